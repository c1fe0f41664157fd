package merge

import (
	"context"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/watermark"
)

// The tests of this file pin small pieces of the core whose bodies, emptied, passed every other
// test of the package (a mutation pass): each states what the piece must do, with an expectation
// written out by hand.

// chunkRows are rows of toastTable with ids ids.
func chunkRows(ids ...string) []chunker.Row {
	var rows []chunker.Row
	for _, id := range ids {
		rows = append(rows, chunker.Row{[]byte(id), []byte("v" + id)})
	}
	return rows
}

// ops lists the events' operations.
func ops(evs []Event) []Op {
	var out []Op
	for _, ev := range evs {
		out = append(out, ev.Op)
	}
	return out
}

// TestTruncateInsideAWindow: a TRUNCATE of the table is emitted at its transaction (a truncate
// event, in the stream's order) and abandons the window open across it: its chunk's rows were
// read before or after the TRUNCATE, and either way may not be emitted at the high watermark.
func TestTruncateInsideAWindow(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	r.window(1, toastTable, nil, chunkRows("1", "2"), func() {
		r.lsn += 0x100
		r.xid++
		r.must(&replicator.Begin{FinalLSN: r.lsn, XID: r.xid})
		r.must(&replicator.Truncate{LSN: r.lsn, XID: r.xid, Rels: []*replicator.Relation{toastRel}})
		r.must(&replicator.Commit{LSN: r.lsn, EndLSN: r.lsn + 1, XID: r.xid})
	}, nil)
	require.Equal(t, []Op{Truncate}, ops(r.out), "the truncate, and no row of the chunk")
	require.Equal(t, r.lsn-0x100, r.out[0].LSN, "at the TRUNCATE's commit (the high mark's transaction came after)")
	require.Len(t, r.verdicts, 1)
	require.False(t, r.verdicts[0].completed)
	require.ErrorIs(t, r.verdicts[0].reason, errTruncated)

	// The next window, with nothing in it, emits its rows.
	r.out = nil
	r.window(2, toastTable, nil, chunkRows("1", "2"), nil, nil)
	require.Equal(t, []Op{Snapshot, Snapshot}, ops(r.out))
}

// TestStaleWindowAbandoned: a window whose high watermark was written (highWritten) before a WAL
// position the stream has passed without showing the mark is abandoned (the mark's transaction
// is lost to this stream: a reconnection past it, a filtered message), at once when the stream
// is past it already, or at the first commit past it.
func TestStaleWindowAbandoned(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	r.must(register{id: 1, table: toastTable.String()})
	r.mark(1, watermark.Low)
	c := &chunker.Chunk{Table: toastTable, Rows: chunkRows("1"), Done: true, Last: []string{"1"},
		Snapshot: chunker.Snapshot{Xmin: uint64(r.xid + 1), Xmax: uint64(r.xid + 1)}}
	r.must(handover{id: 1, chunk: c, maxKey: []string{"1000"}})
	r.must(highWritten{id: 1, after: r.lsn + 0x80})
	require.Empty(t, r.verdicts, "the stream is not past the mark's position yet")
	r.mustTxn(ins(toastRel, text("7"), text("x")))
	require.Len(t, r.verdicts, 1, "the stream passed the mark's position without it")
	require.False(t, r.verdicts[0].completed)
	require.ErrorIs(t, r.verdicts[0].reason, errStale)
	require.Equal(t, []Op{Insert}, ops(r.out), "no row of the abandoned chunk")

	// Already past: abandoned as the notice comes.
	r.must(register{id: 2, table: toastTable.String()})
	r.mark(2, watermark.Low)
	c.Snapshot = chunker.Snapshot{Xmin: uint64(r.xid + 1), Xmax: uint64(r.xid + 1)}
	r.must(handover{id: 2, chunk: c, maxKey: []string{"1000"}})
	r.must(highWritten{id: 2, after: r.lsn})
	require.Len(t, r.verdicts, 2)
	require.ErrorIs(t, r.verdicts[1].reason, errStale)
}

