package chunker

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chunker/tuple"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func table(keys ...int) *Table {
	t := &Table{Schema: "public", Name: "Order Items", Columns: []Column{
		{Name: "tenant", TypeOID: 2950, BaseOID: 2950}, {Name: "id", TypeOID: 20, BaseOID: 20}, {Name: `we"ird`, TypeOID: 25, BaseOID: 25},
	}}
	t.Key = keys
	for _, k := range keys {
		t.KeyOps = append(t.KeyOps, CatalogOps(t.Columns[k].BaseOID))
	}
	return t
}

// citextTable is table with its first column's type from an extension in public.
func citextTable(keys ...int) *Table {
	t := table(keys...)
	for i, k := range keys {
		if k == 0 {
			t.KeyOps[i] = Ops{Less: "OPERATOR(public.<)", LessEq: "OPERATOR(public.<=)", Eq: "OPERATOR(public.=)",
				GreaterEq: "OPERATOR(public.>=)", Greater: "OPERATOR(public.>)", Cast: "::public.citext", Param: 16400}
		}
	}
	return t
}

// TestSQLGolden: the chunk queries of a single and a composite key, with quoted identifiers,
// bound parameters and the key columns' own operators (a citext key's from public; a composite
// key with operators in two schemas compared column by column).
func TestSQLGolden(t *testing.T) {
	var b strings.Builder
	for _, tc := range []struct {
		name string
		t    *Table
	}{{"single key", table(1)}, {"composite key", table(0, 1)}, {"citext key", citextTable(0)},
		{"composite key, operators in two schemas", citextTable(0, 1)}, {"three columns, operators in two schemas", citextTable(0, 1, 2)}} {
		fmt.Fprintf(&b, "# %s\n", tc.name)
		for _, q := range []struct {
			name         string
			after, upper bool
		}{{"first chunk", false, true}, {"next chunk", true, true}, {"unbounded", false, false}, {"after only", true, false}} {
			fmt.Fprintf(&b, "%s:\n%s\n", q.name, ChunkSQL(tc.t, q.after, q.upper, 1000))
		}
		fmt.Fprintf(&b, "max key:\n%s\n", MaxKeySQL(tc.t))
		fmt.Fprintf(&b, "three keys:\n%s\n", KeysSQL(tc.t, 3))
		fmt.Fprintf(&b, "their types: %v\n\n", KeysParams(tc.t, 3))
	}
	path := filepath.Join("testdata", "sql.golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./chunker -run TestSQLGolden -update")
	require.Equal(t, string(want), b.String())
}

func TestCanonicalNumeric(t *testing.T) {
	for in, want := range map[string]string{
		"1": "1", "1.0": "1", "1.10": "1.1", "-0.00": "0", "0.000": "0", "100": "100", "100.0100": "100.01",
		"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity", "-12.50": "-12.5", "0.5": "0.5",
	} {
		require.Equal(t, want, string(canonicalNumeric([]byte(in))), in)
	}
}

// TestKeyEquality: stored keys equal under the key type's = operator encode to the same bytes;
// different ones to different bytes.
func TestKeyEquality(t *testing.T) {
	key := func(oid uint32, v string) string {
		tb := &Table{Name: "t", Columns: []Column{{Name: "k", TypeOID: oid, BaseOID: oid}}, Key: []int{0}}
		b, err := tb.AppendKey(nil, [][]byte{[]byte(v)})
		require.NoError(t, err)
		return string(b)
	}
	for _, tc := range []struct {
		oid      uint32
		a, b     string
		wantSame bool
	}{
		{oidNumeric, "1.0", "1.00", true},
		{oidNumeric, "1.0", "1.01", false},
		{oidFloat8, "-0", "0", true},
		{oidFloat8, "NaN", "NaN", true},
		{oidFloat8, "0.1", "0.10000000000000001", true},
		{oidFloat8, "Infinity", "1e308", false},
		{oidInt8, "007", "7", true},
		{oidUUID, "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", true},
		{oidBytea, `\x00ff`, `\x00FF`, true},
		{oidText, "a", "A", false},
		{oidText, "é", "e\u0301", false},
		{oidBool, "t", "f", false},
	} {
		require.Equal(t, tc.wantSame, key(tc.oid, tc.a) == key(tc.oid, tc.b), "%d: %q vs %q", tc.oid, tc.a, tc.b)
	}
}

