package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// syncTarget runs `tidemark sync` of tables into the target until caught up.
func syncTarget(t *testing.T, db *e2e.TestDB, tgt, tables string, args ...string) error {
	t.Helper()
	_, err := runSyncTo(t, db, tgt, append([]string{"--tables", tables, "--stop-when-caught-up", "--quiet"}, args...)...)
	return err
}

// failOnRewrite is the sync's choice to stop on a change that rewrote values (the tests of the
// stops and of what the operator does then), rather than re-backfill the table.
var failOnRewrite = []string{"--on-rewrite", "fail"}

// targetEquals checks that the target's table equals the source's.
func targetEquals(t *testing.T, db *e2e.TestDB, tgt, table string) {
	t.Helper()
	ctx := context.Background()
	src, err := e2e.SourceRows(ctx, db.DSN, "public", table, []string{"id"})
	require.NoError(t, err)
	dst, err := e2e.SourceRows(ctx, tgt, "public", table, []string{"id"})
	require.NoError(t, err)
	require.Empty(t, e2e.Diff(dst, src), "target table %s", table)
}

// TestTargetFollowsColumnChanges: the source's schema changes reach the PostgreSQL target where
// that is safe, or stop the sync with the statement to run; the target never diverges silently.
func TestTargetFollowsColumnChanges(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY, amount numeric(12,2), v text)`)
	db.Exec(`INSERT INTO t SELECT g, g * 1.25, 'v' || g FROM generate_series(1, 20) g`)
	tgt := targetDB(t, db)
	require.NoError(t, syncTarget(t, db, tgt, "public.t"))
	conn, err := pgxConnect(context.Background(), tgt)
	require.NoError(t, err)
	defer conn.Close(context.Background())

	// A wider type: PostgreSQL rewrote the table under the changed column, which could have
	// been with a USING that changed the values: the sync stops; told the output's values are
	// as the source's (they are: only the scale grew), the target's column follows.
	db.Exec(`ALTER TABLE t ALTER COLUMN amount TYPE numeric(12,4)`)
	db.Exec(`UPDATE t SET amount = 1.2345 WHERE id = 1`)
	require.ErrorContains(t, syncTarget(t, db, tgt, "public.t", failOnRewrite...), "--types-changed public.t")
	_, err = runSyncTo(t, db, tgt, "--tables", "public.t", "--stop-when-caught-up", "--quiet", "--types-changed", "public.t")
	require.NoError(t, err)
	targetEquals(t, db, tgt, "t")

	// A column added with a default: rows that existed get the default on the source without a
	// row event; the target's column gets them too.
	db.Exec(`ALTER TABLE t ADD COLUMN c int DEFAULT 7`)
	db.Exec(`UPDATE t SET v = 'changed' WHERE id = 2`)
	require.NoError(t, syncTarget(t, db, tgt, "public.t"))
	targetEquals(t, db, tgt, "t")

	// A renamed column: the target cannot tell it from a column dropped and another added; the
	// sync stops with both statements, and goes on once the operator ran the right one.
	db.Exec(`ALTER TABLE t RENAME COLUMN v TO label`)
	db.Exec(`UPDATE t SET label = 'renamed' WHERE id = 3`)
	err = syncTarget(t, db, tgt, "public.t")
	require.Error(t, err)
	require.ErrorContains(t, err, `RENAME COLUMN "v" TO "label"`)
	_, err = conn.Exec(context.Background(), `ALTER TABLE t RENAME COLUMN v TO label`)
	require.NoError(t, err)
	require.NoError(t, syncTarget(t, db, tgt, "public.t"))
	targetEquals(t, db, tgt, "t")

	// A type the target cannot take over by itself (the source's USING is unknown, and every
	// stored value was rewritten with no row event): the sync stops with the statement, and
	// goes on once the operator converted the target's column and said so.
	db.Exec(`ALTER TABLE t ALTER COLUMN label TYPE int USING length(label)`)
	db.Exec(`UPDATE t SET label = 42 WHERE id = 4`)
	err = syncTarget(t, db, tgt, "public.t", failOnRewrite...)
	require.ErrorContains(t, err, "after a change of column label (text, now label integer)")
	require.ErrorContains(t, err, "--types-changed public.t")
	_, err = conn.Exec(context.Background(), `ALTER TABLE t ALTER COLUMN label TYPE int USING length(label)`)
	require.NoError(t, err)
	_, err = runSyncTo(t, db, tgt, "--tables", "public.t", "--stop-when-caught-up", "--quiet", "--types-changed", "public.t")
	require.NoError(t, err)
	targetEquals(t, db, tgt, "t")
	require.NoError(t, syncTarget(t, db, tgt, "public.t"), "the new types are the recorded ones")
}

// TestTargetStorageReplaced: into a PostgreSQL target, a persistence round trip of a source table
// between two runs (SET UNLOGGED, writes, SET LOGGED, under a FOR ALL TABLES publication) stops the
// next sync with the cause and both ways on; --rebackfill makes the target equal to the source; a
// VACUUM FULL leaves the same sign and is acknowledged with --maintenance, for one run.
func TestTargetStorageReplaced(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR ALL TABLES`)
	tgt := targetDB(t, db)
	require.NoError(t, syncTarget(t, db, tgt, "public.t"))
	db.Exec(`ALTER TABLE t SET UNLOGGED`)
	db.Exec(`INSERT INTO t VALUES (21, 'unlogged')`)
	db.Exec(`UPDATE t SET v = 'unlogged' WHERE id = 1`)
	db.Exec(`DELETE FROM t WHERE id = 2`)
	db.Exec(`ALTER TABLE t SET LOGGED`)
	err := syncTarget(t, db, tgt, "public.t")
	require.ErrorContains(t, err, "the storage files of")
	require.ErrorContains(t, err, "--rebackfill public.t")
	_, err = runSyncTo(t, db, tgt, "--tables", "public.t", "--stop-when-caught-up", "--quiet", "--rebackfill", "public.t")
	require.NoError(t, err)
	targetEquals(t, db, tgt, "t")

	db.Exec(`VACUUM FULL t`)
	require.ErrorContains(t, syncTarget(t, db, tgt, "public.t"), "--maintenance public.t")
	_, err = runSyncTo(t, db, tgt, "--tables", "public.t", "--stop-when-caught-up", "--quiet", "--maintenance", "public.t")
	require.NoError(t, err)
	require.NoError(t, syncTarget(t, db, tgt, "public.t"), "the files now are the recorded ones")
	targetEquals(t, db, tgt, "t")
}

