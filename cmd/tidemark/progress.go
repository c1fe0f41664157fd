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
	estimate    map[string]int64 // rows estimated at the start (estimateSQL); -1 unknown
	base        map[string]int64 // rows a resumed backfill had emitted before this run
	earlier     map[string]bool  // the backfill was done before this run
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
	s := &syncStats{start: time.Now(), estimate: map[string]int64{}, base: map[string]int64{}, earlier: map[string]bool{}, snapshot: map[string]int64{}, done: map[string]bool{},
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

// Replaying says whether the output is writing again what it holds past its checkpoint, when it
// can (merge.Replayer).
func (w statsSink) Replaying() bool {
	r, ok := w.Sink.(merge.Replayer)
	return ok && r.Replaying()
}

// Leftover says whether the output holds events of a run before that this one will not read
// again, when it can tell (merge.Leftover).
func (w statsSink) Leftover(start pglogrepl.LSN) bool {
	l, ok := w.Sink.(merge.Leftover)
	return ok && l.Leftover(start)
}

// Resume tells the output where the run resumes, when it asks (merge.Resumer).
func (w statsSink) Resume(pos *merge.Position, over bool) {
	if r, ok := w.Sink.(merge.Resumer); ok {
		r.Resume(pos, over)
	}
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

// estimateSQL estimates the rows of table $1 without trusting reltuples alone: it is -1 until a
// table is first vacuumed or analyzed (right after a load or a restore), and always for a
// partitioned table. So: over the table's leaf partitions (the table itself when it has none),
// each leaf's reltuples when known, otherwise its pages on disk times the rows a page holds for
// the leaf's column widths (a variable-length column counted as 32 bytes); NULL when the table
// cannot be read.
const estimateSQL = `SELECT sum(CASE WHEN c.reltuples >= 0 THEN c.reltuples
		ELSE floor(pg_relation_size(c.oid) / current_setting('block_size')::float8)
			* floor((current_setting('block_size')::float8 - 24) / (28 + coalesce((SELECT sum(CASE WHEN t.typlen > 0 THEN t.typlen ELSE 32 END)
				FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), 0)))
		END)::float8
	FROM pg_class c WHERE c.oid IN (SELECT l.relid FROM pg_partition_tree(to_regclass($1)) l WHERE l.isleaf
		UNION SELECT to_regclass($1) WHERE NOT EXISTS (SELECT FROM pg_partition_tree(to_regclass($1)) l WHERE l.isleaf AND l.relid <> to_regclass($1)))`

// estimates reads each table's estimated row count (estimateSQL); -1 when unknown.
func (s *syncStats) estimates(ctx context.Context, conn *pgx.Conn) {
	for _, name := range s.tables {
		schema, table, _ := strings.Cut(name, ".")
		n := -1.0
		var v *float64
		// pg_relation_size takes the table's lightest lock: behind an ALTER TABLE's it waits
		// at most a moment, and the estimate is unknown.
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '500ms'`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, estimateSQL, pgx.Identifier{schema, table}.Sanitize()).Scan(&v)
		})
		if err == nil && v != nil {
			n = *v
		}
		s.mu.Lock()
		s.estimate[name] = int64(n)
		s.mu.Unlock()
	}
}

// resumed records what the position a run resumes from says of each table: a backfill done
// earlier (with its rows), or the rows a backfill in progress had emitted.
func (s *syncStats) resumed(from *merge.Position) {
	if from == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, p := range from.Tables {
		if p.Refresh {
			continue
		}
		// Another attempt of the same process resumes here too: its rows are in the base now.
		s.base[name], s.snapshot[name] = p.Rows, 0
		delete(s.firstRow, name)
		if p.Done && len(p.Reread) == 0 {
			s.earlier[name] = true
			s.done[name] = true
		}
	}
}

// progressText is a table's progress as the display and the log lines show it: rows so far of
// the estimate, a percentage that reaches 100 only when the engine says the backfill is done,
// "done earlier" for a table a previous run finished. The caller holds s.mu.
func (s *syncStats) progressText(name string) (rows, pct string) {
	cur, est := s.base[name]+s.snapshot[name], s.estimate[name]
	switch {
	case s.earlier[name] && s.snapshot[name] == 0:
		return fmt.Sprintf("done earlier (%d rows)", cur), "100 %"
	case s.done[name]:
		return fmt.Sprintf("%d rows", cur), "100 %"
	case est < 0:
		return fmt.Sprintf("%d / ? rows", cur), "? %"
	case cur >= est:
		// Past the estimate: it was stale.
		return fmt.Sprintf("%d / ~%d rows", cur, est), "99 %"
	default:
		return fmt.Sprintf("%d / ~%d rows", cur, est), fmt.Sprintf("%d %%", min(99, cur*100/max(est, 1)))
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
		rows := decor.Any(func(decor.Statistics) string {
			s.mu.Lock()
			defer s.mu.Unlock()
			r, _ := s.progressText(name)
			return r
		}, decor.WCSyncWidth)
		pct := decor.Any(func(decor.Statistics) string {
			s.mu.Lock()
			defer s.mu.Unlock()
			_, p := s.progressText(name)
			return p
		}, decor.WCSyncSpace)
		rate := decor.Any(func(decor.Statistics) string {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.earlier[name] && s.snapshot[name] == 0 {
				return ""
			}
			return fmt.Sprintf("%.0f rows/s", s.rate(name, time.Now()))
		}, decor.WCSyncSpace)
		// Names, counters and rates each in a column of their own width, the same on every bar.
		// The bar is complete only when the engine says the backfill is done (update).
		// A bar made with a total would complete once its rows reach it (a stale estimate):
		// made without, it completes only when update says so.
		bars[name] = p.AddBar(0, mpb.BarWidth(30),
			mpb.PrependDecorators(decor.Name(name, decor.WCSyncSpaceR), rows),
			mpb.AppendDecorators(pct, rate,
				decor.OnComplete(decor.EwmaETA(decor.ET_STYLE_GO, 30, decor.WCSyncSpace), "done")))
	}
	s.mu.Unlock()
	// The live line is text only: no bar, which would stay empty.
	live := p.New(0, mpb.NopStyle(), mpb.BarFillerClearOnComplete(), mpb.PrependDecorators(decor.Any(func(decor.Statistics) string {
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
			states[name] = state{s.base[name] + s.snapshot[name], s.estimate[name], s.done[name]}
		}
		s.mu.Unlock()
		for name, b := range bars {
			st := states[name]
			if st.done {
				b.SetTotal(max(st.cur, 1), true)
				continue
			}
			// Never complete before the engine says so: the total stays above the rows so far
			// (an unknown one is drawn as twice the rows so far: the bar says nothing it knows).
			total := max(st.estimate, st.cur+1)
			if st.estimate < 0 {
				total = 2*st.cur + 1
			}
			b.SetTotal(total, false)
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
		rows, pct := s.progressText(name)
		ev = ev.Str(name, rows+", "+pct)
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
