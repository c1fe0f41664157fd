package nats_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/sink/debezium"
	tmnats "github.com/tidemark/tidemark/sink/nats"
)

var server *e2e.Server

func TestMain(m *testing.M) { os.Exit(e2e.Main(m, &server)) }

var errStop = errors.New("stopped by the test")

// failAfter is a NATS output whose nth Checkpoint fails after the stream acknowledged what was
// emitted before it: a run killed with messages past its checkpoint. history, when set, is the
// source's history the sink is told (a restore).
type failAfter struct {
	*tmnats.Sink
	n, seen int
	emitted *int
	history string
	// beforeRefresh: the run stops before its first refresh, after the stream took what came
	// before it.
	beforeRefresh bool
	// afterSnapshot: the run stops once the stream took its first backfilled (or re-read) row.
	afterSnapshot bool
	// then, when set, runs once the stream took the second chunk's rows; the run checkpoints
	// nothing after it (its checkpoints are dropped, the slot is not confirmed), and stops once
	// the stream took an insert.
	then      func()
	held      bool
	snapshots int
}

func (f *failAfter) Emit(ctx context.Context, events []merge.Event) error {
	if f.beforeRefresh {
		if i := slices.IndexFunc(events, func(e merge.Event) bool { return e.Op == merge.Refresh }); i >= 0 {
			if err := f.Sink.Emit(ctx, events[:i]); err != nil {
				return err
			}
			if err := f.Sink.Flush(ctx); err != nil {
				return err
			}
			return errStop
		}
	}
	*f.emitted += len(events)
	if f.then != nil {
		if err := f.Sink.Emit(ctx, events); err != nil {
			return err
		}
		switch {
		case !f.held && slices.ContainsFunc(events, func(e merge.Event) bool { return e.Op == merge.Snapshot }):
			if f.snapshots++; f.snapshots < 2 {
				return nil
			}
			if err := f.Sink.Flush(ctx); err != nil {
				return err
			}
			f.then()
			f.held = true
		case f.held && slices.ContainsFunc(events, func(e merge.Event) bool { return e.Op == merge.Insert }):
			if err := f.Sink.Flush(ctx); err != nil {
				return err
			}
			return errStop
		}
		return nil
	}
	if f.afterSnapshot && slices.ContainsFunc(events, func(e merge.Event) bool { return e.Op == merge.Snapshot }) {
		if err := f.Sink.Emit(ctx, events); err != nil {
			return err
		}
		if err := f.Sink.Flush(ctx); err != nil {
			return err
		}
		return errStop
	}
	return f.Sink.Emit(ctx, events)
}

func (f *failAfter) Checkpoint(ctx context.Context, pos *merge.Position) error {
	if f.held {
		return nil
	}
	if f.seen++; f.n > 0 && f.seen >= f.n {
		if err := f.Sink.Flush(ctx); err != nil {
			return err
		}
		return errStop
	}
	return f.Sink.Checkpoint(ctx, pos)
}

func (f *failAfter) Resume(pos *merge.Position, over bool) {
	if f.history != "" {
		p := pos.Clone()
		p.SystemID = f.history
		pos = p
	}
	f.Sink.Resume(pos, over)
}

type run struct {
	failAt        int
	partitions    int
	replicas      int
	history       string
	refresh       []string // tables re-backfilled (sync --rebackfill)
	beforeRefresh bool
	afterSnapshot bool
	reread        bool // merge.Config.RereadPartial, and the output told so
	then          func()
	afterLow      func() // merge.Hooks.AfterLow, for the run's first chunk
}

