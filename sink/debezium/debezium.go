// Package debezium writes the engine's events in Debezium's change-event format, as its
// PostgreSQL connector writes them through Kafka Connect's JSON converter: a key record (the
// row's key columns) and a value record, the envelope of before, after, source, op, ts_ms and
// transaction; with Schemas, each wrapped as the converter's schemas.enable writes it
// ({"schema":...,"payload":...}). Consumers that read Debezium's topics (Kafka Connect sinks,
// Flink's debezium-json, and whatever reads that envelope) read Tidemark's output the same way.
// docs/cli.md, "The Debezium format", gives the field mapping and where Tidemark's output
// differs.
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
//     ts_ns): its commit time. The top-level ts_ms (ts_us, ts_ns) is when the event was encoded.
//   - before: a delete's row as the stream gave it: the key columns and nulls, or the whole
//     row under REPLICA IDENTITY FULL; an update's row before it under REPLICA IDENTITY FULL
//     (merge.Event.HasOld), null otherwise, as Debezium fills them. (Flink's debezium-json
//     refuses an update without before: it needs REPLICA IDENTITY FULL, with Debezium too.)
//   - A TOASTed value the update did not carry is Debezium's placeholder,
//     __debezium_unavailable_value, in the column's shape (pgjson.Debezium.AppendUnavailable).
//     With Schemas the sync has such rows read again whole (merge.Config.RereadPartial): the
//     placeholder does not fit most columns' schemas (a number's, a Decimal's).
//   - Values have Debezium's per-type forms (pgjson.Debezium: days, micros, Decimal bytes,
//     ZonedTimestamp strings...), computed from the value's text, which is the same whether the
//     backfill or the stream read it: one form per value. The decimal mode is Debezium's
//     decimal.handling.mode; a value its form cannot carry (a numeric NaN in the precise mode)
//     stops the sync with the fix, as it stops Debezium's connector.
//   - The schema (Schemas) declares a column optional unless it is in the key: Tidemark does
//     not read NOT NULL, and a nullable declaration accepts every value.
package debezium

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
)

// Unavailable is Debezium's placeholder for a TOASTed value an update did not carry.
const Unavailable = pgjson.Unavailable

// Encoder encodes events as Debezium key and value records.
type Encoder struct {
	types *pgjson.Registry
	// Name is source.name: the logical name of the capture (Debezium's topic.prefix).
	Name string
	// Database is source.db.
	Database string
	// Version is source.version.
	Version string
	// Decimal is how numeric and money values are written (Debezium's decimal.handling.mode).
	Decimal pgjson.DecimalMode
	// Schemas wraps each key and value with its schema, as Kafka Connect's JSON converter
	// writes them with schemas.enable.
	Schemas bool
	// Now is the clock of the top-level ts_ms; nil: time.Now.
	Now  func() time.Time
	cols map[*merge.Columns]*columns
}

// Format is the output's format as its checkpoint records it and a run's flags spell it: a run
// in another one is refused, since a consumer would meet two forms of the same column.
func (e *Encoder) Format() string {
	f := "debezium --debezium-decimal " + e.Decimal.String()
	if e.Schemas {
		f += " --debezium-schemas"
	}
	return f
}

// legacy is the format an earlier Tidemark recorded for its Debezium envelopes, which held
// Tidemark's value forms, not Debezium's.
const legacy = "debezium"

// Continue says how a run continues an output whose checkpoint records format held (a Format,
// or "tidemark").
func Continue(held string) string {
	if held == legacy {
		return "a new output (an earlier Tidemark wrote this one's Debezium envelopes with its own value forms, which no run writes now)"
	}
	return "--format " + held
}

type columns struct {
	names  [][]byte           // `"name":` per column
	forms  []*pgjson.Debezium // per column
	source []byte             // `,"schema":"...","table":"..."`
	// With Schemas: `{"schema":...,"payload":` of the key and of the value.
	keySchema, valueSchema []byte
}

