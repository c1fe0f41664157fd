package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// The Standard and Xmin replication methods: a role with SELECT only, reads with kills against a
// live workload, and what each method promises (inserts and updates; deletes are CDC's).

// platform keeps the states of a connection as the platform does: the last GLOBAL state, or the
// last STREAM state of each stream.
type platform struct {
	global  any
	streams map[string]any
	order   []string
}

func newPlatform() *platform { return &platform{streams: map[string]any{}} }

// take keeps the states of r (all it got, even from a killed read).
func (p *platform) take(t testing.TB, r *result) {
	t.Helper()
	for _, m := range r.states() {
		st := m.m["state"]
		switch m.str("state", "type") {
		case "GLOBAL":
			p.global = st
		case "STREAM":
			d := m.get("state", "stream", "stream_descriptor").(map[string]any)
			k := fmt.Sprint(d["namespace"]) + "." + fmt.Sprint(d["name"])
			if _, ok := p.streams[k]; !ok {
				p.order = append(p.order, k)
			}
			p.streams[k] = st
		default:
			t.Fatalf("a state of type %q: %s", m.str("state", "type"), m.raw)
		}
	}
}

// state is what the platform passes to the next read (nil: none).
func (p *platform) state() []byte {
	var all []any
	if p.global != nil {
		all = append(all, p.global)
	}
	for _, k := range p.order {
		all = append(all, p.streams[k])
	}
	if all == nil {
		return nil
	}
	b, _ := json.Marshal(all)
	return b
}

// streamState is the stream_state of the platform's state of stream (schema.table).
func (p *platform) streamState(stream string) map[string]any {
	st, _ := p.streams[stream].(map[string]any)
	if st == nil {
		return nil
	}
	s, _ := st["stream"].(map[string]any)["stream_state"].(map[string]any)
	return s
}

// readWith runs a read with the platform's state, requires it to succeed, and keeps its states.
func (e *env) readWith(p *platform, catalog string) *result {
	e.t.Helper()
	r := e.read(catalog, p.state())
	p.take(e.t, r)
	return r
}

// upToDate requires every row of the source table to be in the destination with its values:
// rows the source deleted (or moved to another key) may stay there, as these methods promise.
func upToDate(t testing.TB, e *env, d *destination, stream string) {
	t.Helper()
	schema, table, _ := strings.Cut(stream, ".")
	src, err := e2e.SourceRowsJSON(context.Background(), e.db.DSN, schema, table, d.keys[stream])
	require.NoError(t, err)
	dst := d.table(stream)
	kept := map[string]map[string]*string{}
	for k := range src {
		kept[k] = dst[k]
	}
	require.Empty(t, e2e.Diff(kept, src), "destination %s is behind the source", stream)
	t.Logf("%s: %d rows, %d more in the destination (deleted or moved in the source)", stream, len(src), len(dst)-len(src))
}

