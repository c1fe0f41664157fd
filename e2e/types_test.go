package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
)

var update = flag.Bool("update", false, "rewrite e2e/testdata/*.golden")

// typeFixtures are one table per type family, with edge values, filled before the backfill.
var typeFixtures = []string{
	`CREATE EXTENSION IF NOT EXISTS citext`,
	`CREATE EXTENSION IF NOT EXISTS hstore`,
	`CREATE EXTENSION IF NOT EXISTS cube`,
	`CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')`,
	`CREATE DOMAIN posint AS int CHECK (VALUE > 0)`,
	`CREATE DOMAIN email AS text`,
	`CREATE TYPE pair AS (n int, s text)`,
	`CREATE TYPE outer_t AS (p pair, a int[], t timestamptz)`,

	`CREATE TABLE nums (id int PRIMARY KEY, i2 smallint, i4 int, i8 bigint, n numeric, n2 numeric(10,2), r real, d double precision, m money, o oid)`,
	`INSERT INTO nums VALUES
		(1, -32768, 2147483647, -9223372036854775808, 123456789012345678901234567890.123456789, 1.10, 0.1, 1e300, 12.34, 4294967295),
		(2, 32767, -2147483648, 9223372036854775807, 'NaN', -0.50, 'Infinity', '-Infinity', -3, 0),
		(3, 0, 0, 0, 'Infinity', 0, 'NaN', '-0', 0, 1),
		(4, 1, 1, 1, '-Infinity', 99999999.99, 3.4028235e38, 2.2250738585072014e-308, 92233720368547758.07, 2),
		(5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)`,

	`CREATE TABLE texts (id int PRIMARY KEY, t text, vc varchar(10), c char(5), ci citext, nm name, b bytea, bo boolean, u uuid)`,
	`INSERT INTO texts VALUES
		(1, E'h\u00e9llo "q" \\ \n\ttab \u2603 \U0001F600', 'short', 'ab', 'MiXeD', 'pg_name', '\x00ff10', true, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'),
		(2, '', '', '', '', '', '', false, '00000000-0000-0000-0000-000000000000'),
		(3, E'\x01ctl', 'NULL', '  ', 'x', 'y', E'\\x', NULL, NULL),
		(4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)`,

	`CREATE TABLE times (id int PRIMARY KEY, d date, t time, tz timetz, ts timestamp, tstz timestamptz, iv interval)`,
	`INSERT INTO times VALUES
		(1, '2024-02-29', '13:14:15.123456', '13:14:15+05:30', '2024-02-29 13:14:15.5', '2024-02-29 13:14:15.123456+02', '1 year 2 mons 3 days 04:05:06.5'),
		(2, '0044-03-15 BC', '24:00:00', '00:00:00-08', '0044-03-15 10:00:00 BC', '0044-03-15 10:00:00+00 BC', '-1 day -00:00:01'),
		(3, 'infinity', '00:00:00', '23:59:59.999999+14', 'infinity', 'infinity', '0'),
		(4, '-infinity', '12:00:00', '12:00:00+00', '-infinity', '-infinity', '1000000 years'),
		(5, '12345-06-07', '01:02:03', '01:02:03-12:30', '12345-06-07 08:09:10', '12345-06-07 08:09:10+00', '1 mon -1 day'),
		(6, NULL, NULL, NULL, NULL, NULL, NULL)`,

	`CREATE TABLE jsons (id int PRIMARY KEY, j json, jb jsonb)`,
	`INSERT INTO jsons VALUES
		(1, '{"a": 1,   "a": 2 }', '{"b": [1, 2.50, null], "a": "x\u00e9"}'),
		(2, '"just a string"', 'null'),
		(3, '[1, 2.50e3, true]', '123.450'),
		(4, NULL, NULL)`,

	`CREATE TABLE arrays (id int PRIMARY KEY, ia int[], ta text[], ia2 int[][], na numeric[], tsa timestamptz[], ea mood[], ba bytea[], bx box[], ja jsonb[], ca pair[])`,
	`INSERT INTO arrays VALUES
		(1, '{1,2,NULL}', ARRAY['a"b', 'c,d', NULL, 'NULL', ' sp ', '', E'back\\slash'], '{{1,NULL},{3,4}}', '{1.5,NaN,-0.00}',
		 ARRAY['2024-01-01 00:00:00+00'::timestamptz, 'infinity'], '{sad,happy}', ARRAY['\x00'::bytea, '\xff'], '{(1,2),(3,4);(5,6),(7,8)}',
		 ARRAY['{"a":1}'::jsonb, '[]'], ARRAY[ROW(1, 'x')::pair, ROW(NULL, 'y "q"')::pair]),
		(2, '[0:2]={7,8,9}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}'),
		(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)`,

	`CREATE TABLE usertypes (id int PRIMARY KEY, e mood, dn posint, dt email, c pair, nest outer_t, r int4range, tr tstzrange, nr numrange, mr int4multirange)`,
	`INSERT INTO usertypes VALUES
		(1, 'happy', 7, 'a@b.c', ROW(1, 'a b'), ROW(ROW(2, 'x,y'), '{1,2}', '2024-01-01 00:00:00+00'), '[1,10)', '[2024-01-01,infinity)', '(1.5,2.50]', '{[1,3),[5,7)}'),
		(2, 'sad', 1, '', ROW(NULL, NULL), ROW(NULL, NULL, NULL), 'empty', '(,)', '[-Infinity,0]', '{}'),
		(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)`,

	`CREATE TABLE misc (id int PRIMARY KEY, ip inet, cd cidr, mac macaddr, mac8 macaddr8, bt bit(4), vb varbit, pt point, ln line, ls lseg, bx box,
		pa path, pg polygon, ci circle, tv tsvector, tq tsquery, x xml, h hstore, lsn pg_lsn, cu cube, g int GENERATED ALWAYS AS (id * 2) STORED)`,
	`INSERT INTO misc VALUES
		(1, '192.168.1.5/24', '10.0.0.0/8', '08:00:2b:01:02:03', '08:00:2b:01:02:03:04:05', B'0101', B'110', '(1,2)', '{1,-1,0}', '[(0,0),(1,1)]',
		 '(3,4),(1,2)', '[(0,0),(1,1),(2,0)]', '((0,0),(1,1),(1,0))', '<(0,0),5>', 'a fat:2 cat', 'fat & (rat | cat)', '<a x="1">t&amp;</a>',
		 '"k"=>"v", "n"=>NULL, "q\""=>"\\"', '16/B374D848', '(1,2),(3,4)'),
		(2, '::1', '2001:db8::/32', 'ff:ff:ff:ff:ff:ff', 'ff:ff:ff:ff:ff:ff:ff:ff', B'0000', B'', '(-1.5,0)', '{1,0,-3}', '[(1,1),(1,1)]',
		 '(0,0),(0,0)', '((0,0),(1,1))', '((0,0))', '<(1,1),0.5>', '', '!a', '', '', '0/0', '(1)'),
		(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)`,
}

