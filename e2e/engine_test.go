package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
)

// memSink keeps the engine's output in memory and replays it through an oracle.
type memSink struct {
	oracle *e2e.Oracle

	mu          sync.Mutex
	records     []e2e.Record
	checkpoints []*merge.Position
}

func newMemSink() *memSink { return &memSink{oracle: e2e.NewOracle("ver")} }

// toRecord turns an engine event into the oracle's record.
func toRecord(ev merge.Event) e2e.Record {
	r := e2e.Record{Table: ev.Columns.Schema + "." + ev.Columns.Table, Op: ev.Op.String(), LSN: uint64(ev.LSN), Seq: ev.Seq}
	if ev.Op == merge.Truncate || ev.Op == merge.Refresh {
		return r
	}
	var key []string
	for _, k := range ev.Columns.Key {
		key = append(key, string(ev.Col(k).Data))
	}
	r.Key = strings.Join(key, e2e.KeySep)
	if ev.Op == merge.Delete {
		return r
	}
	r.Values = map[string]*string{}
	for i, name := range ev.Columns.Names {
		switch v := ev.Col(i); v.Kind {
		case replicator.Null:
			r.Values[name] = nil
		case replicator.Text:
			s := string(v.Data)
			r.Values[name] = &s
		case replicator.Unchanged:
			r.Unchanged = append(r.Unchanged, name)
		}
	}
	return r
}

func (s *memSink) Emit(_ context.Context, evs []merge.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range evs {
		r := toRecord(ev)
		s.records = append(s.records, r)
		s.oracle.Apply(r)
	}
	return nil
}

func (s *memSink) Checkpoint(_ context.Context, pos *merge.Position) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checkpoints = append(s.checkpoints, pos)
	return nil
}

// of returns the records of one key of table, in output order.
func (s *memSink) of(table, key string) []e2e.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []e2e.Record
	for _, r := range s.records {
		if r.Table == table && r.Key == key {
			out = append(out, r)
		}
	}
	return out
}

func (s *memSink) count(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.records {
		if r.Op == op {
			n++
		}
	}
	return n
}

func (s *memSink) last() *merge.Position {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.checkpoints) == 0 {
		return nil
	}
	return s.checkpoints[len(s.checkpoints)-1]
}

func ops(rs []e2e.Record) []string {
	var out []string
	for _, r := range rs {
		s := r.Op
		if v := r.Values["v"]; v != nil {
			s += ":" + *v
		}
		out = append(out, s)
	}
	return out
}

// engineConfig is the test default: small chunks, quick checkpoints, and a bounded run.
func engineConfig(db *e2e.TestDB, tables ...string) merge.Config {
	cfg := merge.Config{
		Source:             replicator.Config{DSN: db.DSN, Slot: db.Slot, Publication: db.Publication, CreateSlot: true, StatusInterval: 200 * time.Millisecond},
		ChunkSize:          10,
		CheckpointInterval: 100 * time.Millisecond,
		StopWhenCaughtUp:   true,
		WatermarkTimeout:   5 * time.Second,
	}
	for _, t := range tables {
		schema, name, _ := strings.Cut(t, ".")
		cfg.Tables = append(cfg.Tables, merge.TableConfig{Schema: schema, Name: name})
	}
	return cfg
}

// runEngine runs the engine to completion (StopWhenCaughtUp) into sink.
func runEngine(t *testing.T, cfg merge.Config, sink merge.Sink, from *merge.Position) error {
	t.Helper()
	eng, err := merge.New(cfg, sink, testLogger(t))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return eng.Run(ctx, from)
}

// verify checks the oracle's replay of table against the source and that no invariant broke.
func verify(t *testing.T, db *e2e.TestDB, sink *memSink, table string, key ...string) {
	t.Helper()
	schema, name, _ := strings.Cut(table, ".")
	src, err := e2e.SourceRows(context.Background(), db.DSN, schema, name, key)
	require.NoError(t, err)
	require.Empty(t, e2e.Diff(sink.oracle.Rows(table), src), "the output does not replay to the source")
	require.Empty(t, sink.oracle.Violations())
}

