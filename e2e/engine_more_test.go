package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/watermark"
)

// background runs fn in a goroutine until stop is called; stop waits for it.
func background(t *testing.T, fn func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		fn(ctx)
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// catchUp runs the engine again from the last checkpoint until it has caught up with the
// source, after a workload stopped.
func catchUp(t *testing.T, cfg merge.Config, sink *memSink) {
	t.Helper()
	cfg.Source.CreateSlot = false
	require.NoError(t, runEngine(t, cfg, sink, sink.last()))
}

// TestVisibilityAnomaly reproduces the visibility anomaly deterministically: a synchronous
// standby that does not exist makes an application transaction stream (its commit record is
// flushed) long before it becomes visible. The chunk read meanwhile misses it although the
// transaction came before the low watermark in the stream. With the guard the chunk is rejected
// and retried, and the output is right; without the guard the stale row wins.
func TestVisibilityAnomaly(t *testing.T) {
	e2e.NeedsOwned(t, server, "changes synchronous_standby_names on the server")
	for _, guard := range []bool{true, false} {
		t.Run(fmt.Sprintf("guard=%v", guard), func(t *testing.T) {
			diff, violations, rejected := runE14(t, !guard)
			if guard {
				require.Empty(t, diff)
				require.Empty(t, violations)
				require.True(t, rejected, "the guard rejected the chunk")
			} else {
				require.NotEmpty(t, diff, "without the guard the stale chunk row overwrites the update")
				require.NotEmpty(t, violations)
			}
		})
	}
}

// standbyNames returns a function that sets synchronous_standby_names on the server through
// admin and reloads its configuration; the setting is cleared again when the test ends.
func standbyNames(t *testing.T, admin *pgx.Conn) func(names string) {
	set := func(names string) {
		ctx := context.Background()
		_, err := admin.Exec(ctx, fmt.Sprintf(`ALTER SYSTEM SET synchronous_standby_names = '%s'`, names))
		require.NoError(t, err)
		_, err = admin.Exec(ctx, `SELECT pg_reload_conf()`)
		require.NoError(t, err)
	}
	t.Cleanup(func() { set("") })
	return set
}

func runE14(t *testing.T, noGuard bool) (diff string, violations []string, rejected bool) {
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 30, 1)
	admin := db.Connect()
	ctx := context.Background()
	setSync := standbyNames(t, admin)

	app := db.Connect()
	t1Done := make(chan error, 1)
	var releaseOnce sync.Once
	release := func() {
		releaseOnce.Do(func() {
			setSync("")
			select {
			case err := <-t1Done:
				if err != nil {
					t.Errorf("the application transaction: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("the application transaction never finished")
			}
		})
	}
	cfg := engineConfig(db, "public.t")
	cfg.ChunkSize = 100
	cfg.WatermarkTimeout = 300 * time.Millisecond
	if noGuard {
		breakGuard(t, &cfg)
	}
	var chunks atomic.Int64
	cfg.Hooks.BeforeLow = func(ctx context.Context, id int64) {
		switch chunks.Add(1) {
		case 1:
			setSync("nonexistent_standby")
			time.Sleep(200 * time.Millisecond) // the reload reaches new sessions
			go func() {
				_, err := app.Exec(context.Background(), fmt.Sprintf(upd, "new", 5))
				t1Done <- err
			}()
			// Hooks run on the engine's goroutines: no t.Fatal here.
			deadline := time.Now().Add(10 * time.Second)
			for {
				var n int
				err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND query LIKE 'UPDATE t %'`).Scan(&n)
				if err == nil && n == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("the update does not wait for the standby (%v)", err)
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		default:
			if !noGuard {
				rejected = true
				release()
			}
		}
	}
	if noGuard {
		// At the first chunk that reaches its high watermark: on a loaded machine the first one
		// may time out on its watermark (WatermarkTimeout) and be read again, still without the
		// update (one CI run released at the second chunk's start instead, and met no anomaly).
		cfg.Hooks.AfterHigh = func(context.Context, int64) { release() }
	}
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	src, err := e2e.SourceRows(ctx, db.DSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	return e2e.Diff(sink.oracle.Rows("public.t"), src), sink.oracle.Violations(), rejected
}

// TestAppendsDuringBackfill: with inserts at the tail all along, the backfill ends at the key
// it captured at its start; later rows arrive as inserts.
func TestAppendsDuringBackfill(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE SEQUENCE ver`)
	db.Exec(`CREATE TABLE t (id bigserial PRIMARY KEY, v text, ver bigint NOT NULL DEFAULT nextval('ver'))`)
	db.Exec(`INSERT INTO t (v) SELECT 'x' FROM generate_series(1, 500)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE t`)
	conn := db.Connect()
	stop := background(t, func(ctx context.Context) {
		for ctx.Err() == nil {
			_, _ = conn.Exec(ctx, `INSERT INTO t (v) VALUES ('tail')`)
		}
	})
	cfg := engineConfig(db, "public.t")
	cfg.ChunkSize = 20
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	stop()
	catchUp(t, cfg, sink)
	verify(t, db, sink, "public.t", "id")
	p := sink.last().Tables["public.t"]
	maxKey, _ := strconv.Atoi(p.MaxKey[0])
	require.GreaterOrEqual(t, maxKey, 500)
	for _, r := range sink.records {
		if r.Op == "snapshot" {
			id, _ := strconv.Atoi(r.Key)
			require.LessOrEqual(t, id, maxKey, "no chunk reads past the bound captured at the start")
		}
	}
	var last int
	require.NoError(t, db.Conn.QueryRow(context.Background(), `SELECT max(id) FROM t`).Scan(&last))
	require.Greater(t, last, maxKey, "rows kept coming after the bound was captured")
	require.Greater(t, sink.count("insert"), 0)
}

// TestCopyInsideWindow: a COPY (one multi-insert: many changes share LSNs) inside a window
// evicts every key it touches.
func TestCopyInsideWindow(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 50, 10000)
	conn := db.Connect()
	cfg := engineConfig(db, "public.t")
	var once sync.Once
	cfg.Hooks.AfterLow = func(ctx context.Context, id int64) {
		once.Do(func() {
			rows := make([][]any, 5000)
			for i := range rows {
				rows[i] = []any{int32(i + 1), "copied"}
			}
			_, err := conn.CopyFrom(ctx, pgx.Identifier{"t"}, []string{"id", "v"}, pgx.CopyFromRows(rows))
			require.NoError(t, err)
		})
	}
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	for i := 1; i <= 10; i++ {
		require.Equal(t, []string{"insert:copied"}, ops(sink.of("public.t", strconv.Itoa(i))), "key %d was in the first chunk", i)
	}
}

// TestLowWatermarkFails: the chunk is withdrawn before its SELECT and retried with a new id;
// nothing is emitted twice. A low watermark written alone (the table's first chunk), and one
// written with the previous chunk's high watermark (I22: the pair fails, so the previous chunk
// is withdrawn too, and redone).
func TestLowWatermarkFails(t *testing.T) {
	t.Parallel()
	for _, id := range []int64{1, 2} {
		t.Run(fmt.Sprintf("L%d", id), func(t *testing.T) {
			db := e2e.NewTestDB(t, server)
			versionedTable(t, db, 30, 1)
			var selected []int64
			cfg := engineConfig(db, "public.t")
			cfg.Watermarks = watermark.Table
			failMarks(t, &cfg, func(m watermark.Mark) bool { return m.Kind == watermark.Low && m.ID == id })
			cfg.Hooks.AfterSelect = func(_ context.Context, id int64) { selected = append(selected, id) }
			sink := newMemSink()
			require.NoError(t, runEngine(t, cfg, sink, nil))
			verify(t, db, sink, "public.t", "id")
			require.Equal(t, 30, sink.count("snapshot"))
			require.NotContains(t, selected, id, "no SELECT for the chunk whose low watermark failed")
		})
	}
}

// TestHighWatermarkFails: a high watermark that fails once is written again with the same
// chunk id; one that keeps failing abandons the chunk, which is redone; no row is emitted twice.
func TestHighWatermarkFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		times     int // how many writes of chunk 2's high watermark fail
		snapshots int // the row updated inside chunk 2's window is read again when chunk 2 is redone
	}{
		{"once", 1, 29},
		{"always", 1 << 30, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := e2e.NewTestDB(t, server)
			versionedTable(t, db, 30, 1)
			cfg := engineConfig(db, "public.t")
			cfg.Watermarks = watermark.Table
			failed := 0
			failMarks(t, &cfg, func(m watermark.Mark) bool {
				if m.Kind == watermark.High && m.ID == 2 && failed < tc.times {
					failed++
					return true
				}
				return false
			})
			cfg.Hooks.AfterSelect = onChunk(t, db, 2, fmt.Sprintf(upd, "new", 15))
			sink := newMemSink()
			require.NoError(t, runEngine(t, cfg, sink, nil))
			verify(t, db, sink, "public.t", "id")
			require.Equal(t, tc.snapshots, sink.count("snapshot"))
			if tc.snapshots == 29 {
				require.Equal(t, []string{"update:new"}, ops(sink.of("public.t", "15")))
			} else {
				require.Equal(t, []string{"update:new", "snapshot:new"}, ops(sink.of("public.t", "15")))
			}
		})
	}
}

