package chaos

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/chaos/oracle"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/internal/pgserver"
	"github.com/tidemark/tidemark/sink/kafka"
	"github.com/tidemark/tidemark/sink/nats"
)

// Mode is what captures.
type Mode string

// The modes.
const (
	JSONL    Mode = "jsonl"    // tidemark sync to a JSON lines file
	Postgres Mode = "postgres" // tidemark sync to another PostgreSQL database, exactly once
	Airbyte  Mode = "airbyte"  // the Airbyte connector, in sync rounds from state to state
	Kafka    Mode = "kafka"    // tidemark sync to Kafka topics, exactly once for read_committed consumers
	NATS     Mode = "nats"     // tidemark sync to a NATS JetStream stream, each event published once
)

// Config configures a run.
type Config struct {
	Mode     Mode
	Seed     uint64
	Duration time.Duration // how long the workload runs under faults. Zero: 1 minute
	// FaultEvery is the mean time between faults. Zero: 3s.
	FaultEvery time.Duration
	// Faults are the faults to inject: kinds (FaultKinds) and families (FaultFamilies: "default",
	// "ddl"). Empty: the default family.
	Faults []string
	// InTurn takes the faults in turn, in the order of Faults, instead of drawing each kind by
	// its weight: a short run meets every one (the tests). The times between them stay drawn. The
	// run goes on past Duration (up to five times it more, plus the time its faults without
	// effect took, eight times it at most) until each kind has taken effect once.
	InTurn bool
	// Source is a staging database to run against (its role must create schemas, slots and
	// publications); empty: a throwaway PostgreSQL started for the run, which also allows the
	// faults that restart or reconfigure the server.
	Source string
	// Target is the database the PostgreSQL mode writes to (it gets the run's schema, a schema
	// for the harness's history of the target's rows, and Tidemark's checkpoint and audit
	// tables). Empty: a second database of the throwaway server, or a server of its own when the
	// faults restart the source's or the target's server.
	Target string
	// Kafka are the brokers (HOST:PORT) the kafka mode writes to; each run writes topics of a
	// prefix of its own (its schema's name), which it leaves behind.
	Kafka []string
	// BrokerFault, when set, is the kafka mode's broker fault (the "broker" kind): it disturbs
	// the brokers for about d (a test's in-process cluster fails requests, drops connections)
	// and says what it did. Without it the kind has no effect: the harness does not control a
	// real cluster.
	BrokerFault func(ctx context.Context, seed uint64, d time.Duration) string
	// NATS are the servers (HOST:PORT) of the JetStream cluster the nats mode writes to; each run
	// writes a stream of its own (named after its schema), which it leaves behind. NATSReplicas is
	// the replicas of that stream (zero: 1; 3 on a cluster of three).
	NATS         []string
	NATSReplicas int
	// NodeFault, when set, is the nats mode's node fault (the "node" kind): a JetStream node of
	// the cluster killed for about d (the leader of the run's stream, or another), then started
	// again, and what it did. Without it the kind has no effect.
	NodeFault func(ctx context.Context, stream string, seed uint64, d time.Duration) string
	// Tidemark and Connector are the tidemark and source-postgres binaries.
	Tidemark, Connector string
	// Rows is the number of rows of the main table before the run. Zero: 20000.
	Rows int
	// ChunkSize is the backfill chunk size. Zero: 1000.
	ChunkSize int
	// MaxChunkBytes is the capture's bound on the bytes of a chunk; the workload writes now and
	// then a value above it. Zero: 256 KiB.
	MaxChunkBytes int
	// Rate bounds the workload's transactions per second, all its connections together (the
	// one that holds transactions open across chunk windows included). Zero: as many as the
	// server takes, which on a shared machine is the most the machine gives: the test suite's
	// short runs bound it so that their cost does not grow with the machine's speed, and the
	// long runs do not.
	Rate int
	// Readers is how many tables the capture backfills at once (tidemark sync --readers, the
	// connector's backfill_readers). Zero: drawn from the seed, 1, 2 or 3.
	Readers int
	// Watermarks is the watermark transport of the capture: "message" (logical messages) or
	// "table" (a signal table in the run's schema). Empty: drawn from the seed, messages three
	// times in four (the table on a server before PostgreSQL 14).
	Watermarks string
	// Break breaks the capture on purpose, to show that the harness catches it: the engine
	// (no-guard, no-eviction, ack-ahead; every mode) or tidemark sync's sinks (checkpoint-apart,
	// the PostgreSQL target; no-truncate, the JSON lines; no-fence, both). See Breaks.
	Break string
	// Dir holds the run's files. Empty: a temporary directory, removed after a passing run.
	Dir string
	// Keep keeps the scratch schema, slot and publication at the end.
	Keep bool
	Log  zerolog.Logger
}