// TestFillUnchanged: the unchanged TOASTed values of a new tuple take the old row's values where
// it has them; the new tuple itself is not written to.
func TestFillUnchanged(t *testing.T) {
	n := replicator.Tuple{text("1"), unchanged, unchanged, null}
	o := replicator.Tuple{text("1"), text("old"), unchanged}
	out := fillUnchanged(n, o)
	require.Equal(t, replicator.Tuple{text("1"), text("old"), unchanged, null}, out)
	require.Equal(t, replicator.Tuple{text("1"), unchanged, unchanged, null}, n, "the new tuple is left as it was")
	same := replicator.Tuple{text("2"), text("b")}
	require.Equal(t, same, fillUnchanged(same, nil))
}

// TestIdentityName: how a stop names a relation's replica identity.
func TestIdentityName(t *testing.T) {
	cols := []replicator.Column{{Name: "a", Key: true}, {Name: "b", Key: true}, {Name: "c"}}
	for _, c := range []struct {
		id   replicator.ReplicaIdentity
		cols []replicator.Column
		want string
	}{
		{replicator.IdentityIndex, cols, "USING INDEX, on a, b"},
		{replicator.IdentityFull, cols, "FULL"},
		{replicator.IdentityNothing, nil, "NOTHING"},
		{replicator.IdentityDefault, cols, "DEFAULT, the primary key a, b"},
		{replicator.IdentityDefault, cols[2:], "DEFAULT, with no primary key"},
	} {
		require.Equal(t, c.want, identityName(&replicator.Relation{ReplicaIdentity: c.id, Columns: c.cols}))
	}
}

// TestPendingWork: a table has rows waiting to be read while its backfill is not done, while it
// is asked to start over, or while rows wait to be read again; otherwise none.
func TestPendingWork(t *testing.T) {
	for _, c := range []struct {
		p    TableProgress
		want bool
	}{
		{TableProgress{}, true},
		{TableProgress{Done: true}, false},
		{TableProgress{Done: true, Refresh: true}, true},
		{TableProgress{Done: true, Reread: [][]string{{"5"}}}, true},
	} {
		p := c.p
		p.Key = []string{"id"}
		r := newCoreRun(t, map[string]*TableProgress{"public.t": &p}, toastTable)
		require.Equal(t, c.want, r.c.pendingWork(), "%+v", c.p)
	}
}

// TestGuardCommitAtOrAboveXmax: a transaction that committed before the low watermark with an
// xid at or above the snapshot's xmax was not yet visible to it (PostgreSQL had not shown it to
// new snapshots): the chunk is rejected. Below xmax and not running, it was visible.
func TestGuardCommitAtOrAboveXmax(t *testing.T) {
	g := guard{max: 1 << 20}
	g.commit(900, 0x100)
	bad, xid := g.violated(chunker.Snapshot{Xmin: 800, Xmax: 900}, 0x200)
	require.True(t, bad)
	require.Equal(t, uint32(900), xid)
	bad, _ = g.violated(chunker.Snapshot{Xmin: 800, Xmax: 901}, 0x200)
	require.False(t, bad, "visible: below xmax and not running")
	bad, _ = g.violated(chunker.Snapshot{Xmin: 800, Xmax: 900}, 0x100)
	require.False(t, bad, "committed at the low watermark, not before it")
}

// TestGuardPrune: prune forgets the commits below the newest snapshot's xmin and every pending
// snapshot's, and keeps the rest; an overflow below the threshold is forgotten with them.
func TestGuardPrune(t *testing.T) {
	g := guard{max: 1 << 20}
	for x := uint32(100); x < 3100; x++ {
		g.commit(x, pglogrepl.LSN(x))
	}
	g.overflow, g.droppedMax = true, 50
	g.snapshot(chunker.Snapshot{Xmin: 2000, Xmax: 2000})
	g.prune([]uint32{1500})
	require.Len(t, g.commits, 3100-1500, "kept from the oldest pending snapshot's xmin")
	require.Equal(t, uint32(1500), g.commits[0].xid)
	require.False(t, g.overflow, "the commits dropped by the cap are all below the threshold")
	for x := uint32(3100); x < 6200; x++ {
		g.commit(x, pglogrepl.LSN(x))
	}
	g.prune(nil)
	require.Equal(t, uint32(2000), g.commits[0].xid, "no pending snapshot: the newest xmin")
	require.Len(t, g.commits, 6200-2000)
}

