package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// leftBehind lists what a sync could have left on the source: its slot, its publication, the
// default signal table.
func leftBehind(t *testing.T, db *e2e.TestDB) []string {
	t.Helper()
	var left []string
	if slotExists(t, db, db.Slot) {
		left = append(left, "slot "+db.Slot)
	}
	if publicationExists(t, db, db.Publication) {
		left = append(left, "publication "+db.Publication)
	}
	var signal bool
	require.NoError(t, db.Conn.QueryRow(context.Background(), `SELECT to_regclass('public.tidemark_signal') IS NOT NULL`).Scan(&signal))
	if signal {
		left = append(left, "signal table public.tidemark_signal")
	}
	return left
}

// TestFirstRunMistakes: the mistakes of a first hour, each on a fresh database. Every one ends
// the run with its exit code and a message that names the cause and the fix, and leaves the
// source as it was: no slot, no publication (a run drops what it created when it ends before
// its first checkpoint; most mistakes are found before it creates anything).
func TestFirstRunMistakes(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, db *e2e.TestDB) (source string)
		args  func(t *testing.T, db *e2e.TestDB) []string // beyond --source, --slot, --publication
		code  int
		want  []string
		after func(t *testing.T, db *e2e.TestDB)
	}{{
		name: "table name typo",
		args: func(t *testing.T, db *e2e.TestDB) []string {
			return []string{"--tables", "public.ordrs", "--to", filepath.Join(t.TempDir(), "out.jsonl")}
		},
		code: 1, want: []string{"public.ordrs does not exist"},
	}, {
		name: "a wildcard",
		args: func(t *testing.T, db *e2e.TestDB) []string {
			return []string{"--tables", "public.*", "--to", filepath.Join(t.TempDir(), "out.jsonl")}
		},
		code: 2, want: []string{"list the tables"},
	}, {
		name: "a key-less table",
		setup: func(t *testing.T, db *e2e.TestDB) string {
			db.Exec(`CREATE TABLE public.events (at timestamptz, v text); INSERT INTO public.events VALUES (now(), 'x')`)
			return ""
		},
		args: func(t *testing.T, db *e2e.TestDB) []string {
			return []string{"--tables", "public.orders,public.events", "--to", filepath.Join(t.TempDir(), "out.jsonl")}
		},
		code: 1, want: []string{"public.events has no primary key"},
		after: func(t *testing.T, db *e2e.TestDB) {
			// The application's own writes still work: no publication holds the table.
			db.Exec(`UPDATE public.events SET v = 'y'`)
			db.Exec(`DELETE FROM public.events`)
		},
	}, {
		name: "no SELECT on a table",
		setup: func(t *testing.T, db *e2e.TestDB) string {
			role := "m_" + db.Name[2:]
			db.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN REPLICATION PASSWORD 'pw'`, role))
			db.Exec(`GRANT CREATE ON DATABASE ` + db.Name + ` TO ` + role)
			db.Exec(`ALTER TABLE public.orders OWNER TO ` + role)
			db.Exec(`CREATE TABLE public.secret (id int PRIMARY KEY)`)
			t.Cleanup(func() {
				db.Exec(`DROP OWNED BY ` + role)
				db.Exec(`DROP ROLE ` + role)
			})
			return server.UserDSN(db.Name, role, "pw")
		},
		args: func(t *testing.T, db *e2e.TestDB) []string {
			return []string{"--tables", "public.orders,public.secret", "--to", filepath.Join(t.TempDir(), "out.jsonl")}
		},
		code: 1, want: []string{"may not read public.secret", `GRANT SELECT ON "public"."secret" TO`},
	}, {
		name: "the target is the source",
		args: func(t *testing.T, db *e2e.TestDB) []string {
			return []string{"--tables", "public.orders", "--to", db.DSN}
		},
		code: 1, want: []string{"the target is the source database itself"},
	}, {
		name: "a target table with a column the source lacks, NOT NULL",
		args: func(t *testing.T, db *e2e.TestDB) []string {
			tgtDSN, tgt := targetDatabase(t, db)
			_, err := tgt.Exec(context.Background(), `CREATE TABLE public.orders (id int PRIMARY KEY, v text, extra int NOT NULL)`)
			require.NoError(t, err)
			return []string{"--tables", "public.orders", "--to", tgtDSN}
		},
		code: 1, want: []string{`"extra"`},
	}, {
		name: "a target table with another column type",
		args: func(t *testing.T, db *e2e.TestDB) []string {
			tgtDSN, tgt := targetDatabase(t, db)
			_, err := tgt.Exec(context.Background(), `CREATE TABLE public.orders (id int PRIMARY KEY, v int)`)
			require.NoError(t, err)
			return []string{"--tables", "public.orders", "--to", tgtDSN}
		},
		code: 1, want: []string{`is text on the source and integer on the existing target table "public"."orders"`, "--target-schema"},
	}, {
		name: "a target table with another column type, signal table transport",
		args: func(t *testing.T, db *e2e.TestDB) []string {
			tgtDSN, tgt := targetDatabase(t, db)
			_, err := tgt.Exec(context.Background(), `CREATE TABLE public.orders (id int PRIMARY KEY, v int)`)
			require.NoError(t, err)
			return []string{"--tables", "public.orders", "--to", tgtDSN, "--watermarks", "table"}
		},
		code: 1, want: []string{`is text on the source and integer on the existing target table "public"."orders"`},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := e2e.NewTestDB(t, server)
			db.Exec(`CREATE TABLE public.orders (id int PRIMARY KEY, v text); INSERT INTO public.orders SELECT g, 'o' || g FROM generate_series(1, 50) g`)
			source := db.DSN
			if c.setup != nil {
				if s := c.setup(t, db); s != "" {
					source = s
				}
			}
			args := append([]string{"sync", "--source", source, "--slot", db.Slot, "--publication", db.Publication, "--stop-when-caught-up", "--quiet"}, c.args(t, db)...)
			e, _, errOut := testEnv(t)
			code := run(context.Background(), args, e)
			require.Equal(t, c.code, code, errOut.String())
			for _, w := range c.want {
				require.Contains(t, errOut.String(), w)
			}
			require.Empty(t, leftBehind(t, db), "left on the source after: %s", errOut.String())
			if c.after != nil {
				c.after(t, db)
			}
		})
	}
}

// TestCreatedPublicationPartitioned: the publication a sync creates publishes a partitioned
// table through its root, so the table is captured under its own name.
func TestCreatedPublicationPartitioned(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.m (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);
		CREATE TABLE public.m1 PARTITION OF public.m FOR VALUES FROM (0) TO (100);
		CREATE TABLE public.m2 PARTITION OF public.m FOR VALUES FROM (100) TO (200);
		INSERT INTO public.m SELECT g, 'v' FROM generate_series(1, 199) g`)
	e, _, errOut := testEnv(t)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	require.Equal(t, 0, run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.m", "--to", out, "--stop-when-caught-up", "--quiet"}, e), errOut.String())
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, 199, strings.Count(string(b), `"table":"public.m"`))
	require.True(t, exists(t, db, `SELECT pubviaroot FROM pg_publication WHERE pubname = $1`, db.Publication))
}

// TestIdleSlotsListed: a slot nobody streams from (a run killed before its first checkpoint
// cannot drop the slot it created) is listed by doctor and status, with the WAL it retains and
// the command that drops it.
func TestIdleSlotsListed(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.orders (id int PRIMARY KEY)`)
	orphan := db.Slot + "_orphan"
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, orphan)
	t.Cleanup(func() { db.Exec(`SELECT pg_drop_replication_slot($1)`, orphan) })
	_, out := runDoctorCmd(t, "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication, "--tables", "public.orders")
	require.Contains(t, out, fmt.Sprintf("replication slot %q is not in use and retains", orphan))
	require.Contains(t, out, "tidemark cleanup --slot "+orphan)

	e, stdout, errOut := testEnv(t)
	require.Equal(t, 0, run(context.Background(), []string{"status", "--source", db.DSN, "--slot", db.Slot}, e), errOut.String())
	require.Contains(t, stdout.String(), "other slot "+orphan+": inactive, retains")
}

// TestDoctorPublicationAdvice: doctor never suggests a publication that would break the
// application's writes (a key-less table in it), and for a partitioned table published through
// its partitions suggests publish_via_partition_root, not an ADD TABLE that fails (the table is
// already a member).
func TestDoctorPublicationAdvice(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.orders (id int PRIMARY KEY); CREATE TABLE public.events (at timestamptz, v text)`)
	role := "adv_" + db.Name[2:]
	db.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN REPLICATION PASSWORD 'pw'`, role))
	db.Exec(`GRANT SELECT ON ALL TABLES IN SCHEMA public TO ` + role)
	t.Cleanup(func() {
		db.Exec(`DROP OWNED BY ` + role)
		db.Exec(`DROP ROLE ` + role)
	})
	_, out := runDoctorCmd(t, "--source", server.UserDSN(db.Name, role, "pw"), "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.orders,public.events")
	require.Contains(t, out, `CREATE PUBLICATION "`+db.Publication+`" FOR TABLE ONLY "public"."orders" WITH (publish_via_partition_root = true);`)
	require.NotContains(t, out, `"public"."events" WITH`)
	require.Contains(t, out, "public.events has no primary key")

	db.Exec(`CREATE TABLE public.m (id int PRIMARY KEY) PARTITION BY RANGE (id); CREATE TABLE public.m1 PARTITION OF public.m FOR VALUES FROM (0) TO (10)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE public.m`)
	_, out = runDoctorCmd(t, "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication, "--tables", "public.m")
	require.Contains(t, out, "SET (publish_via_partition_root = true)")
	require.NotContains(t, out, "ADD TABLE")
	// And sync refuses it before creating its slot.
	e, _, errOut := testEnv(t)
	require.Equal(t, 1, run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.m", "--to", "-", "--stop-when-caught-up", "--quiet"}, e))
	require.Contains(t, errOut.String(), "publish_via_partition_root = true")
	require.False(t, slotExists(t, db, db.Slot))
}

// TestFailedRunKeepsWhatExisted: a publication that existed before the run stays, without the
// table the run added to it; the slot it created goes.
func TestFailedRunKeepsWhatExisted(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.orders (id int PRIMARY KEY, v text); INSERT INTO public.orders VALUES (1, 'a')`)
	db.Exec(`CREATE TABLE public.other (id int PRIMARY KEY)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE public.other`)
	tgtDSN, tgt := targetDatabase(t, db)
	_, err := tgt.Exec(context.Background(), `CREATE TABLE public.orders (id int PRIMARY KEY, v int)`)
	require.NoError(t, err)
	e, _, errOut := testEnv(t)
	require.Equal(t, 1, run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.orders", "--to", tgtDSN, "--stop-when-caught-up", "--quiet"}, e))
	require.False(t, slotExists(t, db, db.Slot), errOut.String())
	require.True(t, publicationExists(t, db, db.Publication))
	require.False(t, exists(t, db, `SELECT EXISTS (SELECT FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'orders')`, db.Publication),
		"the table the run added is taken out again")
	require.True(t, exists(t, db, `SELECT EXISTS (SELECT FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'other')`, db.Publication))

	// An inheritance parent the run added, whose child was in the publication already: the
	// parent is taken out again, and only the parent.
	db.Exec(`CREATE TABLE public.kid (x int) INHERITS (public.orders); ALTER TABLE public.kid ADD PRIMARY KEY (id);
		ALTER PUBLICATION ` + db.Publication + ` ADD TABLE ONLY public.kid`)
	e, _, errOut = testEnv(t)
	require.Equal(t, 1, run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.orders", "--to", tgtDSN, "--stop-when-caught-up", "--quiet"}, e))
	require.NotContains(t, errOut.String(), "left on the source")
	require.False(t, exists(t, db, `SELECT EXISTS (SELECT FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'orders')`, db.Publication), errOut.String())
	require.True(t, exists(t, db, `SELECT EXISTS (SELECT FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'kid')`, db.Publication),
		"the child, in the publication before the run, stays")
}

// TestSyncReconnects: a sync whose connections the server ends (pg_terminate_backend: 57P01, as
// a restart or a failover does) starts again from its last checkpoint and goes on, saying so;
// the output holds every row once. A run that never reached a checkpoint is not retried (see
// TestFirstRunMistakes: its error is reported at once).
func TestSyncReconnects(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.r (id int PRIMARY KEY, v text); INSERT INTO public.r SELECT g, 'a' FROM generate_series(1, 500) g`)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	var logs syncBuffer
	e, _, errOut := testEnv(t)
	e.log = zerolog.New(&logs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
			"--tables", "public.r", "--to", out, "--quiet"}, e)
	}()
	keys := func() map[string]int {
		b, _ := os.ReadFile(out)
		m := map[string]int{}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var line struct {
				Op  string         `json:"op"`
				Key map[string]any `json:"key"`
			}
			if json.Unmarshal([]byte(l), &line) == nil && line.Key != nil {
				m[fmt.Sprint(line.Key["id"])]++
			}
		}
		return m
	}
	require.Eventually(t, func() bool { return len(keys()) == 500 }, 30*time.Second, 50*time.Millisecond)
	time.Sleep(1500 * time.Millisecond) // a checkpoint after the backfill (--checkpoint-interval 1s)
	db.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'tidemark%'`)
	db.Exec(`INSERT INTO public.r SELECT g, 'b' FROM generate_series(501, 600) g`)
	require.Eventually(t, func() bool { return len(keys()) == 600 }, 60*time.Second, 100*time.Millisecond, "the run goes on after the connections were ended:\n%s", logs.String())
	require.Contains(t, logs.String(), "connection lost: reconnecting")
	cancel()
	require.Equal(t, 0, <-done, errOut.String())
	for k, n := range keys() {
		require.Equal(t, 1, n, "key %s written %d times", k, n)
	}
}