// Report is what a run found.
type Report struct {
	Mode Mode
	Seed uint64
	// Command is the tidemark chaos command that replays the run: the same seed, duration,
	// fault rate, rows, chunk size and bound, faults and watermark transport.
	Command      string
	Schema       string        // the run's schema, slot and publication
	Transport    string        // the watermark transport: message or table
	Readers      int           // the capture's backfill readers
	Duration     time.Duration // the whole run, setup and checks included
	Transactions int64         // workload transactions committed
	WorkloadTime time.Duration // how long the workload ran (its pauses for a restore included)
	Faults       map[string]int
	// Void are the faults of Faults that had no effect (a kill with no capture running, no
	// walsender or connection to end, a commit stall that could not hold a backend, a restart
	// that failed...): they are not effective.
	Void        map[string]int
	Unmet       []string       // InTurn: the kinds that had not taken effect when the run ran out of time
	Stops       map[string]int // clear stops with the cause a fault explains, by fault kind
	Remedies    map[string]int // what followed them: "undo KIND", "rebackfill TABLE" (or all), "reset TABLE" (Airbyte)
	Starts      int            // capture processes started
	Reconnects  int            // restarts from the checkpoint a capture made by itself after a lost connection
	Failures    int            // capture processes that failed on their own (not killed by the harness), expected stops included
	LastFailure string         // the last one's error, apart from expected stops
	// OtherFailures counts the failures that named no cause (a connection dropped or reset by
	// a fault...), by message without numbers.
	OtherFailures map[string]int
	Records       int // output records checked
	Duplicates    int
	Latency       []time.Duration // commit to delivery of live changes, sorted
	Violations    []string
	Dir           string
}

// OK reports whether the run found no violation.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

func (r *Report) percentile(p float64) time.Duration {
	if len(r.Latency) == 0 {
		return 0
	}
	return r.Latency[min(len(r.Latency)-1, int(p*float64(len(r.Latency))))]
}

// Effective returns the faults of each kind that took effect.
func (r *Report) Effective() map[string]int {
	out := map[string]int{}
	for k, n := range r.Faults {
		if e := n - r.Void[k]; e > 0 {
			out[k] = e
		}
	}
	return out
}

