package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// hostileRole creates a role without privileges but CREATE on schema public of the databases
// given (PostgreSQL's default for databases created on 14 and older), and returns its name.
func hostileRole(t *testing.T, name string, dsns ...string) string {
	ctx := context.Background()
	admin, err := server.Admin(ctx)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	_, err = admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{name}.Sanitize()+" LOGIN NOSUPERUSER")
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := server.Admin(context.Background())
		if err == nil {
			defer c.Close(context.Background())
			for _, dsn := range dsns {
				if d, err := pgx.Connect(context.Background(), dsn); err == nil {
					_, _ = d.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{name}.Sanitize())
					d.Close(context.Background())
				}
			}
			_, _ = c.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
		}
	})
	for _, dsn := range dsns {
		c, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		_, err = c.Exec(ctx, "GRANT CREATE ON SCHEMA public TO "+pgx.Identifier{name}.Sanitize())
		c.Close(ctx)
		require.NoError(t, err)
	}
	return name
}

// plant creates, as role, a function in public whose body makes role a superuser when the
// caller is one, then does what the builtin does (body: the builtin's call, on $1, $2...).
func plant(t *testing.T, dsn, role, signature, returns, body string) {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer c.Close(ctx)
	_, err = c.Exec(ctx, fmt.Sprintf(`SET ROLE %[1]s;
		CREATE FUNCTION public.%[2]s RETURNS %[3]s LANGUAGE plpgsql AS $f$
		BEGIN
			IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
				EXECUTE 'ALTER ROLE %[1]s SUPERUSER';
			END IF;
			%[4]s;
		END $f$;
		RESET ROLE`, pgx.Identifier{role}.Sanitize(), signature, returns, body))
	require.NoError(t, err)
}

func isSuperuser(t *testing.T, role string) bool {
	ctx := context.Background()
	admin, err := server.Admin(ctx)
	require.NoError(t, err)
	defer admin.Close(ctx)
	var super bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = $1`, role).Scan(&super))
	return super
}

// TestHostileFunctionsGainNothing reproduces the privilege escalation of a role with CREATE on
// public (CVE-2018-1058's pattern): a function in public whose argument types match a call of
// Tidemark's better than the builtin's would run, as Tidemark's role (here a superuser), on the
// source (unnest(int2vector), called to read a key's columns) and on the target
// (hashtextextended(text, integer), called to take the sink's advisory lock). The sync must not
// call them: the role stays without privileges.
func TestHostileFunctionsGainNothing(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE h (id int PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO h SELECT g, md5(g::text) FROM generate_series(1, 100) g`)
	tgtDSN, _ := targetDatabase(t, db)
	role := hostileRole(t, "mallory_"+db.Name, db.DSN, tgtDSN)
	plant(t, db.DSN, role, "unnest(int2vector)", "SETOF smallint", "RETURN QUERY SELECT pg_catalog.unnest($1::pg_catalog.int2[])")
	plant(t, tgtDSN, role, "hashtextextended(text, integer)", "bigint", "RETURN pg_catalog.hashtextextended($1, $2::pg_catalog.int8)")

	e, _, errOut := testEnv(t)
	require.Equal(t, 0, run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.h", "--to", tgtDSN, "--stop-when-caught-up"}, e), errOut.String())
	require.False(t, isSuperuser(t, role), "a function planted in public ran as the sync's role and made %s a superuser", role)
}