// TestFailedRunPublicationShared: a publication the failed run created stays when another
// pgoutput slot of the database exists (another capture may have taken it up meanwhile, and its
// slot would fail without it); the run says so, with the statement. Its own slot goes.
func TestFailedRunPublicationShared(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.orders (id int PRIMARY KEY, v text); INSERT INTO public.orders VALUES (1, 'a')`)
	other := db.Slot + "_other"
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, other)
	t.Cleanup(func() { db.Exec(`SELECT pg_drop_replication_slot($1)`, other) })
	tgtDSN, tgt := targetDatabase(t, db)
	_, err := tgt.Exec(context.Background(), `CREATE TABLE public.orders (id int PRIMARY KEY, v int)`)
	require.NoError(t, err)
	var logs syncBuffer
	e, _, errOut := testEnv(t)
	e.log = zerolog.New(&logs)
	require.Equal(t, 1, run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.orders", "--to", tgtDSN, "--stop-when-caught-up", "--quiet"}, e))
	require.False(t, slotExists(t, db, db.Slot), errOut.String())
	require.True(t, publicationExists(t, db, db.Publication), "another pgoutput slot may stream it")
	require.Contains(t, logs.String(), "publication kept")
	require.Contains(t, logs.String(), `DROP PUBLICATION \"`+db.Publication+`\";`)
}

