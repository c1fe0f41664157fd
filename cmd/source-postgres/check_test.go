package main

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// check and discover: the connection status, and the streams, types, sync modes and keys.

// checkStatus runs check and returns its one CONNECTION_STATUS.
func (e *env) checkStatus() (status, message string) {
	e.t.Helper()
	r := e.run("check", "--config", e.config())
	require.Equal(e.t, 0, r.code, "check exits 0 whatever it finds:\n%s", tail(r.stderr))
	st := r.ofType("CONNECTION_STATUS")
	require.Len(e.t, st, 1, "exactly one CONNECTION_STATUS:\n%s", r.stdout)
	require.Len(e.t, r.msgs, len(st)+len(r.ofType("LOG")), "check prints its status and logs only")
	return st[0].str("connectionStatus", "status"), st[0].str("connectionStatus", "message")
}

func TestCheckSucceeds(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	status, msg := e.checkStatus()
	require.Equal(t, "SUCCEEDED", status, msg)
}

func TestCheckFailsWithAnActionableMessage(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	role := "chk_" + e.db.Name[2:]
	const rolePassword = "role-secret-9f8e7d"
	e.db.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s'`, role, rolePassword))
	e.db.Exec(`GRANT SELECT ON t TO ` + role)
	t.Cleanup(func() {
		e.db.Exec(`DROP OWNED BY ` + role)
		e.db.Exec(`DROP ROLE ` + role)
	})
	e.secrets = append(e.secrets, rolePassword, "wrong-password-42")
	good := e.cfg

	free, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedPort := free.Addr().(*net.TCPAddr).Port
	free.Close()

	cases := []struct {
		name string
		edit func(c map[string]any)
		want []string // in the message
	}{
		{"bad password", func(c map[string]any) { c["password"] = "wrong-password-42" }, []string{"password"}},
		{"unreachable host", func(c map[string]any) { c["port"] = closedPort }, []string{"connect to", fmt.Sprint(closedPort)}},
		{"missing slot", func(c map[string]any) { c["create_replication_slot"] = false }, []string{`replication slot "` + e.db.Slot + `" does not exist`, "pg_create_logical_replication_slot"}},
		{"missing publication", func(c map[string]any) { c["replication_method"].(map[string]any)["publication"] = "no_such_pub" }, []string{`publication "no_such_pub" does not exist`, "CREATE PUBLICATION"}},
		{"no REPLICATION privilege", func(c map[string]any) { c["username"], c["password"] = role, rolePassword }, []string{"REPLICATION", "ALTER ROLE"}},
		{"signal table checked when configured", func(c map[string]any) {
			c["username"], c["password"] = role, rolePassword
			c["signal_table"] = "public.tidemark_signal"
		}, []string{`signal table "public"."tidemark_signal" does not exist, and this role may not create it`}},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			e.t = t
			e.cfg = clone(good)
			tc.edit(e.cfg)
			status, msg := e.checkStatus()
			require.Equal(t, "FAILED", status)
			for _, w := range tc.want {
				require.Contains(t, msg, w)
			}
		})
	}
}

// TestCheckFailsOnWalLevel: a server without wal_level=logical fails the check with the
// setting to change.
func TestCheckFailsOnWalLevel(t *testing.T) {
	e2e.NeedsLocal(t, server, "needs a second local server with wal_level=replica")
	other, err := e2e.Start(t.Context(), e2e.Options{Settings: map[string]string{"wal_level": "replica"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Stop(t.Context()) })
	e := newEnv(t)
	e.cfg["port"] = other.Port()
	pc := parseDSN(t, other.DSN("postgres"))
	e.cfg["database"], e.cfg["password"] = "postgres", pc.Password
	e.secrets = append(e.secrets, pc.Password)
	status, msg := e.checkStatus()
	require.Equal(t, "FAILED", status)
	require.Contains(t, msg, "wal_level")
	require.Contains(t, msg, "logical")
}

func clone(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		if mv, ok := v.(map[string]any); ok {
			v = clone(mv)
		}
		out[k] = v
	}
	return out
}

