package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// exists runs a query that returns one boolean on db.
func exists(t *testing.T, db *e2e.TestDB, sql string, args ...any) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.Conn.QueryRow(context.Background(), sql, args...).Scan(&ok))
	return ok
}

func slotExists(t *testing.T, db *e2e.TestDB, slot string) bool {
	return exists(t, db, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, slot)
}

func publicationExists(t *testing.T, db *e2e.TestDB, pub string) bool {
	return exists(t, db, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, pub)
}

func tableExists(t *testing.T, db *e2e.TestDB, table string) bool {
	return exists(t, db, `SELECT to_regclass($1) IS NOT NULL`, table)
}

// cleanup runs `tidemark cleanup --yes` with args and returns its exit code, stdout and stderr.
func cleanup(t *testing.T, db *e2e.TestDB, args ...string) (int, string, string) {
	t.Helper()
	e, out, errOut := testEnv(t)
	code := run(context.Background(), append([]string{"cleanup", "--source", db.DSN, "--yes"}, args...), e)
	return code, out.String(), errOut.String()
}

// TestCleanupKeepsSharedPublication: a publication Tidemark did not create for this slot, or one
// another logical slot of the database may be streaming, is kept: cleanup prints the statement
// for the operator instead of breaking another capture.
func TestCleanupKeepsSharedPublication(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	db.Exec(`INSERT INTO t SELECT generate_series(1, 10)`)

	// A publication the DBA created (no comment of Tidemark's): kept, the slot is dropped.
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE t`)
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	code, out, errOut := cleanup(t, db, "--slot", db.Slot, "--publication", db.Publication)
	require.Equal(t, 0, code, errOut)
	require.False(t, slotExists(t, db, db.Slot))
	require.True(t, publicationExists(t, db, db.Publication), "a publication Tidemark did not create is kept")
	require.Contains(t, out, `DROP PUBLICATION "`+db.Publication+`";`, "the statement is printed for the operator")
	require.Contains(t, out, "not created by Tidemark for slot "+db.Slot)
	db.Exec(`DROP PUBLICATION ` + db.Publication)

	// A publication sync created for this slot, while another pgoutput slot of the database may
	// stream it: kept. Once that slot is gone: dropped. (The sync writes its watermarks in the
	// signal table, which cleanup handles too.)
	e, _, errOut2 := testEnv(t)
	require.Equal(t, 0, run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.t", "--to", filepath.Join(t.TempDir(), "out.jsonl"), "--stop-when-caught-up", "--quiet", "--watermarks", "table"}, e), errOut2.String())
	other := db.Slot + "_other"
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, other)
	code, out, errOut = cleanup(t, db, "--slot", db.Slot, "--publication", db.Publication)
	require.Equal(t, 0, code, errOut)
	require.False(t, slotExists(t, db, db.Slot))
	require.True(t, publicationExists(t, db, db.Publication), "another pgoutput slot may stream the publication")
	require.Contains(t, out, other)
	require.Contains(t, out, `DROP PUBLICATION "`+db.Publication+`";`)
	require.True(t, slotExists(t, db, other), "another capture's slot is never touched")
	require.True(t, tableExists(t, db, "public.tidemark_signal"), "the other slot's capture may use the signal table before it wrote a mark")
	require.Contains(t, out, `DELETE FROM "public"."tidemark_signal" WHERE slot = '`+db.Slot+`'`)

	db.Exec(`SELECT pg_drop_replication_slot($1)`, other)
	code, _, errOut = cleanup(t, db, "--slot", db.Slot, "--publication", db.Publication)
	require.Equal(t, 0, code, errOut)
	require.False(t, publicationExists(t, db, db.Publication), "created by Tidemark for this slot, used by no other: dropped")
	require.False(t, tableExists(t, db, "public.tidemark_signal"), "no other slot, no other row: dropped")
}

// TestCleanupRefusesForeignSlot: a physical slot, a slot of another plugin, or a slot of another
// database is not a capture of this database: cleanup drops nothing and says why.
func TestCleanupRefusesForeignSlot(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE PUBLICATION ` + db.Publication)

	db.Exec(`SELECT pg_create_physical_replication_slot($1)`, db.Slot)
	t.Cleanup(func() {
		db.Exec(`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, db.Slot)
	})
	code, _, errOut := cleanup(t, db, "--slot", db.Slot, "--publication", db.Publication)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "physical")
	require.True(t, slotExists(t, db, db.Slot), "a physical slot (a standby's) is never dropped")
	require.True(t, publicationExists(t, db, db.Publication), "nothing is dropped")
	db.Exec(`SELECT pg_drop_replication_slot($1)`, db.Slot)

	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, db.Slot)
	code, _, errOut = cleanup(t, db, "--slot", db.Slot, "--publication", db.Publication)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "test_decoding")
	require.True(t, slotExists(t, db, db.Slot), "a slot of another plugin is not Tidemark's")
	db.Exec(`SELECT pg_drop_replication_slot($1)`, db.Slot)

	_, otherConn := targetDatabase(t, db)
	_, err := otherConn.Exec(context.Background(), `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	require.NoError(t, err)
	code, _, errOut = cleanup(t, db, "--slot", db.Slot, "--publication", db.Publication)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, db.Name+"_tgt")
	require.True(t, slotExists(t, db, db.Slot), "a slot of another database is not this capture's")
	require.True(t, publicationExists(t, db, db.Publication))
}

// TestCleanupSignalTable: cleanup cleans the signal table it is given (--signal-table, as sync
// takes it), never the default one of other captures, and refuses a table that is not a signal
// table.
func TestCleanupSignalTable(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	db.Exec(`CREATE SCHEMA app`)
	e, _, syncErr := testEnv(t)
	require.Equal(t, 0, run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.t", "--to", filepath.Join(t.TempDir(), "out.jsonl"), "--stop-when-caught-up", "--quiet", "--signal-table", "app.sig"}, e), syncErr.String())
	// Another capture's signal table, at the default name.
	db.Exec(`CREATE TABLE public.tidemark_signal (slot text PRIMARY KEY, run text NOT NULL, chunk bigint NOT NULL, kind text NOT NULL, written_at timestamptz NOT NULL DEFAULT now())`)
	db.Exec(`INSERT INTO public.tidemark_signal VALUES ('another', 'r', 1, 'L')`)
	// A row of another capture in this one's table: only this slot's row goes.
	db.Exec(`INSERT INTO app.sig VALUES ('another', 'r', 1, 'L')`)

	code, out, errOut := cleanup(t, db, "--slot", db.Slot, "--publication", db.Publication, "--signal-table", "app.sig")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `DELETE FROM "app"."sig" WHERE slot = '`+db.Slot+`'`)
	require.True(t, tableExists(t, db, "app.sig"), "another capture still uses it")
	require.False(t, exists(t, db, `SELECT EXISTS (SELECT 1 FROM app.sig WHERE slot = $1)`, db.Slot))
	require.True(t, tableExists(t, db, "public.tidemark_signal"), "the default signal table is not this capture's")

	db.Exec(`DELETE FROM app.sig`)
	code, out, errOut = cleanup(t, db, "--slot", db.Slot, "--publication", "", "--signal-table", "app.sig")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `DROP TABLE "app"."sig";`)
	require.False(t, tableExists(t, db, "app.sig"))
	require.True(t, tableExists(t, db, "public.tidemark_signal"))

	// A table that is not a signal table is never dropped, even when named.
	db.Exec(`CREATE TABLE app.orders (id int PRIMARY KEY, slot text)`)
	code, _, errOut = cleanup(t, db, "--slot", db.Slot, "--publication", "", "--signal-table", "app.orders")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "not a Tidemark signal table")
	require.True(t, tableExists(t, db, "app.orders"))

	code, _, errOut = cleanup(t, db, "--slot", db.Slot, "--signal-table", "nodot")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--signal-table must be schema.table")
}
