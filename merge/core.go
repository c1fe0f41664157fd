package merge

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/watermark"
)

// The inputs of the core besides stream events. The chunk worker sends them into the same
// channel as the stream, so a chunk's registration precedes its low watermark and its rows
// precede its high watermark (each is sent before the mark is written).
type (
	// register announces chunk id of table before its low watermark is written.
	register struct {
		id    int64
		table string
	}
	// handover delivers chunk id's rows before its high watermark is written.
	handover struct {
		id     int64
		chunk  *chunker.Chunk
		maxKey []string   // the backfill's upper bound
		keys   [][]string // a key-list chunk's keys; nil for a range chunk
	}
	// abandon withdraws chunk id (a mark could not be written); its verdict still comes.
	abandon struct {
		id     int64
		reason error
	}
	// emptyTable reports that a table had no rows when its backfill started.
	emptyTable struct{ table string }
	// highWritten reports that chunk id's high watermark committed before WAL position after:
	// once the stream has passed it, the window is stale if the mark was not seen.
	highWritten struct {
		id    int64
		after pglogrepl.LSN
	}
)

// verdict tells the chunk worker how chunk id ended.
type verdict struct {
	id         int64
	completed  bool
	reason     error         // why it was abandoned
	rediscover bool          // the table's definition changed: discover it again
	progress   TableProgress // the table's progress after the chunk
	emitted    int           // rows emitted
}

// Why chunks are abandoned.
var (
	errVisibility = errors.New("a transaction streamed before the low watermark was invisible to the chunk's snapshot")
	errTruncated  = errors.New("the table was truncated inside the window")
	errSchema     = errors.New("the table's definition changed")
	errProtocol   = errors.New("watermarks out of order")
	errWithdrawn  = errors.New("the chunk was withdrawn")
	errStale      = errors.New("the high watermark did not come back through the stream")
)

// window is one chunk between its low and high watermarks.
type window struct {
	id      int64
	ts      *tableState
	lSeen   bool
	lLSN    pglogrepl.LSN   // commit LSN of the low watermark
	chunk   *chunker.Chunk  // nil until handed over
	maxKey  []string        // the backfill's upper bound, with the chunk
	touched map[string]bool // keys changed inside the window, before or after the chunk arrived; true when the last change lacked unchanged TOASTed values
	keys    [][]string      // a key-list chunk's keys (text values); nil for a range chunk
	dirty   error           // why the window cannot complete
	stale   pglogrepl.LSN   // the high watermark committed before this position (0: not yet written)
}

// tableState is a captured table as the core tracks it.
type tableState struct {
	name     string
	table    *chunker.Table       // as last discovered (chunk side)
	rel      *replicator.Relation // as last described by the stream in this session
	cols     *Columns             // Columns of stream events, from rel
	keyIdx   []int                // indexes into rel.Columns of the key columns, in key order
	progress *TableProgress
	open     []*window       // windows whose low watermark was seen
	rereads  map[string]bool // canonical keys in progress.Reread
}

// core is the DBLog reconciliation: windows, eviction, the visibility guard, emission order and
// the backfill progress behind checkpoints. It is pure: no I/O, no goroutines, no clock, no
// logging. One goroutine feeds it every input in channel order and drains its outputs.
type core struct {
	marks   watermark.Config
	tables  map[string]*tableState
	windows map[int64]*window
	guard   guard
	pos     *Position

	inTxn     bool
	txXID     uint32
	txLSN     pglogrepl.LSN // commit LSN of the open transaction (its Begin's final LSN)
	txTime    time.Time
	txSeq     int
	txMarks   []watermark.Mark
	keyBuf    [][]byte
	chunkCols map[*chunker.Table]*Columns

	out      []Event   // events to emit, in order
	verdicts []verdict // chunk outcomes for the worker
	fences   []int64   // fence marks whose transaction committed

	noGuard       bool // chaos switch: skip the visibility guard
	noEviction    bool // chaos switch: never evict chunk rows
	rereadPartial bool // Config.RereadPartial
}

