package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/watermark"
)

// TestDiscoverKeys: the key is the replica identity's; tables without a usable key are refused
// with what to do; an override must be NOT NULL, unique and carried by the replica identity.
func TestDiscoverKeys(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE pk (a int, b text, c int NOT NULL, PRIMARY KEY (b, a))`)
	db.Exec(`CREATE TABLE idx (id int PRIMARY KEY, email text NOT NULL UNIQUE, v text)`)
	db.Exec(`ALTER TABLE idx REPLICA IDENTITY USING INDEX idx_email_key`)
	db.Exec(`CREATE TABLE nokey (a int, b int)`)
	// Its replica identity index dropped (or the identity changed while it was read): the
	// identity says USING INDEX and no index is it, which PostgreSQL treats as NOTHING.
	db.Exec(`CREATE TABLE lostidx (id int PRIMARY KEY, email text NOT NULL UNIQUE)`)
	db.Exec(`ALTER TABLE lostidx REPLICA IDENTITY USING INDEX lostidx_email_key`)
	db.Exec(`ALTER TABLE lostidx DROP CONSTRAINT lostidx_email_key`)
	db.Exec(`CREATE TABLE full_nokey (a int NOT NULL, b int)`)
	db.Exec(`ALTER TABLE full_nokey REPLICA IDENTITY FULL`)
	db.Exec(`CREATE UNIQUE INDEX ON full_nokey (a)`)
	db.Exec(`CREATE TABLE nothing (id int PRIMARY KEY)`)
	db.Exec(`ALTER TABLE nothing REPLICA IDENTITY NOTHING`)
	db.Exec(`CREATE TABLE gen (id int PRIMARY KEY, x int, doubled int GENERATED ALWAYS AS (x * 2) STORED)`)
	db.Exec(`CREATE TABLE ci (k text COLLATE "und-x-icu" PRIMARY KEY)`)
	db.Exec(`CREATE COLLATION nocase (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`)
	db.Exec(`CREATE TABLE nondet (k text COLLATE nocase PRIMARY KEY)`)
	db.Exec(`CREATE TABLE cols (id int PRIMARY KEY, secret text, v text)`)
	db.Exec(`CREATE TABLE unpublished (id int PRIMARY KEY)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE pk, idx, nokey, lostidx, full_nokey, nothing, gen, ci, nondet, cols (id, v)`)
	ctx := context.Background()
	discover := func(name string, override ...string) (*chunker.Table, error) {
		return chunker.Discover(ctx, db.Conn, "public", name, override, db.Publication)
	}

	tb, err := discover("pk")
	require.NoError(t, err)
	require.Equal(t, []string{"b", "a"}, tb.KeyNames(), "the primary key's order")
	require.Equal(t, "primary key", tb.KeySource)

	tb, err = discover("idx")
	require.NoError(t, err)
	require.Equal(t, []string{"email"}, tb.KeyNames(), "deletes carry the replica identity index, so that is the key")

	_, err = discover("nokey")
	require.ErrorIs(t, err, chunker.ErrNoKey)
	require.ErrorContains(t, err, "add a primary key")

	_, err = discover("full_nokey")
	require.ErrorIs(t, err, chunker.ErrNoKey)
	require.ErrorContains(t, err, "give a key override")
	tb, err = discover("full_nokey", "a")
	require.NoError(t, err)
	require.Equal(t, "key override", tb.KeySource)
	_, err = discover("full_nokey", "b")
	require.ErrorContains(t, err, `column "b" is nullable`)

	_, err = discover("nothing")
	require.ErrorContains(t, err, "REPLICA IDENTITY NOTHING")

	_, err = discover("lostidx")
	require.ErrorIs(t, err, chunker.ErrNoKey)
	require.ErrorContains(t, err, "names no index")
	require.ErrorContains(t, err, "REPLICA IDENTITY DEFAULT")
	require.NotContains(t, err.Error(), "has no primary key", "it has one: the replica identity is what carries no key")

	_, err = discover("pk", "c")
	require.ErrorContains(t, err, "is not unique")
	_, err = discover("idx", "id")
	require.ErrorContains(t, err, "differs from its replica identity")
	require.ErrorContains(t, err, "REPLICA IDENTITY FULL")

	tb, err = discover("gen")
	require.NoError(t, err)
	require.Equal(t, []string{"id", "x"}, tb.ColumnNames(), "generated columns are not read: pgoutput does not send them")

	_, err = discover("ci")
	require.NoError(t, err)
	_, err = discover("nondet")
	require.ErrorContains(t, err, "nondeterministic collation")

	tb, err = discover("cols")
	require.NoError(t, err)
	require.Equal(t, []string{"id", "v"}, tb.ColumnNames(), "the publication's column list")

	_, err = discover("unpublished")
	require.ErrorIs(t, err, chunker.ErrNotPublished)
	require.ErrorContains(t, err, fmt.Sprintf(`ALTER PUBLICATION "%s" ADD TABLE ONLY "public"."unpublished"`, db.Publication))

	_, err = discover("missing")
	require.ErrorIs(t, err, chunker.ErrNoTable)
}

// TestDiscoverWhileRenamed: a table renamed while it is discovered is either found under its name
// (the OID looked up, whose membership of the publication is read) or not found at all
// (chunker.ErrNoTable), never "not in the publication": that stop would name the wrong cause and
// the wrong fix (ALTER PUBLICATION ... ADD TABLE), and a resuming capture would call the table one
// that left the publication. Found by TestChaosDDL (seed 85346191, airbyte): the publication was
// read by the name after the OID was looked up by it, and a rename came between the two.
func TestDiscoverWhileRenamed(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE moving (id int PRIMARY KEY, v text)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE moving`)
	ctx := context.Background()
	var oid uint32
	require.NoError(t, db.Conn.QueryRow(ctx, `SELECT 'moving'::regclass::oid`).Scan(&oid))
	discoverWhile(t, db, "moving", []string{`ALTER TABLE moving RENAME TO moved`, `ALTER TABLE moved RENAME TO moving`}, func() {
		// A captured table is followed by its OID, whatever its name meanwhile.
		tb, err := chunker.DiscoverOID(ctx, db.Conn, oid, nil, db.Publication)
		require.NoError(t, err, "by OID")
		require.Contains(t, []string{"moving", "moved"}, tb.Name)
		require.Equal(t, []string{"id"}, tb.KeyNames())
	})
}

