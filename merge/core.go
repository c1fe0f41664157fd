package merge

import (
	"context"
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
		id      int64
		chunk   *chunker.Chunk
		maxKey  []string   // the backfill's upper bound
		keys    [][]string // a key-list chunk's keys; nil for a range chunk
		refresh bool       // a refresh's first window: no rows, it only places the Refresh event
		// rng is the key range a range chunk of a split backfill read, as 1 + its index in
		// TableProgress.Ranges, up to that range's bound to; 0 for a chunk of a backfill not split.
		rng int
		to  []string
	}
	// abandon withdraws chunk id (a mark could not be written); its verdict still comes.
	abandon struct {
		id     int64
		reason error
	}
	// emptyTable reports that a table had no rows when its backfill started.
	emptyTable struct{ table string }
	// seed gives the visibility guard the transactions invisible when the run started, for a
	// run whose position does not say which commits were (see guard.seed); the worker sends it
	// before its first chunk.
	seed struct{ xids []uint32 }
	// probe is a snapshot the idle worker took: it shows which commits are visible by now.
	probe struct{ snap chunker.Snapshot }
	// storage is where a table's leaf partitions are stored now, as the worker's watch found:
	// checkpoints carry it, for the next run to compare (TableProgress.Storage).
	storage struct {
		table  string
		leaves []chunker.LeafStorage
	}
	// shapeNow is a table's Shape as the worker's watch found it after a change that rewrote no
	// value under a changed column: checkpoints carry it (TableProgress.Shape).
	shapeNow struct {
		table string
		shape Shape
	}
	// memberNow is a table's membership of the publication as the worker's watch found it after
	// a change that kept it published all along (chunker.MembershipKept): checkpoints carry it
	// (TableProgress.Publication).
	memberNow struct {
		table  string
		member string
	}
	// highWritten reports that chunk id's high watermark committed before WAL position after:
	// once the stream has passed it, the window is stale if the mark was not seen.
	highWritten struct {
		id    int64
		after pglogrepl.LSN
	}
	// split divides the rest of table's backfill into key ranges that several readers read at
	// once (I23): at points (text keys in key order, after the cursor from, before the upper
	// bound maxKey). It is taken only if the table's progress is still the one the points were
	// computed on (not split, not done, no refresh, at cursor from under bound maxKey); the
	// verdict of id carries the table's progress either way.
	split struct {
		id           int64
		table        string
		from, maxKey []string
		points       [][]string
	}
)

// verdict tells the chunk worker how chunk id ended.
type verdict struct {
	id         int64
	completed  bool
	reason     error         // why it was abandoned
	rediscover bool          // the table's definition changed: discover it again
	progress   TableProgress // the table's progress after the chunk
	gen        int           // core.rereadGen when it was given: the progress is as of then
	emitted    int           // rows emitted
	// quiet: no change of any captured table committed inside the window, so no live change
	// waited behind its rows (the worker lets the next chunks grow).
	quiet bool
}

// wakeup tells the idle worker the progress of the tables with rows to read (again), as of
// core.rereadGen gen: a table's progress from a later verdict is newer, and wins.
type wakeup struct {
	gen    int
	tables map[string]TableProgress
}

// Why chunks are abandoned.
var (
	errVisibility = errors.New("a transaction streamed before the low watermark was invisible to the chunk's snapshot")
	errTruncated  = errors.New("the table was truncated inside the window")
	errSchema     = errors.New("the table's definition changed")
	errProtocol   = errors.New("watermarks out of order")
	errWithdrawn  = errors.New("the chunk was withdrawn")
	errStale      = errors.New("the high watermark did not come back through the stream")
	errCrowded    = errors.New("too many keys changed inside the window before its rows arrived")
	errRestarted  = errors.New("the table's backfill started again")
	errSplitLate  = errors.New("the table's backfill moved on before its split arrived")
)

// maxEarly bounds the keys a window remembers before its chunk arrives (a transaction of millions
// of rows between the low watermark and the chunk's hand-over): past it the window is abandoned
// and its chunk read again. Once the chunk arrived, only changes of its own keys are recorded;
// the keys remembered before are dropped at the first change after that (track), or when the
// window closes.
const maxEarly = 1 << 19

// maxRereads bounds the rows a table waits to read again (an update of millions of rows that all
// left a TOASTed value out): past it the table's backfill starts again from the beginning, which
// reads every row whole, instead of a list of millions of keys in every position.
const maxRereads = 100_000

// window is one chunk between its low and high watermarks.
type window struct {
	id      int64
	refresh bool // a refresh's first window (handover.refresh)
	// early: registered before a re-backfill of its table was asked for (rebackfill). Its low
	// watermark may have been written before the writes that made the re-backfill necessary
	// (a SET UNLOGGED's, in no WAL record): the refresh must not start there (I20).
	early   bool
	ts      *tableState
	rel     *replicator.Relation // the last description of the table the stream sent inside the window
	lSeen   bool
	lLSN    pglogrepl.LSN   // commit LSN of the low watermark
	changes uint64          // core.changes when the low watermark was seen
	chunk   *chunker.Chunk  // nil until handed over
	maxKey  []string        // the backfill's upper bound, with the chunk
	touched map[string]bool // keys changed inside the window, before or after the chunk arrived; true when the last change lacked unchanged TOASTed values
	// Once the chunk arrived: its rows' keys, and (built at the first change after it: track)
	// the keys whose changes still matter, the rows' and a key-list chunk's. Before, every
	// changed key is kept, up to maxEarly.
	rowKeys [][]byte
	tracked map[string]bool
	keys    [][]string // a key-list chunk's keys (text values); nil for a range chunk
	rng     int        // the key range of a split backfill the chunk read, 1-based (handover.rng); 0: not split
	to      []string   // and that range's upper bound
	dirty   error      // why the window cannot complete
	// floor is the guard's newest xmin when the window was registered (floorKnown: it had
	// one): its chunk's snapshot, taken later, has an xmin at least as high (pendingXmins).
	floor      uint32
	floorKnown bool
	stale      pglogrepl.LSN // the high watermark committed before this position (0: not yet written)
	// fills are the touched keys whose changes inside the window were all updates of the key
	// that left TOASTed values out (a nil entry: a key that had another change).
	fills map[string]*fill
}

