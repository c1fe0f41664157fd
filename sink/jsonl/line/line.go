// Package line defines the JSON lines output's format once: Line, one event a line, and its
// strict reader (Decode, Reader). It imports nothing of the engine, so that what checks the
// output (the tests' oracle, the chaos harness) reads it without linking what wrote it; the
// writer is package sink/jsonl.
package line

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pglogrepl"
)

// Line is one line of the output: one event. sink/jsonl's Encoder writes it (without going
// through this type, for speed; its tests check that every line it writes decodes into a Line and
// encodes back to the same JSON); Decode and Reader read it.
//
//	{"op":"update","table":"public.t","key":{"id":1},"after":{"id":1,"n":null},"unchanged":["doc"],"original":{"n":"NaN"},"lsn":"0/16B3748","seq":0,"xid":731,"time":"2026-01-02T03:04:05.123456Z"}
type Line struct {
	// Op is merge.Op's name: insert, update, delete, snapshot (a backfilled row), truncate, or
	// refresh (the table's output starts over: drop its rows, its backfill follows).
	Op string `json:"op"`
	// Table is the source table, schema.name.
	Table string `json:"table"`
	// Key holds the key columns' values (every op but truncate and refresh).
	Key map[string]json.RawMessage `json:"key,omitempty"`
	// After holds the row's values, each in its type's JSON form (docs/types.md), NULL as null
	// (insert, update, snapshot). A column the server did not send is left out and listed in
	// Unchanged.
	After map[string]json.RawMessage `json:"after,omitempty"`
	// Unchanged lists the columns whose TOASTed value the server did not send with an update:
	// they keep the value they had.
	Unchanged []string `json:"unchanged,omitempty"`
	// Original holds, in PostgreSQL's text form, the values whose JSON form in After (for a
	// delete: in Key) does not carry the whole value (numeric NaN and a date's infinity, written
	// as null, alone or inside an array or a composite; an array whose lower bounds are not 1).
	Original map[string]string `json:"original,omitempty"`
	// LSN is the commit LSN of the source transaction, or of the chunk's high watermark for a
	// backfilled row; Seq orders the events of one LSN. (LSN, Seq) increases along the output.
	LSN LSN `json:"lsn"`
	Seq int `json:"seq"`
	// XID is the source transaction (0, left out, for backfilled rows).
	XID uint32 `json:"xid,omitempty"`
	// Time is the commit time of the source transaction or of the high watermark.
	Time time.Time `json:"time,omitzero"`
}

// LSN is a WAL position in its text form, 0/16B3748.
type LSN pglogrepl.LSN

func (l LSN) String() string { return pglogrepl.LSN(l).String() }

// MarshalText writes the LSN's text form.
func (l LSN) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText reads the LSN's text form.
func (l *LSN) UnmarshalText(b []byte) error {
	v, err := pglogrepl.ParseLSN(string(b))
	if err != nil {
		return err
	}
	*l = LSN(v)
	return nil
}

// fields are the names of Line's fields in the output, exactly as written.
var fields = map[string]bool{"op": true, "table": true, "key": true, "after": true, "unchanged": true,
	"original": true, "lsn": true, "seq": true, "xid": true, "time": true}

// Decode parses one line (with or without its newline). It is strict, since whatever it let
// through would be lost or misread without a word: a field this version does not know, a name in
// another case ("OP"), a field given twice, a line without op, table or lsn (0/0 is never an
// event's position), or more than one JSON value, is an error.
func Decode(b []byte) (Line, error) {
	if err := checkNames(b); err != nil {
		return Line{}, err
	}
	var l Line
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&l); err != nil {
		return Line{}, err
	}
	if d.More() {
		return Line{}, errors.New("more than one JSON value on the line")
	}
	if l.Op == "" || l.Table == "" {
		return Line{}, errors.New(`the line has no "op" or no "table"`)
	}
	if l.LSN == 0 {
		return Line{}, errors.New(`the line has no "lsn"`)
	}
	return l, nil
}

// checkNames checks that the line's object names only Line's fields, each once, in their case
// (encoding/json would match names in any case, and keep the last of two).
func checkNames(b []byte) error {
	d := json.NewDecoder(bytes.NewReader(b))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return errors.New("the line is not a JSON object")
	}
	seen := map[string]bool{}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return err
		}
		name, _ := t.(string)
		if !fields[name] {
			return fmt.Errorf("unknown field %q", name)
		}
		if seen[name] {
			return fmt.Errorf("field %q given twice", name)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := d.Decode(&skip); err != nil {
			return err
		}
	}
	return nil
}

// Reader reads the lines of an output one at a time.
type Reader struct {
	sc *bufio.Scanner
	n  int
}

// MaxLine is the longest line a Reader accepts.
const MaxLine = 1 << 30

// NewReader reads lines from r.
func NewReader(r io.Reader) *Reader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), MaxLine)
	return &Reader{sc: sc}
}

// Next returns the next line, or io.EOF after the last. An error names the line's number.
func (r *Reader) Next() (Line, error) {
	if !r.sc.Scan() {
		if err := r.sc.Err(); err != nil {
			return Line{}, fmt.Errorf("line %d: %w", r.n+1, err)
		}
		return Line{}, io.EOF
	}
	r.n++
	l, err := Decode(r.sc.Bytes())
	if err != nil {
		return Line{}, fmt.Errorf("line %d: %w", r.n, err)
	}
	return l, nil
}

// ReadAll reads every line of r.
func ReadAll(r io.Reader) ([]Line, error) {
	var out []Line
	rd := NewReader(r)
	for {
		l, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, l)
	}
}

// CanonicalNumber is a key value's JSON form as a key: a number without trailing fractional
// zeros and without the sign of a zero (a key is equal under its type's =, by which 1.0 and 1.00,
// 0 and -0 are one key, and the output may carry either form of it), anything else as it is.
func CanonicalNumber(j []byte) []byte {
	if len(j) == 0 || !(j[0] == '-' || (j[0] >= '0' && j[0] <= '9')) || bytes.ContainsAny(j, "eE") {
		return j
	}
	if bytes.IndexByte(j, '.') >= 0 {
		j = bytes.TrimRight(j, "0")
		j = bytes.TrimSuffix(j, []byte("."))
	}
	if len(j) > 1 && j[0] == '-' && len(bytes.Trim(j[1:], "0.")) == 0 {
		return []byte("0")
	}
	return j
}
