package main

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
)

// rowColumns names the columns of rows to encode.
type rowColumns struct {
	schema, table string
	names         []string
	types         []uint32
}

func chunkColumns(t *chunker.Table) *rowColumns {
	c := &rowColumns{schema: t.Schema, table: t.Name}
	for _, col := range t.Columns {
		c.names = append(c.names, col.Name)
		c.types = append(c.types, col.TypeOID)
	}
	return c
}

// plan is how the rows of one table definition become RECORD lines for one stream.
type plan struct {
	names   []string
	types   []uint32
	prefix  []byte         // {"type":"RECORD","record":{"namespace":...,"stream":...,"data":{
	keys    [][]byte       // `"column":` per column
	codecs  []*pgjson.Type // per column
	include []bool         // the column is in the configured stream's schema
	meta    [3]bool        // _ab_cdc_lsn, _ab_cdc_updated_at, _ab_cdc_deleted_at are in it
	clash   string         // a configured column named as one of the metadata columns
}

// rowEncoder encodes rows and events of one stream's table as RECORD lines: the configured
// columns only, values in their type's JSON form (internal/pgjson, the same for the backfill and
// the stream), and the CDC metadata columns.
type rowEncoder struct {
	types   *pgjson.Registry
	st      *readStream
	plans   []*plan // the table's definitions seen, latest last
	changes []byte  // meta.changes of the record being encoded
	// The last event's commit time as the metadata columns write it: a chunk's rows, and a
	// transaction's changes, share one, which is formatted once.
	lastTime time.Time
	timeText []byte
}

func newRowEncoder(types *pgjson.Registry, st *readStream) *rowEncoder {
	return &rowEncoder{types: types, st: st}
}

func (e *rowEncoder) prepare(ctx context.Context, c *rowColumns) error {
	_, err := e.plan(ctx, c.names, c.types)
	return err
}

func (e *rowEncoder) plan(ctx context.Context, names []string, types []uint32) (*plan, error) {
	for i := len(e.plans) - 1; i >= 0; i-- {
		if p := e.plans[i]; slices.Equal(p.names, names) && slices.Equal(p.types, types) {
			return p, nil
		}
	}
	st := e.st
	p := &plan{names: names, types: types}
	p.prefix = append(p.prefix, `{"type":"RECORD","record":{`...)
	if st.desc.Namespace != nil {
		p.prefix = append(pgjson.AppendString(append(p.prefix, `"namespace":`...), *st.desc.Namespace), ',')
	}
	p.prefix = append(pgjson.AppendString(append(p.prefix, `"stream":`...), st.desc.Name), `,"data":{`...)
	for i, n := range names {
		p.keys = append(p.keys, append(pgjson.AppendString(nil, n), ':'))
		t, err := e.types.Type(ctx, types[i])
		if err != nil {
			return nil, err
		}
		p.codecs = append(p.codecs, t)
		p.include = append(p.include, st.columns == nil || st.columns[n])
	}
	for i, n := range []string{colLSN, colUpdatedAt, colDeletedAt} {
		p.meta[i] = st.columns == nil || st.columns[n]
		if slices.Contains(names, n) && p.meta[i] && p.clash == "" {
			p.clash = n
		}
	}
	if len(e.plans) >= 8 {
		e.plans = e.plans[1:]
	}
	e.plans = append(e.plans, p)
	return p, nil
}

// appendRow appends the RECORD of a row read by a full refresh (no CDC metadata).
func (e *rowEncoder) appendRow(ctx context.Context, b []byte, c *rowColumns, row chunker.Row) ([]byte, error) {
	p, err := e.plan(ctx, c.names, c.types)
	if err != nil {
		return b, err
	}
	b, _ = e.appendData(ctx, append(b, p.prefix...), p, func(i int) replicator.Value {
		if row[i] == nil {
			return replicator.Value{Kind: replicator.Null}
		}
		return replicator.Value{Kind: replicator.Text, Data: row[i]}
	}, nil)
	return e.finish(b, time.Now().UnixMilli()), nil
}

// appendEvent appends the RECORD of an engine event, with _ab_cdc_lsn (the transaction's commit
// LSN, or the high watermark's for backfilled rows), _ab_cdc_updated_at (its commit time) and,
// for a delete, _ab_cdc_deleted_at.
func (e *rowEncoder) appendEvent(ctx context.Context, b []byte, ev *merge.Event, emittedAt int64) ([]byte, error) {
	c := ev.Columns
	p, err := e.plan(ctx, c.Names, c.Types)
	if err != nil {
		return b, err
	}
	if p.clash != "" {
		return b, metadataClash(streamKey(c.Schema, c.Table), p.clash)
	}
	var isKey []bool
	if ev.Op == merge.Delete {
		isKey = make([]bool, len(c.Names))
		for _, k := range c.Key {
			isKey[k] = true
		}
	}
	b, first := e.appendData(ctx, append(b, p.prefix...), p, ev.Col, isKey)
	if !ev.Time.Equal(e.lastTime) || e.timeText == nil {
		e.lastTime = ev.Time
		e.timeText = ev.Time.UTC().AppendFormat(e.timeText[:0], "2006-01-02T15:04:05.000000Z")
	}
	sep := func() {
		if !first {
			b = append(b, ',')
		}
		first = false
	}
	if p.meta[0] {
		sep()
		b = strconv.AppendUint(append(b, `"_ab_cdc_lsn":`...), uint64(ev.LSN), 10)
	}
	if p.meta[1] {
		sep()
		b = append(append(append(b, `"_ab_cdc_updated_at":"`...), e.timeText...), '"')
	}
	if p.meta[2] {
		sep()
		if ev.Op == merge.Delete {
			b = append(append(append(b, `"_ab_cdc_deleted_at":"`...), e.timeText...), '"')
		} else {
			b = append(b, `"_ab_cdc_deleted_at":null`...)
		}
	}
	return e.finish(b, emittedAt), nil
}

