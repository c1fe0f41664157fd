package pgjson

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// epochDay is java.time's LocalDate.toEpochDay by Go's calendar (also proleptic Gregorian, year
// 0 being 1 BC): an oracle the encoder's own arithmetic does not share.
func epochDay(y, m, d int) int64 {
	return time.Date(y, time.Month(m), d, 0, 0, 0, 0, time.UTC).Unix() / 86400
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// TestDebeziumForms: each type's value in Debezium's form, worked out by hand (or by Go's
// calendar) from Debezium's connector's rules, not by the encoder's code.
func TestDebeziumForms(t *testing.T) {
	ty := func(base string) *Type { return &Type{Name: base, base: base} }
	arr := func(elem string) *Type { return &Type{Name: "_" + elem, kind: kArray, elem: ty(elem), delim: ','} }
	numeric := func(prec, scale int32) int32 { return (prec<<16 | scale&0x7ff) + 4 }
	cases := []struct {
		t      *Type
		typmod int32
		mode   DecimalMode
		text   string
		want   string
	}{
		{ty("bool"), -1, 0, "t", "true"},
		{ty("int2"), -1, 0, "-32768", "-32768"},
		{ty("int8"), -1, 0, "9223372036854775807", "9223372036854775807"},
		{ty("float8"), -1, 0, "1e+300", "1e+300"},
		{ty("float8"), -1, 0, "NaN", `"NaN"`},
		{ty("float4"), -1, 0, "-Infinity", `"-Infinity"`},
		// numeric(10,2): Kafka Connect's Decimal, 1234 = 0x04D2; -300 = 0xFED4; 150 = 0x0096.
		{ty("numeric"), numeric(10, 2), DecimalPrecise, "12.34", `"BNI="`},
		{ty("numeric"), numeric(10, 2), DecimalPrecise, "-3.00", `"/tQ="`},
		{ty("numeric"), numeric(10, 2), DecimalPrecise, "1.50", `"AJY="`},
		{ty("numeric"), numeric(10, 2), DecimalPrecise, "0.00", `"AA=="`},
		// numeric(5,-2): 12300 is 123 at scale -2.
		{ty("numeric"), numeric(5, -2), DecimalPrecise, "12300", `"ew=="`},
		{ty("numeric"), numeric(5, -2), DecimalString, "12300", `"12300"`},
		// numeric: VariableScaleDecimal, trailing fraction zeros stripped, no negative scale.
		{ty("numeric"), -1, DecimalPrecise, "1.50", `{"scale":1,"value":"Dw=="}`},
		{ty("numeric"), -1, DecimalPrecise, "1000", `{"scale":0,"value":"A+g="}`},
		{ty("numeric"), -1, DecimalPrecise, "0.000", `{"scale":0,"value":"AA=="}`},
		{ty("numeric"), -1, DecimalPrecise, "-128", `{"scale":0,"value":"gA=="}`},
		{ty("numeric"), -1, DecimalPrecise, "-129", `{"scale":0,"value":"/38="}`},
		{ty("numeric"), -1, DecimalString, "NaN", `"NAN"`},
		{ty("numeric"), -1, DecimalString, "-Infinity", `"NEGATIVE_INFINITY"`},
		{ty("numeric"), -1, DecimalString, "123.4500", `"123.4500"`},
		{ty("numeric"), -1, DecimalDouble, "123456789012345678901234567890.123456789", "1.2345678901234568E29"},
		{ty("numeric"), -1, DecimalDouble, "12.34", "12.34"},
		{ty("numeric"), -1, DecimalDouble, "Infinity", `"Infinity"`},
		// money: Decimal at scale 2; 123450 = 0x01E23A.
		{ty("money"), -1, DecimalPrecise, "$1,234.50", `"AeI6"`},
		{ty("money"), -1, DecimalString, "-$3.00", `"-3.00"`},
		{ty("money"), -1, DecimalDouble, "$1,234.50", "1234.5"},
		{ty("bytea"), -1, 0, `\x00ff10`, `"AP8Q"`},
		{ty("jsonb"), -1, 0, `{"a": [1, 2]}`, `"{\"a\": [1, 2]}"`},
		{ty("uuid"), -1, 0, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`},
		{ty("date"), -1, 0, "2024-02-29", "19782"},
		{ty("date"), -1, 0, "1969-12-31", "-1"},
		{ty("date"), -1, 0, "0044-03-15 BC", itoa(epochDay(-43, 3, 15))},
		{ty("date"), -1, 0, "12345-06-07", itoa(epochDay(12345, 6, 7))},
		{ty("date"), -1, 0, "infinity", itoa(epochDay(-5877611, 6, 21))},
		{ty("date"), -1, 0, "-infinity", itoa(epochDay(-5877611, 6, 22))},
		// time: milliseconds of the day up to precision 3, microseconds past it.
		{ty("time"), -1, 0, "13:14:15.123456", "47655123456"},
		{ty("time"), 3, 0, "13:14:15.123", "47655123"},
		{ty("time"), 0, 0, "24:00:00", "86400000"},
		{ty("time"), -1, 0, "24:00:00", "86400000000"},
		{ty("timetz"), -1, 0, "13:14:15.123456+05:30", `"07:44:15.123456Z"`},
		{ty("timetz"), -1, 0, "00:00:00-08", `"08:00:00Z"`},
		{ty("timetz"), -1, 0, "23:59:59.5+14", `"09:59:59.5Z"`},
		// timestamp: 2024-02-29 is day 19782, 13:14:15.5 is 47655.5 s.
		{ty("timestamp"), -1, 0, "2024-02-29 13:14:15.5", "1709212455500000"},
		{ty("timestamp"), 3, 0, "2024-02-29 13:14:15.5", "1709212455500"},
		{ty("timestamp"), 3, 0, "1969-12-31 23:59:59.999", "-1"},
		{ty("timestamp"), -1, 0, "infinity", "9223372036825200000"},
		{ty("timestamp"), -1, 0, "-infinity", "-9223372036832400000"},
		{ty("timestamp"), -1, 0, "0044-03-15 10:00:00 BC", itoa(epochDay(-43, 3, 15)*86400e6 + 10*3600e6)},
		// timestamptz: UTC, the fraction as wide as the precision (none at 0: as needed).
		{ty("timestamptz"), -1, 0, "2024-02-29 11:14:15.123456+00", `"2024-02-29T11:14:15.123456Z"`},
		{ty("timestamptz"), -1, 0, "2024-02-29 11:14:15+00", `"2024-02-29T11:14:15.000000Z"`},
		{ty("timestamptz"), 3, 0, "2024-02-29 23:14:15.5-02", `"2024-03-01T01:14:15.500Z"`},
		{ty("timestamptz"), 0, 0, "2024-02-29 11:14:15+00", `"2024-02-29T11:14:15Z"`},
		{ty("timestamptz"), -1, 0, "0044-03-15 10:00:00+00 BC", `"-0043-03-15T10:00:00.000000Z"`},
		{ty("timestamptz"), -1, 0, "12345-06-07 08:09:10+00", `"+12345-06-07T08:09:10.000000Z"`},
		{ty("timestamptz"), -1, 0, "infinity", `"infinity"`},
		// interval: 14 months of 30.4375 days, 3 days, 4:05:06.5.
		{ty("interval"), -1, 0, "P1Y2M3DT4H5M6.5S", "37091106500000"},
		{ty("interval"), -1, 0, "P-1DT-1S", "-86401000000"},
		{ty("interval"), -1, 0, "PT0S", "0"},
		{ty("interval"), -1, 0, "PT-0.5S", "-500000"},
		{ty("hstore"), -1, 0, `"a"=>"1", "b"=>NULL`, `"{\"a\":\"1\",\"b\":null}"`},
		{ty("bit"), 1, 0, "1", "true"},
		{ty("bit"), 3, 0, "101", `"BQ=="`},
		{ty("varbit"), -1, 0, "100000000", `"AAE="`},
		{ty("varbit"), -1, 0, "000", `""`},
		{ty("inet"), -1, 0, "10.0.0.1/8", `"10.0.0.1/8"`},
		{&Type{Name: "c", kind: kComposite}, -1, 0, `(1,"a b")`, `"(1,\"a b\")"`},
		{arr("int4"), -1, 0, "{1,NULL,3}", "[1,null,3]"},
		{arr("int4"), -1, 0, "[0:1]={1,2}", "[1,2]"},
		{arr("int4"), -1, 0, "{{1,2},{3,4}}", "[[1,2],[3,4]]"},
		{arr("numeric"), numeric(10, 2), DecimalPrecise, "{1.50,-3.00}", `["AJY=","/tQ="]`},
		{arr("text"), -1, 0, `{"a,b",NULL,"NULL"}`, `["a,b",null,"NULL"]`},
		// A domain's column takes the domain's modifier (its own is -1).
		{&Type{Name: "d", base: "numeric", domTypmod: numeric(10, 2), hasDomTypmod: true}, -1, DecimalPrecise, "12.34", `"BNI="`},
		{&Type{Name: "d", base: "timestamp", domTypmod: 3, hasDomTypmod: true}, -1, 0, "2024-02-29 13:14:15.5", "1709212455500"},
		{&Type{Name: "d", base: "bit", domTypmod: 1, hasDomTypmod: true}, -1, 0, "1", "true"},
		// pgjdbc keeps an interval's microseconds apart from its seconds: 1 + 0.003691.
		{ty("interval"), -1, 0, "PT1.003691S", "1003690"},
		{ty("interval"), -1, 0, "PT1.003969S", "1003969"},
		{ty("numeric"), numeric(5, -2), DecimalPrecise, "0", `"AA=="`},
		{ty("numeric"), numeric(5, -2), DecimalString, "0", `"0"`},
		// The last years of PostgreSQL's timestamps: past 64-bit microseconds, not milliseconds.
		{ty("timestamptz"), -1, 0, "294250-01-01 00:00:00+00", `"+294250-01-01T00:00:00.000000Z"`},
		{ty("timestamp"), 3, 0, "294276-12-31 23:59:59.999", "9224318015999999"},
	}
	for _, c := range cases {
		got, err := c.t.Debezium(c.typmod, c.mode).Append(nil, []byte(c.text))
		require.NoError(t, err, "%s(%d) %s %q", c.t.Name, c.typmod, c.mode, c.text)
		require.Equal(t, c.want, string(got), "%s(%d) %s %q", c.t.Name, c.typmod, c.mode, c.text)
	}

	// No precise form for NaN or the infinities: refused, naming the fix (as Debezium does).
	for _, v := range []string{"NaN", "Infinity", "-Infinity"} {
		_, err := ty("numeric").Debezium(-1, DecimalPrecise).Append(nil, []byte(v))
		require.ErrorContains(t, err, "--debezium-decimal string")
	}
	// Text that is not the type's is an error, not a guess.
	for _, c := range []struct{ base, text string }{{"int4", "1.5"}, {"bool", "yes"}, {"date", "29.02.2024"}, {"bit", "102"}, {"interval", "1 day"}} {
		_, err := ty(c.base).Debezium(-1, 0).Append(nil, []byte(c.text))
		require.Error(t, err, "%s %q", c.base, c.text)
	}
}

// TestDebeziumSchemas: the Kafka Connect schema of each form, in the JSON converter's field
// order, with Debezium's semantic names.
func TestDebeziumSchemas(t *testing.T) {
	ty := func(base string) *Type { return &Type{Name: base, base: base} }
	numeric := (int32(10)<<16 | 2) + 4
	cases := []struct {
		t      *Type
		typmod int32
		mode   DecimalMode
		want   string
	}{
		{ty("int4"), -1, 0, `{"type":"int32","optional":false,"field":"c"}`},
		{ty("float4"), -1, 0, `{"type":"float","optional":false,"field":"c"}`},
		{ty("numeric"), numeric, DecimalPrecise, `{"type":"bytes","optional":false,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"},"field":"c"}`},
		{ty("numeric"), -1, DecimalPrecise, `{"type":"struct","fields":[{"type":"int32","optional":false,"field":"scale"},{"type":"bytes","optional":false,"field":"value"}],"optional":false,"name":"io.debezium.data.VariableScaleDecimal","version":1,"doc":"Variable scaled decimal","field":"c"}`},
		{ty("numeric"), -1, DecimalString, `{"type":"string","optional":false,"field":"c"}`},
		{ty("money"), -1, DecimalPrecise, `{"type":"bytes","optional":false,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2"},"field":"c"}`},
		{ty("date"), -1, 0, `{"type":"int32","optional":false,"name":"io.debezium.time.Date","version":1,"field":"c"}`},
		{ty("time"), 3, 0, `{"type":"int32","optional":false,"name":"io.debezium.time.Time","version":1,"field":"c"}`},
		{ty("time"), -1, 0, `{"type":"int64","optional":false,"name":"io.debezium.time.MicroTime","version":1,"field":"c"}`},
		{ty("timestamp"), -1, 0, `{"type":"int64","optional":false,"name":"io.debezium.time.MicroTimestamp","version":1,"field":"c"}`},
		{ty("timestamptz"), -1, 0, `{"type":"string","optional":false,"name":"io.debezium.time.ZonedTimestamp","version":1,"field":"c"}`},
		{ty("interval"), -1, 0, `{"type":"int64","optional":false,"name":"io.debezium.time.MicroDuration","version":1,"field":"c"}`},
		{ty("bit"), 3, 0, `{"type":"bytes","optional":false,"name":"io.debezium.data.Bits","version":1,"parameters":{"length":"3"},"field":"c"}`},
		{ty("varbit"), -1, 0, `{"type":"bytes","optional":false,"name":"io.debezium.data.Bits","version":1,"parameters":{"length":"2147483647"},"field":"c"}`},
		{ty("tsvector"), -1, 0, `{"type":"string","optional":false,"name":"io.debezium.data.Tsvector","version":1,"field":"c"}`},
		{&Type{Name: "_date", kind: kArray, elem: ty("date"), delim: ','}, -1, 0, `{"type":"array","items":{"type":"int32","optional":true,"name":"io.debezium.time.Date","version":1},"optional":false,"field":"c"}`},
	}
	for _, c := range cases {
		require.Equal(t, c.want, string(c.t.Debezium(c.typmod, c.mode).AppendSchema(nil, "c", false)), "%s(%d)", c.t.Name, c.typmod)
	}
}

// FuzzDebezium: whatever text a column of any form is given, Append does not panic, and what it
// writes when it takes the text is one JSON value.
func FuzzDebezium(f *testing.F) {
	bases := []string{"bool", "int2", "int4", "int8", "float4", "float8", "numeric", "money", "bytea", "json", "uuid", "date", "time", "timetz", "timestamp", "timestamptz", "interval", "hstore", "bit", "varbit", "text"}
	for _, s := range []string{"2024-02-29", "13:14:15.5+05:30", "0044-03-15 10:00:00+00 BC", "P1Y-2M3DT4H5M6.5S", "-12.3400", "$1,234.50", `\x00ff`, "101", `"a"=>NULL`, "{1,{2}}"} {
		f.Add(s, uint8(0), int32(-1), uint8(0))
	}
	f.Fuzz(func(t *testing.T, text string, base uint8, typmod int32, mode uint8) {
		ty := &Type{Name: "x", base: bases[int(base)%len(bases)]}
		if base >= 128 {
			ty = &Type{Name: "_x", kind: kArray, elem: ty, delim: ','}
		}
		d := ty.Debezium(typmod, DecimalMode(mode%3))
		for _, d := range []*Debezium{d, d.OneDimension()} {
			out, err := d.Append(nil, []byte(text))
			if err == nil && !json.Valid(out) {
				t.Fatalf("%s(%d) %q: %s is not JSON", ty.Name, typmod, text, out)
			}
			if !json.Valid(d.AppendUnavailable(nil)) || !json.Valid(d.AppendSchema(nil, "f", true)) {
				t.Fatalf("%s(%d): the placeholder or the schema is not JSON", ty.Name, typmod)
			}
		}
	})
}

// FuzzDebeziumDays: a date PostgreSQL prints (4713 BC to 5874897 AD) becomes the day Go's
// calendar counts for it, and a timestamptz of it prints back the same day in java.time's form.
func FuzzDebeziumDays(f *testing.F) {
	f.Add(int64(0), int64(0))
	f.Add(int64(-2440588), int64(86399999999))
	f.Fuzz(func(t *testing.T, day, us int64) {
		lo, hi := epochDay(-4712, 1, 1), epochDay(5874897, 12, 31)
		if day < lo || day > hi {
			day = lo + ((day%(hi-lo+1))+(hi-lo+1))%(hi-lo+1)
		}
		us = ((us % 86400e6) + 86400e6) % 86400e6
		tm := time.Unix(day*86400, us*1000).UTC()
		y := tm.Year()
		text := fmt.Sprintf("%04d-%02d-%02d", y, tm.Month(), tm.Day())
		if y <= 0 {
			text = fmt.Sprintf("%04d-%02d-%02d BC", 1-y, tm.Month(), tm.Day())
		}
		got, err := (&Type{Name: "date", base: "date"}).Debezium(-1, 0).Append(nil, []byte(text))
		if err != nil || string(got) != strconv.FormatInt(day, 10) {
			t.Fatalf("%s: %s, %v; want %d", text, got, err, day)
		}
		if y > 294276 {
			return // past timestamptz's range
		}
		clock := fmt.Sprintf("%02d:%02d:%02d.%06d", tm.Hour(), tm.Minute(), tm.Second(), us%1e6)
		stamp := fmt.Sprintf("%04d-%02d-%02d %s+00", y, tm.Month(), tm.Day(), clock)
		if y <= 0 {
			stamp = fmt.Sprintf("%04d-%02d-%02d %s+00 BC", 1-y, tm.Month(), tm.Day(), clock)
		}
		got, err = (&Type{Name: "timestamptz", base: "timestamptz"}).Debezium(-1, 0).Append(nil, []byte(stamp))
		iso := fmt.Sprintf("%04d", y)
		switch {
		case y > 9999:
			iso = fmt.Sprintf("+%d", y)
		case y < 0:
			iso = fmt.Sprintf("-%04d", -y)
		}
		want := fmt.Sprintf(`"%s-%02d-%02dT%sZ"`, iso, tm.Month(), tm.Day(), clock)
		if err != nil || string(got) != want {
			t.Fatalf("%s: %s, %v; want %s", stamp, got, err, want)
		}
	})
}