func newCore(marks watermark.Config, pos *Position, tables map[string]*chunker.Table) *core {
	c := &core{marks: marks, tables: map[string]*tableState{}, windows: map[int64]*window{}, pos: pos,
		chunkCols: map[*chunker.Table]*Columns{}, guard: guard{max: 1 << 20}}
	for name, t := range tables {
		ts := &tableState{name: name, table: t, progress: pos.Tables[name], rereads: map[string]bool{}}
		c.tables[name] = ts
		for _, k := range ts.progress.Reread {
			vals := make([][]byte, len(k))
			for i, v := range k {
				vals[i] = []byte(v)
			}
			if key, err := t.AppendKey(nil, vals); err == nil {
				ts.rereads[string(key)] = true
			}
		}
	}
	return c
}

// pendingRereads reports whether rows are waiting to be read again.
func (c *core) pendingRereads() bool {
	for _, ts := range c.tables {
		if len(ts.progress.Reread) > 0 {
			return true
		}
	}
	return false
}

// rereadsByTable returns a copy of the pending re-reads of each table that has some.
func (c *core) rereadsByTable() map[string][][]string {
	out := map[string][][]string{}
	for name, ts := range c.tables {
		if len(ts.progress.Reread) > 0 {
			out[name] = slices.Clone(ts.progress.Reread)
		}
	}
	return out
}

// consistent reports whether the output is at a transaction boundary, where a checkpoint may be
// taken.
func (c *core) consistent() bool { return !c.inTxn }

// step processes one input.
func (c *core) step(in any) error {
	switch v := in.(type) {
	case *replicator.Begin:
		if c.inTxn {
			return fmt.Errorf("begin of xid %d inside xid %d", v.XID, c.txXID)
		}
		c.inTxn, c.txXID, c.txLSN, c.txTime, c.txSeq, c.txMarks = true, v.XID, v.FinalLSN, v.Time, 0, c.txMarks[:0]
	case *replicator.Relation:
		c.relation(v)
	case *replicator.Change:
		return c.change(v)
	case *replicator.Truncate:
		c.truncate(v)
	case *replicator.Commit:
		return c.commit(v)
	case *replicator.Keepalive:
		// Idle: everything before WALEnd was delivered and processed.
		if !c.inTxn && v.WALEnd > c.pos.LSN {
			c.pos.LSN = v.WALEnd
			c.checkStale()
		}
	case *replicator.Message, *replicator.TypeInfo, *replicator.Origin:
	case register:
		ts := c.tables[v.table]
		if ts == nil {
			return fmt.Errorf("chunk %d of table %s, which is not captured", v.id, v.table)
		}
		c.windows[v.id] = &window{id: v.id, ts: ts, touched: map[string]bool{}}
	case handover:
		return c.handover(v)
	case abandon:
		if w := c.windows[v.id]; w != nil {
			c.end(w, fmt.Errorf("%w: %w", errWithdrawn, v.reason), false)
		}
	case emptyTable:
		if ts := c.tables[v.table]; ts != nil {
			ts.progress.Done = true
		}
	case highWritten:
		if w := c.windows[v.id]; w != nil {
			w.stale = v.after
			c.checkStale()
		}
	default:
		return fmt.Errorf("unexpected input %T", in)
	}
	return nil
}

func (c *core) relation(r *replicator.Relation) {
	ts := c.tables[r.Schema+"."+r.Table]
	if ts == nil {
		return
	}
	if ts.rel != nil && !sameColumns(ts.rel, r) {
		for _, w := range ts.open {
			w.dirty = errSchema
		}
	}
	ts.rel = r
	cols := &Columns{Schema: r.Schema, Table: r.Table}
	for _, col := range r.Columns {
		cols.Names = append(cols.Names, col.Name)
		cols.Types = append(cols.Types, col.TypeOID)
		cols.TypeMods = append(cols.TypeMods, col.TypeMod)
	}
	ts.keyIdx = ts.keyIdx[:0]
	for _, name := range ts.table.KeyNames() {
		ts.keyIdx = append(ts.keyIdx, slices.Index(cols.Names, name))
	}
	cols.Key = slices.Clone(ts.keyIdx)
	ts.cols = cols
}

func sameColumns(a, b *replicator.Relation) bool {
	return slices.EqualFunc(a.Columns, b.Columns, func(x, y replicator.Column) bool {
		return x.Name == y.Name && x.TypeOID == y.TypeOID && x.TypeMod == y.TypeMod
	})
}