// maxFills bounds the keys a window keeps the last values of (fill): a window's chunk has at
// most a chunk's rows, and before it is handed over every changed key is a candidate.
const maxFills = 1 << 14

// fill is what a window knows of a key whose changes inside it were all updates of that key,
// each leaving TOASTed values out (Unchanged): the last one's values and columns, and which
// columns every one left out. Those columns kept their values across the window, so the chunk's
// row, read inside it, has them: the row is whole at the high watermark (wholeRow) without being
// read again, a read that the next such change cannot beat (a hot row would otherwise be read
// again and again, each read losing to the next update).
type fill struct {
	vals replicator.Tuple
	cols *Columns
	kept []bool // column i was Unchanged in every change so far
}

// noteChange records a change of key inside w for its fill: vals are a same-key update's values,
// nil for any other change.
func (w *window) noteChange(key string, vals replicator.Tuple, cols *Columns) {
	if w.fills == nil {
		w.fills = map[string]*fill{}
	}
	f, seen := w.fills[key]
	switch {
	case vals == nil || !hasUnchanged(vals) || !seen && len(w.fills) >= maxFills:
		// Another change, or more keys than the window keeps values of (a bulk update of
		// the table inside it): read again as before.
		w.fills[key] = nil
	case !seen:
		kept := make([]bool, len(vals))
		for i, v := range vals {
			kept[i] = v.Kind == replicator.Unchanged
		}
		w.fills[key] = &fill{vals: vals, cols: cols, kept: kept}
	case f != nil:
		if cols != f.cols || len(vals) != len(f.kept) {
			w.fills[key] = nil // the table was described anew: no column-by-column account
			return
		}
		for i, v := range vals {
			f.kept[i] = f.kept[i] && v.Kind == replicator.Unchanged
		}
		f.vals = vals
	}
}

// wholeRow returns the row of a key whose changes inside the window were f's, as it is after the
// last one: that change's values, and the chunk's row (in cols) for the ones it left out; nil
// when f does not give it (another change, a value left out by the last change that an earlier
// one set, columns that differ from the chunk's).
func wholeRow(f *fill, cols *Columns, row chunker.Row) chunker.Row {
	if f == nil || len(f.cols.Names) != len(cols.Names) || len(row) != len(cols.Names) {
		return nil
	}
	out := make(chunker.Row, len(cols.Names))
	for j, name := range cols.Names {
		i := j
		if f.cols.Names[i] != name {
			if i = slices.Index(f.cols.Names, name); i < 0 {
				return nil
			}
		}
		if f.cols.Types[i] != cols.Types[j] {
			return nil // a column of that name, another type: not the chunk's column
		}
		switch v := f.vals[i]; v.Kind {
		case replicator.Unchanged:
			if !f.kept[i] || row[j] == nil {
				return nil
			}
			out[j] = row[j]
		case replicator.Null:
		case replicator.Text:
			out[j] = v.Data
			if out[j] == nil {
				out[j] = []byte{}
			}
		default:
			return nil
		}
	}
	return out
}

// tableState is a captured table as the core tracks it. The stream names tables by OID: a
// renamed table (ALTER TABLE ... RENAME, SET SCHEMA) is followed, and its output keeps the
// configured name (schema, tname).
type tableState struct {
	name          string // configured "schema.table": the output's name and the position's key
	schema, tname string
	oid           uint32
	keyTypes      []uint32             // the key columns' types when the capture started: keys are encoded by type
	table         *chunker.Table       // as last discovered (chunk side)
	tableSnap     chunker.Snapshot     // the snapshot of the chunk that brought table (older)
	rel           *replicator.Relation // as last described by the stream in this session
	cols          *Columns             // Columns of stream events, from rel
	keyIdx        []int                // indexes into rel.Columns of the key columns, in key order
	identityErr   error                // non-nil while rel's replica identity does not carry the key
	progress      *TableProgress
	open          []*window       // windows whose low watermark was seen
	rereads       map[string]bool // canonical keys in progress.Reread
}

// core is the DBLog reconciliation: windows, eviction, the visibility guard, emission order and
// the backfill progress behind checkpoints. It is pure: no I/O, no goroutines, no clock, no
// logging. One goroutine feeds it every input in channel order and drains its outputs.
type core struct {
	marks   watermark.Config
	tables  map[string]*tableState // by configured "schema.table"
	byOID   map[uint32]*tableState
	windows map[int64]*window
	guard   guard
	pos     *Position
	// storage are the tables whose storage files changed since the position was taken, until a
	// TRUNCATE the stream carries explains them (storageCheck).
	storage map[string]*storageCheck
	// asked are the re-backfill requests taken, answered once a checkpoint carries them;
	// deferred, those that came inside a transaction, to be taken at its end.
	asked, deferred []rebackfillAsk

	changes uint64 // changes of captured tables processed (verdict.quiet)
	inTxn   bool
	txXID   uint32
	txLSN   pglogrepl.LSN // commit LSN of the open transaction (its Begin's final LSN)
	txTime  time.Time
	txSeq   int
	txMarks []watermark.Mark
	// txRows: the open transaction changed or truncated a captured table. One that did not (a
	// watermark's, another reader's among them) cannot hold a row a chunk misses by not seeing
	// it: the visibility guard passes over it (I11, I23).
	txRows    bool
	keyBuf    [][]byte
	chunkCols map[*chunker.Table]*Columns

	out      []Event   // events to emit, in order
	verdicts []verdict // chunk outcomes for the worker
	fences   []int64   // fence marks whose transaction committed, since the last new work
	// fencesSeen are the fence marks whose transaction committed, which new work does not clear:
	// the merge loop takes them to count the readers that fenced (mergeLoop.noteFences).
	fencesSeen []int64
	rereadGen  int      // counts changes of any table's pending re-reads, for the idle worker
	notices    []string // things the merge loop logs (a renamed table followed)

	maxRereads    int  // maxRereads, lower in the model test
	noGuard       bool // chaos switch: skip the visibility guard
	noEviction    bool // chaos switch: never evict chunk rows
	rereadPartial bool // Config.RereadPartial
}

