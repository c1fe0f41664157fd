package jsonl

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
)

// Line is one line of the output: one event. Encoder writes it (without going through this type,
// for speed; the tests check that every line it writes decodes into a Line and encodes back to
// the same JSON); Decode and Reader read it.
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
	// Original holds, in PostgreSQL's text form, the values whose JSON form in After does not
	// carry the whole value (numeric NaN and a date's infinity, written as null, alone or inside
	// an array or a composite; an array whose lower bounds are not 1).
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

// Decode parses one line (with or without its newline). A field this version does not know is
// an error, not ignored: it would be lost.
func Decode(b []byte) (Line, error) {
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
	return l, nil
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

// Encoder encodes events as lines, keeping the encoded parts that events of one table share
// (table name, quoted column names, column types) per Columns. Values take their JSON form from
// their column's type (internal/pgjson), the same whichever path read them.
type Encoder struct {
	types    *pgjson.Registry
	cols     map[*merge.Columns]*encodedColumns
	lastTime time.Time
	timeJSON []byte
	nulled   []int // columns whose JSON form is lossy
}

// NewEncoder returns an Encoder whose values take their forms from types.
func NewEncoder(types *pgjson.Registry) *Encoder { return &Encoder{types: types} }

type encodedColumns struct {
	table []byte         // `,"table":"schema.name"`
	names [][]byte       // `"name":` per column
	types []*pgjson.Type // per column
}

func (e *Encoder) columns(ctx context.Context, c *merge.Columns) (*encodedColumns, error) {
	if ec := e.cols[c]; ec != nil {
		return ec, nil
	}
	if e.cols == nil || len(e.cols) > 10000 {
		e.cols = map[*merge.Columns]*encodedColumns{}
	}
	ec := &encodedColumns{table: pgjson.AppendString([]byte(`,"table":`), c.Schema+"."+c.Table)}
	for i, n := range c.Names {
		ec.names = append(ec.names, append(pgjson.AppendString(nil, n), ':'))
		t, err := e.types.Type(ctx, c.Types[i])
		if err != nil {
			return nil, fmt.Errorf("column %s of %s.%s: %w", n, c.Schema, c.Table, err)
		}
		ec.types = append(ec.types, t)
	}
	e.cols[c] = ec
	return ec, nil
}

// Append appends the line of one event (a Line, newline included) to b.
func (e *Encoder) Append(ctx context.Context, b []byte, ev *merge.Event) ([]byte, error) {
	cols := ev.Columns
	ec, err := e.columns(ctx, cols)
	if err != nil {
		return b, err
	}
	b = append(b, `{"op":"`...)
	b = append(b, ev.Op.String()...)
	b = append(b, '"')
	b = append(b, ec.table...)
	if ev.Op != merge.Truncate && ev.Op != merge.Refresh {
		b = append(b, `,"key":{`...)
		for i, k := range cols.Key {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, ec.names[k]...)
			if b, _, err = e.appendValue(ctx, b, ec.types[k], ev.Col(k)); err != nil {
				return b, fmt.Errorf("key column %s of %s.%s: %w", cols.Names[k], cols.Schema, cols.Table, err)
			}
		}
		b = append(b, '}')
	}
	if ev.Op != merge.Delete && ev.Op != merge.Truncate && ev.Op != merge.Refresh {
		b = append(b, `,"after":{`...)
		first := true
		var unchanged []string
		e.nulled = e.nulled[:0]
		for i := range ev.NumCols() {
			v := ev.Col(i)
			if v.Kind == replicator.Unchanged {
				unchanged = append(unchanged, cols.Names[i])
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = append(b, ec.names[i]...)
			var lossy bool
			if b, lossy, err = e.appendValue(ctx, b, ec.types[i], v); err != nil {
				return b, fmt.Errorf("column %s of %s.%s: %w", cols.Names[i], cols.Schema, cols.Table, err)
			}
			if lossy {
				e.nulled = append(e.nulled, i)
			}
		}
		b = append(b, '}')
		if len(unchanged) > 0 {
			b = append(b, `,"unchanged":[`...)
			for i, c := range unchanged {
				if i > 0 {
					b = append(b, ',')
				}
				b = pgjson.AppendString(b, c)
			}
			b = append(b, ']')
		}
		if len(e.nulled) > 0 {
			b = append(b, `,"original":{`...)
			for j, i := range e.nulled {
				if j > 0 {
					b = append(b, ',')
				}
				b = append(b, ec.names[i]...)
				b = pgjson.AppendString(b, ev.Col(i).Data)
			}
			b = append(b, '}')
		}
	}
	b = append(b, `,"lsn":"`...)
	b = append(b, ev.LSN.String()...)
	b = append(b, `","seq":`...)
	b = strconv.AppendInt(b, int64(ev.Seq), 10)
	if ev.XID != 0 {
		b = append(b, `,"xid":`...)
		b = strconv.AppendUint(b, uint64(ev.XID), 10)
	}
	if !ev.Time.IsZero() {
		if !ev.Time.Equal(e.lastTime) || e.timeJSON == nil {
			e.lastTime = ev.Time
			e.timeJSON = append(ev.Time.UTC().AppendFormat(append(e.timeJSON[:0], `,"time":"`...), time.RFC3339Nano), '"')
		}
		b = append(b, e.timeJSON...)
	}
	return append(b, '}', '\n'), nil
}

func (e *Encoder) appendValue(ctx context.Context, b []byte, t *pgjson.Type, v replicator.Value) ([]byte, bool, error) {
	if v.Kind != replicator.Text {
		return append(b, "null"...), false, nil
	}
	return e.types.Append(ctx, t, b, v.Data)
}
