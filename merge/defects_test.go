package merge

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/watermark"
)

// The tests of this file drive the core by hand, one defect each: the inputs a real run would
// give it, in the order that broke it.

var (
	// toastTable is t(id int4 primary key, big text), as the chunker discovers it.
	toastTable = &chunker.Table{Schema: "public", Name: "t", OID: 16384, KeySource: "primary key", ReplicaIdentity: 'd',
		Columns: []chunker.Column{{Name: "id", TypeOID: 23, BaseOID: 23, TypeMod: -1}, {Name: "big", TypeOID: 25, BaseOID: 25, TypeMod: -1}},
		Key:     []int{0}}
	toastRel = &replicator.Relation{ID: 16384, Schema: "public", Table: "t", ReplicaIdentity: replicator.IdentityDefault,
		Columns: []replicator.Column{{Name: "id", TypeOID: 23, TypeMod: -1, Key: true}, {Name: "big", TypeOID: 25, TypeMod: -1}}}
	unchanged = replicator.Value{Kind: replicator.Unchanged}
	null      = replicator.Value{Kind: replicator.Null}
)

// coreRun feeds a core and collects its output.
type coreRun struct {
	t        *testing.T
	c        *core
	lsn      pglogrepl.LSN
	xid      uint32
	out      []Event
	verdicts []verdict
}

func newCoreRun(t *testing.T, progress map[string]*TableProgress, tables ...*chunker.Table) *coreRun {
	pos := &Position{Version: PositionVersion, Tables: map[string]*TableProgress{}}
	byName := map[string]*chunker.Table{}
	for _, tb := range tables {
		p := progress[tb.String()]
		if p == nil {
			p = &TableProgress{Key: tb.KeyNames()}
		}
		pos.Tables[tb.String()] = p
		byName[tb.String()] = tb
	}
	r := &coreRun{t: t, c: newCore(simMarks, pos, byName), lsn: 0x1000000, xid: 500}
	require.NoError(t, r.step(simSignal))
	return r
}

func (r *coreRun) step(in any) error {
	err := r.c.step(in)
	r.out = append(r.out, r.c.out...)
	r.c.out = r.c.out[:0]
	r.verdicts = append(r.verdicts, r.c.verdicts...)
	r.c.verdicts = r.c.verdicts[:0]
	return err
}

func (r *coreRun) must(in any) {
	r.t.Helper()
	require.NoError(r.t, r.step(in))
}

// txn delivers one transaction of changes; it returns the first error.
func (r *coreRun) txn(changes ...*replicator.Change) error {
	r.lsn += 0x100
	r.xid++
	if err := r.step(&replicator.Begin{FinalLSN: r.lsn, XID: r.xid}); err != nil {
		return err
	}
	for _, ch := range changes {
		ch.XID = r.xid
		if err := r.step(ch); err != nil {
			return err
		}
	}
	return r.step(&replicator.Commit{LSN: r.lsn, EndLSN: r.lsn + 1, XID: r.xid})
}

func (r *coreRun) mustTxn(changes ...*replicator.Change) {
	r.t.Helper()
	require.NoError(r.t, r.txn(changes...))
}

// mark delivers a watermark's transaction.
func (r *coreRun) mark(id int64, kind watermark.Kind) {
	r.t.Helper()
	r.mustTxn(&replicator.Change{Op: replicator.Update, Rel: simSignal, New: replicator.Tuple{
		text("s"), text("run1"), text(strconv.FormatInt(id, 10)), text(string(rune(kind))), text("2026-01-01 00:00:00+00")}})
}

// window runs a whole window of chunk id: register, L, the changes of during (between L and the
// hand-over), the hand-over of rows, the changes of after, H.
func (r *coreRun) window(id int64, tb *chunker.Table, keys [][]string, rows []chunker.Row, during, after func()) {
	r.t.Helper()
	r.must(register{id: id, table: tb.String()})
	r.mark(id, watermark.Low)
	if during != nil {
		during()
	}
	c := &chunker.Chunk{Table: tb, Rows: rows, Done: true, Snapshot: chunker.Snapshot{Xmin: uint64(r.xid + 1), Xmax: uint64(r.xid + 1)}}
	if n := len(rows); n > 0 {
		c.Last = keyStrings(rows[n-1], tb.Key)
	}
	r.must(handover{id: id, chunk: c, maxKey: []string{"1000"}, keys: keys})
	if after != nil {
		after()
	}
	r.mark(id, watermark.High)
}