// key returns the canonical key of tuple t of table ts.
func (c *core) key(ts *tableState, t replicator.Tuple) ([]byte, error) {
	c.keyBuf = c.keyBuf[:0]
	for i, idx := range ts.keyIdx {
		if idx < 0 {
			return nil, fmt.Errorf("%w: key column %q of %s is not in the stream's columns", errSchema, ts.table.KeyNames()[i], ts.name)
		}
		v := t[idx]
		switch v.Kind {
		case replicator.Text:
			c.keyBuf = append(c.keyBuf, v.Data)
		case replicator.Null:
			c.keyBuf = append(c.keyBuf, nil)
		default:
			return nil, fmt.Errorf("key column %q of %s arrived without its value (kind %q): TOASTed key values are not supported",
				ts.table.KeyNames()[i], ts.name, byte(v.Kind))
		}
	}
	return ts.table.AppendKey(nil, c.keyBuf)
}

func (c *core) change(ch *replicator.Change) error {
	if !c.inTxn {
		return fmt.Errorf("change outside a transaction")
	}
	rel := ch.Rel
	if c.marks.IsTable(rel.Schema, rel.Table) {
		if ch.New != nil {
			vals := make([][]byte, len(ch.New))
			for i, v := range ch.New {
				vals[i] = v.Data
			}
			names := make([]string, len(rel.Columns))
			for i, col := range rel.Columns {
				names[i] = col.Name
			}
			if m, ok := c.marks.Decode(names, vals); ok {
				c.txMarks = append(c.txMarks, m)
			}
		}
		return nil
	}
	ts := c.tables[rel.Schema+"."+rel.Table]
	if ts == nil {
		return nil
	}
	if ts.rel != rel {
		// Every change follows its Relation in the session; a change of an unseen relation
		// would mean the stream skipped one.
		return fmt.Errorf("change of %s before its relation", ts.name)
	}
	var newKey, oldKey []byte
	var partial bool // an update that lacks unchanged TOASTed values
	var err error
	switch ch.Op {
	case replicator.Insert:
		if newKey, err = c.key(ts, ch.New); err != nil {
			return err
		}
		c.emit(Insert, ts.cols, ch.New, newKey)
	case replicator.Update:
		if newKey, err = c.key(ts, ch.New); err != nil {
			return err
		}
		vals := ch.New
		if ch.OldKind == replicator.OldRow {
			vals = fillUnchanged(ch.New, ch.Old)
		}
		partial = hasUnchanged(vals)
		if ch.OldKind != replicator.OldNone {
			if oldKey, err = c.key(ts, ch.Old); err != nil {
				return err
			}
		}
		op := Update
		if oldKey != nil && string(oldKey) != string(newKey) {
			// A key change: the old key is gone, the new one appears.
			c.emit(Delete, ts.cols, ch.Old, oldKey)
			op = Insert
		}
		switch {
		case partial && c.rereadPartial:
			// The sink replaces whole rows: instead of a row without its unchanged TOASTed
			// values, the row is read again whole, at a later position.
			c.queueReread(ts, vals, newKey)
		case partial && op == Insert:
			// A key change that left TOASTed values alone: the new key has no row in the
			// output for them to stay in, so the row is also read again whole.
			c.emit(op, ts.cols, vals, newKey)
			c.queueReread(ts, vals, newKey)
		default:
			c.emit(op, ts.cols, vals, newKey)
		}
	case replicator.Delete:
		if oldKey, err = c.key(ts, ch.Old); err != nil {
			return err
		}
		c.emit(Delete, ts.cols, ch.Old, oldKey)
	}
	c.evict(ts, newKey, partial)
	c.evict(ts, oldKey, false)
	return nil
}

// queueReread asks for the row of key (whose key columns tuple t holds) to be read again whole.
func (c *core) queueReread(ts *tableState, t replicator.Tuple, key []byte) {
	if ts.rereads[string(key)] {
		return
	}
	vals := make([]string, len(ts.keyIdx))
	for i, idx := range ts.keyIdx {
		vals[i] = string(t[idx].Data)
	}
	ts.rereads[string(key)] = true
	ts.progress.Reread = append(ts.progress.Reread, vals)
	c.fences = c.fences[:0] // a bounded run is not caught up until the row is read
}

func hasUnchanged(t replicator.Tuple) bool {
	for _, v := range t {
		if v.Kind == replicator.Unchanged {
			return true
		}
	}
	return false
}

// fillUnchanged replaces the unchanged TOASTed values of the new tuple with the old row's.
func fillUnchanged(n, o replicator.Tuple) replicator.Tuple {
	out, cloned := n, false
	for i, v := range n {
		if v.Kind == replicator.Unchanged && i < len(o) && o[i].Kind != replicator.Unchanged {
			if !cloned {
				out, cloned = slices.Clone(n), true
			}
			out[i] = o[i]
		}
	}
	return out
}

