package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// read: arguments and state forms, records, states, resumption, statuses, errors and estimates.

// ordersEnv is an env with a captured table public.orders (id, v, n) of rows rows.
func ordersEnv(t *testing.T, rows int) *env {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE orders (id int PRIMARY KEY, v text, n numeric)`)
	e.db.Exec(fmt.Sprintf(`INSERT INTO orders SELECT g, 'v' || g, g * 1.5 FROM generate_series(1, %d) g`, rows))
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE orders`)
	return e
}

func TestArgumentsInAnyOrderFromAnyDirectory(t *testing.T) {
	e := ordersEnv(t, 10)
	cat := e.catalog()
	cfg := e.config()
	for _, args := range [][]string{
		{"read", "--catalog", cat, "--config", cfg},
		{"read", "--config=" + cfg, "--catalog=" + cat},
		{"read", "-catalog", cat, "-config", cfg},
	} {
		cmd := exec.Command(binPath, args...)
		cmd.Dir = "/"
		r := e.startCmd(cmd).wait()
		require.Equal(t, 0, r.code, "%v:\n%s", args, tail(r.stderr))
		require.NotEmpty(t, r.records())
	}
}

func TestStateArgumentForms(t *testing.T) {
	e := ordersEnv(t, 20)
	cat := e.catalog()
	first := e.read(cat, nil)
	require.Len(t, first.records(), 20, "without --state: a first sync")
	st := first.states()[len(first.states())-1].m["state"]
	single, _ := json.Marshal(st)
	array, _ := json.Marshal([]any{st})
	for name, state := range map[string][]byte{"array": array, "object": single} {
		r := e.read(cat, state)
		require.Empty(t, r.records(), "state as %s: nothing new", name)
	}
	for _, empty := range []string{"[]", "{}", "null", ""} {
		r := e.read(cat, []byte(empty))
		require.Len(t, r.records(), 20, "state %q is no state", empty)
	}
}

func TestUnknownFieldsAreIgnored(t *testing.T) {
	e := ordersEnv(t, 5)
	e.cfg["some_future_option"] = map[string]any{"x": 1}
	e.cdc()["another_one"] = true
	e.cfg["ssl_mode"].(map[string]any)["extra"] = "y"
	cat := e.catalog()
	var c map[string]any
	b, _ := os.ReadFile(cat)
	require.NoError(t, json.Unmarshal(b, &c))
	c["extra"] = 1
	s0 := c["streams"].([]any)[0].(map[string]any)
	s0["generation_id"], s0["minimum_generation_id"], s0["sync_id"], s0["unknown"] = 1, 0, 7, "z"
	s0["stream"].(map[string]any)["is_file_based"] = false
	cat = e.file("catalog.json", c)
	r := e.read(cat, nil)
	var st map[string]any
	require.NoError(t, json.Unmarshal(r.lastState(t), &[]any{&st}))
	st["extra_state_field"] = 1
	st["global"].(map[string]any)["extra"] = 2
	st["global"].(map[string]any)["shared_state"].(map[string]any)["extra"] = 3
	state, _ := json.Marshal([]any{st})
	e.db.Exec(`INSERT INTO orders VALUES (6, 'six', 9)`)
	r = e.read(cat, state)
	require.Len(t, r.records(), 1)
}

func TestSIGTERMEndsCleanlyWithAState(t *testing.T) {
	e := ordersEnv(t, 200000)
	e.cfg["backfill_chunk_size"] = 2000
	e.cfg["continuous"] = true
	cat := e.catalog()
	p := e.start("read", "--config", e.config(), "--catalog", cat)
	e2e.WaitFor(t, 60*time.Second, "records", func() bool {
		n := 0
		for _, m := range p.snapshot() {
			if m.Type == "RECORD" {
				n++
			}
		}
		return n > 5000
	})
	sent := time.Now()
	p.signal(syscall.SIGTERM)
	r := p.wait()
	require.Less(t, time.Since(sent), 10*time.Second, "ends within seconds")
	require.NotEqual(t, 0, r.code, "an interrupted read exits non-zero")
	last := r.msgs[len(r.msgs)-1]
	require.NotEmpty(t, last.Type, "the last line is a whole message")
	var lastState, lastRecord int
	for i, m := range r.msgs {
		switch m.Type {
		case "STATE":
			lastState = i
		case "RECORD":
			lastRecord = i
		}
	}
	require.Greater(t, lastState, lastRecord, "a state covers every record sent")
	errs := r.traces("ERROR")
	require.Len(t, errs, 1)
	require.Equal(t, "transient_error", errs[0].str("trace", "error", "failure_type"))
	for _, m := range r.traces("STREAM_STATUS") {
		require.NotEqual(t, "COMPLETE", m.str("trace", "stream_status", "status"))
	}
	// The platform retries with the last state: the rest comes, nothing is lost.
	d := newDestination(map[string][]string{"public.orders": {"id"}})
	d.apply(t, r.records())
	e.cfg["continuous"] = false
	r2 := e.read(cat, r.lastState(t))
	d.apply(t, r2.records())
	d.equalsSource(t, e, "public.orders")
}