// TestKeyOverride: a table without a primary key, whose NOT NULL columns under a unique index
// identify its rows, is captured with --key once that index is its replica identity; before,
// doctor and sync print the statement, and sync creates nothing.
func TestKeyOverride(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.ev (tenant text NOT NULL, n int NOT NULL, v text);
		CREATE UNIQUE INDEX ev_tn ON public.ev (tenant, n);
		INSERT INTO public.ev SELECT 't' || (g % 3), g, 'x' FROM generate_series(1, 300) g`)
	args := []string{"--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication, "--tables", "public.ev", "--key", "public.ev=tenant,n"}
	fix := `ALTER TABLE "public"."ev" REPLICA IDENTITY USING INDEX ev_tn;`
	_, out := runDoctorCmd(t, args...)
	require.Contains(t, out, fix)

	dir := t.TempDir()
	sync := append([]string{"sync"}, append(args, "--to", filepath.Join(dir, "out.jsonl"), "--stop-when-caught-up", "--quiet")...)
	e, _, errOut := testEnv(t)
	require.Equal(t, 1, run(context.Background(), sync, e))
	require.Contains(t, errOut.String(), fix)
	require.Empty(t, leftBehind(t, db))

	e, _, errOut = testEnv(t)
	require.Equal(t, 2, run(context.Background(), []string{"sync", "--source", db.DSN, "--tables", "public.ev", "--key", "public.other=a", "--to", "-"}, e))
	require.Contains(t, errOut.String(), "public.other is not among --tables")

	db.Exec(`ALTER TABLE public.ev REPLICA IDENTITY USING INDEX ev_tn`)
	e, _, errOut = testEnv(t)
	require.Equal(t, 0, run(context.Background(), sync, e), errOut.String())
	b, err := os.ReadFile(filepath.Join(dir, "out.jsonl"))
	require.NoError(t, err)
	require.Equal(t, 300, strings.Count(string(b), `"key":{"tenant":`))
	// The application's writes work as before.
	db.Exec(`UPDATE public.ev SET v = 'y' WHERE n = 1`)

	// An index name that needs quotes is printed so that the statement runs as printed.
	db.Exec(`CREATE TABLE public."Ev2" (a int NOT NULL, b text); CREATE UNIQUE INDEX "Ev2_a" ON public."Ev2" (a)`)
	_, out = runDoctorCmd(t, "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication, "--tables", "public.Ev2", "--key", "public.Ev2=a")
	fix2 := `ALTER TABLE "public"."Ev2" REPLICA IDENTITY USING INDEX "Ev2_a";`
	require.Contains(t, out, fix2)
	db.Exec(strings.TrimSuffix(fix2, ";"))
}

// TestPasswordFromEnvironment: a connection string without a password takes it from
// PGPASSWORD, or from the file PGPASSFILE names, as libpq's tools do.
func TestPasswordFromEnvironment(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	role := "pw_" + db.Name[2:]
	db.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'S3cret-pw'`, role))
	t.Cleanup(func() { db.Exec(`DROP ROLE ` + role) })
	cfg, err := pgx.ParseConfig(db.DSN)
	require.NoError(t, err)
	dsn := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, role, db.Name)
	status := func() (int, string) {
		e, out, errOut := testEnv(t)
		code := run(context.Background(), []string{"status", "--source", dsn, "--slot", db.Slot}, e)
		return code, out.String() + errOut.String()
	}
	t.Setenv("PGPASSFILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("PGPASSWORD", "")
	code, out := status()
	require.Equal(t, 1, code, "no password anywhere: refused\n%s", out)

	t.Setenv("PGPASSWORD", "S3cret-pw")
	code, out = status()
	require.Equal(t, 0, code, out)

	t.Setenv("PGPASSWORD", "")
	pass := filepath.Join(t.TempDir(), "pgpass")
	require.NoError(t, os.WriteFile(pass, []byte(fmt.Sprintf("%s:%d:%s:%s:S3cret-pw\n", cfg.Host, cfg.Port, db.Name, role)), 0o600))
	t.Setenv("PGPASSFILE", pass)
	code, out = status()
	require.Equal(t, 0, code, out)
}

