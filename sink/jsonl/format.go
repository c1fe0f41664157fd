package jsonl

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
)

// Encoder encodes events as lines, keeping the encoded parts that events of one table share
// (table name, quoted column names, column types) per Columns. Values take their JSON form from
// their column's type (internal/pgjson), the same whichever path read them.
type Encoder struct {
	types    *pgjson.Registry
	cols     map[*merge.Columns]*encodedColumns
	lastTime time.Time
	timeJSON []byte
	// The last event's position text: a chunk's rows, and a transaction's changes, share one
	// LSN, which is formatted once.
	lastLSN pglogrepl.LSN
	lsnText []byte
	nulled  []int // columns whose JSON form is lossy
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
	e.nulled = e.nulled[:0]
	if ev.Op != merge.Truncate && ev.Op != merge.Refresh {
		b = append(b, `,"key":`...)
		if b, err = e.appendKey(ctx, b, ec, ev); err != nil {
			return b, err
		}
	}
	if ev.Op != merge.Delete && ev.Op != merge.Truncate && ev.Op != merge.Refresh {
		b = append(b, `,"after":{`...)
		first := true
		var unchanged []string
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
	b = append(b, `,"lsn":"`...)
	if ev.LSN != e.lastLSN || e.lsnText == nil {
		e.lastLSN, e.lsnText = ev.LSN, append(e.lsnText[:0], ev.LSN.String()...)
	}
	b = append(b, e.lsnText...)
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

// AppendKey appends the JSON object of ev's key columns ({"id":1}, the line's "key") to b. A
// Truncate or a Refresh has no key: it appends nothing.
func (e *Encoder) AppendKey(ctx context.Context, b []byte, ev *merge.Event) ([]byte, error) {
	if ev.Op == merge.Truncate || ev.Op == merge.Refresh {
		return b, nil
	}
	ec, err := e.columns(ctx, ev.Columns)
	if err != nil {
		return b, err
	}
	e.nulled = e.nulled[:0]
	return e.appendKey(ctx, b, ec, ev)
}

// appendKey appends ev's key object, noting in e.nulled the key columns of a Delete whose JSON
// form is lossy (a delete has no "after" whose original would carry the key whole).
func (e *Encoder) appendKey(ctx context.Context, b []byte, ec *encodedColumns, ev *merge.Event) ([]byte, error) {
	cols := ev.Columns
	b = append(b, '{')
	for i, k := range cols.Key {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, ec.names[k]...)
		var lossy bool
		var err error
		if b, lossy, err = e.appendValue(ctx, b, ec.types[k], ev.Col(k)); err != nil {
			return b, fmt.Errorf("key column %s of %s.%s: %w", cols.Names[k], cols.Schema, cols.Table, err)
		}
		if lossy && ev.Op == merge.Delete {
			e.nulled = append(e.nulled, k)
		}
	}
	return append(b, '}'), nil
}

func (e *Encoder) appendValue(ctx context.Context, b []byte, t *pgjson.Type, v replicator.Value) ([]byte, bool, error) {
	if v.Kind != replicator.Text {
		return append(b, "null"...), false, nil
	}
	return e.types.Append(ctx, t, b, v.Data)
}
