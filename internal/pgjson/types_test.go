package pgjson

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func typ(k kind) *Type { return &Type{Name: "t", kind: k} }

func enc(t *testing.T, ty *Type, text string) (string, bool) {
	t.Helper()
	out, nulled, err := ty.Append(nil, []byte(text))
	require.NoError(t, err, text)
	require.True(t, json.Valid(out), "%s -> %s", text, out)
	return string(out), nulled
}

// TestScalarForms: the JSON form of each kind, from PostgreSQL's text output under the pinned
// session settings.
func TestScalarForms(t *testing.T) {
	for _, tc := range []struct {
		k      kind
		in     string
		want   string
		nulled bool
	}{
		{kInteger, "-9223372036854775808", "-9223372036854775808", false},
		{kNumber, "123456789012345678901234567890.123456789000", "123456789012345678901234567890.123456789000", false},
		{kNumber, "NaN", "null", true},
		{kNumber, "-Infinity", "null", true},
		{kNumber, "1e+30", "1e+30", false},
		{kNumber, "-0", "-0", false},
		{kMoney, "$1,234.50", "1234.50", false},
		{kMoney, "-$3.00", "-3.00", false},
		{kBool, "t", "true", false},
		{kBytea, `\x00ff10`, `"AP8Q"`, false},
		{kDate, "0044-03-15 BC", `"0044-03-15 BC"`, false},
		{kDate, "12345-01-01", `"+12345-01-01"`, false},
		{kDate, "infinity", "null", true},
		{kDate, "-infinity", "null", true},
		{kTime, "24:00:00", `"24:00:00"`, false},
		{kTimeTZ, "12:34:56-08", `"12:34:56-08:00"`, false},
		{kTimeTZ, "12:34:56+05:30", `"12:34:56+05:30"`, false},
		{kTimeTZ, "12:34:56+00", `"12:34:56+00:00"`, false},
		{kTimeTZ, "12:34:56+05:30:15", "null", true},
		{kTimestamp, "2024-01-01 10:00:00.5 BC", `"2024-01-01T10:00:00.5 BC"`, false},
		{kTimestamp, "infinity", "null", true},
		{kTimestamp, "12345-06-07 08:09:10", `"+12345-06-07T08:09:10"`, false},
		{kTimestampTZ, "2024-01-01 10:00:00.123456+00", `"2024-01-01T10:00:00.123456Z"`, false},
		{kTimestampTZ, "0044-03-15 10:00:00+00 BC", `"0044-03-15T10:00:00Z BC"`, false},
		{kTimestampTZ, "-infinity", "null", true},
		{kString, "P1Y2M3DT4H5M6.5S", `"P1Y2M3DT4H5M6.5S"`, false},
		{kString, "a\"b\\c\n", `"a\"b\\c\n"`, false},
		{kHstore, `"a"=>"1", "q\""=>"x", "b c"=>NULL`, `{"a":"1","q\"":"x","b c":null}`, false},
	} {
		got, nulled := enc(t, typ(tc.k), tc.in)
		require.Equal(t, tc.want, got, tc.in)
		require.Equal(t, tc.nulled, nulled, tc.in)
	}
	for _, tc := range []struct {
		k  kind
		in string
	}{{kInteger, "1.5"}, {kNumber, "abc"}, {kBool, "yes"}, {kBytea, "00"}, {kMoney, "€3"}} {
		_, _, err := typ(tc.k).Append(nil, []byte(tc.in))
		require.Error(t, err, tc.in)
	}
}

func TestArrays(t *testing.T) {
	ints := &Type{Name: "int4[]", kind: kArray, elem: typ(kInteger), delim: ','}
	texts := &Type{Name: "text[]", kind: kArray, elem: typ(kString), delim: ','}
	boxes := &Type{Name: "box[]", kind: kArray, elem: typ(kString), delim: ';'}
	nums := &Type{Name: "numeric[]", kind: kArray, elem: typ(kNumber), delim: ','}
	for _, tc := range []struct {
		ty     *Type
		in     string
		want   string
		nulled bool
	}{
		{ints, "{}", "[]", false},
		{ints, "{1,2,NULL}", "[1,2,null]", false},
		{ints, "{{1,NULL},{3,4}}", "[[1,null],[3,4]]", false},
		{ints, "[2:3]={1,2}", "[1,2]", true},
		{texts, `{"a\"b","c,d",NULL,"NULL"," sp ",plain}`, `["a\"b","c,d",null,"NULL"," sp ","plain"]`, false},
		{boxes, "{(3,4),(1,2);(7,8),(5,6)}", `["(3,4),(1,2)","(7,8),(5,6)"]`, false},
		{nums, "{1.5,NaN}", "[1.5,null]", true},
	} {
		got, nulled := enc(t, tc.ty, tc.in)
		require.Equal(t, tc.want, got, tc.in)
		require.Equal(t, tc.nulled, nulled, tc.in)
	}
	for _, bad := range []string{"{1,2", "1,2}", `{"a}`, "{1}x", "[1:2]{1}"} {
		_, _, err := ints.Append(nil, []byte(bad))
		require.Error(t, err, bad)
	}
}