// TestEnumCreatedOnTarget: a table with an enum column (and an array of it) syncs into a fresh
// target: the enum is created there as on the source; an enum of that name with fewer labels is
// refused with the ALTER TYPE statements that complete it, before anything is left on the source.
func TestEnumCreatedOnTarget(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE SCHEMA app; CREATE TYPE app.mood AS ENUM ('ok', 'meh', 'it''s fine');
		CREATE TABLE public.m (id int PRIMARY KEY, m app.mood, ms app.mood[]);
		INSERT INTO public.m VALUES (1, 'ok', '{meh,ok}'), (2, 'it''s fine', NULL)`)
	ctx := context.Background()
	tgtDSN, tgt := targetDatabase(t, db)
	args := []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.m", "--to", tgtDSN, "--stop-when-caught-up", "--quiet"}

	_, err := tgt.Exec(ctx, `CREATE SCHEMA app; CREATE TYPE app.mood AS ENUM ('ok', 'it''s fine')`)
	require.NoError(t, err)
	e, _, errOut := testEnv(t)
	require.Equal(t, 1, run(ctx, args, e))
	require.Contains(t, errOut.String(), `ALTER TYPE "app"."mood" ADD VALUE 'meh' AFTER 'ok';`)
	require.Empty(t, leftBehind(t, db))

	// One with the same labels, but another role's: its owner could rename them.
	role := "en_" + db.Name[2:]
	_, err = tgt.Exec(ctx, `DROP TYPE app.mood; CREATE ROLE `+role+`; CREATE TYPE app.mood AS ENUM ('ok', 'meh', 'it''s fine'); ALTER TYPE app.mood OWNER TO `+role)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = tgt.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE `+role) })
	e, _, errOut = testEnv(t)
	require.Equal(t, 1, run(ctx, args, e))
	require.Contains(t, errOut.String(), `ALTER TYPE "app"."mood" OWNER TO CURRENT_USER;`)

	_, err = tgt.Exec(ctx, `DROP TYPE app.mood`)
	require.NoError(t, err)
	e, _, errOut = testEnv(t)
	require.Equal(t, 0, run(ctx, args, e), errOut.String())
	var labels string
	require.NoError(t, tgt.QueryRow(ctx, `SELECT string_agg(enumlabel::text, ',' ORDER BY enumsortorder) FROM pg_enum WHERE enumtypid = 'app.mood'::regtype`).Scan(&labels))
	require.Equal(t, "ok,meh,it's fine", labels)
	src, err := e2e.SourceRows(ctx, db.DSN, "public", "m", []string{"id"})
	require.NoError(t, err)
	dst, err := e2e.SourceRows(ctx, tgtDSN, "public", "m", []string{"id"})
	require.NoError(t, err)
	require.Empty(t, e2e.Diff(dst, src))
}

