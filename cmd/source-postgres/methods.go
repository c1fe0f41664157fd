package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/merge"
)

// The Standard and Xmin replication methods, as Airbyte's connector has them: a stream is read
// with queries, without slot, publication or REPLICATION, and later reads return the rows
// inserted or updated since (deletes are not seen: they are CDC's).
//
//   - Standard: by a cursor column the user chooses. A read returns the rows whose cursor is past
//     the state's, in cursor order, in one snapshot; the state holds the last cursor value and
//     how many rows had it (cursor_record_count, in Airbyte's format). The next read starts at
//     that value, its ties included (duplicates at the boundary, as Airbyte's model allows): a
//     count of ties equal to the state's does not show that no row arrived at the value (one may
//     have left it meanwhile).
//   - Xmin: by the row's xmin, the id of the transaction that wrote its current version. A read
//     returns the rows written by transactions from the state's xmin on; the state holds the
//     oldest transaction still running when the read began (its snapshot's xmin, 64 bits:
//     xmin_raw_value, and the 32-bit value and wraparound count Airbyte's connector writes
//     beside it). Row xmins are 32 bits: they are compared with the state's in modular
//     arithmetic within [state xmin, snapshot xmax), which is exact while fewer than 2^32
//     transactions separate the two (more, and the whole table is read again).
//
// A stream's first read loads the whole table: by primary key chunks, one statement each, with a
// state after each, so a read killed mid-table resumes after the last chunk the platform saw;
// the position the increments continue from is taken before the load starts. A relation without
// a primary key is read in one query by Standard (in cursor order, with states between cursor
// values, so it resumes too), and by Xmin in ranges of its pages with a state after each
// (pageScan), unless it is partitioned or has inheritance children (one query).
//
// The states are Airbyte's STREAM states, in Airbyte's own forms (version 2: cursor_based, xmin)
// once a stream is loaded, so that a state moves between the two connectors; a load in progress
// is Tidemark's own form (tidemark_load), which Airbyte's connector refuses rather than misreads.

// The method state types.
const (
	stateCursor = "cursor_based"
	stateXmin   = "xmin"
	stateLoad   = "tidemark_load"
)

// methodState is a Standard or Xmin stream's state.
type methodState struct {
	Version         int    `json:"version"`
	StateType       string `json:"state_type"`
	StreamName      string `json:"stream_name,omitempty"`
	StreamNamespace string `json:"stream_namespace,omitempty"`

	// cursor_based: the last cursor value read (its text form; nil: none yet) and the number of
	// rows that had it.
	CursorField       []string `json:"cursor_field,omitempty"`
	Cursor            *string  `json:"cursor,omitempty"`
	CursorRecordCount int64    `json:"cursor_record_count,omitempty"`

	// xmin: the transaction id reads continue from, 64 bits, and split as Airbyte writes it.
	XminXidValue  *uint64 `json:"xmin_xid_value,omitempty"`
	XminRawValue  *uint64 `json:"xmin_raw_value,omitempty"`
	NumWraparound *uint64 `json:"num_wraparound,omitempty"`

	// tidemark_load: a scan by primary key chunks in progress (Load), of the rows written from
	// ScanFrom's xmin on (nil: every row), after which the stream continues from
	// IncrementalState. Without IncrementalState, nothing was read yet.
	Load             *merge.TableProgress `json:"load,omitempty"`
	Pages            *pageScan            `json:"pages,omitempty"` // the load of a relation without a primary key
	ScanFrom         *methodState         `json:"scan_from,omitempty"`
	IncrementalState *methodState         `json:"incremental_state,omitempty"`
}

func cursorState(field string, cursor *string, count int64) *methodState {
	return &methodState{Version: 2, StateType: stateCursor, CursorField: []string{field}, Cursor: cursor, CursorRecordCount: count}
}

func xminState(x uint64) *methodState {
	lo, hi := x&0xFFFFFFFF, x>>32
	return &methodState{Version: 2, StateType: stateXmin, XminXidValue: &lo, XminRawValue: &x, NumWraparound: &hi}
}

// xmin returns an xmin state's 64-bit transaction id.
func (m *methodState) xmin() (uint64, bool) {
	switch {
	case m == nil || m.StateType != stateXmin:
		return 0, false
	case m.XminRawValue != nil:
		return *m.XminRawValue, true
	case m.XminXidValue != nil:
		var epoch uint64
		if m.NumWraparound != nil {
			epoch = *m.NumWraparound
		}
		return epoch<<32 | *m.XminXidValue&0xFFFFFFFF, true
	}
	return 0, false
}