func newCore(marks watermark.Config, pos *Position, tables map[string]*chunker.Table) *core {
	c := &core{marks: marks, tables: map[string]*tableState{}, byOID: map[uint32]*tableState{}, windows: map[int64]*window{}, pos: pos,
		chunkCols: map[*chunker.Table]*Columns{}, guard: guard{max: 1 << 20}, maxRereads: maxRereads}
	if pos.Invisible != nil {
		c.guard.seed(*pos.Invisible)
	}
	for name, t := range tables {
		schema, tname, _ := strings.Cut(name, ".")
		ts := &tableState{name: name, schema: schema, tname: tname, oid: t.OID, table: t, progress: pos.Tables[name], rereads: map[string]bool{}}
		for _, k := range t.Key {
			ts.keyTypes = append(ts.keyTypes, t.Columns[k].TypeOID)
		}
		c.tables[name] = ts
		c.byOID[t.OID] = ts
		ts.indexRereads()
	}
	return c
}

// indexRereads rebuilds ts.rereads from its progress.
func (ts *tableState) indexRereads() {
	clear(ts.rereads)
	for _, k := range ts.progress.Reread {
		vals := make([][]byte, len(k))
		for i, v := range k {
			vals[i] = []byte(v)
		}
		if key, err := ts.table.AppendKey(nil, vals); err == nil {
			ts.rereads[string(key)] = true
		}
	}
}

// rereadsChanged notes that some table's pending re-reads changed: the idle worker is told.
func (c *core) rereadsChanged() { c.rereadGen++ }

// hasWork reports whether the table has rows waiting to be read (again): its backfill, a
// refresh, or re-reads.
func (p *TableProgress) hasWork() bool { return len(p.Reread) > 0 || !p.Done || p.Refresh }

// pendingWork reports whether a table has rows waiting to be read (again).
func (c *core) pendingWork() bool {
	for _, ts := range c.tables {
		if ts.progress.hasWork() {
			return true
		}
	}
	return false
}