func TestRecordFields(t *testing.T) {
	e := ordersEnv(t, 3)
	cat := e.catalog()
	r := e.read(cat, nil)
	require.Len(t, r.records(), 3)
	start := time.Now().Add(-time.Minute).UnixMilli()
	for _, m := range r.records() {
		require.Equal(t, "orders", m.str("record", "stream"))
		require.Equal(t, "public", m.str("record", "namespace"))
		require.NotEmpty(t, m.get("record", "data"))
		at, ok := m.get("record", "emitted_at").(json.Number)
		require.True(t, ok)
		n, err := at.Int64()
		require.NoError(t, err, "emitted_at is an integer")
		require.Greater(t, n, start)
	}
}

func TestOnlyConfiguredStreams(t *testing.T) {
	e := ordersEnv(t, 5)
	e.db.Exec(`CREATE TABLE other (id int PRIMARY KEY)`)
	e.db.Exec(`ALTER PUBLICATION ` + e.db.Publication + ` ADD TABLE other`)
	cat := e.catalog("public.orders")
	r := e.read(cat, nil)
	e.db.Exec(`INSERT INTO other VALUES (1), (2)`)
	e.db.Exec(`INSERT INTO orders VALUES (100, 'x', 1)`)
	r2 := e.read(cat, r.lastState(t))
	for _, m := range append(r.records(), r2.records()...) {
		require.Equal(t, "orders", m.str("record", "stream"))
	}
	require.Len(t, r2.records(), 1)
	for _, m := range append(r.traces("STREAM_STATUS"), r2.traces("STREAM_STATUS")...) {
		require.Equal(t, "orders", m.str("trace", "stream_status", "stream_descriptor", "name"))
	}
}

func TestOnlyConfiguredColumns(t *testing.T) {
	e := ordersEnv(t, 5)
	cat := e.catalog()
	// The user deselected column n.
	var c map[string]any
	b, _ := os.ReadFile(cat)
	require.NoError(t, json.Unmarshal(b, &c))
	props := c["streams"].([]any)[0].(map[string]any)["stream"].(map[string]any)["json_schema"].(map[string]any)["properties"].(map[string]any)
	delete(props, "n")
	cat = e.file("catalog.json", c)
	r := e.read(cat, nil)
	for _, m := range r.records() {
		_, data := recordOf(t, m)
		require.NotContains(t, data, "n")
		require.Contains(t, data, "v")
	}
	// A column added after discover is not emitted; a dropped one is simply absent.
	e.db.Exec(`ALTER TABLE orders ADD COLUMN added text`)
	e.db.Exec(`INSERT INTO orders VALUES (6, 'six', 6, 'new')`)
	e.db.Exec(`ALTER TABLE orders DROP COLUMN v`)
	e.db.Exec(`INSERT INTO orders VALUES (7, 7, 'new')`)
	r = e.read(cat, r.lastState(t))
	require.Len(t, r.records(), 2)
	for _, m := range r.records() {
		_, data := recordOf(t, m)
		require.NotContains(t, data, "added")
		require.NotContains(t, data, "n")
	}
	_, data := recordOf(t, r.records()[1])
	require.NotContains(t, data, "v")
}

// typesTable creates a table with a column of most types Airbyte's connector maps (its data type table), and
// rows that exercise their edges.
func typesTable(e *env) {
	e.db.Exec(`CREATE EXTENSION IF NOT EXISTS hstore`)
	e.db.Exec(`CREATE TYPE mood AS ENUM ('sad', 'happy')`)
	e.db.Exec(`CREATE TABLE types (id bigserial PRIMARY KEY,
		i2 int2, i4 int4, i8 int8, num numeric, num2 numeric(10,2), f4 float4, f8 float8, m money, b bool,
		bits bit(4), vbits varbit, bytes bytea, c char(3), vc varchar(10), t text, d date, tm time, tmtz timetz,
		ts timestamp, tstz timestamptz, iv interval, j json, jb jsonb, h hstore, ip inet, net cidr, mac macaddr,
		pt point, bx box, u uuid, x xml, lsn pg_lsn, tsv tsvector, e mood, rng int4range, arr int[], tarr text[][])`)
	e.db.Exec(`INSERT INTO types (i2, i4, i8, num, num2, f4, f8, m, b, bits, vbits, bytes, c, vc, t, d, tm, tmtz, ts, tstz, iv, j, jb, h,
		ip, net, mac, pt, bx, u, x, lsn, tsv, e, rng, arr, tarr) VALUES
		(-32768, 2147483647, 9223372036854775807, 123456789012345678901234567890.123456789, 1.10, 1.5, -0.0, 1234.5, true,
		 B'1010', B'101', '\x00ff10', 'ab', 'varchar', 'text "quoted" <&>', '2024-02-29', '23:59:59.999999', '10:00+05:30',
		 '2024-01-01 00:00:00', '2024-06-30 12:34:56.789+02', '1 year 2 mons 3 days 04:05:06', '{"a": 1, "a": 2}', '{"b": [1, 2.50]}',
		 'k=>v', '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03', '(1,2)', '((0,0),(1,1))', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
		 '<a>x</a>', '16/B374D848', 'a fat cat', 'happy', '[1,5)', '{1,NULL,3}', '{{a,b},{c,d}}'),
		(NULL, NULL, NULL, 'NaN', NULL, 'Infinity', '-Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
		 '0044-03-15 BC', NULL, NULL, 'infinity', '12345-01-01 00:00:00+00', NULL, NULL, NULL, NULL, NULL, NULL, NULL,
		 NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'empty', '{}', NULL)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE types`)
}

