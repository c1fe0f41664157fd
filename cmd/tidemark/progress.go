package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/tidemark/tidemark/cmd/internal/preflight"
	"github.com/tidemark/tidemark/merge"
)

// syncStats follows a sync: what the sink was handed, what the source says. The sink side is
// written from the merge loop's goroutine, the source side by the poller; both are read by the
// display and by Prometheus.
type syncStats struct {
	mu          sync.Mutex
	start       time.Time
	tables      []string
	estimate    map[string]int64 // rows, from pg_class.reltuples at the start
	snapshot    map[string]int64 // backfilled rows emitted
	done        map[string]bool
	chunks      map[string]int64
	events      map[[2]string]int64  // by table and op
	changes     int64                // stream events
	lastLSN     pglogrepl.LSN        // position of the last event or checkpoint
	lastCommit  time.Time            // commit time of the last stream event
	checkpoint  time.Time            // when the last checkpoint was taken
	walLSN      pglogrepl.LSN        // the source's current WAL position (polled)
	retainedWAL int64                // bytes the slot retains (polled)
	abandoned   map[string]int64     // chunks abandoned, by reason class
	pending     []time.Time          // commit times of sampled stream events not yet checkpointed
	latencies   []float64            // source commit to durable in the target, ms (sampled)
	backfilled  time.Duration        // time from the start until every backfill was done
	firstRow    map[string]time.Time // when the table's first backfilled row was emitted
	doneAt      map[string]time.Time // when a checkpoint first had the table's backfill done
	reconnects  int64                // runs restarted after a lost connection
}

func newSyncStats(tables []merge.TableConfig) *syncStats {
	s := &syncStats{start: time.Now(), estimate: map[string]int64{}, snapshot: map[string]int64{}, done: map[string]bool{},
		chunks: map[string]int64{}, events: map[[2]string]int64{}, abandoned: map[string]int64{},
		firstRow: map[string]time.Time{}, doneAt: map[string]time.Time{}}
	for _, t := range tables {
		s.tables = append(s.tables, t.Schema+"."+t.Name)
	}
	return s
}

// statsSink counts what passes through it to the real sink.
type statsSink struct {
	merge.Sink
	s *syncStats
}

func (w statsSink) Emit(ctx context.Context, evs []merge.Event) error {
	if err := w.Sink.Emit(ctx, evs); err != nil {
		return err
	}
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range evs {
		ev := &evs[i]
		table := ev.Columns.Schema + "." + ev.Columns.Table
		s.events[[2]string{table, ev.Op.String()}]++
		if ev.Op == merge.Snapshot {
			if s.snapshot[table] == 0 {
				s.firstRow[table] = time.Now()
			}
			s.snapshot[table]++
		} else {
			s.changes++
			s.lastCommit = ev.Time
			if i%16 == 0 && len(s.pending) < 1<<16 {
				s.pending = append(s.pending, ev.Time)
			}
		}
		s.lastLSN = max(s.lastLSN, ev.LSN)
	}
	return nil
}

func (w statsSink) Checkpoint(ctx context.Context, pos *merge.Position) error {
	if err := w.Sink.Checkpoint(ctx, pos); err != nil {
		return err
	}
	s := w.s
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checkpoint = now
	s.lastLSN = max(s.lastLSN, pos.LSN)
	for _, t := range s.pending {
		if len(s.latencies) < 1<<20 {
			s.latencies = append(s.latencies, float64(now.Sub(t).Microseconds())/1000)
		}
	}
	s.pending = s.pending[:0]
	all := len(pos.Tables) > 0
	for name, p := range pos.Tables {
		s.done[name] = p.Done && len(p.Reread) == 0
		if s.done[name] && s.doneAt[name].IsZero() {
			s.doneAt[name] = now
		}
		s.chunks[name] = p.Chunks
		all = all && s.done[name]
	}
	if all && s.backfilled == 0 {
		s.backfilled = now.Sub(s.start)
	}
	return nil
}

// abandonedHook counts abandoned chunks by the class of their reason.
func (s *syncStats) abandonedHook(_ context.Context, _ string, reason error) {
	class := "other"
	msg := reason.Error()
	for _, c := range []string{"invisible", "definition", "truncated", "did not come back", "withdrawn"} {
		if strings.Contains(msg, c) {
			class = map[string]string{"invisible": "visibility", "definition": "schema", "truncated": "truncate",
				"did not come back": "stale", "withdrawn": "withdrawn"}[c]
			break
		}
	}
	s.mu.Lock()
	s.abandoned[class]++
	s.mu.Unlock()
}

// lag returns the WAL not yet processed, in bytes, and an estimate of how old it is: the age of
// the last change processed while there is unprocessed WAL, 0 when caught up.
func (s *syncStats) lag() (int64, float64) {
	if s.walLSN == 0 || s.lastLSN == 0 || s.walLSN <= s.lastLSN {
		return 0, 0
	}
	b := int64(s.walLSN - s.lastLSN)
	if b < 64<<10 || s.lastCommit.IsZero() {
		return b, 0
	}
	return b, time.Since(s.lastCommit).Seconds()
}