func ins(rel *replicator.Relation, vals ...replicator.Value) *replicator.Change {
	return &replicator.Change{Op: replicator.Insert, Rel: rel, New: vals}
}

func upd(rel *replicator.Relation, old replicator.Tuple, vals ...replicator.Value) *replicator.Change {
	ch := &replicator.Change{Op: replicator.Update, Rel: rel, New: vals}
	if old != nil {
		ch.OldKind, ch.Old = replicator.OldKey, old
	}
	return ch
}

func del(rel *replicator.Relation, old ...replicator.Value) *replicator.Change {
	return &replicator.Change{Op: replicator.Delete, Rel: rel, OldKind: replicator.OldKey, Old: old}
}

// TestRereadSurvivesKeyRecreatedInItsWindow: a key waiting to be read again whole is re-created
// inside its own key-list window after the window's SELECT (an insert, then an update that leaves
// the TOASTed value out; or a key change onto it). The window's SELECT did not see the row, so
// its high watermark must leave the key pending: the Airbyte profile withheld the update, and the
// CLI emitted the moved row without its TOASTed value.
func TestRereadSurvivesKeyRecreatedInItsWindow(t *testing.T) {
	pending := map[string]*TableProgress{"public.t": {Done: true, Key: []string{"id"}, Reread: [][]string{{"5"}}}}
	t.Run("insert then partial update, whole rows only", func(t *testing.T) {
		r := newCoreRun(t, pending, toastTable)
		r.c.rereadPartial = true
		r.must(toastRel)
		r.window(1, toastTable, [][]string{{"5"}}, nil, nil, func() {
			r.mustTxn(ins(toastRel, text("5"), text("whole")))
			r.mustTxn(upd(toastRel, nil, text("5"), unchanged))
		})
		require.Equal(t, [][]string{{"5"}}, r.c.tables["public.t"].progress.Reread, "the withheld update's row is still to be read")
	})
	t.Run("key moved onto it", func(t *testing.T) {
		r := newCoreRun(t, pending, toastTable)
		r.must(toastRel)
		r.window(1, toastTable, [][]string{{"5"}}, nil, nil, func() {
			r.mustTxn(upd(toastRel, replicator.Tuple{text("3"), null}, text("5"), unchanged))
		})
		require.Equal(t, [][]string{{"5"}}, r.c.tables["public.t"].progress.Reread, "the moved row lacks its TOASTed value in the output")
	})
}

// TestPartialFlagWhenOldAndNewKeysAreEqual: a key update that only rewrites the key's text
// (numeric 1.0 to 1.00: equal keys) and leaves a TOASTed value out is a partial change of that
// key; evicting the old key afterwards must not clear the flag, or the chunk row that held the
// only whole copy is dropped without being read again. The window's only change of the key left
// the value out, so the row goes out whole at the high watermark: the change's key text, the
// chunk's TOASTed value.
func TestPartialFlagWhenOldAndNewKeysAreEqual(t *testing.T) {
	num := &chunker.Table{Schema: "public", Name: "n", OID: 16390, KeySource: "primary key", ReplicaIdentity: 'd',
		Columns: []chunker.Column{{Name: "k", TypeOID: 1700, BaseOID: 1700, TypeMod: -1}, {Name: "big", TypeOID: 25, BaseOID: 25, TypeMod: -1}},
		Key:     []int{0}}
	rel := &replicator.Relation{ID: 16390, Schema: "public", Table: "n", ReplicaIdentity: replicator.IdentityDefault,
		Columns: []replicator.Column{{Name: "k", TypeOID: 1700, TypeMod: -1, Key: true}, {Name: "big", TypeOID: 25, TypeMod: -1}}}
	r := newCoreRun(t, nil, num)
	r.must(rel)
	r.window(1, num, nil, []chunker.Row{{[]byte("1.0"), []byte("whole")}}, nil, func() {
		r.mustTxn(upd(rel, replicator.Tuple{text("1.0"), null}, text("1.00"), unchanged))
	})
	require.Len(t, r.verdicts, 1)
	require.True(t, r.verdicts[0].completed)
	require.Empty(t, r.c.tables["public.n"].progress.Reread, "nothing to read again")
	var whole []string
	for _, ev := range r.out {
		if ev.Op == Snapshot {
			whole = append(whole, string(ev.Col(0).Data)+"/"+string(ev.Col(1).Data))
		}
	}
	require.Equal(t, []string{"1.00/whole"}, whole, "the evicted row goes out whole, after the change")
}

