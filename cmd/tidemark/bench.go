package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/internal/pgserver"
	"github.com/tidemark/tidemark/internal/sqlfix"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/sink"
	"github.com/tidemark/tidemark/sink/jsonl"
	"github.com/tidemark/tidemark/sink/kafka"
	"github.com/tidemark/tidemark/sink/nats"
	"github.com/tidemark/tidemark/sink/postgres"
)

// benchSettings are the conditions of every figure (docs/benchmarks.md): durable commits, a
// warm cache.
var benchSettings = map[string]string{
	"fsync": "on", "synchronous_commit": "on", "shared_buffers": "1GB", "max_wal_size": "4GB", "checkpoint_timeout": "15min",
}

func runBench(ctx context.Context, args []string, e *env) error {
	fs := newFlags("bench", "bench [--quick] [--rows N] [--memory]", e)
	quick := fs.Bool("quick", false, "a small run (about a minute) that checks the benchmark works; its figures are informative only (--rows, --changes and the other sizes given with it are taken)")
	rows := fs.Int("rows", 5_000_000, "rows of the backfill table")
	reps := fs.Int("reps", 3, "repetitions of each figure (the median is reported)")
	chunk := fs.Int("chunk-size", 10000, "backfill chunk size")
	encoders := fs.Int("encoders", 0, "goroutines that encode a batch's JSON lines at once in the figures that encode them (0: one per core past the first, at most 8)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	verbose := fs.Bool("v", false, "log the engine's progress")
	connector := fs.String("connector", "", "the source-postgres binary for the Airbyte read; default beside this one, on the PATH, or built with go")
	changes := fs.Int("changes", 1_000_000, "changes streamed for the streaming figures")
	kafkaBrokers := fs.String("kafka", "", "the brokers of a Kafka cluster (HOST:PORT,...): adds the kafka group, the backfill into Kafka (exactly once, three partitions) as a ratio to the same backfill into JSON lines; it leaves its topics (tidemark_bench_*) behind")
	natsServers := fs.String("nats", "", "the servers of a NATS cluster with JetStream (HOST:PORT,...): adds the nats group, the backfill into a JetStream stream (each event once, three subjects) as a ratio to the same backfill into JSON lines; it leaves its streams (tidemark_bench_*) and their buckets behind")
	only := fs.String("only", "", "run only these groups of figures, comma-separated: scan (COPY and the backfills), sync (native, tidemark sync, pgcopydb, the Airbyte read), memory, stream, sweep, latency, readers (the rows in four tables, backfilled by one reader and by two; and the one table by two readers of key ranges), kafka (with --kafka), nats (with --nats); default all")
	memory := fs.Bool("memory", false, "instead of the default figures: the peak memory of tidemark sync for one very large source transaction and for wide rows")
	txRows := fs.Int("tx-rows", 10_000_000, "--memory: rows changed by the one large source transaction")
	wideRows := fs.Int("wide-rows", 200, "--memory: rows of the wide table")
	wideMB := fs.Int("wide-mb", 5, "--memory: size of each wide row, in MB")
	msgMB := fs.Int("message-mb", 400, "--memory: size of the logical message another role writes, in MB")
	scale := fs.Bool("scale", false, "instead of the default figures: one large backfill (--rows, 50,000,000 unless given) into JSON lines and into PostgreSQL under a live workload, sampled through the run")
	every := fs.Duration("sample-every", 5*time.Second, "--scale: time between two samples")
	rate := fs.Int("live-rate", 200, "--scale: live inserts per second, and as many updates of the backfilled table")
	plot := fs.String("plot", "", "--scale: draw the samples into this PNG file")
	samples := fs.String("samples", "", "--scale: write the samples to this file, as tab-separated values")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := usageProblems(fs, outOfRange(intRange("rows", *rows, 1, 1_000_000_000), intRange("reps", *reps, 1, 100),
		intRange("chunk-size", *chunk, 1, 1_000_000), intRange("encoders", *encoders, 0, jsonl.MaxEncoders), intRange("changes", *changes, 1, 1_000_000_000),
		intRange("tx-rows", *txRows, 1, 1_000_000_000), intRange("wide-rows", *wideRows, 1, 1_000_000), intRange("wide-mb", *wideMB, 1, 512), intRange("message-mb", *msgMB, 1, 900))); err != nil {
		return err
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *quick {
		// The small run's sizes, where no flag gives another.
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		for _, v := range []struct {
			name  string
			p     *int
			quick int
		}{{"rows", rows, 200_000}, {"reps", reps, 1}, {"changes", changes, 100_000}, {"tx-rows", txRows, 200_000},
			{"wide-rows", wideRows, 20}, {"wide-mb", wideMB, 1}, {"message-mb", msgMB, 40}} {
			if !given[v.name] {
				*v.p = v.quick
			}
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if *scale {
		if *memory || *quick || *only != "" {
			return usageProblems(fs, []string{"--scale is a run of its own: without --memory, --quick or --only"})
		}
		if !flagGiven(fs, "rows") {
			*rows = 50_000_000
		}
		if *every < 100*time.Millisecond || *rate < 1 || *rate > 10000 {
			return usageProblems(fs, []string{"--sample-every is 100ms at least, and --live-rate 1 to 10000"})
		}
		b := &bench{e: e, rows: *rows, chunk: *chunk, log: e.log.Level(zerolog.WarnLevel)}
		if *verbose {
			b.log = e.log
		}
		return (&scaleBench{bench: b, every: *every, rate: *rate, plot: *plot, samples: *samples}).run(ctx)
	}
	if *memory {
		tm, err := findTidemark(ctx, self)
		if err != nil {
			return err
		}
		b := &bench{e: e, log: e.log.Level(zerolog.WarnLevel)}
		return (&memoryBench{bench: b, tidemark: tm, txRows: *txRows, wideRows: *wideRows, wideMB: *wideMB, msgMB: *msgMB}).run(ctx)
	}
	conn, err := findConnector(ctx, *connector, self, false)
	if err != nil {
		return err
	}
	groups, err := benchGroups(*only)
	if err != nil {
		return usageProblems(fs, []string{err.Error()})
	}
	var brokers []string
	switch {
	case *kafkaBrokers != "":
		brokers = strings.Split(*kafkaBrokers, ",")
		groups["kafka"] = groups["kafka"] || *only == ""
	case groups["kafka"]:
		return usageProblems(fs, []string{"--only kafka needs a Kafka cluster: --kafka with its brokers (HOST:PORT, comma-separated)"})
	}
	var natsAddrs []string
	switch {
	case *natsServers != "":
		natsAddrs = strings.Split(*natsServers, ",")
		groups["nats"] = groups["nats"] || *only == ""
	case groups["nats"]:
		return usageProblems(fs, []string{"--only nats needs a NATS cluster with JetStream: --nats with its servers (HOST:PORT, comma-separated)"})
	}
	b := &bench{e: e, rows: *rows, reps: *reps, chunk: *chunk, encoders: *encoders, changes: *changes, connector: conn, groups: groups, log: e.log.Level(zerolog.WarnLevel), brokers: brokers, natsServers: natsAddrs}
	if *verbose {
		b.log = e.log
	}
	return b.run(ctx)
}

type bench struct {
	e           *env
	changes     int
	connector   string
	rows        int
	reps        int
	chunk       int
	encoders    int             // the discarding sinks' encoders (jsonl.NewPool)
	brokers     []string        // --kafka
	natsServers []string        // --nats
	groups      map[string]bool // the groups of figures to run (benchGroups)
	log         zerolog.Logger
	srv         *pgserver.Server
	dsn         string
	cpu         *cpuMeter
	lastCPU     cpuTimes // of the last median: the median of each side's CPU seconds over its repetitions
	slots       int
	types       *pgjson.Registry

	// Measured by scans, the references of the figures after them.
	copyS  time.Duration // COPY of bench_rows through psql
	copyMB float64       // its output
	peak   uint64        // the peak heap of the encoded backfill of bench_rows
}

func (b *bench) printf(format string, args ...any) { fmt.Fprintf(b.e.stdout, format, args...) }

// machine prints the line that says where the figures were measured.
func (b *bench) machine() {
	host, _ := os.Hostname()
	b.printf("# machine: %s, %d cores, %s\n", host, runtime.NumCPU(), runtime.Version())
}

func (b *bench) run(ctx context.Context) error {
	b.printf("# tidemark bench %s rows=%d reps=%d chunk=%d encoders=%d\n", time.Now().UTC().Format(time.RFC3339), b.rows, b.reps, b.chunk, jsonl.NewPool(nil, b.encoders).Encoders())
	b.machine()
	conn, stop, err := b.open(ctx)
	if err != nil {
		return err
	}
	defer stop()
	if err := b.prepare(ctx, conn); err != nil {
		return err
	}
	steps := map[string]func(context.Context) error{"scan": b.scans, "sync": b.syncs, "memory": b.memory, "stream": b.stream, "sweep": b.sweep, "latency": b.latency, "readers": b.readers, "kafka": b.kafka, "nats": b.nats}
	if !b.groups["scan"] {
		// The ratios of the other figures are to COPY's time, and memory's to the backfill's peak.
		steps["scan"] = b.copyReference
		b.groups["scan"] = true
	}
	for _, name := range benchGroupNames {
		if !b.groups[name] {
			continue
		}
		if err := steps[name](ctx); err != nil {
			return err
		}
	}
	return nil
}

// open starts the bench's own server with its database, the connection for its setup (conn)
// and the one of the type registry, and the CPU meter; stop ends them all.
func (b *bench) open(ctx context.Context) (conn *pgx.Conn, stop func(), err error) {
	srv, err := pgserver.Start(ctx, pgserver.Options{Settings: benchSettings})
	if err != nil {
		return nil, nil, err
	}
	var closers []func()
	stop = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	closers = append(closers, func() { srv.Stop(context.WithoutCancel(ctx)) })
	b.srv = srv
	if err := srv.CreateDatabase(ctx, "bench"); err != nil {
		stop()
		return nil, nil, err
	}
	b.dsn = srv.DSN("bench")
	if conn, err = pgconf.OpenDefaultSSL(ctx, b.dsn, "tidemark"); err != nil {
		stop()
		return nil, nil, err
	}
	closers = append(closers, func() { conn.Close(context.WithoutCancel(ctx)) })
	typeConn, err := pgconf.OpenDefaultSSL(ctx, b.dsn, "tidemark")
	if err != nil {
		stop()
		return nil, nil, err
	}
	closers = append(closers, func() { typeConn.Close(context.WithoutCancel(ctx)) })
	b.types = pgjson.NewRegistry(typeConn)
	b.cpu = newCPUMeter(ctx, conn)
	if b.cpu.postmaster == 0 {
		b.printf("# the server's CPU time cannot be read here (/proc): server_cpu figures are 0\n")
	}
	return conn, stop, nil
}

// benchGroupNames are the groups of figures, in the order they run.
var benchGroupNames = []string{"scan", "sync", "memory", "stream", "sweep", "latency", "readers", "kafka", "nats"}

// benchGroups parses --only: the groups to run (all when empty).
func benchGroups(only string) (map[string]bool, error) {
	groups := map[string]bool{}
	if only == "" {
		for _, g := range benchGroupNames {
			groups[g] = g != "kafka" && g != "nats" // with --kafka, --nats only
		}
		return groups, nil
	}
	for _, g := range strings.Split(only, ",") {
		g = strings.TrimSpace(g)
		if !slices.Contains(benchGroupNames, g) {
			return nil, fmt.Errorf("--only: unknown group %q (one of %s)", g, strings.Join(benchGroupNames, ", "))
		}
		groups[g] = true
	}
	groups["scan"] = groups["scan"] || groups["memory"] // memory's ratio is to the whole backfill's peak
	return groups, nil
}

// copyReference measures only the reference the other figures' ratios are to (--only without
// scan).
func (b *bench) copyReference(ctx context.Context) error {
	var err error
	b.copyS, err = b.median(func() (time.Duration, error) { return b.psqlCopy(ctx, `COPY public.bench_rows TO STDOUT`, &b.copyMB) })
	if err != nil {
		return err
	}
	b.line("scan.copy_text", b.copyS, float64(b.rows), b.copyMB, "")
	return nil
}

// prepare builds the benchmark's tables and its publication.
func (b *bench) prepare(ctx context.Context, conn *pgx.Conn) error {
	var version string
	_ = conn.QueryRow(ctx, "SELECT version()").Scan(&version)
	b.printf("# %s\n", version)
	start := time.Now()
	for _, s := range []string{
		`CREATE TABLE public.bench_rows (id bigint PRIMARY KEY, k int, v text, ts timestamptz, n numeric, j jsonb)`,
		fmt.Sprintf(`INSERT INTO public.bench_rows SELECT g, g %% 1000, md5(g::text) || repeat('x', 20 + g %% 40), now() - g * interval '1 second',
			(g * 1.0001)::numeric(20, 4), jsonb_build_object('a', g, 'b', md5(g::text)) FROM generate_series(1, %d) g`, b.rows),
		`CREATE TABLE public.bench_live (id bigserial PRIMARY KEY, sent timestamptz NOT NULL DEFAULT clock_timestamp())`,
		`VACUUM ANALYZE public.bench_rows`,
		`CREATE PUBLICATION bench FOR TABLE public.bench_rows, public.bench_live`,
		`SELECT count(*) FROM public.bench_rows`,
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("prepare: %w", err)
		}
	}
	var heapMB float64
	_ = conn.QueryRow(ctx, `SELECT pg_table_size('public.bench_rows') / 1e6`).Scan(&heapMB)
	b.printf("# bench_rows: %d rows, heap %.1f MB, built in %s\n", b.rows, heapMB, time.Since(start).Round(time.Second))
	return nil
}

// scans measures the reference (COPY through psql, output discarded: docs/benchmarks.md) and
// Tidemark's backfill of the same table, encoded and not.
func (b *bench) scans(ctx context.Context) error {
	if err := b.copyReference(ctx); err != nil {
		return err
	}

	// Tidemark's backfill of the same table, output encoded as JSON lines and discarded.
	var outMB float64
	tmS, err := b.median(func() (time.Duration, error) {
		s := &discardSink{pool: jsonl.NewPool(b.types, b.encoders)}
		d, err := b.backfill(ctx, s, false)
		outMB, b.peak = float64(s.bytes.Load())/1e6, s.peakHeap
		return d, err
	})
	if err != nil {
		return err
	}
	b.line("backfill.tidemark", tmS, float64(b.rows), outMB, fmt.Sprintf("ratio_to_copy=%.2f peak_heap_MB=%.0f", b.copyS.Seconds()/tmS.Seconds(), float64(b.peak)/1e6))

	// The same backfill with the output not encoded: what the engine costs without the sink.
	rawS, err := b.median(func() (time.Duration, error) { return b.backfill(ctx, nullSink{}, false) })
	if err != nil {
		return err
	}
	b.line("backfill.not_encoded", rawS, float64(b.rows), 0, fmt.Sprintf("ratio_to_copy=%.2f", b.copyS.Seconds()/rawS.Seconds()))
	return nil
}

// syncs measures syncs into another PostgreSQL (native logical replication's initial copy,
// Tidemark's exactly-once sync, pgcopydb when installed) and the Airbyte connector's first sync.
func (b *bench) syncs(ctx context.Context) error {
	nativeS, err := b.median(func() (time.Duration, error) { return b.nativeSubscription(ctx) })
	if err != nil {
		return err
	}
	b.line("sync.native_subscription", nativeS, float64(b.rows), b.copyMB, "(CREATE SUBSCRIPTION with copy_data, until the table is ready)")
	pgS, err := b.median(func() (time.Duration, error) { return b.syncPostgres(ctx) })
	if err != nil {
		return err
	}
	b.line("sync.tidemark_postgres", pgS, float64(b.rows), b.copyMB, fmt.Sprintf("time_ratio_to_native=%.2f", pgS.Seconds()/nativeS.Seconds()))

	if _, err := exec.LookPath("pgcopydb"); err == nil {
		cpS, err := b.median(func() (time.Duration, error) { return b.pgcopydb(ctx) })
		if err != nil {
			return err
		}
		b.line("sync.pgcopydb_clone", cpS, float64(b.rows), b.copyMB, fmt.Sprintf("(pgcopydb clone: schema, data, indexes) tidemark_time_ratio=%.2f", pgS.Seconds()/cpS.Seconds()))
	} else {
		b.printf("%-24s skipped: pgcopydb is not installed (apt-get install pgcopydb)\n", "sync.pgcopydb_clone")
	}

	// The Airbyte connector's first sync of the same table, its output discarded.
	var abMB float64
	var abRSS int64
	abS, err := b.median(func() (time.Duration, error) { return b.airbyteRead(ctx, &abMB, &abRSS) })
	if err != nil {
		return err
	}
	b.line("airbyte.read", abS, float64(b.rows), abMB, fmt.Sprintf("ratio_to_copy=%.2f peak_rss_MB=%.0f", b.copyS.Seconds()/abS.Seconds(), float64(abRSS)/1e3))
	return nil
}

// memory shows that memory does not grow with the table: the same backfill of a fifth of it.
func (b *bench) memory(ctx context.Context) error {
	if err := execAll(ctx, b.dsn, fmt.Sprintf(`CREATE TABLE public.bench_fifth AS SELECT * FROM public.bench_rows WHERE id <= %d; ALTER TABLE public.bench_fifth ADD PRIMARY KEY (id); ALTER PUBLICATION bench ADD TABLE public.bench_fifth`, b.rows/5)); err != nil {
		return err
	}
	var fifthPeak uint64
	if _, err := b.median(func() (time.Duration, error) {
		s := &discardSink{pool: jsonl.NewPool(b.types, b.encoders)}
		d, err := b.backfillTable(ctx, "bench_fifth", b.chunk, s)
		fifthPeak = max(fifthPeak, s.peakHeap)
		return d, err
	}); err != nil {
		return err
	}
	b.printf("%-24s rows=%d peak_heap_MB=%.0f rows=%d peak_heap_MB=%.0f ratio=%.2f\n", "memory.peak_heap", b.rows/5, float64(fifthPeak)/1e6,
		b.rows, float64(b.peak)/1e6, float64(b.peak)/float64(max(fifthPeak, 1)))
	return nil
}

// stream measures changes decoded by pg_recvlogical (pgoutput, written to /dev/null) against
// Tidemark's stream, decoded and encoded as JSON lines.
func (b *bench) stream(ctx context.Context) error {
	recvS, tmStreamS, recvCPU, tmCPU, err := b.streaming(ctx)
	if err != nil {
		return err
	}
	perM := 1e6 / float64(b.changes)
	b.printf("%-24s changes=%d median_s=%.3f changes_per_s=%.0f client_cpu_s_per_M=%.2f server_cpu_s_per_M=%.2f\n", "stream.pg_recvlogical", b.changes, recvS.Seconds(), float64(b.changes)/recvS.Seconds(),
		recvCPU.client*perM, recvCPU.server*perM)
	b.printf("%-24s changes=%d median_s=%.3f changes_per_s=%.0f client_cpu_s_per_M=%.2f server_cpu_s_per_M=%.2f ratio_to_pg_recvlogical=%.2f\n", "stream.tidemark", b.changes, tmStreamS.Seconds(),
		float64(b.changes)/tmStreamS.Seconds(), tmCPU.client*perM, tmCPU.server*perM, recvS.Seconds()/tmStreamS.Seconds())
	return nil
}

// sweep shows where the default chunk size comes from: the backfill at several sizes (one chunk
// is in flight at a time by design: its window is what makes the merge exact).
func (b *bench) sweep(ctx context.Context) error {
	for _, size := range []int{1000, 5000, 10000, 50000} {
		before := b.measure()
		d, err := b.backfillTable(ctx, "bench_rows", size, nullSink{})
		if err != nil {
			return err
		}
		b.lastCPU = b.measure().sub(before)
		b.line(fmt.Sprintf("sweep.chunk_%d", size), d, float64(b.rows), 0, fmt.Sprintf("ratio_to_copy=%.2f", b.copyS.Seconds()/d.Seconds()))
	}
	return nil
}

// latency measures live-change latency while a backfill runs: single-row inserts at 200/s,
// commit to output.
func (b *bench) latency(ctx context.Context) error {
	lat := &latencySink{discardSink: discardSink{pool: jsonl.NewPool(b.types, b.encoders)}}
	stop := b.writer(ctx, 200)
	d, err := b.backfill(ctx, lat, true)
	stop()
	if err != nil {
		return err
	}
	p50, p99, maxL, n := lat.stats()
	b.printf("%-24s samples=%d p50_ms=%.2f p99_ms=%.2f max_ms=%.2f (200 inserts/s during a backfill of %s)\n",
		"latency.during_backfill", n, p50, p99, maxL, d.Round(time.Millisecond))
	return nil
}

// line prints a figure: its wall time, and the CPU seconds per million rows of each side, of the
// median that measured it (lastCPU).
func (b *bench) line(name string, d time.Duration, rows, mb float64, extra string) {
	perM := 1e6 / rows
	b.printf("%-24s rows=%.0f MB=%.1f median_s=%.3f rows_per_s=%.0f MB_per_s=%.1f client_cpu_s_per_M=%.2f server_cpu_s_per_M=%.2f %s\n", name, rows, mb, d.Seconds(), rows/d.Seconds(), mb/d.Seconds(),
		b.lastCPU.client*perM, b.lastCPU.server*perM, extra)
}

// median runs f reps times and returns the median of its durations; lastCPU gets the median of
// each side's CPU seconds over the repetitions.
func (b *bench) median(f func() (time.Duration, error)) (time.Duration, error) {
	var ds []time.Duration
	var client, server []float64
	for range b.reps {
		before := b.measure()
		d, err := f()
		if err != nil {
			return 0, err
		}
		used := b.measure().sub(before)
		ds = append(ds, d)
		client, server = append(client, used.client), append(server, used.server)
	}
	slices.Sort(ds)
	slices.Sort(client)
	slices.Sort(server)
	b.lastCPU = cpuTimes{client: client[len(client)/2], server: server[len(server)/2]}
	return ds[len(ds)/2], nil
}

// measure reads the CPU times (none without a meter: the memory bench).
func (b *bench) measure() cpuTimes {
	if b.cpu == nil {
		return cpuTimes{}
	}
	return b.cpu.read()
}

// psqlCopy times psql running a COPY to /dev/null, counting the bytes.
func (b *bench) psqlCopy(ctx context.Context, sql string, mb *float64) (time.Duration, error) {
	bin, err := pgserver.FindBinDir()
	if err != nil {
		return 0, err
	}
	dsn, env := b.srv.ClientDSN("bench")
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "psql"), "-X", "-q", "-d", dsn, "-c", sql)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("psql: %w", err)
	}
	n, _ := io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return 0, fmt.Errorf("psql: %w", err)
	}
	*mb = float64(n) / 1e6
	return time.Since(start), nil
}