// TestTargetEnumLabelRenamed: into a PostgreSQL target, ALTER TYPE ... RENAME VALUE on the source
// (with --on-rewrite fail) stops the sync with the statement that renames the label on the target; once run there, a
// sync told so (--types-changed) goes on, and the target equals the source.
func TestTargetEnumLabelRenamed(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TYPE mood AS ENUM ('sad', 'happy')`)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY, m mood)`)
	db.Exec(`INSERT INTO t SELECT g, CASE WHEN g % 2 = 0 THEN 'sad' ELSE 'happy' END::mood FROM generate_series(1, 20) g`)
	tgt := targetDB(t, db)
	require.NoError(t, syncTarget(t, db, tgt, "public.t"))
	db.Exec(`ALTER TYPE mood RENAME VALUE 'sad' TO 'unhappy'`)
	db.Exec(`UPDATE t SET m = 'unhappy' WHERE id = 1`)
	err := syncTarget(t, db, tgt, "public.t", failOnRewrite...)
	require.ErrorContains(t, err, `ALTER TYPE public.mood RENAME VALUE 'sad' TO 'unhappy';`)
	conn, err := pgxConnect(context.Background(), tgt)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), `ALTER TYPE public.mood RENAME VALUE 'sad' TO 'unhappy'`)
	require.NoError(t, err)
	_, err = runSyncTo(t, db, tgt, "--tables", "public.t", "--stop-when-caught-up", "--quiet", "--types-changed", "public.t")
	require.NoError(t, err)
	targetEquals(t, db, tgt, "t")
}

