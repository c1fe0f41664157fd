package merge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/pgtrust"
	"github.com/tidemark/tidemark/watermark"
)

// workTable is a table as the chunk worker sees it.
type workTable struct {
	name     string
	table    *chunker.Table // as last discovered: its current name, for the chunk queries
	override []string
	progress TableProgress         // as of the last verdict or wake-up
	gen      int                   // the core's re-read generation progress is as of
	parts    []uint32              // the partitions it had when the run started
	storage  []chunker.LeafStorage // its leaf partitions' storage when last looked at (publishing through the root)
	shape    Shape                 // its columns and storage when last looked at
	// member is its membership of the publication when last looked at (Membership), which
	// changes while the run goes on only in ways that keep it published (MembershipKept).
	member string
	// lastAuto is when a rewrite last re-backfilled the table (Config.RebackfillRewrites);
	// waiting, that a rewrite waits for RewriteRebackfillEvery to pass since (said once).
	lastAuto time.Time
	waiting  bool
	// mine: the table was dealt to this reader, which alone refreshes it, reads its rows again,
	// looks at it in watch and splits its backfill; the other readers hold it to read the key
	// ranges of a split backfill that fall to them (range i to reader (owner+i) mod readers).
	mine  bool
	owner int
	// splitTried: this run looked at splitting the table's backfill already.
	splitTried bool
}

// span is which part of its table's backfill a range chunk reads: rng is 1 + the index of its
// key range in TableProgress.Ranges, up to that range's bound to; 0 for a backfill not split.
type span struct {
	rng int
	to  []string
}

// worker runs the chunk protocol: register, low watermark, SELECT, hand over, high watermark,
// verdict. One window is open at a time; between two range chunks of a table, the high
// watermark of one and the low of the next go in one transaction, and the next chunk is read
// while the stream brings the first one's verdict (I22). It is the only user of its query
// connection.
//
// Several workers (Config.Readers) run side by side, each a reader of its own tables on its own
// connection (I23): reader index of n numbers its chunks index+1, index+1+n, ... (ids unique
// across readers; the merge loop routes each verdict by its id), takes the wakeups of its own
// tables, looks at its own tables in watch, and writes a fence when it has nothing left (the run
// ends at a fence once no table has work pending, whichever reader wrote it). Reader 0 seeds the
// guard; the others register no window before it has (seeded).
type worker struct {
	cfg      *Config
	conn     *pgx.Conn
	reader   *chunker.Reader
	writer   *watermark.Writer
	in       chan<- any
	verdicts <-chan verdict
	wake     <-chan wakeup
	log      zerolog.Logger
	tables   []*workTable

	index, readers int           // this reader's index, and how many there are (chunk ids)
	seeded         chan struct{} // closed once reader 0 has seeded the guard (or gave up)
	nextID         int64         // the last id numbered; index+1-readers before the first (newID)
	limit          int           // rows of the next chunk: ChunkSize, less while chunks are too big or too slow
	fails          int           // consecutive abandoned chunks
	rereads        int           // consecutive key-list chunks that left keys to read again
	rereading      bool          // a key-list chunk is in flight
	lastWatch      time.Time
	// seedRunning: the position does not say which commits may still be invisible (a first
	// run, an older position, a table whose capture starts in this run), so the guard starts
	// with every transaction invisible now, when the server has synchronous standbys
	// (guard.seed).
	seedRunning bool

	// Where the backfill's time goes, for the log line at the end of a table.
	markTime, selectTime, waitTime time.Duration

	// stop ends the issuing of chunks (run's stop): a worker told to stop opens no window ahead.
	stop context.Context
	// opened is the window whose low watermark went out with the last chunk's high one (I22),
	// nil when there is none.
	opened *opened
}

// opened is a window whose low watermark was written in one transaction with the high watermark
// of the chunk before it, prev (I22): its chunk is the next range chunk of the same table, read
// from prev's last key before prev's verdict comes.
type opened struct {
	id     int64
	t      *workTable
	span   span     // prev's key range, which this chunk continues
	after  []string // prev's last key: this chunk's exclusive lower bound
	maxKey []string // the backfill's upper bound prev was read with
	prev   int64
	chunk  *chunker.Chunk // prev's chunk, for its verdict
}

// order sorts the tables as configured, and notes their key overrides.
func (w *worker) order(cfg []TableConfig) {
	idx := map[string]int{}
	for i, tc := range cfg {
		idx[tc.Schema+"."+tc.Name] = i
	}
	slices.SortFunc(w.tables, func(a, b *workTable) int { return idx[a.name] - idx[b.name] })
	for _, t := range w.tables {
		t.override = cfg[idx[t.name]].Key
	}
}

