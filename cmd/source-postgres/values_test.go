package main

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// valueCase is one column of TestValueFormsBothProfiles: its type and value, its JSON form in
// each profile, and the meta.changes entry each profile's record carries for it ("" for none).
type valueCase struct {
	col, typ, value        string
	airbyte, exact         string // JSON
	airbyteMeta, exactMeta string // NULLED, TRUNCATED or ""
}

var valueCases = []valueCase{
	{"b", "bytea", `'\x00ff'`, `"\\x00ff"`, `"AP8="`, "", ""},
	{"j", "jsonb", `'{"a": [1, 2]}'`, `"{\"a\": [1, 2]}"`, `"{\"a\": [1, 2]}"`, "", ""},
	{"h", "hstore", `'b=>2, a=>NULL'`, `"{\"a\":null,\"b\":\"2\"}"`, `{"a":null,"b":"2"}`, "", ""},
	{"c", "pair", `ROW(1, 'x y')`, `"(1,\"x y\")"`, `{"n":1,"s":"x y"}`, "", ""},
	{"iv", "interval", `'1 day 02:00:00'`, `"1 day 02:00:00"`, `"P1DT2H"`, "", ""},
	{"n", "numeric", `'NaN'`, `null`, `null`, "NULLED", "NULLED"},
	{"na", "numeric[]", `'{1,NaN}'`, `[1,null]`, `[1,null]`, "TRUNCATED", "TRUNCATED"},
	{"lb", "int[]", `'[0:1]={7,8}'`, `[7,8]`, `[7,8]`, "TRUNCATED", "TRUNCATED"},
	{"d", "date", `'infinity'`, `null`, `null`, "NULLED", "NULLED"},
	{"dbc", "date", `'0044-03-15 BC'`, `"0044-03-15 BC"`, `"0044-03-15 BC"`, "", ""},
	{"ts", "timestamptz", `'2024-01-01 00:00:00+00'`, `"2024-01-01T00:00:00.000000Z"`, `"2024-01-01T00:00:00Z"`, "", ""},
	{"tz", "timetz", `'12:00:00+05:30:15'`, `null`, `null`, "NULLED", "NULLED"},
	{"t", "time", `'24:00:00'`, `"23:59:59.999999999"`, `"24:00:00"`, "TRUNCATED", ""},
	{"v", "int2vector", `'1 2'`, `"1 2"`, `[1,2]`, "", ""},
	{"nd", "numdate", `ROW('NaN', '2024-01-01')`, `"(NaN,2024-01-01)"`, `{"x":null,"d":"2024-01-01"}`, "", "TRUNCATED"},
	{"n0", "numeric(10,0)", `12`, `12`, `12`, "", ""},
	{"pt", "point", `'(1,2.5)'`, `"(1.0,2.5)"`, `"(1,2.5)"`, "", ""},
	{"ia", "int[]", `'{{1,2},{3,4}}'`, `[[1,2],[3,4]]`, `[[1,2],[3,4]]`, "", ""},
}

// recordData decodes a RECORD's data and its meta.changes as field → change.
func recordData(t *testing.T, m msg) (map[string]json.RawMessage, map[string]string) {
	t.Helper()
	var r struct {
		Record struct {
			Data map[string]json.RawMessage `json:"data"`
			Meta struct {
				Changes []struct{ Field, Change, Reason string } `json:"changes"`
			} `json:"meta"`
		} `json:"record"`
	}
	require.NoError(t, json.Unmarshal(m.raw, &r))
	changes := map[string]string{}
	for _, c := range r.Record.Meta.Changes {
		require.Equal(t, "SOURCE_SERIALIZATION_ERROR", c.Reason)
		changes[c.Field] = c.Change
	}
	return r.Record.Data, changes
}

// streamSchema returns the json_schema the catalog file gives stream name.
func streamSchema(t *testing.T, catalogPath, name string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(catalogPath)
	require.NoError(t, err)
	var c struct {
		Streams []struct {
			Stream struct {
				Name       string         `json:"name"`
				JSONSchema map[string]any `json:"json_schema"`
			} `json:"stream"`
		} `json:"streams"`
	}
	require.NoError(t, json.Unmarshal(b, &c))
	for _, s := range c.Streams {
		if s.Stream.Name == name {
			return s.Stream.JSONSchema
		}
	}
	t.Fatalf("no stream %s in the catalog", name)
	return nil
}

