package e2e_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/sink/debezium"
	"github.com/tidemark/tidemark/sink/kafka"
	"github.com/tidemark/tidemark/sink/nats"
)

// dbzSink encodes every event with the Debezium encoders (the default, precise decimals, and
// string decimals with schemas) and keeps each table's records by key and op, with the source
// fields that vary from run to run (times, LSN, transaction id) checked against the event and
// then left out. A value the precise mode refuses is kept as its error. Every record with a
// schema is checked against it (conforms).
type dbzSink struct {
	enc, schemas *debezium.Encoder
	mu           sync.Mutex
	recs         map[string][]string // table: "key op value" lines
	errs         []string
}

func (s *dbzSink) Emit(ctx context.Context, evs []merge.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range evs {
		ev := &evs[i]
		for _, enc := range []*debezium.Encoder{s.enc, s.schemas} {
			line, err := s.encode(ctx, enc, ev)
			if err != nil {
				return err
			}
			s.recs[ev.Columns.Table] = append(s.recs[ev.Columns.Table], line)
		}
	}
	return nil
}

func (s *dbzSink) encode(ctx context.Context, enc *debezium.Encoder, ev *merge.Event) (string, error) {
	decode := func(b []byte) (map[string]any, error) {
		var v map[string]any
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			return nil, fmt.Errorf("%s: %w", b, err)
		}
		if enc.Schemas {
			if err := conforms(v["schema"], v["payload"], "$"); err != nil {
				s.errs = append(s.errs, fmt.Sprintf("%s %s: %v", ev.Columns.Table, ev.Op, err))
			}
			p, _ := v["payload"].(map[string]any)
			return p, nil
		}
		return v, nil
	}
	key, keyed, err := enc.AppendKey(ctx, nil, ev)
	if err != nil {
		return "", err
	}
	k := "-"
	if keyed {
		kv, err := decode(key)
		if err != nil {
			return "", err
		}
		kb, _ := json.Marshal(kv)
		k = string(kb)
	}
	format := strings.ReplaceAll(enc.Format(), " ", "")
	val, err := enc.AppendValue(ctx, nil, ev)
	if err != nil {
		if enc.Decimal == pgjson.DecimalPrecise || enc.Schemas {
			op := map[merge.Op]string{merge.Insert: "c", merge.Update: "u", merge.Delete: "d", merge.Snapshot: "r", merge.Truncate: "t", merge.Refresh: "t"}[ev.Op]
			return fmt.Sprintf("%s %s %s error: %v", k, op, format, err), nil
		}
		return "", err
	}
	v, err := decode(val)
	if err != nil {
		return "", err
	}
	src := v["source"].(map[string]any)
	if got := src["lsn"].(json.Number).String(); got != strconv.FormatUint(uint64(ev.LSN), 10) {
		s.errs = append(s.errs, fmt.Sprintf("source.lsn %s, event LSN %d", got, uint64(ev.LSN)))
	}
	if ev.XID != 0 && src["txId"].(json.Number).String() != strconv.FormatUint(uint64(ev.XID), 10) || ev.XID == 0 && src["txId"] != nil {
		s.errs = append(s.errs, fmt.Sprintf("source.txId %v, event xid %d", src["txId"], ev.XID))
	}
	if ms, _ := src["ts_ms"].(json.Number).Int64(); ms != ev.Time.UnixMilli() {
		s.errs = append(s.errs, fmt.Sprintf("source.ts_ms %d, event time %s", ms, ev.Time))
	}
	for _, f := range []string{"ts_ms", "ts_us", "ts_ns", "lsn", "txId"} {
		delete(src, f)
	}
	norm, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s %s %s %s", k, v["op"], format, norm), nil
}

