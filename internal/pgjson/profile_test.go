package pgjson

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func atyp(k kind) *Type { return &Type{Name: "t", kind: k, prof: Airbyte} }

// TestAirbyteForms: the Airbyte profile's form of each kind, from PostgreSQL's text under the
// pinned settings. The expected forms are those Airbyte's Java connector publishes in its
// datatype test (the inputs are the text PostgreSQL prints for that test's insert values); the
// end-to-end golden test (e2e TestAirbytePublishedForms) checks the same against a server.
func TestAirbyteForms(t *testing.T) {
	for _, tc := range []struct {
		k      kind
		in     string
		want   string
		lossy  bool
		reason string
	}{
		{kString, `\x1234`, `"\\x1234"`, false, "bytea: its hex text"},
		{kInterval, "P1Y2M3DT4H5M6S", `"1 year 2 mons 3 days 04:05:06"`, false, "published"},
		{kInterval, "PT-49444H-26M-40S", `"-49444:26:40"`, false, "published"},
		{kInterval, "PT49444H26M40S", `"49444:26:40"`, false, "published"},
		{kInterval, "PT0S", `"00:00:00"`, false, ""},
		{kInterval, "P-1DT-1S", `"-1 days -00:00:01"`, false, ""},
		{kInterval, "P1M-1D", `"1 mon -1 days"`, false, ""},
		{kInterval, "P-1Y2M", `"-1 years +2 mons"`, false, ""},
		{kInterval, "P1DT-0.5S", `"1 day -00:00:00.5"`, false, ""},
		{kInterval, "P-1DT1H", `"-1 days +01:00:00"`, false, ""},
		{kInterval, "P1000000Y", `"1000000 years"`, false, ""},
		{kGeometric, "(15,18),(3,7)", `"(15.0,18.0),(3.0,7.0)"`, false, "box, published"},
		{kGeometric, "<(-10,-4),10>", `"<(-10.0,-4.0),10.0>"`, false, "circle, published"},
		{kGeometric, "{4,5,6}", `"{4.0,5.0,6.0}"`, false, "line, published"},
		{kGeometric, "(1e+24,0)", `"(1.0E24,0.0)"`, false, "point, published"},
		{kGeometric, "((0,0),(1e+24,0))", `"((0.0,0.0),(1.0E24,0.0))"`, false, "polygon, published"},
		{kGeometric, "[(0.001,-0.5),(1234567.5,1e-05)]", `"[(0.001,-0.5),(1234567.5,1.0E-5)]"`, false, "Double.toString's ranges"},
		{kGeometric, "(NaN,-Infinity)", `"(NaN,-Infinity)"`, false, ""},
		{kDate, "1999-01-08", `"1999-01-08"`, false, "published"},
		{kDate, "1991-02-10 BC", `"1991-02-10 BC"`, false, "published"},
		{kDate, "12345-06-07", `"+12345-06-07"`, false, "java.time's yyyy"},
		{kDate, "infinity", "null", true, ""},
		{kTime, "13:00:01.01", `"13:00:01.010"`, false, "published"},
		{kTime, "13:00:02.000001", `"13:00:02.000001"`, false, "published"},
		{kTime, "13:00:03", `"13:00:03"`, false, "published"},
		{kTime, "13:00:05.01234", `"13:00:05.012340"`, false, "published"},
		{kTime, "13:00:00", `"13:00:00.000000"`, false, "published"},
		{kTime, "24:00:00", `"23:59:59.999999999"`, true, "published; the value changes"},
		{kTime, "13:00:00.5", `"13:00:00.500"`, false, ""},
		{kTimeTZ, "13:00:01+08", `"13:00:01+08:00"`, false, "published"},
		{kTimeTZ, "13:00:04+00", `"13:00:04Z"`, false, "published"},
		{kTimeTZ, "13:00:05.012345-08", `"13:00:05.012345-08:00"`, false, "published"},
		{kTimeTZ, "13:00:00+08", `"13:00:00.000000+08:00"`, false, "published (array)"},
		{kTimeTZ, "13:00:00+05:30:15", "null", true, "no form in format: time"},
		{kTimestamp, "2004-10-19 10:23:00", `"2004-10-19T10:23:00.000000"`, false, "published"},
		{kTimestamp, "2004-10-19 10:23:54.123456", `"2004-10-19T10:23:54.123456"`, false, "published"},
		{kTimestamp, "3004-10-19 10:23:54.123456 BC", `"3004-10-19T10:23:54.123456 BC"`, false, "published"},
		{kTimestamp, "0001-12-31 23:59:59.999999 BC", `"0001-12-31T23:59:59.999999 BC"`, false, "published"},
		{kTimestamp, "2004-10-19 10:23:54", `"2004-10-19T10:23:54"`, false, ""},
		{kTimestamp, "12345-06-07 08:09:10", `"+12345-06-07T08:09:10"`, false, ""},
		{kTimestamp, "-infinity", "null", true, ""},
		{kTimestampTZ, "2004-10-19 18:23:00+00", `"2004-10-19T18:23:00.000000Z"`, false, "published"},
		{kTimestampTZ, "2004-10-19 18:23:54.123456+00", `"2004-10-19T18:23:54.123456Z"`, false, "published"},
		{kTimestampTZ, "3004-10-19 18:23:54.123456+00 BC", `"3004-10-19T18:23:54.123456Z BC"`, false, "published"},
		{kTimestampTZ, "2004-10-19 18:23:54.5+00", `"2004-10-19T18:23:54.500000Z"`, false, ""},
		{kTimestampTZ, "infinity", "null", true, ""},
		{kHstore, `"weight"=>"11.2 ounces", "ISBN-13"=>"978-1449370000", "language"=>"English", "paperback"=>"243", "publisher"=>"postgresqltutorial.com"`,
			`"{\"ISBN-13\":\"978-1449370000\",\"weight\":\"11.2 ounces\",\"paperback\":\"243\",\"publisher\":\"postgresqltutorial.com\",\"language\":\"English\"}"`, false, "published: java.util.HashMap's order"},
		{kHstore, "\"a\"=>NULL, \"q\\\"\"=>\"x\ny\\\\\"", `"{\"a\":null,\"q\\\"\":\"x\\ny\\\\\"}"`, false, "a newline and a backslash in a value"},
		{kBitBool, "1", "true", false, "published"},
		{kBitBool, "0", "false", false, "published"},
		{kBitBool, "101", "null", true, "no boolean form"},
	} {
		got, lossy := enc(t, atyp(tc.k), tc.in)
		require.Equal(t, tc.want, got, "%s (%s)", tc.in, tc.reason)
		require.Equal(t, tc.lossy, lossy, "%s: lossy", tc.in)
	}
}

