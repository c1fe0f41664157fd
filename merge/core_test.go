package merge

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/watermark"
)

// The model: a table t(id int4 primary key, ver int8) whose every write takes a new ver from a
// global counter, so a key's versions only grow, also across a delete and a re-insert. A
// simulated PostgreSQL commits transactions in an order the stream delivers them in, makes them
// visible to snapshots at commit or, for "hung" transactions, later (a synchronous standby that
// has not answered). A simulated chunk worker runs the chunk protocol against it; its inputs and
// the stream's reach the core in one FIFO order that respects causality, as the engine's channel
// does. The oracle: replaying the output gives the final table (I1), and no key's version ever
// goes back or comes back after a delete (I2, I3).

var (
	simTable = &chunker.Table{Schema: "public", Name: "t", OID: 16384, KeySource: "primary key", ReplicaIdentity: 'd',
		Columns: []chunker.Column{{Name: "id", TypeOID: 23, BaseOID: 23, TypeMod: -1}, {Name: "ver", TypeOID: 20, BaseOID: 20, TypeMod: -1}},
		Key:     []int{0}}
	simRel = &replicator.Relation{ID: 16384, Schema: "public", Table: "t", ReplicaIdentity: replicator.IdentityDefault,
		Columns: []replicator.Column{{Name: "id", TypeOID: 23, TypeMod: -1, Key: true}, {Name: "ver", TypeOID: 20, TypeMod: -1}}}
	simSignal = &replicator.Relation{ID: 16385, Schema: "public", Table: "tidemark_signal", ReplicaIdentity: replicator.IdentityDefault,
		Columns: []replicator.Column{{Name: "slot", TypeOID: 25, Key: true}, {Name: "run", TypeOID: 25}, {Name: "chunk", TypeOID: 20}, {Name: "kind", TypeOID: 25}, {Name: "written_at", TypeOID: 1184}}}
	simMarks = watermark.Config{Slot: "s", Run: "run1"}
)

func text(s string) replicator.Value { return replicator.Value{Kind: replicator.Text, Data: []byte(s)} }

// simOp is one row operation of a transaction.
type simOp struct {
	op       replicator.Op
	id, old  int   // old: the previous key of a key-changing update
	ver      int64 // the new version (insert, update)
	keyMoved bool
}

// simTxn is a transaction of the simulated server.
type simTxn struct {
	xid     uint32
	ops     []simOp
	mark    *watermark.Mark
	commit  pglogrepl.LSN
	visible bool // visible to new snapshots
}

type sim struct {
	r *rand.Rand

	table   map[int]int64 // committed state, in commit order
	vis     map[int]int64 // state visible to new snapshots
	nextXID uint32
	nextLSN pglogrepl.LSN
	nextVer int64
	nextKey int
	open    []uint32  // xids of started, uncommitted app transactions
	hung    []*simTxn // committed, not yet visible
	wal     []*simTxn // committed, not yet delivered to the core
	locked  map[int]bool

	core   *core
	inputs int

	// the worker
	wstate  int
	wid     int64
	chunk   *chunker.Chunk
	maxKey  []string
	limit   int
	cursor  []string
	done    bool
	started bool
	fails   int

	// the oracle
	replay  map[string]int64
	maxVer  map[string]int64
	deleted map[string]bool
}

// simFailure is a broken invariant, raised as a panic and returned by run.
type simFailure struct{ msg string }

func (s *sim) failf(format string, args ...any) { panic(simFailure{fmt.Sprintf(format, args...)}) }

func (s *sim) must(err error) {
	if err != nil {
		s.failf("%v", err)
	}
}