// TestDiscoverWhileDropped: a table dropped and created again while it is discovered is found
// (the one there when it was looked up, or the new one), or named as not there; never refused
// for a problem of its own (no key, no columns) that the drop made up.
func TestDiscoverWhileDropped(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE again (id int PRIMARY KEY, v text)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR ALL TABLES`)
	discoverWhile(t, db, "again", []string{`DROP TABLE again; CREATE TABLE again (id int PRIMARY KEY, v text)`}, nil)
}

// discoverWhile discovers public.name (keyed by id) over and over while another connection runs
// ddl in a loop, until both outcomes were met often enough (at most 400 times): found, or not
// found (chunker.ErrNoTable); any other error fails t. each, when set, runs after every
// discovery.
func discoverWhile(t *testing.T, db *e2e.TestDB, name string, ddl []string, each func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	other, err := pgx.Connect(ctx, db.DSN)
	require.NoError(t, err)
	defer other.Close(context.Background())
	failed := make(chan error, 1)
	go func() {
		defer close(failed)
		for ctx.Err() == nil {
			for _, sql := range ddl {
				if _, err := other.Exec(ctx, sql); err != nil {
					if ctx.Err() == nil {
						failed <- err
					}
					return
				}
			}
		}
	}()
	found, gone := 0, 0
	for i := 0; i < 400 && (found < 20 || gone < 20 || i < 100); i++ {
		tb, err := chunker.Discover(ctx, db.Conn, "public", name, nil, db.Publication)
		switch {
		case err == nil:
			require.Equal(t, []string{"id"}, tb.KeyNames())
			found++
		case errors.Is(err, chunker.ErrNoTable):
			gone++
		default:
			require.NoError(t, err, "after %d found and %d not found under the name", found, gone)
		}
		if each != nil {
			each()
		}
	}
	cancel()
	require.NoError(t, <-failed)
	t.Logf("found %d times, not found %d times", found, gone)
	require.Positive(t, found)
	require.Positive(t, gone)
}

// TestKeyIdentityAcrossPaths (I9): for every row of a table keyed by many types, the key the
// chunk read and the key of the same row's insert in the stream are the same bytes, on a
// database whose defaults for every text-output setting differ from Tidemark's.
func TestKeyIdentityAcrossPaths(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	for _, set := range []string{"TimeZone = 'Pacific/Chatham'", "DateStyle = 'SQL, DMY'", "IntervalStyle = 'sql_standard'",
		"extra_float_digits = -2", "bytea_output = 'escape'", "lc_monetary = 'C.UTF-8'"} {
		db.Exec(`ALTER DATABASE ` + db.Name + ` SET ` + set)
	}
	db.Exec(`CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')`)
	db.Exec(`CREATE TABLE k (ts timestamptz, d date, i interval, f float8, n numeric, b bytea, u uuid, m mood, t text, tm time, PRIMARY KEY (ts, d, i, f, n, b, u, m, t, tm))`)
	db.Exec(`INSERT INTO k SELECT '2024-02-29 23:59:59.999999+13:45'::timestamptz + g * interval '17 hours', DATE '0044-03-15 BC' + g,
		make_interval(years => g, secs => g * 1.5), 0.1 * g, 1.10 * g, decode(repeat('00ff', g), 'hex'), md5(g::text)::uuid,
		(ARRAY['sad', 'ok', 'happy'])[1 + g % 3]::mood, 'é' || g, TIME '23:59:59.123456' - g * interval '1 minute'
		FROM generate_series(1, 50) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE k`)
	cfg := engineConfig(db, "public.k")
	cfg.ChunkSize = 7
	// Re-insert every row inside the first window so each key arrives from both paths.
	cfg.Hooks.AfterLow = onChunk(t, db, 1, `CREATE TEMP TABLE k2 AS SELECT * FROM k`, `DELETE FROM k`, `INSERT INTO k SELECT * FROM k2`)
	keys := &keySink{byOp: map[merge.Op]map[string]bool{}}
	eng, err := merge.New(cfg, keys, zerolog.Nop())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, eng.Run(ctx, nil))
	require.Len(t, keys.byOp[merge.Insert], 50)
	require.Len(t, keys.byOp[merge.Snapshot], 43, "the first chunk's 7 rows were evicted by their re-insert")
	for k := range keys.byOp[merge.Snapshot] {
		require.True(t, keys.byOp[merge.Insert][k], "snapshot key %x has no equal stream key", k)
	}
	for k := range keys.byOp[merge.Delete] {
		require.True(t, keys.byOp[merge.Insert][k], "delete key %x has no equal insert key", k)
	}
}

