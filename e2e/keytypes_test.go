package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgconf"
)

// TestKeysOfTypesOutsideCatalog: every connection pins search_path to pg_catalog (docs/security.md),
// so a key whose type lives in another schema is compared with its own operators, named
// OPERATOR(schema.op) from its default btree operator class (chunker.Ops), not with text's,
// which a bare > would resolve to for citext: text orders 'B' before 'a', citext after, so a
// keyset chunk would skip or repeat rows. Keys of citext, of a domain over citext, of an enum
// declared out of alphabetical order, and a composite of citext and integer (whose operators are
// in two schemas) are backfilled one row per chunk, with a change inside a window: every key
// once, the output equal to the source, and each chunk read from the key's index.
func TestKeysOfTypesOutsideCatalog(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE EXTENSION citext`)
	db.Exec(`CREATE DOMAIN ci AS citext CHECK (VALUE <> '')`)
	db.Exec(`CREATE TYPE mood AS ENUM ('zesty', 'happy', 'blue', 'angry')`)
	db.Exec(`CREATE SEQUENCE ver`)
	keys := []string{"a", "B", "c", "D", "e", "F", "g", "H"}
	tables := map[string]string{
		"c1": `CREATE TABLE c1 (k citext PRIMARY KEY, v text, ver bigint NOT NULL DEFAULT nextval('ver'))`,
		"c2": `CREATE TABLE c2 (k ci PRIMARY KEY, v text, ver bigint NOT NULL DEFAULT nextval('ver'))`,
		"c3": `CREATE TABLE c3 (k mood PRIMARY KEY, v text, ver bigint NOT NULL DEFAULT nextval('ver'))`,
		"c4": `CREATE TABLE c4 (tenant citext, id int, v text, ver bigint NOT NULL DEFAULT nextval('ver'), PRIMARY KEY (tenant, id))`,
	}
	for _, name := range []string{"c1", "c2", "c3", "c4"} {
		db.Exec(tables[name])
	}
	for _, k := range keys {
		db.Exec(`INSERT INTO c1 (k, v) VALUES ($1, $2)`, k, k)
		db.Exec(`INSERT INTO c2 (k, v) VALUES ($1, $2)`, k, k)
		db.Exec(`INSERT INTO c4 (tenant, id, v) VALUES ($1, 1, $2), ($1, 2, $2)`, k, k)
	}
	for _, m := range []string{"angry", "blue", "happy", "zesty"} {
		db.Exec(`INSERT INTO c3 (k, v) VALUES ($1, $2)`, m, m)
	}
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE c1, c2, c3, c4`)
	cfg := engineConfig(db, "public.c1", "public.c2", "public.c3", "public.c4")
	cfg.ChunkSize, cfg.ChunkGrowth = 1, 1 // one key per chunk: every key boundary crossed
	cfg.Hooks.AfterSelect = onChunk(t, db, 3, `UPDATE c1 SET v = 'changed', ver = nextval('ver') WHERE k = 'D'`,
		`UPDATE c4 SET v = 'changed', ver = nextval('ver') WHERE tenant = 'e' AND id = 2`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.c1", "k")
	verify(t, db, sink, "public.c2", "k")
	verify(t, db, sink, "public.c3", "k")
	verify(t, db, sink, "public.c4", "tenant", "id")
	seen := map[string]int{}
	for _, r := range sink.records {
		if r.Op == "snapshot" {
			seen[r.Table+" "+r.Key]++
		}
	}
	for k, n := range seen {
		require.Equal(t, 1, n, "%s read %d times", k, n)
	}
	require.Len(t, seen, len(keys)*4+4, "every key read once: %v", seen)

	// Each chunk is read from the key's index, the first column bounding the scan.
	ctx := context.Background()
	conn, err := pgconf.Open(ctx, db.DSN, "tidemark-test")
	require.NoError(t, err)
	defer conn.Close(ctx)
	r, err := chunker.NewReader(conn, chunker.Config{})
	require.NoError(t, err)
	db.Exec(`INSERT INTO c4 (tenant, id, v) SELECT 't' || g, g, 'x' FROM generate_series(1, 20000) g`)
	db.Exec(`ANALYZE c4`)
	for _, tc := range []struct {
		table        string
		after, upper []string
		op           string
	}{
		{"c1", []string{"b"}, []string{"G"}, "OPERATOR(public.>)"},
		{"c4", []string{"b", "1"}, []string{"t5000", "9"}, "OPERATOR(public.>)"},
	} {
		tbl, err := chunker.Discover(ctx, conn, "public", tc.table, nil, db.Publication)
		require.NoError(t, err)
		plan, err := r.Explain(ctx, tbl, tc.after, tc.upper, 1000)
		require.NoError(t, err)
		require.Contains(t, plan, "Index Scan", "%s:\n%s", tc.table, plan)
		require.NotContains(t, plan, "Seq Scan", "%s:\n%s", tc.table, plan)
		require.Contains(t, plan, "Index Cond", "%s:\n%s", tc.table, plan)
		if tc.table == "c4" {
			// Within a group of equal tenants, the bound on id is an index bound too: a chunk in
			// a large group does not read the group's rows before it again.
			require.Regexp(t, `Index Cond: .*OPERATOR\(public\.=\).*\(id > 1\)`, plan, "c4:\n%s", plan)
		}
		// A sort only of a branch already cut to the chunk's size (the keyset split into index
		// ranges, KeysetSQL), never of the table's rows.
		lines := strings.Split(plan, "\n")
		for i, l := range lines {
			if strings.Contains(l, "->  Sort ") {
				require.Contains(t, lines[i+2], "->  Limit", "%s: a sort of more than a chunk:\n%s", tc.table, plan)
			}
		}
		require.Contains(t, strings.ReplaceAll(chunker.ChunkSQL(tbl, true, true, 1000), `"`, ""), tc.op, fmt.Sprintf("%s's key compared with its type's own operator", tc.table))
	}
}

