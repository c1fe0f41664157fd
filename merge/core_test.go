package merge

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/watermark"
)

// The model: a table t(id numeric primary key, ver int8, big text, big2 text[, c int4]) whose every write
// takes a new ver from a global counter, so a key's versions only grow, also across a delete and
// a re-insert. A key is stored with a scale (5, 5.0, 5.00: equal keys, different text), and an
// update may change only the scale, which the stream sends as a key change. big stands for a TOASTed value: an update that leaves it alone sends it as
// unchanged (under REPLICA IDENTITY DEFAULT; under FULL the old row carries it), a key change
// too. A simulated PostgreSQL commits transactions in an order the stream delivers them in,
// makes them visible to snapshots at commit or, for "hung" transactions, later (a synchronous
// standby that has not answered). Schema changes are transactions of their own: a column added
// or dropped, the table renamed, its replica identity flipped between DEFAULT and FULL, a
// column's type changed without a rewrite (text and varchar); the
// stream describes the table again before its next change, as pgoutput does. The capture
// restarts at random from its last checkpoint: the core is rebuilt from the position, the stream
// replays from it, the output after the checkpoint is rolled back (an exactly-once sink), and
// hung transactions stay hung across the restart. Each run numbers its chunks from 1, as the
// engine does: an earlier run's marks with the same ids are still in the stream. A TRUNCATE of
// the table now and then (a transaction of its own, once no transaction is hung: it waits for
// their locks), keepalives while the stream is idle (the position moves past the last commit),
// and re-backfills asked for at a restart or while the capture runs.
//
// A simulated chunk worker runs the chunk protocol against it (range chunks, key-list chunks
// for the rows to read again, probes when idle); its inputs and the stream's reach the core in
// one FIFO order that respects causality, as the engine's channel does. With several readers
// (I23), key-list readers run beside it, each window of its own; with two tables, a second
// table u (its rows the odd ids, t's the even ones, each keyed by its id halved, so that the
// two tables' keys coincide and a change of one must not touch the other's windows) gets a
// range reader of its own, and transactions write both. The oracle: replaying
// the output gives the final table, TOASTed values included (I1), no key's version ever goes
// back or comes back after a delete (I2, I3), positions (LSN, seq) increase along the output,
// across restarts too (I13), a chunk's rows go out with the columns it read (I17), a table asked
// to be re-backfilled has no event before its Refresh (I20), every event is under the configured table name,
// and the backfill finishes.

var (
	simSignal = &replicator.Relation{ID: 16385, Schema: "public", Table: "tidemark_signal", ReplicaIdentity: replicator.IdentityDefault,
		Columns: []replicator.Column{{Name: "slot", TypeOID: 25, Key: true}, {Name: "run", TypeOID: 25}, {Name: "chunk", TypeOID: 20}, {Name: "kind", TypeOID: 25}, {Name: "written_at", TypeOID: 1184}}}
	simMarks = watermark.Config{Slot: "s", Run: "run1"}
)

const simOID = 16384

// simTableWith is t as the chunker discovers it, with or without the column c.
func simTableWith(c bool) *chunker.Table { return simTableOf(simSchema{c: c}) }

// simTableOf is the table as the chunker discovers it under definition d.
func simTableOf(d simSchema) *chunker.Table {
	t := &chunker.Table{Schema: "public", Name: d.baseName(), OID: d.relOID(), KeySource: "primary key", ReplicaIdentity: 'd',
		Columns: []chunker.Column{{Name: "id", TypeOID: 1700, BaseOID: 1700, TypeMod: -1}, {Name: "ver", TypeOID: 20, BaseOID: 20, TypeMod: -1},
			{Name: "big", TypeOID: 25, BaseOID: 25, TypeMod: -1}, {Name: "big2", TypeOID: d.big2Type(), BaseOID: d.big2Type(), TypeMod: -1}},
		Key: []int{0}}
	if d.c {
		t.Columns = append(t.Columns, chunker.Column{Name: "c", TypeOID: 23, BaseOID: 23, TypeMod: -1})
	}
	return t
}

func text(s string) replicator.Value { return replicator.Value{Kind: replicator.Text, Data: []byte(s)} }

// simSchema is a table's definition at one point of the WAL.
type simSchema struct {
	base     string // the captured table's name: t ("" too), or u, the second table (simOptions.tables)
	split    bool   // two tables: a row's key is its id halved (keyNum), so the tables' keys coincide
	oid      uint32 // its OID; 0: simOID
	c        bool   // has the column c
	name     string // table name (renames)
	full     bool   // REPLICA IDENTITY FULL
	varchar  bool   // big2 is varchar (ALTER COLUMN ... TYPE varchar, binary-coercible: no rewrite), not text
	relation *replicator.Relation
}

// keyNum is the key value of row id under d.
func (s simSchema) keyNum(id int) int {
	if s.split {
		return id >> 1
	}
	return id
}

func (s simSchema) baseName() string {
	if s.base == "" {
		return "t"
	}
	return s.base
}

func (s simSchema) relOID() uint32 {
	if s.oid == 0 {
		return simOID
	}
	return s.oid
}

// big2Type is the type of column big2.
func (s simSchema) big2Type() uint32 {
	if s.varchar {
		return 1043
	}
	return 25
}

func (s simSchema) with(edit func(*simSchema)) simSchema {
	edit(&s)
	cols := []replicator.Column{{Name: "id", TypeOID: 1700, TypeMod: -1, Key: true}, {Name: "ver", TypeOID: 20, TypeMod: -1, Key: s.full},
		{Name: "big", TypeOID: 25, TypeMod: -1, Key: s.full}, {Name: "big2", TypeOID: s.big2Type(), TypeMod: -1, Key: s.full}}
	if s.c {
		cols = append(cols, replicator.Column{Name: "c", TypeOID: 23, TypeMod: -1, Key: s.full})
	}
	ri := replicator.IdentityDefault
	if s.full {
		ri = replicator.IdentityFull
	}
	s.relation = &replicator.Relation{ID: s.relOID(), Schema: "public", Table: s.name, ReplicaIdentity: ri, Columns: cols}
	return s
}

// simRow is a row's state: its version, its TOASTed value's version, and its key's scale.
type simRow struct {
	ver, big int64
	big2     int64 // a second TOASTed value, changed apart from big
	scale    int
}

// keyText is id's text with scale zeros after the point.
func keyText(id, scale int) string {
	if scale == 0 {
		return strconv.Itoa(id)
	}
	return strconv.Itoa(id) + "." + strings.Repeat("0", scale)
}

// keyID parses a key's text back to its id.
func keyID(s string) int {
	i, _ := strconv.Atoi(strings.SplitN(s, ".", 2)[0])
	return i
}

// simOp is one row operation of a transaction.
type simOp struct {
	op       replicator.Op
	id, old  int    // old: the previous key of a key-changing update
	ver      int64  // the new version (insert, update)
	big      int64  // the new TOASTed value's version; 0: unchanged (update)
	big2     int64  // the same for big2
	scale    int    // the key's scale (insert, update)
	keyMoved bool   // a key change (old, possibly equal to id with another scale)
	before   simRow // the row before (update, delete): what a FULL identity's old tuple carries
}

// simTxn is a transaction of the simulated server.
type simTxn struct {
	xid     uint32
	ops     []simOp
	marks   []watermark.Mark // a mark transaction's marks, in order (a high one and the next low one, I22)
	run     string           // the run whose mark this is
	message bool             // the mark is a logical message (watermark.Messages), not a signal table row
	schema  simSchema
	ddl     bool
	// truncate: a TRUNCATE of the table
	truncate bool
	commit   pglogrepl.LSN
	visible  bool // visible to new snapshots
}

// simOptions choose what the model exercises, and which breaks the core runs with.
type simOptions struct {
	noGuard, noEviction bool
	ddl                 bool // column, name and identity changes
	restarts            bool // restarts from the last checkpoint
	rereadPartial       bool // the core withholds partial updates (Airbyte)
	hot                 bool // most operations hit the keys a window or a re-read is about
	refreshes           bool // some restarts ask for the table's output to start over, and so do requests while it runs
	capped              bool // chunks stop early, as at the byte bound, and few rows may wait to be read again
	truncates           bool // TRUNCATE of the table now and then (while no transaction is hung: it waits for their locks)
	keepalives          bool // keepalives while the stream is idle move the position past the last commit
	readers             int  // chunk readers: above one, key-list readers beside the range readers (I23)
	tables              int  // 2: a second table u, with its own range reader (I23: windows of two tables)
	split               bool // a second range reader per table, and backfills split into key ranges (I23)
	waitProbes          bool // readers waiting for a verdict take snapshots (probes), as the worker does
}