// poll reads the source's WAL position and the slot's retained WAL every second until ctx ends.
func (s *syncStats) poll(ctx context.Context, conn *pgx.Conn, slot string) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		var wal string
		var retained *int64
		err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text,
			(SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&wal, &retained)
		if err == nil {
			lsn, _ := pglogrepl.ParseLSN(wal)
			s.mu.Lock()
			s.walLSN = lsn
			if retained != nil {
				s.retainedWAL = *retained
			}
			s.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// estimates reads each table's estimated row count.
func (s *syncStats) estimates(ctx context.Context, conn *pgx.Conn) {
	for _, name := range s.tables {
		schema, table, _ := strings.Cut(name, ".")
		var n float64
		if err := conn.QueryRow(ctx, `SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = to_regclass($1)`, pgx.Identifier{schema, table}.Sanitize()).Scan(&n); err == nil {
			s.mu.Lock()
			s.estimate[name] = int64(n)
			s.mu.Unlock()
		}
	}
}

// rate is the table's backfill rate in rows per second: from its first row to its end, or to
// now while it runs. The caller holds s.mu.
func (s *syncStats) rate(name string, now time.Time) float64 {
	first := s.firstRow[name]
	if first.IsZero() {
		return 0
	}
	end := now
	if !s.doneAt[name].IsZero() {
		end = s.doneAt[name]
	}
	return float64(s.snapshot[name]) / max(end.Sub(first).Seconds(), 0.001)
}

// display shows the progress until ctx ends: bars on a terminal, with the log lines written
// meanwhile above them; a log line every 10 seconds otherwise.
func (s *syncStats) display(ctx context.Context, e *env) {
	log := e.log
	if !e.terminal {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.logLine(log)
			}
		}
	}
	// The caller found out that out is a terminal; ForceTTY keeps mpb from asking again.
	p := mpb.New(mpb.WithOutput(e.stderr), mpb.WithRefreshRate(250*time.Millisecond), mpb.ForceTTY(), mpb.WithAutoRefresh())
	// Log lines go above the bars while they are drawn, and to the terminal again once the
	// display has ended (p.Wait below): a line written in between falls back by itself.
	defer e.logs.above(p)()
	bars := map[string]*mpb.Bar{}
	s.mu.Lock()
	for _, name := range s.tables {
		total := max(s.estimate[name], 1)
		rows := decor.Any(func(st decor.Statistics) string {
			if st.Completed {
				return fmt.Sprintf("%d rows", st.Current)
			}
			return fmt.Sprintf("%d / %d", st.Current, st.Total)
		}, decor.WCSyncWidth)
		rate := decor.Any(func(decor.Statistics) string {
			s.mu.Lock()
			defer s.mu.Unlock()
			return fmt.Sprintf("%.0f rows/s", s.rate(name, time.Now()))
		}, decor.WCSyncSpace)
		// Names, counters and rates each in a column of their own width, the same on every bar.
		bars[name] = p.AddBar(total, mpb.BarWidth(30),
			mpb.PrependDecorators(decor.Name(name, decor.WCSyncSpaceR), rows),
			mpb.AppendDecorators(decor.Percentage(decor.WCSyncSpace), rate,
				decor.OnComplete(decor.EwmaETA(decor.ET_STYLE_GO, 30, decor.WCSyncSpace), "done")))
	}
	s.mu.Unlock()
	live := p.AddBar(0, mpb.BarFillerClearOnComplete(), mpb.PrependDecorators(decor.Any(func(decor.Statistics) string {
		s.mu.Lock()
		defer s.mu.Unlock()
		b, sec := s.lag()
		rate := float64(s.changes) / time.Since(s.start).Seconds()
		return fmt.Sprintf("changes %d (%.0f/s)  lag %s, %.1fs  slot retains %s", s.changes, rate, bytesStr(b), sec, bytesStr(s.retainedWAL))
	})))
	last := time.Now()
	update := func(now time.Time, final bool) {
		// Copy under the lock, update the bars without it: mpb's rendering calls the live
		// line's decorator, which takes the lock.
		type state struct {
			cur, estimate int64
			done          bool
		}
		states := map[string]state{}
		s.mu.Lock()
		for name := range bars {
			states[name] = state{s.snapshot[name], s.estimate[name], s.done[name]}
		}
		s.mu.Unlock()
		for name, b := range bars {
			st := states[name]
			switch {
			case st.done:
				b.SetTotal(st.cur, true)
				continue
			case st.cur >= st.estimate:
				b.SetTotal(st.cur+1, false)
			}
			b.EwmaSetCurrent(st.cur, now.Sub(last))
			if final {
				b.Abort(false)
			}
		}
		last = now
	}
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			update(time.Now(), true)
			live.SetTotal(0, true)
			p.Wait()
			return
		case now := <-t.C:
			update(now, false)
		}
	}
}

