// Package debezium writes the engine's events in Debezium's change-event format, as its
// PostgreSQL connector writes them with the JSON converter and schemas disabled: a key record
// (the row's key columns) and a value record, the envelope of before, after, source, op, ts_ms
// and transaction. Consumers that read Debezium's topics (Flink's debezium-json, and whatever
// reads that envelope) read Tidemark's output the same way. docs/cli.md, "The Debezium format",
// gives the field mapping and where Tidemark's output differs.
//
// The mapping, and what it relies on:
//
//   - op: c (insert), u (update), d (delete), r (a backfilled row), t (a truncate, and a
//     Tidemark refresh: the table's rows start over and are read again, as r events; a consumer
//     that empties the table on t gets the same result).
//   - source.snapshot: "incremental" for backfilled rows (Debezium's own incremental snapshots
//     are the same watermark algorithm), "false" otherwise. source.lsn: the commit LSN of the
//     row's transaction (a backfilled row's: its chunk's high watermark), as a number;
//     source.txId: the transaction id (null for backfilled rows); source.ts_ms (and ts_us,
//     ts_ns): its commit time. The top-level ts_ms is when the event was encoded.
//   - before: a delete's row as the stream gave it: the key columns and nulls, or the whole
//     row under REPLICA IDENTITY FULL; an update's row before it under REPLICA IDENTITY FULL
//     (merge.Event.HasOld), null otherwise, as Debezium fills them. (Flink's debezium-json
//     refuses an update without before: it needs REPLICA IDENTITY FULL, with Debezium too.)
//   - A TOASTed value the update did not carry is Debezium's placeholder,
//     __debezium_unavailable_value, in the column's shape: a string, an array of it, or its
//     bytes for bytea.
//   - Values have Tidemark's exact JSON forms (docs/types.md), the same whether the backfill or
//     the stream read them: not Debezium's per-type encodings (epoch numbers for dates and
//     times, base64 decimals), which need the schema its converter writes beside them. A value
//     with no JSON form (NaN, infinity) is its PostgreSQL text, as a string.
package debezium

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"time"

	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
)

// Unavailable is Debezium's placeholder for a TOASTed value an update did not carry.
const Unavailable = "__debezium_unavailable_value"

// Encoder encodes events as Debezium key and value records.
type Encoder struct {
	types *pgjson.Registry
	// Name is source.name: the logical name of the capture (Debezium's topic.prefix).
	Name string
	// Database is source.db.
	Database string
	// Version is source.version.
	Version string
	// Now is the clock of the top-level ts_ms; nil: time.Now.
	Now  func() time.Time
	cols map[*merge.Columns]*columns
}

type columns struct {
	names  [][]byte       // `"name":` per column
	types  []*pgjson.Type // per column
	schema []byte         // `,"schema":"...","table":"..."`
}

// NewEncoder returns an Encoder whose values take their forms from types.
func NewEncoder(types *pgjson.Registry) *Encoder {
	return &Encoder{types: types, Name: "tidemark", Version: "tidemark"}
}

func (e *Encoder) columns(ctx context.Context, c *merge.Columns) (*columns, error) {
	if ec := e.cols[c]; ec != nil {
		return ec, nil
	}
	if e.cols == nil || len(e.cols) > 10000 {
		e.cols = map[*merge.Columns]*columns{}
	}
	ec := &columns{}
	ec.schema = pgjson.AppendString(append(pgjson.AppendString([]byte(`,"schema":`), c.Schema), `,"table":`...), c.Table)
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

// AppendKey appends the key record of ev (its key columns as a JSON object) to b. A truncate
// or a refresh has none: it appends nothing and reports false.
func (e *Encoder) AppendKey(ctx context.Context, b []byte, ev *merge.Event) ([]byte, bool, error) {
	if ev.Op == merge.Truncate || ev.Op == merge.Refresh {
		return b, false, nil
	}
	ec, err := e.columns(ctx, ev.Columns)
	if err != nil {
		return b, false, err
	}
	b = append(b, '{')
	for i, k := range ev.Columns.Key {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, ec.names[k]...)
		if b, err = e.value(ctx, b, ec.types[k], ev.Col(k)); err != nil {
			return b, false, fmt.Errorf("key column %s of %s.%s: %w", ev.Columns.Names[k], ev.Columns.Schema, ev.Columns.Table, err)
		}
	}
	return append(b, '}'), true, nil
}