func TestDiscoverOneStreamPerTable(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE SCHEMA sales`)
	e.db.Exec(`CREATE TABLE public.a (id int PRIMARY KEY, v text)`)
	e.db.Exec(`CREATE TABLE sales.b (id bigint PRIMARY KEY, amount numeric(12,2))`)
	e.db.Exec(`CREATE TABLE other_hidden (id int)`) // not in the configured schemas? (public is): listed
	e.db.Exec(`CREATE SCHEMA ignored`)
	e.db.Exec(`CREATE TABLE ignored.c (id int PRIMARY KEY)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE public.a, sales.b`)
	e.cfg["schemas"] = []string{"public", "sales"}
	r := e.run("discover", "--config", e.config())
	require.Equal(t, 0, r.code, r.stderr)
	cats := r.ofType("CATALOG")
	require.Len(t, cats, 1)
	require.Len(t, r.msgs, 1+len(r.ofType("LOG")))
	got := map[string]map[string]any{}
	for _, s := range cats[0].get("catalog", "streams").([]any) {
		st := s.(map[string]any)
		got[st["namespace"].(string)+"."+st["name"].(string)] = st
	}
	require.ElementsMatch(t, []string{"public.a", "sales.b", "public.other_hidden"}, keys(got))
	for name, st := range got {
		schema := st["json_schema"].(map[string]any)
		require.Equal(t, "object", schema["type"], name)
		props := schema["properties"].(map[string]any)
		for _, c := range []string{colLSN, colUpdatedAt, colDeletedAt} {
			require.Contains(t, props, c, name)
		}
	}
	require.Contains(t, got["public.a"]["json_schema"].(map[string]any)["properties"], "v")
	require.Contains(t, got["sales.b"]["json_schema"].(map[string]any)["properties"], "amount")
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestDiscoverTypes(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int8 PRIMARY KEY, d date, ts timestamp, tstz timestamptz, tm time, tmtz timetz,
		n numeric, f float8, b bool, bytes bytea, arr int[], j jsonb)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	r := e.run("discover", "--config", e.config())
	require.Equal(t, 0, r.code, r.stderr)
	st := r.ofType("CATALOG")[0].get("catalog", "streams").([]any)[0].(map[string]any)
	schema := st["json_schema"].(map[string]any)
	require.NotContains(t, schema, "required")
	props := schema["properties"].(map[string]any)
	typ := func(c string) map[string]any { return props[c].(map[string]any) }
	require.Equal(t, []any{"null", "integer"}, typ("id")["type"], "int8 is an integer")
	for c, want := range map[string][2]string{
		"d": {"date", ""}, "ts": {"date-time", "timestamp_without_timezone"}, "tstz": {"date-time", "timestamp_with_timezone"},
		"tm": {"time", "time_without_timezone"}, "tmtz": {"time", "time_with_timezone"},
	} {
		require.Equal(t, want[0], typ(c)["format"], c)
		if want[1] != "" {
			require.Equal(t, want[1], typ(c)["airbyte_type"], c)
		}
	}
	require.Equal(t, []any{"null", "number"}, typ("n")["type"])
	require.Equal(t, []any{"null", "array"}, typ("arr")["type"])
	require.Contains(t, typ("arr"), "items")
	// bytea: hex text in Airbyte's forms (the default), base64 in the exact ones.
	require.Equal(t, map[string]any{"type": []any{"null", "string"}}, typ("bytes"))
	require.Equal(t, []any{"null", "string"}, typ("j")["type"])
	e.cfg["value_forms"] = "exact"
	r = e.run("discover", "--config", e.config())
	require.Equal(t, 0, r.code, r.stderr)
	props = r.ofType("CATALOG")[0].get("catalog", "streams").([]any)[0].(map[string]any)["json_schema"].(map[string]any)["properties"].(map[string]any)
	require.Equal(t, "base64", typ("bytes")["contentEncoding"])
}

func TestDiscoverSyncModesAndKeys(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE captured (a int, b text, PRIMARY KEY (b, a))`)
	e.db.Exec(`CREATE TABLE unpublished (id int PRIMARY KEY)`)
	e.db.Exec(`CREATE TABLE nokey (v int)`)
	e.db.Exec(`CREATE VIEW vw AS SELECT * FROM captured`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE captured, nokey`)
	r := e.run("discover", "--config", e.config())
	require.Equal(t, 0, r.code, r.stderr)
	got := map[string]map[string]any{}
	for _, s := range r.ofType("CATALOG")[0].get("catalog", "streams").([]any) {
		got[s.(map[string]any)["name"].(string)] = s.(map[string]any)
	}
	c := got["captured"]
	require.Equal(t, []any{"full_refresh", "incremental"}, c["supported_sync_modes"])
	require.Equal(t, true, c["source_defined_cursor"])
	require.Equal(t, []any{colLSN}, c["default_cursor_field"])
	require.Equal(t, []any{[]any{"b"}, []any{"a"}}, c["source_defined_primary_key"], "the key in key order")
	require.Equal(t, true, c["is_resumable"])

	u := got["unpublished"]
	require.Equal(t, []any{"full_refresh"}, u["supported_sync_modes"])
	require.Equal(t, []any{[]any{"id"}}, u["source_defined_primary_key"], "the key is reported for full refresh streams too")
	for _, name := range []string{"nokey", "vw"} {
		require.Equal(t, []any{"full_refresh"}, got[name]["supported_sync_modes"], name)
		require.NotContains(t, got[name], "source_defined_primary_key", name)
		require.NotContains(t, got[name], "is_resumable", name)
	}
}

func TestDiscoverKeyAndCursorPathsExist(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t1 (id int PRIMARY KEY, v text)`)
	e.db.Exec(`CREATE TABLE t2 (x int, y int, PRIMARY KEY (x, y))`)
	e.db.Exec(`CREATE TABLE t3 (id int PRIMARY KEY)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t1, t2`)
	r := e.run("discover", "--config", e.config())
	require.Equal(t, 0, r.code, r.stderr)
	for _, s := range r.ofType("CATALOG")[0].get("catalog", "streams").([]any) {
		st := s.(map[string]any)
		props := st["json_schema"].(map[string]any)["properties"].(map[string]any)
		var paths [][]any
		if pk, ok := st["source_defined_primary_key"].([]any); ok {
			for _, p := range pk {
				paths = append(paths, p.([]any))
			}
		}
		if c, ok := st["default_cursor_field"].([]any); ok {
			paths = append(paths, c)
		}
		for _, p := range paths {
			require.Len(t, p, 1)
			prop, ok := props[p[0].(string)].(map[string]any)
			require.True(t, ok, "%s: path %v is not a property", st["name"], p)
			require.NotContains(t, prop["type"], "object")
			require.NotContains(t, prop["type"], "array")
		}
	}
}