// simCheckpoint is what survives a restart: the position, and the output up to it.
type simCheckpoint struct {
	pos     *Position
	replay  map[string]simRow
	maxVer  map[string]int64
	deleted map[string]bool
	lastLSN pglogrepl.LSN
	lastSeq int
}

type sim struct {
	r   *rand.Rand
	opt simOptions

	// With two tables (simOptions.tables), a row's table is its id's parity: ids are unique
	// across the tables, and so are the output's keys. Schema changes and TRUNCATE are t's.
	tabs    int
	table   map[int]simRow // committed state, in commit order
	vis     map[int]simRow // state visible to new snapshots
	schema  simSchema      // t's current definition (DDL never hangs)
	uschema simSchema      // u's, which does not change
	nextXID uint32
	nextLSN pglogrepl.LSN
	nextVer int64
	nextKey int
	open    []uint32  // xids of started, uncommitted app transactions
	hung    []*simTxn // committed, not yet visible
	log     []*simTxn // every committed transaction, in commit order
	next    int       // index in log of the next transaction to deliver
	locked  map[int]bool

	core     *core
	runNo    int
	marks    watermark.Config
	sentRel  map[uint32]*replicator.Relation // the descriptions the stream sent in this session, by OID
	inputs   int
	restarts int
	last     *simCheckpoint

	// the readers (the first of each table reads its ranges) and the range readers' views of
	// their tables' progress
	readers []*simReader
	prog    []*simProg
	nextID  int64
	// overlaps counts the inputs after which two or more windows were open (their low marks seen)
	// with a chunk handed over, crossed those of them with windows of both tables, same those with
	// two or more of one table; sideRows, the
	// rows the key-list readers' windows emitted
	overlaps, crossed, same, sideRows int
	// ranged counts the inputs after which windows of two key ranges of one table were open,
	// splits the splits the core took
	ranged, splits int
	limit          int

	tail      bool     // the random steps are over: no more transactions
	trace     []string // what happened, for a failure's message
	refreshed int      // Refresh events seen

	// the oracle
	replay  map[string]simRow
	maxVer  map[string]int64
	deleted map[string]bool
	// the position of the last event (I13: positions increase along the output; lastLSN 0: none)
	lastLSN pglogrepl.LSN
	lastSeq int
	// awaitRefresh: a re-backfill of the table was asked for and its Refresh has not come yet:
	// no event of the table may come before it (I20); by table name
	awaitRefresh map[string]bool
	ids          map[string]int // every key's id, by its table's name and the key
	verOwner     map[int64]int  // the row (id) each version was written to: versions are unique
	// chunkTypes are the column types each chunk of this run read, by id (I17: it is emitted
	// with them); emitting, the chunk whose high watermark is being delivered
	chunkTypes map[int64][]uint32
	emitting   int64
}

// simProg is a range reader's view of its table's progress, from its verdicts.
type simProg struct {
	cursor, maxKey []string
	done, started  bool
	gen            int // core.rereadGen its progress is as of (verdict.gen)
}

// tabOf is the table of row id: 0 (t) or 1 (u).
func (s *sim) tabOf(id int) int {
	if s.tabs == 2 {
		return id % 2
	}
	return 0
}

// tabName is the configured name of table tab.
func tabName(tab int) string { return []string{"public.t", "public.u"}[tab] }

// schemaNow is table tab's current definition.
func (s *sim) schemaNow(tab int) simSchema {
	if tab == 1 {
		return s.uschema
	}
	return s.schema
}

// schemaAt is table tab's definition when tx committed.
func (s *sim) schemaAt(tab int, tx *simTxn) simSchema {
	if tab == 1 {
		return s.uschema
	}
	return tx.schema
}

// simFailure is a broken invariant, raised as a panic and returned by run.
type simFailure struct{ msg string }

func (s *sim) failf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if len(s.trace) > 0 && testing.Verbose() {
		msg += "\n" + strings.Join(s.trace[max(0, len(s.trace)-100000):], "\n")
	}
	panic(simFailure{msg})
}

func (s *sim) tracef(format string, args ...any) {
	if testing.Verbose() {
		s.trace = append(s.trace, fmt.Sprintf(format, args...))
	}
}

func (s *sim) must(err error) {
	if err != nil {
		s.failf("%v", err)
	}
}

func newSim(seed uint64, opt simOptions) *sim {
	s := &sim{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), opt: opt, table: map[int]simRow{}, vis: map[int]simRow{},
		nextXID: 1000, nextLSN: 0x1000000, nextVer: 1, locked: map[int]bool{},
		replay: map[string]simRow{}, maxVer: map[string]int64{}, deleted: map[string]bool{}}
	s.tabs = max(1, opt.tables)
	s.schema = simSchema{name: "t", split: s.tabs == 2}.with(func(*simSchema) {})
	s.uschema = simSchema{base: "u", oid: simOID + 1, name: "u", split: true}.with(func(*simSchema) {})
	s.ids, s.verOwner = map[string]int{}, map[int64]int{}
	s.limit = 1 + s.r.IntN(8)
	// Rows that exist before the slot: only the backfill can see them.
	for range 10 + s.r.IntN(30) {
		s.nextKey += 1 + s.r.IntN(3)
		row := simRow{ver: s.nextVer, big: s.nextVer, big2: s.nextVer}
		s.table[s.nextKey], s.vis[s.nextKey] = row, row
		s.key(s.nextKey)
		s.verOwner[s.nextVer] = s.nextKey
		s.nextVer++
	}
	pos := &Position{Version: PositionVersion, LSN: s.nextLSN, Tables: map[string]*TableProgress{}}
	for tab := range s.tabs {
		pos.Tables[tabName(tab)] = &TableProgress{Key: []string{"id"}}
	}
	s.start(pos)
	return s
}

// start begins a run of the capture from pos: a new core, a new replication session.
func (s *sim) start(pos *Position) {
	s.runNo++
	s.marks = watermark.Config{Slot: "s", Run: "run" + strconv.Itoa(s.runNo)}
	tables := map[string]*chunker.Table{}
	for tab := range s.tabs {
		tables[tabName(tab)] = simTableOf(s.schemaNow(tab))
	}
	s.core = newCore(s.marks, pos, tables)
	s.core.noGuard, s.core.noEviction, s.core.rereadPartial = s.opt.noGuard, s.opt.noEviction, s.opt.rereadPartial
	if s.opt.capped {
		s.core.maxRereads = 8 // the backfill starts over now and then
	}
	s.sentRel = map[uint32]*replicator.Relation{}
	// Chunk ids start at 1 again in each run, as the engine's do: marks of an earlier run with
	// the same ids are still in the stream, and only their run tells them apart.
	s.nextID = 0
	// A range reader per table, then the key-list readers.
	s.readers, s.prog = nil, nil
	s.awaitRefresh = map[string]bool{}
	for tab := range s.tabs {
		s.readers = append(s.readers, &simReader{s: s, n: len(s.readers), tab: tab, ranges: true})
		if s.opt.split {
			s.readers[len(s.readers)-1].view = slices.Clone(pos.Tables[tabName(tab)].Ranges)
			s.readers = append(s.readers, &simReader{s: s, n: len(s.readers), tab: tab, ranges: true, part: 1, view: slices.Clone(pos.Tables[tabName(tab)].Ranges)})
		}
		p := pos.Tables[tabName(tab)]
		s.prog = append(s.prog, &simProg{cursor: p.Cursor, done: p.Done, maxKey: p.MaxKey, started: p.MaxKey != nil || p.Done})
		s.awaitRefresh[tabName(tab)] = p.Refresh
	}
	for range max(0, s.opt.readers-1) {
		s.readers = append(s.readers, &simReader{s: s, n: len(s.readers)})
	}
	s.chunkTypes = map[int64][]uint32{}
	s.feed(simSignal)
	s.next = len(s.log)
	for i, tx := range s.log {
		if tx.commit >= pos.LSN {
			s.next = i
			break
		}
	}
}