// conforms checks a value against a Kafka Connect schema as the JSON converter writes it:
// what its converter with schemas.enable would accept.
func conforms(schema, v any, path string) error {
	sc, ok := schema.(map[string]any)
	if !ok {
		return fmt.Errorf("%s: schema %v is not an object", path, schema)
	}
	if v == nil {
		if sc["optional"] != true {
			return fmt.Errorf("%s: null, and the schema is not optional", path)
		}
		return nil
	}
	switch typ := sc["type"]; typ {
	case "struct":
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an object", path, v)
		}
		fields, _ := sc["fields"].([]any)
		seen := map[string]bool{}
		for _, f := range fields {
			fs := f.(map[string]any)
			name := fs["field"].(string)
			seen[name] = true
			if err := conforms(fs, obj[name], path+"."+name); err != nil {
				return err
			}
		}
		for k := range obj {
			if !seen[k] {
				return fmt.Errorf("%s: field %s is not in the schema", path, k)
			}
		}
	case "array":
		arr, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an array", path, v)
		}
		for i, it := range arr {
			if err := conforms(sc["items"], it, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case "int8", "int16", "int32", "int64":
		n, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%s: %v is not a number", path, v)
		}
		bits := map[any]int{"int8": 8, "int16": 16, "int32": 32, "int64": 64}[typ]
		if _, err := strconv.ParseInt(n.String(), 10, bits); err != nil {
			return fmt.Errorf("%s: %v is not an %s: %v", path, v, typ, err)
		}
	case "float", "double":
		switch x := v.(type) {
		case json.Number:
		case string:
			if x != "NaN" && x != "Infinity" && x != "-Infinity" {
				return fmt.Errorf("%s: %q is not a %s", path, x, typ)
			}
		default:
			return fmt.Errorf("%s: %v is not a %s", path, v, typ)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%s: %v is not a boolean", path, v)
		}
	case "string":
		if _, ok := v.(string); !ok {
			return fmt.Errorf("%s: %v is not a string", path, v)
		}
	case "bytes":
		x, ok := v.(string)
		if !ok {
			return fmt.Errorf("%s: %v is not bytes (base64)", path, v)
		}
		if _, err := base64.StdEncoding.DecodeString(x); err != nil {
			return fmt.Errorf("%s: %q is not base64: %v", path, x, err)
		}
	default:
		return fmt.Errorf("%s: schema type %v", path, typ)
	}
	return nil
}

func (s *dbzSink) Checkpoint(context.Context, *merge.Position) error { return nil }