// TestWholeRowOnlyFromValuesTheWindowKept: a row changed inside its window only by updates that
// left its TOASTed value out goes out whole at the high watermark; one whose value an update
// inside the window set, before an update that left it out, is read again instead (the chunk's
// copy may be older than that update); so is one whose change was a delete and an insert.
func TestWholeRowOnlyFromValuesTheWindowKept(t *testing.T) {
	rows := []chunker.Row{{[]byte("1"), []byte("chunk1")}, {[]byte("2"), []byte("chunk2")}, {[]byte("3"), []byte("chunk3")}}
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	r.window(1, toastTable, nil, rows, nil, func() {
		r.mustTxn(upd(toastRel, nil, text("1"), unchanged))
		r.mustTxn(upd(toastRel, nil, text("1"), unchanged))
		r.mustTxn(upd(toastRel, nil, text("2"), text("set")))
		r.mustTxn(upd(toastRel, nil, text("2"), unchanged))
		r.mustTxn(del(toastRel, text("3"), null))
		r.mustTxn(ins(toastRel, text("3"), text("again")))
		r.mustTxn(upd(toastRel, nil, text("3"), unchanged))
	})
	require.Len(t, r.verdicts, 1)
	require.True(t, r.verdicts[0].completed)
	var whole []string
	for _, ev := range r.out {
		if ev.Op == Snapshot {
			whole = append(whole, string(ev.Col(0).Data)+"/"+string(ev.Col(1).Data))
		}
	}
	require.Equal(t, []string{"1/chunk1"}, whole)
	require.Equal(t, [][]string{{"2"}, {"3"}}, r.c.tables["public.t"].progress.Reread)

	// Two TOASTed columns: an update that sets a and leaves b out, then one that leaves both
	// out; a is not the chunk's any more.
	two := &chunker.Table{Schema: "public", Name: "two", OID: 16391, KeySource: "primary key", ReplicaIdentity: 'd',
		Columns: []chunker.Column{{Name: "id", TypeOID: 23, BaseOID: 23, TypeMod: -1}, {Name: "a", TypeOID: 25, BaseOID: 25, TypeMod: -1}, {Name: "b", TypeOID: 25, BaseOID: 25, TypeMod: -1}},
		Key:     []int{0}}
	rel := &replicator.Relation{ID: 16391, Schema: "public", Table: "two", ReplicaIdentity: replicator.IdentityDefault,
		Columns: []replicator.Column{{Name: "id", TypeOID: 23, TypeMod: -1, Key: true}, {Name: "a", TypeOID: 25, TypeMod: -1}, {Name: "b", TypeOID: 25, TypeMod: -1}}}
	r = newCoreRun(t, nil, two)
	r.must(rel)
	r.window(1, two, nil, []chunker.Row{{[]byte("1"), []byte("a1"), []byte("b1")}, {[]byte("2"), []byte("a2"), []byte("b2")}}, nil, func() {
		r.mustTxn(upd(rel, nil, text("1"), unchanged, unchanged))
		r.mustTxn(upd(rel, nil, text("1"), text("new"), unchanged))
		r.mustTxn(upd(rel, nil, text("1"), unchanged, unchanged))
		r.mustTxn(upd(rel, nil, text("2"), unchanged, unchanged))
		r.mustTxn(upd(rel, nil, text("2"), text("new"), unchanged))
	})
	whole = nil
	for _, ev := range r.out {
		if ev.Op == Snapshot {
			whole = append(whole, string(ev.Col(0).Data)+"/"+string(ev.Col(1).Data)+"/"+string(ev.Col(2).Data))
		}
	}
	require.Equal(t, []string{"2/new/b2"}, whole, "the last change's a, the chunk's b")
	require.Equal(t, [][]string{{"1"}}, r.c.tables["public.two"].progress.Reread)
}

// TestNullKeyIsNotPlaced: a change whose key column arrives NULL (the table's replica identity
// now uses another index, a redefined primary key, a partition with another identity) cannot be
// placed: the core stops with an error naming the table instead of emitting a key it cannot build.
func TestNullKeyIsNotPlaced(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	r.mustTxn(ins(toastRel, text("1"), text("x")))
	err := r.txn(del(toastRel, null, null))
	require.ErrorIs(t, err, ErrUnplaceable)
	require.ErrorContains(t, err, "public.t")
	for _, ev := range r.out {
		require.NotEqual(t, Delete, ev.Op, "no delete with an empty key")
	}
}