// run backfills every table that is not done and reads again the rows waiting for it; with
// StopWhenCaughtUp it then writes the fence the merge loop stops at. Idle, it waits for rows to
// read again. It stops issuing chunks when stop ends.
func (w *worker) run(stop, ctx context.Context) error {
	w.limit, w.stop = w.cfg.ChunkSize, stop
	if w.index == 0 {
		err := w.seed(ctx)
		close(w.seeded)
		if err != nil {
			return err
		}
	} else {
		select {
		case <-w.seeded:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	if err := w.watch(ctx); err != nil {
		return err
	}
	watch := time.NewTicker(w.cfg.WatchInterval)
	defer watch.Stop()
	probes := time.NewTicker(time.Second)
	defer probes.Stop()
	fenced := false
	for {
		worked := false
		for _, t := range w.tables {
			if w.hasWork(t) && (t.progress.Refresh || !t.progress.Done) {
				w.log.Info().Str("table", t.name).Strs("cursor", t.progress.Cursor).Bool("refresh", t.progress.Refresh).Int("ranges", len(t.progress.Ranges)).Msg("backfill started")
			}
			w.markTime, w.selectTime, w.waitTime = 0, 0, 0
			lastReread := false
			for w.hasWork(t) {
				if stop.Err() != nil {
					return nil
				}
				if time.Since(w.lastWatch) >= w.cfg.WatchInterval {
					if err := w.watch(ctx); err != nil {
						return err
					}
				}
				// A re-backfill asked for while another table's backfill runs: its refresh's first
				// window (no rows) goes first, so that its changes are withheld only until then,
				// not for as long as this backfill takes; its rows come in their turn.
				select {
				case up := <-w.wake:
					w.update(up)
				default:
				}
				for _, u := range w.tables {
					if u != t && u.mine && u.progress.Refresh {
						if err := w.refresh(ctx, u); err != nil {
							return err
						}
					}
				}
				if !w.hasWork(t) {
					// A wakeup took this reader's work on t away: a refresh or a restarted
					// backfill of a table another reader owns.
					continue
				}
				reread := t.mine && len(t.progress.Reread) > 0 && (!w.backfills(t) || !lastReread)
				if w.opened != nil && (t.progress.Refresh || reread) {
					// The window opened ahead serves only the table's next range chunk. Its
					// predecessor's verdict first, so that the choice is made on the table's
					// progress as of then (a row it read whole needs no re-read).
					if err := w.settle(ctx); err != nil {
						return err
					}
					continue
				}
				var err error
				switch {
				case t.progress.Refresh:
					err = w.refresh(ctx, t)
				case reread:
					// Taken in turn with the backfill's chunks: rows that keep asking to be
					// read again (each update of a hot row, for the connector) never hold it up.
					err, lastReread = w.reread(ctx, t), true
				default:
					err, lastReread = w.chunk(ctx, t), false
				}
				if err != nil {
					return err
				}
				worked = true
			}
		}
		// No window stays open ahead while the worker idles.
		if err := w.settle(ctx); err != nil {
			return err
		}
		if w.cfg.StopWhenCaughtUp && (worked || !fenced) {
			if err := w.fence(ctx); err != nil {
				return err
			}
			fenced = true
		}
		select {
		case up := <-w.wake:
			w.update(up)
		case <-watch.C:
			if err := w.watch(ctx); err != nil {
				return err
			}
		case <-probes.C:
			// Commits the stream showed become visible: a snapshot says which, so that
			// checkpoints hand only those still invisible to the next run.
			if err := w.probe(ctx); err != nil {
				return err
			}
		case <-stop.Done():
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// hasWork reports whether this reader has work on t: its refresh, rows to read again or backfill
// when t is its own, and the key ranges of a split backfill that fall to it.
func (w *worker) hasWork(t *workTable) bool {
	if t.mine && (t.progress.Refresh || len(t.progress.Reread) > 0) {
		return true
	}
	return !t.progress.Refresh && w.backfills(t)
}

// backfills reports whether this reader has rows of t's backfill to read: a backfill not split
// of its own table, or a key range of a split one that falls to it and is not done.
func (w *worker) backfills(t *workTable) bool {
	if t.progress.Ranges == nil {
		return t.mine && !t.progress.Done
	}
	return w.nextRange(t) >= 0
}

// nextRange is the index of the first key range of t's split backfill that falls to this reader
// and is not done, -1 when none is.
func (w *worker) nextRange(t *workTable) int {
	n := max(1, w.readers)
	for i, r := range t.progress.Ranges {
		if !r.Done && (t.owner+i)%n == w.index {
			return i
		}
	}
	return -1
}

// seed gives the guard, before any chunk, every transaction invisible now when the position
// does not say which commits may still be (see guard.seed), and the server has synchronous
// standbys; without them a commit is visible within microseconds, long before a chunk.
func (w *worker) seed(ctx context.Context) error {
	if !w.seedRunning {
		return nil
	}
	sync, err := chunker.SynchronousStandbys(ctx, w.conn)
	if err != nil || !sync {
		return err
	}
	xids, _, err := chunker.Invisible(ctx, w.conn)
	if err != nil {
		return err
	}
	if len(xids) > 0 {
		w.log.Info().Uints32("xids", xids[:min(len(xids), 20)]).Int("transactions", len(xids)).
			Msg("the server has synchronous standbys: chunks wait until these transactions, which may have committed, are visible")
	}
	return w.send(ctx, seed{xids: xids})
}

// newID numbers the next chunk (or fence) of this reader: unique across the run's readers.
func (w *worker) newID() int64 {
	w.nextID += int64(max(1, w.readers))
	return w.nextID
}

// fence writes the mark a bounded run stops at once the stream has passed it. No window is open
// ahead then (run settles it first).
func (w *worker) fence(ctx context.Context) error {
	id := w.newID()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if _, err = w.writeMarks(ctx, watermark.Mark{ID: id, Kind: watermark.Fence}); err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		w.log.Warn().Err(err).Msg("fence not written; retrying")
		sleep(ctx, time.Duration(attempt+1)*time.Second)
	}
	return err
}

func (w *worker) send(ctx context.Context, v any) error {
	select {
	case w.in <- v:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// wait waits for chunk id's verdict. Meanwhile (behind a backlog of changes, it can be long), it
// takes a snapshot every second: the commits it shows visible need not be handed to the next run;
// and it looks at what the stream does not say when WatchInterval has passed, so that a wait
// never hides a change undone within it (a publish option narrowed and restored).
func (w *worker) wait(ctx context.Context, id int64) (verdict, error) {
	probes := time.NewTicker(time.Second)
	defer probes.Stop()
	for {
		select {
		case v := <-w.verdicts:
			if v.id != id {
				return verdict{}, fmt.Errorf("verdict for chunk %d while chunk %d is in flight", v.id, id)
			}
			return v, nil
		case <-probes.C:
			if err := w.probe(ctx); err != nil {
				return verdict{}, err
			}
			if time.Since(w.lastWatch) >= w.cfg.WatchInterval {
				if err := w.watch(ctx); err != nil {
					return verdict{}, err
				}
			}
		case <-ctx.Done():
			return verdict{}, context.Cause(ctx)
		}
	}
}

// probe hands the core a snapshot taken now (guard.observe).
func (w *worker) probe(ctx context.Context) error {
	snap, err := chunker.CurrentSnapshot(ctx, w.conn)
	if err != nil {
		return err
	}
	return w.send(ctx, probe{snap: snap})
}

func (w *worker) hook(ctx context.Context, h func(context.Context, int64), id int64) {
	if h != nil {
		h(ctx, id)
	}
}

// chunk runs the next range chunk of t to its verdict, or, pipelined (I22), to its high
// watermark written with the next chunk's low one. The first chunk of a backfill also reads its
// upper bound, in the chunk's own snapshot (chunker.Reader.First). A chunk whose window is open
// already is read from the last chunk's end, before that chunk's verdict.
func (w *worker) chunk(ctx context.Context, t *workTable) error {
	if o := w.opened; o != nil && o.t == t {
		upper := o.maxKey
		if o.span.rng > 0 {
			upper = o.span.to
		}
		return w.window(ctx, t, nil, false, o.span, func(ctx context.Context) (*chunker.Chunk, error) {
			return w.reader.Next(ctx, t.table, o.after, upper, w.limit)
		})
	}
	if t.progress.MaxKey == nil {
		t.splitTried = false // a backfill from the start: split again once it has its bound
		return w.window(ctx, t, nil, false, span{}, func(ctx context.Context) (*chunker.Chunk, error) {
			return w.reader.First(ctx, t.table, w.limit)
		})
	}
	if w.splitDue(t) {
		t.splitTried = true
		if err := w.split(ctx, t); err != nil {
			return err
		}
		if !w.hasWork(t) {
			return nil
		}
	}
	if t.progress.Ranges != nil {
		i := w.nextRange(t)
		if i < 0 {
			return nil
		}
		r := t.progress.Ranges[i]
		return w.window(ctx, t, nil, false, span{rng: i + 1, to: r.To}, func(ctx context.Context) (*chunker.Chunk, error) {
			return w.reader.Next(ctx, t.table, r.Cursor, r.To, w.limit)
		})
	}
	return w.window(ctx, t, nil, false, span{}, func(ctx context.Context) (*chunker.Chunk, error) {
		return w.reader.Next(ctx, t.table, t.progress.Cursor, t.progress.MaxKey, w.limit)
	})
}

// splitDue reports whether t's backfill is to be split before its next chunk: several readers,
// a backfill of this reader's own table past its first chunk and not split, not tried yet in
// this run.
func (w *worker) splitDue(t *workTable) bool {
	return w.readers > 1 && t.mine && t.progress.Ranges == nil && t.progress.MaxKey != nil && !t.progress.Done && !t.splitTried
}

// split splits the rest of t's backfill into key ranges, one per reader, when it holds enough
// rows for each reader to read a few chunks of (I23): from a sample of the table's pages
// (chunker.Reader.Split), taken by the core only if t's progress is still the one the sample
// was taken on. A failed sample is no failure: the backfill goes on unsplit.
func (w *worker) split(ctx context.Context, t *workTable) error {
	p := t.progress
	points, est, err := w.reader.Split(ctx, t.table, p.Cursor, p.MaxKey, w.readers)
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		w.log.Warn().Err(err).Str("table", t.name).Msg("the backfill's key ranges could not be sampled: one reader reads it")
		return nil
	}
	if len(points) == 0 || est < float64(2*w.readers*w.cfg.ChunkSize) {
		return nil
	}
	id := w.newID()
	if err := w.send(ctx, split{id: id, table: t.name, from: p.Cursor, maxKey: p.MaxKey, points: points}); err != nil {
		return err
	}
	v, err := w.wait(ctx, id)
	if err != nil {
		return err
	}
	t.take(v)
	if v.completed {
		w.log.Info().Str("table", t.name).Int("ranges", len(t.progress.Ranges)).Float64("rows_estimate", est).Msg("backfill split into key ranges, read by the readers at once")
	}
	return nil
}

// refresh runs the first window of a refresh of t: no rows, its low watermark places the Refresh
// event (core.refresh); the backfill then starts from the beginning.
func (w *worker) refresh(ctx context.Context, t *workTable) error {
	w.log.Info().Str("table", t.name).Msg("the table's output starts over: re-backfill")
	return w.window(ctx, t, nil, true, span{}, func(context.Context) (*chunker.Chunk, error) {
		return &chunker.Chunk{Table: t.table}, nil
	})
}

// take takes a verdict's progress of t, unless t has a newer one: a wakeup built after the
// verdict (a higher gen) and taken before it, which a verdict taken late (I22: the chunk before
// a pipelined one) would otherwise roll back (a row to read again, a refresh, lost until the
// next verdict).
func (t *workTable) take(v verdict) {
	if v.gen >= t.gen {
		t.progress, t.gen = v.progress, v.gen
	}
}

// update takes the merge loop's newer progress of each table (a wakeup).
func (w *worker) update(up wakeup) {
	for _, t := range w.tables {
		if p, ok := up.tables[t.name]; ok && up.gen > t.gen {
			t.progress, t.gen = p, up.gen
		}
	}
}

// reread runs a key-list chunk of t's pending re-reads to its verdict.
func (w *worker) reread(ctx context.Context, t *workTable) error {
	keys := t.progress.Reread[:min(len(t.progress.Reread), w.limit, 1000)]
	w.log.Debug().Str("table", t.name).Int("keys", len(keys)).Msg("re-reading rows whose TOASTed values a change did not carry")
	w.rereading = true
	err := w.window(ctx, t, keys, false, span{}, func(ctx context.Context) (*chunker.Chunk, error) {
		return w.reader.Keys(ctx, t.table, keys)
	})
	w.rereading = false
	// Keys asked for since (an update of a hot row, for the connector) are not this chunk's
	// failure: only its own keys still pending count.
	pending := make(map[string]bool, len(t.progress.Reread))
	for _, k := range t.progress.Reread {
		pending[strings.Join(k, "\x00")] = true
	}
	if !slices.ContainsFunc(keys, func(k []string) bool { return pending[strings.Join(k, "\x00")] }) {
		w.rereads = 0
		return err
	}
	if w.rereads++; w.rereads%10 == 0 {
		w.log.Warn().Str("table", t.name).Int("keys", len(t.progress.Reread)).Int("attempts", w.rereads).
			Msg("rows keep changing without their TOASTed values inside every re-read; ALTER TABLE ... REPLICA IDENTITY FULL ends this")
		sleep(ctx, time.Second)
	}
	return err
}

// errInjectedMark is the failure of a watermark a test build's fault switch failed.
var errInjectedMark = errors.New("watermark failed on purpose (a test build's Faults.FailMark)")

// writeMarks writes marks in one transaction (or fails as a test build's Faults.FailMark says of
// any of them) and returns the WAL flush position after it.
func (w *worker) writeMarks(ctx context.Context, marks ...watermark.Mark) (pglogrepl.LSN, error) {
	for _, m := range marks {
		if w.cfg.Faults.failMark(m) {
			return 0, errInjectedMark
		}
	}
	after, err := w.writer.Write(ctx, w.conn, marks...)
	return pglogrepl.LSN(after), err
}

// window runs the chunk protocol for one chunk of t: register, low watermark, read, hand over,
// high watermark, verdict. keys is a key-list chunk's keys, nil for a range chunk; refresh marks
// a refresh's first window.
//
// Pipelined (I22): a range chunk of t whose window is open already (w.opened) skips the first
// two steps, and after its hand-over takes the verdict of the chunk before it, withdrawing
// itself when that one did not leave the table's cursor where this one starts. A range chunk
// that is not the table's last (and no other work waits) writes its high watermark with the
// next chunk's low one, and returns without its verdict: the next call takes it.
func (w *worker) window(ctx context.Context, t *workTable, keys [][]string, refresh bool, sp span, read func(context.Context) (*chunker.Chunk, error)) error {
	var id int64
	prev := w.opened
	if prev != nil && (prev.t != t || keys != nil || refresh) {
		if err := w.settle(ctx); err != nil {
			return err
		}
		prev = nil
	}
	w.opened = nil
	if prev != nil {
		id = prev.id
	} else {
		id = w.newID()
		if err := w.send(ctx, register{id: id, table: t.name}); err != nil {
			return err
		}
		w.hook(ctx, w.cfg.Hooks.BeforeLow, id)
		start := time.Now()
		if _, err := w.writeMarks(ctx, watermark.Mark{ID: id, Kind: watermark.Low}); err != nil {
			return w.withdraw(ctx, t, id, err)
		}
		w.markTime += time.Since(start)
		w.hook(ctx, w.cfg.Hooks.AfterLow, id)
	}
	start := time.Now()
	c, err := read(ctx)
	if err != nil {
		if prev != nil {
			if _, perr := w.previous(ctx, prev); perr != nil {
				return perr
			}
		}
		return w.withdraw(ctx, t, id, err)
	}
	w.selectTime += time.Since(start)
	maxKey := t.progress.MaxKey
	if prev != nil {
		maxKey = prev.maxKey
	}
	if maxKey == nil {
		maxKey = c.Upper
	}
	if err := w.send(ctx, handover{id: id, chunk: c, maxKey: maxKey, keys: keys, refresh: refresh, rng: sp.rng, to: sp.to}); err != nil {
		return err
	}
	w.hook(ctx, w.cfg.Hooks.AfterSelect, id)
	if prev != nil {
		continues, err := w.previous(ctx, prev)
		if err != nil {
			return err
		}
		if !continues {
			return w.discard(ctx, id, errPredecessor)
		}
	}
	// The next chunk's window opens with this one's high watermark when the next step is the
	// next range chunk of this table.
	var next int64
	if w.pipelines(t, c, keys, refresh) {
		next = w.newID()
		if err := w.send(ctx, register{id: next, table: t.name}); err != nil {
			return err
		}
		w.hook(ctx, w.cfg.Hooks.BeforeLow, next)
	}
	marks := []watermark.Mark{{ID: id, Kind: watermark.High}}
	if next != 0 {
		marks = append(marks, watermark.Mark{ID: next, Kind: watermark.Low})
	}
	// An error writing the high watermark does not say whether it committed: write it again
	// with the same id; the merge loop acts on the first one it sees.
	start = time.Now()
	var after pglogrepl.LSN
	for attempt := 0; ; attempt++ {
		if after, err = w.writeMarks(ctx, marks...); err == nil {
			break
		}
		if ctx.Err() != nil || attempt == 2 {
			werr := w.withdraw(ctx, t, id, err)
			if next != 0 {
				if derr := w.discard(ctx, next, err); derr != nil && werr == nil {
					werr = derr
				}
			}
			return werr
		}
		w.log.Warn().Err(err).Int64("chunk", id).Msg("high watermark not written; retrying")
		sleep(ctx, 100*time.Millisecond)
	}
	// If the stream passes this position without showing the high watermark, the watermark is
	// not coming (the signal table left the publication, say): the window is stale.
	if err := w.send(ctx, highWritten{id: id, after: after}); err != nil {
		return err
	}
	w.markTime += time.Since(start)
	w.hook(ctx, w.cfg.Hooks.AfterHigh, id)
	if next != 0 {
		w.hook(ctx, w.cfg.Hooks.AfterLow, next)
		w.opened = &opened{id: next, t: t, span: sp, after: c.Last, maxKey: maxKey, prev: id, chunk: c}
		return nil
	}
	start = time.Now()
	v, err := w.wait(ctx, id)
	if err != nil {
		return err
	}
	w.waitTime += time.Since(start)
	return w.verdict(ctx, t, c, v)
}

// errPredecessor withdraws a chunk read, pipelined, from the end of a chunk that did not
// complete (or left the table's cursor elsewhere): it is no failure of its own.
var errPredecessor = errors.New("the chunk before it did not complete")

// pipelines reports whether chunk c of t opens the next chunk's window with its high watermark
// (I22): a range chunk that is not the table's last, within the byte bound, while nothing else
// waits (a refresh, rows to read again, a stop).
func (w *worker) pipelines(t *workTable, c *chunker.Chunk, keys [][]string, refresh bool) bool {
	if keys != nil || refresh || c.Done || c.Last == nil || c.Bytes > w.cfg.MaxChunkBytes || w.stop.Err() != nil || len(t.progress.Reread) > 0 {
		return false
	}
	if w.splitDue(t) {
		return false // the next step samples the table for its split
	}
	return !slices.ContainsFunc(w.tables, func(u *workTable) bool { return u.progress.Refresh })
}

// previous takes the verdict of prev's chunk, pipelined before the chunk of prev's window, and
// reports whether that chunk continues the table's cursor.
func (w *worker) previous(ctx context.Context, prev *opened) (bool, error) {
	start := time.Now()
	v, err := w.wait(ctx, prev.prev)
	if err != nil {
		return false, err
	}
	w.waitTime += time.Since(start)
	if err := w.verdict(ctx, prev.t, prev.chunk, v); err != nil {
		return false, err
	}
	p := prev.t.progress
	return v.completed && !p.Refresh && p.continuesAt(prev.span.rng, prev.after, prev.span.to), nil
}

// settle ends a pipelined window that the next step does not use (another table, a key-list
// chunk, a refresh, the fence, a stop): the verdict of the chunk before it, then the window
// withdrawn.
func (w *worker) settle(ctx context.Context) error {
	prev := w.opened
	if prev == nil {
		return nil
	}
	w.opened = nil
	if _, err := w.previous(ctx, prev); err != nil {
		return err
	}
	return w.discard(ctx, prev.id, errors.New("the window was not used"))
}

// discard withdraws window id, which is no chunk's failure, and takes its verdict.
func (w *worker) discard(ctx context.Context, id int64, reason error) error {
	if err := w.send(ctx, abandon{id: id, reason: reason}); err != nil {
		return err
	}
	_, err := w.wait(ctx, id)
	return err
}

// verdict applies the merge loop's verdict on a chunk.
func (w *worker) verdict(ctx context.Context, t *workTable, c *chunker.Chunk, v verdict) error {
	if v.completed {
		t.take(v)
		// A key-list chunk says nothing of how the range chunks fare: taken in turn with them, it
		// would undo their back-off (a statement timeout halves the limit) and their count of
		// failures in a row.
		if !w.rereading {
			w.fails = 0
			switch {
			case c.Bytes > w.cfg.MaxChunkBytes:
				w.limit = max(1, int(int64(w.limit)*int64(w.cfg.MaxChunkBytes)/int64(c.Bytes)))
			case w.limit < w.cfg.ChunkSize:
				w.limit = min(w.cfg.ChunkSize, 2*w.limit)
			case !v.quiet:
				// A live change waited behind the window: back to the configured size, which
				// bounds how long the next one waits behind a chunk's rows.
				w.limit = w.cfg.ChunkSize
			case !c.Done && !c.Capped && len(c.Rows) >= w.limit && 2*c.Bytes <= w.cfg.MaxChunkBytes:
				// Nothing waited behind it: the next chunks grow, within the byte bound, up to
				// ChunkGrowth times the configured size (fewer watermarks and round trips per row).
				w.limit = min(2*w.limit, max(1, w.cfg.ChunkGrowth)*w.cfg.ChunkSize)
			}
		}
		w.log.Debug().Str("table", t.name).Int64("chunk", v.id).Int("rows", len(c.Rows)).Int("emitted", v.emitted).
			Int("bytes", c.Bytes).Strs("cursor", t.progress.Cursor).Msg("chunk done")
		if t.progress.Done {
			w.log.Info().Str("table", t.name).Int64("rows", t.progress.Rows).Int64("chunks", t.progress.Chunks).
				Str("select", w.selectTime.Round(time.Millisecond).String()).Str("watermarks", w.markTime.Round(time.Millisecond).String()).Str("verdicts", w.waitTime.Round(time.Millisecond).String()).Msg("backfill done")
		}
		return nil
	}
	t.take(v)
	if v.rediscover {
		if err := w.rediscover(ctx, t); err != nil {
			return err
		}
	}
	if errors.Is(v.reason, errStale) && w.fails >= 2 {
		if w.writer.Config().Transport == watermark.Messages {
			return fmt.Errorf("chunk %d of %s: %w; the stream does not carry the watermarks' logical messages (prefix %q): check that nothing filters logical messages between the server and Tidemark",
				v.id, t.name, v.reason, watermark.Prefix)
		}
		return fmt.Errorf("chunk %d of %s: %w; check that the signal table %s is in publication %q",
			v.id, t.name, v.reason, w.cfg.SignalTable.Sanitize(), w.cfg.Source.Publication)
	}
	return w.retry(ctx, t, v.reason)
}

// withdraw abandons chunk id after a failure of its own, and waits for its verdict: the high
// watermark may still have committed, and then the chunk completed after all.
func (w *worker) withdraw(ctx context.Context, t *workTable, id int64, cause error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if err := w.send(ctx, abandon{id: id, reason: cause}); err != nil {
		return err
	}
	v, err := w.wait(ctx, id)
	if err != nil {
		return err
	}
	if v.completed {
		t.take(v)
		return nil
	}
	if errors.Is(cause, chunker.ErrSchemaChanged) {
		if err := w.rediscover(ctx, t); err != nil {
			return err
		}
	}
	if pgerr.Canceled(cause) { // statement timeout: smaller chunks
		w.limit = max(1, w.limit/2)
	}
	return w.retry(ctx, t, cause)
}

// retry backs off after a failed chunk, and gives up after too many in a row.
func (w *worker) retry(ctx context.Context, t *workTable, cause error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	w.fails++
	if h := w.cfg.Hooks.ChunkAbandoned; h != nil {
		h(ctx, t.name, cause)
	}
	// A table Tidemark writes that another role could now run code through is no chunk's
	// failure: the capture stops at once, with what to do (pgtrust).
	if errors.Is(cause, pgtrust.ErrUntrusted) {
		return fmt.Errorf("backfill of %s: %w", t.name, cause)
	}
	// Permission denied does not pass with time: stopped at once, with the grant.
	if pgerr.Privilege(cause) {
		return fmt.Errorf("%w: backfill of %s: %w; grant this role SELECT on it (GRANT SELECT ON %s TO <role>;)", ErrNoPrivilege, t.name, cause, t.table.Ident())
	}
	if w.fails > 20 && !errors.Is(cause, errVisibility) {
		return fmt.Errorf("backfill of %s: %d chunks in a row failed, the last with: %w", t.name, w.fails, cause)
	}
	// A commit not yet visible to a chunk's snapshot is normal for a moment (it becomes visible
	// microseconds after it is in the WAL); only a lasting one is worth a warning.
	ev := w.log.Warn()
	if errors.Is(cause, errVisibility) && w.fails < 5 {
		ev = w.log.Debug()
	}
	ev.Str("table", t.name).Int("attempt", w.fails).Err(cause).Msg("chunk abandoned; retrying")
	sleep(ctx, min(time.Duration(25<<min(w.fails, 7))*time.Millisecond, 2*time.Second))
	return nil
}

// rediscover reads t's definition again after it changed, under its current name (a renamed
// table is followed by OID).
func (w *worker) rediscover(ctx context.Context, t *workTable) error {
	// By the OID throughout: a name looked up and then discovered in another statement could be
	// renamed back, or taken by another table, in between.
	nt, err := chunker.DiscoverOID(ctx, w.conn, t.table.OID, t.override, w.cfg.Source.Publication)
	if errors.Is(err, chunker.ErrGone) {
		return fmt.Errorf("%w: %s (OID %d) was dropped; take it out of the capture (or, if it was created again, re-backfill it)", chunker.ErrGone, t.name, t.table.OID)
	}
	if err != nil {
		return fmt.Errorf("discover %s again after its definition changed: %w", t.name, err)
	}
	if !slices.Equal(nt.KeyNames(), t.table.KeyNames()) {
		return fmt.Errorf("%w: the key of %s changed from %v to %v during its capture; re-backfill it", ErrKeyChanged, t.name, t.table.KeyNames(), nt.KeyNames())
	}
	for i, k := range nt.Key {
		if was := t.table.Columns[t.table.Key[i]].TypeOID; nt.Columns[k].TypeOID != was {
			return fmt.Errorf("%w: the type of key column %q of %s changed (type OID %d, now %d) during its capture; re-backfill it",
				ErrKeyChanged, nt.Columns[k].Name, t.name, was, nt.Columns[k].TypeOID)
		}
	}
	if !slices.Equal(nt.Partitions, t.parts) {
		return partitionsChanged(t, nt.Partitions)
	}
	w.log.Info().Str("table", t.name).Str("now", nt.String()).Strs("columns", nt.ColumnNames()).Msg("table definition changed: chunks read the new definition")
	t.table = nt
	return nil
}

// watch checks what the stream does not say: that every captured table still exists, follows
// it under a new name, and stops the capture when one's membership of the publication or its
// partitions changed since the run started (changes or rows that never reach the stream).
func (w *worker) watch(ctx context.Context) error {
	w.lastWatch = time.Now()
	pub := w.cfg.Source.Publication
	if err := w.watchPublish(ctx); err != nil {
		return err
	}
	for _, t := range w.tables {
		if !t.mine {
			continue // its owner looks at it
		}
		schema, name, err := chunker.NameOf(ctx, w.conn, t.table.OID)
		if errors.Is(err, chunker.ErrGone) {
			return fmt.Errorf("%w: %s (OID %d) was dropped; take it out of the capture (or, if it was created again, re-backfill it)", chunker.ErrGone, t.name, t.table.OID)
		}
		if err != nil {
			return err
		}
		if schema != t.table.Schema || name != t.table.Name {
			if err := w.rediscover(ctx, t); err != nil {
				return err
			}
		}
		// First: an UNLOGGED table also leaves a FOR ALL TABLES publication, which the membership
		// would report less precisely.
		unlogged, err := w.watchShape(ctx, t)
		if err != nil {
			return err
		}
		if unlogged {
			continue // out of the publication meanwhile; re-backfilled once LOGGED again
		}
		w.cfg.Faults.betweenLooks(t.name)
		member, err := chunker.Membership(ctx, w.conn, t.table.OID, pub)
		if err != nil {
			return err
		}
		if member != t.member {
			// Read after the shape: a table made UNLOGGED in between left the publication for
			// that reason, which the shape names.
			if unlogged, err := w.watchShape(ctx, t); err != nil {
				return err
			} else if unlogged {
				continue
			}
		}
		if kept, err := membershipKept(ctx, w.conn, t.table.OID, t.member, member); err != nil {
			return err
		} else if kept && member != t.member {
			w.log.Info().Str("table", t.name).Str("was", t.member).Str("now", member).
				Msg("the table's membership of the publication changed, and it stayed published all along")
			t.member = member
			if err := w.send(ctx, memberNow{table: t.name, member: member}); err != nil {
				return err
			}
		}
		if member != t.member {
			what := "its membership changed"
			if member == "" {
				what = "it is no longer published under its name (dropped from the publication, or publish_via_partition_root turned off)"
			}
			return fmt.Errorf("%w: %s in publication %q: %s (was %q, now %q), so its changes since then are not in the slot; "+
				"restore it (ALTER PUBLICATION %s ADD TABLE ONLY %s, or SET (publish_via_partition_root = true)), then re-backfill the table",
				ErrPublicationChanged, t.name, pub, what, t.member, member, pgx.Identifier{pub}.Sanitize(), t.table.Ident())
		}
		if t.table.Partitions != nil || t.parts != nil {
			parts, err := chunker.Partitions(ctx, w.conn, t.table.OID)
			if err != nil {
				return err
			}
			if !slices.Equal(parts, t.parts) {
				return partitionsChanged(t, parts)
			}
			if err := w.watchStorage(ctx, t); err != nil {
				return err
			}
		}
	}
	return nil
}

// watchPublish stops the capture when the publication no longer publishes every kind of change:
// pgoutput filters each change by the publish option in force when it was written, so the ones
// filtered out are in no slot. What changes the publication's row without changing what it
// publishes (OWNER TO, RENAME) is not looked at.
func (w *worker) watchPublish(ctx context.Context) error {
	pub := w.cfg.Source.Publication
	var ins, upd, del, trunc bool
	err := w.conn.QueryRow(ctx, `SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1`, pub).Scan(&ins, &upd, &del, &trunc)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // dropped: each table's membership says so
	}
	if err != nil {
		return err
	}
	var off []string
	for _, o := range []struct {
		on   bool
		name string
	}{{ins, "insert"}, {upd, "update"}, {del, "delete"}, {trunc, "truncate"}} {
		if !o.on {
			off = append(off, o.name)
		}
	}
	if len(off) == 0 {
		return nil
	}
	return fmt.Errorf("%w: publication %q no longer publishes %s (its publish option changed): pgoutput leaves such changes out as they are written, so those made since are in no slot; restore it with ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate');, then re-backfill the tables",
		ErrPublicationChanged, pub, strings.Join(off, ", "), pgx.Identifier{pub}.Sanitize())
}

// watchShape stops the capture when t became UNLOGGED, was rewritten under a changed column
// (checkShape), or got a column with a volatile default (volatileAdded); with
// RebackfillRewrites, it re-backfills t instead (rewritten), and an UNLOGGED table once it is
// LOGGED again; unlogged then says it is UNLOGGED now. A change that rewrote nothing is
// recorded for the checkpoints.
func (w *worker) watchShape(ctx context.Context, t *workTable) (unlogged bool, err error) {
	now, err := checkShape(ctx, w.conn, t.name, t.table.Ident(), t.table.OID, t.shape)
	auto := w.cfg.RebackfillRewrites
	switch {
	case err == nil:
	case auto && errors.Is(err, ErrUnlogged):
		if t.shape.Unlogged {
			return true, nil
		}
		w.log.Warn().Str("table", t.name).Msg("the table is UNLOGGED (ALTER TABLE ... SET UNLOGGED): its writes are in no WAL record, so none is captured until it is LOGGED again; then it is re-backfilled")
		t.shape.Unlogged = true // recorded, so that a later run re-backfills it too
		return true, w.send(ctx, shapeNow{table: t.name, shape: t.shape})
	case auto && errors.Is(err, ErrValuesRewritten):
		return false, w.rewritten(ctx, t, now, err)
	default:
		return false, err
	}
	if t.shape.Unlogged {
		return false, w.rewritten(ctx, t, now, fmt.Errorf("%s was UNLOGGED and is LOGGED again (ALTER TABLE ... SET UNLOGGED, then SET LOGGED): the writes made in between are in no WAL record", t.name))
	}
	if slices.Equal(now.Files, t.shape.Files) && slices.Equal(now.Columns, t.shape.Columns) && slices.Equal(now.Labels, t.shape.Labels) {
		return false, nil
	}
	if !slices.Equal(now.Files, t.shape.Files) {
		added, err := volatileAdded(ctx, w.conn, t.table.OID, t.shape.Columns, now.Columns)
		switch {
		case err != nil:
			return false, fmt.Errorf("read the columns added to %s: %w", t.name, err)
		case len(added) > 0 && auto:
			return false, w.rewritten(ctx, t, now, errVolatileAdded(t.name, added))
		case len(added) > 0:
			return false, errVolatileAdded(t.name, added)
		}
	}
	t.shape = now
	return false, w.send(ctx, shapeNow{table: t.name, shape: now})
}

// rewritten re-backfills t, whose values a change rewrote with no row event (cause), while the
// capture goes on (RebackfillRewrites): at once, or, within RewriteRebackfillEvery of its last
// such re-backfill, at the first look after that time. Until it is asked for, t's recorded shape
// stays as it was, so each look (and a later run) finds the change again; with the request, the
// merge loop records the shape now.
func (w *worker) rewritten(ctx context.Context, t *workTable, now Shape, cause error) error {
	// A bounded run (StopWhenCaughtUp) does not wait: it would end with the output behind.
	if wait := w.cfg.RewriteRebackfillEvery - time.Since(t.lastAuto); !t.lastAuto.IsZero() && wait > 0 && !w.cfg.StopWhenCaughtUp {
		if !t.waiting {
			w.log.Warn().Str("table", t.name).Str("cause", rewriteCause(cause)).Str("in", wait.Round(time.Second).String()).
				Msg("the table's values were rewritten again: it is re-backfilled once the time between two automatic re-backfills of a table has passed")
			t.waiting = true
		}
		return nil
	}
	t.lastAuto, t.waiting = time.Now(), false
	w.log.Warn().Str("table", t.name).Str("cause", rewriteCause(cause)).Msg("re-backfilling the table while the capture goes on: a change rewrote its values with no row event")
	now.Unlogged = false
	t.shape = now
	return w.send(ctx, rebackfillAsk{ctx: ctx, tables: []string{t.name}, done: make(chan error, 1), cause: "its values were rewritten with no row event", shape: &now})
}

// watchStorage stops the capture when a leaf partition of t was truncated: published through the
// root, a TRUNCATE of one partition is not streamed, and shows only as a new, empty file.
func (w *worker) watchStorage(ctx context.Context, t *workTable) error {
	if !strings.Contains(t.progress.Publication, "via_root") {
		return nil
	}
	now, err := chunker.Storage(ctx, w.conn, t.parts)
	if err != nil {
		return err
	}
	if gone := chunker.Truncated(t.storage, now); len(gone) > 0 {
		return fmt.Errorf("%w: partition(s) %v of %s were truncated (emptied into a new file): published through the root, a TRUNCATE of one partition is not streamed, so their rows are still in the output; re-backfill the table",
			ErrPartitionsChanged, gone, t.name)
	}
	if !slices.Equal(now, t.storage) {
		t.storage = now
		return w.send(ctx, storage{table: t.name, leaves: now})
	}
	return nil
}

func partitionsChanged(t *workTable, now []uint32) error {
	return fmt.Errorf("%w: %s had partitions %v when the capture started and has %v now: a partition attached or detached brings or takes rows without a row event; re-backfill the table",
		ErrPartitionsChanged, t.name, t.parts, now)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