func newSim(seed uint64, noGuard, noEviction bool) *sim {
	s := &sim{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), table: map[int]int64{}, vis: map[int]int64{},
		nextXID: 1000, nextLSN: 0x1000000, nextVer: 1, locked: map[int]bool{},
		replay: map[string]int64{}, maxVer: map[string]int64{}, deleted: map[string]bool{}}
	s.limit = 1 + s.r.IntN(8)
	pos := &Position{Version: PositionVersion, Tables: map[string]*TableProgress{"public.t": {Key: []string{"id"}}}}
	s.core = newCore(simMarks, pos, map[string]*chunker.Table{"public.t": simTable})
	s.core.noGuard, s.core.noEviction = noGuard, noEviction
	// Rows that exist before the slot: only the backfill can see them.
	for range 10 + s.r.IntN(30) {
		s.nextKey += 1 + s.r.IntN(3)
		s.table[s.nextKey], s.vis[s.nextKey] = s.nextVer, s.nextVer
		s.nextVer++
	}
	s.feed(simSignal)
	s.feed(simRel)
	return s
}

func (s *sim) feed(in any) {
	s.inputs++
	s.must(s.core.step(in))
	for _, ev := range s.core.out {
		s.check(ev)
	}
	s.core.out = s.core.out[:0]
	vs := slices.Clone(s.core.verdicts)
	s.core.verdicts = s.core.verdicts[:0]
	for _, v := range vs {
		s.verdict(v)
	}
}

// check applies one output event to the replay and checks I2/I3 on the way.
func (s *sim) check(ev Event) {
	k := string(ev.Key)
	switch ev.Op {
	case Delete:
		delete(s.replay, k)
		s.deleted[k] = true
	case Insert, Update, Snapshot:
		ver, err := strconv.ParseInt(string(ev.Col(1).Data), 10, 64)
		s.must(err)
		if last, ok := s.maxVer[k]; ok {
			if ver < last {
				s.failf("I2: key %x went back from version %d to %d (%v at %s)", ev.Key, last, ver, ev.Op, ev.LSN)
			}
			if s.deleted[k] && ver <= last {
				s.failf("I3: key %x came back after its delete with old version %d (%v at %s)", ev.Key, ver, ev.Op, ev.LSN)
			}
		}
		s.maxVer[k], s.deleted[k] = ver, false
		s.replay[k] = ver
	}
}

func (s *sim) key(id int) string {
	k, err := simTable.AppendKey(nil, [][]byte{[]byte(strconv.Itoa(id))})
	s.must(err)
	return string(k)
}

func (s *sim) lsn() pglogrepl.LSN { s.nextLSN += pglogrepl.LSN(1 + s.r.IntN(200)); return s.nextLSN }

// commit commits a transaction: it joins the WAL (to be streamed) and, unless hung, becomes
// visible at once.
func (s *sim) commit(tx *simTxn, hang bool) {
	tx.commit = s.lsn()
	for _, op := range tx.ops {
		apply(s.table, op)
	}
	s.wal = append(s.wal, tx)
	if hang {
		s.hung = append(s.hung, tx)
		for _, op := range tx.ops {
			s.locked[op.id], s.locked[op.old] = true, true
		}
		return
	}
	s.makeVisible(tx)
}

func (s *sim) makeVisible(tx *simTxn) {
	tx.visible = true
	for _, op := range tx.ops {
		apply(s.vis, op)
		delete(s.locked, op.id)
		delete(s.locked, op.old)
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
		free := func() (int, bool) {
			id := s.r.IntN(s.nextKey + 10)
			_, taken := scratch[id]
			return id, !taken && !s.locked[id]
		}
		var op simOp
		switch n := s.r.IntN(10); {
		case n < 3 || len(keys) == 0:
			id, ok := free()
			if !ok {
				continue
			}
			op = simOp{op: replicator.Insert, id: id, ver: s.nextVer}
		case n < 7:
			op = simOp{op: replicator.Update, id: keys[s.r.IntN(len(keys))], ver: s.nextVer}
		case n < 9:
			op = simOp{op: replicator.Delete, id: keys[s.r.IntN(len(keys))]}
		default:
			id, ok := free()
			if !ok {
				continue
			}
			op = simOp{op: replicator.Update, id: id, old: keys[s.r.IntN(len(keys))], ver: s.nextVer, keyMoved: true}
		}
		s.nextVer++
		apply(scratch, op)
		tx.ops = append(tx.ops, op)
	}
	s.commit(tx, s.r.IntN(12) == 0)
}