// TestReplicaIdentityWithoutTheKey: a Relation whose replica identity no longer carries the key
// columns (REPLICA IDENTITY USING INDEX on another index) makes updates and deletes of the table
// unplaceable: an update could move the key without saying so. Inserts still go through.
func TestReplicaIdentityWithoutTheKey(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	other := &replicator.Relation{ID: 16384, Schema: "public", Table: "t", ReplicaIdentity: replicator.IdentityIndex,
		Columns: []replicator.Column{{Name: "id", TypeOID: 23, TypeMod: -1}, {Name: "big", TypeOID: 25, TypeMod: -1, Key: true}}}
	r.must(other)
	r.mustTxn(ins(other, text("1"), text("x")))
	err := r.txn(upd(other, nil, text("1"), text("y")))
	require.ErrorIs(t, err, ErrUnplaceable)
	require.ErrorContains(t, err, "REPLICA IDENTITY")
	// Restored: placeable again.
	r2 := newCoreRun(t, nil, toastTable)
	r2.must(other)
	r2.must(toastRel)
	r2.mustTxn(upd(toastRel, nil, text("1"), text("y")))
}

// TestRenamedTableIsFollowed: after ALTER TABLE ... RENAME (or SET SCHEMA) the stream names the
// table differently; the core follows it by OID and keeps its output under the configured name.
// A table that took the configured name (another OID) stops the capture.
func TestRenamedTableIsFollowed(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	renamed := &replicator.Relation{ID: 16384, Schema: "archive", Table: "t_old", ReplicaIdentity: replicator.IdentityDefault, Columns: toastRel.Columns}
	r.must(renamed)
	r.mustTxn(ins(renamed, text("7"), text("x")))
	require.Len(t, r.out, 1, "the renamed table's change is emitted")
	require.Equal(t, "public", r.out[0].Columns.Schema)
	require.Equal(t, "t", r.out[0].Columns.Table)

	impostor := &replicator.Relation{ID: 20000, Schema: "public", Table: "t", ReplicaIdentity: replicator.IdentityDefault, Columns: toastRel.Columns}
	err := r.step(impostor)
	require.ErrorIs(t, err, ErrUnplaceable)
	require.ErrorContains(t, err, "OID")
}

// TestQuietColumnChangeDuringBackfill: a column added while the table is quiet changes what the
// chunks read, but the stream says nothing until the table's next change. The chunk read the
// newer definition, so it completes with its own columns instead of being abandoned forever.
func TestQuietColumnChangeDuringBackfill(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	r.mustTxn(ins(toastRel, text("900"), text("x"))) // the stream's last description: (id, big)
	wider := &chunker.Table{Schema: "public", Name: "t", OID: 16384, KeySource: "primary key", ReplicaIdentity: 'd',
		Columns: append(append([]chunker.Column{}, toastTable.Columns...), chunker.Column{Name: "c", TypeOID: 23, BaseOID: 23, TypeMod: -1}),
		Key:     []int{0}}
	r.out = nil
	r.window(1, wider, nil, []chunker.Row{{[]byte("1"), []byte("a"), []byte("0")}}, nil, nil)
	require.Len(t, r.verdicts, 1)
	require.True(t, r.verdicts[0].completed, "abandoned: %v", r.verdicts[0].reason)
	require.Len(t, r.out, 1)
	require.Equal(t, []string{"id", "big", "c"}, r.out[0].Columns.Names)
}

// TestWakeOnEveryRereadChange: the idle worker is told about pending re-reads whenever they
// change, not only when their total count does (one table's re-read done, another's queued).
func TestWakeOnEveryRereadChange(t *testing.T) {
	other := &chunker.Table{Schema: "public", Name: "u", OID: 16400, KeySource: "primary key", ReplicaIdentity: 'd',
		Columns: toastTable.Columns, Key: []int{0}}
	r := newCoreRun(t, nil, toastTable, other)
	// Two readers (I23): each is told, whichever table is its own.
	m := &mergeLoop{core: r.c, wake: []chan wakeup{make(chan wakeup, 1), make(chan wakeup, 1)}}
	m.wakeWorker()
	for _, wake := range m.wake {
		require.Empty(t, wake, "nothing to tell: the worker starts from the position's re-reads")
	}
	r.c.tables["public.t"].progress.Reread = [][]string{{"1"}}
	r.c.rereadsChanged()
	m.wakeWorker()
	for _, wake := range m.wake {
		require.Equal(t, [][]string{{"1"}}, (<-wake).tables["public.t"].Reread)
	}
	r.c.tables["public.t"].progress.Reread = nil
	r.c.tables["public.u"].progress.Reread = [][]string{{"2"}}
	r.c.rereadsChanged()
	m.wakeWorker()
	for i, wake := range m.wake {
		select {
		case got := <-wake:
			require.Equal(t, [][]string{{"2"}}, got.tables["public.u"].Reread)
		default:
			t.Fatalf("reader %d was not woken for public.u's re-read", i)
		}
	}
}