// TestValueFormsBothProfiles: the connector writes Airbyte's forms by default and the exact
// forms with value_forms exact; in each, a row backfilled and the same values streamed give the
// same data and the same meta.changes; every value whose JSON form is not the whole value has an
// entry (NULLED when written as null, TRUNCATED when written in part: a NaN element, an array's
// lower bounds, the Java connector's 23:59:59.999999999 for 24:00:00), and no other value has
// one; every record validates against its stream's discovered schema.
func TestValueFormsBothProfiles(t *testing.T) {
	for _, profile := range []string{"", "airbyte", "exact"} {
		t.Run("value_forms="+profile, func(t *testing.T) {
			e := newEnv(t)
			if profile != "" {
				e.cfg["value_forms"] = profile
			}
			e.db.Exec(`CREATE EXTENSION IF NOT EXISTS hstore`)
			e.db.Exec(`CREATE TYPE pair AS (n int, s text)`)
			e.db.Exec(`CREATE TYPE numdate AS (x numeric, d date)`)
			cols := []string{"id int PRIMARY KEY"}
			var vals []string
			for _, c := range valueCases {
				cols = append(cols, c.col+" "+c.typ)
				vals = append(vals, c.value)
			}
			e.db.Exec(`CREATE TABLE vals (` + strings.Join(cols, ", ") + `)`)
			e.db.Exec(`INSERT INTO vals VALUES (1, ` + strings.Join(vals, ", ") + `)`)
			e.db.Exec(`INSERT INTO vals (id) VALUES (2)`)
			e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE vals`)
			cat := e.catalog()
			r1 := e.read(cat, nil)
			// The same values again, through the stream.
			e.db.Exec(`INSERT INTO vals SELECT 3, ` + strings.Join(func() []string {
				var c []string
				for _, v := range valueCases {
					c = append(c, v.col)
				}
				return c
			}(), ", ") + ` FROM vals WHERE id = 1`)
			r2 := e.read(cat, r1.lastState(t))

			schema, err := e2e.CompileSchema(streamSchema(t, cat, "vals"))
			require.NoError(t, err)
			rows := map[string]map[string]json.RawMessage{}
			changes := map[string]map[string]string{}
			for _, m := range append(r1.records(), r2.records()...) {
				data, ch := recordData(t, m)
				id := string(data["id"])
				rows[id], changes[id] = data, ch
				b, _ := json.Marshal(data)
				inst, err := jsonschema.UnmarshalJSON(strings.NewReader(string(b)))
				require.NoError(t, err)
				require.NoError(t, schema.Validate(inst), "record %s does not validate against the discovered schema", b)
			}
			require.Len(t, rows, 3)
			require.Empty(t, changes["2"], "NULLs are not changes")
			for _, c := range valueCases {
				want, meta := c.airbyte, c.airbyteMeta
				if profile == "exact" {
					want, meta = c.exact, c.exactMeta
				}
				for _, id := range []string{"1", "3"} {
					require.JSONEq(t, want, string(rows[id][c.col]), "%s %s (row %s)", c.typ, c.value, id)
					require.Equal(t, meta, changes[id][c.col], "meta.changes of %s %s (row %s)", c.typ, c.value, id)
				}
				require.Equal(t, string(rows["1"][c.col]), string(rows["3"][c.col]), "%s: the backfill and the stream give different bytes", c.col)
			}
			require.Len(t, changes["1"], len(changes["3"]))
		})
	}
}

// TestDiscoverLikeAirbyte: a partitioned table is one stream (its root), not one beside each of
// its partitions; views and materialized views are full refresh only; a table with a column
// named as a CDC metadata column keeps that column's schema and is offered as full refresh only,
// and a catalog that syncs it incrementally anyway fails the read with a config error naming the
// column and the fix, rather than writing the name twice in a record.
func TestDiscoverLikeAirbyte(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE events (id int, at date, v text, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)`)
	e.db.Exec(`CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01') PARTITION BY RANGE (id)`)
	e.db.Exec(`CREATE TABLE events_2024_low PARTITION OF events_2024 FOR VALUES FROM (0) TO (100)`)
	e.db.Exec(`CREATE TABLE events_2025 PARTITION OF events FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`)
	e.db.Exec(`INSERT INTO events VALUES (1, '2024-05-01', 'a'), (2, '2025-05-01', 'b')`)
	e.db.Exec(`CREATE TABLE plain (id int PRIMARY KEY, v text)`)
	e.db.Exec(`INSERT INTO plain VALUES (1, 'x')`)
	e.db.Exec(`CREATE VIEW plain_view AS SELECT * FROM plain`)
	e.db.Exec(`CREATE MATERIALIZED VIEW plain_mat AS SELECT * FROM plain`)
	e.db.Exec(`CREATE TABLE clash (id int PRIMARY KEY, _ab_cdc_lsn text)`)
	e.db.Exec(`INSERT INTO clash VALUES (1, 'mine')`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE events, plain, clash WITH (publish_via_partition_root = true)`)

	r := e.run("discover", "--config", e.config())
	require.Equal(t, 0, r.code, r.stderr)
	streams := map[string]map[string]any{}
	for _, s := range r.ofType("CATALOG")[0].get("catalog", "streams").([]any) {
		st := s.(map[string]any)
		streams[st["name"].(string)] = st
	}
	names := make([]string, 0, len(streams))
	for n := range streams {
		names = append(names, n)
	}
	slices.Sort(names)
	require.Equal(t, []string{"clash", "events", "plain", "plain_mat", "plain_view"}, names, "partitions are not listed beside their root")
	modes := func(n string) []any { return streams[n]["supported_sync_modes"].([]any) }
	require.Equal(t, []any{"full_refresh", "incremental"}, modes("events"))
	require.Equal(t, []any{"full_refresh", "incremental"}, modes("plain"))
	require.Equal(t, []any{"full_refresh"}, modes("plain_view"))
	require.Equal(t, []any{"full_refresh"}, modes("plain_mat"))
	require.Equal(t, []any{"full_refresh"}, modes("clash"))
	clashProps := streams["clash"]["json_schema"].(map[string]any)["properties"].(map[string]any)
	require.Equal(t, map[string]any{"type": []any{"null", "string"}}, clashProps["_ab_cdc_lsn"], "the table's own column")
	require.NotContains(t, clashProps, "_ab_cdc_updated_at")
	require.Contains(t, r.stderr, "_ab_cdc_lsn", "the discover log says why clash is full refresh only")

	// Every stream read: the partitioned table's rows once, the views' rows, the clashing table's
	// own value under its name.
	cat := e.catalog()
	read := e.read(cat, nil)
	byStream := map[string][]map[string]json.RawMessage{}
	for _, m := range read.records() {
		stream, data := recordOf(t, m)
		byStream[stream] = append(byStream[stream], data)
	}
	require.Len(t, byStream["public.events"], 2)
	require.Len(t, byStream["public.plain_view"], 1)
	require.Len(t, byStream["public.plain_mat"], 1)
	require.Len(t, byStream["public.clash"], 1)
	require.JSONEq(t, `"mine"`, string(byStream["public.clash"][0]["_ab_cdc_lsn"]))

	// The clashing table synced incrementally anyway (a catalog edited by hand, or a column
	// added after discover): refused, naming the column and the fix.
	b, err := os.ReadFile(cat)
	require.NoError(t, err)
	var c map[string]any
	require.NoError(t, json.Unmarshal(b, &c))
	for _, s := range c["streams"].([]any) {
		cs := s.(map[string]any)
		st := cs["stream"].(map[string]any)
		if st["name"] == "clash" {
			cs["sync_mode"], cs["destination_sync_mode"] = "incremental", "append_dedup"
			props := st["json_schema"].(map[string]any)["properties"].(map[string]any)
			props["_ab_cdc_updated_at"] = map[string]any{"type": []any{"null", "string"}}
		}
	}
	failed := e.run("read", "--config", e.config(), "--catalog", e.file("clash.json", c))
	require.NotEqual(t, 0, failed.code)
	errs := failed.traces("ERROR")
	require.Len(t, errs, 1)
	require.Equal(t, "config_error", errs[0].str("trace", "error", "failure_type"))
	msg := errs[0].str("trace", "error", "message")
	require.Contains(t, msg, "public.clash")
	require.Contains(t, msg, "_ab_cdc_lsn")
	require.Contains(t, msg, "RENAME COLUMN")
	for _, m := range failed.records() {
		stream, _ := recordOf(t, m)
		require.NotEqual(t, "public.clash", stream, "no record of the clashing table")
	}
}