// keySink records the canonical keys of the events by kind.
type keySink struct{ byOp map[merge.Op]map[string]bool }

func (s *keySink) Emit(_ context.Context, evs []merge.Event) error {
	for _, ev := range evs {
		if s.byOp[ev.Op] == nil {
			s.byOp[ev.Op] = map[string]bool{}
		}
		s.byOp[ev.Op][string(ev.Key)] = true
	}
	return nil
}

func (s *keySink) Checkpoint(context.Context, *merge.Position) error { return nil }

// TestSignalTableRights: a role that may not create the signal table, or add it to the
// publication, gets the exact SQL a DBA should run (create it, give it to the role, publish it);
// a table the DBA created and only granted is refused; given to the role, a least-privilege
// role (REPLICATION and SELECT) runs the backfill.
func TestSignalTableRights(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 20, 1)
	role := "tm_" + db.Name[2:]
	db.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN REPLICATION PASSWORD 'pw'`, role))
	t.Cleanup(func() {
		db.Exec(fmt.Sprintf(`DROP OWNED BY %s`, role))
		db.Exec(fmt.Sprintf(`DROP ROLE %s`, role))
	})
	db.Exec(fmt.Sprintf(`GRANT SELECT ON t TO %s`, role))
	db.Exec(`REVOKE CREATE ON SCHEMA public FROM PUBLIC`)
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	cfg := engineConfig(db, "public.t")
	cfg.Watermarks = watermark.Table
	cfg.Source.DSN = server.UserDSN(db.Name, role, "pw")
	run := func() error { return runEngine(t, cfg, newMemSink(), nil) }

	err := run()
	require.ErrorIs(t, err, watermark.ErrSetup)
	create := fmt.Sprintf(watermark.CreateTable, `"public"."tidemark_signal"`)
	require.ErrorContains(t, err, create)
	require.ErrorContains(t, err, fmt.Sprintf(`ALTER TABLE "public"."tidemark_signal" OWNER TO "%s"`, role))

	// Created by a DBA and only granted (what releases before said to do): refused, since its
	// owner is not the capture's role (internal/pgtrust).
	db.Exec(create)
	db.Exec(fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE ON tidemark_signal TO %s`, role))
	err = run()
	require.ErrorContains(t, err, `, not by this role`)
	require.ErrorContains(t, err, fmt.Sprintf(`ALTER TABLE "public"."tidemark_signal" OWNER TO "%s";`, role))

	db.Exec(fmt.Sprintf(`ALTER TABLE tidemark_signal OWNER TO %s`, role))
	err = run()
	require.ErrorContains(t, err, "is not in publication")
	require.ErrorContains(t, err, fmt.Sprintf(`ALTER PUBLICATION "%s" ADD TABLE "public"."tidemark_signal"`, db.Publication))

	db.Exec(`ALTER PUBLICATION ` + db.Publication + ` ADD TABLE tidemark_signal`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	require.False(t, strings.Contains(fmt.Sprint(err), "pw"))
}