func (s *sim) feed(in any) {
	s.inputs++
	s.must(s.core.step(in))
	if open := 0; len(s.core.windows) > 1 {
		tables := map[string]int{}
		rngs := map[string]map[int]bool{}
		for _, w := range s.core.windows {
			if w.lSeen && w.chunk != nil {
				open++
				tables[w.ts.name]++
				if w.rng > 0 {
					if rngs[w.ts.name] == nil {
						rngs[w.ts.name] = map[int]bool{}
					}
					rngs[w.ts.name][w.rng] = true
				}
			}
		}
		for _, r := range rngs {
			if len(r) > 1 {
				s.ranged++
				break
			}
		}
		if open > 1 {
			s.overlaps++
			if len(tables) > 1 {
				s.crossed++
			}
			if len(tables) < open {
				s.same++
			}
		}
	}
	for _, ev := range s.core.out {
		s.check(ev)
	}
	s.core.out = s.core.out[:0]
	s.core.notices = s.core.notices[:0]
	vs := slices.Clone(s.core.verdicts)
	s.core.verdicts = s.core.verdicts[:0]
	for _, v := range vs {
		s.readerOf(v.id).verdict(v)
	}
}

// check applies one output event to the replay and checks I2/I3 on the way.
func (s *sim) check(ev Event) {
	name := ev.Columns.Schema + "." + ev.Columns.Table
	tab := slices.Index([]string{"public.t", "public.u"}[:s.tabs], name)
	if tab < 0 {
		s.failf("an event under %s, not a configured table's name", name)
	}
	k := name + "\x00" + string(ev.Key)
	if id, ok := s.ids[k]; ev.Key != nil && (!ok || s.tabOf(id) != tab) {
		s.failf("key %x (id %d, known %v) under %s", ev.Key, id, ok, name)
	}
	if s.lastLSN != 0 && (ev.LSN < s.lastLSN || ev.LSN == s.lastLSN && ev.Seq <= s.lastSeq) {
		s.failf("I13: %v at %s/%d after an event at %s/%d", ev.Op, ev.LSN, ev.Seq, s.lastLSN, s.lastSeq)
	}
	s.lastLSN, s.lastSeq = ev.LSN, ev.Seq
	if s.awaitRefresh[name] && ev.Op != Refresh {
		s.failf("I20: %v at %s before the Refresh of the re-backfill asked for", ev.Op, ev.LSN)
	}
	if read := s.chunkTypes[s.emitting]; ev.Op == Snapshot && (ev.NumCols() != len(read) || !slices.Equal(ev.Columns.Types, read)) {
		s.failf("I17: a chunk row of chunk %d emitted with the columns of types %v, the chunk read %v", s.emitting, ev.Columns.Types, read)
	}
	if ev.Op == Refresh {
		s.awaitRefresh[name] = false
	}
	if ev.Op == Refresh || ev.Op == Truncate {
		s.refreshed++
		for k := range s.replay {
			if s.tabOf(s.ids[k]) == tab {
				delete(s.replay, k)
			}
		}
		return
	}
	s.tracef("  out %v key %x vals %v at %s/%d", ev.Op, ev.Key, ev.NumCols(), ev.LSN, ev.Seq)
	if ev.NumCols() > 1 {
		s.tracef("      ver %s", ev.Col(1).Data)
	}
	switch ev.Op {
	case Delete:
		delete(s.replay, k)
		s.deleted[k] = true
	case Insert, Update, Snapshot:
		ver, err := strconv.ParseInt(string(ev.Col(1).Data), 10, 64)
		s.must(err)
		if owner, ok := s.verOwner[ver]; !ok || owner != s.ids[k] {
			s.failf("version %d (of row %d, known %v) went out as key %x of %s, row %d (%v at %s)", ver, owner, ok, ev.Key, name, s.ids[k], ev.Op, ev.LSN)
		}
		if last, ok := s.maxVer[k]; ok {
			if ver < last {
				s.failf("I2: key %x went back from version %d to %d (%v at %s)", ev.Key, last, ver, ev.Op, ev.LSN)
			}
			if s.deleted[k] && ver <= last {
				s.failf("I3: key %x came back after its delete with old version %d (%v at %s)", ev.Key, ver, ev.Op, ev.LSN)
			}
		}
		row := simRow{ver: ver}
		for i, dst := range []*int64{&row.big, &row.big2} {
			switch v := ev.Col(2 + i); v.Kind {
			case replicator.Unchanged:
				if ev.Op == Snapshot {
					s.failf("a snapshot row without its TOASTed value")
				}
				// Kept as it was; 0 when the output never had it.
				*dst = []int64{s.replay[k].big, s.replay[k].big2}[i]
			case replicator.Text:
				*dst, err = strconv.ParseInt(string(v.Data[1:]), 10, 64)
				s.must(err)
			default:
				s.failf("key %x: TOASTed column %d arrived as %q", ev.Key, i, v.Kind)
			}
		}
		s.maxVer[k], s.deleted[k] = ver, false
		s.replay[k] = row
	}
}

// key is row id's key as the replay holds it: its table's name and the key as the output
// carries it (the same under each scale). It records the id the key stands for.
func (s *sim) key(id int) string {
	tab := s.tabOf(id)
	k, err := simTableWith(false).AppendKey(nil, [][]byte{[]byte(keyText(s.keyNum(id), 0))})
	s.must(err)
	rk := tabName(tab) + "\x00" + string(k)
	s.ids[rk] = id
	return rk
}

// keyNum is the key value of row id.
func (s *sim) keyNum(id int) int { return s.schemaNow(s.tabOf(id)).keyNum(id) }

// idOf is the id of the row of table tab whose key text is k.
func (s *sim) idOf(tab int, k string) int {
	if s.tabs == 2 {
		return keyID(k)<<1 + tab
	}
	return keyID(k)
}

func (s *sim) lsn() pglogrepl.LSN { s.nextLSN += pglogrepl.LSN(1 + s.r.IntN(200)); return s.nextLSN }

// commit commits a transaction: it joins the WAL (to be streamed) and, unless hung, becomes
// visible at once.
func (s *sim) commit(tx *simTxn, hang bool) {
	tx.commit = s.lsn()
	tx.schema = s.schema
	if tx.truncate {
		s.truncateRows(s.table)
	}
	for _, op := range tx.ops {
		apply(s.table, op)
		s.key(op.id)
		if op.op != replicator.Delete {
			s.verOwner[op.ver] = op.id
		}
	}
	s.log = append(s.log, tx)
	// Committed: no later operation joins this transaction (a hung one still counts as running
	// in snapshots, through s.hung).
	s.open = slices.DeleteFunc(s.open, func(x uint32) bool { return x == tx.xid })
	if hang {
		s.tracef("hung xid %d commit %s ops %+v", tx.xid, tx.commit, tx.ops)
		s.hung = append(s.hung, tx)
		for _, op := range tx.ops {
			s.locked[op.id] = true
			if op.keyMoved {
				s.locked[op.old] = true
			}
		}
		return
	}
	s.makeVisible(tx)
}

// truncateRows empties t's rows of state (a TRUNCATE is t's).
func (s *sim) truncateRows(state map[int]simRow) {
	maps.DeleteFunc(state, func(id int, _ simRow) bool { return s.tabOf(id) == 0 })
}

func (s *sim) makeVisible(tx *simTxn) {
	s.tracef("visible xid %d", tx.xid)
	tx.visible = true
	if tx.truncate {
		s.truncateRows(s.vis)
	}
	for _, op := range tx.ops {
		apply(s.vis, op)
		delete(s.locked, op.id)
		if op.keyMoved {
			delete(s.locked, op.old)
		}
	}
	s.open = slices.DeleteFunc(s.open, func(x uint32) bool { return x == tx.xid })
}