// workByTable returns a copy of the progress of each table that has rows waiting to be read
// (again): rows whose TOASTed values a change left out, or a backfill started again.
func (c *core) workByTable() map[string]TableProgress {
	out := map[string]TableProgress{}
	for name, ts := range c.tables {
		if ts.progress.hasWork() {
			out[name] = ts.progress.clone()
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
		c.inTxn, c.txXID, c.txLSN, c.txTime, c.txSeq, c.txMarks, c.txRows = true, v.XID, v.FinalLSN, v.Time, 0, c.txMarks[:0], false
	case *replicator.Relation:
		return c.relation(v)
	case *replicator.Change:
		return c.change(v)
	case *replicator.Truncate:
		return c.truncate(v)
	case *replicator.Commit:
		return c.commit(v)
	case *replicator.Keepalive:
		// Idle: everything before WALEnd was delivered and processed.
		if !c.inTxn && v.WALEnd > c.pos.LSN {
			c.pos.LSN = v.WALEnd
			c.checkStale()
			return c.checkStorage()
		}
	case *replicator.Message:
		// A mark written as a logical message (watermark.Messages). Only a transactional one can
		// be a mark: it comes in its transaction's place in commit order.
		if v.Transactional && c.inTxn {
			if m, ok := c.marks.DecodeMessage(v.Prefix, v.Content); ok {
				c.txMarks = append(c.txMarks, m)
			}
		}
	case *replicator.TypeInfo, *replicator.Origin:
	case register:
		ts := c.tables[v.table]
		if ts == nil {
			return fmt.Errorf("chunk %d of table %s, which is not captured", v.id, v.table)
		}
		w := &window{id: v.id, ts: ts, touched: map[string]bool{}}
		w.floor, w.floorKnown = uint32(c.guard.latestXmin), c.guard.haveXmin
		c.windows[v.id] = w
	case seed:
		c.guard.seed(v.xids)
	case probe:
		c.guard.observe(v.snap)
	case storage:
		if ts := c.tables[v.table]; ts != nil {
			ts.progress.Storage = v.leaves
		}
	case shapeNow:
		for i, a := range c.deferred {
			if a.shape != nil && slices.Contains(a.tables, v.table) {
				newer := v.shape // the request is taken with the latest look's shape
				c.deferred[i].shape = &newer
			}
		}
		if ts := c.tables[v.table]; ts != nil {
			c.setShape(v.table, ts.progress, v.shape)
		}
	case memberNow:
		if ts := c.tables[v.table]; ts != nil {
			ts.progress.Publication = v.member
		}
	case handover:
		return c.handover(v)
	case abandon:
		if w := c.windows[v.id]; w != nil {
			c.end(w, fmt.Errorf("%w: %w", errWithdrawn, v.reason), false)
		}
	case split:
		c.split(v)
	case emptyTable:
		if ts := c.tables[v.table]; ts != nil {
			ts.progress.Done = true
		}
	case highWritten:
		if w := c.windows[v.id]; w != nil {
			w.stale = v.after
			c.checkStale()
		}
	case rebackfillAsk:
		switch {
		case v.ctx.Err() != nil:
			v.done <- context.Cause(v.ctx) // its caller gave up: not taken
		case c.inTxn:
			c.deferred = append(c.deferred, v) // taken at the transaction's end
		default:
			c.takeAsk(v)
		}
	default:
		return fmt.Errorf("unexpected input %T", in)
	}
	return nil
}

// relation takes a table's description from the stream. Tables are known by OID: a renamed table
// is followed; another table under a captured table's name (the captured one dropped and created
// again, or renamed over) cannot be placed. A description whose replica identity does not carry
// the key makes the table's updates and deletes unplaceable until a description that does.
func (c *core) relation(r *replicator.Relation) error {
	ts := c.byOID[r.ID]
	if ts == nil {
		if other := c.tables[r.Schema+"."+r.Table]; other != nil && !other.progress.Refresh {
			return &UnplaceableError{Table: other.name, LSN: c.txLSN,
				Reason: fmt.Sprintf("the stream describes another table under its name (OID %d; the table captured has OID %d): it was dropped and created again, or another table was renamed to its name", r.ID, other.oid),
				Fix:    "capture the table that now has the name from scratch (re-backfill it)"}
		}
		return nil
	}
	if (r.Schema != ts.schema || r.Table != ts.tname) && (ts.rel == nil || ts.rel.Schema != r.Schema || ts.rel.Table != r.Table) {
		c.notices = append(c.notices, fmt.Sprintf("%s (OID %d) is now named %s.%s; it is still captured, and its output keeps the name %s",
			ts.name, ts.oid, r.Schema, r.Table, ts.name))
	}
	for _, w := range ts.open {
		w.rel = r // checked against the chunk's columns at the high watermark
	}
	ts.rel = r
	cols := &Columns{Schema: ts.schema, Table: ts.tname}
	for _, col := range r.Columns {
		cols.Names = append(cols.Names, col.Name)
		cols.Types = append(cols.Types, col.TypeOID)
		cols.TypeMods = append(cols.TypeMods, col.TypeMod)
	}
	ts.keyIdx = ts.keyIdx[:0]
	ts.identityErr = nil
	for k, name := range ts.table.KeyNames() {
		i := slices.Index(cols.Names, name)
		ts.keyIdx = append(ts.keyIdx, i)
		if i >= 0 && k < len(ts.keyTypes) && r.Columns[i].TypeOID != ts.keyTypes[k] && !ts.progress.Refresh {
			// Keys are encoded by type (an int and a numeric of one value are different
			// bytes): the chunks' keys and the stream's would no longer meet.
			return fmt.Errorf("%w: the type of key column %q of %s changed (type OID %d, now %d): its keys are encoded otherwise from here on; re-backfill the table",
				ErrKeyChanged, name, ts.name, ts.keyTypes[k], r.Columns[i].TypeOID)
		}
		if ts.identityErr != nil {
			continue
		}
		switch {
		case i < 0:
			ts.identityErr = fmt.Errorf("its key column %q is no longer among the columns the stream carries (dropped, renamed, or left out of the publication's column list)", name)
		case r.ReplicaIdentity == replicator.IdentityNothing:
			ts.identityErr = errors.New("its replica identity is NOTHING, so updates and deletes carry no key")
		case !r.Columns[i].Key:
			ts.identityErr = fmt.Errorf("its replica identity (%s) does not carry the key column %q, so an update or delete of it cannot be matched to a row", identityName(r), name)
		}
	}
	cols.Key = slices.Clone(ts.keyIdx)
	ts.cols = cols
	return nil
}

// identityName describes a Relation's replica identity and the columns it carries.
func identityName(r *replicator.Relation) string {
	var keys []string
	for _, col := range r.Columns {
		if col.Key {
			keys = append(keys, col.Name)
		}
	}
	switch r.ReplicaIdentity {
	case replicator.IdentityIndex:
		return "USING INDEX, on " + strings.Join(keys, ", ")
	case replicator.IdentityFull:
		return "FULL"
	case replicator.IdentityNothing:
		return "NOTHING"
	}
	if len(keys) == 0 {
		return "DEFAULT, with no primary key"
	}
	return "DEFAULT, the primary key " + strings.Join(keys, ", ")
}

// describes reports whether the stream's description r has the columns a chunk of t reads (names,
// types and type modifiers, in order). A modifier changed without a rewrite (timestamp(3) to
// timestamp(6), varbit(1) to varbit(8)) changes the forms of some outputs (Debezium's
// milliseconds or microseconds): rows read since take the chunk's, until the stream says it.
func describes(r *replicator.Relation, t *chunker.Table) bool {
	return slices.EqualFunc(r.Columns, t.Columns, func(x replicator.Column, y chunker.Column) bool {
		return x.Name == y.Name && x.TypeOID == y.TypeOID && x.TypeMod == y.TypeMod
	})
}

// key returns the canonical key of tuple t of table ts. A key column that is NULL, missing or
// not sent makes the change unplaceable: key columns are NOT NULL, so such a tuple was logged
// under another identity than the key (another index, a redefined key, a partition whose
// identity differs from its root's).
func (c *core) key(ts *tableState, t replicator.Tuple) ([]byte, error) {
	c.keyBuf = c.keyBuf[:0]
	for i, idx := range ts.keyIdx {
		name := ts.table.KeyNames()[i]
		if idx < 0 || idx >= len(t) {
			return nil, c.unplaceable(ts, fmt.Sprintf("its key column %q is not among the columns the stream carries", name))
		}
		v := t[idx]
		switch v.Kind {
		case replicator.Text:
			c.keyBuf = append(c.keyBuf, v.Data)
		case replicator.Null:
			return nil, c.unplaceable(ts, fmt.Sprintf("its key column %q arrived NULL: the change was logged under a replica identity that does not carry the key (%s)", name, identityName(ts.rel)))
		default:
			return nil, c.unplaceable(ts, fmt.Sprintf("its key column %q arrived without its value (kind %q): TOASTed key values are not supported", name, byte(v.Kind)))
		}
	}
	return ts.table.AppendKey(nil, c.keyBuf)
}

// unplaceable describes a change of ts, in the transaction being read, that cannot be placed.
func (c *core) unplaceable(ts *tableState, reason string) error {
	return &UnplaceableError{Table: ts.name, LSN: c.txLSN, XID: c.txXID, Reason: reason,
		Fix: fmt.Sprintf("restore the table's replica identity (ALTER TABLE %s REPLICA IDENTITY DEFAULT, or FULL), then re-backfill the table: the changes logged meanwhile do not say which rows they changed", pgIdent(ts.schema, ts.tname))}
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
	ts := c.byOID[rel.ID]
	if ts == nil {
		return nil
	}
	c.changes++
	c.txRows = true
	if ts.rel != rel {
		// Every change follows its Relation in the session; a change of an unseen relation
		// would mean the stream skipped one.
		return fmt.Errorf("change of %s before its relation", ts.name)
	}
	if ts.progress.Refresh {
		// The table's output starts over at its refresh (see Refresh): what comes before it is
		// replaced by the backfill.
		return nil
	}
	if ch.Op != replicator.Insert && ts.identityErr != nil {
		return c.unplaceable(ts, fmt.Sprintf("a change (%s) arrived while %v", ch.Op, ts.identityErr))
	}
	var newKey, oldKey []byte
	var partial bool          // an update that lacks unchanged TOASTed values
	var same replicator.Tuple // a same-key update's values
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
		} else {
			oldKey, same = nil, vals // the same key: evicted once, with the change's partial flag
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
			if op == Update && ch.OldKind == replicator.OldRow {
				c.out[len(c.out)-1].old = ch.Old
			}
		}
	case replicator.Delete:
		if oldKey, err = c.key(ts, ch.Old); err != nil {
			return err
		}
		c.emit(Delete, ts.cols, ch.Old, oldKey)
	}
	c.evict(ts, newKey, partial, same)
	c.evict(ts, oldKey, false, nil)
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
	c.rereadsChanged()
	c.fences = c.fences[:0] // a bounded run is not caught up until the row is read
	if len(ts.progress.Reread) > c.maxRereads {
		c.notices = append(c.notices, fmt.Sprintf("%s: more than %d rows wait to be read again whole (changes that left TOASTed values out): its backfill starts again from the beginning instead; REPLICA IDENTITY FULL avoids this",
			ts.name, c.maxRereads))
		p := ts.progress
		p.Reread, p.Cursor, p.MaxKey, p.Done, p.Ranges = nil, nil, nil, false, nil
		ts.indexRereads()
		// Every window of the table, open or not yet (registered, its low watermark still to
		// come), was asked for under the old progress.
		for _, w := range c.windows {
			if w.ts == ts && w.dirty == nil {
				w.dirty = errRestarted
			}
		}
	}
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