// Write prints the report.
func (r *Report) Write(w io.Writer) {
	fmt.Fprintf(w, "tidemark chaos: mode=%s seed=%d duration=%s schema=%s watermarks=%s readers=%d\n", r.Mode, r.Seed, r.Duration.Round(time.Second), r.Schema, r.Transport, r.Readers)
	if r.Command != "" {
		fmt.Fprintf(w, "replay: %s\n", r.Command)
	}
	fmt.Fprintf(w, "workload: %d transactions\n", r.Transactions)
	fmt.Fprintf(w, "faults: %d injected, %d effective (%s)", sum(r.Faults), sum(r.Effective()), formatCounts(r.Effective()))
	if len(r.Void) > 0 {
		fmt.Fprintf(w, ", without effect: %s", formatCounts(r.Void))
	}
	fmt.Fprintln(w)
	if len(r.Unmet) > 0 {
		fmt.Fprintf(w, "in turn, never took effect: %s\n", strings.Join(r.Unmet, ", "))
	}
	if len(r.Stops) > 0 || len(r.Remedies) > 0 {
		fmt.Fprintf(w, "stopped with the expected cause: %d (%s); remedies: %s\n", sum(r.Stops), formatCounts(r.Stops), formatCounts(r.Remedies))
	}
	fmt.Fprintf(w, "capture: %d starts, %d restarts, %d reconnections by itself, %d failed on their own", r.Starts, max(r.Starts-1, 0), r.Reconnects, r.Failures)
	if r.LastFailure != "" {
		fmt.Fprintf(w, " (last: %.200s)", r.LastFailure)
	}
	fmt.Fprintln(w)
	if len(r.OtherFailures) > 0 {
		kinds := slices.SortedFunc(maps.Keys(r.OtherFailures), func(a, b string) int { return r.OtherFailures[b] - r.OtherFailures[a] })
		var top []string
		for _, k := range kinds[:min(len(kinds), 3)] {
			top = append(top, fmt.Sprintf("%d× %.120s", r.OtherFailures[k], k))
		}
		fmt.Fprintf(w, "failures that named no cause: %d, of %d kinds (%s)\n", sum(r.OtherFailures), len(kinds), strings.Join(top, "; "))
	}
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

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// formatCounts writes m as "k=v k=v", sorted by key.
func formatCounts(m map[string]int) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf("%s=%d", k, m[k]))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, " ")
}

// run is one chaos run in progress.
type run struct {
	cfg    Config
	log    zerolog.Logger
	srv    *pgserver.Server // nil for a staging database
	dsn    string           // the source, direct
	via    string           // the source, through the proxy
	target string           // the PostgreSQL target, direct
	tvia   string           // the PostgreSQL target, through its proxy
	proxy  *proxy
	tproxy *proxy // between the capture and the PostgreSQL target
	sch    string // the run's schema; also its slot's and publication's name
	slot   string
	// transport is the watermark transport (message or table); faultsArg the faults as asked.
	transport, faultsArg string
	report               *Report
	rng                  *rand.Rand // the fault schedule
	schema               *schemaState
	capt                 capture
	work                 *workload
	// targetSrv is the PostgreSQL mode's target server when the faults restart or restore the
	// source's server, or restart the target's: the target must not go with the source.
	targetSrv *pgserver.Server
	hist      *targetHistory // the PostgreSQL target's history of its rows
	restores  int            // restore faults so far (names their backups)

	mu            sync.Mutex
	faults        map[string]int
	void          map[string]int // faults without effect
	stops         map[string]int // expected stops by fault kind
	remedies      map[string]int
	otherFailures map[string]int
	violations    []string             // found while the run goes on
	exps          []*expectation       // the stops the faults may cause
	auditFrom     int64                // the PostgreSQL target's audit covers txlog ids above (a restore raises it)
	pubDrops      []*pubDrop           // the publication faults' spans, for the target history
	autoAt        map[string]time.Time // table → when a fault last had the sync re-backfill it by itself
	unmet         []string             // InTurn: kinds that never took effect
	sup           *supervisor
	journal       *os.File // Dir/journal.log: the faults, the capture's runs and how they ended
}

