package pgjson

import (
	"bytes"
	"strings"
	"testing"
)

// The parsers' round trip: elements drawn from the fuzz input are printed the way PostgreSQL's
// array_out, record_out and hstore_out print them (the quoting rules written out here, apart
// from the parsers), and each parser must give back exactly those elements. A parser that only
// did not panic would pass FuzzParsers; this one fails on any element it reads wrong.

// fuzzElems splits data into elements at 0xff; an element starting with 0xfe is NULL.
func fuzzElems(data []byte) (elems [][]byte) {
	for _, e := range bytes.Split(data, []byte{0xff}) {
		if len(e) > 0 && e[0] == 0xfe {
			elems = append(elems, nil)
			continue
		}
		elems = append(elems, append([]byte{}, e...))
	}
	return elems
}

func isPGSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// arrayOut prints a one-dimensional array as array_out does with delimiter ','.
func arrayOut(elems [][]byte) []byte {
	b := []byte{'{'}
	for i, e := range elems {
		if i > 0 {
			b = append(b, ',')
		}
		if e == nil {
			b = append(b, "NULL"...)
			continue
		}
		quote := len(e) == 0 || strings.EqualFold(string(e), "NULL")
		for _, c := range e {
			quote = quote || c == ',' || c == '{' || c == '}' || c == '"' || c == '\\' || isPGSpace(c)
		}
		if !quote {
			b = append(b, e...)
			continue
		}
		b = append(b, '"')
		for _, c := range e {
			if c == '"' || c == '\\' {
				b = append(b, '\\')
			}
			b = append(b, c)
		}
		b = append(b, '"')
	}
	return append(b, '}')
}

// recordOut prints a composite as record_out does: NULL is nothing, quotes and backslashes are
// doubled inside quotes.
func recordOut(elems [][]byte) []byte {
	b := []byte{'('}
	for i, e := range elems {
		if i > 0 {
			b = append(b, ',')
		}
		if e == nil {
			continue
		}
		quote := len(e) == 0
		for _, c := range e {
			quote = quote || c == '"' || c == '\\' || c == '(' || c == ')' || c == ',' || isPGSpace(c)
		}
		if !quote {
			b = append(b, e...)
			continue
		}
		b = append(b, '"')
		for _, c := range e {
			if c == '"' || c == '\\' {
				b = append(b, c)
			}
			b = append(b, c)
		}
		b = append(b, '"')
	}
	return append(b, ')')
}

// hstoreOut prints pairs as hstore_out does: every key and value quoted, with backslash escapes;
// a NULL value is NULL.
func hstoreOut(keys, vals [][]byte) []byte {
	var b []byte
	q := func(s []byte) {
		b = append(b, '"')
		for _, c := range s {
			if c == '"' || c == '\\' {
				b = append(b, '\\')
			}
			b = append(b, c)
		}
		b = append(b, '"')
	}
	for i := range keys {
		if i > 0 {
			b = append(b, ", "...)
		}
		q(keys[i])
		b = append(b, "=>"...)
		if vals[i] == nil {
			b = append(b, "NULL"...)
		} else {
			q(vals[i])
		}
	}
	return b
}

func sameElems(t *testing.T, what string, printed []byte, want, got [][]byte) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%s %q: %d elements, parsed %d", what, printed, len(want), len(got))
	}
	for i := range want {
		if (want[i] == nil) != (got[i] == nil) || !bytes.Equal(want[i], got[i]) {
			t.Fatalf("%s %q: element %d is %q (null %v), parsed %q (null %v)", what, printed, i, want[i], want[i] == nil, got[i], got[i] == nil)
		}
	}
}

func FuzzParsersRoundTrip(f *testing.F) {
	for _, s := range []string{"a\xffb", "\xfe\xff\xffNULL\xffnull", "x y\xff\"q\"\xff\\\xff{}\xff(,)", "", "\xfe", "=>\xff, \xff\t\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		elems := fuzzElems(data)

		printed := arrayOut(elems)
		items, bounds, err := parseArray(printed, ',')
		if err != nil || bounds != nil {
			t.Fatalf("array %q: %v (bounds %q)", printed, err, bounds)
		}
		var got [][]byte
		for _, it := range items {
			if it.isSub {
				t.Fatalf("array %q: a nested element in a one-dimensional array", printed)
			}
			switch {
			case it.null:
				got = append(got, nil)
			case it.text == nil:
				got = append(got, []byte{})
			default:
				got = append(got, it.text)
			}
		}
		sameElems(t, "array", printed, elems, got)

		printed = recordOut(elems)
		fields, err := parseComposite(printed)
		if err != nil {
			t.Fatalf("composite %q: %v", printed, err)
		}
		sameElems(t, "composite", printed, elems, fields)

		// hstore: pairs from consecutive elements; keys are never NULL.
		var keys, vals [][]byte
		for i := 0; i+1 < len(elems); i += 2 {
			k := elems[i]
			if k == nil {
				k = []byte{}
			}
			keys, vals = append(keys, k), append(vals, elems[i+1])
		}
		printed = hstoreOut(keys, vals)
		gk, gv, err := parseHstore(printed)
		if err != nil {
			t.Fatalf("hstore %q: %v", printed, err)
		}
		sameElems(t, "hstore keys", printed, keys, gk)
		sameElems(t, "hstore values", printed, vals, gv)
	})
}
