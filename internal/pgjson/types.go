package pgjson

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// kind is how a type's values are written in JSON; some kinds are written otherwise in the
// Airbyte profile (Type.prof), as their comments say.
type kind int

const (
	kString      kind = iota // the text form, as a string
	kInteger                 // integer types: the text is a JSON integer
	kNumber                  // numeric, float4, float8: a JSON number; NaN and the infinities become null
	kMoney                   // money: "$1,234.50" becomes 1234.50
	kBool                    // t/f
	kBytea                   // base64 of the bytes (the Airbyte profile's bytea is kString, but for array elements)
	kDate                    // as printed (ISO, " BC" suffix, "+" past 9999); infinity null
	kTime                    // as printed; Airbyte: as java.time prints it
	kTimeTZ                  // the offset as +HH:MM; Airbyte: java.time's form
	kTimestamp               // "YYYY-MM-DDTHH:MM:SS[.f]"; Airbyte: java.time's form
	kTimestampTZ             // "YYYY-MM-DDTHH:MM:SS[.f]Z"; Airbyte: six fraction digits
	kArray                   // a JSON array of the elements
	kComposite               // a JSON object of the fields; Airbyte: the text, as a string
	kHstore                  // a JSON object of string (or null) values; Airbyte: its JSON text, as a string
	kInterval                // ISO 8601 duration, as a string; Airbyte: PostgreSQL's postgres style
	kGeometric               // the text, as a string; Airbyte: its numbers as Java doubles
	kVector                  // int2vector, oidvector: "1 2 3" becomes [1,2,3]
	kText                    // Airbyte: an untyped array's element, its server text as a string (elem: the type)
	kBitBool                 // Airbyte: bit[] elements: 1 true, 0 false
)

// Type is how one PostgreSQL type's values become JSON. Types are immutable and shared.
type Type struct {
	OID  uint32
	Name string // type name, schema-qualified outside pg_catalog
	base string // a built-in base type's name (a domain's: its base type's); "hstore"; "" otherwise
	// domTypmod is a domain's declared type modifier (numeric(10,2), timestamp(3)): a column of
	// the domain has none of its own. hasDomTypmod: it has one (the domain's or, for a domain
	// over a domain, the nearest one's).
	domTypmod    int32
	hasDomTypmod bool
	kind         kind
	prof         Profile
	elem         *Type   // arrays: the element type
	delim        byte    // arrays: the element delimiter (',' for all but box, ';')
	untyped      bool    // Airbyte: an array the Java connector does not type (schema without items)
	fields       []Field // composites: the fields as first loaded
	// comp is a composite's current definition, shared by the domains over it: ALTER TYPE ...
	// ADD or DROP ATTRIBUTE changes it while the capture runs (Registry.Reload). nil: fields.
	comp *compositeHolder
}

// IsArray reports whether the type's JSON form is an array (a PostgreSQL array, or a domain
// over one).
func (t *Type) IsArray() bool { return t.kind == kArray }

// Field is one field of a composite type.
type Field struct {
	Name string
	Type *Type
}

// compositeHolder holds a composite type's definition, replaced whole when it is reloaded.
type compositeHolder struct{ def atomic.Pointer[compositeDef] }

// compositeDef is a composite's fields now, and every attribute it ever had in attribute order
// (dropped ones have no Type): a value written before an ADD or DROP ATTRIBUTE (the stream
// prints it with the catalog of its time) has the fields of that time.
type compositeDef struct {
	fields []Field
	all    []attr
}

type attr struct {
	Field
	dropped bool
}

func (t *Type) def() *compositeDef {
	if t.comp != nil {
		if d := t.comp.def.Load(); d != nil {
			return d
		}
	}
	d := &compositeDef{fields: t.fields}
	for _, f := range t.fields {
		d.all = append(d.all, attr{Field: f})
	}
	return d
}

// ErrCompositeChanged: a composite value's fields are not its type's as loaded; the type
// changed (ALTER TYPE ... ADD or DROP ATTRIBUTE): Registry.Reload reads it again.
var ErrCompositeChanged = errors.New("the composite type changed")

// CompositeChangedError details ErrCompositeChanged: which type, and how many fields the value
// had.
type CompositeChangedError struct {
	OID    uint32
	Name   string
	Fields int // the value's
	Have   int // the type's, as loaded
}

func (e *CompositeChangedError) Error() string {
	return fmt.Sprintf("%v: a value of %s has %d fields, and the type as Tidemark read it has %d; its fields were added or dropped", ErrCompositeChanged, e.Name, e.Fields, e.Have)
}

