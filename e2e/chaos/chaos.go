package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgjson"
)

// Mode is what captures.
type Mode string

// The modes.
const (
	JSONL    Mode = "jsonl"    // tidemark sync to a JSON lines file
	Postgres Mode = "postgres" // tidemark sync to another PostgreSQL database, exactly once
	Airbyte  Mode = "airbyte"  // the Airbyte connector, in sync rounds from state to state
)

// Config configures a run.
type Config struct {
	Mode     Mode
	Seed     uint64
	Duration time.Duration // how long the workload runs under faults. Zero: 1 minute
	// FaultEvery is the mean time between faults. Zero: 3s.
	FaultEvery time.Duration
	// Faults restricts the faults to these kinds (FaultKinds); empty: all of them.
	Faults []string
	// Source is a staging database to run against (its role must create schemas, slots and
	// publications); empty: a throwaway PostgreSQL started for the run, which also allows the
	// faults that restart or reconfigure the server.
	Source string
	// Target is the database the PostgreSQL mode writes to (it gets Schema and Tidemark's
	// checkpoint and audit tables). Empty: a second database of the throwaway server.
	Target string
	// Tidemark and Connector are the tidemark and source-postgres binaries.
	Tidemark, Connector string
	// Rows is the number of rows of the main table before the run. Zero: 20000.
	Rows int
	// ChunkSize is the backfill chunk size. Zero: 1000.
	ChunkSize int
	// Break breaks the engine on purpose (no-guard, no-eviction, ack-ahead; tidemark sync only),
	// to show that the harness catches it.
	Break string
	// Dir holds the run's files. Empty: a temporary directory, removed after a passing run.
	Dir string
	// Keep keeps the scratch schema, slot and publication at the end.
	Keep bool
	Log  zerolog.Logger
}

// Report is what a run found.
type Report struct {
	Mode         Mode
	Seed         uint64
	Duration     time.Duration // the whole run, setup and checks included
	Transactions int64         // workload transactions committed
	Faults       map[string]int
	Void         map[string]int // faults of Faults that could not be applied (a restart that failed...)
	Starts       int            // capture processes started
	Failures     int            // capture processes that failed on their own (not killed by the harness)
	LastFailure  string         // the last one's error
	Records      int            // output records checked
	Duplicates   int
	Latency      []time.Duration // commit to delivery of live changes, sorted
	Violations   []string
	Dir          string
}

// OK reports whether the run found no violation.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

func (r *Report) percentile(p float64) time.Duration {
	if len(r.Latency) == 0 {
		return 0
	}
	return r.Latency[min(len(r.Latency)-1, int(p*float64(len(r.Latency))))]
}

// Write prints the report.
func (r *Report) Write(w io.Writer) {
	fmt.Fprintf(w, "tidemark chaos: mode=%s seed=%d duration=%s\n", r.Mode, r.Seed, r.Duration.Round(time.Second))
	fmt.Fprintf(w, "workload: %d transactions\n", r.Transactions)
	var kinds []string
	total := 0
	for k, n := range r.Faults {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		total += n
	}
	sort.Strings(kinds)
	fmt.Fprintf(w, "faults: %d (%s)", total, strings.Join(kinds, " "))
	if len(r.Void) > 0 {
		var void []string
		for k, n := range r.Void {
			void = append(void, fmt.Sprintf("%s=%d", k, n))
		}
		sort.Strings(void)
		fmt.Fprintf(w, ", without effect: %s", strings.Join(void, " "))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "capture: %d starts, %d restarts, %d failed on their own", r.Starts, max(r.Starts-1, 0), r.Failures)
	if r.LastFailure != "" {
		fmt.Fprintf(w, " (last: %.200s)", r.LastFailure)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "output: %d records checked, %d duplicates\n", r.Records, r.Duplicates)
	if len(r.Latency) > 0 {
		fmt.Fprintf(w, "latency of live changes (commit to delivery, %d samples): p50=%s p99=%s max=%s\n", len(r.Latency),
			r.percentile(0.5).Round(time.Millisecond), r.percentile(0.99).Round(time.Millisecond), r.Latency[len(r.Latency)-1].Round(time.Millisecond))
	}
	if r.OK() {
		fmt.Fprintln(w, "verdict: PASS")
		return
	}
	fmt.Fprintf(w, "verdict: FAIL, %d violations (files in %s)\n", len(r.Violations), r.Dir)
	for i, v := range r.Violations {
		if i == 20 {
			fmt.Fprintf(w, "  ... and %d more\n", len(r.Violations)-20)
			break
		}
		fmt.Fprintf(w, "  - %s\n", v)
	}
}