// TestSlotsFull: a sync that cannot create its slot because every replication slot of the
// server is taken (53400) says so with doctor's fixes: the slots nobody streams from, each with
// its cleanup, and the setting to raise. It leaves nothing behind.
func TestSlotsFull(t *testing.T) {
	e2e.NeedsLocal(t, server, "it takes every replication slot of the server for a moment")
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.orders (id int PRIMARY KEY); INSERT INTO public.orders VALUES (1)`)
	orphan := db.Slot + "_orphan"
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, orphan)
	t.Cleanup(func() { db.Exec(`SELECT pg_drop_replication_slot($1)`, orphan) })
	// Physical slots that reserve no WAL take the rest, at no cost.
	var free int
	require.NoError(t, db.Conn.QueryRow(context.Background(),
		`SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)`).Scan(&free))
	for i := range free {
		db.Exec(`SELECT pg_create_physical_replication_slot($1)`, fmt.Sprintf("%s_fill_%d", db.Slot, i))
	}
	t.Cleanup(func() {
		db.Exec(`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE $1`, db.Slot+`\_fill\_%`)
	})
	e, _, errOut := testEnv(t)
	code := run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.orders", "--to", filepath.Join(t.TempDir(), "out.jsonl"), "--quiet"}, e)
	require.Equal(t, 1, code, errOut.String())
	for _, want := range []string{"max_replication_slots", "slot " + orphan + " (logical, database ", "tidemark cleanup --slot " + orphan,
		"ALTER SYSTEM SET max_replication_slots = "} {
		require.Contains(t, errOut.String(), want)
	}
	require.Empty(t, leftBehind(t, db))
}

// TestUserTypesCreatedOnTarget: the domains and composite types a created table needs are
// created on the target as on the source (what they are made of first: a domain over an enum, a
// composite with a domain attribute, arrays of them; a domain without its CHECK constraints), the
// rows arrive equal, and an existing type of that name with another definition is refused with
// both definitions, leaving nothing behind.
func TestUserTypesCreatedOnTarget(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE SCHEMA app;
		CREATE TYPE app.mood AS ENUM ('ok', 'meh');
		CREATE DOMAIN app.positive AS numeric(10,2) NOT NULL CHECK (VALUE > 0);
		CREATE DOMAIN app.zip AS text COLLATE "C" CHECK (length(VALUE) = 5);
		CREATE DOMAIN app.feeling AS app.mood;
		CREATE TYPE app.addr AS (street text, zip app.zip, tags text[]);
		CREATE TABLE public.u (id int PRIMARY KEY, p app.positive, a app.addr, hist app.addr[], f app.feeling);
		INSERT INTO public.u VALUES (1, 2.5, ROW('Main St', '12345', '{x,y}'), ARRAY[ROW('Old "Rd"', '54321', NULL)::app.addr], 'meh'),
			(2, 1, NULL, NULL, NULL)`)
	ctx := context.Background()
	tgtDSN, tgt := targetDatabase(t, db)
	args := []string{"--source", db.DSN, "--publication", db.Publication, "--tables", "public.u"}

	_, err := tgt.Exec(ctx, `CREATE SCHEMA app; CREATE DOMAIN app.positive AS numeric(10,2) CHECK (VALUE >= 0)`)
	require.NoError(t, err)
	e, _, errOut := testEnv(t)
	require.Equal(t, 1, run(ctx, append([]string{"sync", "--slot", db.Slot, "--to", tgtDSN, "--stop-when-caught-up", "--quiet"}, args...), e))
	require.Contains(t, errOut.String(), `domain "app"."positive" is numeric(10,2) on the target and numeric(10,2) NOT NULL on the source`)
	require.Empty(t, leftBehind(t, db))

	_, err = tgt.Exec(ctx, `DROP DOMAIN app.positive`)
	require.NoError(t, err)
	e, _, errOut = testEnv(t)
	require.Equal(t, 0, run(ctx, append([]string{"sync", "--slot", db.Slot, "--to", tgtDSN, "--stop-when-caught-up", "--quiet"}, args...), e), errOut.String())
	var defs string
	require.NoError(t, tgt.QueryRow(ctx, `SELECT string_agg(format_type(oid, NULL) || ':' || typtype::text, ',' ORDER BY typname) FROM pg_type
		WHERE typnamespace = 'app'::regnamespace AND typtype IN ('c', 'd', 'e')`).Scan(&defs))
	require.Equal(t, "app.addr:c,app.feeling:d,app.mood:e,app.positive:d,app.zip:d", defs)
	// A domain's CHECK constraints are code of the source's, which the sync does not run on the
	// target with its own rights (another source role may have written them): not copied.
	var checks int
	require.NoError(t, tgt.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE contypid IN ('app.positive'::regtype, 'app.zip'::regtype)`).Scan(&checks))
	require.Zero(t, checks)
	e, stdout, errOut := testEnv(t)
	require.Equal(t, 0, run(ctx, append([]string{"verify", "--to", tgtDSN, "--recheck-for", "0"}, args...), e), errOut.String()+stdout.String())
	require.Contains(t, stdout.String(), "public.u: equal (2 rows")
}

// TestEnumLabelAddedLater: a label added to an enum on the source after the target's enum was
// made stops the sync at the first row that uses it, with the statement that adds it on the
// target; once run, the sync goes on and the target equals the source.
func TestEnumLabelAddedLater(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TYPE public.mood AS ENUM ('ok', 'meh');
		CREATE TABLE public.m (id int PRIMARY KEY, m public.mood, ms public.mood[]);
		INSERT INTO public.m VALUES (1, 'ok', '{meh}')`)
	ctx := context.Background()
	tgtDSN, tgt := targetDatabase(t, db)
	args := []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.m", "--to", tgtDSN, "--stop-when-caught-up", "--quiet"}
	e, _, errOut := testEnv(t)
	require.Equal(t, 0, run(ctx, args, e), errOut.String())

	db.Exec(`ALTER TYPE public.mood ADD VALUE 'glad' BEFORE 'ok'`)
	db.Exec(`INSERT INTO public.m VALUES (2, 'glad', '{glad,ok}')`)
	e, _, errOut = testEnv(t)
	require.Equal(t, 1, run(ctx, args, e))
	require.Contains(t, errOut.String(), `ALTER TYPE "public"."mood" ADD VALUE 'glad' BEFORE 'ok';`)

	_, err := tgt.Exec(ctx, `ALTER TYPE public.mood ADD VALUE 'glad' BEFORE 'ok'`)
	require.NoError(t, err)
	e, _, errOut = testEnv(t)
	require.Equal(t, 0, run(ctx, args, e), errOut.String())
	e, stdout, errOut := testEnv(t)
	require.Equal(t, 0, run(ctx, []string{"verify", "--source", db.DSN, "--publication", db.Publication, "--tables", "public.m", "--to", tgtDSN, "--recheck-for", "0"}, e), errOut.String()+stdout.String())
}