func (e *CompositeChangedError) Unwrap() error { return ErrCompositeChanged }

// Append appends the JSON form of a value of type t, given its text form, in t's profile. lossy
// reports that the JSON form does not carry the whole value, so the caller keeps the text beside
// it: a part with no JSON form in the column's schema (NaN and the infinities of numeric and
// floating-point types, ±infinity of dates and timestamps, a UTC offset with seconds) is
// written as null, and an array's lower bounds other than 1 are not written.
func (t *Type) Append(dst, text []byte) (out []byte, lossy bool, err error) {
	switch t.kind {
	case kInteger:
		if !isInteger(text) {
			return dst, false, fmt.Errorf("%w: %s %q", errSyntax, t.Name, text)
		}
		return append(dst, text...), false, nil
	case kNumber:
		if isNumber(text) {
			return append(dst, text...), false, nil
		}
		switch string(text) {
		case "NaN", "Infinity", "-Infinity":
			return append(dst, "null"...), true, nil
		}
		return dst, false, fmt.Errorf("%w: %s %q", errSyntax, t.Name, text)
	case kMoney:
		return appendMoney(dst, text)
	case kBool:
		switch string(text) {
		case "t":
			return append(dst, "true"...), false, nil
		case "f":
			return append(dst, "false"...), false, nil
		}
		return dst, false, fmt.Errorf("%w: boolean %q", errSyntax, text)
	case kBitBool:
		switch string(text) {
		case "1":
			return append(dst, "true"...), false, nil
		case "0":
			return append(dst, "false"...), false, nil
		}
		// A bit string of more than one bit has no boolean form (the Java connector writes
		// false): null, the text kept beside.
		if strings.Trim(string(text), "01") != "" {
			return dst, false, fmt.Errorf("%w: bit %q", errSyntax, text)
		}
		return append(dst, "null"...), true, nil
	case kBytea:
		if !bytes.HasPrefix(text, []byte(`\x`)) {
			return dst, false, fmt.Errorf("%w: bytea %q is not in hex form", errSyntax, text)
		}
		raw := make([]byte, hex.DecodedLen(len(text)-2))
		if _, err := hex.Decode(raw, text[2:]); err != nil {
			return dst, false, fmt.Errorf("bytea: %w", err)
		}
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, raw)
		return append(dst, '"'), false, nil
	case kDate, kTime, kTimeTZ, kTimestamp, kTimestampTZ:
		return t.appendTemporal(dst, text)
	case kInterval:
		if t.prof == Airbyte {
			return AppendString(dst, postgresInterval(text)), false, nil
		}
		return AppendString(dst, text), false, nil
	case kGeometric:
		if t.prof == Airbyte {
			out, err := appendJavaGeometric(dst, text)
			return out, false, err
		}
		return AppendString(dst, text), false, nil
	case kVector:
		return appendVector(dst, text)
	case kText:
		r, err := t.elem.serverText(text)
		if err != nil {
			return dst, false, err
		}
		return AppendString(dst, r), false, nil
	case kArray:
		return t.appendArray(dst, text)
	case kComposite:
		if t.prof == Airbyte {
			r, err := t.serverText(text)
			if err != nil {
				return dst, false, err
			}
			return AppendString(dst, r), false, nil
		}
		return t.appendComposite(dst, text)
	case kHstore:
		if t.prof == Airbyte {
			out, err := appendJavaHstore(dst, text)
			return out, false, err
		}
		keys, vals, err := parseHstore(text)
		if err != nil {
			return dst, false, err
		}
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(AppendString(dst, k), ':')
			if vals[i] == nil {
				dst = append(dst, "null"...)
			} else {
				dst = AppendString(dst, vals[i])
			}
		}
		return append(dst, '}'), false, nil
	}
	return AppendString(dst, text), false, nil
}

// appendVector writes an int2vector's or oidvector's text ("1 2 3", no braces: its lower bound
// is always 0) as a JSON array of integers.
func appendVector(dst, text []byte) ([]byte, bool, error) {
	out := append(dst, '[')
	for i, f := range bytes.Fields(text) {
		if !isInteger(f) {
			return dst, false, fmt.Errorf("%w: vector %q", errSyntax, text)
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, f...)
	}
	return append(out, ']'), false, nil
}