// TestHostileOwnTables reproduces the sink's own tables trusted blindly: a role with CREATE on
// public creates public.tidemark_checkpoint (and public.tidemark_applied) first, with a trigger
// whose function makes it a superuser when a superuser writes the table. The sync must refuse
// the tables, say why and how to fix them, and write nothing to them.
func TestHostileOwnTables(t *testing.T) {
	for _, table := range []string{"tidemark_checkpoint", "tidemark_applied"} {
		t.Run(table, func(t *testing.T) {
			db := e2e.NewTestDB(t, server)
			db.Exec(`CREATE TABLE h (id int PRIMARY KEY, v text)`)
			db.Exec(`INSERT INTO h SELECT g, md5(g::text) FROM generate_series(1, 10) g`)
			// Changes streamed after the slot: the audit ledger gets a row for each.
			db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE h`)
			db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
			db.Exec(`INSERT INTO h VALUES (11, 'live')`)
			db.Exec(`UPDATE h SET v = 'changed' WHERE id = 1`)
			tgtDSN, tgt := targetDatabase(t, db)
			role := hostileRole(t, "mallory_"+db.Name, tgtDSN)
			ctx := context.Background()
			create := map[string]string{
				"tidemark_checkpoint": `CREATE TABLE public.tidemark_checkpoint (id text PRIMARY KEY, position jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(), target_schema text NOT NULL DEFAULT '')`,
				"tidemark_applied":    `CREATE TABLE public.tidemark_applied (commit_lsn pg_lsn PRIMARY KEY, xid bigint NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
			}[table]
			_, err := tgt.Exec(ctx, fmt.Sprintf(`SET ROLE %[1]s;
				%[3]s;
				GRANT ALL ON public.%[2]s TO PUBLIC;
				CREATE FUNCTION public.escalate() RETURNS trigger LANGUAGE plpgsql AS $f$
				BEGIN
					IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
						EXECUTE 'ALTER ROLE %[1]s SUPERUSER';
					END IF;
					RETURN NEW;
				END $f$;
				CREATE TRIGGER escalate BEFORE INSERT OR UPDATE ON public.%[2]s FOR EACH ROW EXECUTE FUNCTION public.escalate();
				RESET ROLE`, pgx.Identifier{role}.Sanitize(), table, create))
			require.NoError(t, err)

			e, _, errOut := testEnv(t)
			code := run(ctx, []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
				"--tables", "public.h", "--to", tgtDSN, "--audit", "--stop-when-caught-up"}, e)
			require.False(t, isSuperuser(t, role), "the trigger of %s's %s ran as the sync's role", role, table)
			require.Equal(t, 1, code, errOut.String())
			require.Contains(t, errOut.String(), `"public"."`+table+`" is refused`)
			require.Contains(t, errOut.String(), fmt.Sprintf(`owned by role "%s"`, role))
			require.Contains(t, errOut.String(), `DROP TRIGGER "escalate" ON "public"."`+table+`";`)
			var n int
			require.NoError(t, tgt.QueryRow(ctx, `SELECT count(*) FROM public.`+table).Scan(&n))
			require.Zero(t, n, "nothing written to the refused table")
		})
	}
}

// TestHostileColumnTypeOnSource: the owner of a captured table (here a role without privileges)
// adds a column of an enum of theirs, with a default that existing rows take without a row event,
// and a cast of the enum to text with a function of theirs. The PostgreSQL sink reads that value
// on the source to give the target's rows; converting it with casts would run that function as
// Tidemark's role (a superuser here). The value must be read without running any code of the
// type's owner (casts are found by type, whatever search_path says).
func TestHostileColumnTypeOnSource(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	tgtDSN, _ := targetDatabase(t, db)
	role := hostileRole(t, "mallory_"+db.Name, db.DSN, tgtDSN)
	ident := pgx.Identifier{role}.Sanitize()
	db.Exec(`CREATE TABLE public.h (id int PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO public.h SELECT g, md5(g::text) FROM generate_series(1, 10) g`)
	db.Exec(`ALTER TABLE public.h OWNER TO ` + ident)
	sync := func() (int, string) {
		e, _, errOut := testEnv(t)
		code := run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
			"--tables", "public.h", "--to", tgtDSN, "--stop-when-caught-up", "--quiet"}, e)
		return code, errOut.String()
	}
	code, msg := sync()
	require.Equal(t, 0, code, msg)
	db.Exec(`SET ROLE ` + ident + `; CREATE TYPE public.mood AS ENUM ('sad', 'happy'); RESET ROLE`)
	plant(t, db.DSN, role, "pwn(public.mood)", "text", "RETURN 'happy'")
	db.Exec(`SET ROLE ` + ident + `;
		CREATE CAST (public.mood AS text) WITH FUNCTION public.pwn(public.mood);
		ALTER TABLE public.h ADD COLUMN f public.mood DEFAULT 'happy';
		UPDATE public.h SET v = 'changed' WHERE id = 1;
		RESET ROLE`)
	// Casts have no owner: DROP OWNED leaves them, and they hold the function and the type.
	t.Cleanup(func() { db.Exec(`DROP TABLE public.h; DROP CAST (public.mood AS text)`) })
	var missing bool
	require.NoError(t, db.Connect().QueryRow(context.Background(), `SELECT atthasmissing FROM pg_attribute WHERE attrelid = 'public.h'::regclass AND attname = 'f'`).Scan(&missing))
	require.True(t, missing, "the existing rows take the default without a rewrite")
	require.False(t, isSuperuser(t, role))
	// The target has the type too (as another role's): the sink adds the column with it.
	tgt, err := pgx.Connect(context.Background(), tgtDSN)
	require.NoError(t, err)
	_, err = tgt.Exec(context.Background(), `CREATE TYPE public.mood AS ENUM ('sad', 'happy')`)
	require.NoError(t, err)
	tgt.Close(context.Background())
	code, msg = sync()
	t.Logf("second sync: exit %d: %s", code, msg)
	require.False(t, isSuperuser(t, role), "the sync cast the column's value with a cast of %s's, as a superuser", role)
	require.Equal(t, 0, code, msg)
	var f string
	tgt, err = pgx.Connect(context.Background(), tgtDSN)
	require.NoError(t, err)
	defer tgt.Close(context.Background())
	require.NoError(t, tgt.QueryRow(context.Background(), `SELECT f::text FROM public.h WHERE id = 2`).Scan(&f))
	require.Equal(t, "happy", f, "the existing rows' value")
}