// appTxn commits an application transaction of a few random operations, started earlier (its
// xid comes from the open set) or now.
func (s *sim) appTxn() {
	var xid uint32
	if len(s.open) > 0 && s.r.IntN(2) == 0 {
		xid = s.open[s.r.IntN(len(s.open))]
	} else {
		xid = s.nextXID
		s.nextXID++
		s.open = append(s.open, xid)
	}
	tx := &simTxn{xid: xid}
	scratch := maps.Clone(s.table)
	for range 1 + s.r.IntN(3) {
		keys := make([]int, 0, len(scratch))
		for k := range scratch {
			if !s.locked[k] {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		// Half the time (most of the time with opt.hot) the keys a window or a re-read is
		// about: where the races are.
		hot := s.hot()
		hotN := 2
		if s.opt.hot {
			hotN = 10
		}
		pick := func() (int, bool) {
			if len(hot) > 0 && s.r.IntN(hotN) != 0 {
				id := hot[s.r.IntN(len(hot))]
				if _, ok := scratch[id]; ok && !s.locked[id] {
					return id, true
				}
			}
			if len(keys) == 0 {
				return 0, false
			}
			return keys[s.r.IntN(len(keys))], true
		}
		free := func() (int, bool) {
			id := s.r.IntN(s.nextKey + 10)
			if len(hot) > 0 && s.r.IntN(hotN) != 0 {
				id = hot[s.r.IntN(len(hot))]
			}
			_, taken := scratch[id]
			return id, !taken && !s.locked[id]
		}
		var op simOp
		n := s.r.IntN(11)
		if r := s.anyReader(); s.opt.hot && r.keys != nil && s.r.IntN(2) == 0 {
			// A key-list window: its keys deleted before its SELECT, re-created after it.
			if r.wstate <= 2 {
				n = 7
			} else {
				n = []int{0, 4, 9}[s.r.IntN(3)]
			}
		}
		switch {
		case n < 3 || len(keys) == 0:
			id, ok := free()
			if !ok {
				continue
			}
			op = simOp{op: replicator.Insert, id: id, ver: s.nextVer, big: s.nextVer, big2: s.nextVer, scale: s.r.IntN(3)}
		case n < 7:
			id, _ := pick()
			op = simOp{op: replicator.Update, id: id, ver: s.nextVer, before: scratch[id], scale: scratch[id].scale}
			if s.r.IntN(3) == 0 {
				op.big = s.nextVer // the TOASTed value changes too
			}
			if s.r.IntN(4) == 0 {
				op.big2 = s.nextVer // and the other, apart from it
			}
		case n < 9:
			id, _ := pick()
			op = simOp{op: replicator.Delete, id: id, before: scratch[id]}
		case n < 10:
			id, ok := free()
			if !ok {
				continue
			}
			old, _ := pick()
			if s.tabOf(old) != s.tabOf(id) {
				continue // a key moves within its table
			}
			op = simOp{op: replicator.Update, id: id, old: old, ver: s.nextVer, keyMoved: true, before: scratch[old], scale: s.r.IntN(3)}
			if s.r.IntN(3) == 0 {
				op.big = s.nextVer
			}
			if s.r.IntN(4) == 0 {
				op.big2 = s.nextVer
			}
		default:
			// Only the key's scale changes: an equal key, sent as a key change.
			id, _ := pick()
			op = simOp{op: replicator.Update, id: id, old: id, ver: s.nextVer, keyMoved: true, before: scratch[id], scale: (scratch[id].scale + 1) % 3}
		}
		s.nextVer++
		apply(scratch, op)
		tx.ops = append(tx.ops, op)
	}
	s.commit(tx, s.r.IntN(12) == 0)
}

// ddlTxn changes the table's definition, in a transaction of its own that is visible at once.
func (s *sim) ddlTxn() {
	switch s.r.IntN(4) {
	case 3:
		// A column's type changed (varchar and text: binary-coercible, no rewrite): a chunk read
		// under one definition must not go out under the other (I17).
		s.schema = s.schema.with(func(d *simSchema) { d.varchar = !d.varchar })
	case 0:
		s.schema = s.schema.with(func(d *simSchema) { d.c = !d.c })
	case 1:
		s.schema = s.schema.with(func(d *simSchema) {
			d.name = map[string]string{"t": "t_renamed", "t_renamed": "t"}[d.name]
		})
	default:
		s.schema = s.schema.with(func(d *simSchema) { d.full = !d.full })
	}
	tx := &simTxn{xid: s.nextXID, ddl: true}
	s.nextXID++
	s.commit(tx, false)
}

// truncTxn truncates the table, in a transaction of its own that is visible at once. A TRUNCATE
// waits for the locks of the transactions that wrote the table: none is hung when it runs.
func (s *sim) truncTxn() {
	if len(s.hung) > 0 {
		return
	}
	tx := &simTxn{xid: s.nextXID, truncate: true}
	s.nextXID++
	s.tracef("TRUNCATE xid %d", tx.xid)
	s.commit(tx, false)
}

func apply(state map[int]simRow, op simOp) {
	switch op.op {
	case replicator.Insert:
		state[op.id] = simRow{ver: op.ver, big: op.big, big2: op.big2, scale: op.scale}
	case replicator.Update:
		prev := state[op.id]
		if op.keyMoved {
			prev = state[op.old]
			delete(state, op.old)
		}
		row := simRow{ver: op.ver, big: prev.big, big2: prev.big2, scale: op.scale}
		if op.big != 0 {
			row.big = op.big
		}
		if op.big2 != 0 {
			row.big2 = op.big2
		}
		state[op.id] = row
	case replicator.Delete:
		delete(state, op.id)
	}
}

// tuple is a row as the stream sends it under schema d; big or big2 nil is an unchanged TOASTed
// value.
func tuple(d simSchema, id, scale int, ver int64, big, big2 *int64) replicator.Tuple {
	t := replicator.Tuple{text(keyText(d.keyNum(id), scale)), text(strconv.FormatInt(ver, 10)), {Kind: replicator.Unchanged}, {Kind: replicator.Unchanged}}
	if big != nil {
		t[2] = text("b" + strconv.FormatInt(*big, 10))
	}
	if big2 != nil {
		t[3] = text("b" + strconv.FormatInt(*big2, 10))
	}
	if d.c {
		t = append(t, replicator.Value{Kind: replicator.Null})
	}
	return t
}

// oldTuple is the old key or row an update or delete carries under schema d.
func oldTuple(d simSchema, id int, before simRow) (replicator.OldKind, replicator.Tuple) {
	if d.full {
		return replicator.OldRow, tuple(d, id, before.scale, before.ver, &before.big, &before.big2)
	}
	t := replicator.Tuple{text(keyText(d.keyNum(id), before.scale)), {Kind: replicator.Null}, {Kind: replicator.Null}, {Kind: replicator.Null}}
	if d.c {
		t = append(t, replicator.Value{Kind: replicator.Null})
	}
	return replicator.OldKey, t
}

// deliver streams the next transaction of the WAL to the core.
func (s *sim) deliver() {
	tx := s.log[s.next]
	s.next++
	if tx.ddl {
		return // DDL sends nothing; the next change of the table describes it again
	}
	for _, m := range tx.marks {
		if tx.message {
			// A non-transactional message with the same content comes at once, outside any
			// transaction and ahead of the mark's commit: it is not a mark.
			s.feed(&replicator.Message{Prefix: watermark.Prefix, Content: []byte(s.marksOf(tx.run).MessageContent(m))})
		}
	}
	s.feed(&replicator.Begin{FinalLSN: tx.commit, XID: tx.xid})
	s.tracef("deliver xid %d commit %s ops %+v marks %v", tx.xid, tx.commit, tx.ops, tx.marks)
	describe := func(d simSchema) {
		if s.sentRel[d.relation.ID] != d.relation {
			s.feed(d.relation)
			s.sentRel[d.relation.ID] = d.relation
		}
	}
	if tx.truncate {
		d := tx.schema
		describe(d)
		s.feed(&replicator.Truncate{LSN: tx.commit, XID: tx.xid, Rels: []*replicator.Relation{d.relation}})
	}
	for _, op := range tx.ops {
		d := s.schemaAt(s.tabOf(op.id), tx)
		describe(d)
		ch := &replicator.Change{Op: op.op, XID: tx.xid, Rel: d.relation}
		switch op.op {
		case replicator.Insert:
			ch.New = tuple(d, op.id, op.scale, op.ver, &op.big, &op.big2)
		case replicator.Update:
			var big, big2 *int64
			if op.big != 0 {
				big = &op.big
			}
			if op.big2 != 0 {
				big2 = &op.big2
			}
			ch.New = tuple(d, op.id, op.scale, op.ver, big, big2)
			switch {
			case d.full:
				from := op.id
				if op.keyMoved {
					from = op.old
				}
				ch.OldKind, ch.Old = oldTuple(d, from, op.before)
			case op.keyMoved:
				ch.OldKind, ch.Old = oldTuple(d, op.old, op.before)
			}
		case replicator.Delete:
			ch.OldKind, ch.Old = oldTuple(d, op.id, op.before)
		}
		s.feed(ch)
	}
	for _, m := range tx.marks {
		if tx.message {
			s.feed(&replicator.Message{Transactional: true, XID: tx.xid, Prefix: "other", Content: []byte(s.marksOf(tx.run).MessageContent(m))})
			s.feed(&replicator.Message{Transactional: true, XID: tx.xid, Prefix: watermark.Prefix, Content: []byte(s.marksOf(tx.run).MessageContent(m))})
		} else {
			// The signal table's row of the slot, updated once per mark.
			s.feed(&replicator.Change{Op: replicator.Update, XID: tx.xid, Rel: simSignal, New: replicator.Tuple{
				text("s"), text(tx.run), text(strconv.FormatInt(m.ID, 10)), text(string(rune(m.Kind))), text("2026-01-01 00:00:00+00")}})
		}
	}
	s.emitting = 0
	for _, m := range tx.marks {
		if m.Kind == watermark.High && tx.run == s.marks.Run {
			s.emitting = m.ID // its rows go out at the commit
		}
	}
	s.feed(&replicator.Commit{LSN: tx.commit, EndLSN: tx.commit + 1, XID: tx.xid})
	if s.core.consistent() && s.r.IntN(3) == 0 {
		s.checkpoint()
	}
}

// checkpoint keeps what a sink made durable at this transaction boundary, as the merge loop
// hands it over.
func (s *sim) checkpoint() {
	s.core.pos.Invisible = s.core.guard.invisible()
	s.last = &simCheckpoint{pos: s.core.pos.Clone(), replay: maps.Clone(s.replay), maxVer: maps.Clone(s.maxVer), deleted: maps.Clone(s.deleted),
		lastLSN: s.lastLSN, lastSeq: s.lastSeq}
}

// restart crashes the capture and starts it again from its last checkpoint: the output after it
// is rolled back, the stream replays from it, windows and the in-flight chunk are gone.
func (s *sim) restart() {
	if s.last == nil {
		return
	}
	s.restarts++
	cp := s.last
	s.tracef("RESTART from %s invisible %v tables %+v", cp.pos.LSN, cp.pos.Invisible, cp.pos.Tables)
	s.replay, s.maxVer, s.deleted = maps.Clone(cp.replay), maps.Clone(cp.maxVer), maps.Clone(cp.deleted)
	s.lastLSN, s.lastSeq = cp.lastLSN, cp.lastSeq
	pos := cp.pos.Clone()
	if s.opt.refreshes && s.r.IntN(3) == 0 {
		// A re-backfill asked for: the table's output starts over.
		pos.Tables[tabName(s.anyTable())] = &TableProgress{Key: []string{"id"}, Refresh: true}
	}
	s.start(pos)
}

// anyTable draws a table (with one, without drawing).
func (s *sim) anyTable() int {
	if s.tabs == 1 {
		return 0
	}
	return s.r.IntN(s.tabs)
}

// marksOf is the watermark configuration of run.
func (s *sim) marksOf(run string) watermark.Config {
	return watermark.Config{Slot: s.marks.Slot, Run: run}
}

func (s *sim) markTxn(ms ...watermark.Mark) {
	// Runs alternate between the transports (without drawing from the random source, so a
	// seed's history does not depend on it).
	tx := &simTxn{xid: s.nextXID, marks: ms, run: s.marks.Run, message: s.runNo%2 == 0}
	s.nextXID++
	s.commit(tx, false)
}

// snapshot is what pg_current_snapshot() returns now.
func (s *sim) snapshot() chunker.Snapshot {
	snap := chunker.Snapshot{Xmin: uint64(s.nextXID), Xmax: uint64(s.nextXID)}
	running := slices.Clone(s.open)
	for _, tx := range s.hung {
		running = append(running, tx.xid)
	}
	slices.Sort(running)
	running = slices.Compact(running)
	if len(running) > 0 {
		snap.Xmin = uint64(running[0])
		for _, x := range running {
			snap.Xip = append(snap.Xip, uint64(x))
		}
	}
	return snap
}

// row is a visible row as a chunk reads it.
func (s *sim) row(id int) chunker.Row {
	r := s.vis[id]
	row := chunker.Row{[]byte(keyText(s.keyNum(id), r.scale)), []byte(strconv.FormatInt(r.ver, 10)), []byte("b" + strconv.FormatInt(r.big, 10)), []byte("b" + strconv.FormatInt(r.big2, 10))}
	if s.schemaNow(s.tabOf(id)).c {
		row = append(row, nil)
	}
	return row
}

// simReader is one chunk reader of the model: its chunk in flight and its pipelining (I22). A
// range reader reads its table's key ranges and its rows to read again, as the engine's worker
// does; there is one per table, so that with two tables (simOptions.tables) windows of both are
// open at once. With simOptions.readers > 1 the others read key lists only, of a table drawn for
// each chunk: rows to read again and keys drawn at random (present, deleted or never inserted),
// each with its own windows open beside the range readers': concurrent windows of one table, a
// key-list window over a range one (I23).
type simReader struct {
	s      *sim
	n      int  // its number: the range readers come first
	ranges bool // a range reader, of table tab
	// part: a range reader's share of a split backfill, the key ranges whose index has its parity
	// (the second, 1, reads only those); rng is 1 + the index of the range of the chunk in flight
	// (0: not split), from rngAfter up to rngTo as it was when the chunk started; splitting: the
	// verdict waited for is a split's
	part            int
	rng             int
	rngAfter, rngTo []string
	splitting       bool
	// view is the reader's view of its table's key ranges, from its verdicts and, as the
	// engine's wakeups bring them, now and then from the core (as of rereadGen viewGen): a
	// reader can start a chunk under ranges the core has replaced since.
	view    []KeyRange
	viewGen int
	tab     int // its table; a key-list reader's, of the chunk in flight
	wstate  int
	wid     int64
	chunk   *chunker.Chunk
	keys    [][]string // a key-list chunk's keys
	refresh bool
	fails   int
	// The chunk in flight's upper bound, as handed over.
	chunkMax []string
	// Pipelining (I22): chunk prev's high watermark went out with this chunk's low one, and this
	// chunk is read from prev's last key (pipeAfter, up to pipeMax) before prev's verdict comes;
	// prevOK: it came, completed, and left the table's cursor there. discardNext: a window
	// registered for a combined mark whose write failed, to withdraw next; discarding: the chunk
	// in flight is withdrawn, which is no failure of its own.
	prev               int64
	prevCame, prevOK   bool
	pipeAfter, pipeMax []string
	discardNext        int64
	discarding         bool
}

// newID is the next chunk id of the run: unique across readers (a repeated id would replace a
// window, I23), from 1 in each run as the engine's.
func (s *sim) newID() int64 { s.nextID++; return s.nextID }

// busy reports whether a reader has a chunk in flight.
func (s *sim) busy() bool {
	for _, r := range s.readers {
		if r.wstate != 0 {
			return true
		}
	}
	return false
}

// readerOf returns the reader whose chunk id is.
func (s *sim) readerOf(id int64) *simReader {
	for _, r := range s.readers {
		if r.wid == id || r.prev == id && !r.prevCame {
			return r
		}
	}
	s.failf("a verdict for chunk %d, which no reader has in flight", id)
	return nil
}

func (r *simReader) read() *chunker.Chunk {
	s := r.s
	pr := s.prog[r.tab]
	after, maxKey := pr.cursor, pr.maxKey
	if r.rng > 0 {
		after, maxKey = r.rngAfter, r.rngTo
	}
	if r.prev != 0 {
		after, maxKey = r.pipeAfter, r.pipeMax // read before the previous chunk's verdict
	}
	r.chunkMax = maxKey
	c := &chunker.Chunk{Table: simTableOf(s.schemaNow(r.tab)), After: after, Snapshot: s.snapshot()}
	if r.refresh {
		return c
	}
	if r.keys != nil {
		c.Done = true
		var ids []int
		for _, k := range r.keys {
			id := s.idOf(r.tab, k[0])
			if _, ok := s.vis[id]; ok {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		for _, id := range slices.Compact(ids) {
			c.Rows = append(c.Rows, s.row(id))
		}
		s.capChunk(c)
		return c
	}
	if len(maxKey) == 0 {
		s.failf("reader %d reads range %d with no upper bound (after %v, view %v, prog %+v, prev %d, keys %v)", r.n, r.rng, after, r.view, *pr, r.prev, r.keys)
	}
	keys := s.visible(r.tab)
	lo := -1
	if after != nil {
		lo = s.idOf(r.tab, after[0])
	}
	hi := s.idOf(r.tab, maxKey[0])
	for _, k := range keys {
		if k <= lo || k > hi {
			continue
		}
		if len(c.Rows) == s.limit {
			break
		}
		c.Rows = append(c.Rows, s.row(k))
	}
	c.Done = len(c.Rows) < s.limit
	s.capChunk(c)
	if n := len(c.Rows); n > 0 {
		c.Last = []string{string(c.Rows[n-1][0])}
	}
	return c
}

// capChunk stops a chunk early at random, as the byte bound does: the rows after the cut are
// not read, and a range chunk is not done.
func (s *sim) capChunk(c *chunker.Chunk) {
	if !s.opt.capped || len(c.Rows) < 2 || s.r.IntN(3) != 0 {
		return
	}
	c.Rows = c.Rows[:1+s.r.IntN(len(c.Rows)-1)]
	c.Capped, c.Done = true, false
	c.Last = []string{string(c.Rows[len(c.Rows)-1][0])}
}

// pending returns the keys the core waits to read again, of table tab.
func (s *sim) pending(tab int) [][]string { return s.core.tables[tabName(tab)].progress.Reread }

// anyPending reports whether rows of a table wait to be read again.
func (s *sim) anyPending() bool {
	for tab := range s.tabs {
		if len(s.pending(tab)) > 0 {
			return true
		}
	}
	return false
}

// visible returns the ids of table tab's rows visible to new snapshots, in order.
func (s *sim) visible(tab int) []int {
	keys := make([]int, 0, len(s.vis))
	for k := range s.vis {
		if s.tabOf(k) == tab {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// workerStep advances one of the simulated chunk readers by one step.
func (s *sim) workerStep() { s.anyReader().step() }

// anyReader draws a reader (with one reader, without drawing: a seed's history stays as it was).
func (s *sim) anyReader() *simReader {
	if len(s.readers) == 1 {
		return s.readers[0]
	}
	return s.readers[s.r.IntN(len(s.readers))]
}

// keyList draws the keys of another reader's key-list chunk: some of the rows to read again,
// and, until the random steps are over, keys drawn at random; nil when there is nothing to read.
func (r *simReader) keyList() [][]string {
	s := r.s
	var keys [][]string
	if p := s.pending(r.tab); len(p) > 0 && s.r.IntN(2) == 0 {
		i := s.r.IntN(len(p))
		keys = slices.Clone(p[i:min(len(p), i+3)])
	}
	if !s.tail && (keys == nil || s.r.IntN(2) == 0) {
		for range 1 + s.r.IntN(3) {
			id := s.r.IntN(s.nextKey + 10)
			if s.tabOf(id) != r.tab {
				id++ // the table's ids have one parity
			}
			keys = append(keys, []string{keyText(s.keyNum(id), 0)})
		}
	}
	return keys
}

// step advances the reader by one step.
func (r *simReader) step() {
	s := r.s
	if s.opt.hot && r.wstate >= 1 && r.wstate <= 4 && s.r.IntN(3) != 0 {
		return // a slow chunk: more transactions commit inside its window
	}
	switch r.wstate {
	case 0: // start a chunk
		if id := r.discardNext; id != 0 {
			// The window registered with a combined mark that failed: withdrawn.
			r.discardNext, r.wid, r.wstate, r.discarding = 0, id, 5, true
			s.feed(abandon{id: id, reason: errors.New("its low watermark's write failed")})
			return
		}
		r.keys, r.refresh = nil, false
		if !r.ranges {
			// Key lists only; a refresh is the range reader's.
			r.tab = s.anyTable()
			if s.core.tables[tabName(r.tab)].progress.Refresh {
				return
			}
			if r.keys = r.keyList(); r.keys == nil {
				return
			}
			r.wid = s.newID()
			s.feed(register{id: r.wid, table: tabName(r.tab)})
			r.wstate = 1
			return
		}
		p, pr := s.core.tables[tabName(r.tab)].progress, s.prog[r.tab]
		r.rng = 0
		if s.core.rereadGen > r.viewGen && s.r.IntN(2) == 0 {
			r.view, r.viewGen = slices.Clone(p.Ranges), s.core.rereadGen // a wakeup
		}
		if r.part == 1 {
			// The second range reader: only the key ranges of a split backfill that fall to it.
			if p.Refresh || !r.takeRange() {
				return
			}
			r.wid = s.newID()
			s.feed(register{id: r.wid, table: tabName(r.tab)})
			r.wstate = 1
			return
		}
		if pr.done && !p.Done && !p.Refresh && s.core.rereadGen > pr.gen {
			// Idle, and the table's backfill started again meanwhile (too many rows to read
			// again): the engine's wakeup gives the idle worker the table's progress, when the
			// re-reads changed since the progress it has (worker.update).
			pr.cursor, pr.done, pr.maxKey, pr.gen = p.Cursor, p.Done, p.MaxKey, s.core.rereadGen
			pr.started = pr.maxKey != nil
		}
		switch {
		case p.Refresh:
			r.refresh = true
		case len(s.pending(r.tab)) > 0:
			// Rows to read again go first, as in the worker.
			r.keys = slices.Clone(s.pending(r.tab)[:min(len(s.pending(r.tab)), 3)])
		case pr.done:
			// Idle: a probe now and then shows which commits are visible.
			if s.r.IntN(4) == 0 {
				s.feed(probe{snap: s.snapshot()})
			}
			return
		case !pr.started:
			pr.started = true
			keys := s.visible(r.tab)
			if len(keys) == 0 {
				pr.done = true
				s.feed(emptyTable{table: tabName(r.tab)})
				return
			}
			pr.maxKey = []string{strconv.Itoa(s.keyNum(slices.Max(keys)))}
		case s.opt.split && p.Ranges == nil && s.r.IntN(3) == 0:
			// Split the rest of the backfill, from this reader's view of it (the core refuses a
			// split computed on a progress that has moved on), at keys drawn between its cursor
			// and its bound, present or not.
			lo := -1
			if pr.cursor != nil {
				lo = s.idOf(r.tab, pr.cursor[0])
			}
			hi := s.idOf(r.tab, pr.maxKey[0])
			var points [][]string
			for id := lo + 1 + s.r.IntN(3); id < hi; id += 1 + s.r.IntN(max(1, (hi-lo)/2)) {
				if s.tabOf(id) == r.tab {
					points = append(points, []string{strconv.Itoa(s.keyNum(id))})
				}
			}
			if len(points) == 0 {
				break
			}
			r.wid, r.splitting, r.wstate = s.newID(), true, 5
			s.feed(split{id: r.wid, table: tabName(r.tab), from: pr.cursor, maxKey: pr.maxKey, points: points})
			return
		}
		if r.keys == nil && !r.refresh && p.Ranges != nil && !r.takeRange() {
			return // its ranges are done, or the other reader's are left
		}
		r.wid = s.newID()
		s.feed(register{id: r.wid, table: tabName(r.tab)})
		r.wstate = 1
	case 1: // low watermark; sometimes its write fails
		if s.r.IntN(20) == 0 {
			if s.r.IntN(2) == 0 { // it committed anyway
				s.markTxn(watermark.Mark{ID: r.wid, Kind: watermark.Low})
			}
			r.wstate = 5
			s.feed(abandon{id: r.wid, reason: fmt.Errorf("simulated failure")})
			return
		}
		s.markTxn(watermark.Mark{ID: r.wid, Kind: watermark.Low})
		r.wstate = 2
	case 2:
		r.chunk = r.read()
		var types []uint32
		for _, c := range r.chunk.Table.Columns {
			types = append(types, c.TypeOID)
		}
		s.chunkTypes[r.wid] = types
		s.tracef("reader %d reads chunk %d: %d rows, snapshot %+v, keys %v", r.n, r.wid, len(r.chunk.Rows), r.chunk.Snapshot, r.keys)
		r.wstate = 3
	case 3:
		s.feed(handover{id: r.wid, chunk: r.chunk, maxKey: r.chunkMax, keys: r.keys, refresh: r.refresh, rng: r.rng, to: r.rngTo})
		r.wstate = 4
	case 4: // high watermark, sometimes twice (an ambiguous commit retried)
		if r.prev != 0 {
			// Read before the previous chunk's verdict: the worker waits for it, and withdraws
			// this chunk when it does not continue the table's cursor; now and then it does not,
			// and the core's own check must refuse the chunk.
			if !r.prevCame {
				return
			}
			r.prev = 0
			if !r.prevOK && s.r.IntN(3) != 0 {
				r.wstate, r.discarding = 5, true
				s.feed(abandon{id: r.wid, reason: errors.New("the previous chunk did not complete")})
				return
			}
		}
		if r.keys == nil && !r.refresh && !r.chunk.Done && r.chunk.Last != nil && len(s.pending(r.tab)) == 0 && s.r.IntN(2) == 0 {
			// Pipelined (I22): this chunk's high watermark and the next one's low in one
			// transaction, and the next chunk read at once, from this one's last key.
			next := s.newID()
			s.feed(register{id: next, table: tabName(r.tab)})
			marks := []watermark.Mark{{ID: r.wid, Kind: watermark.High}, {ID: next, Kind: watermark.Low}}
			if s.r.IntN(20) == 0 {
				// The write fails; it may have committed all the same. This chunk is withdrawn,
				// then the next window.
				if s.r.IntN(2) == 0 {
					s.markTxn(marks...)
				}
				r.discardNext, r.wstate = next, 5
				s.feed(abandon{id: r.wid, reason: errors.New("simulated failure")})
				return
			}
			s.markTxn(marks...)
			if s.r.IntN(10) == 0 {
				s.markTxn(marks...)
			}
			r.prev, r.prevCame, r.prevOK = r.wid, false, false
			r.pipeAfter, r.pipeMax = r.chunk.Last, r.chunkMax
			r.wid, r.wstate = next, 2
			return
		}
		s.markTxn(watermark.Mark{ID: r.wid, Kind: watermark.High})
		if s.r.IntN(10) == 0 {
			s.markTxn(watermark.Mark{ID: r.wid, Kind: watermark.High})
		}
		r.wstate = 5
	case 5: // waiting for the verdict, which delivery produces
		if s.opt.waitProbes && s.r.IntN(4) == 0 {
			// The worker takes a snapshot now and then while it waits (worker.wait): it shows
			// commits visible that the chunk in flight's older snapshot did not see.
			s.feed(probe{snap: s.snapshot()})
		}
	}
}

func (r *simReader) verdict(v verdict) {
	s := r.s
	s.tracef("reader %d: verdict %d completed %v reason %v", r.n, v.id, v.completed, v.reason)
	if r.prev != 0 && v.id == r.prev && !r.prevCame {
		// The previous chunk's, while the next one is in flight (I22).
		r.prevCame = true
		r.progress(v)
		r.prevOK = v.completed && !v.progress.Refresh
		if r.rng > 0 {
			rs := v.progress.Ranges
			r.prevOK = r.prevOK && r.rng <= len(rs) && slices.Equal(rs[r.rng-1].Cursor, r.pipeAfter) && slices.Equal(rs[r.rng-1].To, r.rngTo)
		} else {
			r.prevOK = r.prevOK && v.progress.Ranges == nil && slices.Equal(v.progress.Cursor, r.pipeAfter)
		}
		return
	}
	if v.id != r.wid || r.wstate != 5 {
		s.failf("verdict for chunk %d in state %d while chunk %d is in flight", v.id, r.wstate, r.wid)
	}
	if r.splitting {
		// A split is no chunk: taken or refused, the progress is the core's.
		r.splitting, r.wstate = false, 0
		if v.completed {
			s.splits++
		}
		pr := s.prog[r.tab]
		pr.cursor, pr.done, pr.maxKey = v.progress.Cursor, v.progress.Done, v.progress.MaxKey
		pr.gen = max(pr.gen, v.gen)
		pr.started = pr.maxKey != nil || pr.done
		r.view, r.viewGen = slices.Clone(v.progress.Ranges), max(r.viewGen, v.gen)
		return
	}
	if r.discarding {
		// Withdrawn by the worker, which takes nothing from its verdict (worker.discard): no
		// failure of its own, and the progress stays as the verdict before it left it.
		r.discarding, r.wstate = false, 0
		return
	}
	r.progress(v)
	r.wstate = 0
	if !r.ranges {
		s.sideRows += v.emitted
	}
}

// takeRange sets the chunk to read next to the first key range of the split backfill p that
// falls to this reader and is not done, as its view has it; false when there is none.
func (r *simReader) takeRange() bool {
	for i, rg := range r.view {
		if !rg.Done && i%2 == r.part {
			r.rng, r.rngAfter, r.rngTo = i+1, rg.Cursor, rg.To
			return true
		}
	}
	return false
}

// progress takes the table's progress from a verdict, as the engine's worker does (a backfill
// started over, or a refresh, shows there), and counts the chunks that failed in a row. Only
// the range reader keeps the table's cursor.
func (r *simReader) progress(v verdict) {
	s := r.s
	if r.ranges {
		if v.gen >= r.viewGen {
			r.view, r.viewGen = slices.Clone(v.progress.Ranges), v.gen
		}
	}
	if r.ranges && r.part == 0 { // the second range reader keeps only its view of the ranges
		pr := s.prog[r.tab]
		pr.cursor, pr.done, pr.maxKey = v.progress.Cursor, v.progress.Done, v.progress.MaxKey
		pr.gen = max(pr.gen, v.gen)
		pr.started = pr.maxKey != nil || pr.done
	}
	switch {
	case v.completed:
		r.fails = 0
	default:
		r.fails++
		// While transactions go on, a table can keep starting its backfill over (rows to read
		// again pile up faster than they are read: a known limit, logged); once they stop, the
		// backfill must finish.
		if r.fails > 500 && (s.tail || !s.opt.capped) {
			s.failf("the backfill makes no progress: %v", v.reason)
		}
	}
}

// run runs the simulation for steps random steps, then until the backfill is done, the rows to
// read again are read and the stream drained, and checks the replay. It returns the first broken
// invariant.
func (s *sim) run(steps int) (err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(simFailure)
			if !ok {
				panic(r)
			}
			err = errors.New(f.msg)
		}
	}()
	for i := 0; i < steps || !s.allDone() || s.busy() || s.next < len(s.log) || len(s.hung) > 0 || s.anyPending(); i++ {
		s.tail = i >= steps
		if i > steps+50000 {
			s.failf("the simulation does not finish (done %v, busy %v, %d to deliver, %d hung, rows to read again %v)",
				s.allDone(), s.busy(), len(s.log)-s.next, len(s.hung), s.anyPending())
		}
		// With restarts, hung transactions stay hung longer, and a restart is likelier while one
		// the last checkpoint covers is still invisible: the case the next run's guard is for.
		restarts, visible := 1, 17
		if s.opt.restarts {
			visible = 8
			if s.hungBehindCheckpoint() {
				restarts = 10
			}
		}
		switch n := s.r.IntN(100); {
		case n < 30 && i < steps:
			s.appTxn()
		case n < 32 && i < steps && s.opt.ddl:
			s.ddlTxn()
		case n == 32 && i < steps && s.opt.truncates && s.r.IntN(2) == 0:
			s.truncTxn()
		case n >= 32 && n < 32+restarts && i < steps && s.opt.restarts:
			s.restart()
		case n >= 32+restarts && n < 32+restarts+visible && len(s.hung) > 0:
			j := s.r.IntN(len(s.hung))
			s.makeVisible(s.hung[j])
			s.hung = slices.Delete(s.hung, j, j+1)
		case n >= 50 && n < 75 && s.next < len(s.log):
			s.deliver()
		case n >= 50 && n < 55 && s.opt.keepalives && s.next == len(s.log):
			// Idle: the server's position is past the last commit.
			s.feed(&replicator.Keepalive{WALEnd: s.lsn()})
			if s.core.consistent() && s.r.IntN(2) == 0 {
				s.checkpoint()
			}
		case n == 75 && i < steps && s.opt.refreshes && s.r.IntN(4) == 0:
			// A re-backfill asked for while the capture runs (Engine.Rebackfill), between two
			// inputs, wherever the stream and the worker are.
			name := tabName(s.anyTable())
			ask := rebackfillAsk{ctx: context.Background(), tables: []string{name}, done: make(chan error, 1)}
			s.tracef("REBACKFILL asked while running")
			s.feed(ask)
			s.awaitRefresh[name] = true
			select {
			case err := <-ask.done: // refused (the request is answered once a checkpoint carries it)
				s.must(err)
			default:
			}
		default:
			s.workerStep()
		}
	}
	// Replay equals the final table, TOASTed values included (I1).
	for id, row := range s.table {
		k := s.key(id)
		got, ok := s.replay[k]
		if !ok || got.ver != row.ver || got.big != row.big || got.big2 != row.big2 {
			s.failf("I1: key %d is %+v in the table and %+v (present: %v) in the replay", id, row, got, ok)
		}
	}
	if len(s.table) != len(s.replay) {
		s.failf("I1: the replay has %d rows, the table %d", len(s.replay), len(s.table))
	}
	for tab := range s.tabs {
		if !s.core.pos.Tables[tabName(tab)].Done {
			s.failf("the backfill of %s is not done", tabName(tab))
		}
	}
	return nil
}

// TestCoreAgainstModel: random interleavings of chunk reads and transactions (inserts,
// updates, deletes, key changes, key changes that only change the key's text, repeated keys,
// updates that leave a TOASTed value unchanged, transactions started before a window and
// committed inside or after it, transactions that stream before they are visible, failed and
// repeated watermarks), with schema changes (a column added and dropped, renames, replica
// identity flips) and restarts from the last checkpoint while transactions are hung, in both
// sink profiles: the replay equals the final table, and no key goes back to an older version.
func TestCoreAgainstModel(t *testing.T) {
	for seed := range uint64(400) {
		opt := simOptions{ddl: seed%2 == 0, restarts: seed%3 != 0, rereadPartial: seed%4 == 1, hot: seed%5 == 2, refreshes: seed%7 == 3, capped: seed%3 == 1,
			truncates: seed%4 == 3, keepalives: seed%2 == 1}
		require.NoError(t, newSim(seed, opt).run(300), "seed %d, %+v", seed, opt)
	}
	// Snapshots taken while a chunk waits for its verdict (the worker's probes), after restarts
	// that hand transactions still invisible to the next run: a newer snapshot showing one
	// visible must not let the chunk in flight, whose older snapshot missed it, through.
	for seed := uint64(2000); seed < 3000; seed++ {
		opt := simOptions{restarts: true, waitProbes: true, hot: seed%2 == 0, readers: int(seed % 3), ddl: seed%5 == 0}
		require.NoError(t, newSim(seed, opt).run(300), "seed %d, %+v", seed, opt)
	}
	for seed := uint64(1000); seed < 1040; seed++ {
		opt := simOptions{ddl: true, restarts: true, rereadPartial: seed%2 == 0, refreshes: seed%3 == 0, truncates: seed%5 == 0, keepalives: seed%2 == 1}
		require.NoError(t, newSim(seed, opt).run(3000), "seed %d, %+v", seed, opt)
	}
}

// TestCoreModelRereadRaces: the races around rows read again whole (a TOASTed value a change did
// not carry), made frequent: most operations hit the keys of the window or re-read in flight,
// keys of a key-list window are deleted before its SELECT and re-created (inserted, moved onto,
// updated without their TOASTed value) after it, while the chunk is slow.
func TestCoreModelRereadRaces(t *testing.T) {
	for seed := range uint64(1000) {
		for _, opt := range []simOptions{{hot: true, rereadPartial: true}, {hot: true}, {rereadPartial: true, capped: true}} {
			require.NoError(t, newSim(seed, opt).run(300), "seed %d, %+v", seed, opt)
		}
	}
}

// TestCoreModelConcurrentWindows: several windows of the table open at once (I23): key-list
// readers beside the range reader, reading rows to read again and keys drawn at random (present,
// deleted, never inserted) while range chunks are in flight, under every other option of the
// model. The oracle is unchanged: the output replays to the table (I1), a key never goes back
// (I2), positions increase (I13).
func TestCoreModelConcurrentWindows(t *testing.T) {
	overlaps, crossed, same, sideRows := 0, 0, 0, 0
	run := func(seed uint64, opt simOptions) {
		s := newSim(seed, opt)
		require.NoError(t, s.run(300), "seed %d, %+v", seed, opt)
		overlaps, crossed, same, sideRows = overlaps+s.overlaps, crossed+s.crossed, same+s.same, sideRows+s.sideRows
	}
	for seed := range uint64(600) {
		run(seed, simOptions{readers: 2 + int(seed%2), ddl: seed%2 == 0, restarts: seed%3 != 0, rereadPartial: seed%4 == 1, hot: seed%5 == 2,
			refreshes: seed%7 == 3, capped: seed%3 == 1, truncates: seed%4 == 3, keepalives: seed%2 == 1})
	}
	for seed := range uint64(300) {
		run(seed, simOptions{readers: 3, hot: true, rereadPartial: seed%2 == 0, capped: seed%3 == 0})
	}
	// Two tables, each with its range reader, and key-list readers over both.
	for seed := range uint64(600) {
		run(seed, simOptions{tables: 2, readers: 1 + int(seed%3), ddl: seed%2 == 0, restarts: seed%3 != 0, rereadPartial: seed%4 == 1, hot: seed%5 == 2,
			refreshes: seed%7 == 3, capped: seed%3 == 1, truncates: seed%4 == 3, keepalives: seed%2 == 1})
	}
	// Backfills split into key ranges, a second range reader per table (I23): windows of two
	// ranges of one table open at once.
	ranged, splits := 0, 0
	for seed := range uint64(600) {
		s := newSim(seed, simOptions{split: true, waitProbes: seed%2 == 1, tables: 1 + int(seed%2), readers: int(seed % 3), ddl: seed%2 == 0, restarts: seed%3 != 0, rereadPartial: seed%4 == 1,
			hot: seed%5 == 2, refreshes: seed%7 == 3, capped: seed%3 == 1, truncates: seed%4 == 3, keepalives: seed%2 == 1})
		require.NoError(t, s.run(300), "seed %d, split", seed)
		ranged, splits = ranged+s.ranged, splits+s.splits
	}
	require.Greater(t, splits, 300)
	require.Greater(t, ranged, 3000, "windows of two key ranges of one table")
	// The windows did overlap, of both tables too, and the key-list readers' rows went out.
	require.Greater(t, overlaps, 10000)
	require.Greater(t, crossed, 10000)
	require.Greater(t, same, 10000, "two windows of one table")
	require.Greater(t, sideRows, 1000)
	t.Logf("%d inputs with two or more windows open (%d with windows of both tables, %d with two of one), %d rows from the key-list readers; %d splits, %d inputs with windows of two key ranges of one table open",
		overlaps, crossed, same, sideRows, splits, ranged)
}

// TestCoreModelCatchesBrokenEngines: the model sees the bugs it exists for.
func TestCoreModelCatchesBrokenEngines(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  simOptions
	}{
		{"no visibility guard", simOptions{noGuard: true}},
		{"no eviction", simOptions{noEviction: true}},
		{"no visibility guard, concurrent windows", simOptions{noGuard: true, readers: 2}},
		{"no eviction, concurrent windows", simOptions{noEviction: true, readers: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caught := 0
			for seed := range uint64(500) {
				if newSim(seed, tc.opt).run(300) != nil {
					caught++
				}
			}
			require.Positive(t, caught, "the broken engine passed every seed")
			t.Logf("caught in %d of 500 seeds", caught)
		})
	}
}

// FuzzWindow drives the model with the fuzzer's choice of seed, length and options.
func FuzzWindow(f *testing.F) {
	f.Add(uint64(1), uint16(100), uint8(0))
	f.Add(uint64(7), uint16(1000), uint8(7))
	f.Fuzz(func(t *testing.T, seed uint64, steps uint16, flags uint8) {
		opt := simOptions{ddl: flags&1 != 0, restarts: flags&2 != 0, rereadPartial: flags&4 != 0}
		if err := newSim(seed, opt).run(int(steps % 2000)); err != nil {
			t.Fatalf("seed %d, %d steps, %+v: %v", seed, steps, opt, err)
		}
	})
}

// hot returns the keys the chunk in flight and the pending re-reads are about.
func (s *sim) hot() []int {
	var ids []int
	for tab := range s.tabs {
		for _, k := range s.pending(tab) {
			ids = append(ids, s.idOf(tab, k[0]))
		}
	}
	for _, r := range s.readers {
		for _, k := range r.keys {
			ids = append(ids, s.idOf(r.tab, k[0]))
		}
		if r.chunk != nil && r.wstate >= 3 {
			for _, row := range r.chunk.Rows {
				ids = append(ids, s.idOf(r.tab, string(row[0])))
			}
		}
	}
	return ids
}

// allDone reports whether the range readers saw their tables' backfills done.
func (s *sim) allDone() bool {
	for tab, pr := range s.prog {
		// A split backfill's last range may be the second reader's: the first one's view of the
		// table is not the one that says it is done.
		if !pr.done && !(s.opt.split && s.core.tables[tabName(tab)].progress.Done) {
			return false
		}
	}
	return true
}

// hungBehindCheckpoint reports whether a hung transaction committed before the last checkpoint.
func (s *sim) hungBehindCheckpoint() bool {
	if s.last == nil {
		return false
	}
	for _, tx := range s.hung {
		if tx.commit < s.last.pos.LSN {
			return true
		}
	}
	return false
}