// edgeFixtures are the values an outside review found lost or off their schema (issue 13, item
// 7), one column each, with the reg* types under a database search_path other than the default.
var edgeFixtures = []string{
	`CREATE TYPE nothing AS ()`,
	`CREATE TYPE numdate AS (x numeric, d date)`,
	`CREATE TYPE witharr AS (a int[])`,
	`CREATE TYPE withiv AS (i interval, a interval[], t text)`,
	`CREATE DOMAIN intarr AS int[]`,
	`CREATE SCHEMA s2`,
	`CREATE TABLE s2.t2 (id int)`,
	`CREATE TYPE s2.kind AS ENUM ('a')`,
	`CREATE TABLE edges (id int PRIMARY KEY, na numeric[], fa float8[], nd numdate, lb int[], lb2 int[], i2v int2vector, oidv oidvector,
		nothing nothing, tz timetz, ia int[], da intarr, wa witharr, wi withiv, b3 bit(3)[], rc regclass, rt regtype, rcs regclass[])`,
	`INSERT INTO edges VALUES
		(1, '{1.5,NaN,Infinity}', '{1,NaN,-Infinity}', ROW('NaN', 'infinity'), '[0:2]={7,8,9}', '[2:3][1:1]={{1},{2}}', '1 2 3', '23 25',
		 ROW(), '12:00:00+05:30:15', '{{1,2},{3,4}}', '{{1},{2}}', ROW('{{1,2},{3,4}}'), ROW('1 day 02:00:00', '{1 year,NULL}', 'x y'),
		 '{101,000}', 's2.t2', 's2.kind', '{s2.t2,public.edges}'),
		(2, '{}', '{0.5}', ROW(1.5, '2024-02-29'), '{7}', '{{1}}', '', '', NULL, '12:00:00+05:30', '{1}', '{1}', ROW('{}'), ROW('-1 day -00:00:01', '{}', NULL),
		 '{}', 'pg_class', 'int4', '{}'),
		(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)`,
}