// queryWorkload writes to tables (id int, v text, tick bigint: a primary key, or, for keyless,
// ids the workload keeps unique) until stop is closed, in transactions of one to three
// statements, one after the other on one connection: inserts, updates, deletes and key changes,
// each setting tick to nextval('ticks') / 4, so that ticks grow in commit order and four rows
// share each.
func queryWorkload(t *testing.T, e *env, tables []string, keyless string, ids int) (stop, done chan struct{}, committed *atomic.Int64) {
	stop, done, committed = make(chan struct{}), make(chan struct{}), new(atomic.Int64)
	go func() {
		defer close(done)
		ctx := context.Background()
		conn := e.db.Connect()
		defer conn.Close(ctx)
		rng := rand.New(rand.NewPCG(3, 4))
		const tick = `nextval('ticks') / 4`
		for {
			select {
			case <-stop:
				return
			default:
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				return
			}
			for n := rng.IntN(3) + 1; n > 0; n-- {
				id := rng.IntN(ids) + 1
				if rng.IntN(len(tables)+1) == 0 {
					if rng.IntN(3) == 0 {
						_, err = tx.Exec(ctx, `INSERT INTO `+keyless+` SELECT nextval('ledger_ids'), 'i', `+tick)
					} else {
						_, err = tx.Exec(ctx, `UPDATE `+keyless+` SET v = v || 'u', tick = `+tick+` WHERE id = $1`, id)
					}
				} else {
					table := tables[rng.IntN(len(tables))]
					switch rng.IntN(6) {
					case 0, 1:
						_, err = tx.Exec(ctx, `UPDATE `+table+` SET v = v || 'u', tick = `+tick+` WHERE id = $1`, id)
					case 2:
						_, err = tx.Exec(ctx, `DELETE FROM `+table+` WHERE id = $1`, id)
					case 3:
						_, err = tx.Exec(ctx, `UPDATE `+table+` SET id = $2, tick = `+tick+` WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM `+table+` WHERE id = $2)`, id, rng.IntN(ids)+1)
					default:
						_, err = tx.Exec(ctx, `INSERT INTO `+table+` (id, v, tick) VALUES ($1, 'i', `+tick+`) ON CONFLICT (id) DO UPDATE SET v = excluded.v || 'r', tick = excluded.tick`, id)
					}
				}
				if err != nil {
					break
				}
			}
			if err != nil {
				_ = tx.Rollback(ctx)
				continue
			}
			if err := tx.Commit(ctx); err != nil {
				return
			}
			committed.Add(1)
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
	}()
	return stop, done, committed
}

// TestSyncRoundsStandard and TestSyncRoundsXmin: reads one after the other during a live
// workload, each from the states the platform kept, as a role with SELECT only (no REPLICATION,
// read-only transactions, no slot or publication anywhere). The first read is killed with
// SIGKILL mid-table and its retry resumes after the last chunk the platform saw; a later read is
// killed at a random moment. Once the workload stops, every row of the source is in the
// destination with its values (deleted rows may stay: these methods do not see deletes).
func TestSyncRoundsStandard(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	syncRoundsQueries(t, "Standard")
}

func TestSyncRoundsXmin(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	syncRoundsQueries(t, "Xmin")
}

func syncRoundsQueries(t *testing.T, method string) {
	e := newEnv(t)
	e.db.Exec(`CREATE SEQUENCE ticks`)
	e.db.Exec(`CREATE SEQUENCE ledger_ids START 20001`)
	keyed := []string{"orders", "events"}
	for _, tb := range keyed {
		e.db.Exec(`CREATE TABLE ` + tb + ` (id int PRIMARY KEY, v text, tick bigint NOT NULL)`)
		e.db.Exec(`INSERT INTO ` + tb + ` SELECT g, 'v' || g, nextval('ticks') / 4 FROM generate_series(1, 20000) g`)
	}
	// A table without a primary key (its ids are unique all the same, for the oracle).
	e.db.Exec(`CREATE TABLE ledger (id int NOT NULL, v text, tick bigint NOT NULL)`)
	e.db.Exec(`INSERT INTO ledger SELECT g, 'v' || g, nextval('ticks') / 4 FROM generate_series(1, 20000) g`)
	e.queryRole(method, "orders", "events", "ledger")
	e.cfg["backfill_chunk_size"] = 500
	status, msg := e.checkStatus()
	require.Equal(t, "SUCCEEDED", status, msg)
	streams := []string{"public.orders", "public.events", "public.ledger"}
	var cat string
	if method == "Standard" {
		cat = e.cursorCatalog(map[string]string{"public.orders": "tick", "public.events": "tick", "public.ledger": "tick"})
	} else {
		cat = e.catalog()
	}
	d := newDestination(map[string][]string{"public.orders": {"id"}, "public.events": {"id"}, "public.ledger": {"id"}})
	p := newPlatform()
	stop, done, committed := queryWorkload(t, e, []string{"orders", "events"}, "ledger", 25000)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			<-done
		}
	}()
	args := func() []string {
		a := []string{"read", "--config", e.config(), "--catalog", cat}
		if s := p.state(); s != nil {
			a = append(a, "--state", e.file("state.json", s))
		}
		return a
	}

	// Round 0: killed once orders' load has a chunk out and more to read.
	proc := e.start(args()...)
	e2e.WaitFor(t, 2*time.Minute, "a chunk of orders' load", func() bool {
		for _, m := range proc.snapshot() {
			if m.Type == "STATE" && m.str("state", "stream", "stream_descriptor", "name") == "orders" {
				if load, _ := m.get("state", "stream", "stream_state", "load").(map[string]any); load != nil && load["done"] == false {
					return true
				}
			}
		}
		return false
	})
	proc.signal(syscall.SIGKILL)
	r := proc.wait()
	d.apply(t, r.records())
	p.take(t, r)
	load := p.streamState("public.orders")["load"].(map[string]any)
	resumeAfter, _ := strconv.Atoi(load["cursor"].([]any)[0].(string))
	t.Logf("round 0 killed after %d records; orders' load at id %d", len(r.records()), resumeAfter)

	// Round 1: the load resumes where the platform's state says.
	r = e.readWith(p, cat)
	d.apply(t, r.records())
	first := -1
	for _, m := range r.records() {
		if s, data := recordOf(t, m); s == "public.orders" {
			first, _ = strconv.Atoi(string(data["id"]))
			break
		}
	}
	require.Greater(t, first, resumeAfter, "the retry resumed orders' load after the last chunk the platform saw")
	before := committed.Load()

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 9))
	killed := rng.IntN(2) + 2
	t.Logf("seed %d: round %d is killed", seed, killed)
	for round := 2; round < 5; round++ {
		time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond)
		if round == killed {
			proc := e.start(args()...)
			time.Sleep(time.Duration(50+rng.IntN(800)) * time.Millisecond)
			proc.signal(syscall.SIGKILL)
			r := proc.wait()
			d.apply(t, r.records())
			p.take(t, r)
			t.Logf("round %d: killed after %d records, %d states", round, len(r.records()), len(r.states()))
			continue
		}
		r := e.readWith(p, cat)
		d.apply(t, r.records())
		t.Logf("round %d: %d records", round, len(r.records()))
	}
	close(stop)
	<-done
	require.Greater(t, committed.Load(), before+100, "the workload committed during the rounds")
	// Two reads after the last write: the first finishes a load a kill left, the second is
	// incremental.
	for range 2 {
		r := e.readWith(p, cat)
		d.apply(t, r.records())
		for _, m := range r.records() {
			_, data := recordOf(t, m)
			for k := range data {
				require.False(t, strings.HasPrefix(k, "_ab_cdc_"), "no CDC column in a %s record", method)
			}
		}
	}
	for _, s := range streams {
		upToDate(t, e, d, s)
		st := p.streamState(s)
		want := map[string]string{"Standard": stateCursor, "Xmin": stateXmin}[method]
		require.Equal(t, want, st["state_type"], "%s's state is Airbyte's %s form", s, want)
	}
	var slots int
	require.NoError(t, e.db.Conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`).Scan(&slots))
	require.Zero(t, slots, "no replication slot")
}

// TestQueryMethodsCheckAndDiscover: with Standard or Xmin, check needs no slot, publication or
// REPLICATION, only SELECT; it fails, with the GRANT to run, when the role can read nothing.
// Discover offers incremental syncs as Airbyte's connector does: by a cursor the user chooses
// (Standard, any relation), by the source-defined xmin (Xmin, relations with rows of their own).
func TestQueryMethodsCheckAndDiscover(t *testing.T) {
	for _, method := range []string{"Standard", "Xmin"} {
		t.Run(method, func(t *testing.T) {
			e := newEnv(t)
			e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text, updated_at timestamptz NOT NULL DEFAULT now())`)
			e.db.Exec(`CREATE TABLE nokey (v text)`)
			e.db.Exec(`CREATE VIEW tv AS SELECT * FROM t`)
			e.db.Exec(`CREATE MATERIALIZED VIEW mv AS SELECT * FROM t`)
			e.db.Exec(`CREATE TABLE hidden (id int PRIMARY KEY)`)
			role := e.queryRole(method)
			status, msg := e.checkStatus()
			require.Equal(t, "FAILED", status)
			require.Contains(t, msg, "GRANT SELECT ON ALL TABLES IN SCHEMA")
			require.Contains(t, msg, role)
			for _, tb := range []string{"t", "nokey", "tv", "mv"} {
				e.db.Exec(`GRANT SELECT ON ` + tb + ` TO ` + role)
			}
			status, msg = e.checkStatus()
			require.Equal(t, "SUCCEEDED", status, msg)

			r := e.run("discover", "--config", e.config())
			require.Equal(t, 0, r.code, r.stderr)
			got := map[string]map[string]any{}
			for _, s := range r.ofType("CATALOG")[0].get("catalog", "streams").([]any) {
				st := s.(map[string]any)
				got[st["name"].(string)] = st
				for prop := range st["json_schema"].(map[string]any)["properties"].(map[string]any) {
					require.False(t, strings.HasPrefix(prop, "_ab_cdc_"), "no CDC column without CDC")
				}
				_, def := st["default_cursor_field"]
				require.False(t, def, "no default cursor field (as Airbyte's connector)")
			}
			require.NotContains(t, got, "hidden", "a table the role cannot read is not listed")
			incremental := func(name string) bool {
				return slices.Contains(got[name]["supported_sync_modes"].([]any), any("incremental"))
			}
			sourceCursor := func(name string) bool { b, _ := got[name]["source_defined_cursor"].(bool); return b }
			if method == "Standard" {
				for _, n := range []string{"t", "nokey", "tv", "mv"} {
					require.True(t, incremental(n), "%s: incremental by a chosen cursor", n)
					require.False(t, sourceCursor(n), "%s: the user chooses the cursor", n)
				}
			} else {
				for _, n := range []string{"t", "nokey", "mv"} {
					require.True(t, incremental(n), "%s: incremental by xmin", n)
					require.True(t, sourceCursor(n), "%s: xmin is the source-defined cursor", n)
				}
				require.False(t, incremental("tv"), "a view has no xmin")
			}
			require.Equal(t, []any{[]any{"id"}}, got["t"]["source_defined_primary_key"])
		})
	}
}