// capture runs the engine into the output at addr until it has caught up (or its failAt-th
// checkpoint fails), and returns the events emitted.
func capture(t *testing.T, db *e2e.TestDB, addr tmnats.Address, r run, tables ...string) (int, error) {
	t.Helper()
	ctx := context.Background()
	conn := db.Connect()
	var names []string
	for _, name := range tables {
		names = append(names, "public."+name)
	}
	s, from, err := tmnats.Open(ctx, tmnats.Options{Address: addr, Tables: names, Partitions: r.partitions, Replicas: r.replicas, Slot: db.Slot,
		RereadPartial: r.reread, Types: pgjson.NewRegistry(conn), Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)}, func() error { return nil })
	if err != nil {
		return 0, err
	}
	defer s.Close(ctx)
	cfg := merge.Config{Source: replicator.Config{DSN: db.DSN, Slot: db.Slot, Publication: db.Publication, CreateSlot: true},
		AckCheckpoints: r.then == nil, StopWhenCaughtUp: true, ChunkSize: 7, ChunkGrowth: 1, RereadPartial: r.reread}
	for _, name := range tables {
		cfg.Tables = append(cfg.Tables, merge.TableConfig{Schema: "public", Name: name})
	}
	if r.afterLow != nil {
		var once sync.Once
		cfg.Hooks.AfterLow = func(context.Context, int64) { once.Do(r.afterLow) }
	}
	if from != nil {
		for _, name := range r.refresh {
			from.Tables["public."+name] = &merge.TableProgress{Refresh: true}
		}
	}
	var emitted int
	eng, err := merge.New(cfg, &failAfter{Sink: s, n: r.failAt, emitted: &emitted, history: r.history, beforeRefresh: r.beforeRefresh, afterSnapshot: r.afterSnapshot, then: r.then},
		zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	err = eng.Run(ctx, from)
	return emitted, err
}

// replay reads the stream back and checks it against the source: every event once, the
// replay equal to the source.
func replay(t *testing.T, db *e2e.TestDB, addr tmnats.Address, tables ...string) *e2e.Oracle {
	t.Helper()
	keys := map[string][]string{}
	for _, name := range tables {
		keys["public."+name] = []string{"id"}
	}
	o := e2e.ReplayNATS(t, addr, keys)
	require.Empty(t, o.Violations())
	for _, name := range tables {
		src, err := e2e.SourceRowsJSON(context.Background(), db.DSN, "public", name, []string{"id"})
		require.NoError(t, err)
		require.Empty(t, e2e.Diff(o.Rows("public."+name), src), "table %s", name)
	}
	return o
}

// snapshotsTwice counts the backfilled rows the stream has twice with one version: a chunk
// written again after a restart (a row read again by a later chunk of a refresh has its own).
func snapshotsTwice(t *testing.T, addr tmnats.Address) int {
	t.Helper()
	var buf bytes.Buffer
	_, err := tmnats.WriteLines(context.Background(), addr, &buf)
	require.NoError(t, err)
	seen, twice := map[string]bool{}, 0
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var ev struct {
			Op, Table string
			Key       json.RawMessage
			After     struct{ Ver json.Number }
		}
		require.NoError(t, json.Unmarshal(l, &ev))
		if ev.Op == "refresh" || ev.Op == "truncate" {
			clear(seen)
		}
		if ev.Op != "snapshot" {
			continue
		}
		id := ev.Table + string(ev.Key) + ev.After.Ver.String()
		if seen[id] {
			twice++
		}
		seen[id] = true
	}
	return twice
}

func messages(t *testing.T, addr tmnats.Address) uint64 {
	t.Helper()
	nc, err := addr.Connect()
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := js.Stream(context.Background(), addr.Stream)
	require.NoError(t, err)
	info, err := st.Info(context.Background())
	require.NoError(t, err)
	return info.State.Msgs
}