// TestDebeziumFormat: the Debezium envelope of every fixture value (golden), for a backfilled
// row (op r, snapshot "incremental"), the same row's update from the stream (op u, the same
// after), a delete (op d, before: the key and nulls) and a truncate (op t); source.lsn,
// source.txId and source.ts_ms are the event's.
func TestDebeziumFormat(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`ALTER DATABASE ` + db.Name + ` SET TimeZone = 'America/Caracas'`)
	db.Exec(`ALTER DATABASE ` + db.Name + ` SET DateStyle = 'German'`)
	for _, s := range append(typeFixtures, edgeFixtures...) {
		db.Exec(s)
	}
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE ` + strings.Join(typeTables, ", "))
	ctx := context.Background()
	pcfg, err := pgx.ParseConfig(db.DSN)
	require.NoError(t, err)
	pgconf.Pin(&pcfg.Config, "test")
	conn, err := pgx.ConnectConfig(ctx, pcfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	enc := debezium.NewEncoder(pgjson.NewRegistry(conn))
	enc.Name, enc.Database = "shop", "app"
	enc.Now = func() time.Time { return time.Unix(1700000000, 0) }
	schemas := debezium.NewEncoder(pgjson.NewRegistry(conn))
	schemas.Name, schemas.Database, schemas.Now = "shop", "app", enc.Now
	schemas.Decimal, schemas.Schemas = pgjson.DecimalString, true
	sink := &dbzSink{enc: enc, schemas: schemas, recs: map[string][]string{}}
	var qualified []string
	for _, tb := range typeTables {
		qualified = append(qualified, "public."+tb)
	}
	cfg := engineConfig(db, qualified...)
	mem := newMemSink()
	require.NoError(t, runEngine(t, cfg, multiSink{sink, mem}, nil))
	// Under REPLICA IDENTITY FULL an update carries its row before it: before is filled.
	db.Exec(`ALTER TABLE times REPLICA IDENTITY FULL`)
	for _, tb := range typeTables {
		db.Exec(`UPDATE ` + tb + ` SET id = id`)
	}
	db.Exec(`DELETE FROM nums WHERE id = 1`)
	db.Exec(`TRUNCATE texts`)
	cfg.Source.CreateSlot = false
	require.NoError(t, runEngine(t, cfg, multiSink{sink, mem}, mem.last()))
	require.Empty(t, sink.errs)

	var golden strings.Builder
	for _, tb := range typeTables {
		recs := sink.recs[tb]
		require.NotEmpty(t, recs, "table %s", tb)
		// A row's update carries the after its backfilled record had: one form per value.
		after := map[string]string{}
		for _, r := range recs {
			fmt.Fprintf(&golden, "%s %s\n", tb, r)
			key, rest, _ := strings.Cut(r, " ")
			op, rest, _ := strings.Cut(rest, " ")
			format, val, _ := strings.Cut(rest, " ")
			if strings.HasPrefix(val, "error: ") {
				continue
			}
			key = format + " " + key
			var v struct{ After json.RawMessage }
			require.NoError(t, json.Unmarshal([]byte(val), &v))
			switch op {
			case "r":
				after[key] = string(v.After)
			case "u":
				require.Equal(t, after[key], string(v.After), "%s key %s: the backfill and the stream give different values", tb, key)
				var b struct{ Before json.RawMessage }
				require.NoError(t, json.Unmarshal([]byte(val), &b))
				if tb == "times" {
					require.Equal(t, after[key], string(b.Before), "%s key %s: REPLICA IDENTITY FULL gives the row before the update", tb, key)
				} else {
					require.Equal(t, "null", string(b.Before), "%s key %s", tb, key)
				}
			}
		}
	}
	path := filepath.Join("testdata", "TestDebeziumFormat.golden")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(golden.String()), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./e2e -run TestDebeziumFormat -update")
	require.Equal(t, string(want), golden.String())
	ops := map[string]bool{}
	for _, l := range strings.Split(golden.String(), "\n") {
		if f := strings.Fields(l); len(f) > 2 {
			ops[f[2]] = true
		}
	}
	require.Equal(t, []string{"d", "r", "t", "u"}, slices.Sorted(func(yield func(string) bool) {
		for k := range ops {
			if !yield(k) {
				return
			}
		}
	}))
}

// TestDebeziumFormatOutputs: `tidemark sync --format debezium` writes one envelope a line to a
// file and key and envelope records to Kafka (a delete followed by its tombstone); a run in the
// other format on the same output is refused before it writes.
func TestDebeziumFormatOutputs(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 50, 1)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	_, err := runSync(t, db, out, "--format", "debezium", "--stop-when-caught-up")
	require.NoError(t, err)
	db.Exec(`DELETE FROM t WHERE id = 3`)
	_, err = runSync(t, db, out, "--format", "debezium", "--stop-when-caught-up")
	require.NoError(t, err)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	ops := map[string]int{}
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var v struct {
			Op     string
			Before map[string]any
			After  map[string]any
		}
		require.NoError(t, json.Unmarshal(l, &v), "%s", l)
		ops[v.Op]++
		if v.Op == "d" {
			require.EqualValues(t, 3, v.Before["id"])
		}
	}
	require.Equal(t, map[string]int{"r": 50, "d": 1}, ops)
	vout, err := exec.Command(tidemarkBinary(t), "verify", "--source", db.DSN, "--tables", "public.t", "--to", out).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(vout), "holds records in the Debezium format: verify replays the tidemark format")
	_, err = runSync(t, db, out, "--stop-when-caught-up")
	require.ErrorContains(t, err, "would mix two formats")
	// Another decimal mode, or the schemas, on the same output: two forms of a column.
	_, err = runSync(t, db, out, "--format", "debezium", "--debezium-decimal", "string", "--stop-when-caught-up")
	require.ErrorContains(t, err, "a run with --format debezium --debezium-decimal string would mix two formats")
	_, err = runSync(t, db, out, "--format", "debezium", "--debezium-schemas", "--stop-when-caught-up")
	require.ErrorContains(t, err, "give --format debezium --debezium-decimal precise,")
	// An output an earlier Tidemark wrote in its own value forms ("debezium") is not continued.
	ckb, err := os.ReadFile(out + ".checkpoint")
	require.NoError(t, err)
	require.Contains(t, string(ckb), `"format": "debezium --debezium-decimal precise"`)
	legacy := filepath.Join(t.TempDir(), "legacy.jsonl")
	require.NoError(t, os.WriteFile(legacy, b, 0o644))
	require.NoError(t, os.WriteFile(legacy+".checkpoint", bytes.Replace(bytes.Replace(ckb, []byte(`"debezium --debezium-decimal precise"`), []byte(`"debezium"`), 1), []byte(`"out.jsonl"`), []byte(`"legacy.jsonl"`), 1), 0o644))
	_, err = runSync(t, db, legacy, "--format", "debezium", "--stop-when-caught-up")
	require.ErrorContains(t, err, "an earlier Tidemark wrote this one's Debezium envelopes with its own value forms")
	_, err = runSync(t, db, out, "--debezium-schemas", "--stop-when-caught-up")
	require.ErrorContains(t, err, "--debezium-schemas is for --format debezium")
	_, err = runSync(t, db, out, "--format", "debezium", "--debezium-decimal", "exact", "--stop-when-caught-up")
	require.ErrorContains(t, err, `--debezium-decimal "exact": give precise, double or string`)

	// With the schemas, each line is the JSON converter's {"schema","payload"}; a numeric NaN
	// stops a precise run with the fix, and a string run writes it.
	db3 := e2e.NewTestDB(t, server)
	db3.Exec(`CREATE DOMAIN ts3 AS timestamp(3)`) // its column takes the domain's precision
	db3.Exec(`CREATE TABLE t (id int PRIMARY KEY, v numeric(6,2), w numeric, ts ts3)`)
	db3.Exec(`INSERT INTO t VALUES (1, 12.34, 'NaN', '2024-02-29 13:14:15.5')`)
	out3 := filepath.Join(t.TempDir(), "out.jsonl")
	_, err = runSync(t, db3, out3, "--format", "debezium", "--debezium-schemas", "--stop-when-caught-up")
	require.ErrorContains(t, err, "give --debezium-decimal string (or double)")
	out3 = filepath.Join(t.TempDir(), "out.jsonl")
	_, err = runSync(t, db3, out3, "--format", "debezium", "--debezium-schemas", "--debezium-decimal", "string", "--stop-when-caught-up")
	require.NoError(t, err)
	b3, err := os.ReadFile(out3)
	require.NoError(t, err)
	var rec struct {
		Schema  map[string]any
		Payload struct {
			After map[string]any
			Op    string
		}
	}
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(b3), &rec), "%s", b3)
	require.Equal(t, "r", rec.Payload.Op)
	require.Equal(t, map[string]any{"id": 1.0, "v": "12.34", "w": "NAN", "ts": 1709212455500.0}, rec.Payload.After)
	require.Equal(t, "tidemark.public.t.Envelope", rec.Schema["name"])

	// An update that leaves a TOASTed value out: Debezium's placeholder without the schemas;
	// with them (where it fits few columns' schemas), the row read again whole instead.
	db5 := e2e.NewTestDB(t, server)
	db5.Exec(`CREATE TABLE t (id int PRIMARY KEY, big text, n int, xs float8[])`)
	db5.Exec(`ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL, ALTER COLUMN xs SET STORAGE EXTERNAL`)
	db5.Exec(`INSERT INTO t SELECT 1, repeat('x', 5000), 1, array_fill(0.5::float8, ARRAY[1000])`)
	lastLine := func(path string) map[string]any {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		ls := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
		var v map[string]any
		d := json.NewDecoder(bytes.NewReader(ls[len(ls)-1]))
		d.UseNumber()
		require.NoError(t, d.Decode(&v))
		if p, ok := v["payload"].(map[string]any); ok {
			require.NoError(t, conforms(v["schema"], p, "$"))
			return p
		}
		return v
	}
	plainOut, schemaOut := filepath.Join(t.TempDir(), "plain.jsonl"), filepath.Join(t.TempDir(), "schema.jsonl")
	db5s := *db5
	db5s.Slot += "_s"
	for _, run := range []func() error{
		func() error {
			_, err := runSync(t, db5, plainOut, "--format", "debezium", "--stop-when-caught-up")
			return err
		},
		func() error {
			_, err := runSync(t, &db5s, schemaOut, "--format", "debezium", "--debezium-schemas", "--stop-when-caught-up")
			return err
		},
	} {
		require.NoError(t, run())
	}
	db5.Exec(`UPDATE t SET n = 2`)
	_, err = runSync(t, db5, plainOut, "--format", "debezium", "--stop-when-caught-up")
	require.NoError(t, err)
	_, err = runSync(t, &db5s, schemaOut, "--format", "debezium", "--debezium-schemas", "--stop-when-caught-up")
	require.NoError(t, err)
	last := lastLine(plainOut)
	require.Equal(t, "u", last["op"])
	require.Equal(t, debezium.Unavailable, last["after"].(map[string]any)["big"])
	require.Equal(t, debezium.Unavailable, last["after"].(map[string]any)["xs"])
	last = lastLine(schemaOut)
	require.Equal(t, "r", last["op"], "the row read again whole")
	require.Equal(t, strings.Repeat("x", 5000), last["after"].(map[string]any)["big"])
	require.Len(t, last["after"].(map[string]any)["xs"], 1000)
	require.Equal(t, json.Number("2"), last["after"].(map[string]any)["n"])

	// NATS: the envelopes with their schemas, one a message; a delete's before has the key.
	naddr, _ := e2e.NATS(t)
	db4 := e2e.NewTestDB(t, server)
	versionedTable(t, db4, 10, 1)
	_, err = runSync(t, db4, naddr.String(), "--format", "debezium", "--debezium-schemas", "--stop-when-caught-up")
	require.NoError(t, err)
	db4.Exec(`DELETE FROM t WHERE id = 4`)
	_, err = runSync(t, db4, naddr.String(), "--format", "debezium", "--debezium-schemas", "--stop-when-caught-up")
	require.NoError(t, err)
	_, err = runSync(t, db4, naddr.String(), "--format", "debezium", "--stop-when-caught-up")
	require.ErrorContains(t, err, "would mix two formats")
	nc, err := naddr.Connect()
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	st, err := js.Stream(ctx, naddr.Stream)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	ops = map[string]int{}
	require.NoError(t, nats.Read(ctx, st, 1, info.State.LastSeq, func(m jetstream.Msg) error {
		var v map[string]any
		d := json.NewDecoder(bytes.NewReader(m.Data()))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			return err
		}
		if err := conforms(v["schema"], v["payload"], "$"); err != nil {
			return err
		}
		p := v["payload"].(map[string]any)
		ops[p["op"].(string)]++
		if p["op"] == "d" {
			require.Equal(t, json.Number("4"), p["before"].(map[string]any)["id"])
		}
		return nil
	}))
	require.Equal(t, map[string]int{"r": 10, "d": 1}, ops)

	addr := e2e.Kafka(t)
	db2 := e2e.NewTestDB(t, server)
	versionedTable(t, db2, 20, 1)
	_, err = runSync(t, db2, addr.String(), "--format", "debezium", "--kafka-partitions", "2", "--stop-when-caught-up")
	require.NoError(t, err)
	db2.Exec(`DELETE FROM t WHERE id = 5`)
	_, err = runSync(t, db2, addr.String(), "--format", "debezium", "--stop-when-caught-up")
	require.NoError(t, err)
	var envelopes, tombstones int
	require.NoError(t, kafka.ReadCommitted(context.Background(), addr, []string{kafka.TopicOf(addr.Prefix, "public", "t")}, func(r *kgo.Record) error {
		if r.Value == nil {
			tombstones++
			require.JSONEq(t, `{"id":5}`, string(r.Key))
			return nil
		}
		envelopes++
		var v struct{ Op string }
		require.NoError(t, json.Unmarshal(r.Value, &v))
		return nil
	}))
	require.Equal(t, 21, envelopes)
	require.Equal(t, 1, tombstones)
	_, err = runSync(t, db2, addr.String(), "--stop-when-caught-up")
	require.ErrorContains(t, err, "would mix two formats")
}

// TestDebeziumTypmodChanged: a column's type modifier changed without a rewrite (timestamp(3)
// to timestamp(6)) between the stream's last description of the table and a re-backfill: the
// backfilled rows take the modifier the chunk read (microseconds), not the stream's older one
// (milliseconds), since the stream says it anew with the next change. One form per value.
func TestDebeziumTypmodChanged(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY, ts timestamp(3))`)
	db.Exec(`INSERT INTO t SELECT g, '2024-02-29 13:14:15.5' FROM generate_series(1, 5) g`)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	_, err := runSync(t, db, out, "--format", "debezium", "--stop-when-caught-up", "--quiet")
	require.NoError(t, err)
	db.Exec(`UPDATE t SET id = id WHERE id = 1`) // described to the stream as timestamp(3)
	conn := db.Connect()
	defer conn.Close(context.Background())
	filenode := func() (n uint32) {
		require.NoError(t, conn.QueryRow(context.Background(), `SELECT pg_relation_filenode('t')`).Scan(&n))
		return n
	}
	before := filenode()
	db.Exec(`ALTER TABLE t ALTER COLUMN ts TYPE timestamp(6)`)
	require.Equal(t, before, filenode(), "raising a timestamp's precision does not rewrite the table")
	_, err = runSync(t, db, out, "--format", "debezium", "--stop-when-caught-up", "--quiet", "--rebackfill", "public.t", "--chunk-size", "2")
	require.NoError(t, err)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	var forms []string
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var v struct {
			Op    string
			After map[string]any
		}
		require.NoError(t, json.Unmarshal(l, &v), "%s", l)
		if v.After != nil {
			forms = append(forms, fmt.Sprintf("%s %v", v.Op, v.After["ts"]))
		} else {
			forms = append(forms, v.Op)
		}
	}
	// The first backfill in milliseconds, the re-backfill (after its refresh, t) in
	// microseconds.
	ms, us := "r 1.7092124555e+12", "r 1.7092124555e+15"
	require.Equal(t, []string{ms, ms, ms, ms, ms, "t", us, us, us, us, us}, forms)
}