// TestStandardCursorStates: a Standard stream's state is Airbyte's cursor_based form, with the
// cursor's value and how many rows had it; the rows that tie with it are read again (Airbyte's
// duplicates at the boundary: a count cannot tell that none arrived),
// rows past it are read, rows below it are not (Standard's limit: a cursor must grow with every
// write). States of Airbyte's connector (Java, Kotlin and legacy forms) carry on. A cursor that
// cannot be read incrementally is a config error before any record.
func TestStandardCursorStates(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY, c int NOT NULL, v text, j json)`)
	e.db.Exec(`INSERT INTO t SELECT g, (g - 1) / 10 + 1, 'v', '{}' FROM generate_series(1, 100) g`)
	e.db.Exec(`CREATE VIEW tv AS SELECT id, c, v FROM t`)
	e.queryRole("Standard", "t", "tv")
	cat := e.cursorCatalog(map[string]string{"public.t": "c", "public.tv": "c"})
	counts := func(r *result) map[string]int {
		out := map[string]int{}
		for _, m := range r.records() {
			s, _ := recordOf(t, m)
			out[s]++
		}
		return out
	}
	p := newPlatform()
	r := e.readWith(p, cat)
	require.Equal(t, map[string]int{"public.t": 100, "public.tv": 100}, counts(r))
	for _, s := range []string{"public.t", "public.tv"} {
		st := p.streamState(s)
		require.Equal(t, "cursor_based", st["state_type"], s)
		require.Equal(t, []any{"c"}, st["cursor_field"], s)
		require.Equal(t, "10", st["cursor"], s)
		require.EqualValues(t, json.Number("10"), st["cursor_record_count"], s)
	}

	e.db.Exec(`INSERT INTO t VALUES (101, 10, 'tie', '{}')`)
	r = e.readWith(p, cat)
	require.Equal(t, map[string]int{"public.t": 11, "public.tv": 11}, counts(r), "a row tying with the cursor: the ties are read again")
	require.Equal(t, map[string]int{"public.t": 11, "public.tv": 11}, counts(e.readWith(p, cat)), "nothing new: the ties at the cursor again, only")
	e.db.Exec(`INSERT INTO t VALUES (102, 9, 'below', '{}')`)
	require.Equal(t, map[string]int{"public.t": 11, "public.tv": 11}, counts(e.readWith(p, cat)), "a row below the cursor is not read (Standard's limit)")
	e.db.Exec(`INSERT INTO t VALUES (103, 11, 'past', '{}')`)
	require.Equal(t, map[string]int{"public.t": 12, "public.tv": 12}, counts(e.readWith(p, cat)), "the row past it, and the ties")

	// States of Airbyte's connector.
	stream := func(st map[string]any) []byte {
		b, _ := json.Marshal([]any{map[string]any{"type": "STREAM", "stream": map[string]any{
			"stream_descriptor": map[string]any{"name": "t", "namespace": "public"}, "stream_state": st}}})
		return b
	}
	only := e.cursorCatalog(map[string]string{"public.t": "c"}, "public.t")
	for name, tc := range map[string]struct {
		state []byte
		want  int
	}{
		"java":             {stream(map[string]any{"version": 2, "state_type": "cursor_based", "stream_name": "t", "stream_namespace": "public", "cursor_field": []any{"c"}, "cursor": "10", "cursor_record_count": 11}), 12},
		"java, ties miss":  {stream(map[string]any{"version": 2, "state_type": "cursor_based", "stream_name": "t", "stream_namespace": "public", "cursor_field": []any{"c"}, "cursor": "10", "cursor_record_count": 5}), 12},
		"kotlin, no count": {stream(map[string]any{"version": 2, "state_type": "cursor_based", "cursors": map[string]any{"c": 10}}), 12},
		"legacy": {func() []byte {
			b, _ := json.Marshal(map[string]any{"cdc": false, "streams": []any{map[string]any{"stream_name": "t", "stream_namespace": "public", "cursor_field": []any{"c"}, "cursor": "10", "cursor_record_count": 11}}})
			return b
		}(), 12},
		"another cursor": {stream(map[string]any{"version": 2, "state_type": "cursor_based", "cursor_field": []any{"id"}, "cursor": "50", "cursor_record_count": 1}), 103},
		"airbyte's load": {stream(map[string]any{"version": 2, "state_type": "ctid", "ctid": "(0,5)", "relation_filenode": 1234}), 103},
	} {
		r := e.read(only, tc.state)
		require.Len(t, r.records(), tc.want, name)
	}

	// One row leaves the state's cursor value and another arrives at it: the count at the value
	// is the state's again, and the arrival must still be read.
	require.Equal(t, "11", p.streamState("public.t")["cursor"])
	e.db.Exec(`INSERT INTO t VALUES (104, 11, 'tie 2', '{}')`)
	e.readWith(p, cat)
	e.db.Exec(`UPDATE t SET c = 5 WHERE id = 103; INSERT INTO t VALUES (105, 11, 'arrives', '{}')`)
	got := map[string]bool{}
	for _, m := range e.readWith(p, cat).records() {
		_, data := recordOf(t, m)
		got[string(data["id"])] = true
	}
	require.True(t, got["105"], "the row that arrived at the saved cursor value is read")

	// Cursors that cannot be read incrementally.
	bad := func(cat string, words ...string) {
		t.Helper()
		r := e.run("read", "--config", e.config(), "--catalog", cat)
		require.NotEqual(t, 0, r.code)
		require.Empty(t, r.records())
		errs := r.traces("ERROR")
		require.Len(t, errs, 1, r.stdout)
		require.Equal(t, "config_error", errs[0].str("trace", "error", "failure_type"))
		for _, w := range words {
			require.Contains(t, errs[0].str("trace", "error", "message"), w)
		}
	}
	noCursor := e.cursorCatalog(map[string]string{"public.t": "c"}, "public.t")
	var c map[string]any
	require.NoError(t, json.Unmarshal([]byte(readFile(t, noCursor)), &c))
	delete(c["streams"].([]any)[0].(map[string]any), "cursor_field")
	bad(e.file("nocursor.json", c), "cursor")
	bad(e.cursorCatalog(map[string]string{"public.t": "j"}, "public.t"), `"j"`, "ordering")
	bad(e.cursorCatalog(map[string]string{"public.t": "nope"}, "public.t"), `"nope"`)
	e.db.Exec(`ALTER TABLE t ALTER c DROP NOT NULL`)
	e.db.Exec(`INSERT INTO t VALUES (110, NULL, 'null cursor', '{}')`)
	bad(e.cursorCatalog(map[string]string{"public.t": "c"}, "public.t"), "NULL", `"c"`)
}

// TestXminStates: an Xmin stream's state is Airbyte's xmin form; a read returns the rows written
// since (in tables, partitioned tables, tables without a key, materialized views), Airbyte's own
// state carries on, a state ahead of the server reads every row again, and a view is refused.
func TestXminStates(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text)`)
	e.db.Exec(`INSERT INTO t SELECT g, 'v' FROM generate_series(1, 100) g`)
	e.db.Exec(`CREATE TABLE parts (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)`)
	e.db.Exec(`CREATE TABLE parts_1 PARTITION OF parts FOR VALUES FROM (0) TO (50)`)
	e.db.Exec(`CREATE TABLE parts_2 PARTITION OF parts FOR VALUES FROM (50) TO (1000)`)
	e.db.Exec(`INSERT INTO parts SELECT g, 'v' FROM generate_series(1, 100) g`)
	e.db.Exec(`CREATE TABLE nokey (id int, v text)`)
	e.db.Exec(`INSERT INTO nokey SELECT g, 'v' FROM generate_series(1, 100) g`)
	e.db.Exec(`CREATE MATERIALIZED VIEW mv AS SELECT id, v FROM t WHERE id <= 10`)
	e.db.Exec(`CREATE VIEW tv AS SELECT id, v FROM t`)
	e.queryRole("Xmin", "t", "parts", "nokey", "mv", "tv")
	cat := e.catalog("public.t", "public.parts", "public.nokey", "public.mv")
	counts := func(r *result) map[string]int {
		out := map[string]int{}
		for _, m := range r.records() {
			s, _ := recordOf(t, m)
			out[s]++
		}
		return out
	}
	p := newPlatform()
	r := e.readWith(p, cat)
	require.Equal(t, map[string]int{"public.t": 100, "public.parts": 100, "public.nokey": 100, "public.mv": 10}, counts(r))
	var next uint64
	require.NoError(t, e.db.Conn.QueryRow(context.Background(), `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&next))
	for _, s := range []string{"public.t", "public.parts", "public.nokey", "public.mv"} {
		st := p.streamState(s)
		require.Equal(t, "xmin", st["state_type"], s)
		raw, _ := strconv.ParseUint(string(st["xmin_raw_value"].(json.Number)), 10, 64)
		require.LessOrEqual(t, raw, next, s)
		require.Equal(t, json.Number(strconv.FormatUint(raw&0xFFFFFFFF, 10)), st["xmin_xid_value"], s)
		require.Equal(t, json.Number(strconv.FormatUint(raw>>32, 10)), st["num_wraparound"], s)
	}

	e.db.Exec(`UPDATE t SET v = 'changed' WHERE id = 5`)
	e.db.Exec(`INSERT INTO parts VALUES (500, 'new')`)
	e.db.Exec(`UPDATE parts SET v = 'changed' WHERE id = 7`)
	e.db.Exec(`UPDATE nokey SET v = 'changed' WHERE id = 9`)
	e.db.Exec(`DELETE FROM t WHERE id = 6`)
	e.db.Exec(`REFRESH MATERIALIZED VIEW mv`)
	r = e.readWith(p, cat)
	require.Equal(t, map[string]int{"public.t": 1, "public.parts": 2, "public.nokey": 1, "public.mv": 9}, counts(r), "the rows written since; a delete is not seen")
	require.Empty(t, counts(e.readWith(p, cat)), "nothing new")

	// Airbyte's own xmin state; one ahead of the server.
	only := e.catalog("public.t")
	state := func(x uint64) []byte {
		b, _ := json.Marshal([]any{map[string]any{"type": "STREAM", "stream": map[string]any{
			"stream_descriptor": map[string]any{"name": "t", "namespace": "public"},
			"stream_state":      map[string]any{"version": 2, "state_type": "xmin", "xmin_xid_value": x & 0xFFFFFFFF, "xmin_raw_value": x, "num_wraparound": x >> 32}}}})
		return b
	}
	require.NoError(t, e.db.Conn.QueryRow(context.Background(), `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&next))
	require.Empty(t, e.read(only, state(next)).records(), "Airbyte's state: nothing since")
	e.db.Exec(`UPDATE t SET v = 'again' WHERE id = 8`)
	require.Len(t, e.read(only, state(next)).records(), 1)
	ahead := e.read(only, state(next+1_000_000))
	require.Len(t, ahead.records(), 99, "a state ahead of the server: every row again")
	require.Contains(t, ahead.stderr, "ahead of the server")

	// A view has no xmin: refused before any record.
	forced := e.catalog("public.tv")
	var c map[string]any
	require.NoError(t, json.Unmarshal([]byte(readFile(t, forced)), &c))
	cs := c["streams"].([]any)[0].(map[string]any)
	cs["sync_mode"], cs["destination_sync_mode"] = "incremental", "append"
	fr := e.run("read", "--config", e.config(), "--catalog", e.file("forced.json", c))
	require.NotEqual(t, 0, fr.code)
	require.Empty(t, fr.records())
	require.Contains(t, fr.traces("ERROR")[0].str("trace", "error", "message"), "view")
}