// versionedTable makes t(id int primary key, v text, ver bigint) with n rows, ids step apart,
// and a publication for it; every write takes a new ver from a sequence.
func versionedTable(t *testing.T, db *e2e.TestDB, n, step int) {
	t.Helper()
	db.Exec(`CREATE SEQUENCE ver`)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text, ver bigint NOT NULL DEFAULT nextval('ver'))`)
	db.Exec(`INSERT INTO t (id, v) SELECT g * $2, 'v' || g * $2 FROM generate_series(1, $1) g`, n, step)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE t`)
}

// onChunk returns a hook that runs sql (on its own connection) when chunk id reaches the hook.
func onChunk(t *testing.T, db *e2e.TestDB, id int64, sqls ...string) func(context.Context, int64) {
	conn := db.Connect()
	var once sync.Once
	return func(ctx context.Context, chunk int64) {
		if chunk != id {
			return
		}
		once.Do(func() {
			for _, s := range sqls {
				if _, err := conn.Exec(ctx, s); err != nil {
					t.Errorf("hook of chunk %d: %q: %v", chunk, s, err)
				}
			}
		})
	}
}

const upd = `UPDATE t SET v = '%s', ver = nextval('ver') WHERE id = %d`

// TestBackfillOnly: with no concurrent changes, every row arrives once as a snapshot row, and
// the checkpoints end with the backfill done.
func TestBackfillOnly(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 95, 1)
	sink := newMemSink()
	require.NoError(t, runEngine(t, engineConfig(db, "public.t"), sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.Equal(t, 95, sink.count("snapshot"))
	require.Zero(t, sink.oracle.Duplicates())
	p := sink.last().Tables["public.t"]
	require.True(t, p.Done)
	require.Equal(t, int64(95), p.Rows)
	require.Equal(t, []string{"95"}, p.MaxKey)
	require.Equal(t, []string{"id"}, p.Key)
}

// TestUpdateBetweenLowAndSelect: the chunk row is evicted, the update emitted once.
func TestUpdateBetweenLowAndSelect(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 30, 1)
	cfg := engineConfig(db, "public.t")
	cfg.Hooks.AfterLow = onChunk(t, db, 1, fmt.Sprintf(upd, "new", 5))
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.Equal(t, []string{"update:new"}, ops(sink.of("public.t", "5")))
}

// TestUpdateBetweenSelectAndHigh: the chunk read the old row; the update inside the window
// evicts it.
func TestUpdateBetweenSelectAndHigh(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 30, 1)
	cfg := engineConfig(db, "public.t")
	cfg.Hooks.AfterSelect = onChunk(t, db, 1, fmt.Sprintf(upd, "new", 5))
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.Equal(t, []string{"update:new"}, ops(sink.of("public.t", "5")))
}

// TestUpdateBeforeLow: the update precedes the window; the chunk row, read after it, carries
// the same version (a duplicate, counted).
func TestUpdateBeforeLow(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 30, 1)
	cfg := engineConfig(db, "public.t")
	cfg.Hooks.BeforeLow = onChunk(t, db, 1, fmt.Sprintf(upd, "new", 5))
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.Equal(t, []string{"update:new", "snapshot:new"}, ops(sink.of("public.t", "5")))
	require.Equal(t, 1, sink.oracle.Duplicates())
}

// TestDeleteInsideWindow: no snapshot row after the delete; the key stays gone.
func TestDeleteInsideWindow(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 30, 1)
	cfg := engineConfig(db, "public.t")
	cfg.Hooks.AfterSelect = onChunk(t, db, 1, `DELETE FROM t WHERE id = 5`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.Equal(t, []string{"delete"}, ops(sink.of("public.t", "5")))
}

// TestDeleteThenInsertInsideWindow: in separate transactions and in one.
func TestDeleteThenInsertInsideWindow(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 30, 1)
	cfg := engineConfig(db, "public.t")
	cfg.Hooks.AfterSelect = onChunk(t, db, 1,
		`DELETE FROM t WHERE id = 5`, `INSERT INTO t (id, v) VALUES (5, 'again')`,
		`BEGIN; DELETE FROM t WHERE id = 6; INSERT INTO t (id, v) VALUES (6, 'again'); COMMIT`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.Equal(t, []string{"delete", "insert:again"}, ops(sink.of("public.t", "5")))
	require.Equal(t, []string{"delete", "insert:again"}, ops(sink.of("public.t", "6")))
}

