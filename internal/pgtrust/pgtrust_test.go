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
	db.Exec(`GRANT TRIGGER ON public.tidemark_own TO ` + other)
	db.Exec(`CREATE INDEX own_extra ON public.tidemark_own ((id + 1))`)
	r := refusal(t, pgtrust.Own(ctx, conn, "own table", name))
	require.Len(t, r.Problems, 8, "%q", r.Problems)
	require.Contains(t, r.Error(), fmt.Sprintf(`owned by role "%s"`, other))
	for _, fix := range r.Fixes {
		db.Exec(fix)
	}
	require.NoError(t, pgtrust.Own(ctx, conn, "own table", name), "once fixed")

	// What a fix of the owner would not remove: a column of a domain, a default calling a
	// function Tidemark did not create. The table is to be dropped.
	db.Exec(`CREATE DOMAIN public.d AS int`)
	db.Exec(`CREATE FUNCTION public.g() RETURNS int LANGUAGE sql AS 'SELECT 1'`)
	db.Exec(`ALTER TABLE public.tidemark_own ADD COLUMN x public.d, ADD COLUMN y int DEFAULT public.g()`)
	r = refusal(t, pgtrust.Own(ctx, conn, "own table", name))
	require.Contains(t, r.Error(), "x public.d")
	require.Contains(t, r.Error(), "public.g()")
	require.Contains(t, r.After, "drop the table")
	db.Exec(`ALTER TABLE public.tidemark_own DROP COLUMN x, DROP COLUMN y`)

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

// TestTable: a target table of the user's is accepted only when its owner, every role that may
// add triggers to it, and the owners of the functions its code calls (triggers, constraints,
// defaults, indexes) are this role or a superuser; its partitions too.
func TestTable(t *testing.T) {
	db, conn, other := fixture(t)
	ctx := context.Background()
	const name = `"public"."target"`
	db.Exec(`CREATE TABLE public.target (id int PRIMARY KEY)`)
	require.NoError(t, pgtrust.Table(ctx, conn, "target table", name), "this role's, no code")

	db.Exec(`ALTER TABLE public.target OWNER TO ` + other)
	r := refusal(t, pgtrust.Table(ctx, conn, "target table", name))
	require.Contains(t, r.Error(), fmt.Sprintf(`owned by role "%s"`, other), "its owner can add code at any time")
	db.Exec(`ALTER TABLE public.target OWNER TO CURRENT_USER`)

	db.Exec(`GRANT TRIGGER ON public.target TO ` + other)
	r = refusal(t, pgtrust.Table(ctx, conn, "target table", name))
	require.Contains(t, r.Error(), "may add triggers")
	db.Exec(`REVOKE TRIGGER ON public.target FROM ` + other)

	// Code of this role's table, calling a function another role owns (and could replace).
	for _, code := range []struct{ add, drop string }{
		{`CREATE TRIGGER audit AFTER INSERT ON public.target FOR EACH ROW EXECUTE FUNCTION public.audit()`, `DROP TRIGGER audit ON public.target`},
		{`ALTER TABLE public.target ADD CONSTRAINT ok CHECK (public.positive(id))`, `ALTER TABLE public.target DROP CONSTRAINT ok`},
		{`ALTER TABLE public.target ADD COLUMN d bool DEFAULT public.positive(1)`, `ALTER TABLE public.target DROP COLUMN d`},
		{`CREATE INDEX target_expr ON public.target ((public.positive(id)))`, `DROP INDEX public.target_expr`},
	} {
		db.Exec(`CREATE FUNCTION public.audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`)
		db.Exec(`CREATE FUNCTION public.positive(int) RETURNS bool LANGUAGE sql IMMUTABLE AS 'SELECT $1 > 0'`)
		db.Exec(code.add)
		require.NoError(t, pgtrust.Table(ctx, conn, "target table", name), "%s: the function is this role's", code.add)
		db.Exec(`ALTER FUNCTION public.audit() OWNER TO ` + other)
		db.Exec(`ALTER FUNCTION public.positive(int) OWNER TO ` + other)
		r = refusal(t, pgtrust.Table(ctx, conn, "target table", name))
		require.Contains(t, r.Error(), "could replace their body", code.add)
		db.Exec(code.drop)
		db.Exec(`DROP FUNCTION public.audit()`)
		db.Exec(`DROP FUNCTION public.positive(int)`)
	}

	// A partition of another owner.
	db.Exec(`CREATE TABLE public.parted (id int PRIMARY KEY) PARTITION BY RANGE (id)`)
	db.Exec(`CREATE TABLE public.parted_1 PARTITION OF public.parted FOR VALUES FROM (0) TO (100)`)
	require.NoError(t, pgtrust.Table(ctx, conn, "target table", `"public"."parted"`))
	db.Exec(`ALTER TABLE public.parted_1 OWNER TO ` + other)
	r = refusal(t, pgtrust.Table(ctx, conn, "target table", `"public"."parted"`))
	require.Contains(t, r.Error(), "its partition public.parted_1")
}