// run is one chaos run in progress.
type run struct {
	cfg    Config
	log    zerolog.Logger
	srv    *e2e.Server // nil for a staging database
	dsn    string      // the source, direct
	via    string      // the source, through the proxy
	target string      // the PostgreSQL target
	proxy  *proxy
	slot   string
	report *Report
	rng    *rand.Rand // the fault schedule

	mu     sync.Mutex
	faults map[string]int
	void   map[string]int // faults without effect
	sup    *supervisor
}

// Run runs the harness. It returns an error when the harness itself could not run (no
// PostgreSQL, a binary missing); what it found is in the Report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Duration == 0 {
		cfg.Duration = time.Minute
	}
	if cfg.FaultEvery == 0 {
		cfg.FaultEvery = 3 * time.Second
	}
	if cfg.Rows == 0 {
		cfg.Rows = 20000
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = 1000
	}
	switch cfg.Mode {
	case JSONL, Postgres:
		if cfg.Tidemark == "" {
			return nil, errors.New("chaos: the tidemark binary is needed")
		}
	case Airbyte:
		if cfg.Connector == "" {
			return nil, errors.New("chaos: the source-postgres binary is needed")
		}
		if cfg.Break != "" {
			return nil, errors.New("chaos: --break works with tidemark sync (modes jsonl and postgres)")
		}
	default:
		return nil, fmt.Errorf("chaos: unknown mode %q (jsonl, postgres, airbyte)", cfg.Mode)
	}
	for _, f := range cfg.Faults {
		if !slices.Contains(FaultKinds(), f) {
			return nil, fmt.Errorf("chaos: unknown fault %q (%s)", f, strings.Join(FaultKinds(), ", "))
		}
	}
	start := time.Now()
	r := &run{cfg: cfg, log: cfg.Log, faults: map[string]int{}, void: map[string]int{},
		report: &Report{Mode: cfg.Mode, Seed: cfg.Seed},
		rng:    rand.New(rand.NewPCG(cfg.Seed, 2)),
		slot:   fmt.Sprintf("tidemark_chaos_%d", cfg.Seed%1000000)}
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "tidemark-chaos-")
		if err != nil {
			return nil, err
		}
		cfg.Dir = dir
		r.cfg.Dir = dir
	}
	r.report.Dir = r.cfg.Dir
	if err := r.prepare(ctx); err != nil {
		r.close(ctx)
		return nil, err
	}
	defer r.close(ctx)
	err := r.execute(ctx)
	r.report.Duration = time.Since(start)
	r.report.Faults, r.report.Void = r.faults, r.void
	if err != nil {
		return r.report, err
	}
	if r.report.OK() && r.cfg.Dir != "" && cfg.Dir == "" {
		_ = os.RemoveAll(r.cfg.Dir)
	}
	return r.report, nil
}

// prepare starts or reaches PostgreSQL, creates the workload, the slot and the publication, and
// the proxy.
func (r *run) prepare(ctx context.Context) error {
	if r.cfg.Source == "" {
		srv, err := e2e.Start(ctx, e2e.Options{Log: r.log})
		if err != nil {
			return fmt.Errorf("start PostgreSQL: %w", err)
		}
		r.srv = srv
		for _, db := range []string{"chaos", "chaos_target"} {
			if err := srv.CreateDatabase(ctx, db); err != nil {
				return err
			}
		}
		r.dsn = srv.DSN("chaos")
		if r.cfg.Target == "" {
			r.target = srv.DSN("chaos_target")
		}
	} else {
		r.dsn = r.cfg.Source
	}
	if r.cfg.Target != "" {
		r.target = r.cfg.Target
	}
	if r.cfg.Mode == Postgres && r.target == "" {
		return errors.New("chaos: the postgres mode against a staging database needs a target database")
	}
	pc, err := pgx.ParseConfig(r.dsn)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("connect to the source: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Leftovers of an earlier run with the same seed.
	_, _ = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, r.slot)
	_, _ = conn.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{r.slot}.Sanitize())
	collation, err := setup(ctx, conn, r.cfg.Rows)
	if err != nil {
		return err
	}
	r.log.Info().Str("collation", collation).Msg("workload tables created")
	var list []string
	for _, t := range tables {
		list = append(list, pgx.Identifier{Schema, t.name}.Sanitize())
	}
	if _, err := conn.Exec(ctx, `CREATE PUBLICATION `+pgx.Identifier{r.slot}.Sanitize()+` FOR TABLE `+strings.Join(list, ", ")); err != nil {
		return fmt.Errorf("create the publication: %w", err)
	}
	// The slot exists before the workload starts: every workload transaction is streamed (the
	// audit of the PostgreSQL target counts on it), the rows before it are backfilled.
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, r.slot); err != nil {
		return fmt.Errorf("create the slot: %w", err)
	}
	r.proxy, err = newProxy(fmt.Sprintf("%s:%d", pc.Host, pc.Port))
	if err != nil {
		return err
	}
	via := pc.Copy()
	via.Host, via.Port = "127.0.0.1", uint16(r.proxy.port())
	r.via = e2e.DSN(via.Host, int(via.Port), via.User, via.Password, via.Database)
	return nil
}