// backfill runs one bounded backfill of bench_rows into sink, on a slot of its own; with live,
// it captures the inserts into bench_live too.
func (b *bench) backfill(ctx context.Context, sink merge.Sink, live bool) (time.Duration, error) {
	return b.backfillOf(ctx, b.nextSlot(), []string{"bench_rows"}, 1, sink, live)
}

// nextSlot names a new slot.
func (b *bench) nextSlot() string {
	b.slots++
	return fmt.Sprintf("bench_%d", b.slots)
}

// backfillOf runs one bounded backfill of names by readers readers into sink, on a new slot,
// dropped after.
func (b *bench) backfillOf(ctx context.Context, slot string, names []string, readers int, sink merge.Sink, live bool) (time.Duration, error) {
	var tables []merge.TableConfig
	for _, n := range names {
		tables = append(tables, merge.TableConfig{Schema: "public", Name: n})
	}
	if live {
		tables = append(tables, merge.TableConfig{Schema: "public", Name: "bench_live", NoBackfill: true})
	}
	cfg := merge.Config{
		// Status updates as often as tidemark sync sends them.
		Source:           replicator.Config{DSN: b.dsn, Slot: slot, Publication: "bench", CreateSlot: true, StatusInterval: time.Second},
		Tables:           tables,
		Readers:          readers,
		ChunkSize:        b.chunk,
		AckCheckpoints:   true,
		StopWhenCaughtUp: true,
	}
	eng, err := merge.New(cfg, sink, b.log)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	err = eng.Run(ctx, nil)
	d := time.Since(start)
	conn, cerr := pgconf.OpenDefaultSSL(ctx, b.dsn, "tidemark")
	if cerr == nil {
		_, _ = conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
		conn.Close(ctx)
	}
	return d, err
}

