package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgjson"
)

// The connector's tests run the built binary, as the platform does, against a real PostgreSQL
// (the e2e harness), and check every message it prints against the protocol's schemas.

var (
	server  *e2e.Server
	binPath string // the connector, built by TestMain
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tidemark-source-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Readable by everyone: a test runs it as an unprivileged user, as the platform does.
	_ = os.Chmod(dir, 0o755)
	binPath = filepath.Join(dir, "source-postgres")
	// "go" from PATH: go test puts the bin directory of its own GOROOT first on the test's PATH.
	if err := e2e.GoBuild(binPath, ".", ""); err != nil {
		fmt.Fprintln(os.Stderr, "build the connector:", err)
		os.Exit(1)
	}
	code := e2e.Main(m, &server)
	os.RemoveAll(dir)
	os.Exit(code)
}

// protocolSchemas are the protocol YAML's AirbyteMessage and ConfiguredAirbyteCatalog, compiled.
var protocolSchemas = sync.OnceValues(func() (map[string]*jsonschema.Schema, error) {
	b, err := os.ReadFile("testdata/airbyte_protocol.yaml")
	if err != nil {
		return nil, err
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	// Through JSON, so the document has the types a JSON schema library expects.
	j, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	parsed, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	if err := c.AddResource("airbyte_protocol.json", parsed); err != nil {
		return nil, err
	}
	out := map[string]*jsonschema.Schema{}
	for _, def := range []string{"AirbyteMessage", "ConfiguredAirbyteCatalog", "AirbyteStateMessage"} {
		s, err := c.Compile("airbyte_protocol.json#/definitions/" + def)
		if err != nil {
			return nil, fmt.Errorf("compile %s: %w", def, err)
		}
		out[def] = s
	}
	return out, nil
})

// validate checks v against one of the protocol's definitions.
func validate(t testing.TB, def string, raw []byte) {
	t.Helper()
	schemas, err := protocolSchemas()
	require.NoError(t, err)
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	require.NoError(t, err)
	require.NoError(t, schemas[def].Validate(v), "%s does not validate: %s", def, raw)
}

// msg is one protocol message of the connector's output.
type msg struct {
	raw  []byte
	Type string
	m    map[string]any
	at   time.Time // when it was read (for cadence checks)
}

func (m msg) get(path ...string) any {
	var v any = m.m
	for _, p := range path {
		o, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = o[p]
	}
	return v
}

func (m msg) str(path ...string) string { s, _ := m.get(path...).(string); return s }

// result is one run of the connector.
type result struct {
	code   int
	msgs   []msg
	stdout string
	stderr string
}

func (r *result) ofType(typ string) []msg {
	var out []msg
	for _, m := range r.msgs {
		if m.Type == typ {
			out = append(out, m)
		}
	}
	return out
}

func (r *result) records() []msg { return r.ofType("RECORD") }
func (r *result) states() []msg  { return r.ofType("STATE") }

// traces returns the TRACE messages of a kind (ERROR, ESTIMATE, STREAM_STATUS, ANALYTICS).
func (r *result) traces(kind string) []msg {
	var out []msg
	for _, m := range r.ofType("TRACE") {
		if m.str("trace", "type") == kind {
			out = append(out, m)
		}
	}
	return out
}

// lastState is the last STATE, as the platform would store it for the next read.
func (r *result) lastState(t testing.TB) []byte {
	t.Helper()
	st := r.states()
	require.NotEmpty(t, st, "no STATE in the output")
	s, err := json.Marshal([]any{st[len(st)-1].m["state"]})
	require.NoError(t, err)
	return s
}

// env is one test's connector setup: a database, a config, files.
type env struct {
	t       testing.TB
	db      *e2e.TestDB
	dir     string
	cfg     map[string]any
	secrets []string
}

func newEnv(t testing.TB) *env {
	db := e2e.NewTestDB(t, server)
	pc, err := pgx.ParseConfig(db.DSN)
	require.NoError(t, err)
	e := &env{t: t, db: db, dir: t.TempDir(), secrets: []string{pc.Password}}
	e.cfg = map[string]any{
		"host": pc.Host, "port": int(pc.Port), "database": pc.Database, "username": pc.User, "password": pc.Password,
		"ssl_mode": map[string]any{"mode": "disable"},
		"replication_method": map[string]any{
			"method": "CDC", "replication_slot": db.Slot, "publication": db.Publication,
		},
		"state_interval_seconds": 1,
		// The tests' slots are made by the first read, unless a test makes them itself.
		"create_replication_slot": true,
	}
	return e
}

// readOnlyRole switches the config to a role set up as Airbyte's guide sets it up for CDC and
// nothing more: LOGIN, REPLICATION, SELECT on the given tables, transactions read-only by
// default, no CREATE anywhere; a DBA (the test's superuser) created the publication and the
// slot, so the connector is told not to create one.
func (e *env) readOnlyRole(tables ...string) string {
	e.t.Helper()
	role := "ab_" + e.db.Name[2:]
	const password = "ro-secret-5c4b3a"
	e.db.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'`, role, password))
	e.t.Cleanup(func() {
		e.db.Exec(`DROP OWNED BY ` + role)
		e.db.Exec(`DROP ROLE ` + role)
	})
	for _, t := range tables {
		e.db.Exec(fmt.Sprintf(`GRANT SELECT ON %s TO %s`, t, role))
	}
	e.db.Exec(fmt.Sprintf(`ALTER ROLE %s SET default_transaction_read_only = on`, role))
	e.db.Exec(`REVOKE CREATE ON SCHEMA public FROM PUBLIC`)
	e.db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, e.db.Slot)
	e.cfg["username"], e.cfg["password"] = role, password
	e.cfg["create_replication_slot"] = false
	e.secrets = append(e.secrets, password)
	return role
}

