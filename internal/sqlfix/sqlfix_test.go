package sqlfix_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/sqlfix"
)

var server *e2e.Server

func TestMain(m *testing.M) { os.Exit(e2e.Main(m, &server)) }

func TestLiteral(t *testing.T) {
	for in, want := range map[string]string{
		"plain": "'plain'", "it's": "'it''s'", `a\b`: `E'a\\b'`, `\'`: `E'\\'''`, "nul\x00": "'nul'", "": "''",
	} {
		require.Equal(t, want, sqlfix.Literal(in), in)
	}
}

// fix is one printed statement with a name in it: what it is for, the objects to make first
// (each SQL run by the test, with the name quoted by the test's own Ident), the statement, and
// the catalog lines (snapshot) it may change: those of the object it names.
type fix struct {
	name   string
	setup  []string
	sql    string
	target []string // prefixes of the snapshot lines the statement may change
}

func fixes(name string) []fix {
	q := sqlfix.Ident(name)
	table := pgx.Identifier{"fx", name}
	return []fix{
		{"create slot", nil, sqlfix.CreateSlot(name), []string{"slot " + name + "|"}},
		{"drop slot", []string{"SELECT pg_catalog.pg_create_logical_replication_slot(" + sqlfix.Literal(name) + ", 'pgoutput')"}, sqlfix.DropSlot(name), []string{"slot " + name + "|"}},
		{"create publication", []string{"CREATE TABLE " + sqlfix.Ident(table...) + " (id int PRIMARY KEY)"}, sqlfix.CreatePublication(name, table), []string{"publication " + name + "|"}},
		{"add table", []string{"CREATE TABLE " + sqlfix.Ident(table...) + " (id int PRIMARY KEY)", "CREATE PUBLICATION " + q}, sqlfix.AddTable(name, table), []string{"publication " + name + "|"}},
		{"publish all", []string{"CREATE PUBLICATION " + q + " WITH (publish = 'insert')"}, sqlfix.PublishAll(name), []string{"publication " + name + "|"}},
		{"drop publication", []string{"CREATE PUBLICATION " + q}, sqlfix.DropPublication(name), []string{"publication " + name + "|"}},
		{"grant select", []string{"CREATE TABLE " + sqlfix.Ident(table...) + " (id int)", "CREATE ROLE " + q}, sqlfix.GrantSelect(table, name), []string{"table fx." + name + "|"}},
		{"grant write", []string{"CREATE TABLE " + sqlfix.Ident(table...) + " (id int)", "CREATE ROLE " + q}, sqlfix.GrantWrite(table, name), []string{"table fx." + name + "|"}},
		{"grant select all", []string{"CREATE SCHEMA " + q, "CREATE TABLE " + q + ".t (id int)", "CREATE ROLE " + q}, sqlfix.GrantSelectAll(name, name), []string{"table " + name + ".t|"}},
		{"grant usage", []string{"CREATE SCHEMA " + q, "CREATE ROLE " + q}, sqlfix.GrantUsage(name, name), []string{"schema " + name + "|"}},
		{"replication", []string{"CREATE ROLE " + q}, sqlfix.Replication(name), []string{"role " + name + "|"}},
		{"grant emit", []string{"CREATE ROLE " + q}, sqlfix.GrantEmit(name), []string{"emit|"}},
		{"owner to", []string{"CREATE TABLE " + sqlfix.Ident(table...) + " (id int)", "CREATE ROLE " + q}, sqlfix.OwnerTo(table, name), []string{"table fx." + name + "|"}},
		{"replica identity", []string{"CREATE TABLE " + sqlfix.Ident(table...) + " (id int)"}, sqlfix.ReplicaIdentityFull(table), []string{"table fx." + name + "|"}},
		{"drop trigger", []string{"CREATE TABLE " + sqlfix.Ident(table...) + " (id int)",
			"CREATE FUNCTION fx.f() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN RETURN NEW; END $f$",
			"CREATE TRIGGER " + q + " BEFORE INSERT ON " + sqlfix.Ident(table...) + " FOR EACH ROW EXECUTE FUNCTION fx.f()"},
			sqlfix.DropTrigger(name, table), []string{"trigger fx." + name + "." + name + "|"}},
		{"drop rule", []string{"CREATE TABLE " + sqlfix.Ident(table...) + " (id int)",
			"CREATE RULE " + q + " AS ON UPDATE TO " + sqlfix.Ident(table...) + " DO ALSO NOTHING"},
			sqlfix.DropRule(name, table), []string{"rule fx." + name + "." + name + "|"}},
		{"drop policy", []string{"CREATE TABLE " + sqlfix.Ident(table...) + " (id int)",
			"CREATE POLICY " + q + " ON " + sqlfix.Ident(table...) + " USING (true)"},
			sqlfix.DropPolicy(name, table), []string{"policy fx." + name + "." + name + "|"}},
	}
}