var typeTables = []string{"nums", "texts", "times", "jsons", "arrays", "usertypes", "misc", "edges"}

// jsonRowSink keeps, per table and key, the JSON object of the latest snapshot row and of the
// latest update, each value encoded by its column's type in the sink's profile, with the
// columns whose value is marked lossy.
type jsonRowSink struct {
	types    *pgjson.Registry
	mu       sync.Mutex
	snapshot map[string]map[string]string // table → key → JSON object [" lossy:" columns]
	updated  map[string]map[string]string
}

func newJSONRowSink(types *pgjson.Registry) *jsonRowSink {
	return &jsonRowSink{types: types, snapshot: map[string]map[string]string{}, updated: map[string]map[string]string{}}
}

func (s *jsonRowSink) Emit(ctx context.Context, evs []merge.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range evs {
		if ev.Op != merge.Snapshot && ev.Op != merge.Update {
			continue
		}
		var b bytes.Buffer
		var lossy []string
		b.WriteByte('{')
		for i, name := range ev.Columns.Names {
			t, err := s.types.Type(ctx, ev.Columns.Types[i])
			if err != nil {
				return err
			}
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(pgjson.AppendString(nil, name))
			b.WriteByte(':')
			v := ev.Col(i)
			switch v.Kind {
			case replicator.Null:
				b.WriteString("null")
			case replicator.Text:
				out, l, err := s.types.Append(ctx, t, nil, v.Data)
				if err != nil {
					return fmt.Errorf("%s.%s: %w", ev.Columns.Table, name, err)
				}
				b.Write(out)
				if l {
					lossy = append(lossy, name)
				}
			default:
				return fmt.Errorf("%s.%s: value of kind %q", ev.Columns.Table, name, byte(v.Kind))
			}
		}
		b.WriteByte('}')
		if len(lossy) > 0 {
			b.WriteString(" lossy:" + strings.Join(lossy, ","))
		}
		m := s.snapshot
		if ev.Op == merge.Update {
			m = s.updated
		}
		key, _ := ev.Value("id")
		if m[ev.Columns.Table] == nil {
			m[ev.Columns.Table] = map[string]string{}
		}
		m[ev.Columns.Table][key] = b.String()
	}
	return nil
}

func (s *jsonRowSink) Checkpoint(context.Context, *merge.Position) error { return nil }

// captureBothPaths backfills the tables (public schema) of db's publication, then updates every
// row (SET id = id) and streams the updates, with one sink per profile, each with its own
// Registry on its own pinned connection: every value goes through both paths and both profiles.
func captureBothPaths(t *testing.T, db *e2e.TestDB, tables []string) map[pgjson.Profile]*jsonRowSink {
	ctx := context.Background()
	sinks := map[pgjson.Profile]*jsonRowSink{}
	multi := multiSink{}
	for _, p := range []pgjson.Profile{pgjson.Exact, pgjson.Airbyte} {
		pcfg, err := pgx.ParseConfig(db.DSN)
		require.NoError(t, err)
		pgconf.Pin(&pcfg.Config, "test")
		conn, err := pgx.ConnectConfig(ctx, pcfg)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close(context.Background()) })
		sinks[p] = newJSONRowSink(pgjson.NewProfileRegistry(conn, p))
		multi = append(multi, sinks[p])
	}
	qualified := make([]string, len(tables))
	for i, tb := range tables {
		qualified[i] = "public." + tb
	}
	cfg := engineConfig(db, qualified...)
	mem := newMemSink()
	multi = append(multi, mem)
	require.NoError(t, runEngine(t, cfg, multi, nil))
	for _, tb := range tables {
		db.Exec(`UPDATE ` + tb + ` SET id = id`)
	}
	cfg.Source.CreateSlot = false
	require.NoError(t, runEngine(t, cfg, multi, mem.last()))
	return sinks
}