func setup(db *e2e.TestDB) {
	db.Exec(`CREATE SEQUENCE ver`)
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text, ver bigint DEFAULT nextval('ver'))`)
	db.Exec(`CREATE TABLE b (id int PRIMARY KEY, ver bigint DEFAULT nextval('ver'))`)
	db.Exec(`INSERT INTO a (id, v) SELECT g, 'x' || g FROM generate_series(1, 100) g`)
	db.Exec(`INSERT INTO b (id) SELECT g FROM generate_series(1, 30) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE a, b`)
}

func changes(db *e2e.TestDB) {
	db.Exec(`UPDATE a SET v = 'y', ver = nextval('ver') WHERE id <= 50`)
	db.Exec(`DELETE FROM a WHERE id > 90`)
	db.Exec(`TRUNCATE b`)
	db.Exec(`INSERT INTO b (id) SELECT g FROM generate_series(100, 120) g`)
	db.Exec(`UPDATE a SET id = id + 1000, ver = nextval('ver') WHERE id = 7`)
	for range 5 {
		db.Exec(`UPDATE a SET ver = nextval('ver') WHERE id BETWEEN 60 AND 70`)
	}
}

// TestExactlyOnceAcrossRuns: runs stopped at each of their first checkpoints, after the stream
// took what they emitted (a kill after the publish, before the checkpoint), in the backfill and
// in the changes: the stream holds every event once, and replays to the source.
func TestExactlyOnceAcrossRuns(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	addr, _ := e2e.NATS(t)
	setup(db)
	// The backfill, stopped at its 2nd, 3rd, ... checkpoint: chunks in the stream past it.
	for n := 2; ; n++ {
		_, err := capture(t, db, addr, run{failAt: n, partitions: 3}, "a", "b")
		if err == nil {
			break
		}
		require.ErrorIs(t, err, errStop)
		if n == 3 {
			changes(db) // changes while the backfill is under way
		}
		require.Less(t, n, 100)
	}
	replay(t, db, addr, "a", "b")
	require.Zero(t, snapshotsTwice(t, addr), "a backfilled row the stream had was written again")

	// Changes of every kind; the run stops at its first checkpoint, after the stream took them.
	changes(db)
	before := messages(t, addr)
	emitted, err := capture(t, db, addr, run{failAt: 1, partitions: 3}, "a", "b")
	require.ErrorIs(t, err, errStop)
	require.Positive(t, emitted)
	require.Greater(t, messages(t, addr), before, "the stopped run's messages are not in the stream")
	_, err = capture(t, db, addr, run{partitions: 3}, "a", "b")
	require.NoError(t, err)
	replay(t, db, addr, "a", "b")
	require.Zero(t, snapshotsTwice(t, addr), "a backfilled row the stream had was written again")

	// The partitions the output was written with are kept.
	_, err = capture(t, db, addr, run{partitions: 2}, "a", "b")
	require.ErrorContains(t, err, "give --nats-partitions 3")
}

// TestAnotherHistory: messages past the checkpoint written in another history of the source (a
// restore to a base backup, where the same LSNs are other changes) are not taken for the events
// the run reads: nothing is passed over.
func TestAnotherHistory(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	addr, _ := e2e.NATS(t)
	setup(db)
	_, err := capture(t, db, addr, run{}, "a", "b")
	require.NoError(t, err)
	changes(db)
	before := messages(t, addr)
	_, err = capture(t, db, addr, run{failAt: 1, history: "restored"}, "a", "b")
	require.ErrorIs(t, err, errStop)
	written := messages(t, addr) - before
	require.Positive(t, written)
	// The same changes, read in the source's own history: none is passed over as written.
	_, err = capture(t, db, addr, run{failAt: 1}, "a", "b")
	require.ErrorIs(t, err, errStop)
	require.Equal(t, 2*written, messages(t, addr)-before)
}

// TestRefreshPastCheckpoint: a run re-backfilling a table stops with its changes in the stream
// past its checkpoint: when its refresh is in the stream, the next run starts the table over
// again by itself; when it stopped before its refresh (the other tables' changes in the stream,
// that table's held back), the next run, not asked to re-backfill it, reads changes the stream
// does not have: it stops, naming the table and the fix, and the run with the fix is exact.
func TestRefreshPastCheckpoint(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	addr, _ := e2e.NATS(t)
	setup(db)
	_, err := capture(t, db, addr, run{}, "a", "b")
	require.NoError(t, err)

	// Stopped past its refresh of b, at its first checkpoint.
	db.Exec(`BEGIN; UPDATE a SET ver = nextval('ver') WHERE id = 1; UPDATE b SET ver = nextval('ver') WHERE id = 1; UPDATE a SET ver = nextval('ver') WHERE id = 2; COMMIT`)
	_, err = capture(t, db, addr, run{failAt: 1, refresh: []string{"b"}}, "a", "b")
	require.ErrorIs(t, err, errStop)
	_, err = capture(t, db, addr, run{}, "a", "b")
	require.NoError(t, err)
	replay(t, db, addr, "a", "b")

	// Stopped before its refresh of b: b's change held back, a's written.
	db.Exec(`BEGIN; UPDATE a SET ver = nextval('ver') WHERE id = 3; UPDATE b SET ver = nextval('ver') WHERE id = 2; UPDATE a SET ver = nextval('ver') WHERE id = 4; COMMIT`)
	_, err = capture(t, db, addr, run{refresh: []string{"b"}, beforeRefresh: true}, "a", "b")
	require.ErrorIs(t, err, errStop)
	_, err = capture(t, db, addr, run{}, "a", "b")
	require.ErrorContains(t, err, "run the same command once with --rebackfill ")
	require.ErrorContains(t, err, "public.b")
	_, err = capture(t, db, addr, run{refresh: []string{"b"}}, "a", "b")
	require.NoError(t, err)
	replay(t, db, addr, "a", "b")
}

// TestSecondWriterFences: a second output opened on the same stream takes it over: the first
// one's next checkpoint fails, naming the cause, and its next message too.
func TestSecondWriterFences(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	addr, _ := e2e.NATS(t)
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY)`)
	ctx := context.Background()
	open := func() *tmnats.Sink {
		s, _, err := tmnats.Open(ctx, tmnats.Options{Address: addr, Tables: []string{"public.a"}, Slot: db.Slot,
			Types: pgjson.NewRegistry(db.Connect()), Log: zerolog.Nop()}, func() error { return nil })
		require.NoError(t, err)
		return s
	}
	first := open()
	defer first.Close(ctx)
	pos := &merge.Position{Version: merge.PositionVersion, LSN: 100, Slot: db.Slot, Tables: map[string]*merge.TableProgress{}}
	require.NoError(t, first.Checkpoint(ctx, pos))
	second := open()
	defer second.Close(ctx)
	err := first.Checkpoint(ctx, pos)
	require.ErrorContains(t, err, "another tidemark sync took over")
	require.NoError(t, second.Checkpoint(ctx, pos))
}