// TestInsertInsideWindow: a new key inside the chunk's range, seen by the SELECT: the insert
// is emitted and the chunk's copy evicted.
func TestInsertInsideWindow(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 30, 2)
	cfg := engineConfig(db, "public.t")
	cfg.Hooks.AfterLow = onChunk(t, db, 1, `INSERT INTO t (id, v) VALUES (5, 'new')`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.Equal(t, []string{"insert:new"}, ops(sink.of("public.t", "5")))
}

// TestInsertUpdateDeleteInOneTransaction: the key ends absent and is never snapshotted.
func TestInsertUpdateDeleteInOneTransaction(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 30, 2)
	cfg := engineConfig(db, "public.t")
	cfg.Hooks.AfterLow = onChunk(t, db, 1,
		`BEGIN; INSERT INTO t (id, v) VALUES (5, 'a'); UPDATE t SET v = 'b', ver = nextval('ver') WHERE id = 5; DELETE FROM t WHERE id = 5; COMMIT`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.Equal(t, []string{"insert:a", "update:b", "delete"}, ops(sink.of("public.t", "5")))
}

// TestKeyMovesBehindCursor: a key update moves a row from the unscanned range to the scanned
// one between chunks: delete of the old key, insert of the new; no chunk finds the old key.
func TestKeyMovesBehindCursor(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 40, 2)
	cfg := engineConfig(db, "public.t")
	cfg.Hooks.BeforeLow = onChunk(t, db, 3, `UPDATE t SET id = 3, ver = nextval('ver') WHERE id = 70`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.Equal(t, []string{"delete"}, ops(sink.of("public.t", "70")))
	require.Equal(t, []string{"insert:v70"}, ops(sink.of("public.t", "3")))
}

// TestKeyMovesAheadOfCursor: a row moves from the scanned range to the unscanned one: the
// later chunk reads the new key and emits it again after the event (a duplicate, same value).
func TestKeyMovesAheadOfCursor(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 40, 2)
	cfg := engineConfig(db, "public.t")
	cfg.Hooks.BeforeLow = onChunk(t, db, 3, `UPDATE t SET id = 71 WHERE id = 2`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.Equal(t, []string{"snapshot:v2", "delete"}, ops(sink.of("public.t", "2")))
	require.Equal(t, []string{"insert:v2", "snapshot:v2"}, ops(sink.of("public.t", "71")))
}

// spanningTxn configures hooks for a transaction that updates key 5 before the first low
// watermark and commits at the hook that setCommit installs.
func spanningTxn(t *testing.T, db *e2e.TestDB, cfg *merge.Config, setCommit func(*merge.Hooks, func(context.Context, int64))) {
	conn := db.Connect()
	var begin, commit sync.Once
	cfg.Hooks.BeforeLow = func(ctx context.Context, _ int64) {
		begin.Do(func() {
			if _, err := conn.Exec(ctx, `BEGIN; `+fmt.Sprintf(upd, "new", 5)); err != nil {
				t.Errorf("begin: %v", err)
			}
		})
	}
	setCommit(&cfg.Hooks, func(ctx context.Context, _ int64) {
		commit.Do(func() {
			if _, err := conn.Exec(ctx, `COMMIT`); err != nil {
				t.Errorf("commit: %v", err)
			}
		})
	})
}

// TestTransactionFromBeforeLowCommitsInsideWindow: the transaction's changes have LSNs before
// the low watermark, but it commits inside the window, so it evicts (window membership is by
// commit order).
func TestTransactionFromBeforeLowCommitsInsideWindow(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 30, 1)
	cfg := engineConfig(db, "public.t")
	spanningTxn(t, db, &cfg, func(h *merge.Hooks, f func(context.Context, int64)) { h.AfterSelect = f })
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.Equal(t, []string{"update:new"}, ops(sink.of("public.t", "5")))
}

// TestTransactionFromBeforeLowCommitsAfterHigh: the chunk row (old value) is emitted at the
// high watermark, then the transaction's update, at a higher position: a destination that keeps
// the row with the highest position ends with the new value.
func TestTransactionFromBeforeLowCommitsAfterHigh(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 30, 1)
	cfg := engineConfig(db, "public.t")
	spanningTxn(t, db, &cfg, func(h *merge.Hooks, f func(context.Context, int64)) { h.AfterHigh = f })
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	rs := sink.of("public.t", "5")
	require.Equal(t, []string{"snapshot:v5", "update:new"}, ops(rs))
	require.Greater(t, rs[1].LSN, rs[0].LSN, "the update ranks above the snapshot row")
}