// TestInheritanceParent: an inheritance parent is captured as the stream sees it, its own rows
// only: the backfill reads ONLY the parent (its children's rows, streamed under their own names,
// are not the parent's), and the publication the sync creates holds ONLY the parent, so a child
// without a key keeps taking the application's updates and deletes.
func TestInheritanceParent(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.par (id int PRIMARY KEY, v text);
		CREATE TABLE public.kid (x int) INHERITS (public.par);
		INSERT INTO public.par VALUES (1, 'parent'); INSERT INTO public.kid VALUES (2, 'child', 9)`)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	e, _, errOut := testEnv(t)
	require.Equal(t, 0, run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.par", "--to", out, "--stop-when-caught-up", "--quiet"}, e), errOut.String())
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Contains(t, string(b), `"key":{"id":1}`)
	require.NotContains(t, string(b), `"key":{"id":2}`, "a child's row is not the parent's")
	var tables []string
	rows, err := db.Conn.Query(context.Background(), `SELECT tablename::text FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1`, db.Publication)
	require.NoError(t, err)
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"par"}, tables)
	db.Exec(`UPDATE public.kid SET v = 'still works' WHERE id = 2`)
	e, stdout, errOut := testEnv(t)
	require.Equal(t, 0, run(context.Background(), []string{"verify", "--source", db.DSN, "--publication", db.Publication, "--tables", "public.par", "--to", out, "--recheck-for", "0"}, e), errOut.String()+stdout.String())
}

// TestKeyOverrideNotUnique: a key override is unique only through a valid unique index on plain
// columns, all within it: an expression index (lower(name)) or an invalid one (a failed CREATE
// INDEX CONCURRENTLY) does not make id unique, and rows sharing an id would collapse into one.
func TestKeyOverrideNotUnique(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.u (id int NOT NULL, name text NOT NULL, v text);
		CREATE UNIQUE INDEX u_expr ON public.u (id, lower(name));
		ALTER TABLE public.u REPLICA IDENTITY FULL;
		INSERT INTO public.u VALUES (1, 'a', 'x'), (1, 'b', 'y')`)
	args := []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication, "--tables", "public.u", "--key", "public.u=id",
		"--to", filepath.Join(t.TempDir(), "out.jsonl"), "--stop-when-caught-up", "--quiet"}
	e, _, errOut := testEnv(t)
	require.Equal(t, 1, run(context.Background(), args, e), errOut.String())
	require.Contains(t, errOut.String(), "key override (id) of public.u is not unique")
	require.Empty(t, leftBehind(t, db))
}