// TestTargetTableReplaced: the owner of the target schema (not Tidemark's role) may drop a
// table in it, even one Tidemark owns, and make another of the same name with a trigger of
// theirs, between two of the sink's transactions. The sink checked the table when it first
// used it; it must not write the replacement, whose trigger would run as its role (a superuser
// here): it stops, saying the table changed.
func TestTargetTableReplaced(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	tgtDSN, tgt := targetDatabase(t, db)
	role := hostileRole(t, "mallory_"+db.Name, db.DSN, tgtDSN)
	ident := pgx.Identifier{role}.Sanitize()
	ctx := context.Background()
	_, err := tgt.Exec(ctx, `CREATE SCHEMA app AUTHORIZATION `+ident)
	require.NoError(t, err)
	db.Exec(`CREATE TABLE public.h (id int PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO public.h SELECT g, md5(g::text) FROM generate_series(1, 10) g`)
	plant(t, tgtDSN, role, "pwn()", "trigger", "RETURN NEW")

	e, _, errOut := testEnv(t)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(runCtx, []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
			"--tables", "public.h", "--to", tgtDSN, "--target-schema", "app", "--checkpoint-interval", "100ms", "--quiet"}, e)
	}()
	rows := func() int {
		var n int
		_ = tgt.QueryRow(ctx, `SELECT count(*) FROM app.h`).Scan(&n)
		return n
	}
	require.Eventually(t, func() bool { return rows() == 10 }, 30*time.Second, 50*time.Millisecond, "the backfill reached the target")
	time.Sleep(300 * time.Millisecond) // past a checkpoint: the sink's transaction is closed
	_, err = tgt.Exec(ctx, `SET ROLE `+ident+`;
		DROP TABLE app.h;
		CREATE TABLE app.h (id int PRIMARY KEY, v text);
		CREATE TRIGGER pwn BEFORE INSERT OR UPDATE OR DELETE ON app.h FOR EACH ROW EXECUTE FUNCTION public.pwn();
		RESET ROLE`)
	require.NoError(t, err)
	db.Exec(`INSERT INTO public.h VALUES (11, 'after')`)
	db.Exec(`UPDATE public.h SET v = 'changed' WHERE id = 1`)
	var code int
	select {
	case code = <-done:
	case <-time.After(20 * time.Second):
		cancel()
		code = <-done
	}
	require.False(t, isSuperuser(t, role), "the sink wrote the replaced table, running %s's trigger as a superuser", role)
	require.Equal(t, 1, code, "the sync stops:\n%s", errOut.String())
	require.Regexp(t, `target table "app"."h" (is refused|is not the table this sync checked)`, errOut.String())
}