func apply(state map[int]int64, op simOp) {
	switch op.op {
	case replicator.Insert, replicator.Update:
		if op.keyMoved {
			delete(state, op.old)
		}
		state[op.id] = op.ver
	case replicator.Delete:
		delete(state, op.id)
	}
}

// deliver streams the oldest undelivered transaction to the core.
func (s *sim) deliver() {
	tx := s.wal[0]
	s.wal = s.wal[1:]
	s.feed(&replicator.Begin{FinalLSN: tx.commit, XID: tx.xid})
	for _, op := range tx.ops {
		ch := &replicator.Change{Op: op.op, XID: tx.xid, Rel: simRel}
		ver := text(strconv.FormatInt(op.ver, 10))
		switch op.op {
		case replicator.Insert:
			ch.New = replicator.Tuple{text(strconv.Itoa(op.id)), ver}
		case replicator.Update:
			ch.New = replicator.Tuple{text(strconv.Itoa(op.id)), ver}
			if op.keyMoved {
				ch.OldKind, ch.Old = replicator.OldKey, replicator.Tuple{text(strconv.Itoa(op.old)), {Kind: replicator.Null}}
			}
		case replicator.Delete:
			ch.OldKind, ch.Old = replicator.OldKey, replicator.Tuple{text(strconv.Itoa(op.id)), {Kind: replicator.Null}}
		}
		s.feed(ch)
	}
	if m := tx.mark; m != nil {
		s.feed(&replicator.Change{Op: replicator.Update, XID: tx.xid, Rel: simSignal, New: replicator.Tuple{
			text("s"), text("run1"), text(strconv.FormatInt(m.ID, 10)), text(string(rune(m.Kind))), text("2026-01-01 00:00:00+00")}})
	}
	s.feed(&replicator.Commit{LSN: tx.commit, EndLSN: tx.commit + 1, XID: tx.xid})
}