// TestXminWraparound: on a server whose transaction ids cross 2^32 between two reads (the epoch
// goes from 0 to 1 and 32-bit xmins start again from 3), the second read returns exactly the
// rows written since the first, before and after the wraparound, and its state counts one
// wraparound, as Airbyte's connector writes it.
func TestXminWraparound(t *testing.T) {
	e2e.NeedsLocal(t, server, "needs a local server of its own, its transaction ids set with pg_resetwal")
	const start = 1<<32 - 3000
	srv, err := e2e.Start(t.Context(), e2e.Options{NextXID: start})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	e := newEnvOn(t, srv)
	pc := parseDSN(t, srv.DSN("postgres"))
	e.secrets = append(e.secrets, pc.Password)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text)`)
	e.db.Exec(`INSERT INTO t SELECT g, 'v' FROM generate_series(1, 300) g`)
	e.db.Exec(`CREATE TABLE nokey (id int, v text)`)
	e.db.Exec(`INSERT INTO nokey SELECT g, 'v' FROM generate_series(1, 300) g`)
	e.queryRole("Xmin", "t", "nokey")
	e.cfg["backfill_chunk_size"] = 50
	cat := e.catalog()
	d := newDestination(map[string][]string{"public.t": {"id"}, "public.nokey": {"id"}})
	p := newPlatform()
	r := e.readWith(p, cat)
	d.apply(t, r.records())
	require.Len(t, r.records(), 600)
	require.Equal(t, json.Number("0"), p.streamState("public.t")["num_wraparound"])

	// One transaction per update, past the wraparound.
	ctx := context.Background()
	conn := e.db.Connect()
	defer conn.Close(ctx)
	changed := map[string]map[int]bool{"public.t": {}, "public.nokey": {}}
	var wrapped bool
	for i := 0; !wrapped || i < 4000; i++ {
		table, id := "t", i%300+1
		if i%2 == 1 {
			table = "nokey"
		}
		_, err := conn.Exec(ctx, `UPDATE `+table+` SET v = v || 'w' WHERE id = $1`, id)
		require.NoError(t, err)
		changed["public."+table][id] = true
		if i%500 == 0 {
			var x uint64
			require.NoError(t, conn.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&x))
			wrapped = x > 1<<32+500
		}
	}
	r = e.readWith(p, cat)
	d.apply(t, r.records())
	got := map[string]int{}
	for _, m := range r.records() {
		s, _ := recordOf(t, m)
		got[s]++
	}
	require.Equal(t, map[string]int{"public.t": len(changed["public.t"]), "public.nokey": len(changed["public.nokey"])}, got, "exactly the rows written since the first read")
	d.equalsSource(t, e, "public.t")
	d.equalsSource(t, e, "public.nokey")
	for _, s := range []string{"public.t", "public.nokey"} {
		require.Equal(t, json.Number("1"), p.streamState(s)["num_wraparound"], s)
	}
	require.Empty(t, e.readWith(p, cat).records(), "nothing new")
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// TestStandardResumesMidScan: a relation without a primary key is loaded by its cursor, in one
// query, with states between cursor values; killed after one, the next read resumes at it (the
// rows that tie with the state's cursor again, then the rest).
func TestStandardResumesMidScan(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE nokey (id int NOT NULL, c int NOT NULL, v text)`)
	e.db.Exec(`INSERT INTO nokey SELECT g, g / 3, repeat('x', 200) FROM generate_series(1, 60000) g`)
	e.queryRole("Standard", "nokey")
	cat := e.cursorCatalog(map[string]string{"public.nokey": "c"})
	p := newPlatform()
	proc := e.start("read", "--config", e.config(), "--catalog", cat)
	// A state with a cursor value: the read may state the stream before its first row (no
	// cursor yet), and a kill right after that one resumes from the start (a CI run did).
	e2e.WaitFor(t, time.Minute, "a state within the scan", func() bool {
		return slices.ContainsFunc(proc.snapshot(), func(m msg) bool {
			return m.Type == "STATE" && m.get("state", "stream", "stream_state", "cursor") != nil
		})
	})
	proc.signal(syscall.SIGKILL)
	killed := proc.wait()
	p.take(t, killed)
	st := p.streamState("public.nokey")
	cursor, _ := strconv.Atoi(st["cursor"].(string))
	require.Less(t, cursor, 20000, "killed before the scan's end")
	resumed := e.readWith(p, cat)
	ids := map[string]bool{}
	for _, r := range [][]msg{killed.records(), resumed.records()} {
		for _, m := range r {
			_, data := recordOf(t, m)
			ids[string(data["id"])] = true
		}
	}
	require.Len(t, ids, 60000, "every row, across the two reads")
	_, data := recordOf(t, resumed.records()[0])
	c, _ := strconv.Atoi(string(data["c"]))
	require.Equal(t, cursor, c, "the resumed read starts at the state's cursor")
	want := 0 // the rows whose c (g / 3) is at the cursor or past it
	for g := 1; g <= 60000; g++ {
		if g/3 >= cursor {
			want++
		}
	}
	require.Equal(t, want, len(resumed.records()), "and reads each row from it once")
}