func TestComposites(t *testing.T) {
	inner := &Type{Name: "pair", kind: kComposite, fields: []Field{{"n", typ(kInteger)}, {"s", typ(kString)}}}
	outer := &Type{Name: "outer", kind: kComposite, fields: []Field{
		{"p", inner}, {"a", &Type{kind: kArray, elem: typ(kInteger), delim: ','}}, {"t", typ(kString)}, {"e", typ(kString)},
	}}
	got, _ := enc(t, outer, `("(1,x)","{1,2}",,"")`)
	require.Equal(t, `{"p":{"n":1,"s":"x"},"a":[1,2],"t":null,"e":""}`, got)
	got, _ = enc(t, inner, `(2,"a ""q"" \\b")`)
	require.Equal(t, `{"n":2,"s":"a \"q\" \\b"}`, got)
	_, _, err := inner.Append(nil, []byte("(1,2,3)"))
	require.Error(t, err)
}

func TestSchemas(t *testing.T) {
	ints := &Type{kind: kArray, elem: typ(kInteger), delim: ','}
	// Declared dimensions are not enforced by PostgreSQL: items may be arrays at any depth.
	for _, dims := range []int{0, 1, 2} {
		b, _ := json.Marshal(ints.Schema(dims))
		require.JSONEq(t, `{"type":["null","array"],"items":{"type":["null","integer","array"]}}`, string(b))
	}
	b, _ := json.Marshal(typ(kTimestampTZ).Schema(0))
	require.JSONEq(t, `{"type":["null","string"],"format":"date-time","airbyte_type":"timestamp_with_timezone"}`, string(b))
}

func FuzzParsers(f *testing.F) {
	for _, s := range []string{"{1,{2,3}}", `("(1,x)","{1,2}",,"")`, `"a"=>"1", "b"=>NULL`, "[1:2]={a,b}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, _, _ = parseArray([]byte(s), ',')
		_, _ = parseComposite([]byte(s))
		_, _, _ = parseHstore([]byte(s))
	})
}

// TestCompositeAmbiguousAcrossChanges: addr(street, city), then ADD ATTRIBUTE zip, then DROP
// ATTRIBUTE street: a value printed before both changes, ("1 Main St",Paris), parses as the
// current (city, zip) too. The text cannot say which it is: the current reading is written and
// marked lossy, so the caller keeps the value's text beside it. Found by an adversarial review.
func TestCompositeAmbiguousAcrossChanges(t *testing.T) {
	s := typ(kString)
	d := &compositeDef{
		fields: []Field{{"city", s}, {"zip", s}},
		all:    []attr{{Field: Field{Name: "street"}, dropped: true}, {Field: Field{"city", s}}, {Field: Field{"zip", s}}},
	}
	h := &compositeHolder{}
	h.def.Store(d)
	addr := &Type{Name: "addr", kind: kComposite, comp: h}
	out, lossy, err := addr.Append(nil, []byte(`("1 Main St",Paris)`))
	require.NoError(t, err)
	require.JSONEq(t, `{"city":"1 Main St","zip":"Paris"}`, string(out))
	require.True(t, lossy, "an ambiguous value is marked")
	// A value only the current definition reads is not.
	n := typ(kInteger)
	d2 := &compositeDef{fields: []Field{{"a", n}, {"c", n}}, all: []attr{{Field: Field{"a", n}}, {Field: Field{Name: "b"}, dropped: true}, {Field: Field{"c", n}}}}
	h2 := &compositeHolder{}
	h2.def.Store(d2)
	pair := &Type{Name: "pair", kind: kComposite, comp: h2}
	_, lossy, err = pair.Append(nil, []byte(`(3,33)`))
	require.NoError(t, err)
	require.True(t, lossy, "(3,33) could also be (a, b) from before b was dropped")
}

