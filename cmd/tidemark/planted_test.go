//go:build tidemark_faults

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/sink/postgres"
	"github.com/tidemark/tidemark/watermark"
)

// The planted-objects test (docs/security.md): a role without privileges but CREATE on schema
// public plants, for every builtin function and operator Tidemark's SQL calls by name, an
// object of the same name and argument types in public whose body reports that it ran. Every
// command of the CLI's command table and every command of the connector runs against databases
// holding them, twice:
//
//   - the control run, with the search_path pin left out (a test build's faults.Unpinned) and the
//     databases' search_path set to "public, pg_catalog", so that public is searched first: every
//     planted object must be seen running, which shows that the plants reach the calls they
//     shadow and that the test cannot pass for want of them;
//   - the pinned run, as the product runs: none may run.
//
// The list of what to plant (testdata/planted.txt) is generated from the SQL the commands send
// (log_statement = all, both runs): a builtin called by name that the list lacks fails the test,
// with the command that rewrites the list (go test -tags tidemark_faults -run TestPlantedObjects
// ./cmd/tidemark -update-planted). A name that cannot be planted (a function of type "any",
// which only C can declare; a grammar construct PostgreSQL qualifies itself) is listed in
// notPlantable with the reason.

var updatePlanted = flag.Bool("update-planted", false, "rewrite testdata/planted.txt from the SQL the commands sent")

const (
	plantedRole = "mallory"
	harnessApp  = "planted-harness"
	firedTag    = "tidemark-planted-fired "
)

// notPlantable are builtins Tidemark calls by name that no role can shadow, with why: the test
// neither plants nor expects them.
var notPlantable = map[string]string{
	"format":             `its arguments are of type "any" (VARIADIC), which only a C function can declare`,
	"jsonb_build_object": `its arguments are of type "any" (VARIADIC); only its zero-argument form can be shadowed`,
	"json_build_object":  `its arguments are of type "any" (VARIADIC)`,
	"jsonb_build_array":  `its arguments are of type "any" (VARIADIC)`,
	"concat":             `its arguments are of type "any"`,
	"concat_ws":          `its arguments are of type "any"`,
	"num_nulls":          `its arguments are of type "any"`,
	"num_nonnulls":       `its arguments are of type "any"`,
	"pg_typeof":          `its argument is of type "any"`,
	"pg_column_size":     `its argument is of type "any"`,
	"extract":            "EXTRACT(field FROM x) is grammar: PostgreSQL calls pg_catalog.extract itself",
	"position":           "POSITION(a IN b) is grammar: PostgreSQL calls pg_catalog.position itself",
	"substring":          "SUBSTRING(a FROM b) is grammar when written with FROM",
	"overlay":            "OVERLAY is grammar",
	"normalize":          "NORMALIZE is grammar",
	"xmlelement":         "grammar",
	"timezone":           "AT TIME ZONE is grammar: PostgreSQL calls pg_catalog.timezone itself",
	"pg_collation_for":   "COLLATION FOR is grammar",
	"current_schema":     "a grammar keyword when written without parentheses",
	"session_user":       "a grammar keyword",
	"current_user":       "a grammar keyword",
	"char_length":        "CHAR_LENGTH is grammar",
	"character_length":   "grammar",
	"octet_length":       "grammar",
}

