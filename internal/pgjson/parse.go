package pgjson

import (
	"bytes"
	"errors"
	"fmt"
)

// errSyntax reports a text form that does not parse as its type's output.
var errSyntax = errors.New("unexpected text form")

// The parsers read PostgreSQL's text output of arrays, composites and hstore (the forms of
// array_out, record_out and hstore_out), which quote elements containing special characters and
// escape quotes and backslashes inside quotes with a backslash (arrays, hstore) or by doubling
// (composites, which also accept backslashes).

// arrayItem is one element of an array's text form: its text, or nested elements.
type arrayItem struct {
	null   bool
	text   []byte
	nested []arrayItem
	isSub  bool
}

// parseArray parses an array's text form, "{a,b}" or "[2:3]={a,b}" (the bounds are returned),
// with elements separated by delim.
func parseArray(s []byte, delim byte) (items []arrayItem, bounds []byte, err error) {
	if len(s) > 0 && s[0] == '[' {
		i := bytes.Index(s, []byte("={"))
		if i < 0 {
			return nil, nil, fmt.Errorf("%w: array bounds in %q", errSyntax, s)
		}
		bounds, s = s[:i], s[i+1:]
	}
	p := &arrayParser{s: s, delim: delim}
	items, err = p.list()
	if err == nil && p.i != len(p.s) {
		err = fmt.Errorf("%w: trailing text in array %q", errSyntax, s)
	}
	return items, bounds, err
}

type arrayParser struct {
	s     []byte
	i     int
	delim byte
	depth int // the nesting of the list being read
}

// maxArrayDepth is PostgreSQL's MAXDIM: no array it prints nests deeper. Text that does (from a
// server that is not PostgreSQL, or a hostile one) is refused rather than recursed into without
// bound.
const maxArrayDepth = 6

func (p *arrayParser) list() ([]arrayItem, error) {
	if p.i >= len(p.s) || p.s[p.i] != '{' {
		return nil, fmt.Errorf("%w: array %q does not start with {", errSyntax, p.s)
	}
	if p.depth++; p.depth > maxArrayDepth {
		return nil, fmt.Errorf("%w: array nested deeper than %d dimensions", errSyntax, maxArrayDepth)
	}
	defer func() { p.depth-- }()
	p.i++
	items := []arrayItem{}
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return items, nil
	}
	for {
		if p.i >= len(p.s) {
			return nil, fmt.Errorf("%w: unterminated array %q", errSyntax, p.s)
		}
		var it arrayItem
		switch p.s[p.i] {
		case '{':
			nested, err := p.list()
			if err != nil {
				return nil, err
			}
			it = arrayItem{nested: nested, isSub: true}
		case '"':
			text, err := p.quoted()
			if err != nil {
				return nil, err
			}
			it = arrayItem{text: text}
		default:
			start := p.i
			for p.i < len(p.s) && p.s[p.i] != p.delim && p.s[p.i] != '}' {
				p.i++
			}
			text := p.s[start:p.i]
			if bytes.EqualFold(text, []byte("NULL")) {
				it = arrayItem{null: true}
			} else {
				it = arrayItem{text: text}
			}
		}
		items = append(items, it)
		if p.i >= len(p.s) {
			return nil, fmt.Errorf("%w: unterminated array %q", errSyntax, p.s)
		}
		switch p.s[p.i] {
		case p.delim:
			p.i++
		case '}':
			p.i++
			return items, nil
		default:
			return nil, fmt.Errorf("%w: %q in array %q", errSyntax, p.s[p.i], p.s)
		}
	}
}

// quoted reads a double-quoted element whose quotes and backslashes are backslash-escaped.
func (p *arrayParser) quoted() ([]byte, error) {
	p.i++ // the opening quote
	var out []byte
	for p.i < len(p.s) {
		switch c := p.s[p.i]; c {
		case '\\':
			if p.i+1 >= len(p.s) {
				return nil, fmt.Errorf("%w: dangling backslash in %q", errSyntax, p.s)
			}
			out = append(out, p.s[p.i+1])
			p.i += 2
		case '"':
			p.i++
			if out == nil {
				out = []byte{}
			}
			return out, nil
		default:
			out = append(out, c)
			p.i++
		}
	}
	return nil, fmt.Errorf("%w: unterminated quote in %q", errSyntax, p.s)
}

// parseComposite parses a composite's text form "(a,,"b c")": one value per field, nil for
// NULL (an empty unquoted field).
func parseComposite(s []byte) ([][]byte, error) {
	if len(s) < 2 || s[0] != '(' || s[len(s)-1] != ')' {
		return nil, fmt.Errorf("%w: composite %q", errSyntax, s)
	}
	s = s[1 : len(s)-1]
	var fields [][]byte
	i := 0
	for {
		var field []byte
		quotedSeen := false
		for i < len(s) && s[i] != ',' {
			switch s[i] {
			case '"':
				quotedSeen = true
				i++
				for {
					if i >= len(s) {
						return nil, fmt.Errorf("%w: unterminated quote in composite %q", errSyntax, s)
					}
					if s[i] == '"' {
						if i+1 < len(s) && s[i+1] == '"' {
							field = append(field, '"')
							i += 2
							continue
						}
						i++
						break
					}
					if s[i] == '\\' && i+1 < len(s) {
						i++
					}
					field = append(field, s[i])
					i++
				}
			case '\\':
				if i+1 < len(s) {
					i++
				}
				field = append(field, s[i])
				i++
			default:
				field = append(field, s[i])
				i++
			}
		}
		if field == nil && quotedSeen {
			field = []byte{}
		}
		fields = append(fields, field)
		if i >= len(s) {
			return fields, nil
		}
		i++ // the comma
	}
}

// parseHstore parses hstore's text form `"k"=>"v", "k2"=>NULL` into pairs in text order; a nil
// value is NULL.
func parseHstore(s []byte) (keys, vals [][]byte, err error) {
	p := &arrayParser{s: s}
	skip := func() {
		for p.i < len(s) && (s[p.i] == ' ' || s[p.i] == ',') {
			p.i++
		}
	}
	for skip(); p.i < len(s); skip() {
		if s[p.i] != '"' {
			return nil, nil, fmt.Errorf("%w: hstore key in %q", errSyntax, s)
		}
		k, err := p.quoted()
		if err != nil {
			return nil, nil, err
		}
		if !bytes.HasPrefix(s[p.i:], []byte("=>")) {
			return nil, nil, fmt.Errorf("%w: hstore => in %q", errSyntax, s)
		}
		p.i += 2
		var v []byte
		switch {
		case p.i < len(s) && s[p.i] == '"':
			if v, err = p.quoted(); err != nil {
				return nil, nil, err
			}
		case bytes.HasPrefix(s[p.i:], []byte("NULL")):
			p.i += 4
		default:
			return nil, nil, fmt.Errorf("%w: hstore value in %q", errSyntax, s)
		}
		keys, vals = append(keys, k), append(vals, v)
	}
	return keys, vals, nil
}

// ArrayElement returns the one element of a one-dimensional, one-element array's text form
// (array_out's, with elements separated by delim: the element type's typdelim), as the element
// type's own output function wrote it; null when it is NULL. It reads a value where converting
// it on the server could run code of the type's owner (a cast to text).
func ArrayElement(s string, delim byte) (elem string, null bool, err error) {
	items, _, err := parseArray([]byte(s), delim)
	if err != nil {
		return "", false, err
	}
	if len(items) != 1 || items[0].isSub {
		return "", false, fmt.Errorf("%w: %q is not an array of one element", errSyntax, s)
	}
	return string(items[0].text), items[0].null, nil
}
