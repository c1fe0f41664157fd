package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/merge"
)

// TestHostileFunctionsGainNothing reproduces the privilege escalation of a role with CREATE on
// public (CVE-2018-1058's pattern) through the connector: a function public.unnest(int2vector),
// which matches the call that reads a primary key's columns better than the builtin
// unnest(anyarray), would run as the connector's role (here a superuser) in check, discover and
// read. None may call it: the role stays without privileges.
func TestHostileFunctionsGainNothing(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text)`)
	e.db.Exec(`INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 10) g`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	role := "mallory_" + e.db.Name
	e.db.Exec(`CREATE ROLE ` + role + ` LOGIN NOSUPERUSER`)
	e.db.Exec(`GRANT CREATE ON SCHEMA public TO ` + role)
	t.Cleanup(func() {
		e.db.Exec(`DROP OWNED BY ` + role)
		e.db.Exec(`DROP ROLE ` + role)
	})
	e.db.Exec(fmt.Sprintf(`SET ROLE %[1]s;
		CREATE FUNCTION public.unnest(int2vector) RETURNS SETOF smallint LANGUAGE plpgsql AS $f$
		BEGIN
			IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
				EXECUTE 'ALTER ROLE %[1]s SUPERUSER';
			END IF;
			RETURN QUERY SELECT pg_catalog.unnest($1::pg_catalog.int2[]);
		END $f$;
		RESET ROLE`, role))
	super := func() bool {
		var s bool
		require.NoError(t, e.db.Connect().QueryRow(t.Context(), `SELECT rolsuper FROM pg_roles WHERE rolname = $1`, role).Scan(&s))
		return s
	}
	status, msg := e.checkStatus()
	require.Equal(t, "SUCCEEDED", status, msg)
	require.False(t, super(), "check ran the function planted in public")
	r := e.run("discover", "--config", e.config())
	require.Equal(t, 0, r.code, tail(r.stderr))
	require.False(t, super(), "discover ran the function planted in public")
	r = e.read(e.catalog("public.t"), nil)
	require.Equal(t, 0, r.code, tail(r.stderr))
	require.Len(t, r.records(), 10)
	require.False(t, super(), "read ran the function planted in public")
}

// TestHostileCursorType: a Standard stream whose cursor column is of an enum owned by another
// role, who also made a cast of it to text with a function of theirs. The first read finds the
// highest cursor value; converting it to text on the server would run that function as the
// connector's role (here a superuser). It must be read in the type's own text form.
func TestHostileCursorType(t *testing.T) {
	e := newEnv(t)
	role := "mallory_" + e.db.Name
	e.db.Exec(`CREATE ROLE ` + role + ` LOGIN NOSUPERUSER`)
	e.db.Exec(`GRANT CREATE ON SCHEMA public TO ` + role)
	t.Cleanup(func() {
		e.db.Exec(`DROP OWNED BY ` + role)
		e.db.Exec(`DROP ROLE ` + role)
	})
	e.db.Exec(fmt.Sprintf(`SET ROLE %[1]s;
		CREATE TYPE public.stage AS ENUM ('new', 'paid', 'shipped');
		CREATE FUNCTION public.stage_text(public.stage) RETURNS text LANGUAGE plpgsql AS $f$
		BEGIN
			IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
				EXECUTE 'ALTER ROLE %[1]s SUPERUSER';
			END IF;
			RETURN 'shipped';
		END $f$;
		CREATE CAST (public.stage AS text) WITH FUNCTION public.stage_text(public.stage);
		RESET ROLE`, role))
	e.db.Exec(`CREATE TABLE public.orders (id int PRIMARY KEY, s public.stage NOT NULL)`)
	// Casts have no owner: DROP OWNED leaves them, and they hold the function.
	t.Cleanup(func() { e.db.Exec(`DROP TABLE public.orders; DROP CAST (public.stage AS text)`) })
	e.db.Exec(`INSERT INTO public.orders SELECT g, (ARRAY['new', 'paid'])[g % 2 + 1]::public.stage FROM generate_series(1, 10) g`)
	e.cfg["replication_method"] = map[string]any{"method": "Standard"}
	r := e.read(e.cursorCatalog(map[string]string{"public.orders": "s"}, "public.orders"), nil)
	require.Len(t, r.records(), 10)
	var super bool
	require.NoError(t, e.db.Connect().QueryRow(t.Context(), `SELECT rolsuper FROM pg_roles WHERE rolname = $1`, role).Scan(&super))
	require.False(t, super, "the read cast the cursor value to text with %s's function, as a superuser", role)
	states := r.ofType("STATE")
	require.NotEmpty(t, states)
	require.Contains(t, string(states[len(states)-1].raw), `"cursor":"paid"`, "the cursor is the highest value, in the enum's own text form")
}

// TestHostileView: a view is read as the connector's role, and the functions it calls run as
// that role (a view's functions run as whoever queries it). A view another role owns, or that
// calls another role's function, must not be read: its owner could run code with the
// connector's rights (here a superuser's). A view of this role's calling only trusted functions
// is read.
func TestHostileView(t *testing.T) {
	e := newEnv(t)
	role := "mallory_" + e.db.Name
	e.db.Exec(`CREATE ROLE ` + role + ` LOGIN NOSUPERUSER`)
	e.db.Exec(`GRANT CREATE ON SCHEMA public TO ` + role)
	t.Cleanup(func() {
		e.db.Exec(`DROP OWNED BY ` + role)
		e.db.Exec(`DROP ROLE ` + role)
	})
	e.db.Exec(`CREATE TABLE public.t (id int PRIMARY KEY, v text)`)
	e.db.Exec(`INSERT INTO public.t SELECT g, md5(g::text) FROM generate_series(1, 10) g`)
	e.db.Exec(`GRANT SELECT ON public.t TO ` + role)
	e.db.Exec(`CREATE VIEW public.fine AS SELECT id, pg_catalog.upper(v) AS v FROM public.t`)
	e.db.Exec(fmt.Sprintf(`SET ROLE %[1]s;
		CREATE FUNCTION public.rows() RETURNS SETOF public.t LANGUAGE plpgsql AS $f$
		BEGIN
			IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
				EXECUTE 'ALTER ROLE %[1]s SUPERUSER';
			END IF;
			RETURN QUERY SELECT * FROM public.t;
		END $f$;
		CREATE VIEW public.theirs AS SELECT * FROM public.rows();
		RESET ROLE`, role))
	// A view of this role's over the other role's view: its functions run as the reader too.
	e.db.Exec(`CREATE VIEW public.wrapped AS SELECT * FROM public.theirs`)
	t.Cleanup(func() { e.db.Exec(`DROP VIEW public.wrapped`) })
	super := func() bool {
		var s bool
		require.NoError(t, e.db.Connect().QueryRow(t.Context(), `SELECT rolsuper FROM pg_roles WHERE rolname = $1`, role).Scan(&s))
		return s
	}
	r := e.read(e.catalog("public.fine"), nil)
	require.Len(t, r.records(), 10, "a view of this role's, calling builtins, is read")
	for _, view := range []string{"public.theirs", "public.wrapped"} {
		r := e.run("read", "--config", e.config(), "--catalog", e.catalog(view))
		require.False(t, super(), "reading %s ran %s's function as a superuser", view, role)
		require.Empty(t, r.records(), view)
		require.Contains(t, r.stdout, "config_error", view)
		require.Contains(t, r.stdout, "ALTER VIEW public.theirs OWNER TO CURRENT_USER", view)
		require.Contains(t, r.stdout, "public.rows() of "+role, view)
	}
}

// TestPrintedFixesAreSafeToPaste reproduces the injection through printed SQL: check prints the
// statements that fix what it finds, for a DBA to paste into a session of theirs (here as a
// superuser, with standard_conforming_strings on and off); a replication_slot written by
// someone else must not make them do anything but what they say.
func TestPrintedFixesAreSafeToPaste(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	role := "mallory_" + e.db.Name
	e.db.Exec(`CREATE ROLE ` + role + ` LOGIN NOSUPERUSER`)
	t.Cleanup(func() { e.db.Exec(`DROP ROLE ` + role) })
	e.cfg["create_replication_slot"] = false // check then prints the statement that creates it
	for _, slot := range []string{
		"x', 'pgoutput'); ALTER ROLE " + role + " SUPERUSER; --",
		`x\'', 'pgoutput'); ALTER ROLE ` + role + ` SUPERUSER; --`,
	} {
		e.cdc()["replication_slot"] = slot
		_, msg := e.checkStatus()
		// Every statement the message gives as a fix, run as the DBA would.
		_, fixes, _ := strings.Cut(msg, "fix: ")
		for _, stmt := range regexp.MustCompile(`(SELECT|ALTER|CREATE|GRANT)\b[^;]*;[^(]*`).FindAllString(fixes, -1) {
			for _, scs := range []string{"on", "off"} {
				c := e.db.Connect()
				_, _ = c.Exec(t.Context(), "SET standard_conforming_strings = "+scs+"; "+stmt)
				c.Close(t.Context())
			}
		}
		var super bool
		require.NoError(t, e.db.Connect().QueryRow(t.Context(), `SELECT rolsuper FROM pg_roles WHERE rolname = $1`, role).Scan(&super))
		require.False(t, super, "a fix check printed for replication_slot %q made %s a superuser:\n%s", slot, role, msg)
	}
}

// FuzzState: a state file is the platform's, or anyone's who can write it: it loads or is
// refused with an error, never panics, and what loads is checked (merge.TableProgress.Check).
func FuzzState(f *testing.F) {
	for _, s := range []string{
		`[{"type":"GLOBAL","global":{"shared_state":{"tidemark":1,"lsn":16,"invisible":"1-3"},"stream_states":[{"stream_descriptor":{"name":"t","namespace":"public"},"stream_state":{"sync_mode":"incremental","key":["id"],"cursor":["1"]}}]}}]`,
		`[{"type":"STREAM","stream":{"stream_descriptor":{"name":"t"},"stream_state":{"version":2,"state_type":"cursor_based","cursor_field":["u"],"cursor":"5"}}}]`,
		`{"cdc":true,"cdc_state":{"state":{}}}`, `[]`, `null`, `[{"type":"GLOBAL","global":{"shared_state":{"tidemark":1,"lsn":0,"invisible":"0-16777216,16777217-33554433,33554434-50331650"}}}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "state.json")
		require.NoError(t, os.WriteFile(path, b, 0o600))
		st, err := loadState(path)
		if err != nil {
			return
		}
		if st.pos != nil {
			if st.pos.Invisible != nil {
				require.LessOrEqual(t, len(*st.pos.Invisible), merge.MaxInvisible)
			}
			for _, tp := range st.pos.Tables {
				require.NoError(t, tp.Check())
			}
		}
	})
}