// note writes a line to the run's journal (Dir/journal.log), which a failed run leaves behind:
// the faults in order, each capture process and how it ended, with its last log lines when it
// failed, the stops and their remedies.
func (r *run) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.journal != nil {
		fmt.Fprintf(r.journal, "%s %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
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
	if cfg.MaxChunkBytes == 0 {
		cfg.MaxChunkBytes = 256 << 10
	}
	switch cfg.Mode {
	case JSONL, Postgres, Kafka, NATS:
		if cfg.Tidemark == "" {
			return nil, errors.New("chaos: the tidemark binary is needed")
		}
		if cfg.Mode == Kafka && len(cfg.Kafka) == 0 {
			return nil, errors.New("chaos: the kafka mode needs a Kafka cluster: its brokers (tidemark chaos --kafka HOST:PORT,...)")
		}
		if cfg.Mode == NATS && len(cfg.NATS) == 0 {
			return nil, errors.New("chaos: the nats mode needs a NATS cluster with JetStream: its servers (tidemark chaos --nats HOST:PORT,...)")
		}
	case Airbyte:
		if cfg.Connector == "" {
			return nil, errors.New("chaos: the source-postgres binary is needed")
		}
	default:
		return nil, fmt.Errorf("chaos: unknown mode %q (jsonl, postgres, airbyte, kafka, nats)", cfg.Mode)
	}
	if cfg.Break != "" {
		b, ok := breakOf(cfg.Break)
		if !ok {
			return nil, fmt.Errorf("chaos: unknown break %q (%s)", cfg.Break, strings.Join(Breaks(), ", "))
		}
		if !slices.Contains(b.modes, cfg.Mode) {
			return nil, fmt.Errorf("chaos: the break %s is of mode(s) %v, not %s", cfg.Break, b.modes, cfg.Mode)
		}
	}
	if cfg.Readers == 0 {
		cfg.Readers = 1 + rand.New(rand.NewPCG(cfg.Seed, 4)).IntN(3) // apart from the rest, as the transport
	}
	switch cfg.Watermarks {
	case "":
		// Drawn from the seed, apart from the fault schedule and the workload.
		cfg.Watermarks = "message"
		if rand.New(rand.NewPCG(cfg.Seed, 3)).IntN(4) == 0 {
			cfg.Watermarks = "table"
		}
	case "message", "table":
	default:
		return nil, fmt.Errorf("chaos: unknown watermark transport %q (message, table)", cfg.Watermarks)
	}
	faultsArg := strings.Join(cfg.Faults, ",")
	if faultsArg == "" {
		faultsArg = "default"
	}
	faults, err := expandFaults(cfg.Faults)
	if err != nil {
		return nil, err
	}
	cfg.Faults = faults
	start := time.Now()
	// A schema, slot and publication of its own: runs against one database do not meet.
	var id [3]byte
	_, _ = crand.Read(id[:])
	sch := fmt.Sprintf("%s_%d_%x", SchemaPrefix, cfg.Seed%1000000, id)
	r := &run{cfg: cfg, log: cfg.Log, faults: map[string]int{}, void: map[string]int{}, stops: map[string]int{}, remedies: map[string]int{},
		otherFailures: map[string]int{}, autoAt: map[string]time.Time{}, schema: newSchemaState(sch), sch: sch, slot: sch, faultsArg: faultsArg,
		report: &Report{Mode: cfg.Mode, Seed: cfg.Seed, Schema: sch},
		rng:    rand.New(rand.NewPCG(cfg.Seed, 2))}
	if cfg.Dir != "" {
		// Another run's output there would be resumed (and its checkpoint is of another server).
		if entries, err := os.ReadDir(cfg.Dir); err == nil && len(entries) > 0 {
			return nil, fmt.Errorf("chaos: %s holds the files of another run; give an empty or new directory", cfg.Dir)
		}
		if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
	}
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "tidemark-chaos-")
		if err != nil {
			return nil, err
		}
		cfg.Dir = dir
		r.cfg.Dir = dir
	}
	r.report.Dir = r.cfg.Dir
	if f, err := os.Create(filepath.Join(r.cfg.Dir, "journal.log")); err == nil {
		r.journal = f
		defer func() {
			r.mu.Lock()
			r.journal = nil
			r.mu.Unlock()
			f.Close()
		}()
	}
	if err := r.prepare(ctx); err != nil {
		r.close(ctx)
		return nil, err
	}
	defer r.close(ctx)
	err = r.execute(ctx)
	r.report.Duration = time.Since(start)
	r.mu.Lock()
	r.report.Faults, r.report.Void, r.report.Stops, r.report.Remedies = r.faults, r.void, r.stops, r.remedies
	r.report.Unmet = r.unmet
	r.report.OtherFailures = r.otherFailures
	r.mu.Unlock()
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
		srv, err := pgserver.Start(ctx, pgserver.Options{Log: r.log})
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
		if r.cfg.Mode == Postgres && r.cfg.Target == "" && (slices.Contains(r.cfg.Faults, "restore") || slices.Contains(r.cfg.Faults, "target-restart")) {
			// The restore fault takes the whole server back, the target's restart must leave the
			// source alone: the target needs a server of its own.
			ts, err := pgserver.Start(ctx, pgserver.Options{Log: r.log})
			if err != nil {
				return fmt.Errorf("start the target's PostgreSQL: %w", err)
			}
			r.targetSrv = ts
			if err := ts.CreateDatabase(ctx, "chaos_target"); err != nil {
				return err
			}
			r.target = ts.DSN("chaos_target")
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
		return fmt.Errorf("source: %w", pgconf.ParseError(err))
	}
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
	if err != nil {
		return fmt.Errorf("connect to the source: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var version int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	if version < 140000 && r.cfg.Watermarks == "message" {
		r.cfg.Watermarks = "table" // logical messages in transactions need PostgreSQL 14
	}
	r.transport = r.cfg.Watermarks
	r.report.Transport, r.report.Readers, r.report.Command = r.transport, r.cfg.Readers, r.command()
	r.note("%s", r.report.Command)
	r.note("schema, slot and publication %s; watermarks as %s; %d reader(s)", r.sch, r.transport, r.cfg.Readers)
	collation, err := setup(ctx, conn, r.sch, r.schema.moved, r.cfg.Rows, r.ddl(), r.cfg.Mode == Postgres)
	if err != nil {
		return err
	}
	r.log.Info().Str("collation", collation).Str("schema", r.sch).Msg("workload tables created")
	var list []string
	for _, t := range tables {
		list = append(list, pgx.Identifier{r.sch, t.name}.Sanitize())
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
	r.via = pgserver.DSN(via.Host, int(via.Port), via.User, via.Password, via.Database)
	if r.cfg.Mode == Postgres {
		tc, err := pgx.ParseConfig(r.target)
		if err != nil {
			return fmt.Errorf("target: %w", pgconf.ParseError(err))
		}
		if r.tproxy, err = newProxy(fmt.Sprintf("%s:%d", tc.Host, tc.Port)); err != nil {
			return err
		}
		r.tvia = pgserver.DSN("127.0.0.1", r.tproxy.port(), tc.User, tc.Password, tc.Database)
		if r.hist, err = newTargetHistory(ctx, r.target, r.sch, r.log); err != nil {
			return err
		}
	}
	return nil
}

// command is the tidemark chaos command that replays the run.
func (r *run) command() string {
	c := r.cfg
	parts := []string{"tidemark chaos", "--mode", string(c.Mode), "--seed", fmt.Sprint(c.Seed), "--duration", c.Duration.String(),
		"--fault-every", c.FaultEvery.String(), "--rows", fmt.Sprint(c.Rows), "--chunk-size", fmt.Sprint(c.ChunkSize),
		"--max-chunk-bytes", fmt.Sprint(c.MaxChunkBytes), "--faults", r.faultsArg, "--watermarks", r.transport}
	if c.Readers > 0 {
		parts = append(parts, "--readers", fmt.Sprint(c.Readers))
	}
	if c.Rate > 0 {
		parts = append(parts, "--rate", fmt.Sprint(c.Rate))
	}
	if c.InTurn {
		parts = append(parts, "--in-turn")
	}
	if c.Break != "" {
		parts = append(parts, "--break", c.Break)
	}
	if c.Source != "" {
		parts = append(parts, "--source", "SOURCE") // not printed: it may hold a password
	}
	if c.Target != "" {
		parts = append(parts, "--target", "TARGET")
	}
	return strings.Join(parts, " ")
}

// close removes what the run created, unless asked to keep it.
func (r *run) close(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	if r.proxy != nil {
		r.proxy.Close()
	}
	if r.tproxy != nil {
		r.tproxy.Close()
	}
	if r.targetSrv != nil {
		_ = r.targetSrv.Stop(ctx)
	}
	if r.srv != nil {
		_ = r.srv.Stop(ctx)
		return
	}
	if r.cfg.Keep || r.dsn == "" {
		return
	}
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
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
	_, _ = conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+r.sch+` CASCADE`)
	if r.ddl() {
		_, _ = conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+r.schema.moved+` CASCADE`)
	}
	if r.target != "" && r.cfg.Mode == Postgres {
		if tc, err := pgconf.Open(ctx, r.target, "tidemark-chaos"); err == nil {
			_, _ = tc.Exec(ctx, `DROP SCHEMA IF EXISTS `+r.sch+` CASCADE`)
			if r.hist != nil {
				r.hist.drop(ctx, tc)
			}
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
	case Kafka:
		capt = &syncCapture{r: r, kafka: &kafka.Address{Brokers: r.cfg.Kafka, Prefix: r.sch}}
	case NATS:
		capt = &syncCapture{r: r, nats: &nats.Address{Servers: r.cfg.NATS, Stream: r.sch}}
	case Airbyte:
		capt = newAirbyteCapture(r)
	}
	r.capt = capt
	if err := capt.prepare(ctx); err != nil {
		return err
	}
	w := &workload{dsn: r.dsn, seed: r.cfg.Seed, rows: r.cfg.Rows, schema: r.schema, bigValue: r.cfg.MaxChunkBytes, pace: newPacer(r.cfg.Rate)}
	r.work = w
	wctx, stopWorkload := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		began := time.Now()
		w.run(wctx)
		r.report.WorkloadTime = time.Since(began)
	})
	r.sup = &supervisor{start: capt.start, exited: r.exited, log: r.log}
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
	r.report.Reconnects = r.sup.reconnectCount()
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
		r.takeViolations()
		return nil
	}
	err := capt.verify(ctx, r.report)
	r.takeViolations()
	return err
}