func (t *Type) appendArray(dst, text []byte) ([]byte, bool, error) {
	items, bounds, err := parseArray(text, t.delim)
	if err != nil {
		return dst, false, err
	}
	dst, lossy, err := t.elem.appendItems(dst, items)
	return dst, lossy || bounds != nil, err
}

func (t *Type) appendItems(dst []byte, items []arrayItem) ([]byte, bool, error) {
	dst = append(dst, '[')
	nulled := false
	for i, it := range items {
		if i > 0 {
			dst = append(dst, ',')
		}
		var n bool
		var err error
		switch {
		case it.null:
			dst = append(dst, "null"...)
		case it.isSub:
			dst, n, err = t.appendItems(dst, it.nested)
		default:
			dst, n, err = t.Append(dst, it.text)
		}
		if err != nil {
			return dst, false, err
		}
		nulled = nulled || n
	}
	return append(dst, ']'), nulled, nil
}

func (t *Type) appendComposite(dst, text []byte) ([]byte, bool, error) {
	d := t.def()
	if len(d.fields) == 0 && string(text) == "()" {
		// A type without attributes (CREATE TYPE e AS ()): its one value.
		return append(dst, "{}"...), false, nil
	}
	vals, err := parseComposite(text)
	if err != nil {
		return dst, false, err
	}
	// The stream prints a value with the attributes of its time; when the type changed since,
	// the value's fields may fit an earlier definition instead. The first reading under which
	// every field parses as its type wins: the current definition, then the most recent
	// earlier ones. Two definitions under which it parses alike cannot be told apart from the
	// text: the value is then marked lossy (its text kept beside it).
	var firstErr error
	readings := d.readings(vals)
	for i, byField := range readings {
		out, nulled, err := d.appendFields(dst, byField)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		// Another definition under which the value parses too, and reads otherwise: the value
		// may be from before a change of the type that this one cannot tell. The current reading
		// is written, marked lossy, so that the caller keeps the value's text beside it.
		for _, other := range readings[i+1:] {
			if alt, _, err := d.appendFields(nil, other); err == nil && string(alt) != string(out[len(dst):]) {
				nulled = true
				break
			}
		}
		return out, nulled, nil
	}
	if firstErr != nil && len(vals) == len(d.fields) {
		return dst, false, firstErr
	}
	return dst, false, &CompositeChangedError{OID: t.OID, Name: t.Name, Fields: len(vals), Have: len(d.fields)}
}

// appendFields appends the object of the current fields from their values (nil: null).
func (d *compositeDef) appendFields(dst []byte, byField [][]byte) ([]byte, bool, error) {
	dst = append(dst, '{')
	nulled := false
	for i, f := range d.fields {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(AppendString(dst, f.Name), ':')
		if byField[i] == nil {
			dst = append(dst, "null"...)
			continue
		}
		var n bool
		var err error
		if dst, n, err = f.Type.Append(dst, byField[i]); err != nil {
			return dst, false, err
		}
		nulled = nulled || n
	}
	return append(dst, '}'), nulled, nil
}

// readings maps the values of a composite onto the current fields (nil for a field the value
// did not have), once for each definition the value's field count fits: the current one, then
// the earlier ones from the most recent. Attributes are only ever appended (ADD ATTRIBUTE) or
// marked dropped, so an earlier definition is a prefix of every attribute, without the ones
// dropped before it (or with them, when they were dropped after).
func (d *compositeDef) readings(vals [][]byte) [][][]byte {
	var out [][][]byte
	if len(vals) == len(d.fields) {
		out = append(out, vals)
	}
	for p := len(d.all); p > 0; p-- {
		prefix := d.all[:p]
		live := 0
		for _, a := range prefix {
			if !a.dropped {
				live++
			}
		}
		for _, withDropped := range []bool{false, true} {
			n := live
			if withDropped {
				n = p
			}
			if n != len(vals) || withDropped && live == p {
				continue
			}
			if !withDropped && p == len(d.all) {
				continue // the current definition, tried first
			}
			byField := make([][]byte, len(d.fields))
			i := 0
			for _, a := range prefix {
				if a.dropped && !withDropped {
					continue
				}
				v := vals[i]
				i++
				if a.dropped {
					continue // a value of an attribute the type no longer has
				}
				for j, f := range d.fields {
					if f.Name == a.Name {
						byField[j] = v
					}
				}
			}
			out = append(out, byField)
		}
	}
	return out
}