// airbyteStreamStateIn is what a stream state may hold, in Tidemark's forms and in those of
// Airbyte's connector (the Java version's cursor_based, xmin and ctid states; the Kotlin
// version's cursors map; the legacy state's stream entries, which have no state_type).
type airbyteStreamStateIn struct {
	methodState
	Cursor   json.RawMessage            `json:"cursor"`
	Cursors  map[string]json.RawMessage `json:"cursors"`
	SyncMode string                     `json:"sync_mode"`
}

// parseMethodState reads a Standard or Xmin stream's state. nil, with a note, when the state
// gives no position to continue from: the stream is then loaded from scratch.
func parseMethodState(raw json.RawMessage) (*methodState, string, error) {
	var fields map[string]json.RawMessage
	if len(raw) == 0 || string(raw) == "null" {
		return nil, "", nil
	}
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, "", fmt.Errorf("%s", jsonProblem(err))
	}
	if len(fields) == 0 {
		return nil, "", nil
	}
	var in airbyteStreamStateIn
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, "", fmt.Errorf("%s", jsonProblem(err))
	}
	m := in.methodState
	m.Cursor = nil
	if in.SyncMode != "" {
		return nil, "a " + in.SyncMode + " state, not a cursor or xmin position", nil
	}
	switch m.StateType {
	case stateCursor, "":
		if len(in.Cursors) > 0 {
			// Airbyte's Kotlin connector: {"cursors": {"column": value}}.
			if len(in.Cursors) > 1 {
				return nil, "", fmt.Errorf("%d cursors: one cursor column per stream", len(in.Cursors))
			}
			for f, v := range in.Cursors {
				m.CursorField = []string{f}
				if c, ok := cursorText(v); ok {
					m.Cursor = &c
				}
			}
		} else if c, ok := cursorText(in.Cursor); ok {
			m.Cursor = &c
		}
		if len(m.CursorField) == 0 {
			return nil, "a state without a cursor field", nil
		}
		m.Version, m.StateType = 2, stateCursor
		return &m, "", nil
	case stateXmin:
		if _, ok := m.xmin(); !ok {
			return nil, "", errors.New("an xmin state without xmin_raw_value or xmin_xid_value")
		}
		return &m, "", nil
	case stateLoad:
		if m.IncrementalState == nil || m.Load == nil {
			return nil, "", nil
		}
		if err := m.Load.Check(); err != nil {
			return nil, "", fmt.Errorf("load: %w", err)
		}
		return &m, "", nil
	case "ctid", "ctid_based":
		return nil, "an initial load of Airbyte's connector in progress (ctid), which Tidemark does not resume", nil
	default:
		return nil, "", fmt.Errorf("state_type %q is not one this connector reads", m.StateType)
	}
}

// cursorText is a cursor value of a state as text: a JSON string's content, or a number's text.
func cursorText(v json.RawMessage) (string, bool) {
	if len(v) == 0 || string(v) == "null" {
		return "", false
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s, true
	}
	return string(v), true
}

// methodStream is what a Standard or Xmin read knows of one stream's relation.
type methodStream struct {
	kind   byte          // relkind
	oid    uint32        // pg_class OID
	key    []string      // primary key columns, in key order; nil without one
	keyOps []chunker.Ops // their comparison operators
	cursor chunker.Ops   // Standard: the cursor column's comparison operators
}