func TestValuesValidateAgainstTheDiscoveredSchema(t *testing.T) {
	e := newEnv(t)
	typesTable(e)
	cat := e.catalog()
	var c map[string]any
	b, _ := os.ReadFile(cat)
	require.NoError(t, json.Unmarshal(b, &c))
	schema, err := e2e.CompileSchema(c["streams"].([]any)[0].(map[string]any)["stream"].(map[string]any)["json_schema"])
	require.NoError(t, err)
	r := e.read(cat, nil)
	// The same rows once more from the stream.
	e.db.Exec(`INSERT INTO types (i2, i4, i8, num, num2, f4, f8, m, b, bits, vbits, bytes, c, vc, t, d, tm, tmtz, ts, tstz, iv, j, jb, h,
		ip, net, mac, pt, bx, u, x, lsn, tsv, e, rng, arr, tarr) SELECT i2, i4, i8, num, num2, f4, f8, m, b, bits, vbits, bytes, c, vc, t, d, tm, tmtz,
		ts, tstz, iv, j, jb, h, ip, net, mac, pt, bx, u, x, lsn, tsv, e, rng, arr, tarr FROM types ORDER BY id`)
	r2 := e.read(cat, r.lastState(t))
	recs := append(r.records(), r2.records()...)
	require.Len(t, recs, 4)
	for _, m := range recs {
		var rec struct {
			Record struct {
				Data any `json:"data"`
			} `json:"record"`
		}
		dec := json.NewDecoder(strings.NewReader(string(m.raw)))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&rec))
		require.NoError(t, schema.Validate(rec.Record.Data), "%s", m.raw)
	}
	// Backfill and stream give the same values.
	_, a := recordOf(t, recs[0])
	_, b2 := recordOf(t, recs[2])
	for col, v := range a {
		if strings.HasPrefix(col, "_ab_cdc_") || col == "id" {
			continue
		}
		require.JSONEq(t, string(v), string(b2[col]), "column %s", col)
	}
}

func TestCDCMetadataColumns(t *testing.T) {
	e := ordersEnv(t, 3)
	cat := e.catalog()
	r := e.read(cat, nil)
	start := time.Now().Add(-time.Second)
	e.db.Exec(`UPDATE orders SET v = 'changed' WHERE id = 1`)
	e.db.Exec(`DELETE FROM orders WHERE id = 2`)
	e.db.Exec(`INSERT INTO orders VALUES (4, 'four', 4)`)
	r = e.read(cat, r.lastState(t))
	recs := r.records()
	require.Len(t, recs, 3)
	var prev uint64
	for i, m := range recs {
		_, data := recordOf(t, m)
		lsn := lsnOf(t, data)
		require.GreaterOrEqual(t, lsn, prev, "_ab_cdc_lsn does not decrease")
		prev = lsn
		var updated string
		require.NoError(t, json.Unmarshal(data[colUpdatedAt], &updated))
		ts, err := time.Parse(time.RFC3339Nano, updated)
		require.NoError(t, err)
		require.True(t, strings.HasSuffix(updated, "Z"), "UTC")
		require.WithinDuration(t, time.Now(), ts, time.Until(start)*-1+time.Minute)
		if i == 1 {
			require.Equal(t, string(data[colUpdatedAt]), string(data[colDeletedAt]), "a delete's time")
			require.Equal(t, "2", string(data["id"]), "a delete carries the key")
			require.NotContains(t, data, "v")
		} else {
			require.Equal(t, "null", string(data[colDeletedAt]))
		}
	}
}

func TestNoRecordWithANullKey(t *testing.T) {
	e := ordersEnv(t, 50)
	cat := e.catalog()
	r := e.read(cat, nil)
	e.db.Exec(`UPDATE orders SET id = id + 1000 WHERE id <= 10`)
	e.db.Exec(`DELETE FROM orders WHERE id > 40`)
	r2 := e.read(cat, r.lastState(t))
	for _, m := range append(r.records(), r2.records()...) {
		_, data := recordOf(t, m)
		require.NotEqual(t, "null", string(data["id"]))
		require.Contains(t, data, "id")
	}
	replayEqualsSource(t, e, "public.orders", "id", r, r2)
}