// TestTypeFidelity: every fixture value has one JSON form (golden), the same bytes whether the
// backfill read it or the stream carried it (an UPDATE of every row during streaming), and every
// row validates against the JSON schema of its table.
func TestTypeFidelity(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	// Session defaults that differ from the pinned settings must not matter.
	db.Exec(`ALTER DATABASE ` + db.Name + ` SET TimeZone = 'America/Caracas'`)
	db.Exec(`ALTER DATABASE ` + db.Name + ` SET DateStyle = 'German'`)
	db.Exec(`ALTER DATABASE ` + db.Name + ` SET IntervalStyle = 'postgres_verbose'`)
	db.Exec(`ALTER DATABASE ` + db.Name + ` SET extra_float_digits = 0`)
	db.Exec(`ALTER DATABASE ` + db.Name + ` SET bytea_output = 'escape'`)
	db.Exec(`ALTER DATABASE ` + db.Name + ` SET search_path = s2, public`)
	for _, s := range append(typeFixtures, edgeFixtures...) {
		db.Exec(s)
	}
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE ` + strings.Join(typeTables, ", "))
	ctx := context.Background()
	sinks := captureBothPaths(t, db, typeTables)
	for _, p := range []pgjson.Profile{pgjson.Exact, pgjson.Airbyte} {
		sink := sinks[p]
		var golden strings.Builder
		for _, tb := range typeTables {
			schema, err := sink.types.TableSchema(ctx, "public", tb)
			require.NoError(t, err)
			validator := compileSchema(t, schema)
			keys := make([]string, 0, len(sink.snapshot[tb]))
			for k := range sink.snapshot[tb] {
				keys = append(keys, k)
			}
			slices.SortFunc(keys, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y })
			require.NotEmpty(t, keys, "table %s was backfilled", tb)
			for _, k := range keys {
				snap := sink.snapshot[tb][k]
				require.Equal(t, snap, sink.updated[tb][k], "%s: %s row %s: the backfill and the stream give different JSON", p, tb, k)
				obj, _, _ := strings.Cut(snap, " lossy:")
				inst, err := jsonschema.UnmarshalJSON(strings.NewReader(obj))
				require.NoError(t, err)
				require.NoError(t, validator.Validate(inst), "%s: %s row %s does not validate against its schema: %s", p, tb, k, snap)
				fmt.Fprintf(&golden, "%s %s %s\n", tb, k, snap)
			}
			b, _ := json.Marshal(schema)
			fmt.Fprintf(&golden, "%s schema %s\n", tb, b)
		}
		name := "TestTypeFidelity.golden"
		if p != pgjson.Exact {
			name = "TestTypeFidelity." + p.String() + ".golden"
		}
		path := filepath.Join("testdata", name)
		if *update {
			require.NoError(t, os.MkdirAll("testdata", 0o755))
			require.NoError(t, os.WriteFile(path, []byte(golden.String()), 0o644))
		}
		want, err := os.ReadFile(path)
		require.NoError(t, err, "run go test ./e2e -run TestTypeFidelity -update")
		require.Equal(t, string(want), golden.String(), "profile %s", p)
	}
}

// multiSink hands the engine's output to several sinks.
type multiSink []merge.Sink

func (m multiSink) Emit(ctx context.Context, evs []merge.Event) error {
	for _, s := range m {
		if err := s.Emit(ctx, evs); err != nil {
			return err
		}
	}
	return nil
}

func (m multiSink) Checkpoint(ctx context.Context, p *merge.Position) error {
	for _, s := range m {
		if err := s.Checkpoint(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// compileSchema compiles a JSON schema for validation.
func compileSchema(t *testing.T, schema map[string]any) *jsonschema.Schema {
	t.Helper()
	s, err := e2e.CompileSchema(schema)
	require.NoError(t, err)
	return s
}

// TestUnchangedTOAST: a 1 MB text and a 100 kB bytea that an UPDATE of another column leaves
// unchanged (pgoutput does not send them), under REPLICA IDENTITY DEFAULT and FULL, during the
// backfill (the update evicts the chunk's row, which held the only whole copy) and after it: the
// replayed output has the whole values, and never a NULL for them.
func TestUnchangedTOAST(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"DEFAULT", "FULL", "DEFAULT/RereadPartial"} {
		identity, rereadPartial := strings.CutSuffix(mode, "/RereadPartial")
		t.Run(mode, func(t *testing.T) {
			db := e2e.NewTestDB(t, server)
			db.Exec(`CREATE SEQUENCE ver`)
			db.Exec(`CREATE TABLE toast (id int PRIMARY KEY, n int, big text, blob bytea, ver bigint NOT NULL DEFAULT nextval('ver'))`)
			db.Exec(`ALTER TABLE toast ALTER COLUMN big SET STORAGE EXTERNAL, ALTER COLUMN blob SET STORAGE EXTERNAL`)
			db.Exec(`ALTER TABLE toast REPLICA IDENTITY ` + identity)
			db.Exec(`INSERT INTO toast (id, n, big, blob) SELECT g, 0,
				(SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 32768) i),
				(SELECT decode(string_agg(md5(i::text || g::text), ''), 'hex') FROM generate_series(1, 6400) i)
				FROM generate_series(1, 12) g`)
			db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE toast`)
			cfg := engineConfig(db, "public.toast")
			cfg.ChunkSize = 4
			cfg.RereadPartial = rereadPartial
			bump := `UPDATE toast SET n = n + 1, ver = nextval('ver') WHERE id = %d`
			cfg.Hooks.AfterSelect = onChunk(t, db, 1, fmt.Sprintf(bump, 2), fmt.Sprintf(bump, 3))
			sink := newMemSink()
			require.NoError(t, runEngine(t, cfg, sink, nil))
			// After the backfill: the update merges into the row the output already has.
			db.Exec(fmt.Sprintf(bump, 9))
			// A key change that leaves the TOASTed values alone (found by the chaos harness):
			// the new key's row has no row to merge into, so it is read again whole.
			db.Exec(`UPDATE toast SET id = 100, ver = nextval('ver') WHERE id = 10`)
			cfg.Source.CreateSlot = false
			cfg.Hooks = merge.Hooks{}
			require.NoError(t, runEngine(t, cfg, sink, sink.last()))
			verify(t, db, sink, "public.toast", "id")
			for _, r := range sink.records {
				if r.Op == "update" && identity == "DEFAULT" {
					require.False(t, rereadPartial, "with RereadPartial no update without its TOASTed values is emitted")
					require.NotContains(t, r.Values, "big", "an unchanged value is absent, not null")
				}
				if v, ok := r.Values["big"]; ok {
					require.NotNil(t, v, "a TOASTed value is never a NULL")
					require.Len(t, *v, 1<<20)
				}
			}
			switch {
			case rereadPartial:
				require.Equal(t, []string{"snapshot"}, opsOnly(sink.of("public.toast", "2")), "the row is read again whole instead")
				require.Equal(t, []string{"snapshot", "snapshot"}, opsOnly(sink.of("public.toast", "9")), "after the backfill too")
				require.Equal(t, []string{"snapshot"}, opsOnly(sink.of("public.toast", "100")), "a new key is read whole")
			case identity == "DEFAULT":
				require.Equal(t, []string{"update", "snapshot"}, opsOnly(sink.of("public.toast", "2")), "the evicted row is read again")
				require.Equal(t, []string{"insert", "snapshot"}, opsOnly(sink.of("public.toast", "100")), "a new key without its TOASTed values is read again whole")
			default:
				require.Equal(t, []string{"update"}, opsOnly(sink.of("public.toast", "2")), "the old row fills the values")
				require.Equal(t, []string{"insert"}, opsOnly(sink.of("public.toast", "100")), "the old row fills the values of the new key")
			}
		})
	}
}