// TestRereadNotSkipped: with RereadPartial (Debezium's schemas), an update that leaves a TOASTed
// value out is no event: its row is read again. A run killed once the stream took such a row,
// before its checkpoint, is followed by an update of the same row: the next run reads the row
// again (both updates lack the value) and must write it, though the stream has a reading of the
// row past the checkpoint, older than this one.
func TestRereadNotSkipped(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	addr, _ := e2e.NATS(t)
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY, big text, ver bigint)`)
	db.Exec(`ALTER TABLE a ALTER COLUMN big SET STORAGE EXTERNAL`)
	db.Exec(`INSERT INTO a VALUES (1, repeat('x', 5000), 1)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE a`)
	_, err := capture(t, db, addr, run{reread: true}, "a")
	require.NoError(t, err)
	db.Exec(`UPDATE a SET ver = 2`)
	_, err = capture(t, db, addr, run{reread: true, afterSnapshot: true}, "a")
	require.ErrorIs(t, err, errStop)
	db.Exec(`UPDATE a SET ver = 3`)
	_, err = capture(t, db, addr, run{reread: true}, "a")
	require.NoError(t, err)
	replay(t, db, addr, "a")
}

// TestSkipEndsAtDelete: a row the stream has as backfilled past the checkpoint, then deleted
// and its key taken by another row moved onto it with its TOASTed value unchanged (the insert
// carries no value for it, so the engine reads the key again): that row must be written, not
// passed over as one the stream has with every change after it. The delete in the stream past
// the checkpoint (the run before wrote it) or only in the run (chaos, nats mode: "column big: no
// value in the output"). And a run that starts on a new slot (the one before failed before its
// first checkpoint and dropped the slot it had created) reads none of the stream's messages
// again, and the changes between the two runs are in no slot: nothing is passed over, and every
// table starts over with a refresh (row 2, which that run wrote and the move deleted, goes);
// also when the slot was made again by hand.
func TestSkipEndsAtDelete(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	setupKeyed := func(t *testing.T, keyType string) (*e2e.TestDB, tmnats.Address, func(string) func()) {
		db := e2e.NewTestDB(t, server)
		addr, _ := e2e.NATS(t)
		db.Exec(`CREATE TABLE a (id ` + keyType + ` PRIMARY KEY, big text, ver bigint)`)
		db.Exec(`ALTER TABLE a ALTER COLUMN big SET STORAGE EXTERNAL`)
		db.Exec(`INSERT INTO a SELECT i, repeat(i::text, 3000), 1 FROM generate_series(1, 60) i`)
		db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE a`)
		conn := db.Connect()
		exec := func(sql string) func() {
			return func() {
				_, err := conn.Exec(context.Background(), sql)
				require.NoError(t, err)
			}
		}
		return db, addr, exec
	}
	setup := func(t *testing.T) (*e2e.TestDB, tmnats.Address, func(string) func()) { return setupKeyed(t, "int") }
	// Chunks of 7 rows: the second (keys 8 to 14) is the one past the checkpoint.
	const move = `DELETE FROM a WHERE id = 8; UPDATE a SET id = 8, ver = 2 WHERE id = 9`
	t.Run("delete in the run", func(t *testing.T) {
		// The move inside the window of the chunk read again: its row 8 is not emitted there,
		// and the engine reads key 8 again on its own.
		db, addr, exec := setup(t)
		_, err := capture(t, db, addr, run{failAt: 2}, "a")
		require.ErrorIs(t, err, errStop)
		_, err = capture(t, db, addr, run{afterLow: exec(move)}, "a")
		require.NoError(t, err)
		replay(t, db, addr, "a")
	})
	t.Run("delete in the stream", func(t *testing.T) {
		// The move in the stream before the run stopped, and an update without the TOASTed
		// value inside the window of the chunk read again: the row goes out whole there (its
		// TOASTed value did not change inside the window), which is the engine's one read of
		// key 8 after the move.
		db, addr, exec := setup(t)
		_, err := capture(t, db, addr, run{then: exec(move)}, "a")
		require.ErrorIs(t, err, errStop)
		_, err = capture(t, db, addr, run{afterLow: exec(`UPDATE a SET ver = 3 WHERE id = 8`)}, "a")
		require.NoError(t, err)
		replay(t, db, addr, "a")
	})
	t.Run("delete of the key written otherwise", func(t *testing.T) {
		// A numeric key whose text changed (8 to 8.0: the same key under numeric's =) before its
		// delete: the delete names the key as 8.0, the row the stream has as backfilled as 8.
		// The skip set goes by the key, not by its text.
		db, addr, exec := setupKeyed(t, "numeric")
		_, err := capture(t, db, addr, run{then: exec(`UPDATE a SET id = 8.0, ver = 2 WHERE id = 8; DELETE FROM a WHERE id = 8; ` +
			`UPDATE a SET id = 8, ver = 3 WHERE id = 9`)}, "a")
		require.ErrorIs(t, err, errStop)
		_, err = capture(t, db, addr, run{afterLow: exec(`UPDATE a SET ver = 4 WHERE id = 8`)}, "a")
		require.NoError(t, err)
		replay(t, db, addr, "a")
	})
	// A new slot: made again by the next run, or by an operator before it (the run then did
	// not create it).
	for _, byHand := range []bool{false, true} {
		t.Run(map[bool]string{false: "new slot", true: "slot created again by hand"}[byHand], func(t *testing.T) {
			db, addr, exec := setup(t)
			_, err := capture(t, db, addr, run{failAt: 1}, "a")
			require.ErrorIs(t, err, errStop)
			exec(`DELETE FROM a WHERE id = 1; UPDATE a SET id = 1, ver = 2 WHERE id = 2`)()
			if byHand {
				exec(`SELECT pg_create_logical_replication_slot('` + db.Slot + `', 'pgoutput')`)()
			}
			_, err = capture(t, db, addr, run{}, "a")
			require.NoError(t, err)
			replay(t, db, addr, "a")
		})
	}
}