func TestNoTOASTPlaceholders(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE docs (id int PRIMARY KEY, title text, body text)`)
	e.db.Exec(`ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL`)
	e.db.Exec(`INSERT INTO docs SELECT g, 't' || g, repeat(md5(g::text), 1000) FROM generate_series(1, 5) g`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE docs`)
	cat := e.catalog()
	r := e.read(cat, nil)
	e.db.Exec(`UPDATE docs SET title = 'changed' WHERE id <= 3`)
	r2 := e.read(cat, r.lastState(t))
	require.NotEmpty(t, r2.records())
	for _, m := range r2.records() {
		_, data := recordOf(t, m)
		require.Contains(t, data, "body", "the whole row, never a placeholder: %s", m.raw)
		require.Greater(t, len(data["body"]), 32000)
		require.NotContains(t, string(m.raw), "unavailable")
		require.Nil(t, m.get("record", "meta"))
	}
	replayEqualsSource(t, e, "public.docs", "id", r, r2)
}

func TestUnencodableValuesAreNulledAndListed(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY, n numeric, f float8)`)
	e.db.Exec(`INSERT INTO t VALUES (1, 'NaN', 'Infinity'), (2, 1.5, 2.5)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	cat := e.catalog()
	r := e.read(cat, nil)
	e.db.Exec(`INSERT INTO t VALUES (3, 'Infinity', 'NaN')`)
	r2 := e.read(cat, r.lastState(t))
	recs := append(r.records(), r2.records()...)
	require.Len(t, recs, 3)
	for _, i := range []int{0, 2} {
		_, data := recordOf(t, recs[i])
		require.Equal(t, "null", string(data["n"]))
		require.Equal(t, "null", string(data["f"]))
		changes := recs[i].get("record", "meta", "changes").([]any)
		require.Len(t, changes, 2)
		for _, c := range changes {
			require.Equal(t, "NULLED", c.(map[string]any)["change"])
			require.Equal(t, "SOURCE_SERIALIZATION_ERROR", c.(map[string]any)["reason"])
		}
	}
	require.Nil(t, recs[1].get("record", "meta"))
}

func TestCDCStatesAreGlobalOnly(t *testing.T) {
	e := ordersEnv(t, 30)
	e.db.Exec(`CREATE TABLE other (id int PRIMARY KEY)`)
	e.db.Exec(`CREATE VIEW vw AS SELECT id FROM orders`)
	e.db.Exec(`ALTER PUBLICATION ` + e.db.Publication + ` ADD TABLE other`)
	cat := e.catalog("public.orders", "public.other", "public.vw")
	e.cfg["backfill_chunk_size"] = 10
	r := e.read(cat, nil)
	require.NotEmpty(t, r.states())
	positioned, recorded := false, false
	for _, s := range r.msgs {
		if s.Type == "RECORD" {
			recorded = true
		}
		if s.Type != "STATE" {
			continue
		}
		require.Equal(t, "GLOBAL", s.str("state", "type"))
		// A heartbeat may go out while the slot is still being made (a loaded server), with no
		// position yet (TestHeartbeatBeforeTheFirstPosition): before any record, and before any
		// state with a position.
		has := s.get("state", "global", "shared_state", "lsn") != nil
		require.False(t, !has && (positioned || recorded), "a state without a position after a record or a positioned state: %s", s.raw)
		positioned = positioned || has
		var names []string
		for _, ss := range s.get("state", "global", "stream_states").([]any) {
			names = append(names, ss.(map[string]any)["stream_descriptor"].(map[string]any)["name"].(string))
		}
		require.ElementsMatch(t, []string{"orders", "other", "vw"}, names, "every configured stream on every state")
	}
	require.True(t, positioned, "no state has a position")
}

func TestRecordCountsAreExact(t *testing.T) {
	// Every run's output is checked for exact counts (env.check); this one has many states,
	// backfill chunks and changes interleaved, and a full refresh stream.
	e := ordersEnv(t, 3000)
	e.db.Exec(`CREATE TABLE fr (id int PRIMARY KEY)`)
	e.db.Exec(`INSERT INTO fr SELECT generate_series(1, 2500)`)
	cat := e.catalog("public.orders", "public.fr")
	e.cfg["backfill_chunk_size"] = 100
	stop, done := workload(t, e, "orders", 3000)
	r := e.read(cat, nil)
	close(stop)
	<-done
	require.Greater(t, len(r.states()), 30)
	total := 0
	for _, s := range r.states() {
		n, _ := s.get("state", "sourceStats", "recordCount").(json.Number).Float64()
		total += int(n)
	}
	require.Equal(t, len(r.records()), total)
}