// TestDebeziumTypmodChangedWhileBackfilling: the same change while a backfill runs, followed by
// an update (the stream says the new modifier): the chunks read after it are read again with
// the table's new definition, so the last backfilled rows and the update are in microseconds.
func TestDebeziumTypmodChangedWhileBackfilling(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY, ts timestamp(3))`)
	db.Exec(`INSERT INTO t SELECT g, '2024-02-29 13:14:15.5' FROM generate_series(1, 4000) g`)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	done := make(chan error, 1)
	go func() {
		_, err := runSync(t, db, out, "--format", "debezium", "--stop-when-caught-up", "--quiet", "--chunk-size", "10")
		done <- err
	}()
	e2e.WaitFor(t, time.Minute, "a part of the backfill", func() bool {
		b, _ := os.ReadFile(out)
		return bytes.Count(b, []byte("\n")) > 300
	})
	db.Exec(`ALTER TABLE t ALTER COLUMN ts TYPE timestamp(6)`)
	db.Exec(`UPDATE t SET id = id WHERE id = 1`)
	require.NoError(t, <-done)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	ls := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	var lastR, update string
	forms := map[string]int{}
	for _, l := range ls {
		var v struct {
			Op    string
			After map[string]json.RawMessage
		}
		require.NoError(t, json.Unmarshal(l, &v), "%s", l)
		switch v.Op {
		case "r":
			lastR = string(v.After["ts"])
			forms[lastR]++
		case "u":
			update = string(v.After["ts"])
		}
	}
	require.Equal(t, "1709212455500000", update)
	require.Equal(t, "1709212455500000", lastR, "the last backfilled row takes the new modifier")
	require.Positive(t, forms["1709212455500"], "the backfill was under way when the type changed: %v", forms)
}