// track builds, once the chunk arrived, the set of keys whose changes still matter (its rows' and
// a key-list chunk's), and forgets the keys changed before that are not among them (they only
// bounded the window's memory: the high watermark looks up its rows' keys alone). It runs at the
// first change of the table after the hand-over: a window that meets none (a quiet table, most
// windows of a large backfill) never builds it.
func (w *window) track() {
	t := w.chunk.Table
	w.tracked = make(map[string]bool, len(w.rowKeys)+len(w.keys))
	for _, k := range w.rowKeys {
		w.tracked[string(k)] = true
	}
	keyVals := make([][]byte, len(t.Key))
	for _, k := range w.keys {
		for j, v := range k {
			keyVals[j] = []byte(v)
		}
		if key, err := t.AppendKey(nil, keyVals); err == nil {
			w.tracked[string(key)] = true
		}
	}
	for k := range w.touched {
		if !w.tracked[k] {
			delete(w.touched, k)
		}
	}
	for k := range w.fills {
		if !w.tracked[k] {
			delete(w.fills, k)
		}
	}
}

// evict drops key from the chunks of ts's open windows: the rows whose key a change touched
// inside the window are not emitted at the high watermark, whether the change came before or
// after the chunk's rows arrived.
func (c *core) evict(ts *tableState, key []byte, partial bool, same replicator.Tuple) {
	if key == nil || c.noEviction {
		return
	}
	for _, w := range ts.open {
		switch {
		case w.chunk != nil:
			if w.tracked == nil {
				w.track()
			}
			if w.tracked[string(key)] {
				w.touched[string(key)] = partial
				w.noteChange(string(key), same, ts.cols)
			}
		case len(w.touched) < maxEarly:
			w.touched[string(key)] = partial
			w.noteChange(string(key), same, ts.cols)
		case w.dirty == nil:
			w.dirty = errCrowded
		}
	}
}

func (c *core) emit(op Op, cols *Columns, vals replicator.Tuple, key []byte) {
	c.out = append(c.out, Event{Op: op, Columns: cols, vals: vals, Key: key, LSN: c.txLSN, Seq: c.txSeq, XID: c.txXID, Time: c.txTime})
	c.txSeq++
}