// evict drops key from the chunks of ts's open windows: the rows whose key a change touched
// inside the window are not emitted at the high watermark, whether the change came before or
// after the chunk's rows arrived.
func (c *core) evict(ts *tableState, key []byte, partial bool) {
	if key == nil || c.noEviction {
		return
	}
	for _, w := range ts.open {
		w.touched[string(key)] = partial
	}
}

func (c *core) emit(op Op, cols *Columns, vals replicator.Tuple, key []byte) {
	c.out = append(c.out, Event{Op: op, Columns: cols, vals: vals, Key: key, LSN: c.txLSN, Seq: c.txSeq, XID: c.txXID, Time: c.txTime})
	c.txSeq++
}

func (c *core) truncate(t *replicator.Truncate) {
	for _, rel := range t.Rels {
		ts := c.tables[rel.Schema+"."+rel.Table]
		if ts == nil {
			continue
		}
		for _, w := range ts.open {
			w.dirty = errTruncated
		}
		c.out = append(c.out, Event{Op: Truncate, Columns: ts.cols, LSN: c.txLSN, Seq: c.txSeq, XID: c.txXID, Time: c.txTime})
		c.txSeq++
	}
}

func (c *core) handover(h handover) error {
	w := c.windows[h.id]
	if w == nil {
		return nil // withdrawn already
	}
	if w.chunk != nil {
		return fmt.Errorf("chunk %d handed over twice", h.id)
	}
	w.ts.table = h.chunk.Table
	w.chunk, w.maxKey, w.keys = h.chunk, h.maxKey, h.keys
	c.guard.snapshot(h.chunk.Snapshot)
	return nil
}

func (c *core) commit(cm *replicator.Commit) error {
	if !c.inTxn {
		return fmt.Errorf("commit outside a transaction")
	}
	c.inTxn = false
	c.guard.commit(c.txXID, c.txLSN)
	for _, m := range c.txMarks {
		switch m.Kind {
		case watermark.Low:
			w := c.windows[m.ID]
			if w == nil || w.lSeen {
				continue // withdrawn, or a repeated mark
			}
			w.lSeen, w.lLSN = true, c.txLSN
			w.ts.open = append(w.ts.open, w)
		case watermark.High:
			if w := c.windows[m.ID]; w != nil {
				c.high(w)
			}
		case watermark.Fence:
			c.fences = append(c.fences, m.ID)
		}
	}
	c.pos.LSN = cm.EndLSN
	c.checkStale()
	c.guard.prune(c.pendingXmins())
	return nil
}

// checkStale abandons the windows whose high watermark the stream has passed without showing.
func (c *core) checkStale() {
	for _, w := range c.windows {
		if w.stale != 0 && c.pos.LSN >= w.stale {
			c.end(w, errStale, false)
		}
	}
}