// TestDomain: a column's domains (its type, an array's elements, a composite's fields) run their
// constraints and default with this role's rights on every value, and their owners can add
// constraints at any time: each must be owned by this role or a superuser, and so must the
// functions they call.
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
	db.Exec(`CREATE TYPE public.pair AS (a int, b public.plain)`)
	for _, n := range []string{"integer", "public.plain", "public.checked", "public.nested", "public.plain[]", "public.pair", "public.pair[]"} {
		require.NoError(t, pgtrust.Domain(ctx, conn, "column", typ(n)), n)
	}
	db.Exec(`ALTER DOMAIN public.plain OWNER TO ` + other)
	for _, n := range []string{"public.plain", "public.plain[]", "public.pair", "public.pair[]"} {
		r := refusal(t, pgtrust.Domain(ctx, conn, "column", typ(n)))
		require.Contains(t, r.Error(), fmt.Sprintf(`its domain public.plain is owned by role "%s"`, other), n)
	}
	db.Exec(`ALTER DOMAIN public.checked OWNER TO ` + other)
	r := refusal(t, pgtrust.Domain(ctx, conn, "column", typ("public.nested")))
	require.Contains(t, r.Error(), fmt.Sprintf(`its domain public.checked is owned by role "%s"`, other))
	db.Exec(`ALTER DOMAIN public.checked OWNER TO CURRENT_USER`)
	db.Exec(`ALTER FUNCTION public.ok(int) OWNER TO ` + other)
	r = refusal(t, pgtrust.Domain(ctx, conn, "column", typ("public.checked")))
	require.Contains(t, r.Error(), "public.ok(integer) of "+other)
}

// TestGuard: the guard a transaction writing an own table runs first passes on the table Own
// accepted, and fails once anything Own refuses is there (a trigger added, the owner changed).
func TestGuard(t *testing.T) {
	db, conn, other := fixture(t)
	ctx := context.Background()
	const name = `"public"."tidemark_own"`
	db.Exec(`CREATE TABLE public.tidemark_own (id int PRIMARY KEY)`)
	guard := func() error {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, pgtrust.LockSQL(name)); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, pgtrust.Guard("own table", name))
		return err
	}
	require.NoError(t, guard())
	db.Exec(`CREATE FUNCTION public.f() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN RETURN NEW; END $f$`)
	db.Exec(`CREATE TRIGGER tr BEFORE INSERT ON public.tidemark_own FOR EACH ROW EXECUTE FUNCTION public.f()`)
	require.ErrorContains(t, guard(), "changed while Tidemark ran")
	db.Exec(`DROP TRIGGER tr ON public.tidemark_own`)
	require.NoError(t, guard())
	db.Exec(`GRANT TRIGGER ON public.tidemark_own TO ` + other)
	require.ErrorContains(t, guard(), "changed while Tidemark ran")
	db.Exec(`REVOKE TRIGGER ON public.tidemark_own FROM ` + other)
	db.Exec(`ALTER TABLE public.tidemark_own OWNER TO ` + other)
	require.ErrorContains(t, guard(), "changed while Tidemark ran")
	db.Exec(`DROP TABLE public.tidemark_own`)
	require.ErrorContains(t, guard(), "does not exist", "a table dropped is no table to write")
}