func (c *core) truncate(t *replicator.Truncate) error {
	for _, rel := range t.Rels {
		ts := c.byOID[rel.ID]
		if ts == nil {
			continue
		}
		c.txRows = true
		// Recorded even while the table starts over: the files it made are explained whenever
		// they are looked at (storageCheck).
		ts.progress.Truncated = c.txXID
		if sc := c.storage[ts.name]; sc != nil && sc.explainedBy(c.txXID) {
			ts.progress.Files = sc.files // explained: this TRUNCATE made them
			delete(c.storage, ts.name)
		}
		if ts.progress.Refresh {
			continue
		}
		for _, w := range ts.open {
			w.dirty = errTruncated
		}
		c.out = append(c.out, Event{Op: Truncate, Columns: ts.cols, LSN: c.txLSN, Seq: c.txSeq, XID: c.txXID, Time: c.txTime})
		c.txSeq++
	}
	return nil
}

func (c *core) handover(h handover) error {
	w := c.windows[h.id]
	if w == nil {
		return nil // withdrawn already
	}
	if w.chunk != nil {
		return fmt.Errorf("chunk %d handed over twice", h.id)
	}
	if h.chunk.Snapshot.Xmax != 0 && older(h.chunk.Snapshot, w.ts.tableSnap) {
		// Another reader's chunk of the table, read earlier and handed over later (a split
		// backfill, I23), does not take back a definition a newer snapshot read.
	} else {
		w.ts.table, w.ts.tableSnap = h.chunk.Table, h.chunk.Snapshot
	}
	w.chunk, w.maxKey, w.keys, w.refresh, w.rng, w.to = h.chunk, h.maxKey, h.keys, h.refresh, h.rng, h.to
	// From now on only changes of the chunk's keys (and a key-list chunk's) matter: the set of
	// them is built at the first such change (track).
	t := h.chunk.Table
	keyVals := make([][]byte, len(t.Key))
	var buf []byte // the rows' keys, in one allocation
	for _, row := range h.chunk.Rows {
		for j, k := range t.Key {
			keyVals[j] = row[k]
		}
		start := len(buf)
		var err error
		if buf, err = t.AppendKey(buf, keyVals); err != nil {
			w.dirty = err
			break
		}
		key := buf[start:len(buf):len(buf)]
		w.rowKeys = append(w.rowKeys, key)
	}
	if !h.refresh {
		c.guard.snapshot(h.chunk.Snapshot)
		c.guard.observe(h.chunk.Snapshot)
	}
	return nil
}

func (c *core) commit(cm *replicator.Commit) error {
	if !c.inTxn {
		return fmt.Errorf("commit outside a transaction")
	}
	c.inTxn = false
	if c.txRows {
		c.guard.commit(c.txXID, c.txLSN)
	}
	for _, m := range c.txMarks {
		switch m.Kind {
		case watermark.Low:
			w := c.windows[m.ID]
			if w == nil || w.lSeen {
				continue // withdrawn, or a repeated mark
			}
			w.lSeen, w.lLSN, w.changes = true, c.txLSN, c.changes
			w.ts.open = append(w.ts.open, w)
			if w.ts.progress.Refresh && !w.early {
				c.refresh(w.ts)
			}
		case watermark.High:
			if w := c.windows[m.ID]; w != nil {
				c.high(w)
			}
		case watermark.Fence:
			c.fences = append(c.fences, m.ID)
			c.fencesSeen = append(c.fencesSeen, m.ID)
		}
	}
	c.pos.LSN = cm.EndLSN
	c.checkStale()
	if xs, ok := c.pendingXmins(); ok {
		c.guard.prune(xs)
	}
	for _, v := range c.deferred {
		c.takeAsk(v)
	}
	c.deferred = c.deferred[:0]
	return c.checkStorage()
}

// takeAsk applies a re-backfill request at a transaction boundary; it is answered once a
// checkpoint carries it, or at once when it is refused.
func (c *core) takeAsk(v rebackfillAsk) {
	if err := c.rebackfill(v.tables, v.cause); err != nil {
		v.done <- err
		return
	}
	if v.shape != nil {
		for _, name := range v.tables {
			c.setShape(name, c.tables[name].progress, *v.shape)
		}
	}
	c.asked = append(c.asked, v)
}

// setShape records what a look found of table name's shape in its progress p. The last TRUNCATE
// the stream carried stays (the worker does not know it), and so do the files a storage
// question is pending on (still to be explained).
func (c *core) setShape(name string, p *TableProgress, s Shape) {
	files, truncated := p.Files, p.Truncated
	p.Shape = s
	p.Truncated = truncated
	if c.storage[name] != nil {
		p.Files = files
	}
}

// dropAsks answers the requests no checkpoint carried, when the run ends.
func (c *core) dropAsks() {
	for _, v := range append(c.asked, c.deferred...) {
		v.done <- errAskLost
	}
	c.asked, c.deferred = nil, nil
}