// NewEncoder returns an Encoder that reads the columns' types from types (of the exact
// profile).
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
	ec.source = pgjson.AppendString(append(pgjson.AppendString([]byte(`,"schema":`), c.Schema), `,"table":`...), c.Table)
	for i, n := range c.Names {
		ec.names = append(ec.names, append(pgjson.AppendString(nil, n), ':'))
		t, err := e.types.Type(ctx, c.Types[i])
		if err != nil {
			return nil, fmt.Errorf("column %s of %s.%s: %w", n, c.Schema, c.Table, err)
		}
		typmod := int32(-1)
		if i < len(c.TypeMods) {
			typmod = c.TypeMods[i]
		}
		form := t.Debezium(typmod, e.Decimal)
		if e.Schemas {
			form = form.OneDimension()
		}
		ec.forms = append(ec.forms, form)
	}
	if e.Schemas {
		e.schemas(ec, c)
	}
	e.cols[c] = ec
	return ec, nil
}

// schemas writes the key's and the envelope's schemas, as Debezium's connector declares them.
func (e *Encoder) schemas(ec *columns, c *merge.Columns) {
	name := e.Name + "." + c.Schema + "." + c.Table
	inKey := make([]bool, len(c.Names))
	for _, k := range c.Key {
		inKey[k] = true
	}
	row := func(b []byte, cols []int, optional bool, suffix, field string) []byte {
		b = append(b, `{"type":"struct","fields":[`...)
		for n, i := range cols {
			if n > 0 {
				b = append(b, ',')
			}
			b = ec.forms[i].AppendSchema(b, c.Names[i], !inKey[i])
		}
		b = strconv.AppendBool(append(b, `],"optional":`...), optional)
		b = pgjson.AppendString(append(b, `,"name":`...), name+suffix)
		if field != "" {
			b = pgjson.AppendString(append(b, `,"field":`...), field)
		}
		return append(b, '}')
	}
	ec.keySchema = append(row([]byte(`{"schema":`), c.Key, false, ".Key", ""), `,"payload":`...)
	all := make([]int, len(c.Names))
	for i := range all {
		all[i] = i
	}
	b := []byte(`{"schema":{"type":"struct","fields":[`)
	b = append(row(b, all, true, ".Value", "before"), ',')
	b = append(row(b, all, true, ".Value", "after"), ',')
	b = append(b, sourceSchema...)
	b = append(b, `,{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"},`...)
	b = append(b, transactionSchema...)
	b = append(b, `],"optional":false,"name":`...)
	b = pgjson.AppendString(b, name+".Envelope")
	ec.valueSchema = append(b, `,"version":2},"payload":`...)
}

// sourceSchema is the source block's schema (io.debezium.connector.postgresql.Source).
const sourceSchema = `{"type":"struct","fields":[` +
	`{"type":"string","optional":false,"field":"version"},` +
	`{"type":"string","optional":false,"field":"connector"},` +
	`{"type":"string","optional":false,"field":"name"},` +
	`{"type":"int64","optional":false,"field":"ts_ms"},` +
	`{"type":"string","optional":true,"name":"io.debezium.data.Enum","version":1,"parameters":{"allowed":"true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},"default":"false","field":"snapshot"},` +
	`{"type":"string","optional":false,"field":"db"},` +
	`{"type":"string","optional":true,"field":"sequence"},` +
	`{"type":"int64","optional":true,"field":"ts_us"},` +
	`{"type":"int64","optional":true,"field":"ts_ns"},` +
	`{"type":"string","optional":false,"field":"schema"},` +
	`{"type":"string","optional":false,"field":"table"},` +
	`{"type":"int64","optional":true,"field":"txId"},` +
	`{"type":"int64","optional":true,"field":"lsn"},` +
	`{"type":"int64","optional":true,"field":"xmin"},` +
	`{"type":"string","optional":true,"field":"origin"},` +
	`{"type":"int64","optional":true,"field":"origin_lsn"}` +
	`],"optional":false,"name":"io.debezium.connector.postgresql.Source","version":1,"field":"source"}`