// TestFormatTakenWhileEmpty: a run in another format on an output whose stream holds nothing
// yet records its format before its first message (it is refused once the stream holds any):
// else a run killed before its first checkpoint would leave its messages under the checkpoint
// of the other format, and a run in that format would append to them.
func TestFormatTakenWhileEmpty(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	addr, _ := e2e.NATS(t)
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY)`)
	ctx := context.Background()
	open := func(dbz *debezium.Encoder) {
		s, _, err := tmnats.Open(ctx, tmnats.Options{Address: addr, Tables: []string{"public.a"}, Slot: db.Slot, Debezium: dbz,
			Types: pgjson.NewRegistry(db.Connect()), Log: zerolog.Nop()}, func() error { return nil })
		require.NoError(t, err)
		require.NoError(t, s.Close(ctx))
	}
	format := func() string {
		ck, err := tmnats.ReadCheckpoint(ctx, addr)
		require.NoError(t, err)
		return ck.Format
	}
	open(nil)
	require.Equal(t, "tidemark", format())
	dbz := debezium.NewEncoder(pgjson.NewRegistry(db.Connect()))
	open(dbz)
	require.Equal(t, dbz.Format(), format())
	open(nil)
	require.Equal(t, "tidemark", format())
}

// TestStreamRefused: a stream holding messages no checkpoint accounts for, a stream with other
// subjects, a stream the output wrote that was deleted, and another slot's checkpoint are
// refused before anything is written.
func TestStreamRefused(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	db := e2e.NewTestDB(t, server)
	ctx := context.Background()
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY, ver int)`)
	db.Exec(`INSERT INTO a VALUES (1, 1)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE a`)
	opts := func(addr tmnats.Address, slot string) tmnats.Options {
		return tmnats.Options{Address: addr, Tables: []string{"public.a"}, Slot: slot, Types: pgjson.NewRegistry(db.Connect()), Log: zerolog.Nop()}
	}
	client := func(addr tmnats.Address) jetstream.JetStream {
		nc, err := addr.Connect()
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		return js
	}
	ready := func() error { return nil }

	// Someone else's messages in the stream.
	addr, _ := e2e.NATS(t)
	js := client(addr)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: addr.Stream, Subjects: []string{addr.Stream + ".>"}})
	require.NoError(t, err)
	_, err = js.Publish(ctx, addr.Stream+".x", []byte("theirs"))
	require.NoError(t, err)
	_, _, err = tmnats.Open(ctx, opts(addr, db.Slot), ready)
	require.ErrorContains(t, err, "holds 1 messages that no checkpoint")

	// A stream of other subjects.
	addr, _ = e2e.NATS(t)
	_, err = client(addr).CreateStream(ctx, jetstream.StreamConfig{Name: addr.Stream, Subjects: []string{"orders.>"}})
	require.NoError(t, err)
	_, _, err = tmnats.Open(ctx, opts(addr, db.Slot), ready)
	require.ErrorContains(t, err, "it is not this output's")

	// The stream the output wrote, deleted: refused, not created again empty.
	addr, _ = e2e.NATS(t)
	_, err = capture(t, db, addr, run{}, "a")
	require.NoError(t, err)
	require.NoError(t, client(addr).DeleteStream(ctx, addr.Stream))
	_, _, err = tmnats.Open(ctx, opts(addr, db.Slot), ready)
	require.ErrorContains(t, err, "which this output wrote, is gone")

	// Another slot's checkpoint: refused before ready (the slot check) runs.
	addr, _ = e2e.NATS(t)
	_, err = capture(t, db, addr, run{}, "a")
	require.NoError(t, err)
	_, _, err = tmnats.Open(ctx, opts(addr, "another_slot"), func() error { t.Fatal("ready called"); return nil })
	require.ErrorContains(t, err, "holds the checkpoint of slot "+db.Slot)

	// A foreign message after the output's last: the output's next message fails.
	addr, _ = e2e.NATS(t)
	_, err = capture(t, db, addr, run{}, "a")
	require.NoError(t, err)
	s, _, err := tmnats.Open(ctx, opts(addr, db.Slot), ready)
	require.NoError(t, err)
	defer s.Close(ctx)
	_, err = client(addr).Publish(ctx, addr.Stream+".public.a.0", []byte("theirs"))
	require.NoError(t, err)
	db.Exec(`INSERT INTO a VALUES (2, 2)`)
	cfg := merge.Config{Source: replicator.Config{DSN: db.DSN, Slot: db.Slot, Publication: db.Publication, CreateSlot: true},
		AckCheckpoints: true, StopWhenCaughtUp: true, Tables: []merge.TableConfig{{Schema: "public", Name: "a"}}}
	eng, err := merge.New(cfg, s, zerolog.Nop())
	require.NoError(t, err)
	ck, err := tmnats.ReadCheckpoint(ctx, addr)
	require.NoError(t, err)
	err = eng.Run(ctx, ck.Position)
	require.ErrorContains(t, err, "another writer wrote to the stream")
}