// TestReaderIDs: the chunk ids of several readers are unique across them (a repeated id would
// replace another reader's window in the core), and the merge loop routes each verdict back to
// the reader that numbered it.
func TestReaderIDs(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		m := &mergeLoop{verdicts: make([]chan verdict, n)}
		seen := map[int64]int{}
		for k := range n {
			w := &worker{index: k, readers: n, nextID: int64(k + 1 - n)}
			for range 50 {
				id := w.newID()
				require.Positive(t, id)
				_, dup := seen[id]
				require.False(t, dup, "id %d numbered twice", id)
				seen[id] = k
				require.Equal(t, k, m.readerOf(id), "the verdict of chunk %d goes to reader %d", id, k)
			}
		}
	}
}

// TestGuardSeededAtStart: a transaction that committed before the position a run resumes from
// was emitted by an earlier run, so this run's stream never shows it; if it is still invisible
// (a synchronous standby that does not answer), a chunk's snapshot misses it. The guard is seeded
// with the transactions that were committed but invisible at start, and rejects such a chunk.
func TestGuardSeededAtStart(t *testing.T) {
	var g guard
	g.max = 1 << 20
	g.seed([]uint32{700})
	low := pglogrepl.LSN(0x5000)
	violated := func(s chunker.Snapshot) bool {
		bad, _ := g.violated(s, low)
		if !bad {
			g.observe(s) // as the core does at the hand-over
		}
		return bad
	}
	require.True(t, violated(chunker.Snapshot{Xmin: 650, Xmax: 800, Xip: []uint64{650, 700}}), "700 is still invisible")
	require.True(t, violated(chunker.Snapshot{Xmin: 650, Xmax: 690}), "700 is at or above xmax")
	require.False(t, violated(chunker.Snapshot{Xmin: 650, Xmax: 800, Xip: []uint64{650}}), "700 is visible now")
	require.False(t, violated(chunker.Snapshot{Xmin: 701, Xmax: 701}))
}

// TestGuardHandsInvisibleCommitsOn: the commits the stream showed that no snapshot has shown
// visible yet are what a checkpoint hands to the next run; a snapshot that shows one visible
// takes it off.
func TestGuardHandsInvisibleCommitsOn(t *testing.T) {
	var g guard
	g.max = 1 << 20
	g.commit(700, 0x100)
	g.commit(701, 0x200)
	g.commit(702, 0x300)
	require.Equal(t, XIDs{700, 701, 702}, *g.invisible())
	g.observe(chunker.Snapshot{Xmin: 700, Xmax: 703, Xip: []uint64{700}})
	require.Equal(t, XIDs{700}, *g.invisible(), "701 and 702 are visible")
	g.seed([]uint32{650})
	require.Equal(t, XIDs{650, 700}, *g.invisible())
	g.observe(chunker.Snapshot{Xmin: 701, Xmax: 703})
	require.Empty(t, *g.invisible())
}

// TestXIDsJSON: the set encodes as ranges and back.
func TestXIDsJSON(t *testing.T) {
	in := XIDs{5, 6, 7, 9, 4294967295}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	require.JSONEq(t, `"5-7,9,4294967295"`, string(b))
	var out XIDs
	require.NoError(t, json.Unmarshal(b, &out))
	require.Equal(t, in, out)
	require.NoError(t, json.Unmarshal([]byte(`""`), &out))
	require.Empty(t, out)
	require.Error(t, json.Unmarshal([]byte(`"9-5"`), &out))
}