func opsOnly(rs []e2e.Record) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Op)
	}
	return out
}

// TestKeysRoundTripNonUTC: a numeric key and a timestamptz key, backfilled one row per chunk on
// a server whose TimeZone is not UTC: every key's text bound as the next chunk's lower bound
// parses back to exactly that key, so none is skipped or read twice.
func TestKeysRoundTripNonUTC(t *testing.T) {
	e2e.NeedsOwned(t, server, "changes the server's TimeZone")
	db := e2e.NewTestDB(t, server)
	ctx := context.Background()
	_, err := db.Conn.Exec(ctx, `ALTER SYSTEM SET TimeZone = 'Australia/Lord_Howe'`)
	require.NoError(t, err)
	_, err = db.Conn.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Conn.Exec(ctx, `ALTER SYSTEM RESET TimeZone`)
		_, _ = db.Conn.Exec(ctx, `SELECT pg_reload_conf()`)
	})
	db.Exec(`CREATE TABLE nk (k numeric PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO nk VALUES (0.1, 'a'), (0.10000000000000000001, 'b'), (1.500, 'c'), (-2.25, 'd'), (1e-20, 'e'), (12345678901234567890.123456789012345678, 'f'), (7, 'g'), (7.0000001, 'h')`)
	db.Exec(`CREATE TABLE tk (k timestamptz PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO tk VALUES ('2024-04-07 01:59:59.999999+11', 'a'), ('2024-04-07 02:00:00+10:30', 'b'), ('2024-10-06 02:00:00+10:30', 'c'),
		('1969-12-31 23:59:59.000001+00', 'd'), ('0001-01-01 00:00:00+00 BC', 'e'), ('294276-12-31 23:59:59.999999+00', 'f'), ('2000-01-01 00:00:00.5-14', 'g')`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE nk, tk`)
	cfg := engineConfig(db, "public.nk", "public.tk")
	cfg.ChunkSize, cfg.ChunkGrowth = 1, 1 // one key per chunk: every key boundary crossed
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.nk", "k")
	verify(t, db, sink, "public.tk", "k")
	require.Equal(t, 15, sink.count("snapshot"))
	require.Zero(t, sink.oracle.Duplicates())
	require.Equal(t, int64(9), sink.last().Tables["public.nk"].Chunks, "one chunk per key, and the last finds none")
}

// TestHotRowReadWhole: a row whose updates never stop, each leaving a TOASTed value out (a
// counter beside a large jsonb, REPLICA IDENTITY DEFAULT), still gets out whole during its
// table's backfill, with no lock. Here the rows are updated inside every window (after each
// chunk's SELECT), the worst case: reading such a row again after the change, as before, lost to
// the next change forever. A window whose changes of the row all left the value alone (and so
// kept it) fills it from the chunk's row instead. With RereadPartial (the connector: only whole
// rows go out, and each such update asks for the row to be read again) the same.
// toastedTable creates table (id, n, doc jsonb, ver) with rows rows, each doc an array of items
// md5 texts kept out of line (STORAGE EXTERNAL: TOASTed once over about 2 kB), and the test
// publication of it.
func toastedTable(db *e2e.TestDB, table string, rows, items int) {
	db.Exec(`CREATE SEQUENCE ver`)
	db.Exec(`CREATE TABLE ` + table + ` (id int PRIMARY KEY, n int, doc jsonb, ver bigint NOT NULL DEFAULT nextval('ver'))`)
	db.Exec(`ALTER TABLE ` + table + ` ALTER COLUMN doc SET STORAGE EXTERNAL`)
	db.Exec(fmt.Sprintf(`INSERT INTO %s (id, n, doc) SELECT g, 0, (SELECT jsonb_agg(md5(g::text || i::text)) FROM generate_series(1, %d) i)
		FROM generate_series(1, %d) g`, table, items, rows))
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE ` + table)
}