const oidText = 25

// TestKeyEncoding: keys are FoundationDB tuples of typed elements.
func TestKeyEncoding(t *testing.T) {
	tb := table(0, 1, 2)
	b, err := tb.AppendKey(nil, [][]byte{[]byte("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), []byte("-5"), []byte("x\x00y")})
	require.NoError(t, err)
	got, err := tuple.Unpack(b)
	require.NoError(t, err)
	require.Equal(t, tuple.Tuple{tuple.UUID{0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, 0x11}, int64(-5), "x\x00y"}, got)
	_, err = tb.AppendKey(nil, [][]byte{[]byte("nope"), []byte("1"), []byte("x")})
	require.ErrorContains(t, err, `key column "tenant"`)
	_, err = tb.AppendKey(nil, [][]byte{[]byte("1")})
	require.ErrorContains(t, err, "has 3 columns, got 1 values")
}

func TestParseSnapshot(t *testing.T) {
	s, err := ParseSnapshot("724:730:725,727")
	require.NoError(t, err)
	require.Equal(t, Snapshot{Xmin: 724, Xmax: 730, Xip: []uint64{725, 727}}, s)
	s, err = ParseSnapshot("5:5:")
	require.NoError(t, err)
	require.Equal(t, Snapshot{Xmin: 5, Xmax: 5}, s)
	for _, bad := range []string{"", "1:2", "a:2:", "1:b:", "1:2:x"} {
		_, err := ParseSnapshot(bad)
		require.Error(t, err, bad)
	}
}

func TestParseInt(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "-1": -1, "42": 42, "9223372036854775807": 9223372036854775807, "-9223372036854775808": -9223372036854775808} {
		got, ok := parseInt([]byte(in))
		require.True(t, ok, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "-", "9223372036854775808", "-9223372036854775809", "1.0", "x", "99999999999999999999"} {
		_, ok := parseInt([]byte(bad))
		require.False(t, ok, bad)
	}
}

// TestMembershipKept: a membership change keeps the table published all along only when both
// looks share a catalog row without a row filter, and publish_via_partition_root did not change.
func TestMembershipKept(t *testing.T) {
	for _, c := range []struct {
		before, now string
		kept        bool
	}{
		{"rel:10", "rel:10,schema:20", true},                      // its schema added
		{"rel:10,schema:20", "schema:20", true},                   // then dropped from the list
		{"schema:20", "rel:30,schema:20", true},                   // and back
		{"all", "all,rel:10", true},                               // FOR ALL TABLES stays
		{"rel:10", "schema:20", false},                            // two steps between two looks
		{"rel:10", "rel:11", false},                               // dropped and added again
		{"rel:10", "", false},                                     // left
		{"", "rel:10", false},                                     // no membership recorded
		{"rel:10:filter:ab", "rel:10:filter:ab,schema:20", false}, // more rows published than the output has
		{"rel:10", "rel:10,rel:11:filter:ab", false},              // a row filter added (through another row of its tree)
		{"rel:10,via_root", "rel:10", false},                      // publish_via_partition_root off
		{"via_root", "via_root,rel:10", false},                    // a token of a flag alone shares no row
	} {
		require.Equal(t, c.kept, MembershipKept(c.before, c.now, false), "%q -> %q", c.before, c.now)
		// A partition may be a member through an ancestor, which DETACH takes away: never kept.
		require.False(t, MembershipKept(c.before, c.now, true), "a partition: %q -> %q", c.before, c.now)
	}
}