// TestBackfillRestartBeatsChunkInFlight: a table whose rows to read again pass maxRereads starts
// its backfill over; a range chunk registered before that (its low watermark not yet streamed,
// or read from the worker's older progress) must not complete into the reset progress, which
// would move the cursor past rows whose updates were dropped with the list. Found by an
// adversarial review.
func TestBackfillRestartBeatsChunkInFlight(t *testing.T) {
	prog := map[string]*TableProgress{"public.t": {Key: []string{"id"}, Cursor: []string{"100"}, MaxKey: []string{"500000"}}}
	r := newCoreRun(t, prog, toastTable)
	r.c.rereadPartial = true
	r.must(toastRel)
	r.must(register{id: 7, table: "public.t"})
	var chs []*replicator.Change
	for k := 1; k <= maxRereads+1; k++ {
		chs = append(chs, upd(toastRel, nil, text(strconv.Itoa(k)), unchanged))
	}
	r.mustTxn(chs...)
	require.Nil(t, r.c.tables["public.t"].progress.Cursor, "the backfill starts over")
	r.mark(7, watermark.Low)
	var rows []chunker.Row
	for k := 101; k <= 110; k++ {
		rows = append(rows, chunker.Row{[]byte(strconv.Itoa(k)), []byte("whole")})
	}
	c := &chunker.Chunk{Table: toastTable, After: []string{"100"}, Rows: rows, Last: []string{"110"}, Snapshot: chunker.Snapshot{Xmin: uint64(r.xid + 1), Xmax: uint64(r.xid + 1)}}
	r.must(handover{id: 7, chunk: c, maxKey: []string{"500000"}})
	r.mark(7, watermark.High)
	require.Len(t, r.verdicts, 1)
	require.False(t, r.verdicts[0].completed)
	require.Nil(t, r.c.tables["public.t"].progress.Cursor, "the cursor stays at the start")
}

// TestCappedKeyListKeepsUnreadKeys: a key-list chunk that stops at the byte bound read only
// some of its keys; the others stay to be read, or their withheld updates are lost. Found by an
// adversarial review.
func TestCappedKeyListKeepsUnreadKeys(t *testing.T) {
	pending := map[string]*TableProgress{"public.t": {Done: true, Key: []string{"id"}, Reread: [][]string{{"1"}, {"2"}, {"3"}}}}
	r := newCoreRun(t, pending, toastTable)
	r.c.rereadPartial = true
	r.must(toastRel)
	r.must(register{id: 1, table: "public.t"})
	r.mark(1, watermark.Low)
	c := &chunker.Chunk{Table: toastTable, Done: true, Capped: true, Rows: []chunker.Row{{[]byte("1"), []byte("whole")}}, Last: []string{"1"},
		Snapshot: chunker.Snapshot{Xmin: uint64(r.xid + 1), Xmax: uint64(r.xid + 1)}}
	r.must(handover{id: 1, chunk: c, keys: [][]string{{"1"}, {"2"}, {"3"}}})
	r.mark(1, watermark.High)
	require.Len(t, r.verdicts, 1)
	require.True(t, r.verdicts[0].completed)
	require.ElementsMatch(t, [][]string{{"2"}, {"3"}}, r.c.tables["public.t"].progress.Reread)
}

// TestGuardThresholdFollowsProbes: the idle worker's snapshots move the guard's prune threshold
// as the chunks' do. Left at the last chunk's xmin while no chunk ran, the threshold was 2^31
// transactions behind after long enough, and every recent commit looked older than it: one that a
// later chunk's snapshot does not see was pruned. Found by an adversarial review.
func TestGuardThresholdFollowsProbes(t *testing.T) {
	g := guard{max: 1 << 20}
	g.snapshot(chunker.Snapshot{Xmin: 1000, Xmax: 1000})
	base := uint32(1000 + 1<<31 + 10)
	g.observe(chunker.Snapshot{Xmin: uint64(base - 5), Xmax: uint64(base - 5)}) // an idle probe, much later
	lsn := pglogrepl.LSN(0x100)
	invisible := base // committed before the low watermark, still running for the snapshot
	g.commit(invisible, lsn)
	low := lsn + 1
	for i := uint32(1); i < 1100; i++ {
		g.commit(base+i, low+pglogrepl.LSN(i))
		g.prune(nil)
	}
	snap := chunker.Snapshot{Xmin: uint64(invisible), Xmax: uint64(base + 1100), Xip: []uint64{uint64(invisible)}}
	bad, xid := g.violated(snap, low)
	require.True(t, bad, "the commit before the low watermark was forgotten (%d kept)", len(g.commits))
	require.Equal(t, invisible, xid)
}

