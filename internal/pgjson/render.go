package pgjson

import (
	"strings"
)

// The Airbyte profile writes composites, and the elements of arrays the Java connector does not
// type, as the text its driver receives: PostgreSQL's output under the server's default
// IntervalStyle (postgres), where Tidemark's sessions pin iso_8601. serverText re-renders a
// value's text with every interval inside it in the postgres style, and is the identity for a
// type with no interval inside (the common case, which needs no parsing).

// renders reports whether t's text holds an interval somewhere (depth bounds self-reference
// through arrays of a composite type).
func (t *Type) renders(depth int) bool {
	if depth > 20 {
		return false
	}
	switch t.kind {
	case kInterval:
		return true
	case kArray, kText:
		return t.elem.renders(depth + 1)
	case kComposite:
		for _, f := range t.def().fields {
			if f.Type.renders(depth + 1) {
				return true
			}
		}
	}
	return false
}

// serverText returns text as a session with IntervalStyle postgres prints the same value.
func (t *Type) serverText(text []byte) ([]byte, error) {
	if !t.renders(0) {
		return text, nil
	}
	return t.render(text)
}

func (t *Type) render(text []byte) ([]byte, error) {
	switch t.kind {
	case kInterval:
		return postgresInterval(text), nil
	case kText:
		return t.elem.render(text)
	case kArray:
		items, bounds, err := parseArray(text, t.delim)
		if err != nil {
			return nil, err
		}
		var b []byte
		if bounds != nil {
			b = append(append(b, bounds...), '=')
		}
		return t.elem.renderItems(b, items, t.delim)
	case kComposite:
		vals, err := parseComposite(text)
		if err != nil {
			return nil, err
		}
		d := t.def()
		if len(vals) != len(d.fields) {
			return nil, &CompositeChangedError{OID: t.OID, Name: t.Name, Fields: len(vals), Have: len(d.fields)}
		}
		b := []byte{'('}
		for i, v := range vals {
			if i > 0 {
				b = append(b, ',')
			}
			if v == nil {
				continue
			}
			r, err := d.fields[i].Type.render(v)
			if err != nil {
				return nil, err
			}
			b = quoteRecordField(b, r)
		}
		return append(b, ')'), nil
	}
	return text, nil
}

// renderItems writes array elements of type t as array_out does.
func (t *Type) renderItems(b []byte, items []arrayItem, delim byte) ([]byte, error) {
	b = append(b, '{')
	for i, it := range items {
		if i > 0 {
			b = append(b, delim)
		}
		switch {
		case it.null:
			b = append(b, "NULL"...)
		case it.isSub:
			var err error
			if b, err = t.renderItems(b, it.nested, delim); err != nil {
				return nil, err
			}
		default:
			r, err := t.render(it.text)
			if err != nil {
				return nil, err
			}
			b = quoteArrayElement(b, r, delim)
		}
	}
	return append(b, '}'), nil
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// quoteRecordField appends a composite's field as record_out writes it: in double quotes when
// empty or holding a quote, backslash, parenthesis, comma or space; quotes and backslashes
// doubled inside.
func quoteRecordField(b, v []byte) []byte {
	q := len(v) == 0
	for _, c := range v {
		if c == '"' || c == '\\' || c == '(' || c == ')' || c == ',' || isSpace(c) {
			q = true
			break
		}
	}
	if q {
		b = append(b, '"')
	}
	for _, c := range v {
		if c == '"' || c == '\\' {
			b = append(b, c)
		}
		b = append(b, c)
	}
	if q {
		b = append(b, '"')
	}
	return b
}

// quoteArrayElement appends an array element as array_out writes it: in double quotes when empty,
// NULL (in any case), or holding a quote, backslash, brace, the delimiter or space; quotes and
// backslashes escaped with a backslash inside.
func quoteArrayElement(b, v []byte, delim byte) []byte {
	q := len(v) == 0 || strings.EqualFold(string(v), "NULL")
	for _, c := range v {
		if c == '"' || c == '\\' || c == '{' || c == '}' || c == delim || isSpace(c) {
			q = true
			break
		}
	}
	if !q {
		return append(b, v...)
	}
	b = append(b, '"')
	for _, c := range v {
		if c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, c)
	}
	return append(b, '"')
}