func (s *sim) markTxn(m watermark.Mark) {
	tx := &simTxn{xid: s.nextXID, mark: &m}
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

func (s *sim) read() *chunker.Chunk {
	c := &chunker.Chunk{Table: simTable, After: s.cursor, Snapshot: s.snapshot()}
	keys := make([]int, 0, len(s.vis))
	for k := range s.vis {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	lo, hi := -1, 1<<30
	if s.cursor != nil {
		lo, _ = strconv.Atoi(s.cursor[0])
	}
	hi, _ = strconv.Atoi(s.maxKey[0])
	for _, k := range keys {
		if k <= lo || k > hi {
			continue
		}
		if len(c.Rows) == s.limit {
			break
		}
		c.Rows = append(c.Rows, chunker.Row{[]byte(strconv.Itoa(k)), []byte(strconv.FormatInt(s.vis[k], 10))})
	}
	c.Done = len(c.Rows) < s.limit
	if n := len(c.Rows); n > 0 {
		c.Last = []string{string(c.Rows[n-1][0])}
	}
	return c
}

// workerStep advances the simulated chunk worker by one step.
func (s *sim) workerStep() {
	switch s.wstate {
	case 0: // start a chunk
		if s.done {
			return
		}
		if !s.started {
			s.started = true
			keys := []int{}
			for k := range s.vis {
				keys = append(keys, k)
			}
			if len(keys) == 0 {
				s.done = true
				s.feed(emptyTable{table: "public.t"})
				return
			}
			s.maxKey = []string{strconv.Itoa(slices.Max(keys))}
		}
		s.wid++
		s.feed(register{id: s.wid, table: "public.t"})
		s.wstate = 1
	case 1: // low watermark; sometimes its write fails
		if s.r.IntN(20) == 0 {
			if s.r.IntN(2) == 0 { // it committed anyway
				s.markTxn(watermark.Mark{ID: s.wid, Kind: watermark.Low})
			}
			s.wstate = 5
			s.feed(abandon{id: s.wid, reason: fmt.Errorf("simulated failure")})
			return
		}
		s.markTxn(watermark.Mark{ID: s.wid, Kind: watermark.Low})
		s.wstate = 2
	case 2:
		s.chunk = s.read()
		s.wstate = 3
	case 3:
		s.feed(handover{id: s.wid, chunk: s.chunk, maxKey: s.maxKey})
		s.wstate = 4
	case 4: // high watermark, sometimes twice (an ambiguous commit retried)
		s.markTxn(watermark.Mark{ID: s.wid, Kind: watermark.High})
		if s.r.IntN(10) == 0 {
			s.markTxn(watermark.Mark{ID: s.wid, Kind: watermark.High})
		}
		s.wstate = 5
	case 5: // waiting for the verdict, which delivery produces
	}
}

func (s *sim) verdict(v verdict) {
	if v.id != s.wid || s.wstate != 5 {
		s.failf("verdict for chunk %d in state %d while chunk %d is in flight", v.id, s.wstate, s.wid)
	}
	if v.completed {
		s.cursor = v.progress.Cursor
		s.done = v.progress.Done
		s.fails = 0
	} else {
		s.fails++
		if s.fails > 500 {
			s.failf("the backfill makes no progress: %v", v.reason)
		}
	}
	s.wstate = 0
}

// run runs the simulation for steps random steps, then until the backfill is done and the
// stream drained, and checks the replay. It returns the first broken invariant.
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
	for i := 0; i < steps || !s.done || s.wstate != 0 || len(s.wal) > 0 || len(s.hung) > 0; i++ {
		if i > steps+50000 {
			s.failf("the simulation does not finish")
		}
		switch n := s.r.IntN(10); {
		case n < 3 && i < steps:
			s.appTxn()
		case n < 5 && len(s.hung) > 0:
			j := s.r.IntN(len(s.hung))
			s.makeVisible(s.hung[j])
			s.hung = slices.Delete(s.hung, j, j+1)
		case n < 7 && len(s.wal) > 0:
			s.deliver()
		default:
			s.workerStep()
		}
	}
	// Replay equals the final table (I1).
	want := map[string]int64{}
	for id, ver := range s.table {
		want[s.key(id)] = ver
	}
	for k, v := range want {
		if got, ok := s.replay[k]; !ok || got != v {
			s.failf("I1: key %x is %d in the table and %d (present: %v) in the replay", k, v, got, ok)
		}
	}
	if len(want) != len(s.replay) {
		s.failf("I1: the replay has %d rows, the table %d", len(s.replay), len(want))
	}
	if !s.core.pos.Tables["public.t"].Done {
		s.failf("the backfill is not done")
	}
	return nil
}

// TestCoreAgainstModel: random interleavings of chunk reads and transactions (inserts,
// updates, deletes, key changes, repeated keys, transactions started before a window and
// committed inside or after it, transactions that stream before they are visible, failed and
// repeated watermarks) replay to the final table, and no key goes back to an older version.
func TestCoreAgainstModel(t *testing.T) {
	for seed := range uint64(500) {
		require.NoError(t, newSim(seed, false, false).run(300), "seed %d", seed)
	}
	for seed := uint64(1000); seed < 1050; seed++ {
		require.NoError(t, newSim(seed, false, false).run(3000), "seed %d", seed)
	}
}

// TestCoreModelCatchesBrokenEngines: the model sees the bugs it exists for.
func TestCoreModelCatchesBrokenEngines(t *testing.T) {
	for _, tc := range []struct {
		name                string
		noGuard, noEviction bool
	}{{"no visibility guard", true, false}, {"no eviction", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			caught := 0
			for seed := range uint64(500) {
				if newSim(seed, tc.noGuard, tc.noEviction).run(300) != nil {
					caught++
				}
			}
			require.Positive(t, caught, "the broken engine passed every seed")
			t.Logf("caught in %d of 500 seeds", caught)
		})
	}
}

// FuzzWindow drives the model with the fuzzer's choice of seed and length.
func FuzzWindow(f *testing.F) {
	f.Add(uint64(1), uint16(100))
	f.Add(uint64(7), uint16(1000))
	f.Fuzz(func(t *testing.T, seed uint64, steps uint16) {
		if err := newSim(seed, false, false).run(int(steps % 2000)); err != nil {
			t.Fatalf("seed %d, %d steps: %v", seed, steps, err)
		}
	})
}