// appendData appends the configured columns' values. For a delete (isKey set), only the key
// columns and the values the old row carried are written. Every value whose JSON form is not the
// whole value is listed in meta.changes: written as null when it has no form in the column's
// schema (numeric NaN, a date's infinity) or cannot be encoded (NULLED), written in part when a
// part of it had none (a NaN element of an array, an array's lower bounds; TRUNCATED). A TOASTed
// value the server did not send (never expected: the engine re-reads such rows) is left out and
// listed too.
func (e *rowEncoder) appendData(ctx context.Context, b []byte, p *plan, col func(int) replicator.Value, isKey []bool) ([]byte, bool) {
	e.changes = e.changes[:0]
	first := true
	for i := range p.names {
		if !p.include[i] {
			continue
		}
		v := col(i)
		if isKey != nil && !isKey[i] && v.Kind != replicator.Text {
			continue
		}
		if v.Kind == replicator.Unchanged {
			e.change(p.names[i], "NULLED", "SOURCE_RETRIEVAL_ERROR")
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, p.keys[i]...)
		if v.Kind != replicator.Text {
			b = append(b, "null"...)
			continue
		}
		start := len(b)
		out, lossy, err := e.types.Append(ctx, p.codecs[i], b, v.Data)
		switch {
		case err != nil:
			b = append(b[:start], "null"...)
			e.change(p.names[i], "NULLED", "SOURCE_SERIALIZATION_ERROR")
		case lossy && string(out[start:]) == "null":
			b = out
			e.change(p.names[i], "NULLED", "SOURCE_SERIALIZATION_ERROR")
		case lossy:
			b = out
			e.change(p.names[i], "TRUNCATED", "SOURCE_SERIALIZATION_ERROR")
		default:
			b = out
		}
	}
	return b, first
}

func (e *rowEncoder) change(field, change, reason string) {
	if len(e.changes) > 0 {
		e.changes = append(e.changes, ',')
	}
	e.changes = append(pgjson.AppendString(append(e.changes, `{"field":`...), field), `,"change":"`...)
	e.changes = append(append(e.changes, change...), `","reason":"`...)
	e.changes = append(append(e.changes, reason...), `"}`...)
}

func (e *rowEncoder) finish(b []byte, emittedAt int64) []byte {
	b = strconv.AppendInt(append(b, `},"emitted_at":`...), emittedAt, 10)
	if len(e.changes) > 0 {
		b = append(append(append(b, `,"meta":{"changes":[`...), e.changes...), `]}`...)
	}
	return append(b, '}', '}', '\n')
}

// maxTxBytes bounds the records of one transaction held back to be collapsed per key.
const maxTxBytes = 64 << 20

// maxEarlyKeys bounds the keys of a transaction remembered as already written (recordSink.early):
// 2 MB of map at most. Past it the sink stops telling keys apart (recordSink.spaceAll).
const maxEarlyKeys = 1 << 16

// recordSink is the engine's sink in a read: events become RECORD lines, checkpoints STATE
// messages. A transaction's records are held until it ends and collapsed to one record per key
// (its last), since they share one _ab_cdc_lsn and a destination could not order them.
type recordSink struct {
	r        *reader
	streams  map[string]*readStream
	encoders map[*readStream]*rowEncoder

	lsn     pglogrepl.LSN  // the transaction being held
	lines   [][]byte       // its records, in order; nil where a later record of the key replaced it
	index   map[string]int // key → index in lines
	bytes   int
	snap    []byte // backfilled rows of the current chunk (keys unique, no collapsing needed)
	snapN   int
	early   map[uint64]bool // keys of the transaction already written (it outgrew maxTxBytes)
	earlyAt int64           // when they were written (ms)
	// spaceAll replaces early once the transaction has written more than maxEarlyKeys keys:
	// every later record of the transaction is then treated as one whose key was written.
	spaceAll bool
	seed     maphash.Seed
}

func newRecordSink(r *reader, tables []*readStream) *recordSink {
	s := &recordSink{r: r, streams: map[string]*readStream{}, encoders: map[*readStream]*rowEncoder{},
		index: map[string]int{}, seed: maphash.MakeSeed()}
	for _, t := range tables {
		s.streams[t.key()] = t
		s.encoders[t] = newRowEncoder(r.types, t)
	}
	return s
}