// TestHighWatermarkTwice: a high watermark seen twice (a retried write whose first commit
// succeeded) acts once.
func TestHighWatermarkTwice(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 30, 1)
	cfg := engineConfig(db, "public.t")
	cfg.Watermarks = watermark.Table
	// Chunk 2's high watermark again (its transaction may also have carried chunk 3's low one).
	cfg.Hooks.AfterHigh = onChunk(t, db, 2, `UPDATE tidemark_signal SET kind = 'H', chunk = 2, written_at = now()`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.Equal(t, 30, sink.count("snapshot"))
	require.Zero(t, sink.oracle.Duplicates())
}

// TestForeignWatermarks: two engines with their own slots share the signal table, and a mark
// of the same slot from another run shows up inside a window: each engine ignores marks that
// are not its own.
func TestForeignWatermarks(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 60, 1)
	db.Exec(`CREATE PUBLICATION other FOR TABLE t`)
	a := engineConfig(db, "public.t")
	a.Watermarks = watermark.Table
	a.Hooks.AfterLow = onChunk(t, db, 2, fmt.Sprintf(`UPDATE tidemark_signal SET run = 'intruder', kind = 'H', chunk = 2 WHERE slot = '%s'`, db.Slot))
	b := engineConfig(db, "public.t")
	b.Watermarks = watermark.Table
	b.Source.Slot, b.Source.Publication = db.Slot+"_b", "other"
	b.ChunkSize = 7
	sa, sb := newMemSink(), newMemSink()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, run := range []struct {
		cfg  merge.Config
		sink *memSink
	}{{a, sa}, {b, sb}} {
		wg.Go(func() {
			errs[i] = runEngine(t, run.cfg, run.sink, nil)
		})
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	for _, s := range []*memSink{sa, sb} {
		verify(t, db, s, "public.t", "id")
		require.Equal(t, 60, s.count("snapshot"))
	}
}