func (s *syncStats) logLine(log zerolog.Logger) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ev := log.Info()
	for _, name := range s.tables {
		state := fmt.Sprintf("%d/%d", s.snapshot[name], s.estimate[name])
		if s.done[name] {
			state += " done"
		}
		ev = ev.Str(name, state)
	}
	b, sec := s.lag()
	ev.Int64("changes", s.changes).Int64("lag_bytes", b).Float64("lag_seconds", sec).Int64("slot_retained_bytes", s.retainedWAL).Msg("progress")
}

func bytesStr(n int64) string { return preflight.Bytes(n) }

// percentile returns the q-quantile of the sampled latencies (ms).
func (s *syncStats) percentile(q float64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.latencies) == 0 {
		return 0
	}
	l := slices.Clone(s.latencies)
	slices.Sort(l)
	return l[min(len(l)-1, int(q*float64(len(l))))]
}

var (
	descEvents      = prometheus.NewDesc("tidemark_events_total", "Events written to the target, by table and operation.", []string{"table", "op"}, nil)
	descBackfill    = prometheus.NewDesc("tidemark_backfill_rows_total", "Rows written by the backfill, by table.", []string{"table"}, nil)
	descChunks      = prometheus.NewDesc("tidemark_backfill_chunks_total", "Backfill chunks completed, by table (as of the last checkpoint).", []string{"table"}, nil)
	descDone        = prometheus.NewDesc("tidemark_backfill_done", "1 when the table's backfill is done.", []string{"table"}, nil)
	descLagBytes    = prometheus.NewDesc("tidemark_replication_lag_bytes", "WAL written on the source that the capture has not processed.", nil, nil)
	descLagSeconds  = prometheus.NewDesc("tidemark_replication_lag_seconds", "Age of the last change processed while WAL is pending; 0 when caught up.", nil, nil)
	descRetained    = prometheus.NewDesc("tidemark_slot_retained_wal_bytes", "WAL the replication slot retains on the source.", nil, nil)
	descCheckpoint  = prometheus.NewDesc("tidemark_checkpoint_age_seconds", "Seconds since the last durable checkpoint.", nil, nil)
	descErrors      = prometheus.NewDesc("tidemark_errors_total", "Retried failures, by class (chunks abandoned: visibility, schema, truncate, stale, withdrawn, other).", []string{"class"}, nil)
	descChangesRate = prometheus.NewDesc("tidemark_changes_total", "Changes from the stream written to the target.", nil, nil)
	descReconnects  = prometheus.NewDesc("tidemark_reconnects_total", "Runs restarted from the last checkpoint after a lost connection (source or target).", nil, nil)
)

// Describe and Collect make syncStats a Prometheus collector, read at each scrape.
func (s *syncStats) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEvents, descBackfill, descChunks, descDone, descLagBytes, descLagSeconds, descRetained, descCheckpoint, descErrors, descChangesRate, descReconnects} {
		ch <- d
	}
}

func (s *syncStats) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, n := range s.events {
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(n), k[0], k[1])
	}
	for _, t := range s.tables {
		ch <- prometheus.MustNewConstMetric(descBackfill, prometheus.CounterValue, float64(s.snapshot[t]), t)
		ch <- prometheus.MustNewConstMetric(descChunks, prometheus.CounterValue, float64(s.chunks[t]), t)
		done := 0.0
		if s.done[t] {
			done = 1
		}
		ch <- prometheus.MustNewConstMetric(descDone, prometheus.GaugeValue, done, t)
	}
	b, sec := s.lag()
	ch <- prometheus.MustNewConstMetric(descLagBytes, prometheus.GaugeValue, float64(b))
	ch <- prometheus.MustNewConstMetric(descLagSeconds, prometheus.GaugeValue, sec)
	ch <- prometheus.MustNewConstMetric(descRetained, prometheus.GaugeValue, float64(s.retainedWAL))
	age := 0.0
	if !s.checkpoint.IsZero() {
		age = time.Since(s.checkpoint).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(descCheckpoint, prometheus.GaugeValue, age)
	for c, n := range s.abandoned {
		ch <- prometheus.MustNewConstMetric(descErrors, prometheus.CounterValue, float64(n), c)
	}
	ch <- prometheus.MustNewConstMetric(descChangesRate, prometheus.CounterValue, float64(s.changes))
	ch <- prometheus.MustNewConstMetric(descReconnects, prometheus.CounterValue, float64(s.reconnects))
}

// serveMetrics serves /metrics on addr until ctx ends.
func serveMetrics(ctx context.Context, addr string, s *syncStats, log zerolog.Logger) (func() error, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		done <- err
	}()
	log.Info().Str("addr", ln.Addr().String()).Msg("serving metrics")
	return func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return <-done
	}, nil
}