func TestFinalStateOnAnIdleDatabase(t *testing.T) {
	e := ordersEnv(t, 0)
	cat := e.catalog()
	before := e.db.CurrentLSN()
	r := e.read(cat, nil)
	require.Empty(t, r.records())
	last := r.msgs[len(r.msgs)-1]
	var lastState msg
	for _, m := range r.msgs {
		if m.Type == "STATE" {
			lastState = m
		}
	}
	require.NotNil(t, lastState.m, "a final state even with no records")
	for _, m := range r.msgs[indexOf(r.msgs, lastState)+1:] {
		require.Equal(t, "TRACE", m.Type, "only statuses follow the final state: %s", m.raw)
	}
	_ = last
	lsn, err := lastState.get("state", "global", "shared_state", "lsn").(json.Number).Int64()
	require.NoError(t, err)
	require.GreaterOrEqual(t, pglogrepl.LSN(lsn), before, "the final state is at or after the WAL position of the read's start")
}

func indexOf(ms []msg, m msg) int {
	for i := range ms {
		if &ms[i].raw[0] == &m.raw[0] {
			return i
		}
	}
	return -1
}

func TestStatesKeepComing(t *testing.T) {
	e := ordersEnv(t, 60000)
	e.cfg["backfill_chunk_size"] = 500
	e.cfg["continuous"] = true
	e.cfg["sync_time_budget_seconds"] = 6
	cat := e.catalog()
	r := e.read(cat, nil)
	states := r.states()
	require.NotEmpty(t, states)
	// The backfill finishes well within the budget; then the source is idle and only states
	// show it is alive, at least every state interval (1s here).
	prev := states[0].at
	for _, s := range states[1:] {
		require.Less(t, s.at.Sub(prev), 2500*time.Millisecond, "a gap between states")
		prev = s.at
	}
	require.Greater(t, len(states), 4)
}

func TestResumeFromAnyState(t *testing.T) {
	e := ordersEnv(t, 2000)
	e.cfg["backfill_chunk_size"] = 150
	cat := e.catalog()
	stop, done := workload(t, e, "orders", 2000)
	r := e.read(cat, nil)
	states := r.states()
	require.Greater(t, len(states), 5)
	close(stop)
	<-done
	// Resume from several intermediate states: what came before the state plus what the
	// resumed read brings equals the source.
	for _, i := range []int{1, len(states) / 3, len(states) / 2, len(states) - 2} {
		cut := indexOf(r.msgs, states[i])
		var before []msg
		for _, m := range r.msgs[:cut] {
			if m.Type == "RECORD" {
				before = append(before, m)
			}
		}
		st, _ := json.Marshal([]any{states[i].m["state"]})
		d := newDestination(map[string][]string{"public.orders": {"id"}})
		d.apply(t, before)
		r2 := e.read(cat, st)
		d.apply(t, r2.records())
		d.equalsSource(t, e, "public.orders")
	}
}

// workload updates, inserts and deletes rows of table (id int primary key, v text) until stop
// is closed.
func workload(t *testing.T, e *env, table string, ids int) (stop chan struct{}, done chan struct{}) {
	stop, done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		conn := e.db.Connect()
		defer conn.Close(context.Background())
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := (i*7919)%ids + 1
			var err error
			switch i % 4 {
			case 0, 1:
				_, err = conn.Exec(context.Background(), `UPDATE `+table+` SET v = v || 'u' WHERE id = $1`, id)
			case 2:
				_, err = conn.Exec(context.Background(), `DELETE FROM `+table+` WHERE id = $1`, id)
			case 3:
				_, err = conn.Exec(context.Background(), `INSERT INTO `+table+` (id, v) VALUES ($1, 'i') ON CONFLICT (id) DO UPDATE SET v = 'r'`, id)
			}
			if err != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return stop, done
}

func TestNoChangesNoRecords(t *testing.T) {
	e := ordersEnv(t, 100)
	cat := e.catalog()
	r := e.read(cat, nil)
	r2 := e.read(cat, r.lastState(t))
	require.Empty(t, r2.records())
	require.NotEmpty(t, r2.states(), "a final state")
}