// TestICUTextKey: a text key under an ICU collation, read one row per chunk: no key skipped
// or repeated; ordering is PostgreSQL's.
func TestICUTextKey(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE SEQUENCE ver`)
	db.Exec(`CREATE TABLE t (k text COLLATE "en-x-icu" PRIMARY KEY, v text, ver bigint NOT NULL DEFAULT nextval('ver'))`)
	keys := []string{"a", "B", "b", "é", "e\u0301", " a", "-a", "a-b", "ab", "Z", "ß", "ss"}
	for _, k := range keys {
		db.Exec(`INSERT INTO t (k, v) VALUES ($1, $1)`, k)
	}
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE t`)
	cfg := engineConfig(db, "public.t")
	cfg.ChunkSize, cfg.ChunkGrowth = 1, 1 // one key per chunk: every key boundary crossed
	cfg.Hooks.AfterSelect = onChunk(t, db, 3, `UPDATE t SET v = 'changed', ver = nextval('ver') WHERE k = 'ß'`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "k")
	seen := map[string]int{}
	for _, r := range sink.records {
		if r.Op == "snapshot" {
			seen[r.Key]++
		}
	}
	for _, k := range keys {
		require.LessOrEqual(t, seen[k], 1, "key %q read twice", k)
	}
	require.Equal(t, int64(len(keys)+1), sink.last().Tables["public.t"].Chunks, "one chunk per key, and the last one finds nothing")
}