// transactionSchema is the transaction block's schema (event.block); Tidemark writes it null.
const transactionSchema = `{"type":"struct","fields":[` +
	`{"type":"string","optional":false,"field":"id"},` +
	`{"type":"int64","optional":false,"field":"total_order"},` +
	`{"type":"int64","optional":false,"field":"data_collection_order"}` +
	`],"optional":true,"name":"event.block","version":1,"field":"transaction"}`

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
	b = append(b, ec.keySchema...)
	b = append(b, '{')
	for i, k := range ev.Columns.Key {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, ec.names[k]...)
		if b, err = e.value(b, ec.forms[k], ev.Col(k)); err != nil {
			return b, false, fmt.Errorf("key column %s of %s.%s: %w", ev.Columns.Names[k], ev.Columns.Schema, ev.Columns.Table, err)
		}
	}
	b = append(b, '}')
	if e.Schemas {
		b = append(b, '}')
	}
	return b, true, nil
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
	b = append(b, ec.valueSchema...)
	b = append(b, `{"before":`...)
	switch {
	case ev.Op == merge.Delete:
		if b, err = e.row(b, ec, ev, ev.NumCols(), ev.Col); err != nil {
			return b, err
		}
	case ev.HasOld():
		if b, err = e.row(b, ec, ev, ev.NumCols(), ev.OldCol); err != nil {
			return b, err
		}
	default:
		b = append(b, "null"...)
	}
	b = append(b, `,"after":`...)
	if op == 'c' || op == 'u' || op == 'r' {
		if b, err = e.row(b, ec, ev, ev.NumCols(), ev.Col); err != nil {
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
	b = append(b, ec.source...)
	b = append(b, `,"txId":`...)
	if ev.XID != 0 {
		b = strconv.AppendUint(b, uint64(ev.XID), 10)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"lsn":`...)
	b = strconv.AppendUint(b, uint64(ev.LSN), 10)
	b = append(b, `,"xmin":null,"origin":null,"origin_lsn":null},"op":"`...)
	b = append(b, op)
	now := time.Now
	if e.Now != nil {
		now = e.Now
	}
	n := now()
	b = strconv.AppendInt(append(b, `","ts_ms":`...), n.UnixMilli(), 10)
	b = strconv.AppendInt(append(b, `,"ts_us":`...), n.UnixMicro(), 10)
	b = strconv.AppendInt(append(b, `,"ts_ns":`...), n.UnixNano(), 10)
	b = append(b, `,"transaction":null}`...)
	if e.Schemas {
		b = append(b, '}')
	}
	return b, nil
}

// row appends the object of ev's columns: every column, null where the event has no value
// (a delete's non-key columns without REPLICA IDENTITY FULL), the placeholder for an unchanged
// TOASTed value.
func (e *Encoder) row(b []byte, ec *columns, ev *merge.Event, n int, col func(int) replicator.Value) ([]byte, error) {
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
			if e.Schemas && !ec.forms[i].UnavailableFits() {
				// The sync reads such rows again whole (merge.Config.RereadPartial): one here
				// would not match the column's schema.
				return b, fmt.Errorf("column %s of %s.%s: an update left its TOASTed value out, and Debezium's placeholder does not fit the column's schema", ev.Columns.Names[i], ev.Columns.Schema, ev.Columns.Table)
			}
			b = ec.forms[i].AppendUnavailable(b)
			continue
		}
		var err error
		if b, err = e.value(b, ec.forms[i], v); err != nil {
			return b, fmt.Errorf("column %s of %s.%s: %w", ev.Columns.Names[i], ev.Columns.Schema, ev.Columns.Table, err)
		}
	}
	return append(b, '}'), nil
}

// value appends one value in its Debezium form.
func (e *Encoder) value(b []byte, f *pgjson.Debezium, v replicator.Value) ([]byte, error) {
	if v.Kind != replicator.Text {
		return append(b, "null"...), nil
	}
	return f.Append(b, v.Data)
}