// TestGuardSkipsCommitsAlreadyVisible: commits streamed after a snapshot already showed them
// visible (a backlog) are not kept to be handed to the next run: the set stays small.
func TestGuardSkipsCommitsAlreadyVisible(t *testing.T) {
	g := guard{max: 1 << 20}
	g.observe(chunker.Snapshot{Xmin: 5000, Xmax: 5000})
	for x := uint32(100); x < 4000; x++ {
		g.commit(x, pglogrepl.LSN(x))
	}
	g.commit(5001, 0x9000)
	require.Equal(t, XIDs{5001}, *g.invisible())
}

// TestKeyTypeChangeStops: keys are encoded by type, so after a key column's type changes (int to
// numeric) the chunks' keys and the stream's no longer meet: the capture stops instead of missing
// evictions. Found by an adversarial review.
func TestKeyTypeChangeStops(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	numeric := &replicator.Relation{ID: 16384, Schema: "public", Table: "t", ReplicaIdentity: replicator.IdentityDefault,
		Columns: []replicator.Column{{Name: "id", TypeOID: 1700, TypeMod: -1, Key: true}, {Name: "big", TypeOID: 25, TypeMod: -1}}}
	err := r.step(numeric)
	require.ErrorIs(t, err, ErrKeyChanged)
	require.ErrorContains(t, err, "public.t")
}

// TestGuardKeepsCommitsForUnseenSnapshots: a window registered before another window's newer
// snapshot was handed over keeps, until its own snapshot arrives, the commits that snapshot may
// not see: pruning at the newer xmin would forget a commit streamed before the first window's
// low watermark and still invisible to its snapshot (several readers, I23; one reader hands
// snapshots over in the order it takes them). Found by a review of the core for several windows.
func TestGuardKeepsCommitsForUnseenSnapshots(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	r.must(probe{snap: chunker.Snapshot{Xmin: uint64(r.xid), Xmax: uint64(r.xid)}})
	r.must(register{id: 7, table: "public.t"})
	row := func() *replicator.Change {
		return &replicator.Change{Op: replicator.Insert, Rel: toastRel, New: replicator.Tuple{text("900"), text("x")}}
	}
	r.mustTxn(row()) // X: streamed before L7, still invisible when chunk 7's snapshot is taken
	x := r.xid
	r.mark(7, watermark.Low)
	r.must(register{id: 8, table: "public.t"})
	r.mark(8, watermark.Low)
	// Chunk 8's snapshot, taken later, sees X: the guard's newest xmin passes it.
	newer := chunker.Snapshot{Xmin: uint64(r.xid + 1), Xmax: uint64(r.xid + 1)}
	r.must(handover{id: 8, chunk: &chunker.Chunk{Table: toastTable, Snapshot: newer, Done: true}, maxKey: []string{"1000"}, keys: [][]string{{"1"}}})
	for range 3000 { // enough commits for the guard to prune
		r.mustTxn(row())
	}
	older := chunker.Snapshot{Xmin: uint64(x), Xmax: uint64(r.xid + 1), Xip: []uint64{uint64(x)}}
	rows := []chunker.Row{{[]byte("5"), []byte("old")}}
	r.must(handover{id: 7, chunk: &chunker.Chunk{Table: toastTable, Rows: rows, Last: []string{"5"}, Done: true, Snapshot: older}, maxKey: []string{"1000"}})
	r.mark(7, watermark.High)
	require.Len(t, r.verdicts, 1)
	require.False(t, r.verdicts[0].completed, "chunk 7's snapshot misses a commit streamed before its low watermark")
	for _, ev := range r.out {
		require.NotEqual(t, Snapshot, ev.Op, "no row of chunk 7 is emitted")
	}
}

// TestPendingXminsSkipRefreshWindows: a refresh's first window has no rows and no snapshot (its
// Xmin is zero). Counted among the pending snapshots, its zero would be the pruning's threshold,
// and with the xid counter past 2^31 every commit above it would look older than every snapshot
// and be forgotten while another reader's window still needs it (I11, I23).
func TestPendingXminsSkipRefreshWindows(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(probe{snap: chunker.Snapshot{Xmin: uint64(r.xid), Xmax: uint64(r.xid)}})
	r.must(register{id: 1, table: "public.t"})
	r.must(handover{id: 1, chunk: &chunker.Chunk{Table: toastTable}, refresh: true})
	r.must(register{id: 2, table: "public.t"})
	xs, ok := r.c.pendingXmins()
	require.True(t, ok)
	require.NotContains(t, xs, uint32(0), "a window without a snapshot has no xmin to keep")
	require.Len(t, xs, 1, "the registered window's floor")
}