// checkStorage stops the capture once the stream is past where a table's storage change was
// found with no TRUNCATE that explains it (storageCheck).
func (c *core) checkStorage() error {
	for _, sc := range c.storage {
		if c.pos.LSN >= sc.until {
			return sc.err()
		}
	}
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
	case w.refresh:
		// A refresh's first window: its low watermark placed the Refresh; nothing to emit.
		c.remove(w)
		c.verdicts = append(c.verdicts, verdict{id: w.id, completed: true, progress: w.ts.progress.clone(), gen: c.rereadGen})
		return
	case w.dirty != nil:
		c.end(w, w.dirty, errors.Is(w.dirty, errSchema))
		return
	case w.rel != nil && !describes(w.rel, w.chunk.Table):
		// The stream described the table anew inside the window, and not as the chunk read it.
		c.end(w, errSchema, true)
		return
	case w.keys == nil && !continues(w):
		// A range chunk read from another cursor than the table's, or its range's (its backfill
		// started over, or was split, after the chunk was asked for): completing it would move
		// the cursor past rows the new backfill has not read.
		c.end(w, errRestarted, false)
		return
	case !c.noGuard && c.guardViolated(w):
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
	c.out = slices.Grow(c.out, len(w.chunk.Rows))
	var filled map[string]bool // keys whose row went out whole though changed inside the window
	var wholes [][]string      // and their text values
	for i, row := range w.chunk.Rows {
		key := w.rowKeys[i]
		if partial, touched := w.touched[string(key)]; touched {
			if !partial {
				continue
			}
			if whole := wholeRow(w.fills[string(key)], cols, row); whole != nil {
				// Every change of the row inside the window left the same TOASTed values out:
				// the chunk's row has them, the last change the rest.
				if filled == nil {
					filled = map[string]bool{}
				}
				filled[string(key)] = true
				wholes = append(wholes, keyStrings(row, t.Key))
				c.out = append(c.out, Event{Op: Snapshot, Columns: cols, row: whole, Key: key, LSN: c.txLSN, Seq: c.txSeq, Time: c.txTime})
				c.txSeq++
				emitted++
				continue
			}
			// The row held the only whole copy of its unchanged TOASTed values: read it again
			// after the change (docs/adr/0005-unchanged-toast.md).
			rereads = append(rereads, keyStrings(row, t.Key))
			continue
		}
		c.out = append(c.out, Event{Op: Snapshot, Columns: cols, row: row, Key: key, LSN: c.txLSN, Seq: c.txSeq, Time: c.txTime})
		c.txSeq++
		emitted++
	}
	p := w.ts.progress
	if w.keys != nil {
		// A key-list chunk: its keys are no longer pending, save those whose last change inside
		// the window lacked unchanged TOASTed values. Such a key may have no row in the chunk
		// (re-created after the SELECT) and still need one.
		// A chunk that stopped at the byte bound read only the keys of its rows: the others
		// stay (a key absent from it may be one it did not reach).
		var read map[string]bool
		if w.chunk.Capped {
			read = make(map[string]bool, len(w.rowKeys))
			for _, k := range w.rowKeys {
				read[string(k)] = true
			}
		}
		done := w.keys[:0:0]
		for _, k := range w.keys {
			vals := make([][]byte, len(k))
			for i, v := range k {
				vals[i] = []byte(v)
			}
			key, err := t.AppendKey(nil, vals)
			if err == nil && (w.touched[string(key)] && !filled[string(key)] || read != nil && !read[string(key)]) {
				continue
			}
			done = append(done, k)
		}
		p.Reread = removeKeys(p.Reread, done)
		w.ts.indexRereads()
		c.rereadsChanged()
	} else {
		if len(wholes) > 0 && len(p.Reread) > 0 {
			// A row that went out whole after its last change needs no other read.
			p.Reread = removeKeys(p.Reread, wholes)
			w.ts.indexRereads()
			c.rereadsChanged()
		}
		if w.rng > 0 {
			r := &p.Ranges[w.rng-1]
			if w.chunk.Last != nil {
				r.Cursor = w.chunk.Last
			}
			r.Done = r.Done || w.chunk.Done
			p.Done = p.rangesDone()
		} else {
			if w.chunk.Last != nil {
				p.Cursor = w.chunk.Last
			}
			if p.MaxKey == nil {
				p.MaxKey = w.maxKey
			}
			p.Done = p.Done || w.chunk.Done
		}
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
		c.rereadsChanged()
	}
	p.Rows += int64(emitted)
	c.remove(w)
	c.verdicts = append(c.verdicts, verdict{id: w.id, completed: true, progress: p.clone(), emitted: emitted, gen: c.rereadGen, quiet: c.changes == w.changes})
}

// continues reports whether range chunk w was read from where its table's backfill is: the
// table's cursor when the backfill is not split, its range's cursor under the same bound when it
// is (a chunk asked for before a split, or under a split since replaced, does not continue it).
func continues(w *window) bool { return w.ts.progress.continuesAt(w.rng, w.chunk.After, w.to) }

// split takes a split of a table's backfill into key ranges (the split message) when the
// table's progress is the one it was computed on, and answers with a verdict either way. The
// ranges start at the cursor and end at the upper bound, adjacent at the points: every key the
// backfill has still to read is in exactly one of them, so the windows of different ranges never
// hold the same key (I23). It emits nothing: a checkpoint may carry it at any point.
func (c *core) split(s split) {
	v := verdict{id: s.id, reason: errSplitLate}
	ts := c.tables[s.table]
	if ts == nil {
		v.reason = fmt.Errorf("split of %s, which is not captured", s.table)
		c.verdicts = append(c.verdicts, v)
		return
	}
	p := ts.progress
	if p.Ranges == nil && !p.Done && !p.Refresh && p.MaxKey != nil && len(s.points) > 0 && len(s.points) < MaxReaders &&
		slices.Equal(p.Cursor, s.from) && slices.Equal(p.MaxKey, s.maxKey) {
		from := p.Cursor
		for _, pt := range s.points {
			p.Ranges = append(p.Ranges, KeyRange{Cursor: from, To: pt})
			from = pt
		}
		p.Ranges = append(p.Ranges, KeyRange{Cursor: from, To: p.MaxKey})
		v.completed, v.reason = true, nil
		c.rereadsChanged() // every reader learns of the ranges (wakeup)
	}
	v.progress, v.gen = p.clone(), c.rereadGen
	c.verdicts = append(c.verdicts, v)
}

// older reports whether snapshot a was certainly taken before snapshot b: a transaction id
// assigned before b was not yet assigned at a (xmax only grows), or, with the same xmax, a
// transaction running at a had ended at b. Snapshots that cannot be told apart are not older.
func older(a, b chunker.Snapshot) bool {
	return a.Xmax < b.Xmax || a.Xmax == b.Xmax && len(a.Xip) > len(b.Xip)
}