// prepareMethods checks every incremental stream of a Standard or Xmin read before anything is
// read, so that a stream that cannot be read incrementally fails the read with its reason
// instead of after other streams went out; and turns each stream's input state into its
// position.
func (r *reader) prepareMethods(ctx context.Context, in *inputState) error {
	method := r.s.cfg.ReplicationMethod.Method
	var errs []error
	for _, st := range r.streams {
		if !st.incremental {
			continue
		}
		ms := &methodStream{}
		st.method = ms
		id := pgx.Identifier{st.schema, st.name}.Sanitize()
		if err := r.conn.QueryRow(ctx, `SELECT relkind, oid FROM pg_class WHERE oid = to_regclass($1)`, id).Scan(&ms.kind, &ms.oid); err != nil {
			return fmt.Errorf("look up %s: %w", st.key(), err)
		}
		var err error
		if ms.kind == 'r' || ms.kind == 'p' {
			if ms.key, err = primaryKey(ctx, r.conn, relation{schema: st.schema, name: st.name}); err != nil {
				return err
			}
			for _, k := range ms.key {
				ops, err := columnOps(ctx, r.conn, ms.oid, k)
				if err != nil {
					return fmt.Errorf("stream %s: primary key column %q: %w", st.key(), k, err)
				}
				ms.keyOps = append(ms.keyOps, ops)
			}
		}
		switch method {
		case "Xmin":
			if ms.kind != 'r' && ms.kind != 'p' && ms.kind != 'm' {
				errs = append(errs, fmt.Errorf("stream %s is incremental with replication_method Xmin, but it is a %s, whose rows have no xmin: sync it as full refresh, or choose Standard with a cursor column", st.key(), relkindName(ms.kind)))
			}
		default:
			if err := r.checkCursor(ctx, st); err != nil {
				var ce *configError
				if errors.As(err, &ce) {
					errs = append(errs, ce.err)
					continue
				}
				return err
			}
		}
		raw, ok := in.streams[st.key()]
		if !ok {
			continue
		}
		state, note, err := parseMethodState(raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("the state of stream %s: %w; reset the stream (Airbyte: Clear data or Reset of that stream) to load it again", st.key(), err))
			continue
		}
		if note != "" {
			r.s.log.Warn().Str("stream", st.key()).Msg("state: " + note + ": the stream is loaded from scratch")
		}
		st.ms = r.adopt(st, state)
	}
	if err := errors.Join(errs...); err != nil {
		return &configError{err}
	}
	return nil
}

// adopt returns the position a stream continues from, given its state: nil (load from scratch)
// when the state belongs to another method or cursor, which is said.
func (r *reader) adopt(st *readStream, m *methodState) *methodState {
	if m == nil {
		return nil
	}
	want := m
	if m.StateType == stateLoad {
		want = m.IncrementalState
	}
	switch r.s.cfg.ReplicationMethod.Method {
	case "Xmin":
		if _, ok := want.xmin(); ok {
			return m
		}
		r.s.log.Warn().Str("stream", st.key()).Str("state_type", want.StateType).Msg("state: not an xmin position (was the replication method changed?): the stream is loaded from scratch")
	default:
		if want.StateType == stateCursor && slices.Equal(want.CursorField, st.cursor) {
			return m
		}
		if want.StateType == stateCursor {
			r.s.log.Warn().Str("stream", st.key()).Strs("state_cursor", want.CursorField).Strs("cursor", st.cursor).Msg("state: the cursor field changed: the stream is loaded from scratch")
		} else {
			r.s.log.Warn().Str("stream", st.key()).Str("state_type", want.StateType).Msg("state: not a cursor position (was the replication method changed?): the stream is loaded from scratch")
		}
	}
	return nil
}

func relkindName(k byte) string {
	switch k {
	case 'v':
		return "view"
	case 'm':
		return "materialized view"
	case 'f':
		return "foreign table"
	case 'p':
		return "partitioned table"
	}
	return "table"
}