// TestKeepaliveInsideATransaction: a keepalive's position is the server's, which may be past the
// commit of the transaction being received: inside it, the position (the next checkpoint's)
// stays before the transaction, and moves to its end at its commit.
func TestKeepaliveInsideATransaction(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	r.mustTxn(ins(toastRel, text("1"), text("a")))
	before := r.c.pos.LSN
	r.lsn += 0x100
	r.xid++
	r.must(&replicator.Begin{FinalLSN: r.lsn, XID: r.xid})
	r.must(&replicator.Keepalive{WALEnd: r.lsn + 0x1000})
	require.Equal(t, before, r.c.pos.LSN, "inside a transaction")
	r.must(ins(toastRel, text("2"), text("b")))
	r.must(&replicator.Commit{LSN: r.lsn, EndLSN: r.lsn + 1, XID: r.xid})
	require.Equal(t, r.lsn+1, r.c.pos.LSN)
	r.must(&replicator.Keepalive{WALEnd: r.lsn + 0x1000})
	require.Equal(t, r.lsn+0x1000, r.c.pos.LSN, "idle: the server's position")
}

// TestRemoveKeys: one occurrence of each done key is removed (a key listed twice to read again,
// read once, stays once).
func TestRemoveKeys(t *testing.T) {
	keys := [][]string{{"1"}, {"2"}, {"1"}, {"3", "x"}}
	require.Equal(t, [][]string{{"2"}, {"1"}}, removeKeys(keys, [][]string{{"1"}, {"3", "x"}}))
	require.Nil(t, removeKeys([][]string{{"1"}}, [][]string{{"1"}, {"1"}}))
	require.Equal(t, keys, removeKeys(keys, nil))
}

// TestQuietWindow: a window's verdict says whether any change of a captured table committed
// inside it (a live change waited behind its rows), the table's own or another's: the worker
// grows chunks only after quiet ones.
func TestQuietWindow(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	r.window(1, toastTable, nil, chunkRows("1", "2"), nil, nil)
	require.Len(t, r.verdicts, 1)
	require.True(t, r.verdicts[0].completed)
	require.True(t, r.verdicts[0].quiet, "nothing inside the window")
	r.mustTxn(ins(toastRel, text("7"), text("x"))) // before the next window: not inside it
	// (Key-list windows from here: a range chunk after the first would have to start at its cursor.)
	r.window(2, toastTable, [][]string{{"3"}}, chunkRows("3"), func() { r.mustTxn(ins(toastRel, text("8"), text("y"))) }, nil)
	require.Len(t, r.verdicts, 2)
	require.True(t, r.verdicts[1].completed)
	require.False(t, r.verdicts[1].quiet, "a change inside the window, before its rows")
	r.window(3, toastTable, [][]string{{"4"}}, chunkRows("4"), nil, func() { r.mustTxn(ins(toastRel, text("9"), text("z"))) })
	require.False(t, r.verdicts[2].quiet, "a change inside the window, after its rows")
}

