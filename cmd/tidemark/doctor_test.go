package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

func runDoctorCmd(t *testing.T, args ...string) (int, string) {
	t.Helper()
	e, out, _ := testEnv(t)
	code := run(context.Background(), append([]string{"doctor"}, args...), e)
	return code, out.String()
}

// TestDoctor: on a database missing each prerequisite in turn, doctor names it and prints its
// fix; once the fixes are applied it says all is well, and a least-privileged role (REPLICATION
// and SELECT, no superuser) runs a sync.
func TestDoctor(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE orders (id int PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO orders SELECT g, 'x' FROM generate_series(1, 100) g`)
	db.Exec(`CREATE TABLE nokey (a int)`)
	db.Exec(`REVOKE CREATE ON SCHEMA public FROM PUBLIC`)
	role := "doc_" + db.Name[2:]
	db.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'pw'`, role))
	t.Cleanup(func() {
		db.Exec(`DROP OWNED BY ` + role)
		db.Exec(`DROP ROLE ` + role)
	})
	dsn := server.UserDSN(db.Name, role, "pw")
	args := []string{"--source", dsn, "--slot", db.Slot, "--publication", db.Publication, "--tables", "public.orders"}

	// The superuser on a fresh database: what is missing, Tidemark creates.
	code, out := runDoctorCmd(t, "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication, "--tables", "public.orders")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "All is well")
	require.Contains(t, out, "Tidemark creates it")

	steps := []struct {
		want []string // in the output, for the missing prerequisite
		fix  string   // what a DBA runs
	}{
		{[]string{`lacks the REPLICATION attribute`, `ALTER ROLE "` + role + `" WITH REPLICATION;`, "GRANT rds_replication"}, `ALTER ROLE ` + role + ` WITH REPLICATION`},
		{[]string{`table public.orders cannot be read`, `GRANT SELECT ON "public"."orders" TO "` + role + `";`}, `GRANT SELECT ON orders TO ` + role},
		{[]string{`publication "` + db.Publication + `" does not exist, and this role may not create it`, `CREATE PUBLICATION "` + db.Publication + `" FOR TABLE ONLY "public"."orders" WITH (publish_via_partition_root = true);`},
			`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE orders`},
	}
	for i, step := range steps {
		code, out := runDoctorCmd(t, args...)
		require.Equal(t, 1, code, "step %d:\n%s", i, out)
		for _, w := range step.want {
			require.Contains(t, out, w, "step %d", i)
		}
		db.Exec(step.fix)
	}
	code, out = runDoctorCmd(t, args...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "All is well")
	require.Contains(t, out, "watermarks are logical messages", "the default transport needs no table and no write privilege")

	// The signal table transport needs a table in the publication that the role may write.
	table := append(slices.Clone(args), "--watermarks", "table")
	code, out = runDoctorCmd(t, table...)
	require.Equal(t, 1, code, out)
	for _, w := range []string{`signal table "public"."tidemark_signal" does not exist, and this role may not create it`, `CREATE TABLE IF NOT EXISTS "public"."tidemark_signal"`,
		`ALTER TABLE "public"."tidemark_signal" OWNER TO "` + role + `";`, `ALTER PUBLICATION "` + db.Publication + `" ADD TABLE ONLY "public"."tidemark_signal";`} {
		require.Contains(t, out, w)
	}
	// Created and only granted, as releases before said: refused (its owner is not the role).
	db.Exec(`CREATE TABLE public.tidemark_signal (slot text PRIMARY KEY, run text NOT NULL, chunk bigint NOT NULL, kind text NOT NULL, written_at timestamptz NOT NULL DEFAULT now());
		 GRANT SELECT, INSERT, UPDATE ON public.tidemark_signal TO ` + role + `; ALTER PUBLICATION ` + db.Publication + ` ADD TABLE public.tidemark_signal`)
	code, out = runDoctorCmd(t, table...)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, `signal table "public"."tidemark_signal" is refused`)
	require.Contains(t, out, `ALTER TABLE "public"."tidemark_signal" OWNER TO "`+role+`";`)
	db.Exec(`ALTER TABLE public.tidemark_signal OWNER TO ` + role)
	code, out = runDoctorCmd(t, table...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "signal table \"public\".\"tidemark_signal\" is ready")

	code, out = runDoctorCmd(t, args...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "All is well")
	require.Contains(t, out, "max_slot_wal_keep_size is unlimited", "a warning, not a failure")

	// A table without a key, and a publication that lacks deletes.
	code, out = runDoctorCmd(t, "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication, "--tables", "public.nokey")
	require.Equal(t, 1, code)
	require.Contains(t, out, "has no primary key")
	db.Exec(`ALTER PUBLICATION ` + db.Publication + ` SET (publish = 'insert, update')`)
	code, out = runDoctorCmd(t, args...)
	require.Equal(t, 1, code)
	require.Contains(t, out, "does not publish every insert, update, delete and truncate")
	db.Exec(`ALTER PUBLICATION ` + db.Publication + ` SET (publish = 'insert, update, delete, truncate')`)

	// The least-privileged role runs a sync.
	e, _, errOut := testEnv(t)
	code = run(context.Background(), []string{"sync", "--source", dsn, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.orders", "--to", filepath.Join(t.TempDir(), "out.jsonl"), "--stop-when-caught-up", "--quiet"}, e)
	require.Equal(t, 0, code, errOut.String())
	require.NotContains(t, errOut.String(), "pw")
}

// TestDoctorWalLevel: a server with wal_level=replica is named with the setting and its
// managed-cloud variants.
func TestDoctorWalLevel(t *testing.T) {
	e2e.NeedsLocal(t, server, "needs a local cluster of its own")
	ctx := context.Background()
	srv, err := e2e.Start(ctx, e2e.Options{Settings: map[string]string{"wal_level": "replica", "max_wal_senders": "10"}})
	require.NoError(t, err)
	defer srv.Stop(ctx)
	code, out := runDoctorCmd(t, "--source", srv.DSN("postgres"))
	require.Equal(t, 1, code)
	for _, w := range []string{"wal_level is replica", "ALTER SYSTEM SET wal_level = logical", "rds.logical_replication = 1", "cloudsql.logical_decoding"} {
		require.Contains(t, out, w)
	}
	require.Equal(t, 1, strings.Count(out, "[FAIL]"), out)
}

// TestStatusAndCleanup: status shows the slot and the checkpoint's progress; cleanup drops only
// when confirmed.
func TestStatusAndCleanup(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	db.Exec(`INSERT INTO t SELECT generate_series(1, 500)`)
	db.Exec(`ANALYZE t`)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	e, _, errOut := testEnv(t)
	require.Equal(t, 0, run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.t", "--to", out, "--stop-when-caught-up", "--quiet"}, e), errOut.String())

	e, stdout, errOut := testEnv(t)
	require.Equal(t, 0, run(context.Background(), []string{"status", "--source", db.DSN, "--slot", db.Slot, "--checkpoint", out + ".checkpoint"}, e), errOut.String())
	for _, w := range []string{"slot " + db.Slot + ": inactive, plugin pgoutput", "confirmed_flush_lsn", "retained WAL", "public.t: backfill done (500 rows, 1 chunks)"} {
		require.Contains(t, stdout.String(), w)
	}

	e, stdout, _ = testEnv(t)
	require.Equal(t, 2, run(context.Background(), []string{"cleanup", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication}, e))
	require.Contains(t, stdout.String(), "SELECT pg_catalog.pg_drop_replication_slot('"+db.Slot+"');")
	var slots int
	require.NoError(t, db.Conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, db.Slot).Scan(&slots))
	require.Equal(t, 1, slots, "nothing is dropped without confirmation")

	e, stdout, errOut = testEnv(t)
	require.Equal(t, 0, run(context.Background(), []string{"cleanup", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication, "--yes"}, e), errOut.String())
	require.Contains(t, stdout.String(), "Dropped.")
	var left int
	require.NoError(t, db.Conn.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1)
		+ (SELECT count(*) FROM pg_publication WHERE pubname = $2) + (to_regclass('tidemark_signal') IS NOT NULL)::int`, db.Slot, db.Publication).Scan(&left))
	require.Zero(t, left)
}
