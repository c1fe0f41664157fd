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

// appendQuoted appends e in double quotes, its quotes and backslashes escaped: by a backslash
// (array_out, hstore_out), or doubled (record_out).
func appendQuoted(b, e []byte, doubled bool) []byte {
	b = append(b, '"')
	for _, c := range e {
		if c == '"' || c == '\\' {
			if doubled {
				b = append(b, c)
			} else {
				b = append(b, '\\')
			}
		}
		b = append(b, c)
	}
	return append(b, '"')
}

// needsQuotes reports whether an element must be quoted: when empty, or holding a byte of
// special or a space.
func needsQuotes(e []byte, special string) bool {
	if len(e) == 0 {
		return true
	}
	for _, c := range e {
		if strings.IndexByte(special, c) >= 0 || isPGSpace(c) {
			return true
		}
	}
	return false
}

// arrayOut prints a one-dimensional array as array_out does with delimiter ','.
func arrayOut(elems [][]byte) []byte {
	b := []byte{'{'}
	for i, e := range elems {
		if i > 0 {
			b = append(b, ',')
		}
		switch {
		case e == nil:
			b = append(b, "NULL"...)
		case needsQuotes(e, `,{}"\`) || strings.EqualFold(string(e), "NULL"):
			b = appendQuoted(b, e, false)
		default:
			b = append(b, e...)
		}
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
		switch {
		case e == nil:
		case needsQuotes(e, `"\(),`):
			b = appendQuoted(b, e, true)
		default:
			b = append(b, e...)
		}
	}
	return append(b, ')')
}

// hstoreOut prints pairs as hstore_out does: every key and value quoted, with backslash escapes;
// a NULL value is NULL.
func hstoreOut(keys, vals [][]byte) []byte {
	var b []byte
	for i := range keys {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendQuoted(b, keys[i], false)
		b = append(b, "=>"...)
		if vals[i] == nil {
			b = append(b, "NULL"...)
		} else {
			b = appendQuoted(b, vals[i], false)
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

// TestPrinters: the printers write what PostgreSQL writes for the same elements.
func TestPrinters(t *testing.T) {
	elems := [][]byte{[]byte("a b"), nil, {}, []byte(`q"\`), []byte("null"), []byte("x")}
	if got := string(arrayOut(elems)); got != `{"a b",NULL,"","q\"\\","null",x}` {
		t.Errorf("arrayOut: %s", got)
	}
	if got := string(recordOut(elems)); got != `("a b",,"","q""\\",null,x)` {
		t.Errorf("recordOut: %s", got)
	}
	if got := string(hstoreOut([][]byte{[]byte(`k"`), []byte("n")}, [][]byte{[]byte(`v\`), nil})); got != `"k\""=>"v\\", "n"=>NULL` {
		t.Errorf("hstoreOut: %s", got)
	}
}