// TestCompositeKeyTypesAndTimeZone: a composite key of uuid, timestamptz and numeric, on a
// database whose default TimeZone is not UTC: keys read by the chunk and by the stream are
// equal, so an update inside the window evicts the chunk's row.
func TestCompositeKeyTypesAndTimeZone(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`ALTER DATABASE ` + db.Name + ` SET TimeZone = 'Asia/Kolkata'`)
	db.Exec(`CREATE SEQUENCE ver`)
	db.Exec(`CREATE TABLE t (tenant uuid, created timestamptz, seq numeric, v text, ver bigint NOT NULL DEFAULT nextval('ver'), PRIMARY KEY (tenant, created, seq))`)
	db.Exec(`INSERT INTO t (tenant, created, seq, v)
		SELECT md5(g::text)::uuid, '2024-01-01 00:00:00+05:30'::timestamptz + g * interval '1 hour 1.5 second', g / 10.0 + 1.10, 'v' || g
		FROM generate_series(1, 40) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE t`)
	conn := db.Connect()
	var tenant, created, seq string
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT tenant::text, created::text, seq::text FROM t ORDER BY tenant, created, seq OFFSET 3 LIMIT 1`).Scan(&tenant, &created, &seq))
	cfg := engineConfig(db, "public.t")
	cfg.Hooks.AfterSelect = onChunk(t, db, 1, fmt.Sprintf(`UPDATE t SET v = 'new', ver = nextval('ver') WHERE tenant = '%s' AND created = '%s' AND seq = %s`, tenant, created, seq))
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "tenant", "created", "seq")
	var key string
	for _, r := range sink.records {
		if r.Op == "update" {
			key = r.Key
		}
	}
	require.True(t, strings.HasPrefix(key, tenant), "the update's key %q is the row's", key)
	require.Equal(t, []string{"update:new"}, ops(sink.of("public.t", key)), "the chunk's copy was evicted")
}

// TestFloatAndNumericBoundaries: NaN, the infinities and -0 as chunk boundaries round-trip.
func TestFloatAndNumericBoundaries(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE SEQUENCE ver`)
	db.Exec(`CREATE TABLE f (k float8 PRIMARY KEY, ver bigint NOT NULL DEFAULT nextval('ver'))`)
	db.Exec(`INSERT INTO f (k) VALUES ('-Infinity'), (-1.5), ('-0'), (1e-300), (0.1), (1e300), ('Infinity'), ('NaN')`)
	db.Exec(`CREATE TABLE n (k numeric PRIMARY KEY, ver bigint NOT NULL DEFAULT nextval('ver'))`)
	db.Exec(`INSERT INTO n (k) VALUES ('-Infinity'), (-1.50), (0.000), (1.10), (123456789012345678901234567890.123456789), ('Infinity'), ('NaN')`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE f, n`)
	cfg := engineConfig(db, "public.f", "public.n")
	cfg.ChunkSize, cfg.ChunkGrowth = 1, 1 // one key per chunk: every key boundary crossed
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.f", "k")
	verify(t, db, sink, "public.n", "k")
	require.Equal(t, 15, sink.count("snapshot"))
	require.Zero(t, sink.oracle.Duplicates())
}

// TestColumnAddedInsideWindow: ALTER TABLE ADD COLUMN (and a change that brings the new
// Relation) inside a window: the chunk is abandoned and read again with the new column; events
// before and after carry their own columns.
func TestColumnAddedInsideWindow(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 40, 1)
	cfg := engineConfig(db, "public.t")
	cfg.Hooks.AfterSelect = onChunk(t, db, 2, `ALTER TABLE t ADD COLUMN c int DEFAULT 7`, fmt.Sprintf(upd, "new", 35))
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	// Rows emitted before the ALTER cannot have the new column (no row event exists for it);
	// every row emitted after it has the column.
	altered := false
	for _, r := range sink.records {
		if r.Op == "update" {
			altered = true
			require.Equal(t, "7", *r.Values["c"])
		}
		if altered && r.Op == "snapshot" {
			require.Contains(t, r.Values, "c", "snapshot row %s after the ALTER lacks the new column", r.Key)
		}
	}
	require.True(t, altered)
	src, err := e2e.SourceRows(context.Background(), db.DSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	got := sink.oracle.Rows("public.t")
	for k, row := range src {
		require.Equal(t, *row["ver"], *got[k]["ver"], "key %s", k)
	}
	require.Len(t, got, len(src))
	require.Empty(t, sink.oracle.Violations())
}

// workload runs a random mix of transactions on t(id, v, ver) until stopped: inserts, updates,
// deletes, primary-key updates, multi-row updates, several statements per transaction, with
// workloadPause between transactions.
func workload(t *testing.T, db *e2e.TestDB, seed uint64, maxID int) func() {
	return workloadWith(t, db, seed, maxID, "", workloadPause)
}

// workloadPause is the pause between the transactions of workload: at most 200 a second.
// Unbounded, a test's workload takes all the machine gives, and the server, the capture and the
// replay follow it, so that a test's cost grew with the machine's speed and the tests beside it
// slowed (TestKafkaCrashPoints: 32 CPU s unbounded, 18 at 5 ms, alone). TestBackfillWhileLive200k,
// the test of a dense workload against a long backfill, runs unbounded.
const workloadPause = 5 * time.Millisecond

// workloadWith is workload with an extra statement at the end of every transaction ("" for
// none) and a pause between transactions.
func workloadWith(t *testing.T, db *e2e.TestDB, seed uint64, maxID int, extra string, pause time.Duration) func() {
	conn := db.Connect()
	r := rand.New(rand.NewPCG(seed, seed+1))
	return background(t, func(ctx context.Context) {
		for ctx.Err() == nil {
			var stmts []string
			for range 1 + r.IntN(4) {
				id := 1 + r.IntN(maxID)
				switch n := r.IntN(10); {
				case n < 3:
					stmts = append(stmts, fmt.Sprintf(`INSERT INTO t (id, v) VALUES (%d, 'ins') ON CONFLICT (id) DO NOTHING`, maxID+r.IntN(maxID)))
				case n < 6:
					stmts = append(stmts, fmt.Sprintf(upd, "upd", id))
				case n < 8:
					stmts = append(stmts, fmt.Sprintf(`DELETE FROM t WHERE id = %d`, id))
				case n < 9:
					to := 1 + r.IntN(2*maxID)
					stmts = append(stmts, fmt.Sprintf(`UPDATE t SET id = %d, ver = nextval('ver') WHERE id = %d AND NOT EXISTS (SELECT 1 FROM t WHERE id = %d)`, to, id, to))
				default:
					stmts = append(stmts, fmt.Sprintf(`UPDATE t SET v = 'multi', ver = nextval('ver') WHERE id BETWEEN %d AND %d`, id, id+5))
				}
			}
			if extra != "" {
				stmts = append(stmts, extra)
			}
			_, err := conn.Exec(ctx, "BEGIN; "+strings.Join(stmts, "; ")+"; COMMIT")
			if err != nil && ctx.Err() == nil {
				// Key collisions of random primary-key updates are expected; the transaction
				// rolled back.
				_, _ = conn.Exec(context.Background(), "ROLLBACK")
			}
			if pause > 0 {
				time.Sleep(pause)
			}
		}
	})
}

// TestBackfillWhileLive200k: a 200,000-row table backfilled while a random workload runs the
// whole time; the output replays to the table, and no key's version ever goes back.
func TestBackfillWhileLive200k(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 200000, 1)
	stop := workloadWith(t, db, 42, 200000, "", 0) // unbounded: as dense as the server takes
	cfg := engineConfig(db, "public.t")
	cfg.ChunkSize = 10000
	sink := newMemSink()
	start := time.Now()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	t.Logf("backfill of 200k rows under load: %s, %d records", time.Since(start).Round(time.Millisecond), sink.oracle.Records())
	stop()
	catchUp(t, cfg, sink)
	verify(t, db, sink, "public.t", "id")
	require.Greater(t, sink.count("update"), 100, "the workload ran during the backfill")
}

// TestHotKey: one key updated in every window of a small-chunk backfill: the backfill still
// finishes (the cursor moves on the chunk's last key, not on emitted rows).
func TestHotKey(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 300, 1)
	conn := db.Connect()
	stop := background(t, func(ctx context.Context) {
		for ctx.Err() == nil {
			_, _ = conn.Exec(ctx, fmt.Sprintf(upd, "hot", 150))
		}
	})
	cfg := engineConfig(db, "public.t")
	cfg.ChunkSize, cfg.ChunkGrowth = 1, 1 // one key per chunk: every key boundary crossed
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	stop()
	catchUp(t, cfg, sink)
	verify(t, db, sink, "public.t", "id")
	require.Greater(t, len(sink.of("public.t", "150")), 10, "the key was hot")
	require.GreaterOrEqual(t, sink.last().Tables["public.t"].Chunks, int64(300))
}