// queryRole switches the config to a role set up as Airbyte's guide sets it up for the Standard
// and Xmin methods, and to that method: LOGIN, SELECT on the given tables, transactions
// read-only by default, no REPLICATION, no CREATE anywhere; no slot, no publication.
func (e *env) queryRole(method string, tables ...string) string {
	e.t.Helper()
	role := "abq_" + e.db.Name[2:]
	const password = "ro-secret-7d6e5f"
	e.db.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN NOREPLICATION PASSWORD '%s'`, role, password))
	e.t.Cleanup(func() {
		e.db.Exec(`DROP OWNED BY ` + role)
		e.db.Exec(`DROP ROLE ` + role)
	})
	for _, t := range tables {
		e.db.Exec(fmt.Sprintf(`GRANT SELECT ON %s TO %s`, t, role))
	}
	e.db.Exec(fmt.Sprintf(`ALTER ROLE %s SET default_transaction_read_only = on`, role))
	e.db.Exec(`REVOKE CREATE ON SCHEMA public FROM PUBLIC`)
	e.cfg["username"], e.cfg["password"] = role, password
	e.cfg["replication_method"] = map[string]any{"method": method}
	delete(e.cfg, "create_replication_slot")
	e.secrets = append(e.secrets, password)
	return role
}

// cdc returns the replication_method object of the config, to change.
func (e *env) cdc() map[string]any { return e.cfg["replication_method"].(map[string]any) }

// file writes v (JSON, or bytes as they are) to a file of the test and returns its path.
func (e *env) file(name string, v any) string {
	e.t.Helper()
	b, ok := v.([]byte)
	if !ok {
		var err error
		b, err = json.Marshal(v)
		require.NoError(e.t, err)
	}
	path := filepath.Join(e.dir, name)
	require.NoError(e.t, os.WriteFile(path, b, 0o644))
	return path
}

func (e *env) config() string { return e.file("config.json", e.cfg) }

// catalog configures every discovered stream of the given tables (schema.table), incremental
// when it can be.
func (e *env) catalog(tables ...string) string {
	e.t.Helper()
	return e.cursorCatalog(nil, tables...)
}

// cursorCatalog is catalog with the cursor fields of the Standard method: a stream whose table
// (schema.table) has a cursor in cursors is incremental by it, the others full refresh.
func (e *env) cursorCatalog(cursors map[string]string, tables ...string) string {
	e.t.Helper()
	r := e.run("discover", "--config", e.config())
	require.Equal(e.t, 0, r.code, r.stderr)
	cats := r.ofType("CATALOG")
	require.Len(e.t, cats, 1)
	var streams []any
	for _, s := range cats[0].get("catalog", "streams").([]any) {
		st := s.(map[string]any)
		name := st["namespace"].(string) + "." + st["name"].(string)
		if len(tables) > 0 && !slices.Contains(tables, name) {
			continue
		}
		mode, dest := "full_refresh", "overwrite"
		cursor, chosen := cursors[name]
		if slices.Contains(st["supported_sync_modes"].([]any), any("incremental")) && (cursors == nil || chosen) {
			mode, dest = "incremental", "append_dedup"
		}
		cs := map[string]any{"stream": st, "sync_mode": mode, "destination_sync_mode": dest}
		if chosen {
			cs["cursor_field"] = []string{cursor}
		}
		if pk, ok := st["source_defined_primary_key"]; ok {
			cs["primary_key"] = pk
		}
		streams = append(streams, cs)
	}
	require.Len(e.t, streams, max(len(tables), len(streams)), "streams of %v", tables)
	c := map[string]any{"streams": streams}
	b, _ := json.Marshal(c)
	validate(e.t, "ConfiguredAirbyteCatalog", b)
	return e.file("catalog.json", c)
}

// configErrorOf checks that r failed with exactly one ERROR trace, a config_error, and returns
// its message.
func configErrorOf(t *testing.T, r *result) string {
	t.Helper()
	require.NotEqual(t, 0, r.code)
	errs := r.traces("ERROR")
	require.Len(t, errs, 1)
	require.Equal(t, "config_error", errs[0].str("trace", "error", "failure_type"))
	return errs[0].str("trace", "error", "message")
}

// stopsUntilReset runs a read from state that must stop with a config error whose message has
// each of wants, and returns the state it leaves (the same position: the stop holds it).
func (e *env) stopsUntilReset(t *testing.T, cat string, state []byte, wants ...string) []byte {
	t.Helper()
	failed := e.run("read", "--config", e.config(), "--catalog", cat, "--state", e.file("state.json", state))
	msg := configErrorOf(t, failed)
	for _, w := range wants {
		require.Contains(t, msg, w)
	}
	for _, st := range failed.states() {
		state = mustJSON(t, []any{st.m["state"]})
	}
	return state
}

// run runs the connector and checks its output; see start.
func (e *env) run(args ...string) *result {
	e.t.Helper()
	p := e.start(args...)
	return p.wait()
}

// proc is a running connector.
type proc struct {
	e      *env
	cmd    *exec.Cmd
	mu     sync.Mutex
	msgs   []msg
	stdout bytes.Buffer
	stderr bytes.Buffer
	done   chan struct{}
	res    *result
}

// start starts the connector with args, reading its output as it comes.
func (e *env) start(args ...string) *proc {
	e.t.Helper()
	return e.startCmd(exec.Command(binPath, args...))
}

func (e *env) startCmd(cmd *exec.Cmd) *proc {
	e.t.Helper()
	p := &proc{e: e, cmd: cmd, done: make(chan struct{})}
	if cmd.Env == nil {
		cmd.Env = append(os.Environ(), "LOG_LEVEL=debug")
	}
	cmd.Stderr = &lockedWriter{mu: &p.mu, w: &p.stderr}
	out, err := cmd.StdoutPipe()
	require.NoError(e.t, err)
	require.NoError(e.t, cmd.Start())
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			line := bytes.Clone(sc.Bytes())
			m := msg{raw: line, at: time.Now()}
			dec := json.NewDecoder(bytes.NewReader(line))
			dec.UseNumber()
			if err := dec.Decode(&m.m); err == nil {
				m.Type, _ = m.m["type"].(string)
			}
			p.mu.Lock()
			p.stdout.Write(line)
			p.stdout.WriteByte('\n')
			p.msgs = append(p.msgs, m)
			p.mu.Unlock()
		}
	}()
	return p
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// snapshot returns the messages read so far.
func (p *proc) snapshot() []msg {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.msgs)
}

func (p *proc) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

// wait waits for the connector to exit (at most three minutes) and checks its output: every
// stdout line is one protocol message that validates against the protocol's schema, every
// STATE counts exactly the records since the one before, and no secret appears anywhere.
func (p *proc) wait() *result {
	t := p.e.t
	t.Helper()
	exited := make(chan error, 1)
	go func() {
		<-p.done
		exited <- p.cmd.Wait()
	}()
	var err error
	select {
	case err = <-exited:
	case <-time.After(3 * time.Minute):
		_ = p.cmd.Process.Kill()
		<-exited
		t.Fatalf("the connector did not end within 3 minutes; stderr:\n%s", tail(p.stderr.String()))
	}
	r := &result{code: p.cmd.ProcessState.ExitCode(), msgs: p.snapshot(), stdout: p.stdout.String(), stderr: p.stderr.String()}
	if r.code < 0 {
		// Killed by a signal.
		r.code = 128 + int(p.cmd.ProcessState.Sys().(syscall.WaitStatus).Signal())
	}
	_ = err
	p.e.check(r)
	p.res = r
	return r
}

// check applies the checks every run must pass.
func (e *env) check(r *result) {
	t := e.t
	t.Helper()
	for i, m := range r.msgs {
		if m.Type == "" {
			// A killed run may leave its last line cut; nothing else may be anything but a message.
			require.True(t, i == len(r.msgs)-1 && r.code >= 128, "stdout line %d is not a protocol message: %q", i, m.raw)
			continue
		}
		validate(t, "AirbyteMessage", m.raw)
	}
	n := 0
	for _, m := range r.msgs {
		switch m.Type {
		case "RECORD":
			n++
		case "STATE":
			count, ok := m.get("state", "sourceStats", "recordCount").(json.Number)
			require.True(t, ok, "STATE without sourceStats.recordCount: %s", m.raw)
			f, _ := count.Float64()
			require.Equal(t, float64(n), f, "recordCount of a STATE: %s", m.raw)
			require.Contains(t, string(m.raw), fmt.Sprintf(`"recordCount":%d.0`, n), "recordCount is written with a decimal point")
			n = 0
		}
	}
	for _, s := range e.secrets {
		require.NotContains(t, r.stdout, s, "a secret on stdout")
		require.NotContains(t, r.stderr, s, "a secret on stderr")
	}
}

func tail(s string) string {
	if len(s) > 4000 {
		return "..." + s[len(s)-4000:]
	}
	return s
}

// read runs a read of catalog with state (nil: none) and requires it to succeed.
func (e *env) read(catalog string, state []byte) *result {
	e.t.Helper()
	r := e.tryRead(catalog, state)
	require.Equal(e.t, 0, r.code, "read failed:\n%s", tail(r.stderr))
	return r
}

// tryRead runs a read of catalog with state (nil: none), whatever its outcome.
func (e *env) tryRead(catalog string, state []byte) *result {
	e.t.Helper()
	args := []string{"read", "--config", e.config(), "--catalog", catalog}
	if state != nil {
		args = append(args, "--state", e.file("state.json", state))
	}
	return e.run(args...)
}

// destination applies records as an Airbyte dedup destination does: per stream and primary key,
// the record with the highest _ab_cdc_lsn wins (a later one on a tie); a winner with
// _ab_cdc_deleted_at set is a deleted row. Rows are keyed as e2e.SourceRowsJSON keys them, and
// values kept as the JSON text the connector wrote.
type destination struct {
	keys map[string][]string                              // primary key columns by stream (schema.table)
	rows map[string]map[string]map[string]json.RawMessage // stream → key → record data
	lsns map[string]map[string]uint64                     // stream → key → winning _ab_cdc_lsn
}

func newDestination(keys map[string][]string) *destination {
	return &destination{keys: keys, rows: map[string]map[string]map[string]json.RawMessage{}, lsns: map[string]map[string]uint64{}}
}

// recordOf decodes a RECORD keeping its values' JSON text.
func recordOf(t testing.TB, m msg) (stream string, data map[string]json.RawMessage) {
	t.Helper()
	var r struct {
		Record struct {
			Namespace string                     `json:"namespace"`
			Stream    string                     `json:"stream"`
			Data      map[string]json.RawMessage `json:"data"`
		} `json:"record"`
	}
	require.NoError(t, json.Unmarshal(m.raw, &r))
	return r.Record.Namespace + "." + r.Record.Stream, r.Record.Data
}

// lsnOf is a record's _ab_cdc_lsn (0 when it has none).
func lsnOf(t testing.TB, data map[string]json.RawMessage) uint64 {
	raw, ok := data[colLSN]
	if !ok || string(raw) == "null" {
		return 0
	}
	var n uint64
	require.NoError(t, json.Unmarshal(raw, &n), "_ab_cdc_lsn %s", raw)
	return n
}

func (d *destination) apply(t testing.TB, recs []msg) {
	t.Helper()
	for _, r := range recs {
		stream, data := recordOf(t, r)
		var kv []string
		for _, k := range d.keys[stream] {
			v, ok := data[k]
			require.True(t, ok && string(v) != "null", "record of %s without key column %s: %s", stream, k, r.raw)
			kv = append(kv, string(v))
		}
		key := strings.Join(kv, e2e.KeySep)
		if d.rows[stream] == nil {
			d.rows[stream], d.lsns[stream] = map[string]map[string]json.RawMessage{}, map[string]uint64{}
		}
		lsn := lsnOf(t, data)
		if old, ok := d.lsns[stream][key]; ok && old > lsn {
			continue
		}
		d.rows[stream][key], d.lsns[stream][key] = data, lsn
	}
}

// table returns the live rows of a stream as e2e.SourceRowsJSON returns the source's.
func (d *destination) table(stream string) map[string]map[string]*string {
	out := map[string]map[string]*string{}
	for k, data := range d.rows[stream] {
		if v, ok := data[colDeletedAt]; ok && string(v) != "null" {
			continue
		}
		row := map[string]*string{}
		for c, v := range data {
			if strings.HasPrefix(c, "_ab_cdc_") {
				continue
			}
			s := string(v)
			row[c] = &s
		}
		out[k] = row
	}
	return out
}

// equalsSource requires the destination's stream to equal the source table.
func (d *destination) equalsSource(t testing.TB, e *env, stream string) {
	t.Helper()
	schema, table, _ := strings.Cut(stream, ".")
	profile := pgjson.Airbyte
	if e.cfg["value_forms"] == "exact" {
		profile = pgjson.Exact
	}
	src, err := e2e.SourceRowsJSON(context.Background(), e.db.DSN, schema, table, d.keys[stream], profile)
	require.NoError(t, err)
	require.Empty(t, e2e.Diff(d.table(stream), src), "destination %s differs from the source", stream)
}

// replayEqualsSource applies the records of the reads, in order, to a destination that
// deduplicates stream on key, and requires the result to equal the source table.
func replayEqualsSource(t testing.TB, e *env, stream, key string, reads ...*result) {
	t.Helper()
	d := newDestination(map[string][]string{stream: {key}})
	for _, r := range reads {
		d.apply(t, r.records())
	}
	d.equalsSource(t, e, stream)
}

func parseDSN(t testing.TB, dsn string) *pgx.ConnConfig {
	t.Helper()
	c, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	return c
}