// TestQueryLoadAcrossSyncs: with a time budget shorter than a table's load, the load goes on
// over several reads, each resuming where the last one's state left it, and the destination
// ends equal to the source.
func TestQueryLoadAcrossSyncs(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE big (id int PRIMARY KEY, v text)`)
	e.db.Exec(`INSERT INTO big SELECT g, repeat('x', 100) FROM generate_series(1, 20000) g`)
	e.queryRole("Xmin", "big")
	// Chunks of one row: 20000 statements, each with its state, do not fit in a second.
	e.cfg["backfill_chunk_size"] = 1
	e.cfg["sync_time_budget_seconds"] = 1
	cat := e.catalog()
	d := newDestination(map[string][]string{"public.big": {"id"}})
	p := newPlatform()
	reads := 0
	for ; reads < 200; reads++ {
		r := e.readWith(p, cat)
		d.apply(t, r.records())
		if p.streamState("public.big")["state_type"] == "xmin" {
			break
		}
		require.Equal(t, "tidemark_load", p.streamState("public.big")["state_type"])
	}
	require.Greater(t, reads, 0, "the load took several reads")
	d.equalsSource(t, e, "public.big")
	t.Logf("loaded in %d reads", reads+1)
}

// TestXminResumesKeylessLoad: a table without a primary key is loaded by Xmin in chunks of its
// heap's pages (ctid ranges), with a state after each: killed mid-load, the next read resumes
// after the last chunk the platform saw instead of reading the table again. Rows updated
// meanwhile (moved to other pages) are read by the next read, whose state is the oldest
// transaction running when the load began. A table rewritten since (VACUUM FULL: rows on other
// pages) starts its load over, and nothing is missed.
func TestXminResumesKeylessLoad(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE nokey (id int NOT NULL, v text)`)
	e.db.Exec(`INSERT INTO nokey SELECT g, repeat('x', 200) FROM generate_series(1, 60000) g`)
	role := e.queryRole("Xmin", "nokey")
	e.cfg["backfill_chunk_size"] = 2000
	cat := e.catalog()
	p := newPlatform()
	proc := e.start("read", "--config", e.config(), "--catalog", cat)
	e2e.WaitFor(t, time.Minute, "a state within the load", func() bool {
		return slices.ContainsFunc(proc.snapshot(), func(m msg) bool { return m.Type == "STATE" })
	})
	proc.signal(syscall.SIGKILL)
	killed := proc.wait()
	p.take(t, killed)
	require.Equal(t, "tidemark_load", p.streamState("public.nokey")["state_type"], "killed within the load")
	require.Less(t, len(killed.records()), 60000)
	e.db.Exec(`UPDATE nokey SET v = 'moved' WHERE id % 1000 = 1`)

	d := newDestination(map[string][]string{"public.nokey": {"id"}})
	d.apply(t, killed.records())
	resumed := e.readWith(p, cat)
	d.apply(t, resumed.records())
	require.Less(t, len(killed.records())+len(resumed.records()), 60000+60+2000, "the resumed read went on from its state")
	require.Equal(t, "xmin", p.streamState("public.nokey")["state_type"])
	d.apply(t, e.readWith(p, cat).records())
	d.equalsSource(t, e, "public.nokey")

	// A load resumed after the table was rewritten starts over.
	e.db.Exec(`INSERT INTO nokey SELECT g, 'new' FROM generate_series(60001, 70000) g`)
	p2 := newPlatform()
	d2 := newDestination(map[string][]string{"public.nokey": {"id"}})
	proc = e.start("read", "--config", e.config(), "--catalog", cat)
	e2e.WaitFor(t, time.Minute, "a state within the load", func() bool {
		return slices.ContainsFunc(proc.snapshot(), func(m msg) bool { return m.Type == "STATE" })
	})
	proc.signal(syscall.SIGKILL)
	killed = proc.wait()
	p2.take(t, killed)
	require.Equal(t, "tidemark_load", p2.streamState("public.nokey")["state_type"], "killed within the load")
	d2.apply(t, killed.records())
	e.db.Exec(`DELETE FROM nokey WHERE id <= 30000`)
	e.db.Exec(`VACUUM FULL nokey`)
	d2.apply(t, e.readWith(p2, cat).records())
	require.Equal(t, "xmin", p2.streamState("public.nokey")["state_type"])
	src, err := e2e.SourceRows(context.Background(), e.db.DSN, "public", "nokey", []string{"id"})
	require.NoError(t, err)
	var missing []string
	for id := range src {
		if _, ok := d2.rows["public.nokey"][id]; !ok {
			missing = append(missing, id)
		}
	}
	require.Empty(t, missing, "rows never read")

	// A table whose rows are in tables that inherit from it (its own pages hold none) is read
	// whole, in one query; a materialized view without a key by its pages.
	e.db.Exec(`CREATE TABLE parent (id int NOT NULL, v text)`)
	e.db.Exec(`CREATE TABLE child () INHERITS (parent)`)
	e.db.Exec(`INSERT INTO child SELECT g, 'c' FROM generate_series(1, 500) g`)
	e.db.Exec(`CREATE MATERIALIZED VIEW mv AS SELECT g AS id, 'm' AS v FROM generate_series(1, 500) g`)
	e.db.Exec(`GRANT SELECT ON parent, child, mv TO ` + role)
	cat = e.catalog()
	d3 := newDestination(map[string][]string{"public.parent": {"id"}, "public.mv": {"id"}})
	d3.apply(t, e.readWith(newPlatform(), cat).records())
	require.Len(t, d3.rows["public.parent"], 500, "the children's rows")
	require.Len(t, d3.rows["public.mv"], 500)
}