// TestLegacySSLFlag: Airbyte's legacy ssl flag, without ssl_mode, is honoured against a real
// server (this one has no TLS): false connects without TLS, true requires it and so fails with
// the TLS cause.
func TestLegacySSLFlag(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	e.cfg["create_replication_slot"] = true
	delete(e.cfg, "ssl_mode")
	e.cfg["ssl"] = false
	status, msg := e.checkStatus()
	require.Equal(t, "SUCCEEDED", status, msg)
	e.cfg["ssl"] = true
	status, msg = e.checkStatus()
	require.Equal(t, "FAILED", status)
	require.Contains(t, msg, "TLS")
}

// TestCheckHeartbeatQuery: the heartbeat_action_query runs on a connection whose search_path is
// pg_catalog only (docs/security.md), so one that names its table without a schema, as Airbyte's
// setup guide writes it, fails check with the fix; written schema-qualified, it passes.
func TestCheckHeartbeatQuery(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	e.db.Exec(`CREATE TABLE airbyte_heartbeat (id int PRIMARY KEY, at timestamptz)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	e.cdc()["heartbeat_action_query"] = `INSERT INTO airbyte_heartbeat VALUES (1, now()) ON CONFLICT (id) DO UPDATE SET at = excluded.at`
	status, msg := e.checkStatus()
	require.Equal(t, "FAILED", status, msg)
	require.Contains(t, msg, `relation "airbyte_heartbeat" does not exist`)
	require.Contains(t, msg, "INSERT INTO public.airbyte_heartbeat (...)")
	e.cdc()["heartbeat_action_query"] = `INSERT INTO public.airbyte_heartbeat VALUES (1, now()) ON CONFLICT (id) DO UPDATE SET at = excluded.at`
	status, msg = e.checkStatus()
	require.Equal(t, "SUCCEEDED", status, msg)
}

// TestCheckRunsNoHeartbeat: check plans the heartbeat_action_query to see that it resolves; it
// runs none of it, even when it holds several statements.
func TestCheckRunsNoHeartbeat(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	e.db.Exec(`CREATE TABLE public.hb (id int)`)
	e.db.Exec(`CREATE TABLE public.victim (id int)`)
	e.db.Exec(`INSERT INTO public.victim VALUES (1)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	e.cdc()["heartbeat_action_query"] = `INSERT INTO public.hb VALUES (1); DELETE FROM public.victim`
	e.checkStatus()
	var n int
	require.NoError(t, e.db.Conn.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM public.victim) + (SELECT count(*) FROM public.hb)`).Scan(&n))
	require.Equal(t, 1, n, "check ran the heartbeat query (or a part of it)")
}

// TestCheckLogsIdleSlots: check passes with a slot nobody streams from in the database (a
// capture stopped, or a run killed before its first checkpoint), and logs it with the WAL it
// retains and how to drop it, as doctor does.
func TestCheckLogsIdleSlots(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	orphan := e.db.Slot + "_orphan"
	e.db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, orphan)
	t.Cleanup(func() { e.db.Exec(`SELECT pg_drop_replication_slot($1)`, orphan) })
	r := e.run("check", "--config", e.config())
	require.Equal(t, 0, r.code)
	st := r.ofType("CONNECTION_STATUS")
	require.Len(t, st, 1)
	require.Equal(t, "SUCCEEDED", st[0].str("connectionStatus", "status"))
	var logged []string
	for _, m := range r.ofType("LOG") {
		logged = append(logged, m.str("log", "message"))
	}
	require.Contains(t, strings.Join(logged, "\n"), fmt.Sprintf("replication slot %q is not in use and retains", orphan))
	require.Contains(t, strings.Join(logged, "\n"), "tidemark cleanup --slot "+orphan)
}