func TestAStateFromTheFuture(t *testing.T) {
	e := ordersEnv(t, 100)
	cat := e.catalog()
	r := e.read(cat, nil)
	var st []map[string]any
	require.NoError(t, json.Unmarshal(r.lastState(t), &st))
	shared := st[0]["global"].(map[string]any)["shared_state"].(map[string]any)
	shared["lsn"] = uint64(math.MaxUint64)
	shared["lsn_text"] = "FFFFFFFF/FFFFFFFF"
	future, _ := json.Marshal(st)
	confirmed, _ := e.db.SlotLSNs(e.db.Slot)
	e.db.Exec(`INSERT INTO orders VALUES (1000, 'x', 1)`)
	// Not resumed, not acknowledged, and not a silent empty sync either: a config error with
	// the way out, or a re-sync where the user asked for one.
	failed := e.run("read", "--config", e.config(), "--catalog", cat, "--state", e.file("state.json", future))
	require.NotEqual(t, 0, failed.code)
	errs := failed.traces("ERROR")
	require.Len(t, errs, 1)
	require.Equal(t, "config_error", errs[0].str("trace", "error", "failure_type"))
	require.Contains(t, errs[0].str("trace", "error", "message"), "ahead of the server's WAL")
	require.Empty(t, failed.records())
	after, _ := e.db.SlotLSNs(e.db.Slot)
	require.Equal(t, confirmed, after, "the slot is not acknowledged to a position the server has not reached")

	e.cdc()["invalid_cdc_cursor_position_behavior"] = "Re-sync data"
	r2 := e.read(cat, future)
	require.GreaterOrEqual(t, len(r2.records()), 101, "every row again")
	replayEqualsSource(t, e, "public.orders", "id", r2)
}

func TestAStateBehindTheSlot(t *testing.T) {
	e := ordersEnv(t, 100)
	cat := e.catalog()
	r := e.read(cat, nil)
	state := r.lastState(t)
	// Changes the destination never got; the slot moves past them.
	e.db.Exec(`INSERT INTO orders VALUES (1000, 'lost', 1)`)
	e.db.Exec(`SELECT pg_replication_slot_advance('` + e.db.Slot + `', pg_current_wal_lsn())`)
	confirmed, _ := e.db.SlotLSNs(e.db.Slot)

	failed := e.run("read", "--config", e.config(), "--catalog", cat, "--state", e.file("state.json", state))
	require.NotEqual(t, 0, failed.code)
	errs := failed.traces("ERROR")
	require.Len(t, errs, 1)
	require.Equal(t, "config_error", errs[0].str("trace", "error", "failure_type"))
	m := errs[0].str("trace", "error", "message")
	require.Contains(t, m, e.db.Slot)
	require.Contains(t, m, confirmed.String())
	require.Empty(t, failed.records())

	e.cdc()["invalid_cdc_cursor_position_behavior"] = "Re-sync data"
	r2 := e.read(cat, state)
	require.Len(t, r2.records(), 101, "every row again")
	require.NotEmpty(t, r2.traces("ANALYTICS"))
	replayEqualsSource(t, e, "public.orders", "id", r, r2)
}

func TestSlotAcknowledgedToTheIncomingState(t *testing.T) {
	e := ordersEnv(t, 100)
	cat := e.catalog()
	r := e.read(cat, nil)
	var st []map[string]any
	require.NoError(t, json.Unmarshal(r.lastState(t), &st))
	stateLSN, _ := st[0]["global"].(map[string]any)["shared_state"].(map[string]any)["lsn"].(float64)
	confirmed, _ := e.db.SlotLSNs(e.db.Slot)
	require.Less(t, confirmed, pglogrepl.LSN(stateLSN), "a read never acknowledges its own states")
	e.db.Exec(`INSERT INTO orders VALUES (1000, 'x', 1)`)
	r2 := e.read(cat, r.lastState(t))
	require.Len(t, r2.records(), 1)
	confirmed, _ = e.db.SlotLSNs(e.db.Slot)
	require.Equal(t, pglogrepl.LSN(stateLSN), confirmed, "acknowledged to the incoming state, and no further")

	// "While reading Data": acknowledged as states go out.
	e.cdc()["lsn_commit_behaviour"] = "While reading Data"
	e.db.Exec(`INSERT INTO orders VALUES (1001, 'y', 1)`)
	r3 := e.read(cat, r2.lastState(t))
	require.NoError(t, json.Unmarshal(r3.lastState(t), &st))
	last, _ := st[0]["global"].(map[string]any)["shared_state"].(map[string]any)["lsn"].(float64)
	confirmed, _ = e.db.SlotLSNs(e.db.Slot)
	require.Equal(t, pglogrepl.LSN(last), confirmed)
}