// Emit encodes events; a transaction's records go out when it ends.
func (s *recordSink) Emit(ctx context.Context, evs []merge.Event) error {
	now := time.Now().UnixMilli()
	for i := range evs {
		ev := &evs[i]
		st := s.streams[streamKey(ev.Columns.Schema, ev.Columns.Table)]
		if st == nil {
			continue
		}
		if ev.LSN != s.lsn {
			if err := s.flush(); err != nil {
				return err
			}
			s.lsn, s.early, s.spaceAll = ev.LSN, nil, false
		}
		switch ev.Op {
		case merge.Truncate:
			// Records cannot remove rows: passing over it would leave the destination with rows
			// the source no longer has. The read stops before it (its state is not emitted), and
			// a reset of the stream starts it over behind the truncate (a refresh).
			if err := s.flush(); err != nil {
				return err
			}
			return configErrorf("table %s was truncated on the source (transaction %d, commit %s), and Airbyte records cannot remove its rows from the destination: "+
				"reset the stream (in Airbyte: the connection's settings, Clear data or Reset for stream %s), and sync again; it is backfilled from scratch, behind the truncate",
				st.key(), ev.XID, ev.LSN, st.key())
		case merge.Refresh:
			// The stream starts over (it was reset, or is new): the platform cleared what the
			// destination had, or it had nothing.
			continue
		}
		enc := s.encoders[st]
		if ev.Op == merge.Snapshot {
			var err error
			if s.snap, err = enc.appendEvent(ctx, s.snap, ev, now); err != nil {
				return err
			}
			s.snapN++
			continue
		}
		key := st.key() + "\x00" + string(ev.Key)
		if s.spaceAll || s.early != nil && s.early[maphash.String(s.seed, key)] {
			// An earlier record of this key in this transaction is already out (or may be): this
			// one must be told apart by a later emitted_at (destinations break ties with it).
			for now <= s.earlyAt {
				time.Sleep(time.Millisecond)
				now = time.Now().UnixMilli()
			}
		}
		line, err := enc.appendEvent(ctx, nil, ev, now)
		if err != nil {
			return err
		}
		if j, ok := s.index[key]; ok {
			s.bytes -= len(s.lines[j])
			s.lines[j] = nil
		}
		s.index[key] = len(s.lines)
		s.lines = append(s.lines, line)
		s.bytes += len(line)
		if s.bytes > maxTxBytes {
			// The keys written are remembered so that only their later records wait for a new
			// millisecond. A transaction of millions of rows would make that set hundreds of MB:
			// past maxEarlyKeys it is dropped, and every later record of the transaction gets an
			// emitted_at after the last part's. That keeps the destination's tie-break right for
			// every key, at the cost of at most a millisecond's wait per part written (each part
			// is maxTxBytes of records): once the clock has passed earlyAt, the records that
			// follow are stamped later without waiting, until the next part.
			switch {
			case s.spaceAll:
			case len(s.early)+len(s.index) > maxEarlyKeys:
				s.early, s.spaceAll = nil, true
			default:
				if s.early == nil {
					s.early = map[uint64]bool{}
				}
				for k := range s.index {
					s.early[maphash.String(s.seed, k)] = true
				}
			}
			if err := s.flush(); err != nil {
				return err
			}
			s.earlyAt = time.Now().UnixMilli()
		}
	}
	return nil
}

// Checkpoint writes the held records and a STATE for pos.
func (s *recordSink) Checkpoint(_ context.Context, pos *merge.Position) error {
	if err := s.flush(); err != nil {
		return err
	}
	s.r.setPosition(pos)
	if err := s.r.emitState(nil); err != nil {
		// A STATE partly written may have reached the platform.
		return fmt.Errorf("%w: %w", merge.ErrCommitUnknown, err)
	}
	return nil
}

// flush writes the held records.
func (s *recordSink) flush() error {
	out := s.r.s.out
	if s.snapN > 0 {
		if err := out.writeRecords(s.snap, s.snapN); err != nil {
			return err
		}
		s.snap, s.snapN = s.snap[:0], 0
	}
	if len(s.lines) == 0 {
		return nil
	}
	var buf []byte
	n := 0
	for _, l := range s.lines {
		if l != nil {
			buf = append(buf, l...)
			n++
		}
	}
	clear(s.index)
	s.lines, s.bytes = s.lines[:0], 0
	return out.writeRecords(buf, n)
}

// metadataClash is the error of a table with a column named as a CDC metadata column: its
// records would carry the name twice, and a destination would keep one of the two values.
func metadataClash(table, column string) error {
	return configErrorf("table %s has a column named %s, the name of a CDC metadata column the connector adds to every record of an incremental stream: the record would hold two values under one name, and the destination would keep only one. "+
		"Rename the column (ALTER TABLE %s RENAME COLUMN %s TO ...), or sync the stream as full refresh (full refresh records carry no metadata columns)", table, column, table, column)
}