func TestArrayElement(t *testing.T) {
	for _, c := range []struct {
		in    string
		delim byte
		want  string
		null  bool
	}{
		{`{7}`, ',', "7", false},
		{`{happy}`, ',', "happy", false},
		{`{"a,b \"c\" \\d"}`, ',', `a,b "c" \d`, false},
		{`{"(1,\"x y\")"}`, ',', `(1,"x y")`, false},
		{`{"(1,2),(0,0)"}`, ';', "(1,2),(0,0)", false},
		{`{NULL}`, ',', "", true},
		{`{"NULL"}`, ',', "NULL", false},
		{`[0:0]={5}`, ',', "5", false},
	} {
		got, null, err := ArrayElement(c.in, c.delim)
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got, c.in)
		require.Equal(t, c.null, null, c.in)
	}
	for _, bad := range []string{`{}`, `{1,2}`, `{{1}}`, `7`, `{"x`} {
		_, _, err := ArrayElement(bad, ',')
		require.Error(t, err, bad)
	}
}

// TestQuoting: an array element and a composite field as PostgreSQL's array_out and record_out
// write them, written out by hand: quoted when empty, NULL-like (arrays) or holding a special
// character; inside, an array escapes quotes and backslashes with a backslash, a composite
// doubles them.
func TestQuoting(t *testing.T) {
	for in, want := range map[string]string{``: `""`, `NULL`: `"NULL"`, `null`: `"null"`, `a b`: `"a b"`, `a\b`: `"a\\b"`, `q"`: `"q\""`, `x`: `x`, `{}`: `"{}"`} {
		require.Equal(t, want, string(quoteArrayElement(nil, []byte(in), ',')), "array element %q", in)
	}
	for in, want := range map[string]string{``: `""`, `a b`: `"a b"`, `a\b`: `"a\\b"`, `q"`: `"q"""`, `(x)`: `"(x)"`, `x`: `x`} {
		require.Equal(t, want, string(quoteRecordField(nil, []byte(in))), "composite field %q", in)
	}
}

// TestIsInteger: what goes out as a JSON number unquoted must be one.
func TestIsInteger(t *testing.T) {
	for in, want := range map[string]bool{"0": true, "-12": true, "": false, "-": false, "1.5": false, "1e3": false, "+1": false, "--1": false} {
		require.Equal(t, want, isInteger([]byte(in)), "%q", in)
	}
}

// TestParseStampOffsets: the zone offsets PostgreSQL prints (±HH, ±HH:MM, ±HH:MM:SS) parse, with
// seconds noted; anything else is refused.
func TestParseStampOffsets(t *testing.T) {
	for _, tc := range []struct {
		in   string
		ok   bool
		secs bool
	}{
		{"12:34:56+05", true, false},
		{"12:34:56-05:30", true, false},
		{"12:34:56+05:30:15", true, true},
		{"12:34:56+05:", false, false},
		{"12:34:56+05:3", false, false},
		{"12:34:56+0530", false, false},
		{"12:34:56+05:30:15:00", false, false},
		{"12:34:56+05::30", false, false},
		{"12:34:56+5", false, false},
		{"12:34:56+05:3a", false, false},
		{"12:34:56+", false, false},
	} {
		st, err := parseStamp([]byte(tc.in), false, true, true)
		require.Equal(t, tc.ok, err == nil, "%s: %v", tc.in, err)
		if tc.ok {
			require.Equal(t, tc.secs, st.offsetSecs, tc.in)
		}
	}
}

// BenchmarkAppendTimestampTZ: a timestamptz value in each profile, as the bench table's ts column
// (one in every row of a backfill); allocations per value are the figure to watch.
func BenchmarkAppendTimestampTZ(b *testing.B) {
	text := []byte("2026-11-30 09:41:17.123456+00")
	for _, prof := range []Profile{Exact, Airbyte} {
		b.Run(prof.String(), func(b *testing.B) {
			t := &Type{Name: "timestamptz", kind: kTimestampTZ, prof: prof}
			dst := make([]byte, 0, 64)
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if dst, _, err = t.Append(dst[:0], text); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