// checkCursor checks a Standard stream's cursor: one column of the relation, with an ordering
// (its type's default btree operators, which ORDER BY, > and = use), and no NULL (a row whose
// cursor is NULL would never be read incrementally; Airbyte's connector refuses it too).
func (r *reader) checkCursor(ctx context.Context, st *readStream) error {
	switch len(st.cursor) {
	case 0:
		return configErrorf("stream %s is incremental with replication_method Standard, which reads by a cursor column: choose its cursor field in the connection's settings (a column whose value grows with every insert and update, such as updated_at)", st.key())
	case 1:
	default:
		return configErrorf("stream %s: the cursor field %q is nested; choose a top-level column", st.key(), strings.Join(st.cursor, "."))
	}
	c := st.cursor[0]
	id := pgx.Identifier{st.schema, st.name}.Sanitize()
	var notNull bool
	var typ uint32
	err := r.conn.QueryRow(ctx, `SELECT attnotnull, atttypid FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 AND NOT attisdropped`, id, c).Scan(&notNull, &typ)
	if errors.Is(err, pgx.ErrNoRows) {
		return configErrorf("stream %s: its cursor field %q is not a column of %s; refresh the source schema and choose another cursor", st.key(), c, id)
	}
	if err != nil {
		return fmt.Errorf("look up the cursor column of %s: %w", st.key(), err)
	}
	col := pgx.Identifier{c}.Sanitize()
	// The cursor is compared with its type's own operators (those ORDER BY sorts with),
	// schema-qualified: search_path is pinned to pg_catalog (internal/pgconf).
	if st.method.cursor, err = chunker.ReadOps(ctx, r.conn, typ); err != nil {
		if errors.Is(err, chunker.ErrNoOrdering) {
			return configErrorf("stream %s: its cursor field %q has no ordering (%v); choose a cursor column of an ordered type, such as a timestamp or a number", st.key(), c, err)
		}
		return fmt.Errorf("check the cursor column of %s: %w", st.key(), err)
	}
	if !notNull {
		var hasNull bool
		if err := r.conn.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE %s IS NULL)`, id, col)).Scan(&hasNull); err != nil {
			return fmt.Errorf("check the cursor column of %s for NULLs: %w", st.key(), err)
		}
		if hasNull {
			return configErrorf("stream %s: its cursor field %q is NULL in some rows, which a cursor never reaches, so their changes would be missed; choose a cursor column without NULLs (or fill them in and make the column NOT NULL)", st.key(), c)
		}
	}
	return nil
}

// methodRead reads one Standard or Xmin stream.
func (r *reader) methodRead(ctx context.Context, st *readStream) error {
	if r.s.cfg.ReplicationMethod.Method == "Xmin" {
		return r.xminRead(ctx, st)
	}
	return r.cursorRead(ctx, st)
}

// cursorRead reads a Standard stream: its load, or the rows past its cursor.
func (r *reader) cursorRead(ctx context.Context, st *readStream) error {
	ms := st.method
	r.mu.Lock()
	m := st.ms
	r.mu.Unlock()
	if m == nil && len(ms.key) > 0 {
		// A first read of a table with a primary key: the cursor value the increments continue
		// from, then the load, by key chunks.
		var cur *string
		var n int64
		col := pgx.Identifier{st.cursor[0]}.Sanitize()
		// The value is read in its type's text form (the result in text format: the type's
		// output function), not converted with ::text, which would run a cast to text that the
		// type's owner may have made with a function of their own, as this role.
		q := fmt.Sprintf(`WITH m AS (SELECT %s AS c FROM %s WHERE %s IS NOT NULL ORDER BY 1 DESC LIMIT 1) SELECT c, (SELECT count(*) FROM %s WHERE %s%s %s m.c%s) FROM m`,
			col, pgx.Identifier{st.schema, st.name}.Sanitize(), col, pgx.Identifier{st.schema, st.name}.Sanitize(), col, ms.cursor.Cast, ms.cursor.Eq, ms.cursor.Cast)
		var c string
		switch err := r.conn.QueryRow(ctx, q, pgx.QueryResultFormats{pgx.TextFormatCode, pgx.TextFormatCode}).Scan(&c, &n); {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("read the highest cursor value of %s: %w", st.key(), err)
		default:
			cur = &c
		}
		m = &methodState{Version: 2, StateType: stateLoad, Load: &merge.TableProgress{Key: ms.key, OID: ms.oid},
			IncrementalState: cursorState(st.cursor[0], cur, n)}
	}
	if m == nil {
		m = cursorState(st.cursor[0], nil, 0)
	}
	if m.StateType == stateLoad && (!slices.Equal(m.Load.Key, ms.key) || m.Load.OID != ms.oid) {
		r.s.log.Warn().Str("stream", st.key()).Msg("the table or its primary key changed since its load began: the load starts over")
		r.setMethodState(st, nil)
		return r.cursorRead(ctx, st)
	}
	r.setMethodState(st, m)
	if m.StateType == stateLoad {
		done, err := r.keysetScan(ctx, st, "")
		if err != nil || !done {
			return err
		}
		r.setMethodState(st, m.IncrementalState)
		return r.emitState(st)
	}
	return r.cursorScan(ctx, st)
}

// cursorScan reads the rows of a Standard stream past its cursor, in one snapshot, in cursor
// order, with a state between two cursor values now and then.
func (r *reader) cursorScan(ctx context.Context, st *readStream) (err error) {
	r.mu.Lock()
	m := *st.ms
	r.mu.Unlock()
	rel := pgx.Identifier{st.schema, st.name}.Sanitize()
	col := pgx.Identifier{st.cursor[0]}.Sanitize()
	conn := r.conn.PgConn()
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").ReadAll(); err != nil {
		return fmt.Errorf("read %s: %w", st.key(), err)
	}
	defer func() {
		end := "COMMIT"
		if err != nil {
			end = "ROLLBACK"
		}
		if _, cerr := conn.Exec(context.WithoutCancel(ctx), end).ReadAll(); cerr != nil && err == nil {
			err = fmt.Errorf("read %s: %w", st.key(), cerr)
		}
	}()
	var where string
	var args [][]byte
	if m.Cursor != nil {
		// The rows tying with the state's cursor value are read again, always: a count of them
		// equal to the state's (cursor_record_count) does not say they are the rows read (one
		// may have left the value and another arrived at it). Airbyte's model takes the
		// duplicates at the boundary; the count stays in the state, in Airbyte's format.
		ops := st.method.cursor
		where = fmt.Sprintf(" WHERE %s%s %s $1", col, ops.Cast, ops.GreaterEq)
		args = [][]byte{[]byte(*m.Cursor)}
	}
	// The last column tells a row whose cursor differs from the one before (under the type's
	// equality, the one ORDER BY groups by; the cursor is never NULL, checkCursor).
	c := st.method.cursor
	q := fmt.Sprintf(`SELECT r.*, coalesce(NOT (r.%s%s %s (lag(r.%s) OVER (ORDER BY r.%s))%s), true) FROM %s AS r%s ORDER BY r.%s`,
		col, c.Cast, c.Eq, col, col, c.Cast, rel, where, col)
	w := r.newRecordWriter(st)
	var group *string // the value of the rows being read
	var count int64
	read := 0
	lastState := time.Now()
	err = r.streamRows(ctx, st, w, q, args, 1, func(vals [][]byte, cols *rowColumns) error {
		if string(vals[len(vals)-1]) == "t" {
			if group != nil {
				// The rows of the previous value are all out.
				if read >= stateEvery || time.Since(lastState) >= r.s.cfg.stateInterval() {
					if err := w.flush(); err != nil {
						return err
					}
					r.setMethodState(st, cursorState(st.cursor[0], group, count))
					if err := r.emitState(st); err != nil {
						return err
					}
					read, lastState = 0, time.Now()
				}
			}
			v := string(vals[slices.Index(cols.names, st.cursor[0])])
			group, count = &v, 0
		}
		count++
		read++
		return nil
	})
	if err != nil {
		return err
	}
	if err := w.flush(); err != nil {
		return err
	}
	if group != nil {
		r.setMethodState(st, cursorState(st.cursor[0], group, count))
	} else if group == nil && m.Cursor != nil {
		// Nothing past the cursor: the state stands (an empty table keeps its empty state).
		r.setMethodState(st, &m)
	}
	return r.emitState(st)
}

// stateEvery is how many records a scan reads between two states, at most, when it can place a
// state (between two cursor values).
const stateEvery = 10000

// xminRead reads an Xmin stream: a scan of the rows written from its state's xmin on (every row
// on its first read), by key chunks where the relation has a primary key, by ranges of pages
// where a table or materialized view has none (pageScan).
func (r *reader) xminRead(ctx context.Context, st *readStream) error {
	ms := st.method
	var xmin, xmax uint64
	if err := r.conn.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&xmin, &xmax); err != nil {
		return fmt.Errorf("read the transaction horizon: %w", err)
	}
	r.mu.Lock()
	m := st.ms
	r.mu.Unlock()
	if m != nil && m.StateType == stateLoad && m.Load != nil && (!slices.Equal(m.Load.Key, ms.key) || m.Load.OID != ms.oid) {
		r.s.log.Warn().Str("stream", st.key()).Msg("the table or its primary key changed since its scan began: the scan starts over")
		m = m.ScanFrom
	}
	var from *methodState
	switch {
	case m == nil:
	case m.StateType == stateXmin:
		from = m
	default:
		from = m.ScanFrom
	}
	if x0, ok := from.xmin(); ok {
		switch {
		case x0 > xmax:
			r.s.log.Warn().Str("stream", st.key()).Uint64("state_xmin", x0).Uint64("server_next_xid", xmax).Msg("the state's xmin is ahead of the server's transactions (a state of another server, or of a database restored to an earlier point): every row is read again")
			from = nil
		case xmax-x0 >= 1<<32:
			r.s.log.Warn().Str("stream", st.key()).Uint64("state_xmin", x0).Uint64("server_next_xid", xmax).Msg("2^32 transactions or more since the state's xmin: 32-bit row xmins cannot tell them apart, so every row is read again")
			from = nil
		}
	}
	if m == nil || m.StateType != stateLoad || m.Load == nil {
		m = &methodState{Version: 2, StateType: stateLoad, Load: &merge.TableProgress{Key: ms.key, OID: ms.oid}, ScanFrom: from, IncrementalState: xminState(xmin)}
	} else {
		resumed := *m
		resumed.ScanFrom = from
		m = &resumed
	}
	r.setMethodState(st, m)
	filter := ""
	if x0, ok := from.xmin(); ok {
		filter = xminFilter(x0)
	}
	if len(ms.key) > 0 {
		done, err := r.keysetScan(ctx, st, filter)
		if err != nil || !done {
			return err
		}
	} else if pages, err := r.pageable(ctx, ms); err != nil {
		return err
	} else if pages {
		done, err := r.pageScan(ctx, st, filter)
		if err != nil || !done {
			return err
		}
	} else {
		// A partitioned table, or a table with inheritance children, without a primary key
		// (each partition or child numbers its pages from 0): one query, whose end alone moves
		// the state.
		q := "SELECT * FROM " + pgx.Identifier{st.schema, st.name}.Sanitize()
		if filter != "" {
			q += " WHERE " + filter
		}
		w := r.newRecordWriter(st)
		if err := r.streamRows(ctx, st, w, q, nil, 0, func([][]byte, *rowColumns) error { return nil }); err != nil {
			return err
		}
		if err := w.flush(); err != nil {
			return err
		}
	}
	r.setMethodState(st, m.IncrementalState)
	return r.emitState(st)
}

// xminFilter is the condition of the rows written by transactions from x0 (64 bits) on: their
// xmin's distance from x0, modulo 2^32, is below the statement's snapshot xmax's distance from
// x0. Every row version the statement can see was written before its xmax, so the rows written
// from x0 on are exactly those, as long as xmax is less than 2^32 past x0 (xminRead reads every
// row otherwise). Rows older than x0 whose 32-bit xmin repeats a value of the window (frozen
// rows of an earlier wraparound) are read again: a repetition, never a loss.
func xminFilter(x0 uint64) string {
	return fmt.Sprintf(`((xmin::text::bigint - %d + 4294967296) %% 4294967296) < ((SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint) - %d)`, x0&0xFFFFFFFF, x0)
}

// keysetScan reads st's relation by primary key chunks, one statement each, the rows matching
// filter (SQL; empty: all), from the progress of st's tidemark_load state, with a state after
// each chunk. done reports the scan finished; false with a nil error: the time budget ran out.
func (r *reader) keysetScan(ctx context.Context, st *readStream, filter string) (done bool, err error) {
	ms := st.method
	r.mu.Lock()
	p := *st.ms.Load
	r.mu.Unlock()
	rel := pgx.Identifier{st.schema, st.name}.Sanitize()
	keys := make([]string, len(ms.key))
	desc := make([]string, len(ms.key))
	for i, k := range ms.key {
		keys[i] = pgx.Identifier{k}.Sanitize()
		desc[i] = keys[i] + " DESC"
	}
	if p.MaxKey == nil && !p.Done {
		// The scan's upper bound: rows with a later key came after it began, and the next read
		// has them.
		rr := r.conn.PgConn().ExecParams(ctx, fmt.Sprintf("SELECT %s FROM %s ORDER BY %s LIMIT 1", strings.Join(keys, ", "), rel, strings.Join(desc, ", ")), nil, nil, nil, nil)
		for rr.NextRow() {
			for _, v := range rr.Values() {
				p.MaxKey = append(p.MaxKey, string(v))
			}
		}
		if _, err := rr.Close(); err != nil {
			return false, fmt.Errorf("read the last key of %s: %w", st.key(), err)
		}
		p.Done = p.MaxKey == nil
	}
	limit := r.s.cfg.BackfillChunkSize
	for !p.Done {
		var args [][]byte
		for _, v := range p.Cursor {
			args = append(args, []byte(v))
		}
		for _, v := range p.MaxKey {
			args = append(args, []byte(v))
		}
		var extra []string
		if filter != "" {
			extra = append(extra, filter)
		}
		q := chunker.KeysetSQL("*", rel, ms.key, ms.keyOps, p.Cursor != nil, true, limit, extra...)
		w := r.newRecordWriter(st)
		var last []string
		n := 0
		err := r.streamRows(ctx, st, w, q, args, 0, func(vals [][]byte, cols *rowColumns) error {
			n++
			if last == nil {
				last = make([]string, len(ms.key))
			}
			for i, k := range ms.key {
				last[i] = string(vals[slices.Index(cols.names, k)])
			}
			return nil
		})
		if err != nil {
			return false, err
		}
		if err := w.flush(); err != nil {
			return false, err
		}
		if last != nil {
			p.Cursor = last
		}
		p.Rows += int64(n)
		p.Chunks++
		p.Done = n < limit
		r.mu.Lock()
		load := p
		st.ms.Load = &load
		r.mu.Unlock()
		if err := r.emitState(st); err != nil {
			return false, err
		}
		if r.budgetSpent() && !p.Done {
			return false, nil
		}
		if err := context.Cause(ctx); err != nil {
			return false, err
		}
	}
	return true, nil
}

// pageScan is the progress of a load of a relation without a primary key by ranges of its heap's
// pages: a row's ctid (page, item) stays as long as the row is not written again, so the pages
// read so far hold no row the rest of the load needs, except rows written since the load began,
// which the Xmin state (the oldest transaction running when it began) reads again next time,
// wherever they moved. A rewrite of the relation (VACUUM FULL, CLUSTER, a non-concurrent REFRESH
// MATERIALIZED VIEW, TRUNCATE) moves every row without writing it: a new storage file, after
// which the load starts over.
type pageScan struct {
	Filenode uint32 `json:"filenode"` // the relation's storage file when the load began
	Next     uint32 `json:"next"`     // the first page not read yet
	End      uint32 `json:"end"`      // the relation's pages when the load began
}

// pageable reports whether a relation without a primary key can be loaded by ranges of its pages
// (pageScan): a table or materialized view whose rows are all its own, no table inheriting from
// it (a scan of it reads theirs too, each numbered from page 0).
func (r *reader) pageable(ctx context.Context, ms *methodStream) (bool, error) {
	if ms.kind != 'r' && ms.kind != 'm' {
		return false, nil
	}
	var children bool
	if err := r.conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_inherits WHERE inhparent = $1)`, ms.oid).Scan(&children); err != nil {
		return false, fmt.Errorf("read the children of relation %d: %w", ms.oid, err)
	}
	return !children, nil
}