// snapshotSQL lists what a printed fix could change, one line per object: roles and their
// attributes, slots, publications with their tables and options, tables with owner, ACL and
// replica identity, schemas with their ACL, triggers, rules, policies, and who may write
// logical messages. PostgreSQL truncates names to 63 bytes; so does the name the lines carry.
const snapshotSQL = `
	SELECT 'role ' || rolname || '|' || rolsuper || rolreplication || rolcreaterole || rolcreatedb || rolbypassrls || rolcanlogin FROM pg_catalog.pg_roles
	UNION ALL SELECT 'member ' || m.roleid::regrole::text || '|' || m.member::regrole::text FROM pg_catalog.pg_auth_members m
	UNION ALL SELECT 'slot ' || slot_name || '|' || plugin FROM pg_catalog.pg_replication_slots
	UNION ALL SELECT 'publication ' || p.pubname || '|' || p.pubinsert || p.pubupdate || p.pubdelete || p.pubtruncate || p.puballtables || '|' ||
		coalesce((SELECT pg_catalog.string_agg(t.schemaname || '.' || t.tablename, ',' ORDER BY 1) FROM pg_catalog.pg_publication_tables t WHERE t.pubname = p.pubname), '')
		FROM pg_catalog.pg_publication p
	UNION ALL SELECT 'table ' || n.nspname || '.' || c.relname || '|' || c.relowner::regrole::text || '|' || coalesce(c.relacl::text, '') || '|' || c.relreplident::text || c.relrowsecurity
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND c.relkind IN ('r', 'p', 'v')
	UNION ALL SELECT 'schema ' || nspname || '|' || nspowner::regrole::text || '|' || coalesce(nspacl::text, '') FROM pg_catalog.pg_namespace
	UNION ALL SELECT 'trigger ' || n.nspname || '.' || c.relname || '.' || t.tgname || '|' FROM pg_catalog.pg_trigger t
		JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE NOT t.tgisinternal
	UNION ALL SELECT 'rule ' || n.nspname || '.' || c.relname || '.' || r.rulename || '|' FROM pg_catalog.pg_rewrite r
		JOIN pg_catalog.pg_class c ON c.oid = r.ev_class JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE r.rulename <> '_RETURN'
	UNION ALL SELECT 'policy ' || n.nspname || '.' || c.relname || '.' || p.polname || '|' FROM pg_catalog.pg_policy p
		JOIN pg_catalog.pg_class c ON c.oid = p.polrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	UNION ALL SELECT 'emit|' || coalesce(proacl::text, '') FROM pg_catalog.pg_proc WHERE oid = 'pg_catalog.pg_logical_emit_message(boolean, text, text)'::pg_catalog.regprocedure
	UNION ALL SELECT 'sentinel ' || count(*) FROM fx_keep.sentinel`

func snapshot(t *testing.T, conn *pgx.Conn) []string {
	rows, err := conn.Query(context.Background(), snapshotSQL)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	slices.Sort(lines)
	return lines
}

// truncate is a name as PostgreSQL keeps it: at most 63 bytes, cut at a character boundary.
func truncate(name string) string {
	if len(name) <= 63 {
		return name
	}
	n := 63
	for n > 0 && (name[n]&0xC0) == 0x80 {
		n--
	}
	return name[:n]
}