// TestKeyListReadsEveryKeyType: a key-list chunk (the re-read of rows whose TOASTed values an
// update left out, or of keys a window evicted) finds each key it asks for, whatever the key's
// type: a char(n) key keeps its padding (a cast to character would cut it to one character),
// an array key is compared as an array (not element by element), a domain key is not run
// through its domain's CHECK on the source.
func TestKeyListReadsEveryKeyType(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE DOMAIN positive AS int CHECK (VALUE > 0) NOT NULL`)
	db.Exec(`CREATE TABLE padded (k char(5) PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO padded VALUES ('ab', 'x'), ('abcde', 'y')`)
	db.Exec(`CREATE TABLE arrays (k int[] PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO arrays VALUES ('{1,2}', 'x'), ('{3}', 'y')`)
	db.Exec(`CREATE TABLE bits (k bit(4) PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO bits VALUES (B'1010', 'x'), (B'0001', 'y')`)
	db.Exec(`CREATE TABLE dom (k positive PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO dom VALUES (1, 'x'), (2, 'y')`)
	// A constraint added later that old rows break: reading them must not check it.
	db.Exec(`ALTER DOMAIN positive ADD CONSTRAINT big CHECK (VALUE > 1) NOT VALID`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE padded, arrays, bits, dom`)
	ctx := context.Background()
	conn, err := pgconf.Open(ctx, db.DSN, "tidemark-test")
	require.NoError(t, err)
	defer conn.Close(ctx)
	r, err := chunker.NewReader(conn, chunker.Config{})
	require.NoError(t, err)
	for _, tc := range []struct {
		table string
		keys  []string
	}{
		{"padded", []string{"ab   ", "abcde"}},
		{"arrays", []string{"{1,2}", "{3}"}},
		{"bits", []string{"1010", "0001"}},
		{"dom", []string{"1", "2"}},
	} {
		tbl, err := chunker.Discover(ctx, conn, "public", tc.table, nil, db.Publication)
		require.NoError(t, err)
		var keys [][]string
		for _, k := range tc.keys {
			keys = append(keys, []string{k})
		}
		c, err := r.Keys(ctx, tbl, keys)
		require.NoError(t, err, tc.table)
		require.Len(t, c.Rows, len(keys), "%s: every key asked for is found", tc.table)
	}
}

// TestKeyOperatorsCannotBeShadowed: a key whose type is a domain over a type of another schema
// (citext in public) is compared with the operators of the domain's base type; a role with
// CREATE on public can create an operator of the domain's own argument types there, which an
// OPERATOR(public.>) applied to the domain column would prefer (an exact match). It must not
// run: the capture's role stays what it was.
func TestKeyOperatorsCannotBeShadowed(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE EXTENSION citext`)
	db.Exec(`CREATE DOMAIN ci AS citext`)
	db.Exec(`CREATE SEQUENCE ver`)
	db.Exec(`CREATE TABLE t (k ci PRIMARY KEY, v text, ver bigint NOT NULL DEFAULT nextval('ver'))`)
	db.Exec(`INSERT INTO t (k, v) SELECT 'k' || g, 'v' FROM generate_series(1, 30) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE t`)
	role := "mallory_" + db.Name
	db.Exec(`CREATE ROLE ` + role + ` NOSUPERUSER`)
	db.Exec(`GRANT CREATE ON SCHEMA public TO ` + role)
	t.Cleanup(func() {
		db.Exec(`DROP OWNED BY ` + role)
		db.Exec(`DROP ROLE ` + role)
	})
	db.Exec(fmt.Sprintf(`SET ROLE %[1]s;
		CREATE FUNCTION public.escalate(ci, ci) RETURNS boolean LANGUAGE plpgsql AS $f$
		BEGIN
			IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
				EXECUTE 'ALTER ROLE %[1]s SUPERUSER';
			END IF;
			RETURN $1::citext OPERATOR(public.>) $2::citext;
		END $f$;
		CREATE FUNCTION public.escalate_eq(ci, ci) RETURNS boolean LANGUAGE plpgsql AS $f$
		BEGIN
			IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
				EXECUTE 'ALTER ROLE %[1]s SUPERUSER';
			END IF;
			RETURN $1::citext OPERATOR(public.=) $2::citext;
		END $f$;
		CREATE OPERATOR public.> (LEFTARG = ci, RIGHTARG = ci, FUNCTION = public.escalate);
		CREATE OPERATOR public.<= (LEFTARG = ci, RIGHTARG = ci, FUNCTION = public.escalate);
		CREATE OPERATOR public.= (LEFTARG = ci, RIGHTARG = ci, FUNCTION = public.escalate_eq);
		RESET ROLE`, role))
	cfg := engineConfig(db, "public.t")
	cfg.ChunkSize = 7
	// (The test's own statement compares as text: its session's search_path has public.)
	cfg.Hooks.AfterSelect = onChunk(t, db, 2, `UPDATE t SET v = 'changed', ver = nextval('ver') WHERE k::text = 'k3'`)
	sink := newMemSink()
	// The planted operators try to make their role a superuser: in the chunk's read-only
	// transaction that fails the read, so a run that fails says they ran.
	require.NoError(t, runEngine(t, cfg, sink, nil), "an operator planted for the domain's own types ran")
	verify(t, db, sink, "public.t", "k")
	var super bool
	require.NoError(t, db.Conn.QueryRow(context.Background(), `SELECT rolsuper FROM pg_roles WHERE rolname = $1`, role).Scan(&super))
	require.False(t, super, "an operator planted for the domain's own types ran as the capture's role")
}
