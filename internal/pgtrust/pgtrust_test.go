package pgtrust_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgtrust"
)

var server *e2e.Server

func TestMain(m *testing.M) { os.Exit(e2e.Main(m, &server)) }

// fixture is a database with an unprivileged role (other) and Tidemark's connection to it, as
// the superuser the tests run as.
func fixture(t *testing.T) (db *e2e.TestDB, conn *pgx.Conn, other string) {
	db = e2e.NewTestDB(t, server)
	other = "other_" + db.Name
	db.Exec(`CREATE ROLE ` + other + ` NOLOGIN`)
	db.Exec(`GRANT CREATE ON SCHEMA public TO ` + other)
	t.Cleanup(func() {
		db.Exec(`REASSIGN OWNED BY ` + other + ` TO CURRENT_USER`)
		db.Exec(`DROP OWNED BY ` + other)
		db.Exec(`DROP ROLE ` + other)
	})
	conn, err := pgconf.Open(context.Background(), db.DSN, "tidemark-test")
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return db, conn, other
}

func refusal(t *testing.T, err error) *pgtrust.Refused {
	t.Helper()
	var r *pgtrust.Refused
	require.True(t, errors.As(err, &r), "want a refusal, got %v", err)
	require.ErrorIs(t, err, pgtrust.ErrUntrusted)
	return r
}

// TestOwn: a table of Tidemark's own is accepted only when this role owns it and it carries
// nothing Tidemark did not create; each problem is named with its fix, and applying the fixes
// makes it accepted.
func TestOwn(t *testing.T) {
	db, conn, other := fixture(t)
	ctx := context.Background()
	const name = `"public"."tidemark_own"`
	require.NoError(t, pgtrust.Own(ctx, conn, "own table", name), "a missing table is the caller's to create")

	db.Exec(`CREATE TABLE public.tidemark_own (id int PRIMARY KEY)`)
	require.NoError(t, pgtrust.Own(ctx, conn, "own table", name))

	// Everything Tidemark would not create, at once.
	db.Exec(`CREATE FUNCTION public.f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`)
	db.Exec(`CREATE TRIGGER tr BEFORE INSERT ON public.tidemark_own FOR EACH ROW EXECUTE FUNCTION public.f()`)
	db.Exec(`CREATE TABLE public.log (id int)`)
	db.Exec(`CREATE RULE ru AS ON UPDATE TO public.tidemark_own DO ALSO INSERT INTO public.log VALUES (NEW.id)`)
	db.Exec(`CREATE POLICY po ON public.tidemark_own USING (true)`)
	db.Exec(`ALTER TABLE public.tidemark_own ENABLE ROW LEVEL SECURITY`)
	db.Exec(`CREATE TABLE public.child () INHERITS (public.tidemark_own)`)
	db.Exec(`ALTER TABLE public.tidemark_own OWNER TO ` + other)
	r := refusal(t, pgtrust.Own(ctx, conn, "own table", name))
	require.Len(t, r.Problems, 6, "%q", r.Problems)
	require.Contains(t, r.Error(), fmt.Sprintf(`owned by role "%s"`, other))
	for _, fix := range r.Fixes {
		db.Exec(fix)
	}
	require.NoError(t, pgtrust.Own(ctx, conn, "own table", name), "once fixed")

	// A superuser other than this role is refused too, and a view is no table.
	db.Exec(`CREATE ROLE super_` + db.Name + ` SUPERUSER NOLOGIN`)
	t.Cleanup(func() {
		db.Exec(`REASSIGN OWNED BY super_` + db.Name + ` TO CURRENT_USER`)
		db.Exec(`DROP ROLE super_` + db.Name)
	})
	db.Exec(`ALTER TABLE public.tidemark_own OWNER TO super_` + db.Name)
	refusal(t, pgtrust.Own(ctx, conn, "own table", name))
	db.Exec(`CREATE VIEW public.tidemark_view AS SELECT 1 AS id`)
	r = refusal(t, pgtrust.Own(ctx, conn, "own table", `"public"."tidemark_view"`))
	require.Contains(t, r.Error(), "not an ordinary table")
}

// TestTable: a target table of the user's is accepted whoever owns it when it carries no code;
// with a trigger, only when its owner and the trigger function's owner are this role or a
// superuser.
func TestTable(t *testing.T) {
	db, conn, other := fixture(t)
	ctx := context.Background()
	const name = `"public"."target"`
	db.Exec(`CREATE TABLE public.target (id int PRIMARY KEY)`)
	db.Exec(`ALTER TABLE public.target OWNER TO ` + other)
	require.NoError(t, pgtrust.Table(ctx, conn, "target table", name), "no code: accepted whoever owns it")

	db.Exec(`CREATE FUNCTION public.audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`)
	db.Exec(`CREATE TRIGGER audit AFTER INSERT ON public.target FOR EACH ROW EXECUTE FUNCTION public.audit()`)
	r := refusal(t, pgtrust.Table(ctx, conn, "target table", name))
	require.Contains(t, r.Error(), fmt.Sprintf(`owned by role "%s"`, other))
	require.Contains(t, r.Error(), "triggers audit (function public.audit() of")

	db.Exec(`ALTER TABLE public.target OWNER TO CURRENT_USER`)
	require.NoError(t, pgtrust.Table(ctx, conn, "target table", name), "the table and its trigger function are this role's")

	db.Exec(`ALTER FUNCTION public.audit() OWNER TO ` + other)
	r = refusal(t, pgtrust.Table(ctx, conn, "target table", name))
	require.Contains(t, r.Error(), "could replace their body")
	db.Exec(`ALTER TABLE public.target DISABLE TRIGGER audit`)
	require.NoError(t, pgtrust.Table(ctx, conn, "target table", name), "a disabled trigger runs nothing")
}

// TestDomain: a column's domain with CHECK constraints runs them with this role's rights on
// every value: its owner and the owners of the functions they call must be this role or a
// superuser. A domain without constraints, and other types, pass.
func TestDomain(t *testing.T) {
	db, conn, other := fixture(t)
	ctx := context.Background()
	typ := func(name string) uint32 {
		var oid uint32
		require.NoError(t, conn.QueryRow(ctx, `SELECT $1::regtype::oid`, name).Scan(&oid))
		return oid
	}
	db.Exec(`CREATE DOMAIN public.plain AS int`)
	db.Exec(`CREATE FUNCTION public.ok(int) RETURNS bool LANGUAGE sql AS 'SELECT $1 > 0'`)
	db.Exec(`CREATE DOMAIN public.checked AS int CHECK (public.ok(VALUE))`)
	db.Exec(`CREATE DOMAIN public.nested AS public.checked`)
	db.Exec(`ALTER DOMAIN public.plain OWNER TO ` + other)
	for _, n := range []string{"integer", "public.plain", "public.checked", "public.nested"} {
		require.NoError(t, pgtrust.Domain(ctx, conn, "column", typ(n)), n)
	}
	db.Exec(`ALTER DOMAIN public.checked OWNER TO ` + other)
	r := refusal(t, pgtrust.Domain(ctx, conn, "column", typ("public.nested")))
	require.Contains(t, r.Error(), fmt.Sprintf(`its domain public.checked, with CHECK constraints that run with this role's rights on every value written, is owned by role "%s"`, other))
	db.Exec(`ALTER DOMAIN public.checked OWNER TO CURRENT_USER`)
	db.Exec(`ALTER FUNCTION public.ok(int) OWNER TO ` + other)
	r = refusal(t, pgtrust.Domain(ctx, conn, "column", typ("public.checked")))
	require.Contains(t, r.Error(), "public.ok(integer) of "+other)
}