// TestDomainComposite: a composite type of another role's is refused (its owner can add a field
// of a domain with constraints at any time), whether the column has it or it is nested.
func TestDomainComposite(t *testing.T) {
	db, conn, other := fixture(t)
	ctx := context.Background()
	typ := func(name string) uint32 {
		var oid uint32
		require.NoError(t, conn.QueryRow(ctx, `SELECT $1::regtype::oid`, name).Scan(&oid))
		return oid
	}
	db.Exec(`CREATE TYPE public.addr AS (street text, zip int)`)
	db.Exec(`CREATE TYPE public.place AS (a public.addr, n int)`)
	require.NoError(t, pgtrust.Domain(ctx, conn, "column", typ("public.place")))
	db.Exec(`ALTER TYPE public.addr OWNER TO ` + other)
	for _, n := range []string{"public.addr", "public.addr[]", "public.place"} {
		r := refusal(t, pgtrust.Domain(ctx, conn, "column", typ(n)))
		require.Contains(t, r.Error(), fmt.Sprintf(`its composite type public.addr is owned by role "%s"`, other), n)
	}
	db.Exec(`ALTER TYPE public.addr OWNER TO CURRENT_USER`)
	require.NoError(t, pgtrust.Domain(ctx, conn, "column", typ("public.place")))
}

// TestGuardTable: the guard of a user's table passes on the table Table accepted, and fails
// once it is another table of the same name, another role owns it or one of its partitions, or
// another role may add triggers to it.
func TestGuardTable(t *testing.T) {
	db, conn, other := fixture(t)
	ctx := context.Background()
	const name = `"public"."target"`
	db.Exec(`CREATE TABLE public.target (id int PRIMARY KEY) PARTITION BY RANGE (id)`)
	db.Exec(`CREATE TABLE public.target_1 PARTITION OF public.target FOR VALUES FROM (0) TO (100)`)
	var oid uint32
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass($1)::oid`, name).Scan(&oid))
	require.NoError(t, pgtrust.Table(ctx, conn, "target table", name))
	guard := func() error {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, pgtrust.LockSQL(name)); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, pgtrust.GuardTable("target table", name, oid))
		return err
	}
	require.NoError(t, guard())
	for _, c := range []struct{ change, undo string }{
		{`GRANT TRIGGER ON public.target TO ` + other, `REVOKE TRIGGER ON public.target FROM ` + other},
		{`GRANT TRIGGER ON public.target_1 TO PUBLIC`, `REVOKE TRIGGER ON public.target_1 FROM PUBLIC`},
		{`ALTER TABLE public.target OWNER TO ` + other, `ALTER TABLE public.target OWNER TO CURRENT_USER`},
		{`ALTER TABLE public.target_1 OWNER TO ` + other, `ALTER TABLE public.target_1 OWNER TO CURRENT_USER`},
	} {
		db.Exec(c.change)
		require.ErrorContains(t, guard(), "changed while Tidemark ran", c.change)
		db.Exec(c.undo)
		require.NoError(t, guard(), c.undo)
	}
	db.Exec(`DROP TABLE public.target`)
	db.Exec(`CREATE TABLE public.target (id int PRIMARY KEY)`)
	require.ErrorContains(t, guard(), "changed while Tidemark ran", "another table of the same name")
	db.Exec(`DROP TABLE public.target`)
	require.ErrorContains(t, guard(), "does not exist")
}

// TestDomainRange: a range (and its multirange) over a domain runs the domain's constraints on
// every value written (range_in calls the subtype's input), so a domain of another role's under
// a range is refused like one under an array.
func TestDomainRange(t *testing.T) {
	db, conn, other := fixture(t)
	ctx := context.Background()
	typ := func(name string) uint32 {
		var oid uint32
		require.NoError(t, conn.QueryRow(ctx, `SELECT $1::regtype::oid`, name).Scan(&oid))
		return oid
	}
	db.Exec(`CREATE DOMAIN public.pos AS int CHECK (VALUE > 0)`)
	db.Exec(`CREATE TYPE public.posrange AS RANGE (subtype = public.pos)`)
	for _, n := range []string{"public.posrange", "public.posrange[]", "public.posmultirange"} {
		require.NoError(t, pgtrust.Domain(ctx, conn, "column", typ(n)), n)
	}
	db.Exec(`ALTER DOMAIN public.pos OWNER TO ` + other)
	for _, n := range []string{"public.posrange", "public.posrange[]", "public.posmultirange"} {
		r := refusal(t, pgtrust.Domain(ctx, conn, "column", typ(n)))
		require.Contains(t, r.Error(), fmt.Sprintf(`its domain public.pos is owned by role "%s"`, other), n)
	}
}

// TestTableInheritanceChildren: writes to a table reach the tables that inherit from it (a DELETE
// or TRUNCATE of the parent), and fire their triggers: a table with inheritance children is
// refused at the check, and a child added since by the guard.
func TestTableInheritanceChildren(t *testing.T) {
	db, conn, other := fixture(t)
	ctx := context.Background()
	const name = `"public"."parent"`
	db.Exec(`CREATE TABLE public.parent (id int PRIMARY KEY)`)
	var oid uint32
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass($1)::oid`, name).Scan(&oid))
	require.NoError(t, pgtrust.Table(ctx, conn, "target table", name))
	guard := func() error {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, pgtrust.GuardTable("target table", name, oid))
		return err
	}
	require.NoError(t, guard())
	db.Exec(`CREATE TABLE public.child () INHERITS (public.parent)`)
	db.Exec(`ALTER TABLE public.child OWNER TO ` + other)
	r := refusal(t, pgtrust.Table(ctx, conn, "target table", name))
	require.Contains(t, r.Error(), "tables inherit from public.parent (public.child)")
	require.ErrorContains(t, guard(), "changed while Tidemark ran")
	// The fix the refusal gives makes both pass again (relhassubclass stays set until an
	// ANALYZE: the guard reads pg_inherits).
	db.Exec(`ALTER TABLE public.child NO INHERIT public.parent`)
	require.NoError(t, pgtrust.Table(ctx, conn, "target table", name))
	require.NoError(t, guard())
}