// isNumber reports whether b is a JSON number (PostgreSQL prints numbers that are, but for NaN
// and the infinities).
func isNumber(b []byte) bool {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if digits() == 0 {
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(b)
}

func isInteger(b []byte) bool {
	if len(b) > 0 && b[0] == '-' {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 1 && b[0] == '0' {
		return false // no JSON integer (PostgreSQL prints no leading zero)
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// appendMoney turns money's text under lc_monetary=C ("$1,234.50", "-$3.00") into a number.
func appendMoney(dst, text []byte) ([]byte, bool, error) {
	start := len(dst)
	for _, c := range text {
		if c != '$' && c != ',' {
			dst = append(dst, c)
		}
	}
	if !isNumber(dst[start:]) {
		return dst[:start], false, fmt.Errorf("%w: money %q", errSyntax, text)
	}
	return dst, false, nil
}

// Schema returns the JSON schema of a column of type t: draft-07 with the formats and
// airbyte_type annotations Airbyte destinations read. Every value may be null. dims, the
// declared array dimensions (attndims), does not narrow it: PostgreSQL does not enforce them, so
// an array's items may be arrays at any depth, whatever the declaration.
func (t *Type) Schema(dims int) map[string]any {
	return t.schema(-1)
}

// schema is Schema for a column whose atttypmod is typmod (-1: none).
func (t *Type) schema(typmod int32) map[string]any {
	nullable := func(typ string, extra ...any) map[string]any {
		m := map[string]any{"type": []string{"null", typ}}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i].(string)] = extra[i+1]
		}
		return m
	}
	switch t.kind {
	case kInteger:
		return nullable("integer")
	case kNumber:
		// The Java connector types a numeric column declared with a scale of 0 as an integer.
		if t.prof == Airbyte && t.Name == "numeric" && typmod >= 4 && (typmod-4)&0xffff == 0 {
			return nullable("integer")
		}
		return nullable("number")
	case kMoney:
		return nullable("number")
	case kBool, kBitBool:
		return nullable("boolean")
	case kBytea:
		if t.prof == Airbyte {
			return nullable("string")
		}
		return nullable("string", "contentEncoding", "base64")
	case kDate:
		return nullable("string", "format", "date")
	case kTime:
		return nullable("string", "format", "time", "airbyte_type", "time_without_timezone")
	case kTimeTZ:
		return nullable("string", "format", "time", "airbyte_type", "time_with_timezone")
	case kTimestamp:
		return nullable("string", "format", "date-time", "airbyte_type", "timestamp_without_timezone")
	case kTimestampTZ:
		return nullable("string", "format", "date-time", "airbyte_type", "timestamp_with_timezone")
	case kArray:
		if t.untyped {
			return nullable("array")
		}
		items := t.elem.schema(-1)
		items["type"] = append(items["type"].([]string), "array")
		return nullable("array", "items", items)
	case kVector:
		return nullable("array", "items", nullable("integer"))
	case kComposite:
		if t.prof == Airbyte {
			return nullable("string")
		}
		props := map[string]any{}
		for _, f := range t.def().fields {
			props[f.Name] = f.Type.schema(-1)
		}
		return nullable("object", "properties", props)
	case kHstore:
		if t.prof == Airbyte {
			return nullable("string")
		}
		return nullable("object", "additionalProperties", map[string]any{"type": []string{"null", "string"}})
	}
	return nullable("string")
}

// Registry looks up Types by OID on a connection, once each.
type Registry struct {
	mu      sync.Mutex
	conn    *pgx.Conn
	types   map[uint32]*Type
	profile Profile
}

// NewRegistry returns a Registry of the Exact profile that queries pg_type on conn, which it
// does not own; it must not be used by anything else while the Registry queries it.
func NewRegistry(conn *pgx.Conn) *Registry {
	return NewProfileRegistry(conn, Exact)
}

// NewProfileRegistry returns a Registry whose Types write the forms of profile p.
func NewProfileRegistry(conn *pgx.Conn, p Profile) *Registry {
	return &Registry{conn: conn, types: map[uint32]*Type{}, profile: p}
}

// Profile is the profile of the Registry's Types.
func (r *Registry) Profile() Profile { return r.profile }

// Type returns the Type of oid.
func (r *Registry) Type(ctx context.Context, oid uint32) (*Type, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.load(ctx, oid, 0)
}

func (r *Registry) load(ctx context.Context, oid uint32, depth int) (*Type, error) {
	if t := r.types[oid]; t != nil {
		return t, nil
	}
	if depth > 20 {
		return nil, fmt.Errorf("type %d nests too deeply", oid)
	}
	var name, schema string
	var typtype, category, delim byte
	var elem, base, relid uint32
	var typmod int32
	err := r.conn.QueryRow(ctx, `SELECT t.typname, n.nspname, t.typtype, t.typcategory, t.typelem, t.typbasetype, t.typdelim, t.typrelid, t.typtypmod
		FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = $1`, oid).
		Scan(&name, &schema, &typtype, &category, &elem, &base, &delim, &relid, &typmod)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("type %d does not exist", oid)
	}
	if err != nil {
		return nil, fmt.Errorf("look up type %d: %w", oid, err)
	}
	t := &Type{OID: oid, Name: name, prof: r.profile}
	if schema != "pg_catalog" {
		t.Name = schema + "." + name
	}
	switch {
	case typtype == 'b' && schema == "pg_catalog" && (name == "int2vector" || name == "oidvector"):
		// Arrays by category, but printed without braces.
		t.kind = kVector
		if r.profile == Airbyte {
			t.kind = kString
		}
	case typtype == 'd':
		b, err := r.load(ctx, base, depth+1)
		if err != nil {
			return nil, err
		}
		c := *b
		c.OID, c.Name = oid, t.Name
		if typmod >= 0 {
			c.domTypmod, c.hasDomTypmod = typmod, true
		}
		t = &c
	case category == 'A' && elem != 0:
		e, err := r.load(ctx, elem, depth+1)
		if err != nil {
			return nil, err
		}
		var elemDelim byte
		if err := r.conn.QueryRow(ctx, `SELECT typdelim FROM pg_type WHERE oid = $1`, elem).Scan(&elemDelim); err != nil {
			return nil, fmt.Errorf("look up type %d: %w", elem, err)
		}
		t.kind, t.elem, t.delim = kArray, e, elemDelim
		if r.profile == Airbyte {
			// The Java connector types the arrays of some built-in types; the elements of every
			// other array are written as the text its driver receives.
			switch {
			case e.Name == "bit":
				t.elem = &Type{OID: e.OID, Name: e.Name, kind: kBitBool, prof: Airbyte}
			case e.Name == "bytea":
				t.elem = &Type{OID: e.OID, Name: e.Name, kind: kBytea, prof: Airbyte}
			case e.Name == "oid":
				// Integers, which the Java connector's catalog types as numbers in an array.
				t.elem = &Type{OID: e.OID, Name: e.Name, kind: kNumber, prof: Airbyte}
			case !airbyteTypedArrays[e.Name]:
				t.untyped = true
				t.elem = &Type{OID: e.OID, Name: e.Name, kind: kText, prof: Airbyte, elem: e}
			}
		}
	case typtype == 'c':
		t.kind = kComposite
		t.comp = &compositeHolder{}
		// The type is registered before its fields load: a field of its own type (through an
		// array) refers back to it.
		r.types[oid] = t
		d, err := r.composite(ctx, t.Name, relid, depth)
		if err != nil {
			delete(r.types, oid)
			return nil, err
		}
		t.fields = d.fields
		t.comp.def.Store(d)
	case typtype == 'b' && schema == "pg_catalog":
		t.base = name
		t.kind = builtinKinds[name]
		if k, ok := airbyteKinds[name]; ok && r.profile == Airbyte {
			t.kind = k
		}
	case typtype == 'b' && name == "hstore":
		t.base = "hstore"
		t.kind = kHstore
	}
	r.types[oid] = t
	return t, nil
}