// TestReadOnlyRoleMessages: with watermarks as logical messages (the default on PostgreSQL 14
// and later), a role with only SELECT on the table and REPLICATION, whose transactions are
// read-only by default and who may create nothing, backfills while the table changes, against
// a slot and publication a DBA created: the engine writes to no table. Revoking the message
// function from the role stops the capture with the GRANT that fixes it.
func TestReadOnlyRoleMessages(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 50, 1)
	role := "ro_" + db.Name[2:]
	db.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN REPLICATION PASSWORD 'pw'`, role))
	t.Cleanup(func() {
		db.Exec(fmt.Sprintf(`DROP OWNED BY %s`, role))
		db.Exec(fmt.Sprintf(`DROP ROLE %s`, role))
	})
	db.Exec(fmt.Sprintf(`GRANT SELECT ON t TO %s`, role))
	db.Exec(fmt.Sprintf(`ALTER ROLE %s SET default_transaction_read_only = on`, role))
	db.Exec(`REVOKE CREATE ON SCHEMA public FROM PUBLIC`)
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	cfg := engineConfig(db, "public.t")
	cfg.Source.DSN = server.UserDSN(db.Name, role, "pw")
	cfg.Hooks.AfterLow = onChunk(t, db, 2, fmt.Sprintf(upd, "during", 15), `INSERT INTO t (id, v, ver) VALUES (1000, 'new', nextval('ver'))`)
	cfg.Hooks.AfterSelect = onChunk(t, db, 3, fmt.Sprintf(upd, "after", 25), `DELETE FROM t WHERE id = 26`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
	conn := db.Connect()
	var signal bool
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT to_regclass('public.tidemark_signal') IS NOT NULL`).Scan(&signal))
	require.False(t, signal, "no signal table")

	// The function is PUBLIC's by default; a DBA may revoke it.
	db.Exec(`REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC`)
	cfg.Hooks = merge.Hooks{}
	err := runEngine(t, cfg, newMemSink(), nil)
	require.ErrorIs(t, err, watermark.ErrSetup)
	require.ErrorContains(t, err, fmt.Sprintf(`GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) TO "%s"`, role))
}