// TestTableAncestors: a parent's owner can add a constraint or a default that applies to its
// partitions and inheritance children, whoever owns them: a target table under a parent of
// another role is refused (at the check, and by the guard if the parent changes hands since).
func TestTableAncestors(t *testing.T) {
	db, conn, other := fixture(t)
	ctx := context.Background()
	oid := func(name string) uint32 {
		var oid uint32
		require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass($1)::oid`, name).Scan(&oid))
		return oid
	}
	guard := func(name string) error {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, pgtrust.GuardTable("target table", name, oid(name)))
		return err
	}
	db.Exec(`CREATE TABLE public.p (id int PRIMARY KEY) PARTITION BY RANGE (id)`)
	db.Exec(`CREATE TABLE public.c PARTITION OF public.p FOR VALUES FROM (0) TO (100)`)
	db.Exec(`CREATE TABLE public.ip (id int PRIMARY KEY)`)
	db.Exec(`CREATE TABLE public.ic (id int PRIMARY KEY) INHERITS (public.ip)`)
	require.NoError(t, pgtrust.Table(ctx, conn, "target table", `"public"."c"`))
	require.NoError(t, guard(`"public"."c"`))

	db.Exec(`ALTER TABLE public.p OWNER TO ` + other)
	r := refusal(t, pgtrust.Table(ctx, conn, "target table", `"public"."c"`))
	require.Contains(t, r.Error(), "public.p")
	require.ErrorContains(t, guard(`"public"."c"`), "changed while Tidemark ran")

	// An inheritance child is refused whoever owns its parent: the parent's owner, or anyone
	// it is given to, can add a constraint that runs on the child's rows.
	r = refusal(t, pgtrust.Table(ctx, conn, "target table", `"public"."ic"`))
	require.Contains(t, r.Error(), "inherits from public.ip")
	require.ErrorContains(t, guard(`"public"."ic"`), "changed while Tidemark ran")
	for _, fix := range r.Fixes {
		db.Exec(fix)
	}
	require.NoError(t, pgtrust.Table(ctx, conn, "target table", `"public"."ic"`))
}

// TestDomainRangeFunction: a range type's subtype_diff runs in GiST index inserts on its
// values (an exclusion constraint), with the rights of the role writing: a range type whose
// subtype_diff belongs to another role is refused.
func TestDomainRangeFunction(t *testing.T) {
	db, conn, other := fixture(t)
	ctx := context.Background()
	db.Exec(`CREATE FUNCTION public.diff(float8, float8) RETURNS float8 LANGUAGE sql IMMUTABLE AS 'SELECT $1 - $2'`)
	db.Exec(`CREATE TYPE public.fr AS RANGE (subtype = float8, subtype_diff = public.diff)`)
	var oid uint32
	require.NoError(t, conn.QueryRow(ctx, `SELECT 'public.fr'::regtype::oid`).Scan(&oid))
	require.NoError(t, pgtrust.Domain(ctx, conn, "column", oid))
	db.Exec(`ALTER FUNCTION public.diff(float8, float8) OWNER TO ` + other)
	r := refusal(t, pgtrust.Domain(ctx, conn, "column", oid))
	require.Contains(t, r.Error(), "public.diff(double precision,double precision)")
}