// takeViolations moves what the run found while it went on into the report.
func (r *run) takeViolations() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.report.Violations = append(r.report.Violations, r.violations...)
	r.violations = nil
}

// ddl reports whether the run injects faults of the ddl family.
func (r *run) ddl() bool {
	for _, k := range faultKinds {
		if k.family == "ddl" && slices.Contains(r.cfg.Faults, k.name) {
			return true
		}
	}
	return false
}

// watchRemedy watches a process started with re-backfills until it ended: once it wrote a
// checkpoint, the re-backfills are in it (the next runs resume them, and need not ask again);
// once they started there, their expectations retire (settle).
func (r *run) watchRemedy(p *process) {
	defer close(p.watched)
	asked := true
	for {
		ended := false
		select {
		case <-p.done:
			ended = true
		case <-time.After(300 * time.Millisecond):
		}
		if asked {
			if cp, err := r.capt.checkpoint(context.Background()); err == nil && cp != nil && cp.raw != p.before {
				r.capt.remedied(p.remedy)
				asked = false
			}
		}
		r.settle(context.Background())
		if ended {
			return
		}
	}
}

// exited judges a capture process that ended (once its remedy is watched): a failure is judged
// by failed. It reports whether the process stopped with a cause a fault explains.
func (r *run) exited(ctx context.Context, p *process) bool {
	if p.watched != nil {
		<-p.watched
	}
	r.settle(ctx)
	lived := time.Since(p.started).Round(time.Millisecond)
	switch {
	case p.wasKilled():
		r.note("capture pid %d killed after %s", p.cmd.Process.Pid, lived)
		return false
	case p.err == nil:
		r.note("capture pid %d ended after %s%s", p.cmd.Process.Pid, lived, warnings(p.stderr.String()))
		return false
	}
	msg := p.failure()
	r.note("capture pid %d failed after %s: %s\n%s", p.cmd.Process.Pid, lived, oneLine(msg), lastLines(p.stderr.String(), 30))
	return r.failed(ctx, p.started, msg)
}