// plantedList reads testdata/planted.txt: "f name" for functions, "o symbol" for operators.
func plantedList(t *testing.T) (fns, ops []string) {
	b, err := os.ReadFile(filepath.Join("testdata", "planted.txt"))
	if err != nil && !*updatePlanted {
		t.Fatalf("read testdata/planted.txt: %v (generate it with -update-planted)", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		kind, name, ok := strings.Cut(strings.TrimSpace(l), " ")
		switch {
		case !ok || strings.HasPrefix(l, "#"):
		case kind == "f":
			fns = append(fns, name)
		case kind == "o":
			ops = append(ops, name)
		}
	}
	return fns, ops
}

func TestPlantedObjects(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	e2e.NeedsLocal(t, server, "it starts a PostgreSQL of its own to read its log")
	ctx := context.Background()
	dir := t.TempDir()
	bins := buildBinaries(t, dir)
	srv, err := e2e.Start(ctx, e2e.Options{Log: zerolog.Nop()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })

	fns, ops := plantedList(t)
	plant, plantFns, unplanted := plantSQL(t, srv, fns, ops)
	for _, u := range unplanted {
		t.Logf("not planted: %s", u)
	}
	plantFile, fnsFile := filepath.Join(dir, "plant.sql"), filepath.Join(dir, "plant-functions.sql")
	require.NoError(t, os.WriteFile(plantFile, []byte(plant), 0o600))
	require.NoError(t, os.WriteFile(fnsFile, []byte(plantFns), 0o600))

	// The two runs side by side, each on a server of its own: each reads its own server's log,
	// and the test takes the time of the longer (the control run, about a minute) rather than
	// of both.
	var control, pinned *plantedRun
	t.Run("runs", func(t *testing.T) {
		t.Run("control", func(t *testing.T) {
			t.Parallel()
			own, err := e2e.Start(ctx, e2e.Options{Log: zerolog.Nop()})
			require.NoError(t, err)
			t.Cleanup(func() { _ = own.Stop(context.Background()) })
			control = runPlanted(t, own, bins, plantFile, fnsFile, true)
		})
		t.Run("pinned", func(t *testing.T) {
			t.Parallel()
			pinned = runPlanted(t, srv, bins, plantFile, "", false)
		})
	})
	require.NotNil(t, control, "the control run ended")
	require.NotNil(t, pinned, "the pinned run ended")

	// What the commands called by name, against the list.
	called := map[string]bool{}
	for _, r := range []*plantedRun{control, pinned} {
		for n := range r.called {
			called[n] = true
		}
	}
	catalog := catalogNames(t, srv)
	var missing []string
	for n := range called {
		kind, name, _ := strings.Cut(n, " ")
		if _, skip := notPlantable[name]; skip && kind == "f" {
			continue
		}
		if !catalog[n] {
			continue
		}
		if (kind == "f" && !slices.Contains(fns, name)) || (kind == "o" && !slices.Contains(ops, name)) {
			missing = append(missing, n)
		}
	}
	slices.Sort(missing)
	if *updatePlanted {
		var names []string
		for n := range called {
			kind, name, _ := strings.Cut(n, " ")
			if _, skip := notPlantable[name]; (skip && kind == "f") || !catalog[n] {
				continue
			}
			names = append(names, n)
		}
		slices.Sort(names)
		out := "# Builtins Tidemark's SQL calls by name, from log_statement = all of TestPlantedObjects's runs\n" +
			"# (regenerate: go test -tags tidemark_faults -run TestPlantedObjects ./cmd/tidemark -update-planted).\n" +
			strings.Join(names, "\n") + "\n"
		require.NoError(t, os.WriteFile(filepath.Join("testdata", "planted.txt"), []byte(out), 0o644))
		t.Logf("wrote testdata/planted.txt: %d names", len(names))
		return
	}
	require.Empty(t, missing, "builtins the commands call by name that testdata/planted.txt lacks: regenerate it with -update-planted")

	// The control run met every planted object; the pinned run none.
	var planted []string
	for _, f := range fns {
		if !slices.ContainsFunc(unplanted, func(u string) bool { return strings.HasPrefix(u, "f "+f+":") }) {
			planted = append(planted, "f "+f)
		}
	}
	for _, o := range ops {
		planted = append(planted, "o "+o)
	}
	var silent []string
	for _, p := range planted {
		if _, ok := control.fired[p]; !ok {
			silent = append(silent, p)
		}
	}
	require.Empty(t, silent, "planted objects the control run (no pin) never ran: the test would not see them run in the pinned run either")
	var ran []string
	for p, where := range pinned.fired {
		ran = append(ran, p+" (in "+where+")")
	}
	slices.Sort(ran)
	require.Empty(t, ran, "planted objects that ran with the search_path pinned")
	var casts []string
	for p, where := range control.fired {
		if strings.HasPrefix(p, "c ") {
			casts = append(casts, p+" (in "+where+")")
		}
	}
	slices.Sort(casts)
	require.Empty(t, casts, "casts of a user type's owner that ran without the pin (they would with it)")
	t.Logf("%d objects planted; all ran without the pin, none with it", len(planted))
}

// buildBinaries builds both binaries as a test build (the control run's switch needs it).
func buildBinaries(t *testing.T, dir string) map[string]string {
	bins := map[string]string{"tidemark": filepath.Join(dir, "tidemark"), "source-postgres": filepath.Join(dir, "source-postgres")}
	for name, pkg := range map[string]string{"tidemark": ".", "source-postgres": "../source-postgres"} {
		require.NoError(t, e2e.GoBuild(bins[name], pkg, "tidemark_faults"))
	}
	return bins
}

// harness connects to database db of srv as the test itself (its statements and the planted
// objects they meet are told apart from the commands' by application_name).
func harness(t *testing.T, srv *e2e.Server, db string) *pgx.Conn {
	conn, err := pgx.Connect(context.Background(), srv.DSN(db)+" application_name="+harnessApp)
	require.NoError(t, err)
	return conn
}

// catalogNames are the names of pg_catalog's functions ("f name") and operators ("o symbol").
func catalogNames(t *testing.T, srv *e2e.Server) map[string]bool {
	conn := harness(t, srv, "postgres")
	defer conn.Close(context.Background())
	rows, err := conn.Query(context.Background(), `SELECT 'f ' || proname FROM pg_catalog.pg_proc WHERE pronamespace = 'pg_catalog'::pg_catalog.regnamespace
		UNION SELECT 'o ' || oprname FROM pg_catalog.pg_operator WHERE oprnamespace = 'pg_catalog'::pg_catalog.regnamespace
		EXCEPT SELECT 'f ' || typname FROM pg_catalog.pg_type WHERE typnamespace = 'pg_catalog'::pg_catalog.regnamespace`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out
}

// plantSQL builds the SQL that plants the hostile role's objects into a database (run there by
// a superuser): the role, CREATE on public, as the role a shadow of every plantable overload of
// fns and ops, and the database's search_path and statement logging. It tries each object in a
// scratch database and leaves out those PostgreSQL refuses (returned, with the reason).
//
// It returns the SQL twice: with every object, and with the functions only (no operators), which
// the control run plants into the demo's and the bench's own servers (controlPlantsFunctions).
func plantSQL(t *testing.T, srv *e2e.Server, fns, ops []string) (string, string, []string) {
	ctx := context.Background()
	require.NoError(t, srv.CreateDatabase(ctx, "planted_scratch"))
	conn := harness(t, srv, "planted_scratch")
	defer conn.Close(ctx)
	// Tidemark's own tables first, as the superuser the commands run as: made by Tidemark under
	// the control run (no pin, public first), their defaults would call the planted now(), and
	// Tidemark refuses a table of its own that calls a function outside pg_catalog (pgtrust.Own).
	own := strings.Join([]string{
		postgres.CheckpointTableSQL(postgres.CheckpointTable), postgres.CheckpointColumnsSQL(postgres.CheckpointTable),
		postgres.LedgerTableSQL(postgres.LedgerTable), fmt.Sprintf(watermark.CreateTable, watermark.DefaultTable.Sanitize()),
	}, ";\n") + ";\n"
	head := own + fmt.Sprintf(`DO $do$ BEGIN
	IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '%[1]s') THEN CREATE ROLE %[1]s NOLOGIN; END IF;
END $do$;
GRANT CREATE ON SCHEMA public TO %[1]s;
SET ROLE %[1]s;
CREATE FUNCTION public.tidemark_planted_fired(name text) RETURNS void LANGUAGE plpgsql AS $f$
DECLARE k text := pg_catalog.textcat('tidemark_planted.f', pg_catalog.md5(name));
BEGIN
	IF pg_catalog.current_setting(k, true) IS NULL THEN
		PERFORM pg_catalog.set_config(k, '1', false);
		RAISE LOG '%[2]s%%', name;
	END IF;
END $f$;
`, plantedRole, firedTag)
	tail := `RESET ROLE;
DO $do$ BEGIN
	EXECUTE pg_catalog.format('ALTER DATABASE %I SET search_path = public, pg_catalog', pg_catalog.current_database());
	EXECUTE pg_catalog.format('ALTER DATABASE %I SET log_statement = ''all''', pg_catalog.current_database());
	-- The planted operators hide the catalogs' costs from the planner, whose estimates then
	-- soar and have every query compiled by JIT (a third of a second each): off, for the test's
	-- time only (it changes no plan's result).
	EXECUTE pg_catalog.format('ALTER DATABASE %I SET jit = off', pg_catalog.current_database());
END $do$;
`
	_, err := conn.Exec(ctx, head+"RESET ROLE;")
	require.NoError(t, err)
	var stmts, unplanted []string
	try := func(what, sql string) {
		_, err := conn.Exec(ctx, "SET ROLE "+plantedRole+"; "+sql+"; RESET ROLE")
		if err != nil {
			_, _ = conn.Exec(ctx, "RESET ROLE")
			unplanted = append(unplanted, what+": "+err.Error())
			t.Logf("overload not planted: %s: %v", what, err)
			return
		}
		stmts = append(stmts, sql+";")
	}
	for _, f := range shadowFunctions(t, conn, fns) {
		if f.why != "" {
			unplanted = append(unplanted, "f "+f.name+": "+f.why)
			continue
		}
		try("f "+f.name+"("+f.args+")", f.sql)
	}
	for _, o := range shadowOperators(t, conn, ops) {
		try("o "+o.name+"("+o.args+")", o.sql)
	}
	require.NoError(t, srv.DropDatabase(ctx, "planted_scratch"))
	// A name is unplanted only if none of its overloads could be.
	var out []string
	for _, u := range unplanted {
		name, _, _ := strings.Cut(u, "(")
		name, _, _ = strings.Cut(name, ":")
		if !slices.ContainsFunc(stmts, func(s string) bool { return strings.Contains(s, "/* "+name+" */") }) {
			out = append(out, name+": "+u)
		}
	}
	fnStmts := slices.DeleteFunc(slices.Clone(stmts), func(s string) bool { return strings.HasPrefix(s, "/* o ") })
	return head + strings.Join(stmts, "\n") + "\n" + tail, head + strings.Join(fnStmts, "\n") + "\n" + tail, out
}

type shadow struct {
	name, args, sql, why string
}

// unplantableTypes are argument or result types a SQL function cannot have.
var unplantableTypes = map[string]bool{`"any"`: true, "internal": true, "cstring": true, "unknown": true, "trigger": true,
	"event_trigger": true, "language_handler": true, "fdw_handler": true, "index_am_handler": true, "table_am_handler": true, "tsm_handler": true}

// shadowFunctions builds a shadow for every overload of each function name: a SQL function of the
// same arguments and result that reports it ran and returns what the builtin returns; an
// aggregate of the same arguments for an aggregate (its transition function a shadow of the
// builtin's) or for a window function.
func shadowFunctions(t *testing.T, conn *pgx.Conn, names []string) []shadow {
	rows, err := conn.Query(context.Background(), `
		SELECT p.oid, p.proname, p.prokind::text, pg_catalog.pg_get_function_arguments(p.oid), pg_catalog.pg_get_function_identity_arguments(p.oid),
		       pg_catalog.pg_get_function_result(p.oid), p.pronargs, p.provariadic <> 0, p.proisstrict,
		       ARRAY(SELECT pg_catalog.format_type(a, NULL) FROM pg_catalog.unnest(p.proargtypes) a), pg_catalog.format_type(p.prorettype, NULL),
		       coalesce((SELECT pg_catalog.quote_ident(f.proname) FROM pg_catalog.pg_proc f WHERE f.oid = a.aggtransfn), ''),
		       coalesce(pg_catalog.format_type(a.aggtranstype, NULL), ''),
		       coalesce((SELECT pg_catalog.quote_ident(f.proname) FROM pg_catalog.pg_proc f WHERE f.oid = a.aggfinalfn), ''), a.agginitval,
		       coalesce((SELECT f.proisstrict FROM pg_catalog.pg_proc f WHERE f.oid = a.aggtransfn), false)
		FROM pg_catalog.pg_proc p LEFT JOIN pg_catalog.pg_aggregate a ON a.aggfnoid = p.oid
		WHERE p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace AND p.proname = ANY($1) ORDER BY p.proname, p.oid`, names)
	require.NoError(t, err)
	defer rows.Close()
	var out []shadow
	for rows.Next() {
		var oid uint32
		var name, kind, args, ident, result, ret, stype, transfn, finalfn string
		var nargs int
		var variadic, strict, transStrict bool
		var argTypes []string
		var initval *string
		require.NoError(t, rows.Scan(&oid, &name, &kind, &args, &ident, &result, &nargs, &variadic, &strict, &argTypes, &ret, &transfn, &stype, &finalfn, &initval, &transStrict))
		s := shadow{name: name, args: ident}
		bad := unplantableTypes[ret]
		for _, a := range argTypes {
			bad = bad || unplantableTypes[a]
		}
		call := make([]string, nargs)
		for i := range call {
			call[i] = fmt.Sprintf("$%d", i+1)
		}
		if variadic && nargs > 0 {
			call[nargs-1] = "VARIADIC " + call[nargs-1]
		}
		fired := fmt.Sprintf("SELECT public.tidemark_planted_fired('f %s')", name)
		tag := "/* f " + name + " */ "
		switch {
		case kind == "p":
			s.why = "a procedure"
		case bad && kind != "a":
			s.why = "a type a SQL function cannot take (" + strings.Join(argTypes, ", ") + " -> " + ret + ")"
		case kind == "f":
			s.sql = fmt.Sprintf(`%sCREATE FUNCTION public.%s(%s) RETURNS %s LANGUAGE sql VOLATILE AS $p$ %s; SELECT * FROM pg_catalog.%s(%s) $p$`,
				tag, pgx.Identifier{name}.Sanitize(), args, result, fired, pgx.Identifier{name}.Sanitize(), strings.Join(call, ", "))
		case kind == "a" && stype != "internal" && !slices.ContainsFunc(argTypes, func(a string) bool { return unplantableTypes[a] }):
			sf := fmt.Sprintf("public.tidemark_planted_trans_%d", oid)
			params := append([]string{stype}, argTypes...)
			pcall := make([]string, len(params))
			for i := range pcall {
				pcall[i] = fmt.Sprintf("$%d", i+1)
			}
			strictness := ""
			if transStrict {
				strictness = " STRICT"
			}
			s.sql = fmt.Sprintf(`%sCREATE FUNCTION %s(%s) RETURNS %s LANGUAGE sql VOLATILE%s AS $p$ %s; SELECT pg_catalog.%s(%s) $p$;
CREATE AGGREGATE public.%s(%s) (SFUNC = %s, STYPE = %s`, tag, sf, strings.Join(params, ", "), stype, strictness, fired,
				transfn, strings.Join(pcall, ", "), pgx.Identifier{name}.Sanitize(), aggArgs(ident), sf, stype)
			if finalfn != "" {
				s.sql += ", FINALFUNC = pg_catalog." + finalfn
			}
			if initval != nil {
				s.sql += ", INITCOND = '" + strings.ReplaceAll(*initval, "'", "''") + "'"
			}
			s.sql += ")"
		case kind == "a" && name == "array_agg" && ident == "anynonarray":
			s.sql = tag + `CREATE FUNCTION public.tidemark_planted_array_agg(anyarray, anynonarray) RETURNS anyarray LANGUAGE sql VOLATILE AS $p$ ` + fired +
				`; SELECT pg_catalog.array_append($1, $2) $p$;
CREATE AGGREGATE public.array_agg(anynonarray) (SFUNC = public.tidemark_planted_array_agg, STYPE = anyarray)`
		case kind == "a" && name == "string_agg" && ident == "text, text":
			s.sql = tag + `CREATE FUNCTION public.tidemark_planted_string_agg(text, text, text) RETURNS text LANGUAGE sql VOLATILE AS $p$ ` + fired +
				`; SELECT CASE WHEN $2 IS NULL THEN $1 WHEN $1 IS NULL THEN $2 ELSE pg_catalog.textcat(pg_catalog.textcat($1, $3), $2) END $p$;
CREATE AGGREGATE public.string_agg(text, text) (SFUNC = public.tidemark_planted_string_agg, STYPE = text)`
		case kind == "a":
			s.why = "an aggregate whose state is internal"
		case kind == "w" && nargs >= 1 && argTypes[0] == ret && !bad:
			// A window function: an aggregate of the same arguments, used as a window
			// aggregate, takes its place (it returns the current row's value).
			sf := fmt.Sprintf("public.tidemark_planted_window_%d", oid)
			s.sql = fmt.Sprintf(`%sCREATE FUNCTION %s(%s, %s) RETURNS %s LANGUAGE sql VOLATILE AS $p$ %s; SELECT $2 $p$;
CREATE AGGREGATE public.%s(%s) (SFUNC = %s, STYPE = %s)`, tag, sf, ret, strings.Join(argTypes, ", "), ret, fired,
				pgx.Identifier{name}.Sanitize(), ident, sf, ret)
		default:
			s.why = "a window function of this shape"
		}
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// aggArgs is an aggregate's argument list for CREATE AGGREGATE: * for none.
func aggArgs(ident string) string {
	if ident == "" {
		return "*"
	}
	return ident
}

// shadowOperators builds a shadow for every overload of each operator symbol: an operator of the
// same argument types in public whose function reports it ran and calls the builtin's.
func shadowOperators(t *testing.T, conn *pgx.Conn, symbols []string) []shadow {
	rows, err := conn.Query(context.Background(), `
		SELECT o.oid, o.oprname, o.oprkind::text, coalesce(pg_catalog.format_type(NULLIF(o.oprleft, 0), NULL), ''),
		       pg_catalog.format_type(o.oprright, NULL), pg_catalog.format_type(o.oprresult, NULL), pg_catalog.quote_ident(p.proname), p.proisstrict
		FROM pg_catalog.pg_operator o JOIN pg_catalog.pg_proc p ON p.oid = o.oprcode
		WHERE o.oprnamespace = 'pg_catalog'::pg_catalog.regnamespace AND o.oprname = ANY($1) ORDER BY o.oprname, o.oid`, symbols)
	require.NoError(t, err)
	defer rows.Close()
	var out []shadow
	for rows.Next() {
		var oid uint32
		var sym, kind, left, right, result, fn string
		var strict bool
		require.NoError(t, rows.Scan(&oid, &sym, &kind, &left, &right, &result, &fn, &strict))
		if unplantableTypes[left] || unplantableTypes[right] || unplantableTypes[result] {
			continue
		}
		f := fmt.Sprintf("public.tidemark_planted_op_%d", oid)
		fired := fmt.Sprintf("SELECT public.tidemark_planted_fired('o %s')", sym)
		strictness := ""
		if strict {
			strictness = " STRICT"
		}
		s := shadow{name: sym, args: left + ", " + right}
		if kind == "l" {
			s.sql = fmt.Sprintf(`/* o %s */ CREATE FUNCTION %s(%s) RETURNS %s LANGUAGE sql VOLATILE%s AS $p$ %s; SELECT pg_catalog.%s($1) $p$;
CREATE OPERATOR public.%s (RIGHTARG = %s, FUNCTION = %s)`, sym, f, right, result, strictness, fired, fn, sym, right, f)
		} else {
			s.sql = fmt.Sprintf(`/* o %s */ CREATE FUNCTION %s(%s, %s) RETURNS %s LANGUAGE sql VOLATILE%s AS $p$ %s; SELECT pg_catalog.%s($1, $2) $p$;
CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s)`, sym, f, left, right, result, strictness, fired, fn, sym, left, right, f)
		}
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// plantedCasts are casts of public.mood (a captured column's enum) to and from text, json and
// jsonb, each reporting when it runs ("c mood AS text"). Casts have no owner: each run's
// databases are dropped with them.
var plantedCasts = func() string {
	var b strings.Builder
	for _, c := range []struct{ from, to, name, value string }{
		{"public.mood", "text", "mood AS text", "'ok'::text"},
		{"public.mood", "json", "mood AS json", `'"ok"'::json`},
		{"public.mood", "jsonb", "mood AS jsonb", `'"ok"'::jsonb`},
		{"text", "public.mood", "text AS mood", "'ok'::public.mood"},
	} {
		f := "public.tidemark_planted_cast_" + strings.NewReplacer(" AS ", "_", ".", "_").Replace(c.name)
		fmt.Fprintf(&b, "CREATE FUNCTION %s(%s) RETURNS %s LANGUAGE sql VOLATILE AS $p$ SELECT public.tidemark_planted_fired('c %s'); SELECT %s $p$;\n", f, c.from, c.to, c.name, c.value)
		fmt.Fprintf(&b, "CREATE CAST (%s AS %s) WITH FUNCTION %s(%s);\n", c.from, c.to, f, c.from)
	}
	return b.String()
}()

// plantedRun is what one run of every command showed in the servers' logs.
type plantedRun struct {
	fired  map[string]string // planted object ("f name", "o symbol") -> the application it ran in
	called map[string]bool   // builtins called by name in the commands' statements
}

// runPlanted runs every command of the CLI's command table, and the connector's, against a
// source and a target database holding the planted objects, and reads from the servers' logs
// which planted objects ran and what the commands called.
func runPlanted(t *testing.T, srv *e2e.Server, bins map[string]string, plantFile, fnsFile string, control bool) *plantedRun {
	ctx := context.Background()
	pass := "pinned"
	if control {
		pass = "control"
	}
	src, tgt := "planted_"+pass+"_src", "planted_"+pass+"_tgt"
	for _, db := range []string{src, tgt} {
		require.NoError(t, srv.CreateDatabase(ctx, db))
		t.Cleanup(func() { _ = srv.DropDatabase(context.Background(), db) })
	}
	c := harness(t, srv, src)
	_, err := c.Exec(ctx, `CREATE EXTENSION citext;
		CREATE TYPE public.mood AS ENUM ('ok', 'meh');
		-- A domain and a composite type the target lacks: the sink creates them there.
		CREATE DOMAIN public.qty AS int NOT NULL CHECK (VALUE >= 0);
		CREATE TYPE public.dims AS (w int, h int);
		CREATE TABLE public.items (id int PRIMARY KEY, name text, n numeric(12,2), at timestamptz DEFAULT now(), tags text[], m public.mood, updated_at timestamptz NOT NULL DEFAULT now(),
			q public.qty DEFAULT 1, d public.dims);
		INSERT INTO public.items (id, name, n, tags, m, d) SELECT g, 'item ' || g, g * 1.5, ARRAY['a', 'b'], 'ok', ROW(g, 2)::public.dims FROM pg_catalog.generate_series(1, 300) g;
		CREATE TABLE public.tenants (tenant citext, id int, v text, PRIMARY KEY (tenant, id));
		INSERT INTO public.tenants SELECT CASE WHEN g % 2 = 0 THEN 'A' ELSE 'b' END, g, 'v' FROM pg_catalog.generate_series(1, 100) g;
		-- A column added with a default the existing rows take without a rewrite, which the
		-- target's tenants lacks: the sink adds it there with that value.
		ALTER TABLE public.tenants ADD COLUMN m public.mood DEFAULT 'meh';
		CREATE TABLE public.other (id int PRIMARY KEY);
		DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'rds_replication') THEN CREATE ROLE rds_replication; END IF; END $$`)
	require.NoError(t, err)
	c.Close(ctx)
	// The target has the enum, and one table already (the sink checks an existing table's key
	// and code).
	tc := harness(t, srv, tgt)
	_, err = tc.Exec(ctx, `CREATE TYPE public.mood AS ENUM ('ok', 'meh'); CREATE EXTENSION citext;
		CREATE TABLE public.tenants (tenant citext, id int, v text, PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
	tc.Close(ctx)
	plant, err := os.ReadFile(plantFile)
	require.NoError(t, err)
	for _, db := range []string{src, tgt} {
		c := harness(t, srv, db)
		_, err := c.Exec(ctx, string(plant))
		require.NoError(t, err, "plant into %s", db)
		// Casts of the enum a captured column has, as its owner may make them: found by type,
		// whatever search_path says, so neither run may meet one (Tidemark reads and writes a
		// user type's values in its text form, through its input and output functions).
		_, err = c.Exec(ctx, plantedCasts)
		c.Close(ctx)
		require.NoError(t, err, "plant casts into %s", db)
	}

	// Another session holds an advisory lock on each database, as a second capture would: the
	// sink's lock query then looks at who holds one.
	for _, db := range []string{src, tgt} {
		c := harness(t, srv, db)
		_, err := c.Exec(ctx, `SELECT pg_catalog.pg_advisory_lock(42)`)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close(context.Background()) })
	}

	dir := t.TempDir()
	logs := filepath.Join(dir, "server-logs")
	require.NoError(t, os.MkdirAll(logs, 0o755))
	env := append(os.Environ(), "TIDEMARK_TESTING_PLANT="+plantFile, "TIDEMARK_TESTING_SERVER_LOGS="+logs, "TIDEMARK_SOURCE=", "TIDEMARK_TARGET=")
	if control {
		env = append(env, "TIDEMARK_TESTING_UNPINNED=1")
	}
	logFile := srv.LogFile()
	start := fileSize(t, logFile)
	srcDSN, tgtDSN := srv.DSN(src), srv.DSN(tgt)

	// How to run each command of the CLI's command table here: a new command without an entry
	// fails the test.
	out := filepath.Join(dir, "out.jsonl")
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	defer kf.Close()
	kafkaURL := "kafka://" + kf.ListenAddrs()[0] + "/planted_" + pass
	jsc, err := e2e.StartNATSCluster(filepath.Join(dir, "nats-"+pass), 1)
	require.NoError(t, err)
	defer jsc.Shutdown()
	natsURL := "nats://" + jsc.Addrs()[0] + "/planted_" + pass
	recipes := map[string][][]string{
		"doctor": {
			{"doctor", "--source", srcDSN, "--tables", "public.items,public.tenants", "--slot", "planted_a_" + pass, "--publication", "planted"},
			// A table outside the publication, and the signal table's checks.
			{"doctor", "--source", srcDSN, "--tables", "public.items,public.other", "--slot", "planted_a_" + pass, "--publication", "planted", "--watermarks", "table"},
		},
		"sync": {
			{"sync", "--source", srcDSN, "--tables", "public.items,public.tenants", "--slot", "planted_a_" + pass, "--publication", "planted",
				"--to", tgtDSN, "--audit", "--chunk-size", "50", "--stop-when-caught-up", "--quiet"},
			{"sync", "--source", srcDSN, "--tables", "public.items,public.tenants", "--slot", "planted_b_" + pass, "--publication", "planted",
				"--to", out, "--chunk-size", "50", "--watermarks", "table", "--stop-when-caught-up", "--quiet"},
			{"sync", "--source", srcDSN, "--tables", "public.items,public.tenants", "--slot", "planted_f_" + pass, "--publication", "planted",
				"--to", kafkaURL, "--format", "debezium", "--chunk-size", "50", "--stop-when-caught-up", "--quiet"},
			{"sync", "--source", srcDSN, "--tables", "public.items,public.tenants", "--slot", "planted_g_" + pass, "--publication", "planted",
				"--to", natsURL, "--nats-partitions", "2", "--chunk-size", "50", "--stop-when-caught-up", "--quiet"},
		},
		"verify": {
			{"verify", "--source", srcDSN, "--tables", "public.items,public.tenants", "--publication", "planted", "--to", tgtDSN, "--recheck-for", "2s"},
			{"verify", "--source", srcDSN, "--tables", "public.items,public.tenants", "--publication", "planted", "--to", out, "--recheck-for", "2s"},
		},
		"status": {
			{"status", "--source", srcDSN, "--slot", "planted_a_" + pass, "--target", tgtDSN},
			{"status", "--source", srcDSN, "--slot", "planted_b_" + pass, "--checkpoint", out + ".checkpoint"},
			{"status", "--source", srcDSN, "--slot", "planted_f_" + pass, "--kafka", kafkaURL},
			{"status", "--source", srcDSN, "--slot", "planted_g_" + pass, "--nats", natsURL},
		},
		// A Kafka output in the tidemark format, applied to the target by a consumer group.
		"consume": {
			{"sync", "--source", srcDSN, "--tables", "public.items,public.tenants", "--slot", "planted_h_" + pass, "--publication", "planted",
				"--to", kafkaURL + "_c", "--chunk-size", "50", "--stop-when-caught-up", "--quiet"},
			{"consume", "--from", kafkaURL + "_c", "--to", tgtDSN, "--group", "planted", "--stop-when-caught-up"},
		},
		"schema":  {{"schema", "--source", srcDSN, "--tables", "public.items,public.tenants"}},
		"stream":  {{"stream", "--source", srcDSN, "--slot", "planted_c_" + pass, "--publication", "planted", "--create-slot"}},
		"cleanup": {{"cleanup", "--source", srcDSN, "--slot", "planted_b_" + pass, "--publication", "planted", "--yes"}},
		// A sync left running (its control socket), the re-backfill it is asked for, and the
		// slot dropped afterwards.
		"rebackfill": {
			{"sync", "--source", srcDSN, "--tables", "public.items,public.tenants", "--slot", "planted_e_" + pass, "--publication", "planted",
				"--to", filepath.Join(dir, "rebackfill.jsonl"), "--chunk-size", "50", "--quiet", "--control", filepath.Join(dir, "ctl", "sync.sock")},
			{"rebackfill", "--control", filepath.Join(dir, "ctl", "sync.sock"), "--tables", "public.items"},
			{"cleanup", "--source", srcDSN, "--slot", "planted_e_" + pass, "--publication", "", "--yes"},
		},
		"demo":  {{"demo", "--rows", "300", "--live", "1s"}},
		"bench": {{"bench", "--rows", "500", "--reps", "1", "--changes", "300", "--chunk-size", "100"}},
		"chaos": {{"chaos", "--mode", "postgres", "--source", srcDSN, "--target", tgtDSN, "--duration", "4s", "--rows", "300",
			"--faults", "kill", "--connector", bins["source-postgres"]},
			{"chaos", "--mode", "kafka", "--kafka", kf.ListenAddrs()[0], "--source", srcDSN, "--duration", "4s", "--rows", "300", "--faults", "kill"},
			{"chaos", "--mode", "nats", "--nats", jsc.Addrs()[0], "--source", srcDSN, "--duration", "4s", "--rows", "300", "--faults", "kill"}},
	}
	for _, cmd := range commands {
		runs, ok := recipes[cmd.name]
		require.True(t, ok, "the planted-objects test has no recipe for command %q: add one", cmd.name)
		if keep, ok := controlRuns[cmd.name]; control && ok {
			var kept [][]string
			for _, i := range keep {
				kept = append(kept, runs[i])
			}
			runs = kept
		}
		if cmd.name == "rebackfill" {
			runWithSync(t, bins["tidemark"], env, runs, control)
			continue
		}
		cmdEnv := env
		if control && controlPlantsFunctions[cmd.name] {
			cmdEnv = append(slices.Clone(env), "TIDEMARK_TESTING_PLANT="+fnsFile)
		}
		for _, args := range runs {
			runCommand(t, bins["tidemark"], cmdEnv, args, control)
		}
	}
	// A second writer on a checkpoint the harness holds (its lock): the sync stops, naming
	// the holder, which the sink looks up.
	hold := harness(t, srv, tgt)
	_, err = hold.Exec(ctx, `SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtextextended('tidemark checkpoint planted_second', 0))`)
	require.NoError(t, err)
	second := exec.Command(bins["tidemark"], "sync", "--source", srcDSN, "--tables", "public.items", "--slot", "planted_d_"+pass,
		"--publication", "planted", "--to", tgtDSN, "--checkpoint-id", "planted_second", "--stop-when-caught-up", "--quiet")
	second.Env = env
	secondOut, err := second.CombinedOutput()
	hold.Close(ctx)
	require.Error(t, err, "a second writer is refused")
	if !control {
		require.Contains(t, string(secondOut), "holds its lock", "a second writer is refused naming the holder")
	}
	runConnector(t, srv, bins["source-postgres"], env, src, dir, pass, control)

	r := &plantedRun{fired: map[string]string{}, called: map[string]bool{}}
	readLog(t, logFile, start, r)
	entries, err := os.ReadDir(logs)
	require.NoError(t, err)
	require.NotEmpty(t, entries, "the bench's servers (and the demo's) left their logs")
	for _, e := range entries {
		readLog(t, filepath.Join(logs, e.Name()), 0, r)
	}
	return r
}

func fileSize(t *testing.T, path string) int64 {
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Size()
}

// controlRuns are the runs (by index in the command's recipe) the control run makes of some
// commands. Chaos's three modes run the same workload and the engine as sync does, so one of
// them meets what the others would of the planted objects; with those objects in the way the
// PostgreSQL mode crawled (up to 95 s, in a package over its time budget), the NATS one takes
// about 10 s. An object only the others call fails the check that the control run met every
// planted object: run them again in the control then. (Demo, bench and the workload call
// functions no other command does.)
var controlRuns = map[string][]int{"chaos": {2}}

// controlPlantsFunctions are the commands whose own servers the control run plants with the
// functions only, not the operators. Every planted operator shadowing pg_catalog's (= on oid or
// text, say) is a volatile SQL function the planner can neither index nor hash nor merge by, so
// a catalog join under it becomes a nested loop calling it for every pair of rows: the demo
// crawled for 15 s and the bench did not finish in 30 s. Their SQL is the engine's, which the
// commands against the shared server run with every operator planted, plus setup and workload
// statements of their own that call functions: a planted operator only these call would be
// reported as one the control run never ran. The pinned run plants everything everywhere.
var controlPlantsFunctions = map[string]bool{"demo": true, "bench": true}

// runWithSync runs runs[0], a sync, in the background until its control socket (the value of its
// --control) answers, then the other commands (runCommand), the sync going on for a while after
// the first (a re-backfill asked for runs), and stops it with SIGINT before the last (cleanup).
func runWithSync(t *testing.T, bin string, env []string, runs [][]string, control bool) {
	sync := exec.Command(bin, runs[0]...)
	sync.Env = env
	var errBuf strings.Builder
	sync.Stderr = &errBuf
	require.NoError(t, sync.Start())
	sock := runs[0][slices.Index(runs[0], "--control")+1]
	answered := false
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && !answered; time.Sleep(100 * time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			_ = c.Close()
			answered = true
		}
	}
	if !control {
		require.True(t, answered, "the sync's control socket answers:\n%s", tailOf(errBuf.String()))
	}
	runCommand(t, bin, env, runs[1], control)
	time.Sleep(3 * time.Second) // the re-backfill runs
	_ = sync.Process.Signal(syscall.SIGINT)
	err := sync.Wait()
	t.Logf("tidemark sync with a control socket: %v", err)
	if !control {
		require.NoError(t, err, "tidemark sync, stopped by SIGINT:\n%s", tailOf(errBuf.String()))
	}
	for _, args := range runs[2:] {
		runCommand(t, bin, env, args, control)
	}
}

// runCommand runs the tidemark binary with args. In the pinned run every command must succeed
// (doctor's findings aside, it exits 1 when it finds one); the control run's may fail, the
// planted objects being no faithful copies. stream runs until interrupted.
func runCommand(t *testing.T, bin string, env, args []string, control bool) {
	limit := 3 * time.Minute
	if control {
		// The control run's commands meet the planted objects, which may slow them or make them
		// fail (a chaos run whose capture could not keep up waited 95 s for it): they call what
		// they call early, and a bound keeps the test's time (SIGINT, as an operator's Ctrl-C).
		// The slowest, the bench and the chaos run, took up to 16 s in a CI run beside the
		// pinned run and the package's other tests: the bound leaves them room on a loaded machine.
		limit = 45 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var outBuf, errBuf strings.Builder
	command := func() *exec.Cmd {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = &outBuf, &errBuf
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
		cmd.WaitDelay = 5 * time.Second
		return cmd
	}
	cmd := command()
	if args[0] == "stream" {
		require.NoError(t, cmd.Start())
		time.Sleep(3 * time.Second)
		_ = cmd.Process.Signal(syscall.SIGINT)
	}
	var err error
	start := time.Now()
	switch {
	case args[0] == "stream":
		err = cmd.Wait()
	case args[0] == "rebackfill":
		// The control socket answers from the sync's start; until its capture runs, the sync
		// says to ask again shortly, and an operator does.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			err = cmd.Run()
			if err == nil || !strings.Contains(errBuf.String(), "not running at this moment") || time.Now().After(deadline) {
				break
			}
			outBuf.Reset()
			errBuf.Reset()
			cmd = command()
		}
	default:
		err = cmd.Run()
	}
	t.Logf("%s: tidemark %s: %v (%s)", map[bool]string{true: "control", false: "pinned"}[control], args[0], err, time.Since(start).Round(100*time.Millisecond))
	if control && err != nil {
		t.Logf("control: tidemark %s:\n%s", args[0], tailOf(errBuf.String()))
	}
	if !control && args[0] != "doctor" {
		require.NoError(t, err, "tidemark %s (pinned, as the product runs):\n%s\n%s", strings.Join(args, " "), tailOf(outBuf.String()), tailOf(errBuf.String()))
	}
}

// runConnector runs the connector's spec, check, discover and read (CDC, then Standard and
// Xmin) against database db.
func runConnector(t *testing.T, srv *e2e.Server, bin string, env []string, db, dir, pass string, control bool) {
	cfg := func(method map[string]any) string {
		c := map[string]any{"host": srv.Host(), "port": srv.Port(), "database": db, "username": "postgres", "password": srvPassword(t, srv),
			"schemas": []string{"public"}, "ssl_mode": map[string]any{"mode": "disable"}, "replication_method": method}
		if method["method"] == "CDC" {
			c["create_replication_slot"] = true
		}
		b, _ := json.Marshal(c)
		p := filepath.Join(dir, fmt.Sprintf("config-%s.json", method["method"]))
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	catalog := func(incremental bool, cursor string) string {
		mode := "full_refresh"
		if incremental {
			mode = "incremental"
		}
		var streams []any
		for _, s := range []struct {
			name string
			key  []string
		}{{"items", []string{"id"}}, {"tenants", []string{"tenant", "id"}}} {
			keys := [][]string{}
			for _, k := range s.key {
				keys = append(keys, []string{k})
			}
			st := map[string]any{"stream": map[string]any{"name": s.name, "namespace": "public", "json_schema": map[string]any{"type": "object"},
				"supported_sync_modes": []string{"full_refresh", "incremental"}, "source_defined_primary_key": keys},
				"sync_mode": mode, "destination_sync_mode": "append", "primary_key": keys}
			if cursor != "" && s.name == "items" {
				st["cursor_field"] = []string{cursor}
			} else if cursor != "" {
				st["sync_mode"] = "full_refresh"
			}
			streams = append(streams, st)
		}
		b, _ := json.Marshal(map[string]any{"streams": streams})
		p := filepath.Join(dir, fmt.Sprintf("catalog-%v-%s.json", incremental, cursor))
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	cdc := cfg(map[string]any{"method": "CDC", "replication_slot": "planted_ab_" + pass, "publication": "planted"})
	standard, xmin := cfg(map[string]any{"method": "Standard"}), cfg(map[string]any{"method": "Xmin"})
	// Each read twice: the second from the first's last state (a Standard stream's increments
	// are read by cursor only then).
	runs := [][]string{
		{"spec"},
		{"check", "--config", cdc},
		{"discover", "--config", cdc},
		{"read", "--config", cdc, "--catalog", catalog(true, "")},
		{"read", "--config", cdc, "--catalog", catalog(true, ""), "--state", "@"},
		{"read", "--config", standard, "--catalog", catalog(true, "updated_at")},
		{"read", "--config", standard, "--catalog", catalog(true, "updated_at"), "--state", "@"},
		// A cursor of the enum (its highest value is read as text).
		{"read", "--config", standard, "--catalog", catalog(true, "m")},
		{"read", "--config", xmin, "--catalog", catalog(true, "")},
		{"read", "--config", xmin, "--catalog", catalog(true, ""), "--state", "@"},
	}
	var lastState []byte
	for i, args := range runs {
		if i > 0 && runs[i-1][0] == "read" && runs[i-1][len(runs[i-1])-1] != "@" && strings.Contains(runs[i-1][2], "Standard") {
			// A change after the first Standard read: the second reads it by cursor.
			c := harness(t, srv, db)
			_, err := c.Exec(context.Background(), `UPDATE public.items SET updated_at = pg_catalog.clock_timestamp() WHERE id IN (1, 2)`)
			c.Close(context.Background())
			require.NoError(t, err)
		}
		if args[len(args)-1] == "@" {
			p := filepath.Join(dir, "state.json")
			require.NoError(t, os.WriteFile(p, lastState, 0o600))
			args[len(args)-1] = p
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = env
		start := time.Now()
		out, err := cmd.Output()
		took := time.Since(start).Round(100 * time.Millisecond)
		if ee, ok := err.(*exec.ExitError); ok {
			out = append(out, ee.Stderr...)
		}
		cancel()
		// The last state of each stream (STREAM states), or the last GLOBAL one.
		states := map[string]json.RawMessage{}
		var order []string
		for _, l := range strings.Split(string(out), "\n") {
			var m struct {
				Type  string          `json:"type"`
				State json.RawMessage `json:"state"`
			}
			if json.Unmarshal([]byte(l), &m) != nil || m.Type != "STATE" {
				continue
			}
			var st struct {
				Stream *struct {
					Descriptor json.RawMessage `json:"stream_descriptor"`
				} `json:"stream"`
			}
			_ = json.Unmarshal(m.State, &st)
			k := "global"
			if st.Stream != nil {
				k = string(st.Stream.Descriptor)
			}
			if _, ok := states[k]; !ok {
				order = append(order, k)
			}
			states[k] = m.State
		}
		var all []string
		for _, k := range order {
			all = append(all, string(states[k]))
		}
		lastState = []byte("[" + strings.Join(all, ",") + "]")
		t.Logf("%s: source-postgres %s: %v (%s)", map[bool]string{true: "control", false: "pinned"}[control], args[0], err, took)
		if control && err != nil {
			t.Logf("control: source-postgres %s:\n%s", args[0], tailOf(string(out)))
		}
		if !control {
			require.NoError(t, err, "source-postgres %s (pinned):\n%s", strings.Join(args, " "), tailOf(string(out)))
			require.NotContains(t, string(out), `"status":"FAILED"`, "source-postgres %s (pinned):\n%s", args[0], tailOf(string(out)))
			require.NotContains(t, string(out), `"failure_type"`, "source-postgres %s (pinned):\n%s", args[0], tailOf(string(out)))
		}
	}
}

func srvPassword(t *testing.T, srv *e2e.Server) string {
	cfg, err := pgx.ParseConfig(srv.DSN("postgres"))
	require.NoError(t, err)
	return cfg.Password
}

// logLine is one record of a server log with the default log_line_prefix ('%m [%p] %q%a '):
// the application, the level and the message.
var logLine = regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+ \[\d+\] (.*?)(LOG|ERROR|WARNING|FATAL|PANIC|DETAIL|HINT|CONTEXT|STATEMENT|NOTICE|INFO|DEBUG\d?):  (.*)$`)

// readLog reads a server log from offset: the planted objects that ran (RAISE LOG of
// tidemark_planted_fired) outside the harness's sessions, and the builtins the statements of
// those sessions call by name.
func readLog(t *testing.T, path string, offset int64, r *plantedRun) {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Seek(offset, 0)
	require.NoError(t, err)
	type record struct{ app, level, msg string }
	var recs []*record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		l := sc.Text()
		if m := logLine.FindStringSubmatch(l); m != nil {
			recs = append(recs, &record{app: strings.TrimSpace(m[1]), level: m[2], msg: m[3]})
		} else if len(recs) > 0 {
			recs[len(recs)-1].msg += "\n" + l
		}
	}
	require.NoError(t, sc.Err())
	for _, rec := range recs {
		// Only Tidemark's sessions (every one names itself tidemark...), not the harness's nor
		// the bench's psql, pg_recvlogical or native subscription workers.
		if !strings.HasPrefix(rec.app, "tidemark") || rec.level != "LOG" {
			continue
		}
		if name, ok := strings.CutPrefix(rec.msg, firedTag); ok {
			if _, seen := r.fired[name]; !seen {
				r.fired[name] = rec.app
			}
			continue
		}
		var sql string
		if s, ok := strings.CutPrefix(rec.msg, "statement: "); ok {
			sql = s
		} else if strings.HasPrefix(rec.msg, "execute ") {
			if _, s, ok := strings.Cut(rec.msg, ": "); ok {
				sql = s
			}
		}
		if sql != "" {
			for n := range calledNames(sql) {
				r.called[n] = true
			}
		}
	}
}
