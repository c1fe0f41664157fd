package pgjson

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// Text is the inverse of Append in the Exact profile: it appends to dst the PostgreSQL text
// input of a value of type t given its JSON form, so that a consumer of the output can write the
// value back into a column of the same type. null reports JSON null: SQL NULL, or a value whose
// form was lossy (NaN, infinity, an offset with seconds, an array's lower bounds), which the
// output carries whole beside it (the line's "original") and the caller takes from there.
//
// Every kind of the Exact profile reads back to the value it was written from: numbers keep
// their digits (never through a float, so -0 and 1.10 stay), bytea's base64 becomes hex,
// an hstore's or a composite's object and an array's list are written as their types' text
// (quoted as record_out and array_out quote), dates and timestamps get PostgreSQL's own spelling
// back (no 'T', no 'Z', no '+' before a year past 9999). The Airbyte profile's forms are not
// read: some of them are lossy with nothing beside them.
func (t *Type) Text(dst []byte, v json.RawMessage) (out []byte, null bool, err error) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return dst, false, fmt.Errorf("%s: an empty JSON value", t.Name)
	}
	if string(v) == "null" {
		return dst, true, nil
	}
	if t.prof != Exact {
		return dst, false, fmt.Errorf("%s: only the exact profile's forms can be read back", t.Name)
	}
	switch t.kind {
	case kInteger, kNumber, kMoney:
		if !isNumber(v) {
			return dst, false, fmt.Errorf("%w: %s: %s is not a JSON number", errSyntax, t.Name, v)
		}
		return append(dst, v...), false, nil
	case kBool:
		switch string(v) {
		case "true":
			return append(dst, 't'), false, nil
		case "false":
			return append(dst, 'f'), false, nil
		}
		return dst, false, fmt.Errorf("%w: boolean %s", errSyntax, v)
	case kVector:
		var xs []json.Number
		if err := json.Unmarshal(v, &xs); err != nil {
			return dst, false, fmt.Errorf("%w: %s: %s is not a list of integers", errSyntax, t.Name, v)
		}
		for i, x := range xs {
			if !isInteger([]byte(x)) {
				return dst, false, fmt.Errorf("%w: %s: %s is not an integer", errSyntax, t.Name, x)
			}
			if i > 0 {
				dst = append(dst, ' ')
			}
			dst = append(dst, x...)
		}
		return dst, false, nil
	case kArray:
		return t.arrayText(dst, v)
	case kComposite:
		return t.compositeText(dst, v)
	case kHstore:
		return hstoreText(dst, v, t.Name)
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return dst, false, fmt.Errorf("%w: %s: %s is not a JSON string", errSyntax, t.Name, v)
	}
	switch t.kind {
	case kBytea:
		raw, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return dst, false, fmt.Errorf("%w: bytea: %q is not base64", errSyntax, s)
		}
		dst = append(dst, `\x`...)
		return hex.AppendEncode(dst, raw), false, nil
	case kDate, kTimestamp, kTimestampTZ:
		return append(dst, temporalText(s)...), false, nil
	}
	return append(dst, s...), false, nil
}

// temporalText gives a date's or timestamp's exact form PostgreSQL's spelling: the 'T' a space,
// a 'Z' +00, no '+' before a year past 9999 ("+12345-06-07T01:02:03Z BC").
func temporalText(s string) string {
	s = strings.TrimPrefix(s, "+")
	if i := strings.IndexByte(s, 'T'); i > 0 {
		s = s[:i] + " " + s[i+1:]
	}
	if i := strings.IndexByte(s, 'Z'); i > 0 {
		s = s[:i] + "+00" + s[i+1:]
	}
	return s
}

func (t *Type) arrayText(dst []byte, v json.RawMessage) ([]byte, bool, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(v, &items); err != nil {
		return dst, false, fmt.Errorf("%w: %s: %s is not a JSON array", errSyntax, t.Name, v)
	}
	return t.elem.itemsText(dst, items, t.delim, t.Name)
}

// itemsText writes a (sub)array's items as array_in reads them: nested lists in braces, NULL,
// and each element's text quoted as array_out quotes it.
func (t *Type) itemsText(dst []byte, items []json.RawMessage, delim byte, name string) ([]byte, bool, error) {
	dst = append(dst, '{')
	var buf []byte
	for i, it := range items {
		if i > 0 {
			dst = append(dst, delim)
		}
		it = bytes.TrimSpace(it)
		// A list is a dimension of the array, unless the element type is itself a list (an
		// int2vector, a domain over an array): then it is one element.
		if len(it) > 0 && it[0] == '[' && t.kind != kVector && t.kind != kArray {
			var sub []json.RawMessage
			if err := json.Unmarshal(it, &sub); err != nil {
				return dst, false, fmt.Errorf("%w: %s: %s", errSyntax, name, err)
			}
			var err error
			if dst, _, err = t.itemsText(dst, sub, delim, name); err != nil {
				return dst, false, err
			}
			continue
		}
		text, null, err := t.Text(buf[:0], it)
		if err != nil {
			return dst, false, err
		}
		if null {
			dst = append(dst, "NULL"...)
			continue
		}
		buf = text
		dst = quoteArrayElement(dst, text, delim)
	}
	return append(dst, '}'), false, nil
}

func (t *Type) compositeText(dst []byte, v json.RawMessage) ([]byte, bool, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(v, &obj); err != nil || obj == nil {
		return dst, false, fmt.Errorf("%w: %s: %s is not a JSON object", errSyntax, t.Name, v)
	}
	fields := t.def().fields
	if len(obj) != len(fields) {
		return dst, false, fmt.Errorf("%s: a value with %d fields, and the type has %d: its fields were added or dropped", t.Name, len(obj), len(fields))
	}
	dst = append(dst, '(')
	for i, f := range fields {
		if i > 0 {
			dst = append(dst, ',')
		}
		fv, ok := obj[f.Name]
		if !ok {
			return dst, false, fmt.Errorf("%s: a value without field %q", t.Name, f.Name)
		}
		text, null, err := f.Type.Text(nil, fv)
		if err != nil {
			return dst, false, err
		}
		if !null {
			dst = quoteRecordField(dst, text)
		}
	}
	return append(dst, ')'), false, nil
}

// hstoreText writes an hstore's object as hstore_in reads it: "k"=>"v" pairs, NULL unquoted.
func hstoreText(dst []byte, v json.RawMessage, name string) ([]byte, bool, error) {
	var obj map[string]*string
	if err := json.Unmarshal(v, &obj); err != nil || obj == nil {
		return dst, false, fmt.Errorf("%w: %s: %s is not an object of strings", errSyntax, name, v)
	}
	quote := func(b []byte, s string) []byte {
		b = append(b, '"')
		for i := 0; i < len(s); i++ {
			if s[i] == '"' || s[i] == '\\' {
				b = append(b, '\\')
			}
			b = append(b, s[i])
		}
		return append(b, '"')
	}
	first := true
	for k, val := range obj {
		if !first {
			dst = append(dst, ", "...)
		}
		first = false
		dst = append(quote(dst, k), "=>"...)
		if val == nil {
			dst = append(dst, "NULL"...)
		} else {
			dst = quote(dst, *val)
		}
	}
	return dst, false, nil
}