func TestResumableFullRefresh(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE fr (id int PRIMARY KEY, v text)`)
	e.db.Exec(`INSERT INTO fr SELECT g, 'v' FROM generate_series(1, 1000) g`)
	e.db.Exec(`CREATE VIEW frv AS SELECT * FROM fr WHERE id <= 10`)
	e.cfg["backfill_chunk_size"] = 100
	cat := e.catalog()
	r := e.read(cat, nil)
	require.Len(t, r.records(), 1010)
	states := r.states()
	require.GreaterOrEqual(t, len(states), 10, "a state per chunk")
	// An attempt that failed after the third chunk resumes from its state.
	var mid msg
	for _, s := range states {
		for _, ss := range s.get("state", "global", "stream_states").([]any) {
			st := ss.(map[string]any)
			if st["stream_descriptor"].(map[string]any)["name"] == "fr" && st["stream_state"].(map[string]any)["chunks"] == json.Number("3") {
				mid = s
			}
		}
	}
	require.NotNil(t, mid.m)
	st, _ := json.Marshal([]any{mid.m["state"]})
	r2 := e.read(cat, st)
	n := 0
	for _, m := range r2.records() {
		if m.str("record", "stream") == "fr" {
			n++
		}
	}
	require.Equal(t, 700, n, "the rest of the table")
	// A finished full refresh starts over in the next job.
	r3 := e.read(cat, r2.lastState(t))
	require.Len(t, r3.records(), 1010)
}

func TestStreamStatuses(t *testing.T) {
	e := ordersEnv(t, 10)
	e.db.Exec(`CREATE TABLE empty (id int PRIMARY KEY)`)
	e.db.Exec(`ALTER PUBLICATION ` + e.db.Publication + ` ADD TABLE empty`)
	cat := e.catalog()
	r := e.read(cat, nil)
	statuses := map[string][]string{}
	for _, m := range r.traces("STREAM_STATUS") {
		name := m.str("trace", "stream_status", "stream_descriptor", "name")
		statuses[name] = append(statuses[name], m.str("trace", "stream_status", "status"))
	}
	for _, name := range []string{"orders", "empty"} {
		s := statuses[name]
		require.Equal(t, "STARTED", s[0], name)
		require.Equal(t, "RUNNING", s[1], name)
		require.Equal(t, "COMPLETE", s[len(s)-1], name)
	}
	// A failing read: INCOMPLETE.
	e.db.Exec(`DROP PUBLICATION ` + e.db.Publication)
	r = e.run("read", "--config", e.config(), "--catalog", cat, "--state", e.file("state.json", r.lastState(t)))
	require.NotEqual(t, 0, r.code)
	last := map[string]string{}
	for _, m := range r.traces("STREAM_STATUS") {
		last[m.str("trace", "stream_status", "stream_descriptor", "name")] = m.str("trace", "stream_status", "status")
	}
	require.Equal(t, map[string]string{"orders": "INCOMPLETE", "empty": "INCOMPLETE"}, last)
}

func TestReadErrorsAreClassified(t *testing.T) {
	e := ordersEnv(t, 10)
	cat := e.catalog()
	good := clone(e.cfg)
	e.secrets = append(e.secrets, "wrong-password-42")
	cases := []struct {
		name string
		edit func(c map[string]any)
		want string
	}{
		{"auth", func(c map[string]any) { c["password"] = "wrong-password-42" }, "config_error"},
		{"slot", func(c map[string]any) { c["create_replication_slot"] = false }, "config_error"},
		{"slot by default", func(c map[string]any) { delete(c, "create_replication_slot") }, "config_error"},
		{"publication", func(c map[string]any) { c["replication_method"].(map[string]any)["publication"] = "nope" }, "config_error"},
		{"network", func(c map[string]any) { c["host"], c["port"] = "127.0.0.1", 1 }, "transient_error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e.t = t
			e.cfg = clone(good)
			tc.edit(e.cfg)
			r := e.run("read", "--config", e.config(), "--catalog", cat)
			require.NotEqual(t, 0, r.code)
			errs := r.traces("ERROR")
			require.Len(t, errs, 1, r.stdout)
			require.Equal(t, tc.want, errs[0].str("trace", "error", "failure_type"), errs[0].str("trace", "error", "message"))
			require.NotEmpty(t, errs[0].str("trace", "error", "message"))
			require.NotEmpty(t, errs[0].str("trace", "error", "internal_message"))
		})
	}
}

func TestAnInvalidCatalog(t *testing.T) {
	e := ordersEnv(t, 1)
	cat := e.file("catalog.json", map[string]any{"streams": []any{map[string]any{
		"stream":    map[string]any{"name": "does_not_exist", "namespace": "public", "json_schema": map[string]any{}, "supported_sync_modes": []string{"full_refresh"}},
		"sync_mode": "INVALID", "destination_sync_mode": "append",
	}}})
	r := e.run("read", "--config", e.config(), "--catalog", cat)
	require.NotEqual(t, 0, r.code)
	errs := r.traces("ERROR")
	require.Len(t, errs, 1)
	require.Equal(t, "config_error", errs[0].str("trace", "error", "failure_type"))
	require.Contains(t, errs[0].str("trace", "error", "message"), "INVALID")
}

func TestEstimates(t *testing.T) {
	e := ordersEnv(t, 5000)
	e.db.Exec(`ANALYZE orders`)
	cat := e.catalog()
	r := e.read(cat, nil)
	est := r.traces("ESTIMATE")
	require.Len(t, est, 1)
	require.Equal(t, "STREAM", est[0].str("trace", "estimate", "type"))
	require.Equal(t, "orders", est[0].str("trace", "estimate", "name"))
	n, _ := est[0].get("trace", "estimate", "row_estimate").(json.Number).Int64()
	require.InDelta(t, 5000, n, 500)
	// A finished backfill has nothing to estimate.
	r = e.read(cat, r.lastState(t))
	require.Empty(t, r.traces("ESTIMATE"))
}

func TestNoSecretsAnywhere(t *testing.T) {
	// Every run's stdout and stderr are searched for the config's secrets (env.check); this run
	// fails on purpose with a password in several places of the config.
	e := ordersEnv(t, 1)
	cat := e.catalog()
	e.cfg["password"] = "super-secret-password-1"
	e.cfg["ssl_mode"] = map[string]any{"mode": "require", "client_certificate": "not-a-cert", "client_key": "client-key-secret-2", "client_key_password": "client-key-password-3"}
	e.cfg["jdbc_url_params"] = "password=url-secret-4"
	e.secrets = append(e.secrets, "super-secret-password-1", "client-key-secret-2", "client-key-password-3", "url-secret-4")
	for _, cmd := range [][]string{{"check", "--config", e.config()}, {"discover", "--config", e.config()}, {"read", "--config", e.config(), "--catalog", cat}} {
		r := e.run(cmd...)
		require.NotEmpty(t, r.stdout)
	}
}

// TestAcceptanceSuites runs, in Go, what the connector acceptance tests' full_refresh and
// incremental suites check (the suites themselves need Docker): two full refresh reads give the
// same records; a second incremental read from the first's state brings only records whose
// cursor is at or after the state's; a state from the future brings none (as TestAStateFromTheFuture).
func TestAcceptanceSuites(t *testing.T) {
	e := ordersEnv(t, 300)
	e.db.Exec(`CREATE TABLE plain (id int PRIMARY KEY, v text)`)
	e.db.Exec(`INSERT INTO plain SELECT g, 'p' FROM generate_series(1, 50) g`)
	cat := e.catalog()
	// Full refresh: every stream read twice, without state.
	var c map[string]any
	b, _ := os.ReadFile(cat)
	require.NoError(t, json.Unmarshal(b, &c))
	for _, s := range c["streams"].([]any) {
		s.(map[string]any)["sync_mode"], s.(map[string]any)["destination_sync_mode"] = "full_refresh", "overwrite"
	}
	full := e.file("full.json", c)
	set := func(r *result) map[string]bool {
		out := map[string]bool{}
		for _, m := range r.records() {
			s, data := recordOf(t, m)
			delete(data, colLSN)
			delete(data, colUpdatedAt)
			delete(data, colDeletedAt)
			k, _ := json.Marshal(data)
			out[s+string(k)] = true
		}
		return out
	}
	first, second := set(e.read(full, nil)), set(e.read(full, nil))
	require.Len(t, first, 350)
	for k := range first {
		require.True(t, second[k], "the first full refresh's records are in the second's: %s", k)
	}
	// Incremental: the second read's cursors are at or after the state's.
	r := e.read(cat, nil)
	require.NotEmpty(t, r.records())
	var st []map[string]any
	require.NoError(t, json.Unmarshal(r.lastState(t), &st))
	cursor, _ := st[0]["global"].(map[string]any)["shared_state"].(map[string]any)["lsn"].(float64)
	e.db.Exec(`UPDATE orders SET v = 'later' WHERE id <= 5`)
	r2 := e.read(cat, r.lastState(t))
	n := 0
	for _, m := range r2.records() {
		stream, data := recordOf(t, m)
		if stream != "public.orders" {
			continue // plain is a full refresh stream: read whole every time
		}
		n++
		require.GreaterOrEqual(t, float64(lsnOf(t, data)), cursor)
	}
	require.Equal(t, 5, n)
}

// TestStdoutCarriesOnlyMessages: with the most verbose log level, every stdout line is one
// protocol message of a valid type (env.check validates each against the protocol's schema), and
// the log goes to stderr.
func TestStdoutCarriesOnlyMessages(t *testing.T) {
	e := ordersEnv(t, 2000)
	e.cfg["backfill_chunk_size"] = 300
	cat := e.catalog()
	cmd := exec.Command(binPath, "read", "--config", e.config(), "--catalog", cat)
	cmd.Env = append(os.Environ(), "LOG_LEVEL=trace")
	r := e.startCmd(cmd).wait()
	require.Equal(t, 0, r.code)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, r.msgs, len(lines))
	valid := map[string]bool{"RECORD": true, "STATE": true, "LOG": true, "TRACE": true}
	for _, m := range r.msgs {
		require.True(t, valid[m.Type], "a read writes records, states, logs and traces only: %s", m.raw)
	}
	require.Contains(t, r.stderr, `"level":"trace"`, "the log goes to stderr")
	require.NotContains(t, r.stdout, `"level":`)
}