// composite reads the attributes of the composite type whose pg_class is relid, dropped ones
// included.
func (r *Registry) composite(ctx context.Context, name string, relid uint32, depth int) (*compositeDef, error) {
	rows, err := r.conn.Query(ctx, `SELECT attname, atttypid, attisdropped FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 ORDER BY attnum`, relid)
	if err != nil {
		return nil, fmt.Errorf("look up fields of type %s: %w", name, err)
	}
	type field struct {
		name    string
		oid     uint32
		dropped bool
	}
	var fs []field
	for rows.Next() {
		var f field
		if err := rows.Scan(&f.name, &f.oid, &f.dropped); err != nil {
			rows.Close()
			return nil, err
		}
		fs = append(fs, f)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	d := &compositeDef{}
	for _, f := range fs {
		if f.dropped {
			d.all = append(d.all, attr{dropped: true})
			continue
		}
		ft, err := r.load(ctx, f.oid, depth+1)
		if err != nil {
			return nil, err
		}
		d.fields = append(d.fields, Field{Name: f.name, Type: ft})
		d.all = append(d.all, attr{Field: Field{Name: f.name, Type: ft}})
	}
	return d, nil
}

// Reload reads the composite type oid's attributes again (after ALTER TYPE ... ADD or DROP
// ATTRIBUTE), for every Type that shares it; values already encoded keep their form. It does
// nothing for other types.
func (r *Registry) Reload(ctx context.Context, oid uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.types[oid]
	if t == nil || t.comp == nil {
		return nil
	}
	var relid uint32 // a domain's is its base type's
	if err := r.conn.QueryRow(ctx, `SELECT coalesce(nullif(t.typrelid, 0), b.typrelid, 0) FROM pg_type t LEFT JOIN pg_type b ON b.oid = t.typbasetype WHERE t.oid = $1`, oid).Scan(&relid); err != nil {
		return fmt.Errorf("look up type %s: %w", t.Name, err)
	}
	d, err := r.composite(ctx, t.Name, relid, 0)
	if err != nil {
		return err
	}
	t.comp.def.Store(d)
	return nil
}

// Append appends the JSON form of a value of type t, as t.Append does; a composite whose fields
// changed since it was loaded (CompositeChangedError) is read again and the value encoded anew.
func (r *Registry) Append(ctx context.Context, t *Type, dst, text []byte) ([]byte, bool, error) {
	for attempt := 0; ; attempt++ {
		out, lossy, err := t.Append(dst, text)
		var changed *CompositeChangedError
		if err == nil || attempt == 3 || !errors.As(err, &changed) {
			return out, lossy, err
		}
		if err := r.Reload(ctx, changed.OID); err != nil {
			return dst, false, err
		}
	}
}

// builtinKinds maps the built-in base types that are not plain strings in JSON.
var builtinKinds = map[string]kind{
	"int2": kInteger, "int4": kInteger, "int8": kInteger, "oid": kInteger, "xid": kInteger, "xid8": kInteger, "cid": kInteger,
	"numeric": kNumber, "float4": kNumber, "float8": kNumber, "money": kMoney,
	"bool": kBool, "bytea": kBytea,
	"date": kDate, "time": kTime, "timetz": kTimeTZ, "timestamp": kTimestamp, "timestamptz": kTimestampTZ,
	"interval": kInterval,
	"point":    kGeometric, "line": kGeometric, "lseg": kGeometric, "box": kGeometric, "path": kGeometric, "polygon": kGeometric, "circle": kGeometric,
}

// airbyteKinds are the Airbyte profile's exceptions to builtinKinds: the Java connector's driver
// has no numeric type for xid, xid8 and cid, and bytea is its hex text.
var airbyteKinds = map[string]kind{"xid": kString, "xid8": kString, "cid": kString, "bytea": kString}

// airbyteTypedArrays are the element types whose arrays the Java connector writes element by
// element in their type's form (PostgresSourceOperations); bit and bytea elements have their own
// kinds there.
var airbyteTypedArrays = map[string]bool{
	"int2": true, "int4": true, "int8": true, "oid": true, "numeric": true, "money": true, "float4": true, "float8": true,
	"bool": true, "bit": true, "bytea": true, "date": true, "time": true, "timetz": true, "timestamp": true, "timestamptz": true,
	"varchar": true, "char": true, "bpchar": true, "text": true, "name": true,
}

// TableSchema returns the JSON schema of a row of schema.table: an object with one property per
// column (not the generated ones, which the change stream does not carry), each as Type.Schema
// describes it.
func (r *Registry) TableSchema(ctx context.Context, schema, table string) (map[string]any, error) {
	type col struct {
		name   string
		oid    uint32
		typmod int32
	}
	r.mu.Lock()
	rows, err := r.conn.Query(ctx, `SELECT a.attname, a.atttypid, a.atttypmod FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum`,
		pgx.Identifier{schema, table}.Sanitize())
	var cols []col
	if err == nil {
		for rows.Next() {
			var c col
			if err = rows.Scan(&c.name, &c.oid, &c.typmod); err != nil {
				break
			}
			cols = append(cols, c)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	r.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("read columns of %s.%s: %w", schema, table, err)
	}
	props := map[string]any{}
	for _, c := range cols {
		t, err := r.Type(ctx, c.oid)
		if err != nil {
			return nil, err
		}
		props[c.name] = t.schema(c.typmod)
	}
	return map[string]any{"type": "object", "properties": props}, nil
}