// close removes what the run created, unless asked to keep it.
func (r *run) close(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	if r.proxy != nil {
		r.proxy.Close()
	}
	if r.srv != nil {
		_ = r.srv.Stop(ctx)
		return
	}
	if r.cfg.Keep || r.dsn == "" {
		return
	}
	conn, err := pgx.Connect(ctx, r.dsn)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	for range 50 {
		var active bool
		if conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, r.slot).Scan(&active) != nil || !active {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, _ = conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, r.slot)
	_, _ = conn.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{r.slot}.Sanitize())
	_, _ = conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+Schema+` CASCADE`)
	if r.target != "" && r.cfg.Mode == Postgres {
		if tc, err := pgx.Connect(ctx, r.target); err == nil {
			_, _ = tc.Exec(ctx, `DROP SCHEMA IF EXISTS `+Schema+` CASCADE`)
			_, _ = tc.Exec(ctx, `DELETE FROM public.tidemark_checkpoint WHERE id = $1`, r.slot)
			tc.Close(ctx)
		}
	}
}

// execute runs the workload and the capture under faults for the duration, then lets the
// capture catch up without faults, and checks its output.
func (r *run) execute(ctx context.Context) error {
	var capt capture
	switch r.cfg.Mode {
	case JSONL:
		capt = &syncCapture{r: r, out: filepath.Join(r.cfg.Dir, "out.jsonl")}
	case Postgres:
		capt = &syncCapture{r: r, toPG: true}
	case Airbyte:
		capt = newAirbyteCapture(r)
	}
	if err := capt.prepare(ctx); err != nil {
		return err
	}
	w := &workload{dsn: r.dsn, rng: rand.New(rand.NewPCG(r.cfg.Seed, 1)), rows: r.cfg.Rows}
	wctx, stopWorkload := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		w.run(wctx)
	})
	r.sup = &supervisor{start: capt.start, log: r.log}
	sctx, stopCapture := context.WithCancel(ctx)
	wg.Go(func() {
		r.sup.run(sctx)
	})
	r.faultLoop(ctx, capt, time.Now().Add(r.cfg.Duration))
	stopWorkload()
	stopCapture()
	wg.Wait()
	r.report.Transactions = w.commits.Load()
	r.report.Starts, r.report.Failures, r.report.LastFailure = r.sup.counts()
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.sup.stuck() {
		r.report.Violations = append(r.report.Violations, "the capture could not resume: "+r.report.LastFailure)
	}
	// Without faults, the capture catches up with everything the workload wrote.
	if err := r.ensureServer(ctx); err != nil {
		return err
	}
	if err := capt.finish(ctx); err != nil {
		r.report.Violations = append(r.report.Violations, "the final catch-up failed: "+err.Error())
		return nil
	}
	return capt.verify(ctx, r.report)
}

// ensureServer waits until the source accepts connections again (after a restart fault).
func (r *run) ensureServer(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, r.dsn)
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the source did not come back: %w", err)
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// capture is one mode's way of running and checking the capture.
type capture interface {
	prepare(ctx context.Context) error
	// start starts one capture process; wait ends with it.
	start(ctx context.Context) (*process, error)
	// slow makes the consumer slow for d.
	slow(ctx context.Context, d time.Duration) string
	// finish runs the capture without faults until it has caught up.
	finish(ctx context.Context) error
	verify(ctx context.Context, rep *Report) error
}

// sourceTables returns the source's rows of each table in their JSON form (the connector's
// forms in airbyte mode, its default; the CLI's exact ones otherwise), by key.
func (r *run) sourceTables(ctx context.Context) (map[string]map[string]map[string]*string, error) {
	out := map[string]map[string]map[string]*string{}
	profile := pgjson.Exact
	if r.cfg.Mode == Airbyte {
		profile = pgjson.Airbyte
	}
	for name, key := range keys() {
		rows, err := e2e.SourceRowsJSON(ctx, r.dsn, Schema, strings.TrimPrefix(name, Schema+"."), key, profile)
		if err != nil {
			return nil, err
		}
		out[name] = rows
	}
	return out, nil
}

// checkOracle adds the oracle's findings against the source to the report.
func (r *run) checkOracle(ctx context.Context, o *e2e.Oracle, rep *Report) error {
	src, err := r.sourceTables(ctx)
	if err != nil {
		return err
	}
	rep.Violations = append(rep.Violations, o.Violations()...)
	rep.Records, rep.Duplicates = o.Records(), o.Duplicates()
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range src {
			if !yield(k) {
				return
			}
		}
	}) {
		if d := e2e.Diff(o.Rows(name), src[name]); d != "" {
			rep.Violations = append(rep.Violations, fmt.Sprintf("I1: %s differs from the source: %s", name, d))
		}
	}
	return nil
}