// TestNodeKilled: a three-node cluster, the stream and the checkpoint bucket with three
// replicas; a node is killed while the sync runs, and started again. Runs that fail on it resume
// from their checkpoint; the stream holds every event once.
func TestNodeKilled(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	addr, c := e2e.NATS(t)
	if c == nil {
		t.Skip("a real cluster ($" + e2e.EnvNATS + ") is not disturbed")
	}
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE SEQUENCE ver`)
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text, ver bigint DEFAULT nextval('ver'))`)
	db.Exec(`INSERT INTO a (id, v) SELECT g, 'x' || g FROM generate_series(1, 3000) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE a`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var writes atomic.Int64
	done := make(chan struct{})
	go func() { // waited for below
		defer close(done)
		conn := db.Connect()
		for i := 0; ctx.Err() == nil; i++ {
			if _, err := conn.Exec(ctx, `UPDATE a SET ver = nextval('ver'), v = v || '.' WHERE id = $1`, 1+i*7%3000); err == nil {
				writes.Add(1)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	killed := make(chan struct{})
	go func() { // waited for below
		defer close(killed)
		// The stream's leader, then another node.
		for _, leader := range []bool{true, false} {
			time.Sleep(1500 * time.Millisecond)
			i := (c.Leader(addr.Stream) + 1) % 3
			if leader {
				i = max(c.Leader(addr.Stream), 0)
			}
			c.Kill(i)
			time.Sleep(3 * time.Second)
			if err := c.Restart(i); err != nil {
				t.Errorf("restart node %d: %v", i, err)
			}
		}
	}()
	failures := 0
	deadline := time.Now().Add(2 * time.Minute)
	for ctx.Err() == nil {
		select {
		case <-killed:
			cancel() // the last runs catch up with the writes
		default:
		}
		if _, err := capture(t, db, addr, run{partitions: 2, replicas: 3}, "a"); err != nil {
			failures++
			t.Logf("run failed (a node down): %v", err)
			require.NotContains(t, err.Error(), "duplicate")
			time.Sleep(500 * time.Millisecond)
		}
		require.True(t, time.Now().Before(deadline), "the sync did not get through the node faults")
	}
	<-done
	<-killed
	_, err := capture(t, db, addr, run{partitions: 2, replicas: 3}, "a")
	require.NoError(t, err)
	t.Logf("%d updates, %d runs failed on a node down", writes.Load(), failures)
	replay(t, db, addr, "a")
}

// TestParseURL: the URL's forms, and mistakes refused with what to write, never with the
// password.
func TestParseURL(t *testing.T) {
	a, err := tmnats.ParseURL("nats://n1:4222,n2:4223/shop")
	require.NoError(t, err)
	require.Equal(t, []string{"n1:4222", "n2:4223"}, a.Servers)
	require.Equal(t, "shop", a.Stream)
	a, err = tmnats.ParseURL("nats://app:s3cret@n1:4222/shop?tls=true")
	require.NoError(t, err)
	require.Equal(t, "s3cret", a.Password)
	require.True(t, a.TLS)
	t.Setenv(tmnats.PasswordEnv, "fromenv")
	a, err = tmnats.ParseURL("nats://app@n1:4222/shop")
	require.NoError(t, err)
	require.Equal(t, "fromenv", a.Password)
	for _, bad := range []struct{ url, want string }{
		{"nats://n1/shop", "HOST:PORT"},
		{"nats://n1:4222/", "stream's name"},
		{"nats://n1:4222/a.b", "stream's name"},
		{"nats://app:s3cret@n1:4222/shop?creds=x.creds", "one way to log in"},
		{"nats://app:s3cret@n1:4222/shop?tls-cert=c.pem", "both tls-cert and tls-key"},
		{"nats://app:s3cret@n1:4222/shop?tls=maybe", "tls="},
		{"nats://n1:4222/shop?acks=1", "unknown option"},
	} {
		_, err := tmnats.ParseURL(bad.url)
		require.ErrorContains(t, err, bad.want, bad.url)
		require.NotContains(t, err.Error(), "s3cret", bad.url)
	}
	require.Equal(t, "nats://app:xxxxx@n1:4222/shop", tmnats.Redact("nats://app:s3cret@n1:4222/shop"))
}

// TestBroadcastEncodeFails: a truncate (or a refresh) whose line cannot be encoded (its column
// types not readable: the source connection lost, say) fails the batch with the encoder's
// error. It panicked ("slice bounds out of range [:-1]") in a 10-minute chaos run: the line was
// cut before the error was looked at.
func TestBroadcastEncodeFails(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	ctx := context.Background()
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY)`)
	c, err := e2e.StartNATSCluster(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(c.Shutdown)
	addr := tmnats.Address{Servers: c.Addrs(), Stream: "encode_fails"}
	conn := db.Connect()
	s, _, err := tmnats.Open(ctx, tmnats.Options{Address: addr, Tables: []string{"public.a"}, Slot: db.Slot,
		Types: pgjson.NewRegistry(conn), Log: zerolog.Nop()}, func() error { return nil })
	require.NoError(t, err)
	defer s.Close(ctx)
	require.NoError(t, conn.Close(ctx)) // the types can no longer be read
	cols := &merge.Columns{Schema: "public", Table: "a", Names: []string{"id"}, Types: []uint32{23}, TypeMods: []int32{-1}, Key: []int{0}}
	for _, op := range []merge.Op{merge.Truncate, merge.Refresh} {
		var err error
		require.NotPanics(t, func() { err = s.Emit(ctx, []merge.Event{{Op: op, Columns: cols, LSN: 0x1000000}}) }, "%s", op)
		require.Error(t, err, "%s", op)
		require.ErrorContains(t, err, "conn closed", "%s: the encoder's error", op)
	}
}