// TestCompositeAttributeAddedLater: an attribute added to a composite type on the source after
// the target's was made stops the sync at the first value that has it, with the statement that
// adds it on the target; once run, the sync goes on and the target equals the source.
func TestCompositeAttributeAddedLater(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TYPE public.dims AS (w int, h int);
		CREATE TABLE public.c (id int PRIMARY KEY, d public.dims);
		INSERT INTO public.c VALUES (1, ROW(1, 2))`)
	ctx := context.Background()
	tgtDSN, tgt := targetDatabase(t, db)
	args := []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.c", "--to", tgtDSN, "--stop-when-caught-up", "--quiet"}
	e, _, errOut := testEnv(t)
	require.Equal(t, 0, run(ctx, args, e), errOut.String())

	db.Exec(`ALTER TYPE public.dims ADD ATTRIBUTE unit text`)
	db.Exec(`INSERT INTO public.c VALUES (2, ROW(3, 4, 'cm'))`)
	e, _, errOut = testEnv(t)
	require.Equal(t, 1, run(ctx, args, e))
	require.Contains(t, errOut.String(), `ALTER TYPE "public"."dims" ADD ATTRIBUTE unit text;`)

	_, err := tgt.Exec(ctx, `ALTER TYPE public.dims ADD ATTRIBUTE unit text`)
	require.NoError(t, err)
	e, _, errOut = testEnv(t)
	require.Equal(t, 0, run(ctx, args, e), errOut.String())
	e, stdout, errOut := testEnv(t)
	require.Equal(t, 0, run(ctx, []string{"verify", "--source", db.DSN, "--publication", db.Publication, "--tables", "public.c", "--to", tgtDSN, "--recheck-for", "0"}, e), errOut.String()+stdout.String())
}