func TestHotRowReadWhole(t *testing.T) {
	t.Parallel()
	for _, rereadPartial := range []bool{false, true} {
		t.Run(fmt.Sprint("RereadPartial=", rereadPartial), func(t *testing.T) {
			db := e2e.NewTestDB(t, server)
			toastedTable(db, "hot", 40, 2000)
			cfg := engineConfig(db, "public.hot")
			cfg.ChunkSize = 5
			cfg.RereadPartial = rereadPartial
			cfg.StopWhenCaughtUp = false
			updater := db.Connect()
			var hooked sync.Mutex
			cfg.Hooks.AfterSelect = func(ctx context.Context, _ int64) {
				hooked.Lock()
				defer hooked.Unlock()
				if _, err := updater.Exec(ctx, `UPDATE hot SET n = n + 1, ver = nextval('ver') WHERE id IN (3, 17)`); err != nil && ctx.Err() == nil {
					t.Errorf("update: %v", err)
				}
			}
			sink := newMemSink()
			done, stopIt := backgroundEngine(t, cfg, sink, nil)
			whole := func(key string) int {
				n := 0
				for _, r := range sink.of("public.hot", key) {
					if r.Op == "snapshot" {
						n++
					}
				}
				return n
			}
			require.Eventually(t, func() bool {
				select {
				case <-done:
					return true // stopped: said below
				default:
				}
				p := sink.last()
				if p == nil || p.Tables["public.hot"] == nil || !p.Tables["public.hot"].Done {
					return false
				}
				return len(p.Tables["public.hot"].Reread) == 0 && whole("3") >= 1 && whole("17") >= 1
			}, 60*time.Second, 100*time.Millisecond, "the hot rows got out whole while they were updated in every window")
			select {
			case <-done:
				t.Fatalf("the capture stopped: %v", stopIt())
			default:
			}
			require.ErrorIs(t, stopIt(), context.Canceled)
			cfg.Source.CreateSlot, cfg.StopWhenCaughtUp, cfg.Hooks = false, true, merge.Hooks{}
			require.NoError(t, runEngine(t, cfg, sink, sink.last()))
			verify(t, db, sink, "public.hot", "id")
		})
	}
}