// TestChunksGrowWhileQuiet: after quiet windows the chunk limit doubles, up to ChunkGrowth times
// the configured size, while a full chunk stays within half the byte bound; a window a change
// waited behind brings it back to the configured size; a capped chunk or the table's last does
// not grow it; ChunkGrowth 1 keeps it fixed.
func TestChunksGrowWhileQuiet(t *testing.T) {
	w := &worker{cfg: &Config{ChunkSize: 10, ChunkGrowth: 4, MaxChunkBytes: 1000}, limit: 10, log: zerolog.Nop()}
	tb := &workTable{name: "public.t", table: toastTable}
	full := func(n, bytes int) *chunker.Chunk {
		return &chunker.Chunk{Rows: make([]chunker.Row, n), Bytes: bytes, Last: []string{"1"}}
	}
	step := func(c *chunker.Chunk, quiet bool) int {
		require.NoError(t, w.verdict(context.Background(), tb, c, verdict{completed: true, quiet: quiet}))
		return w.limit
	}
	require.Equal(t, 20, step(full(10, 100), true))
	require.Equal(t, 40, step(full(20, 200), true))
	require.Equal(t, 40, step(full(40, 400), true), "at most ChunkGrowth times the configured size")
	require.Equal(t, 10, step(full(40, 400), false), "a live change waited: back to the configured size")
	require.Equal(t, 10, step(full(10, 600), true), "a full chunk over half the byte bound does not grow")
	capped := full(10, 100)
	capped.Capped = true
	require.Equal(t, 10, step(capped, true))
	last := full(5, 50)
	last.Done = true
	require.Equal(t, 10, step(last, true))
	w.cfg.ChunkGrowth = 1
	require.Equal(t, 10, step(full(10, 100), true), "ChunkGrowth 1: fixed")
}

// TestSplitTakenOnItsProgress: a split of a table's backfill is taken only on the progress it
// was computed on, into ranges from the cursor to the upper bound, adjacent at the points; a
// split of a backfill that moved on, is done, restarting, or split already is refused, and the
// verdict carries the table's progress either way.
func TestSplitTakenOnItsProgress(t *testing.T) {
	name := toastTable.String()
	r := newCoreRun(t, map[string]*TableProgress{name: {Key: []string{"id"}, Cursor: []string{"10"}, MaxKey: []string{"100"}}}, toastTable)
	r.must(split{id: 1, table: name, from: []string{"5"}, maxKey: []string{"100"}, points: [][]string{{"50"}}})
	require.False(t, r.verdicts[0].completed, "computed at another cursor")
	require.ErrorIs(t, r.verdicts[0].reason, errSplitLate)
	require.Nil(t, r.verdicts[0].progress.Ranges)
	r.must(split{id: 2, table: name, from: []string{"10"}, maxKey: []string{"90"}, points: [][]string{{"50"}}})
	require.False(t, r.verdicts[1].completed, "under another upper bound")
	gen := r.c.rereadGen
	r.must(split{id: 3, table: name, from: []string{"10"}, maxKey: []string{"100"}, points: [][]string{{"40"}, {"70"}}})
	require.True(t, r.verdicts[2].completed)
	require.Equal(t, []KeyRange{{Cursor: []string{"10"}, To: []string{"40"}}, {Cursor: []string{"40"}, To: []string{"70"}}, {Cursor: []string{"70"}, To: []string{"100"}}},
		r.verdicts[2].progress.Ranges)
	require.Greater(t, r.c.rereadGen, gen, "the other readers are woken to take their ranges")
	require.NoError(t, r.verdicts[2].progress.Check())
	r.must(split{id: 4, table: name, from: []string{"10"}, maxKey: []string{"100"}, points: [][]string{{"20"}}})
	require.False(t, r.verdicts[3].completed, "split already")
	require.Len(t, r.verdicts[3].progress.Ranges, 3)

	for _, p := range []*TableProgress{
		{Key: []string{"id"}, Cursor: []string{"10"}, MaxKey: []string{"100"}, Done: true},
		{Key: []string{"id"}, Cursor: []string{"10"}, MaxKey: []string{"100"}, Refresh: true},
	} {
		r := newCoreRun(t, map[string]*TableProgress{name: p}, toastTable)
		r.must(split{id: 1, table: name, from: []string{"10"}, maxKey: []string{"100"}, points: [][]string{{"50"}}})
		require.False(t, r.verdicts[0].completed, "%+v", p)
		require.Nil(t, r.verdicts[0].progress.Ranges)
	}
}