// high closes window w at its high watermark: the chunk's surviving rows are emitted right
// after the watermark's transaction, at its commit LSN, or the chunk is abandoned.
func (c *core) high(w *window) {
	switch {
	case !w.lSeen || w.chunk == nil:
		c.end(w, errProtocol, false)
		return
	case w.dirty != nil:
		c.end(w, w.dirty, errors.Is(w.dirty, errSchema))
		return
	case !c.noGuard && c.guard.violated(w.chunk.Snapshot, w.lLSN):
		c.end(w, errVisibility, false)
		return
	}
	cols := c.columnsOf(w)
	if cols == nil {
		c.end(w, errSchema, true)
		return
	}
	emitted := 0
	t := w.chunk.Table
	var rereads [][]string
	keyVals := make([][]byte, len(t.Key))
	c.out = slices.Grow(c.out, len(w.chunk.Rows))
	var keys []byte // the rows' keys, in one allocation
	for _, row := range w.chunk.Rows {
		for j, k := range t.Key {
			keyVals[j] = row[k]
		}
		start := len(keys)
		var err error
		if keys, err = t.AppendKey(keys, keyVals); err != nil {
			c.end(w, err, false)
			return
		}
		key := keys[start:len(keys):len(keys)]
		if partial, touched := w.touched[string(key)]; touched {
			if partial {
				// The row held the only whole copy of its unchanged TOASTed values: read it
				// again after the change (algorithm reference §5 E17).
				rereads = append(rereads, keyStrings(row, t.Key))
			}
			continue
		}
		c.out = append(c.out, Event{Op: Snapshot, Columns: cols, row: row, Key: key, LSN: c.txLSN, Seq: c.txSeq, Time: c.txTime})
		c.txSeq++
		emitted++
	}
	p := w.ts.progress
	if w.keys != nil {
		// A key-list chunk: its keys are no longer pending, save those touched again.
		p.Reread = removeKeys(p.Reread, w.keys)
		clear(w.ts.rereads)
		for _, k := range p.Reread {
			vals := make([][]byte, len(k))
			for i, v := range k {
				vals[i] = []byte(v)
			}
			if key, err := t.AppendKey(nil, vals); err == nil {
				w.ts.rereads[string(key)] = true
			}
		}
	} else {
		if w.chunk.Last != nil {
			p.Cursor = w.chunk.Last
		}
		if p.MaxKey == nil {
			p.MaxKey = w.maxKey
		}
		p.Done = p.Done || w.chunk.Done
		p.Chunks++
	}
	for _, k := range rereads {
		vals := make([][]byte, len(k))
		for i, v := range k {
			vals[i] = []byte(v)
		}
		key, err := t.AppendKey(nil, vals)
		if err == nil && w.ts.rereads[string(key)] {
			continue
		}
		w.ts.rereads[string(key)] = true
		p.Reread = append(p.Reread, k)
	}
	p.Rows += int64(emitted)
	c.remove(w)
	c.verdicts = append(c.verdicts, verdict{id: w.id, completed: true, progress: p.clone(), emitted: emitted})
}

func keyStrings(row [][]byte, key []int) []string {
	out := make([]string, len(key))
	for i, k := range key {
		out[i] = string(row[k])
	}
	return out
}

// removeKeys removes one occurrence of each of done from keys.
func removeKeys(keys, done [][]string) [][]string {
	left := map[string]int{}
	for _, k := range done {
		left[strings.Join(k, "\x00")]++
	}
	out := keys[:0:0]
	for _, k := range keys {
		id := strings.Join(k, "\x00")
		if left[id] > 0 {
			left[id]--
			continue
		}
		out = append(out, k)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// columnsOf returns the Columns of w's rows: the stream's when the stream has described the
// table with the same columns, else the chunk's own; nil when they differ (the chunk read another
// definition than the stream's current one).
func (c *core) columnsOf(w *window) *Columns {
	t := w.chunk.Table
	if rel := w.ts.rel; rel != nil {
		if len(rel.Columns) != len(t.Columns) {
			return nil
		}
		for i, col := range rel.Columns {
			if col.Name != t.Columns[i].Name || col.TypeOID != t.Columns[i].TypeOID {
				return nil
			}
		}
		return w.ts.cols
	}
	if cols := c.chunkCols[t]; cols != nil {
		return cols
	}
	cols := &Columns{Schema: t.Schema, Table: t.Name, Key: slices.Clone(t.Key)}
	for _, col := range t.Columns {
		cols.Names = append(cols.Names, col.Name)
		cols.Types = append(cols.Types, col.TypeOID)
		cols.TypeMods = append(cols.TypeMods, col.TypeMod)
	}
	c.chunkCols[t] = cols
	return cols
}

// end abandons window w.
func (c *core) end(w *window, reason error, rediscover bool) {
	c.remove(w)
	c.verdicts = append(c.verdicts, verdict{id: w.id, reason: reason, rediscover: rediscover, progress: w.ts.progress.clone()})
}

func (c *core) remove(w *window) {
	delete(c.windows, w.id)
	w.ts.open = slices.DeleteFunc(w.ts.open, func(o *window) bool { return o == w })
}

// pendingXmins returns the xmins of the snapshots the guard must still check.
func (c *core) pendingXmins() []uint32 {
	var xs []uint32
	for _, w := range c.windows {
		if w.chunk != nil {
			xs = append(xs, uint32(w.chunk.Snapshot.Xmin))
		}
	}
	return xs
}

// openWindows reports how many chunks are between registration and their verdict.
func (c *core) openWindows() int { return len(c.windows) }

// abandonAll ends every window, as when the stream restarts: marks re-streamed later would be
// ignored, so no window could close.
func (c *core) abandonAll(reason error) {
	for _, w := range c.windows {
		c.end(w, reason, false)
	}
}