// nativeSubscription times CREATE SUBSCRIPTION with copy_data of bench_rows into a fresh
// database, until the table is ready. On one cluster the subscription cannot create its slot
// itself (it would wait for its own transaction), so the slot is made first.
func (b *bench) nativeSubscription(ctx context.Context) (time.Duration, error) {
	b.slots++
	db := fmt.Sprintf("bench_native_%d", b.slots)
	if err := b.srv.CreateDatabase(ctx, db); err != nil {
		return 0, err
	}
	defer b.srv.DropDatabase(context.WithoutCancel(ctx), db)
	slot := fmt.Sprintf("bench_sub_%d", b.slots)
	if err := execAll(ctx, b.dsn, `CREATE PUBLICATION bench_rows_only FOR TABLE public.bench_rows`); err != nil && !pgerr.DuplicateObject(err) {
		return 0, err
	}
	if err := execAll(ctx, b.dsn, sqlfix.CreateSlot(slot)); err != nil {
		return 0, err
	}
	tdsn := b.srv.DSN(db)
	if err := execAll(ctx, tdsn, `CREATE TABLE public.bench_rows (id bigint PRIMARY KEY, k int, v text, ts timestamptz, n numeric, j jsonb)`); err != nil {
		return 0, err
	}
	conn, err := pgconf.OpenDefaultSSL(ctx, tdsn, "tidemark")
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	start := time.Now()
	// The subscription's connection reads the password from a file the server's user owns: no
	// password in the statement (the server's log) or in pg_subscription.
	passfile, err := b.srv.Passfile()
	if err != nil {
		return 0, err
	}
	pubDSN, _ := b.srv.ClientDSN("bench")
	_, err = conn.Exec(ctx, fmt.Sprintf(`CREATE SUBSCRIPTION sub CONNECTION %s PUBLICATION bench_rows_only WITH (copy_data = true, create_slot = false, slot_name = %s)`,
		sqlfix.Literal(pubDSN+" passfile="+passfile), sqlfix.Literal(slot)))
	if err != nil {
		return 0, fmt.Errorf("create subscription: %w", err)
	}
	for {
		var state string
		if err := conn.QueryRow(ctx, `SELECT coalesce(min(srsubstate), '') FROM pg_subscription_rel`).Scan(&state); err != nil {
			return 0, err
		}
		if state == "r" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	d := time.Since(start)
	_, _ = conn.Exec(ctx, `ALTER SUBSCRIPTION sub DISABLE`)
	_, _ = conn.Exec(ctx, `ALTER SUBSCRIPTION sub SET (slot_name = NONE)`)
	_, _ = conn.Exec(ctx, `DROP SUBSCRIPTION sub`)
	_ = execAll(ctx, b.dsn, sqlfix.DropSlot(slot))
	return d, nil
}

// syncPostgres times a bounded `tidemark sync` of bench_rows into a fresh database.
func (b *bench) syncPostgres(ctx context.Context) (time.Duration, error) {
	b.slots++
	db := fmt.Sprintf("bench_tidemark_%d", b.slots)
	if err := b.srv.CreateDatabase(ctx, db); err != nil {
		return 0, err
	}
	defer b.srv.DropDatabase(context.WithoutCancel(ctx), db)
	tgt, err := pgconf.OpenDefaultSSL(ctx, b.srv.DSN(db), "tidemark")
	if err != nil {
		return 0, err
	}
	defer tgt.Close(context.WithoutCancel(ctx))
	src, err := pgconf.OpenDefaultSSL(ctx, b.dsn, "tidemark")
	if err != nil {
		return 0, err
	}
	defer src.Close(context.WithoutCancel(ctx))
	sink, _, err := postgres.Open(ctx, tgt, src, postgres.Options{ID: "bench", Log: b.log})
	if err != nil {
		return 0, err
	}
	defer sink.Close(context.WithoutCancel(ctx))
	return b.backfill(ctx, sink, false)
}

// writer inserts into bench_live at rate per second until stopped.
func (b *bench) writer(ctx context.Context, rate int) (stop func()) {
	return b.repeat(ctx, rate, func(ctx context.Context, conn *pgx.Conn) {
		_, _ = conn.Exec(ctx, `INSERT INTO public.bench_live DEFAULT VALUES`)
	})
}

// repeat runs do rate times a second on a connection of its own until stopped.
func (b *bench) repeat(ctx context.Context, rate int, do func(context.Context, *pgx.Conn)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		conn, err := pgconf.OpenDefaultSSL(ctx, b.dsn, "tidemark")
		if err != nil {
			return
		}
		defer conn.Close(context.WithoutCancel(ctx))
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				do(ctx, conn)
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// nullSink drops events without looking at them.
type nullSink struct{}

func (nullSink) Emit(context.Context, []merge.Event) error         { return nil }
func (nullSink) Checkpoint(context.Context, *merge.Position) error { return nil }

// discardSink encodes every event as the JSON lines sink does and discards it.
type discardSink struct {
	pool     *jsonl.Pool
	bytes    atomic.Int64
	peakHeap uint64
}

func (s *discardSink) Emit(ctx context.Context, evs []merge.Event) error {
	if err := s.pool.Encode(ctx, evs, func(b []byte) error {
		s.bytes.Add(int64(len(b)))
		return nil
	}); err != nil {
		return err
	}
	// The heap at its highest: a chunk is emitted in a few calls, so each is sampled.
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s.peakHeap = max(s.peakHeap, ms.HeapInuse)
	return nil
}

func (s *discardSink) Checkpoint(context.Context, *merge.Position) error { return nil }

// latencySink measures, for each insert into bench_live, the time from its commit (the row's
// clock_timestamp(), a lower bound) to its arrival here.
type latencySink struct {
	discardSink
	mu  sync.Mutex
	lat []float64 // milliseconds
}

func (s *latencySink) Emit(ctx context.Context, evs []merge.Event) error {
	now := time.Now()
	for i := range evs {
		ms, ok, err := liveLatency(&evs[i], now)
		if err != nil {
			return err
		}
		if ok {
			s.mu.Lock()
			s.lat = append(s.lat, ms)
			s.mu.Unlock()
		}
	}
	return s.discardSink.Emit(ctx, evs)
}

// liveLatency is the time in milliseconds from the commit of an insert into bench_live (its
// sent column, a lower bound) to now; ok is false for any other event.
func liveLatency(ev *merge.Event, now time.Time) (ms float64, ok bool, err error) {
	if ev.Columns.Table != "bench_live" || ev.Op != merge.Insert {
		return 0, false, nil
	}
	sent, ok := ev.Value("sent")
	if !ok {
		return 0, false, nil
	}
	t, err := time.Parse("2006-01-02 15:04:05.999999-07", sent)
	if err != nil {
		return 0, false, fmt.Errorf("parse %q: %w", sent, err)
	}
	return float64(now.Sub(t).Microseconds()) / 1000, true, nil
}

func (s *latencySink) stats() (p50, p99, maxL float64, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lat) == 0 {
		return 0, 0, 0, 0
	}
	l := slices.Clone(s.lat)
	slices.Sort(l)
	at := func(q float64) float64 { return l[min(len(l)-1, int(q*float64(len(l))))] }
	return at(0.5), at(0.99), l[len(l)-1], len(l)
}

// backfillTable runs one bounded backfill of table with chunk size into sink, on a slot of its own.
func (b *bench) backfillTable(ctx context.Context, table string, chunk int, sink merge.Sink) (time.Duration, error) {
	saved := b.chunk
	b.chunk = chunk
	defer func() { b.chunk = saved }()
	return b.backfillOf(ctx, b.nextSlot(), []string{table}, 1, sink, false)
}

// benchParts is how many tables the readers figures split bench_rows' rows into.
const benchParts = 4

// readers measures the backfill of bench_rows' rows split into benchParts tables (by id modulo
// benchParts, each with the same key and columns), output encoded and discarded, by one reader
// and by two (Config.Readers: the tables in parallel, each reader with its own backend), against
// the COPY of bench_rows.
func (b *bench) readers(ctx context.Context) error {
	var names []string
	stmts := []string{}
	for i := range benchParts {
		name := fmt.Sprintf("bench_part_%d", i+1)
		names = append(names, name)
		stmts = append(stmts,
			fmt.Sprintf(`CREATE TABLE public.%s AS SELECT * FROM public.bench_rows WHERE id %% %d = %d`, name, benchParts, i),
			fmt.Sprintf(`ALTER TABLE public.%s ADD PRIMARY KEY (id)`, name),
			fmt.Sprintf(`VACUUM ANALYZE public.%s`, name),
			fmt.Sprintf(`ALTER PUBLICATION bench ADD TABLE public.%s`, name))
	}
	start := time.Now()
	if err := execAll(ctx, b.dsn, stmts...); err != nil {
		return fmt.Errorf("readers: %w", err)
	}
	b.printf("# bench_part_1..%d: bench_rows' rows in %d tables, built in %s\n", benchParts, benchParts, time.Since(start).Round(time.Second))
	for _, n := range []int{1, 2} {
		var outMB float64
		d, err := b.median(func() (time.Duration, error) {
			s := &discardSink{pool: jsonl.NewPool(b.types, b.encoders)}
			d, err := b.backfillOf(ctx, b.nextSlot(), names, n, s, false)
			outMB = float64(s.bytes.Load()) / 1e6
			return d, err
		})
		if err != nil {
			return err
		}
		b.line(fmt.Sprintf("readers.%d_of_%d_tables", n, benchParts), d, float64(b.rows), outMB, fmt.Sprintf("ratio_to_copy=%.2f", b.copyS.Seconds()/d.Seconds()))
	}
	// One table, by one reader, and by two: its backfill split into key ranges, one per reader
	// (I23).
	for _, n := range []int{1, 2} {
		var outMB float64
		d, err := b.median(func() (time.Duration, error) {
			s := &discardSink{pool: jsonl.NewPool(b.types, b.encoders)}
			d, err := b.backfillOf(ctx, b.nextSlot(), []string{"bench_rows"}, n, s, false)
			outMB = float64(s.bytes.Load()) / 1e6
			return d, err
		})
		if err != nil {
			return err
		}
		b.line(fmt.Sprintf("readers.%d_of_1_table", n), d, float64(b.rows), outMB, fmt.Sprintf("ratio_to_copy=%.2f", b.copyS.Seconds()/d.Seconds()))
	}
	return nil
}

// kafka times the backfill of bench_rows into a Kafka output (three partitions, a Kafka
// transaction per checkpoint), as a ratio to the same backfill encoded as JSON lines.
func (b *bench) kafka(ctx context.Context) error {
	return b.outputBackfill(ctx, "kafka", func(slot, name string) (sink.Output, error) {
		s, _, err := kafka.Open(ctx, kafka.Options{Address: kafka.Address{Brokers: b.brokers, Prefix: name}, Tables: []string{"public.bench_rows"},
			Partitions: 3, Slot: slot, Types: b.types, Log: b.log}, func() error { return nil })
		return s, err
	})
}

// nats times the backfill of bench_rows into a NATS JetStream output (three subjects, each
// message acknowledged before the checkpoint), as a ratio to the same backfill encoded as JSON
// lines.
func (b *bench) nats(ctx context.Context) error {
	return b.outputBackfill(ctx, "nats", func(slot, name string) (sink.Output, error) {
		s, _, err := nats.Open(ctx, nats.Options{Address: nats.Address{Servers: b.natsServers, Stream: name}, Tables: []string{"public.bench_rows"},
			Partitions: 3, Slot: slot, Types: b.types, Log: b.log}, func() error { return nil })
		return s, err
	})
}

// outputBackfill times the backfill of bench_rows into the output open opens (a prefix or stream
// name of the run's own, tidemark_bench_*, which stays) and, for the ratio, the same backfill
// encoded as JSON lines and discarded: the lines GROUP.jsonl_reference and GROUP.backfill.
func (b *bench) outputBackfill(ctx context.Context, group string, open func(slot, name string) (sink.Output, error)) error {
	names := []string{"bench_rows"}
	var outMB float64
	jd, err := b.median(func() (time.Duration, error) {
		s := &discardSink{pool: jsonl.NewPool(b.types, b.encoders)}
		d, err := b.backfillOf(ctx, b.nextSlot(), names, 1, s, false)
		outMB = float64(s.bytes.Load()) / 1e6
		return d, err
	})
	if err != nil {
		return err
	}
	b.line(group+".jsonl_reference", jd, float64(b.rows), outMB, "")
	od, err := b.median(func() (time.Duration, error) {
		slot := b.nextSlot()
		s, err := open(slot, fmt.Sprintf("tidemark_bench_%d_%s", time.Now().Unix(), slot))
		if err != nil {
			return 0, err
		}
		defer s.Close(context.WithoutCancel(ctx))
		return b.backfillOf(ctx, slot, names, 1, s, false)
	})
	if err != nil {
		return err
	}
	b.line(group+".backfill", od, float64(b.rows), outMB, fmt.Sprintf("ratio_to_jsonl=%.2f", jd.Seconds()/od.Seconds()))
	return nil
}

// pgcopydb times `pgcopydb clone` of the bench database into a fresh one.
func (b *bench) pgcopydb(ctx context.Context) (time.Duration, error) {
	b.slots++
	db := fmt.Sprintf("bench_pgcopydb_%d", b.slots)
	if err := b.srv.CreateDatabase(ctx, db); err != nil {
		return 0, err
	}
	defer b.srv.DropDatabase(context.WithoutCancel(ctx), db)
	bin, err := pgserver.FindBinDir()
	if err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "tidemark-pgcopydb-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	srcDSN, env := b.srv.ClientDSN("bench")
	tgtDSN, _ := b.srv.ClientDSN(db)
	cmd := exec.CommandContext(ctx, "pgcopydb", "clone", "--source", pgURL(srcDSN), "--target", pgURL(tgtDSN),
		"--dir", dir, "--table-jobs", "2", "--index-jobs", "2", "--no-owner", "--no-acl")
	cmd.Env = append(append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH")), env...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("pgcopydb: %w: %s", err, tailOf(out.String()))
	}
	return time.Since(start), nil
}

func tailOf(s string) string {
	if len(s) > 1500 {
		return s[len(s)-1500:]
	}
	return s
}

// pgURL turns a key=value connection string into a URL (pgcopydb wants one).
func pgURL(dsn string) string {
	c, err := pgx.ParseConfig(dsn)
	if err != nil {
		return dsn
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", url.PathEscape(c.User), c.Host, c.Port, url.PathEscape(c.Database))
}

// airbyteRead times the connector's first sync of bench_rows, its output discarded.
func (b *bench) airbyteRead(ctx context.Context, mb *float64, rss *int64) (time.Duration, error) {
	b.slots++
	slot := fmt.Sprintf("bench_ab_%d", b.slots)
	c, err := pgx.ParseConfig(b.dsn)
	if err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "tidemark-bench-ab-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	config := fmt.Sprintf(`{"host":%q,"port":%d,"database":%q,"username":%q,"password":%q,"ssl_mode":{"mode":"disable"},
		"replication_method":{"method":"CDC","replication_slot":%q,"publication":"bench"},"create_replication_slot":true,"backfill_chunk_size":%d}`,
		c.Host, c.Port, c.Database, c.User, c.Password, slot, b.chunk)
	catalog := `{"streams":[{"stream":{"name":"bench_rows","namespace":"public","json_schema":{"type":"object"},"supported_sync_modes":["full_refresh","incremental"]},
		"sync_mode":"incremental","destination_sync_mode":"append_dedup"}]}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o600); err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, "catalog.json"), []byte(catalog), 0o600); err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, b.connector, "read", "--config", filepath.Join(dir, "config.json"), "--catalog", filepath.Join(dir, "catalog.json"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	n, _ := io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return 0, fmt.Errorf("connector read: %w: %s", err, tailOf(stderr.String()))
	}
	d := time.Since(start)
	*mb = float64(n) / 1e6
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		*rss = max(*rss, ru.Maxrss)
	}
	_ = execAll(ctx, b.dsn, sqlfix.DropSlot(slot))
	return d, nil
}