// warnings returns the warnings and errors a process logged (zerolog JSON lines), indented on
// lines of their own; "" when there are none.
func warnings(stderr string) string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) {
			out = append(out, "\n    | "+l)
		}
	}
	if len(out) > 10 {
		out = append(out[:10], fmt.Sprintf("\n    | ... and %d more", len(out)-10))
	}
	return strings.Join(out, "")
}

// lastLines returns the last n lines of s, indented.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    | " + strings.Join(lines, "\n    | ")
}

// ensureServer waits until the source accepts connections again (after a restart fault).
func (r *run) ensureServer(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
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
	// second runs a second capture against the slot and output of the running one, which must
	// be refused (fence.go).
	second(ctx context.Context) string
	// finish runs the capture without faults until it has caught up.
	finish(ctx context.Context) error
	verify(ctx context.Context, rep *Report) error
	// rebackfill starts table's output over (every table's for ""), as an operator would after
	// a stop that asks for it, and says how ("rebackfill", "reset").
	rebackfill(ctx context.Context, table string) string
	// remedied is told that a process started with the re-backfills of tables wrote a durable
	// checkpoint.
	remedied(tables []string)
	// checkpoint reads the durable checkpoint; nil when there is none yet.
	checkpoint(ctx context.Context) (*checkpointInfo, error)
}