// guardViolated ends w when a transaction that committed before its low watermark is invisible
// to its snapshot, naming the transaction (an operator can look it up in pg_stat_activity).
func (c *core) guardViolated(w *window) bool {
	bad, xid := c.guard.violated(w.chunk.Snapshot, w.lLSN)
	if !bad {
		return false
	}
	reason := errVisibility
	if xid != 0 {
		reason = fmt.Errorf("%w: transaction %d (committed, not yet visible: a synchronous standby that does not answer? see pg_stat_activity.backend_xid)", errVisibility, xid)
	}
	c.end(w, reason, false)
	return true
}

// rebackfill starts tables' output over while the run goes on (Engine.Rebackfill): from here their
// changes are not emitted (Refresh), the windows open or asked for under their old progress are
// abandoned, and the worker, told of the new progress, opens the refresh's first window, whose
// low watermark places the Refresh event (I20). Changes passed over between here and there do
// not matter: the Refresh says every row the output had is gone, and the backfill reads all.
func (c *core) rebackfill(tables []string, cause string) error {
	var errs []error
	for _, name := range tables {
		if c.tables[name] == nil {
			errs = append(errs, fmt.Errorf("%s is not captured by this run", name))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, name := range tables {
		ts := c.tables[name]
		p := ts.progress
		if p.Refresh {
			continue // asked for already, not started yet
		}
		*p = p.whatTheTableIs()
		p.Refresh = true
		if sc := c.storage[name]; sc != nil {
			// A storage change between runs no longer matters: every row is read again. The
			// files now are the ones to compare with from here.
			p.Files = sc.files
			delete(c.storage, name)
		}
		ts.indexRereads()
		for _, w := range c.windows {
			if w.ts == ts {
				w.early = true
				if w.dirty == nil {
					w.dirty = errRestarted
				}
			}
		}
		if cause == "" {
			cause = "asked for while the capture runs"
		}
		c.notices = append(c.notices, fmt.Sprintf("%s: re-backfill, %s: its output starts over at the next window (a refresh), its changes meanwhile are replaced by the backfill", name, cause))
	}
	c.rereadsChanged()
	c.fences = c.fences[:0] // a bounded run is not caught up until the re-backfill is done
	return nil
}

// refresh starts ts's output over, at the low watermark of its refresh's first window: a Refresh
// event (every row the output had for the table is gone), and a backfill from the start. The
// table's changes before this point were not emitted (see change): the backfill replaces them.
func (c *core) refresh(ts *tableState) {
	c.out = append(c.out, Event{Op: Refresh, Columns: chunkColumns(ts.table, ts.schema, ts.tname), LSN: c.txLSN, Seq: c.txSeq, Time: c.txTime})
	c.txSeq++
	p := ts.progress
	*p = p.whatTheTableIs()
	ts.indexRereads()
	c.rereadsChanged()
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

// columnsOf returns the Columns of w's rows: the stream's when the stream describes the table
// with the same columns, else the chunk's own. The chunk read the table's definition between the
// window's watermarks; a description the stream sent inside the window was checked against it
// already (high), so a stream description that differs here is older than the chunk's: a column
// was added or dropped while the table had no change to send a new description with. It returns
// nil when the chunk's key differs from the one the table was captured with.
func (c *core) columnsOf(w *window) *Columns {
	t := w.chunk.Table
	if rel := w.ts.rel; rel != nil && describes(rel, t) {
		return w.ts.cols
	}
	if !slices.Equal(t.KeyNames(), w.ts.table.KeyNames()) {
		return nil
	}
	if cols := c.chunkCols[t]; cols != nil {
		return cols
	}
	cols := chunkColumns(t, w.ts.schema, w.ts.tname)
	c.chunkCols[t] = cols
	return cols
}

// chunkColumns describes the rows a chunk of t reads, under the output name schema.name.
func chunkColumns(t *chunker.Table, schema, name string) *Columns {
	cols := &Columns{Schema: schema, Table: name, Key: slices.Clone(t.Key)}
	for _, col := range t.Columns {
		cols.Names = append(cols.Names, col.Name)
		cols.Types = append(cols.Types, col.TypeOID)
		cols.TypeMods = append(cols.TypeMods, col.TypeMod)
	}
	return cols
}

// end abandons window w.
func (c *core) end(w *window, reason error, rediscover bool) {
	c.remove(w)
	c.verdicts = append(c.verdicts, verdict{id: w.id, reason: reason, rediscover: rediscover, progress: w.ts.progress.clone(), gen: c.rereadGen})
}

func (c *core) remove(w *window) {
	delete(c.windows, w.id)
	w.ts.open = slices.DeleteFunc(w.ts.open, func(o *window) bool { return o == w })
}

// pendingXmins returns the xmins of the snapshots the guard must still check: of the chunks
// handed over, and, for a window whose chunk has not come, a floor under its snapshot's (the
// newest the guard knew at its registration: its reader takes the snapshot after that, and
// xmins do not go back). ok is false when a window registered before the guard knew any xmin
// waits for its chunk: nothing may be pruned then. With one reader, snapshots come in the order
// they were taken and the floors change nothing; with several they are what keeps a commit an
// older snapshot may miss (I23).
func (c *core) pendingXmins() (xs []uint32, ok bool) {
	for _, w := range c.windows {
		switch {
		case w.refresh:
			// A refresh's first window: no rows, no snapshot, nothing to check.
		case w.chunk != nil:
			xs = append(xs, uint32(w.chunk.Snapshot.Xmin))
		case !w.floorKnown:
			return nil, false
		default:
			xs = append(xs, w.floor)
		}
	}
	return xs, true
}