// streaming writes b.changes inserts in transactions of 1000 rows with two slots waiting, then
// times pg_recvlogical and Tidemark reading them (each the median of the repetitions, on slots
// of their own).
func (b *bench) streaming(ctx context.Context) (recv, tm time.Duration, recvCPU, tmCPU cpuTimes, err error) {
	if err := execAll(ctx, b.dsn, `CREATE TABLE public.bench_stream (id bigint PRIMARY KEY, v text, n numeric, ts timestamptz); CREATE PUBLICATION bench_stream FOR TABLE public.bench_stream`); err != nil {
		return 0, 0, recvCPU, tmCPU, err
	}
	var recvSlots, tmSlots []string
	for i := range b.reps {
		for _, kind := range []string{"recv", "tm"} {
			slot := fmt.Sprintf("bench_stream_%s_%d", kind, i)
			if err := execAll(ctx, b.dsn, sqlfix.CreateSlot(slot)); err != nil {
				return 0, 0, recvCPU, tmCPU, err
			}
			if kind == "recv" {
				recvSlots = append(recvSlots, slot)
			} else {
				tmSlots = append(tmSlots, slot)
			}
		}
	}
	conn, err := pgconf.OpenDefaultSSL(ctx, b.dsn, "tidemark")
	if err != nil {
		return 0, 0, recvCPU, tmCPU, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for from := 1; from <= b.changes; from += 1000 {
		if _, err := conn.Exec(ctx, `INSERT INTO public.bench_stream SELECT g, md5(g::text), g * 1.5, now() FROM generate_series($1::int, $2::int) g`, from, min(from+999, b.changes)); err != nil {
			return 0, 0, recvCPU, tmCPU, err
		}
	}
	var end string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		return 0, 0, recvCPU, tmCPU, err
	}
	bin, err := pgserver.FindBinDir()
	if err != nil {
		return 0, 0, recvCPU, tmCPU, err
	}
	i := 0
	recv, err = b.median(func() (time.Duration, error) {
		slot := recvSlots[i]
		i++
		dsn, env := b.srv.ClientDSN("bench")
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_recvlogical"), "-d", dsn, "--slot", slot, "--start", "--endpos", end,
			"-o", "proto_version=1", "-o", "publication_names=bench_stream", "--no-loop", "-f", "/dev/null")
		cmd.Env = append(os.Environ(), env...)
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("pg_recvlogical: %w: %s", err, out)
		}
		return time.Since(start), nil
	})
	if err != nil {
		return 0, 0, recvCPU, tmCPU, err
	}
	recvCPU = b.lastCPU
	j := 0
	tm, err = b.median(func() (time.Duration, error) {
		slot := tmSlots[j]
		j++
		s := &discardSink{pool: jsonl.NewPool(b.types, b.encoders)}
		cfg := merge.Config{
			Source:           replicator.Config{DSN: b.dsn, Slot: slot, Publication: "bench_stream"},
			Tables:           []merge.TableConfig{{Schema: "public", Name: "bench_stream", NoBackfill: true}},
			AckCheckpoints:   true,
			StopWhenCaughtUp: true,
		}
		eng, err := merge.New(cfg, s, b.log)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		if err := eng.Run(ctx, nil); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	})
	tmCPU = b.lastCPU
	for _, slot := range append(recvSlots, tmSlots...) {
		_ = execAll(ctx, b.dsn, sqlfix.DropSlot(slot))
	}
	return recv, tm, recvCPU, tmCPU, err
}