// TestResumeAfterStop: an engine stopped in the middle of a backfill (its context cancelled)
// ends at a transaction boundary with a checkpoint; a new run from it finishes without a gap.
func TestResumeAfterStop(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 2000, 1)
	stop := workload(t, db, 3, 2000)
	cfg := engineConfig(db, "public.t")
	// Twenty chunks of 100 rows (no growth), stopped after the sixth's high watermark: a stop
	// taken from a checkpoint seen by polling came after the last chunk on a fast run (CI: ten
	// growing chunks done before the cancel).
	cfg.ChunkSize, cfg.ChunkGrowth = 100, 1
	cfg.StopWhenCaughtUp = false
	sink := newMemSink()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg.Hooks.AfterHigh = func(_ context.Context, id int64) {
		if id >= 6 {
			cancel()
		}
	}
	eng, err := merge.New(cfg, sink, testLogger(t))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- eng.Run(ctx, nil) }()
	require.ErrorIs(t, <-done, context.Canceled)
	mid := sink.last()
	require.NotNil(t, mid, "a checkpoint at the stop")
	require.False(t, mid.Tables["public.t"].Done, "stopped mid-backfill")
	stop()
	cfg.StopWhenCaughtUp = true
	cfg.Source.CreateSlot = false
	cfg.Hooks = merge.Hooks{}
	require.NoError(t, runEngine(t, cfg, sink, mid))
	verify(t, db, sink, "public.t", "id")
}

// TestOlderPositionSlotNotAdvanced: the platform lost the latest state but the slot was never
// confirmed past the older one: replay from it redoes the chunks and converges.
func TestOlderPositionSlotNotAdvanced(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 300, 1)
	cfg := engineConfig(db, "public.t")
	cfg.ChunkSize = 50
	first := newMemSink()
	var counts []int
	cfg.Hooks.AfterCheckpoint = func(context.Context, *merge.Position) {
		first.mu.Lock()
		counts = append(counts, len(first.records))
		first.mu.Unlock()
	}
	cfg.Hooks.AfterSelect = onChunk(t, db, 4, fmt.Sprintf(upd, "x", 20), `DELETE FROM t WHERE id = 260`)
	require.NoError(t, runEngine(t, cfg, first, nil))
	// Take a checkpoint from the middle of the backfill, and the output up to it.
	var old *merge.Position
	n := 0
	for i, p := range first.checkpoints {
		if p.Tables["public.t"].Chunks == 2 {
			old, n = p, counts[i]
			break
		}
	}
	require.NotNil(t, old)
	db.Exec(fmt.Sprintf(upd, "after", 30))
	second := newMemSink()
	for _, r := range first.records[:n] {
		second.records = append(second.records, r)
		second.oracle.Apply(r)
	}
	cfg.Hooks = merge.Hooks{}
	cfg.Source.CreateSlot = false
	require.NoError(t, runEngine(t, cfg, second, old))
	verify(t, db, second, "public.t", "id")
}

// TestChunkPlanWithoutStatistics: a table that was never analyzed (just loaded, autovacuum not
// there yet) makes the planner guess that a key range holds 0.5% of the table, fewer rows than
// a chunk; it then reads the whole rest of the range and sorts it for every chunk (a backfill in
// O(n²)). Chunks are read in key order from the key's index whatever the statistics say.
func TestChunkPlanWithoutStatistics(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE loaded (id bigint PRIMARY KEY, tenant int NOT NULL, v text) WITH (autovacuum_enabled = off)`)
	db.Exec(`CREATE UNIQUE INDEX loaded_tenant_id ON loaded (tenant, id)`)
	db.Exec(`ALTER TABLE loaded ALTER COLUMN tenant SET NOT NULL`)
	db.Exec(`INSERT INTO loaded SELECT g, g % 7, md5(g::text) FROM generate_series(1, 200000) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE loaded`)
	ctx := context.Background()
	r, err := chunker.NewReader(db.Connect(), chunker.Config{})
	require.NoError(t, err)
	for _, override := range [][]string{nil, {"tenant", "id"}} {
		if override != nil {
			db.Exec(`ALTER TABLE loaded REPLICA IDENTITY USING INDEX loaded_tenant_id`)
		}
		tbl, err := chunker.Discover(ctx, db.Conn, "public", "loaded", override, db.Publication)
		require.NoError(t, err)
		after, upper := []string{"1000"}, []string{"200000"}
		if override != nil {
			after, upper = []string{"0", "1000"}, []string{"6", "200000"}
		}
		plan, err := r.Explain(ctx, tbl, after, upper, 10000)
		require.NoError(t, err)
		require.NotContains(t, plan, "Sort", "key %v: the chunk is read in index order:\n%s", tbl.Key, plan)
		require.Contains(t, plan, "Index Scan", "key %v:\n%s", tbl.Key, plan)
	}
}