// FuzzPrintedFixes runs every statement sqlfix prints, with a hostile name in it, as a DBA would
// paste it (a superuser's session, standard_conforming_strings on and off, the simple protocol,
// which runs every statement a string holds; off only for a statement with a backslash, the one
// thing the setting changes), and checks that the catalog changed only in the
// lines of the object the statement names: no other role, slot, publication, table, grant or
// row changed. A statement PostgreSQL refuses (a slot name it does not accept) must change
// nothing. Seeds: quotes, backslashes, semicolons, dollar quotes, comments, unicode, a name of
// 63 bytes and more.
func FuzzPrintedFixes(f *testing.F) {
	for _, s := range []string{
		"plain", `it's`, `say "hi"`, `back\slash`, `\'`, `x'); DROP TABLE fx_keep.sentinel; --`,
		`x', 'pgoutput'); DROP TABLE fx_keep.sentinel; --`, `x\', 'pgoutput'); DROP TABLE fx_keep.sentinel; --`,
		`x'); DROP TABLE fx_keep.sentinel; SELECT ('`, `x\'); DROP TABLE fx_keep.sentinel; SELECT ('`,
		`x\'); ALTER ROLE fx_victim SUPERUSER; --`, `"; DROP TABLE fx_keep.sentinel; --`, `$$; DROP TABLE fx_keep.sentinel; $$`,
		`$q$`, "semi;colon", "/* c */", "-- c", "é☃ 日本", strings.Repeat("ü", 40), strings.Repeat("a", 70), "E'x'",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if name == "" || strings.ContainsRune(name, 0) || !isValidUTF8(name) {
			t.Skip("no object has an empty name, a NUL or invalid UTF-8 in it")
		}
		db := e2e.NewTestDB(t, server)
		ctx := context.Background()
		for _, fx := range fixes(name) {
			for _, scs := range []string{"on", "off"} {
				if scs == "off" && !strings.Contains(fx.sql, `\`) {
					// standard_conforming_strings changes only what a backslash in a string
					// literal means: a statement without one reads the same under both.
					continue
				}
				db.Exec(`DROP SCHEMA IF EXISTS fx CASCADE; DROP SCHEMA IF EXISTS fx_keep CASCADE; CREATE SCHEMA fx; CREATE SCHEMA fx_keep;
					CREATE TABLE fx_keep.sentinel (id int); INSERT INTO fx_keep.sentinel VALUES (1)`)
				cleanup(t, db, name)
				conn := db.Connect()
				// What PostgreSQL refuses to make (a slot of that name) does not exist.
				for _, s := range fx.setup {
					_, _ = conn.Exec(ctx, s)
				}
				before := snapshot(t, conn)
				_, err := conn.PgConn().Exec(ctx, "SET standard_conforming_strings = "+scs+"; "+fx.sql).ReadAll()
				after := snapshot(t, conn)
				conn.Close(ctx)
				for _, l := range symmetricDiff(before, after) {
					ok := false
					for _, p := range fx.target {
						ok = ok || strings.HasPrefix(l, truncatedPrefix(p, name))
					}
					require.True(t, ok, "%s with name %q (standard_conforming_strings %s): %s\nchanged %q, not the object it names (err: %v)", fx.name, name, scs, fx.sql, l, err)
				}
				cleanup(t, db, name)
			}
		}
	})
}

// truncatedPrefix is prefix with name as PostgreSQL keeps it.
func truncatedPrefix(prefix, name string) string {
	return strings.ReplaceAll(prefix, name, truncate(name))
}

func cleanup(t *testing.T, db *e2e.TestDB, name string) {
	c := db.Connect()
	defer c.Close(context.Background())
	ctx := context.Background()
	_, _ = c.Exec(ctx, "SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1", truncate(name))
	_, _ = c.Exec(ctx, "DROP PUBLICATION IF EXISTS "+sqlfix.Ident(name))
	_, _ = c.Exec(ctx, "DROP SCHEMA IF EXISTS "+sqlfix.Ident(name)+" CASCADE")
	_, _ = c.Exec(ctx, "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) FROM "+sqlfix.Ident(name))
	_, _ = c.Exec(ctx, "DROP OWNED BY "+sqlfix.Ident(name))
	_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+sqlfix.Ident(name))
	_, _ = c.Exec(ctx, "GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) TO PUBLIC")
}

func symmetricDiff(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, "removed "+x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			out = append(out, "added "+x)
		}
	}
	for i, l := range out {
		out[i] = strings.TrimPrefix(strings.TrimPrefix(l, "removed "), "added ")
	}
	return out
}

func isValidUTF8(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }
