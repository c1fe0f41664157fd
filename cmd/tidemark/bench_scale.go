package main

import (
	"context"
	"fmt"
	"image/color"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/sink/jsonl"
	"github.com/tidemark/tidemark/sink/postgres"
)

// scaleBench is `tidemark bench --scale`: one large backfill of bench_rows into each real sink
// (a JSON lines file, another PostgreSQL database), under a live workload (inserts into
// bench_live, updates of random bench_rows), sampled at a fixed interval through the run: the
// backfill's throughput, the live changes' latency, the process's resident set, the WAL the
// slot retains and the source's oldest open transaction. Each should stay flat in time: nothing
// the engine holds grows with the table.
type scaleBench struct {
	*bench
	every   time.Duration // between two samples
	rate    int           // live inserts and updates per second, each
	plot    string        // the PNG of the samples; "" for none
	samples string        // the samples as tab-separated values; "" for none
	updates atomic.Int64  // updates of bench_rows made by the live workload
}

// scaleSample is one sample of a scale run.
type scaleSample struct {
	target   string  // jsonl or postgres
	at       float64 // seconds since the run started
	rows     int64   // backfilled rows emitted so far
	rowsPerS float64 // backfilled rows per second since the last sample
	p99      float64 // the live changes' latency (commit to emit) since the last sample, ms; 0 with none
	live     int     // live changes emitted since the last sample
	rssMB    float64 // this process's resident set
	walMB    float64 // WAL the slot retains (current WAL position - its restart_lsn)
	lagMB    float64 // WAL not yet confirmed (current WAL position - the slot's confirmed flush)
	oldestS  float64 // the source's oldest open transaction, seconds
	xminAge  int64   // the source's oldest snapshot (backend_xmin), in transactions
}

func (b *scaleBench) run(ctx context.Context) error {
	b.printf("# tidemark bench --scale %s rows=%d chunk=%d live=%d/s inserts and %d/s updates, a sample every %s\n",
		time.Now().UTC().Format(time.RFC3339), b.rows, b.chunk, b.rate, b.rate, b.every)
	b.machine()
	// The files of the results are made first: a path that cannot be written fails now, not
	// after the run.
	for _, path := range []string{b.plot, b.samples} {
		if path == "" {
			continue
		}
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		f.Close()
	}
	conn, stop, err := b.open(ctx)
	if err != nil {
		return err
	}
	defer stop()
	if err := b.prepare(ctx, conn); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "tidemark-bench-scale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b.printf("%-15s %8s %10s %10s %8s %6s %8s %8s %8s %9s %8s\n", "#sample", "at_s", "rows", "rows_per_s", "p99_ms", "live", "rss_MB", "wal_MB", "lag_MB", "oldest_s", "xmin_age")
	var all []scaleSample
	for _, target := range []string{"jsonl", "postgres"} {
		samples, err := b.one(ctx, target, dir)
		if err != nil {
			return fmt.Errorf("%s: %w", target, err)
		}
		all = append(all, samples...)
	}
	if b.samples != "" {
		if err := writeSamples(b.samples, all); err != nil {
			return err
		}
	}
	if b.plot != "" {
		if err := plotScale(b.plot, fmt.Sprintf("tidemark bench --scale: %s rows backfilled under %d inserts/s and %d updates/s", thousands(int64(b.rows)), b.rate, b.rate), all); err != nil {
			return err
		}
		b.printf("# plot: %s\n", b.plot)
	}
	return nil
}

// one backfills bench_rows into target under the live workload, sampling, and prints the run's
// summary line.
func (b *scaleBench) one(ctx context.Context, target, dir string) ([]scaleSample, error) {
	src, err := pgconf.OpenDefaultSSL(ctx, b.dsn, "tidemark")
	if err != nil {
		return nil, err
	}
	defer src.Close(context.WithoutCancel(ctx))
	var sink merge.Sink
	var outBytes func() int64
	switch target {
	case "jsonl":
		out := filepath.Join(dir, "scale.jsonl")
		w, _, err := jsonl.Open(out, out+".checkpoint", b.types, func() error { return nil })
		if err != nil {
			return nil, err
		}
		defer w.Close(context.WithoutCancel(ctx))
		defer os.Remove(out)
		sink = w
		outBytes = func() int64 {
			if st, err := os.Stat(out); err == nil {
				return st.Size()
			}
			return 0
		}
	case "postgres":
		if err := b.srv.CreateDatabase(ctx, "bench_scale_target"); err != nil {
			return nil, err
		}
		defer b.srv.DropDatabase(context.WithoutCancel(ctx), "bench_scale_target")
		tgt, err := pgconf.OpenDefaultSSL(ctx, b.srv.DSN("bench_scale_target"), "tidemark")
		if err != nil {
			return nil, err
		}
		defer tgt.Close(context.WithoutCancel(ctx))
		ps, _, err := postgres.Open(ctx, tgt, src, postgres.Options{ID: "scale", Log: b.log})
		if err != nil {
			return nil, err
		}
		defer ps.Close(context.WithoutCancel(ctx))
		sink = ps
	}
	m := &meteredSink{inner: sink}
	slot := b.nextSlot()
	stopWriter := b.writer(ctx, b.rate)
	stopUpdater := b.updater(ctx, b.rate)
	sctx, stopSampler := context.WithCancel(ctx)
	var samples []scaleSample
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() { samples = b.sample(sctx, target, slot, start, m) })
	before := b.measure()
	d, err := b.backfillOf(ctx, slot, []string{"bench_rows"}, 1, m, true)
	cpu := b.measure().sub(before)
	stopSampler()
	wg.Wait()
	stopUpdater()
	stopWriter()
	if err != nil {
		return nil, err
	}
	lat := m.allLatencies()
	p99, maxL := quantile(lat, 0.99), quantile(lat, 1)
	var peakRSS, peakWAL, peakLag, peakOldest float64
	var peakXmin int64
	for _, s := range samples {
		peakRSS, peakWAL, peakLag = max(peakRSS, s.rssMB), max(peakWAL, s.walMB), max(peakLag, s.lagMB)
		peakOldest, peakXmin = max(peakOldest, s.oldestS), max(peakXmin, s.xminAge)
	}
	perM := 1e6 / float64(b.rows)
	out := ""
	if outBytes != nil {
		out = fmt.Sprintf(" output_MB=%.0f", float64(outBytes())/1e6)
	}
	b.printf("%-24s rows=%d s=%.1f rows_per_s=%.0f client_cpu_s_per_M=%.2f server_cpu_s_per_M=%.2f live_p99_ms=%.1f live_max_ms=%.1f live=%d peak_rss_MB=%.0f peak_wal_MB=%.0f peak_lag_MB=%.0f oldest_xact_s=%.2f xmin_age=%d%s\n",
		"scale."+target, m.rows.Load(), d.Seconds(), float64(m.rows.Load())/d.Seconds(), cpu.client*perM, cpu.server*perM,
		p99, maxL, len(lat), peakRSS, peakWAL, peakLag, peakOldest, peakXmin, out)
	// A row updated inside its chunk's window comes as the update instead of the chunk's row.
	if got, updated := m.rows.Load(), b.updates.Load(); got+updated < int64(b.rows) {
		return nil, fmt.Errorf("the backfill emitted %d rows of %d, with %d updates meanwhile", got, b.rows, updated)
	}
	if target == "postgres" {
		var n int64
		if err := queryRow(ctx, b.srv.DSN("bench_scale_target"), `SELECT count(*) FROM public.bench_rows`, &n); err != nil {
			return nil, err
		}
		if err := want("the target", n, b.rows); err != nil {
			return nil, err
		}
	}
	return samples, nil
}

// sample takes a sample every b.every until ctx ends, and one at the end.
func (b *scaleBench) sample(ctx context.Context, target, slot string, start time.Time, m *meteredSink) []scaleSample {
	conn, err := pgconf.OpenDefaultSSL(ctx, b.dsn, "tidemark")
	if err != nil {
		return nil
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t := time.NewTicker(b.every)
	defer t.Stop()
	var out []scaleSample
	last, lastAt := int64(0), start
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-t.C:
		}
		now := time.Now()
		s := scaleSample{target: target, at: now.Sub(start).Seconds(), rows: m.rows.Load(), rssMB: float64(procStatus("VmRSS")) * 1024 / 1e6}
		s.rowsPerS = float64(s.rows-last) / now.Sub(lastAt).Seconds()
		last, lastAt = s.rows, now
		lat := m.takeLatencies()
		s.p99, s.live = quantile(lat, 0.99), len(lat)
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = conn.QueryRow(qctx, `SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) / 1e6, 0)::float8,
			coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) / 1e6, 0)::float8 FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s.walMB, &s.lagMB)
		// The transactions of the source database (the target's, in another database of the
		// same server, are not the source's).
		_ = conn.QueryRow(qctx, `SELECT greatest(coalesce(extract(epoch FROM clock_timestamp() - min(xact_start)), 0), 0)::float8, coalesce(max(age(backend_xmin)), 0)::int8
			FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND datname = current_database() AND xact_start IS NOT NULL`).Scan(&s.oldestS, &s.xminAge)
		cancel()
		b.printf("%-15s %8.1f %10d %10.0f %8.1f %6d %8.0f %8.1f %8.1f %9.2f %8d\n", "sample."+target, s.at, s.rows, s.rowsPerS, s.p99, s.live, s.rssMB, s.walMB, s.lagMB, s.oldestS, s.xminAge)
		out = append(out, s)
	}
	return out
}

// updater updates random rows of bench_rows at rate per second until stopped.
func (b *scaleBench) updater(ctx context.Context, rate int) (stop func()) {
	r := rand.New(rand.NewPCG(1, 2))
	return b.repeat(ctx, rate, func(ctx context.Context, conn *pgx.Conn) {
		if _, err := conn.Exec(ctx, `UPDATE public.bench_rows SET k = k + 1 WHERE id = $1`, 1+r.IntN(b.rows)); err == nil {
			b.updates.Add(1)
		}
	})
}

// meteredSink counts the backfilled rows passing to inner, and the latency of each insert into
// bench_live (commit to emit, as latencySink).
type meteredSink struct {
	inner merge.Sink
	rows  atomic.Int64
	mu    sync.Mutex
	lat   []float64 // ms, since the last takeLatencies
	all   []float64 // ms, every one
}

func (s *meteredSink) Emit(ctx context.Context, evs []merge.Event) error {
	now := time.Now()
	var n int64
	for i := range evs {
		ev := &evs[i]
		if ev.Op == merge.Snapshot {
			n++
			continue
		}
		ms, ok, err := liveLatency(ev, now)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		s.mu.Lock()
		s.lat, s.all = append(s.lat, ms), append(s.all, ms)
		s.mu.Unlock()
	}
	s.rows.Add(n)
	return s.inner.Emit(ctx, evs)
}

func (s *meteredSink) Checkpoint(ctx context.Context, pos *merge.Position) error {
	return s.inner.Checkpoint(ctx, pos)
}

func (s *meteredSink) takeLatencies() []float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lat
	s.lat = nil
	return l
}

func (s *meteredSink) allLatencies() []float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.all)
}

// quantile is the q-quantile of l (0 when l is empty); it sorts l.
func quantile(l []float64, q float64) float64 {
	if len(l) == 0 {
		return 0
	}
	slices.Sort(l)
	return l[min(len(l)-1, int(q*float64(len(l))))]
}

// procStatus reads a field of this process's /proc status, in kB (0 when it cannot).
func procStatus(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kib
		}
	}
	return 0
}

// writeSamples writes the samples as tab-separated values with a header line.
func writeSamples(path string, samples []scaleSample) error {
	var sb strings.Builder
	sb.WriteString("target\tat_s\trows\trows_per_s\tp99_ms\tlive\trss_MB\twal_MB\tlag_MB\toldest_s\txmin_age\n")
	for _, s := range samples {
		fmt.Fprintf(&sb, "%s\t%.1f\t%d\t%.0f\t%.2f\t%d\t%.1f\t%.2f\t%.2f\t%.3f\t%d\n", s.target, s.at, s.rows, s.rowsPerS, s.p99, s.live, s.rssMB, s.walMB, s.lagMB, s.oldestS, s.xminAge)
	}
	return os.WriteFile(path, []byte(sb.String()), 0o644)
}

// plotScale draws the samples: one panel per measure, one line per target.
func plotScale(path, title string, samples []scaleSample) error {
	colors := map[string]color.RGBA{"jsonl": {0x1f, 0x77, 0xb4, 0xff}, "postgres": {0xd6, 0x27, 0x28, 0xff}}
	measures := []struct {
		title string
		value func(scaleSample) float64
	}{
		{"backfilled rows per second", func(s scaleSample) float64 { return s.rowsPerS }},
		{"p99 latency of live changes, ms (commit to emit)", func(s scaleSample) float64 { return s.p99 }},
		{"resident set of the engine's process, MB", func(s scaleSample) float64 { return s.rssMB }},
		{"WAL retained by the slot (from its restart_lsn), MB", func(s scaleSample) float64 { return s.walMB }},
		{"WAL not yet confirmed (from the slot's confirmed flush), MB", func(s scaleSample) float64 { return s.lagMB }},
		{"oldest open transaction on the source, s", func(s scaleSample) float64 { return s.oldestS }},
	}
	var panels []panel
	for _, m := range measures {
		p := panel{title: m.title}
		for _, target := range []string{"jsonl", "postgres"} {
			sr := series{name: target, color: colors[target]}
			for _, s := range samples {
				if s.target == target {
					sr.xs, sr.ys = append(sr.xs, s.at), append(sr.ys, m.value(s))
				}
			}
			if len(sr.xs) > 0 {
				p.series = append(p.series, sr)
			}
		}
		panels = append(panels, p)
	}
	return plotPNG(path, title, "seconds since the backfill started", panels)
}

// thousands formats n with thin separators: 50,000,000.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