// pageScan reads st's relation (a table or materialized view without a primary key) by ranges
// of its pages, one statement each (a TID range scan, PostgreSQL 14 and later; earlier servers
// filter each range from a sequential scan, so the whole relation is read in one), the rows
// matching filter (SQL; empty: all), from the progress of st's state, with a state after each
// range. done reports the scan finished; false with a nil error: the time budget ran out.
func (r *reader) pageScan(ctx context.Context, st *readStream, filter string) (done bool, err error) {
	ms := st.method
	rel := pgx.Identifier{st.schema, st.name}.Sanitize()
	// look reads the relation's storage file and size in pages, and the rows per page the
	// statistics estimate (50 without any), and whether the server has TID range scans.
	var filenode, pages uint32
	var perPage float64
	var rangeScans bool
	look := func() error {
		err := r.conn.QueryRow(ctx, `SELECT relfilenode::bigint, pg_relation_size(oid) / current_setting('block_size')::bigint,
				CASE WHEN relpages > 0 AND reltuples > 0 THEN reltuples / relpages ELSE 50 END::float8,
				current_setting('server_version_num')::int >= 140000
			FROM pg_class WHERE oid = $1`, ms.oid).Scan(&filenode, &pages, &perPage, &rangeScans)
		if err != nil {
			return fmt.Errorf("read the size of %s: %w", st.key(), err)
		}
		return nil
	}
	r.mu.Lock()
	var ps pageScan
	if st.ms.Pages != nil {
		ps = *st.ms.Pages
	}
	r.mu.Unlock()
	if err := look(); err != nil {
		return false, err
	}
	// startOver begins the load (again, when the relation was rewritten since it began).
	startOver := func() {
		if ps.Filenode != 0 {
			r.s.log.Warn().Str("stream", st.key()).Msg("the relation was rewritten since its load began (VACUUM FULL, CLUSTER, REFRESH MATERIALIZED VIEW, TRUNCATE): its rows moved, so the load starts over")
		}
		ps = pageScan{Filenode: filenode, End: pages}
	}
	if ps.Filenode != filenode {
		startOver()
	}
	step := uint32(min(max(math.Ceil(float64(r.s.cfg.BackfillChunkSize)/perPage), 1), 1<<20))
	if !rangeScans {
		step = max(ps.End, 1) // each range would be a sequential scan: one statement
	}
	for ps.Next < ps.End {
		hi := min(uint64(ps.Next)+uint64(step), uint64(ps.End))
		q := fmt.Sprintf("SELECT * FROM ONLY %s WHERE ctid >= '(%d,0)'::tid AND ctid < '(%d,0)'::tid", rel, ps.Next, hi)
		if filter != "" {
			q += " AND " + filter
		}
		w := r.newRecordWriter(st)
		if err := r.streamRows(ctx, st, w, q, nil, 0, func([][]byte, *rowColumns) error { return nil }); err != nil {
			return false, err
		}
		if err := w.flush(); err != nil {
			return false, err
		}
		ps.Next = uint32(hi)
		// A rewrite before this range was read moved rows to pages read already: checked after
		// it, so that a range read from the new file is never taken for the old one's.
		if err := look(); err != nil {
			return false, err
		}
		if filenode != ps.Filenode {
			startOver()
		}
		r.mu.Lock()
		progress := ps
		st.ms.Pages = &progress
		r.mu.Unlock()
		if err := r.emitState(st); err != nil {
			return false, err
		}
		if r.budgetSpent() && ps.Next < ps.End {
			return false, nil
		}
		if err := context.Cause(ctx); err != nil {
			return false, err
		}
	}
	return true, nil
}