// TestRangeChunkContinuesItsRange: a chunk of a key range completes only from that range's
// cursor under that range's bound, and moves that range alone; the table is done once every
// range is. A chunk of the backfill as it was before the split, or of a range as another split
// drew it, does not complete.
func TestRangeChunkContinuesItsRange(t *testing.T) {
	name := toastTable.String()
	r := newCoreRun(t, map[string]*TableProgress{name: {Key: []string{"id"}, Cursor: []string{"1"}, MaxKey: []string{"9"},
		Ranges: []KeyRange{{Cursor: []string{"1"}, To: []string{"5"}}, {Cursor: []string{"5"}, To: []string{"9"}}}}}, toastTable)
	r.must(toastRel)
	chunk := func(id int64, rng int, after, to []string, done bool, ids ...string) verdict {
		r.must(register{id: id, table: name})
		r.mark(id, watermark.Low)
		c := &chunker.Chunk{Table: toastTable, After: after, Rows: chunkRows(ids...), Done: done,
			Snapshot: chunker.Snapshot{Xmin: uint64(r.xid + 1), Xmax: uint64(r.xid + 1)}}
		if len(ids) > 0 {
			c.Last = []string{ids[len(ids)-1]}
		}
		r.must(handover{id: id, chunk: c, maxKey: []string{"9"}, rng: rng, to: to})
		r.mark(id, watermark.High)
		return r.verdicts[len(r.verdicts)-1]
	}
	v := chunk(1, 0, []string{"1"}, nil, false, "2", "3")
	require.ErrorIs(t, v.reason, errRestarted, "a chunk of the backfill before its split")
	v = chunk(2, 2, []string{"5"}, []string{"8"}, true, "6", "7")
	require.ErrorIs(t, v.reason, errRestarted, "the range's cursor, another bound")
	v = chunk(3, 3, []string{"5"}, []string{"9"}, true, "6")
	require.ErrorIs(t, v.reason, errRestarted, "no such range")
	v = chunk(4, 2, []string{"5"}, []string{"9"}, true, "6", "7", "8")
	require.True(t, v.completed)
	require.Equal(t, []KeyRange{{Cursor: []string{"1"}, To: []string{"5"}}, {Cursor: []string{"8"}, To: []string{"9"}, Done: true}}, v.progress.Ranges)
	require.False(t, v.progress.Done, "the first range is not done")
	require.Equal(t, []string{"1"}, v.progress.Cursor, "the table's cursor stays where the split was made")
	v = chunk(5, 1, []string{"1"}, []string{"5"}, false, "2", "3")
	require.True(t, v.completed)
	require.False(t, v.progress.Done)
	v = chunk(6, 1, []string{"3"}, []string{"5"}, true, "4", "5")
	require.True(t, v.completed)
	require.True(t, v.progress.Done, "every range is done")
	require.Equal(t, int64(3), v.progress.Chunks)
	require.Equal(t, int64(7), v.progress.Rows)
	require.NoError(t, v.progress.Check())
}

// TestCheckRanges: a state's key ranges are checked like its cursor: bounds of as many values as
// the key has columns, the last range ending at the upper bound, a table done exactly when
// every range is.
func TestCheckRanges(t *testing.T) {
	ok := TableProgress{Key: []string{"id"}, Cursor: []string{"1"}, MaxKey: []string{"9"},
		Ranges: []KeyRange{{Cursor: []string{"1"}, To: []string{"5"}}, {Cursor: []string{"5"}, To: []string{"9"}, Done: true}}}
	require.NoError(t, ok.Check())
	for want, edit := range map[string]func(p *TableProgress){
		"without an upper bound":          func(p *TableProgress) { p.MaxKey = nil },
		"done is true":                    func(p *TableProgress) { p.Done = true },
		"does not end at the upper bound": func(p *TableProgress) { p.Ranges[1].To = []string{"8"} },
		"bounds of 2 and 1 values":        func(p *TableProgress) { p.Ranges[0].Cursor = []string{"1", "2"} },
		"key ranges (at most":             func(p *TableProgress) { p.Ranges = make([]KeyRange, MaxReaders+1) },
		"an empty list of key ranges":     func(p *TableProgress) { p.Ranges, p.Done = []KeyRange{}, true },
	} {
		p := ok.clone()
		edit(&p)
		require.ErrorContains(t, p.Check(), want)
	}
}