// keys returns the key columns of the run's tables by schema.table.
func (r *run) keys() map[string][]string { return keysIn(r.sch) }

// sourceTables returns the source's rows of each table in their JSON form (the connector's
// forms in airbyte mode, its default; the CLI's exact ones otherwise), by key.
func (r *run) sourceTables(ctx context.Context) (map[string]map[string]map[string]*string, error) {
	out := map[string]map[string]map[string]*string{}
	profile := pgjson.Exact
	if r.cfg.Mode == Airbyte {
		profile = pgjson.Airbyte
	}
	for name, key := range r.keys() {
		rows, err := oracle.SourceRowsJSON(ctx, r.dsn, r.sch, strings.TrimPrefix(name, r.sch+"."), key, profile)
		if err != nil {
			return nil, err
		}
		out[name] = rows
	}
	return out, nil
}

// checkOracle adds the oracle's findings against the source to the report: the versions that
// came back after their delete (txnXID gives the source transaction of a record's Txn), and the
// replay compared with the source's tables.
func (r *run) checkOracle(ctx context.Context, o *oracle.Oracle, rep *Report, txnXID func(txn string) (uint32, bool)) error {
	src, err := r.sourceTables(ctx)
	if err != nil {
		return err
	}
	deaths, err := r.readDeaths(ctx)
	if err != nil {
		return err
	}
	o.CheckDeaths(func(table, key, txn string) (int64, bool) {
		xid, ok := txnXID(txn)
		if !ok {
			return 0, false
		}
		return deaths.removed(table, key, xid)
	})
	rep.Violations = append(rep.Violations, o.Violations()...)
	rep.Records, rep.Duplicates = o.Records(), o.Duplicates()
	null := "null"
	for _, name := range slices.Sorted(maps.Keys(src)) {
		replay := o.Rows(name)
		rep.Violations = append(rep.Violations, o.FillMissing(name, replay, r.schema.addedIn(name, src[name]), &null)...)
		if r.cfg.Mode == Airbyte {
			airbyteForm(src[name])
		}
		if d := oracle.Diff(replay, src[name]); d != "" {
			rep.Violations = append(rep.Violations, fmt.Sprintf("I1: %s differs from the source: %s", name, d))
		}
	}
	return nil
}