// AppendValue appends the value record of ev (the envelope) to b.
func (e *Encoder) AppendValue(ctx context.Context, b []byte, ev *merge.Event) ([]byte, error) {
	ec, err := e.columns(ctx, ev.Columns)
	if err != nil {
		return b, err
	}
	var op byte
	switch ev.Op {
	case merge.Insert:
		op = 'c'
	case merge.Update:
		op = 'u'
	case merge.Delete:
		op = 'd'
	case merge.Snapshot:
		op = 'r'
	case merge.Truncate, merge.Refresh:
		op = 't'
	default:
		return b, fmt.Errorf("event of op %s has no Debezium form", ev.Op)
	}
	b = append(b, `{"before":`...)
	switch {
	case ev.Op == merge.Delete:
		if b, err = e.row(ctx, b, ec, ev, ev.NumCols(), ev.Col); err != nil {
			return b, err
		}
	case ev.HasOld():
		if b, err = e.row(ctx, b, ec, ev, ev.NumCols(), ev.OldCol); err != nil {
			return b, err
		}
	default:
		b = append(b, "null"...)
	}
	b = append(b, `,"after":`...)
	if op == 'c' || op == 'u' || op == 'r' {
		if b, err = e.row(ctx, b, ec, ev, ev.NumCols(), ev.Col); err != nil {
			return b, err
		}
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"source":{"version":`...)
	b = pgjson.AppendString(b, e.Version)
	b = append(b, `,"connector":"postgresql","name":`...)
	b = pgjson.AppendString(b, e.Name)
	b = append(b, `,"ts_ms":`...)
	t := ev.Time
	b = strconv.AppendInt(b, t.UnixMilli(), 10)
	b = append(b, `,"snapshot":`...)
	if ev.Op == merge.Snapshot {
		b = append(b, `"incremental"`...)
	} else {
		b = append(b, `"false"`...)
	}
	b = append(b, `,"db":`...)
	b = pgjson.AppendString(b, e.Database)
	b = append(b, `,"sequence":null,"ts_us":`...)
	b = strconv.AppendInt(b, t.UnixMicro(), 10)
	b = append(b, `,"ts_ns":`...)
	b = strconv.AppendInt(b, t.UnixNano(), 10)
	b = append(b, ec.schema...)
	b = append(b, `,"txId":`...)
	if ev.XID != 0 {
		b = strconv.AppendUint(b, uint64(ev.XID), 10)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"lsn":`...)
	b = strconv.AppendUint(b, uint64(ev.LSN), 10)
	b = append(b, `,"xmin":null},"transaction":null,"op":"`...)
	b = append(b, op)
	b = append(b, `","ts_ms":`...)
	now := time.Now
	if e.Now != nil {
		now = e.Now
	}
	b = strconv.AppendInt(b, now().UnixMilli(), 10)
	return append(b, '}'), nil
}

// row appends the object of ev's columns: every column, null where the event has no value
// (a delete's non-key columns without REPLICA IDENTITY FULL), the placeholder for an unchanged
// TOASTed value.
func (e *Encoder) row(ctx context.Context, b []byte, ec *columns, ev *merge.Event, n int, col func(int) replicator.Value) ([]byte, error) {
	b = append(b, '{')
	for i := range ec.names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, ec.names[i]...)
		if i >= n {
			b = append(b, "null"...)
			continue
		}
		v := col(i)
		if v.Kind == replicator.Unchanged {
			b = unavailable(b, ec.types[i])
			continue
		}
		var err error
		if b, err = e.value(ctx, b, ec.types[i], v); err != nil {
			return b, fmt.Errorf("column %s of %s.%s: %w", ev.Columns.Names[i], ev.Columns.Schema, ev.Columns.Table, err)
		}
	}
	return append(b, '}'), nil
}

// unavailable appends the placeholder in the shape of the column's type, as Debezium's connector
// writes it: the string, an array of it for an array, its bytes (base64) for bytea.
func unavailable(b []byte, t *pgjson.Type) []byte {
	switch {
	case t.Name == "bytea":
		return pgjson.AppendString(b, base64.StdEncoding.EncodeToString([]byte(Unavailable)))
	case t.IsArray():
		return append(pgjson.AppendString(append(b, '['), Unavailable), ']')
	}
	return pgjson.AppendString(b, Unavailable)
}

// value appends one value in its exact JSON form; one the form does not carry whole (NaN,
// infinity, an array with other lower bounds) is its PostgreSQL text, as a string.
func (e *Encoder) value(ctx context.Context, b []byte, t *pgjson.Type, v replicator.Value) ([]byte, error) {
	if v.Kind != replicator.Text {
		return append(b, "null"...), nil
	}
	start := len(b)
	b, lossy, err := e.types.Append(ctx, t, b, v.Data)
	if err != nil {
		return b, err
	}
	if lossy {
		b = pgjson.AppendString(b[:start], v.Data)
	}
	return b, nil
}