// TestGuardPassesOverMarkOnlyTransactions: with several readers, another reader's watermark
// transaction can be streamed before this chunk's low watermark and still be invisible to its
// snapshot (a synchronous standby that has not answered yet). It changed no captured row, so the
// chunk misses nothing by not seeing it: it completes. A transaction that changed a captured row
// is still checked.
func TestGuardPassesOverMarkOnlyTransactions(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	r.must(register{id: 1, table: "public.t"})
	r.must(register{id: 2, table: "public.t"})
	r.mark(2, watermark.Low) // the other reader's mark, committed and streamed, not yet visible
	x := r.xid
	r.mark(1, watermark.Low)
	v := r.closeMissing(1, x)
	require.True(t, v.completed, "a mark-only transaction the snapshot does not see yet rejected the chunk: %v", v.reason)

	// The same with a row change in the invisible transaction: rejected.
	r2 := newCoreRun(t, nil, toastTable)
	r2.must(toastRel)
	r2.must(register{id: 1, table: "public.t"})
	r2.mustTxn(&replicator.Change{Op: replicator.Insert, Rel: toastRel, New: replicator.Tuple{text("9"), text("nine")}})
	y := r2.xid
	r2.mark(1, watermark.Low)
	require.False(t, r2.closeMissing(1, y).completed, "a change before the low watermark the snapshot does not see")
}

// TestGuardChecksTruncateOnlyTransactions: a transaction that only truncated a captured table
// changed its rows as much as one that deleted them: streamed before a chunk's low watermark and
// invisible to its snapshot, it rejects the chunk (which would emit the rows it removed).
func TestGuardChecksTruncateOnlyTransactions(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	r.must(register{id: 1, table: "public.t"})
	r.lsn += 0x100
	r.xid++
	r.must(&replicator.Begin{FinalLSN: r.lsn, XID: r.xid})
	r.must(&replicator.Truncate{LSN: r.lsn, XID: r.xid, Rels: []*replicator.Relation{toastRel}})
	r.must(&replicator.Commit{LSN: r.lsn, EndLSN: r.lsn + 1, XID: r.xid})
	x := r.xid
	r.mark(1, watermark.Low)
	require.False(t, r.closeMissing(1, x).completed, "a TRUNCATE before the low watermark the snapshot does not see")
}

// TestFenceOfIdleReaderCounted: with two readers, the fence of one that has nothing left can be
// followed, in the batch the merge loop takes before it looks, by new work for the other's table
// (a re-backfill, a row to read again), which clears the fences the core has seen. The idle
// reader never fences again (it did no work since), so its fence must still count, or a bounded
// run waits for it for ever.
func TestFenceOfIdleReaderCounted(t *testing.T) {
	r := newCoreRun(t, map[string]*TableProgress{"public.t": {Key: toastTable.KeyNames(), Done: true}}, toastTable)
	r.must(toastRel)
	m := &mergeLoop{core: r.c, verdicts: make([]chan verdict, 2), fenced: make([]bool, 2)}
	r.mark(2, watermark.Fence) // reader 1 (ids 2, 4, ...) has nothing left
	r.must(rebackfillAsk{ctx: context.Background(), tables: []string{"public.t"}, done: make(chan error, 1)})
	m.noteFences() // the merge loop looks only now
	require.True(t, m.fenced[1], "reader 1's fence counts although new work came after it")
	require.Equal(t, 1, m.fencedReaders)
}

// closeMissing hands over chunk id (one row of toastTable) read in a snapshot that does not see
// transaction x, writes its high watermark, and returns its verdict, the run's only one.
func (r *coreRun) closeMissing(id int64, x uint32) verdict {
	r.t.Helper()
	snap := chunker.Snapshot{Xmin: uint64(x), Xmax: uint64(r.xid + 1), Xip: []uint64{uint64(x)}}
	rows := []chunker.Row{{[]byte("5"), []byte("five")}}
	r.must(handover{id: id, chunk: &chunker.Chunk{Table: toastTable, Rows: rows, Last: []string{"5"}, Done: true, Snapshot: snap}, maxKey: []string{"1000"}})
	r.mark(id, watermark.High)
	require.Len(r.t, r.verdicts, 1)
	return r.verdicts[0]
}