func TestJavaDouble(t *testing.T) {
	for in, want := range map[string]string{
		"123": "123.0", "1234567890.1234567": "1.2345678901234567E9", "0": "0.0", "-0": "-0.0", "0.001": "0.001",
		"0.0001": "1.0E-4", "9999999": "9999999.0", "10000000": "1.0E7", "-1.5": "-1.5", "1e-05": "1.0E-5", "3.4145": "3.4145",
		"1.7976931348623157e+308": "1.7976931348623157E308", "5e-324": "4.9E-324",
	} {
		got, err := javaDouble(nil, in)
		require.NoError(t, err)
		require.Equal(t, want, string(got), in)
	}
}

// TestJavaHashMapOrder: the iteration order of java.util.HashMap, including its growth (past 12
// keys to 32 buckets, past 24 to 64).
func TestJavaHashMapOrder(t *testing.T) {
	keys := func(ss ...string) [][]byte {
		var out [][]byte
		for _, s := range ss {
			out = append(out, []byte(s))
		}
		return out
	}
	// "Aa" and "BB" share their hash: insertion order within the bucket.
	require.Equal(t, []int{0, 1}, javaHashMapOrder(keys("Aa", "BB")))
	require.Equal(t, []int{1, 0}, javaHashMapOrder(keys("b", "a")))
	// Single characters hash to their code: 'a' (97) and 'q' (113) share bucket 1 of 16, and
	// are parted once the table has 32 buckets.
	require.Equal(t, []int{0, 1}, javaHashMapOrder(keys("q", "a")))
	many := keys("q", "a", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m")
	order := javaHashMapOrder(many)
	require.Equal(t, "a", string(many[order[0]]), "32 buckets: a (97 & 31 = 1) before q (113 & 31 = 17)")
}

func TestAirbyteArrays(t *testing.T) {
	ints := &Type{kind: kArray, prof: Airbyte, elem: atyp(kInteger), delim: ','}
	ivs := &Type{kind: kArray, prof: Airbyte, untyped: true, delim: ',', elem: &Type{kind: kText, prof: Airbyte, elem: atyp(kInterval)}}
	texts := &Type{kind: kArray, prof: Airbyte, untyped: true, delim: ',', elem: &Type{kind: kText, prof: Airbyte, elem: atyp(kString)}}
	bits := &Type{kind: kArray, prof: Airbyte, elem: atyp(kBitBool), delim: ','}
	byteas := &Type{kind: kArray, prof: Airbyte, elem: atyp(kBytea), delim: ','}
	for _, tc := range []struct {
		ty    *Type
		in    string
		want  string
		lossy bool
	}{
		{ints, "{1,2,3}", "[1,2,3]", false},
		{ints, "{{1,2},{3,NULL}}", "[[1,2],[3,null]]", false},
		{ints, "[0:1]={7,8}", "[7,8]", true},
		{ivs, `{P1D,PT1H,NULL}`, `["1 day","01:00:00",null]`, false},
		{texts, `{"{\"foo\": \"bar\"}",NULL}`, `["{\"foo\": \"bar\"}",null]`, false},
		{bits, "{NULL,1,0}", "[null,true,false]", false},
		{byteas, `{"\\x00ff"}`, `["AP8="]`, false},
	} {
		got, lossy := enc(t, tc.ty, tc.in)
		require.Equal(t, tc.want, got, tc.in)
		require.Equal(t, tc.lossy, lossy, tc.in)
	}
	b, _ := json.Marshal(ints.Schema(1))
	require.JSONEq(t, `{"type":["null","array"],"items":{"type":["null","integer","array"]}}`, string(b))
	b, _ = json.Marshal(texts.Schema(1))
	require.JSONEq(t, `{"type":["null","array"]}`, string(b), "an untyped array: no items, as the Java connector's")
	b, _ = json.Marshal(byteas.Schema(1))
	require.JSONEq(t, `{"type":["null","array"],"items":{"type":["null","string","array"]}}`, string(b))
}

// TestAirbyteComposites: a composite is its text, as a string; an interval inside it is
// rendered as a session of IntervalStyle postgres prints it, and re-quoted as record_out does.
func TestAirbyteComposites(t *testing.T) {
	pair := &Type{Name: "pair", kind: kComposite, prof: Airbyte, fields: []Field{{"n", atyp(kInteger)}, {"s", atyp(kString)}}}
	got, lossy := enc(t, pair, `("fuzzy dice",42)`)
	require.Equal(t, `"(\"fuzzy dice\",42)"`, got, "published: the text as it is")
	require.False(t, lossy)
	withIv := &Type{Name: "w", kind: kComposite, prof: Airbyte, fields: []Field{
		{"i", atyp(kInterval)}, {"a", &Type{kind: kArray, prof: Airbyte, untyped: true, delim: ',', elem: &Type{kind: kText, prof: Airbyte, elem: atyp(kInterval)}}}, {"t", atyp(kString)},
	}}
	got, _ = enc(t, withIv, `(P1DT2H,"{PT0S,P1Y}",)`)
	require.Equal(t, `"(\"1 day 02:00:00\",\"{00:00:00,\"\"1 year\"\"}\",)"`, got)
	empty := &Type{Name: "e", kind: kComposite, prof: Airbyte}
	got, _ = enc(t, empty, `()`)
	require.Equal(t, `"()"`, got)
	b, _ := json.Marshal(pair.Schema(0))
	require.JSONEq(t, `{"type":["null","string"]}`, string(b))
}

// TestExactEdgeCases: the exact profile's forms of the values an outside review found off their
// schema or lost.
func TestExactEdgeCases(t *testing.T) {
	vec := typ(kVector)
	got, lossy := enc(t, vec, "1 2 3")
	require.Equal(t, "[1,2,3]", got, "int2vector and oidvector print without braces")
	require.False(t, lossy)
	got, _ = enc(t, vec, "")
	require.Equal(t, "[]", got)
	empty := &Type{Name: "e", kind: kComposite}
	got, _ = enc(t, empty, "()")
	require.Equal(t, "{}", got, "a type without attributes")
	nums := &Type{kind: kArray, elem: typ(kNumber), delim: ','}
	got, lossy = enc(t, nums, "{1,NaN,-Infinity}")
	require.Equal(t, "[1,null,null]", got)
	require.True(t, lossy, "NaN inside an array is marked")
	pair := &Type{Name: "p", kind: kComposite, fields: []Field{{"x", typ(kNumber)}, {"d", typ(kDate)}}}
	got, lossy = enc(t, pair, "(NaN,infinity)")
	require.Equal(t, `{"x":null,"d":null}`, got)
	require.True(t, lossy, "NaN and infinity inside a composite are marked")
}