// TestPrecreatedTargets: a target made with `pg_dump -s` of the source has a key GENERATED
// ALWAYS AS IDENTITY, which takes the source's values (OVERRIDING SYSTEM VALUE); a foreign key
// on the target is refused with the reason (tables are applied in the capture's order, and
// backfilled one after the other).
func TestPrecreatedTargets(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO t (v) SELECT 'v' || g FROM generate_series(1, 20) g`)
	tgt := targetDB(t, db)
	conn, err := pgxConnect(context.Background(), tgt)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), `CREATE TABLE t (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)`)
	require.NoError(t, err)
	require.NoError(t, syncTarget(t, db, tgt, "public.t"))
	db.Exec(`INSERT INTO t (v) VALUES ('streamed')`)
	db.Exec(`UPDATE t SET v = 'changed' WHERE id = 3`)
	require.NoError(t, syncTarget(t, db, tgt, "public.t"))
	targetEquals(t, db, tgt, "t")

	db.Exec(`CREATE TABLE parent (id int PRIMARY KEY)`)
	db.Exec(`CREATE TABLE child (id int PRIMARY KEY, parent int)`)
	db.Exec(`INSERT INTO parent VALUES (1), (2)`)
	db.Exec(`INSERT INTO child VALUES (1, 1), (2, 2)`)
	_, err = conn.Exec(context.Background(), `CREATE TABLE parent (id int PRIMARY KEY); CREATE TABLE child (id int PRIMARY KEY, parent int REFERENCES parent)`)
	require.NoError(t, err)
	err = syncTarget(t, db, tgt, "public.parent,public.child")
	require.Error(t, err)
	require.ErrorContains(t, err, "foreign key")
}

// TestTargetRewritesRebackfilled: into a PostgreSQL target, with the sync's default --on-rewrite
// rebackfill, a change that rewrote the source's values with no row event re-backfills the table:
// the target's table is emptied, takes the source's new column types as they are (no value to
// convert), and is filled again. While the sync runs, the watch finds a type change on a quiet
// table; between two runs, a type change and a column added with a volatile default are found at
// start, and the changes made meanwhile (which a target could not convert) are passed over for
// the re-backfill; on a busy table, whose next change reaches the target before the watch looks,
// the sync runs again, and that run re-backfills it. An enum label renamed stops at the re-backfill's rows with the statement that
// renames it on the target.
func TestTargetRewritesRebackfilled(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TYPE mood AS ENUM ('sad', 'happy')`)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY, price numeric(12,2), m mood, v text)`)
	db.Exec(`INSERT INTO t SELECT g, g * 1.25, CASE WHEN g % 2 = 0 THEN 'sad' ELSE 'happy' END::mood, 'v' || g FROM generate_series(1, 30) g`)
	tgt := targetDB(t, db)
	require.NoError(t, syncTarget(t, db, tgt, "public.t"))
	conn, err := pgxConnect(context.Background(), tgt)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	typeOf := func(col string) string {
		var typ string
		require.NoError(t, conn.QueryRow(context.Background(), `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'public.t'::regclass AND attname = $1`, col).Scan(&typ))
		return typ
	}

	db.Exec(`ALTER TABLE t ALTER COLUMN price TYPE bigint USING (price * 100)::bigint`)
	db.Exec(`UPDATE t SET price = 7 WHERE id = 1`) // a change the target could not take in numeric's place
	db.Exec(`ALTER TABLE t ADD COLUMN r float8 DEFAULT random()`)
	require.NoError(t, syncTarget(t, db, tgt, "public.t"), "rewrites between two runs")
	require.Equal(t, "bigint", typeOf("price"))
	targetEquals(t, db, tgt, "t")
	require.NoError(t, syncTarget(t, db, tgt, "public.t"), "the new shape is the recorded one")

	// An enum is a type of the target's, which the sink does not change by itself: the
	// re-backfill's rows stop it with the statement, and once it is run the next sync goes on.
	db.Exec(`ALTER TYPE mood RENAME VALUE 'sad' TO 'unhappy'`)
	err = syncTarget(t, db, tgt, "public.t")
	require.ErrorContains(t, err, `ALTER TYPE "public"."mood" RENAME VALUE 'sad' TO 'unhappy';`)
	_, err = conn.Exec(context.Background(), `ALTER TYPE public.mood RENAME VALUE 'sad' TO 'unhappy'`)
	require.NoError(t, err)
	require.NoError(t, syncTarget(t, db, tgt, "public.t"))
	targetEquals(t, db, tgt, "t")

	cmd := exec.Command(tidemarkBinary(t), "sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication, "--to", tgt,
		"--tables", "public.t", "--quiet")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	time.Sleep(time.Second)
	db.Exec(`ALTER TABLE t ALTER COLUMN v TYPE int USING length(v)`)
	require.Eventually(t, func() bool { return typeOf("v") == "integer" }, 60*time.Second, 200*time.Millisecond,
		"the watch found the rewrite and re-backfilled the table: %s", stderr.String())
	db.Exec(`UPDATE t SET v = 99 WHERE id = 2`)
	// A busy table: its next change reaches the target before the watch looks. The target
	// cannot take it in the old type's place; the sync runs again, and the new run re-backfills.
	db.Exec(`ALTER TABLE t ALTER COLUMN price TYPE text USING price::text || ' cents'`)
	db.Exec(`UPDATE t SET price = 'none' WHERE id = 3`)
	require.Eventually(t, func() bool { return typeOf("price") == "text" }, 60*time.Second, 200*time.Millisecond,
		"the sync ran again and re-backfilled the table: %s", stderr.String())
	require.Contains(t, stderr.String(), "running again, which re-backfills the table")
	// And again later in the same process: each such stop gets its run again.
	db.Exec(`ALTER TABLE t ALTER COLUMN v TYPE bigint USING v::bigint * 2`)
	db.Exec(`UPDATE t SET v = 5 WHERE id = 4`)
	require.Eventually(t, func() bool { return typeOf("v") == "bigint" }, 60*time.Second, 200*time.Millisecond,
		"the sync ran again a second time: %s", stderr.String())
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	_ = cmd.Wait()
	require.Contains(t, stderr.String(), "re-backfilling the table while the capture goes on")
	require.NoError(t, syncTarget(t, db, tgt, "public.t"))
	targetEquals(t, db, tgt, "t")
}