// streamRows runs q (text parameters args, untyped: each takes the type of what it is compared
// with) and hands each row to fn, then writes its record through w; the last extra columns of
// the row are not the relation's (they are left out of the record). The column types are looked
// up before the rows come (the connection is busy meanwhile).
func (r *reader) streamRows(ctx context.Context, st *readStream, w *recordWriter, q string, args [][]byte, extra int, fn func(vals [][]byte, cols *rowColumns) error) error {
	for attempt := 0; ; attempt++ {
		rr := r.conn.PgConn().ExecParams(ctx, q, args, nil, nil, nil)
		cols := columnsOf(st, rr.FieldDescriptions())
		if extra > 0 && len(cols.names) >= extra {
			cols.names, cols.types = cols.names[:len(cols.names)-extra], cols.types[:len(cols.types)-extra]
		}
		if !w.prepared(cols) {
			// Close the query, look the types up, run it again.
			if _, err := rr.Close(); err != nil {
				return fmt.Errorf("read %s: %w", st.key(), err)
			}
			if attempt > 1 {
				return fmt.Errorf("read %s: its columns keep changing", st.key())
			}
			if err := w.prepare(ctx, cols); err != nil {
				return err
			}
			continue
		}
		for rr.NextRow() {
			vals := rr.Values()
			if err := fn(vals, cols); err != nil {
				_, _ = rr.Close()
				return err
			}
			if err := w.add(ctx, cols, vals[:len(cols.names)]); err != nil {
				_, _ = rr.Close()
				return err
			}
		}
		if _, err := rr.Close(); err != nil {
			return fmt.Errorf("read %s: %w", st.key(), err)
		}
		return nil
	}
}

// recordWriter encodes a stream's rows as RECORD lines and writes them in pieces.
type recordWriter struct {
	r     *reader
	enc   *rowEncoder
	ready []*rowColumns // column sets whose types are looked up
	buf   []byte
	n     int
}

func (r *reader) newRecordWriter(st *readStream) *recordWriter {
	if st.enc == nil {
		st.enc = &recordWriter{r: r, enc: newRowEncoder(r.types, st)}
	}
	return st.enc
}

func (w *recordWriter) prepared(cols *rowColumns) bool {
	for _, c := range w.ready {
		if slices.Equal(c.names, cols.names) && slices.Equal(c.types, cols.types) {
			return true
		}
	}
	return false
}

func (w *recordWriter) prepare(ctx context.Context, cols *rowColumns) error {
	if err := w.enc.prepare(ctx, cols); err != nil {
		return err
	}
	w.ready = append(w.ready, cols)
	return nil
}

func (w *recordWriter) add(ctx context.Context, cols *rowColumns, vals [][]byte) error {
	var err error
	if w.buf, err = w.enc.appendRow(ctx, w.buf, cols, chunker.Row(vals)); err != nil {
		return err
	}
	w.n++
	if len(w.buf) >= recordPiece {
		return w.flush()
	}
	return nil
}

func (w *recordWriter) flush() error {
	err := w.r.s.out.writeRecords(w.buf, w.n)
	w.buf, w.n = w.buf[:0], 0
	return err
}

// setMethodState sets a stream's current state (what its next STATE carries).
func (r *reader) setMethodState(st *readStream, m *methodState) {
	r.mu.Lock()
	st.ms = m
	r.mu.Unlock()
}

// streamStateMessage is the STREAM state of st: its method state, or its full refresh progress.
func (r *reader) streamStateMessage(st *readStream) *stateMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b []byte
	switch {
	case !st.incremental:
		ts := tableState{SyncMode: "full_refresh"}
		if st.fr != nil {
			ts = *st.fr
		}
		b, _ = json.Marshal(ts)
	default:
		m := methodState{Version: 2, StateType: stateLoad}
		if st.ms != nil {
			m = *st.ms
		}
		m.StreamName, m.StreamNamespace = st.name, st.schema
		b, _ = json.Marshal(m)
	}
	s, _ := json.Marshal(streamState{StreamDescriptor: st.desc, StreamState: b})
	return &stateMessage{Type: "STREAM", Stream: s}
}
