package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/internal/pgtrust"
	"github.com/tidemark/tidemark/internal/sqlfix"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
)

// errBudget ends a read whose time budget ran out: a normal end, with a final state from which
// the next read resumes.
var errBudget = errors.New("the sync's time budget ran out")

// readStream is one configured stream.
type readStream struct {
	desc        streamDescriptor // exactly as the configured catalog names it
	schema      string           // the table's schema (the namespace, or public)
	name        string
	incremental bool
	columns     map[string]bool // the configured schema's properties; nil: every column
	exists      bool            // the table exists (a dropped table's stream is reported, not read)
	fr          *tableState     // a full refresh stream's progress
	base        *merge.TableProgress

	// Standard and Xmin (methods.go).
	cursor []string      // the configured cursor field (Standard)
	method *methodStream // the relation, as the read needs it
	ms     *methodState  // the stream's state: its input, then its progress (guarded by reader.mu)
	enc    *recordWriter // its records' writer
}

func (r *readStream) key() string { return streamKey(r.schema, r.name) }

// loadCatalog reads the configured catalog and checks what a read needs of it.
func loadCatalog(path string) ([]*readStream, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, configErrorf("read the catalog file: %w", err)
	}
	var c configuredCatalog
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, configErrorf("the catalog file %s is not a configured catalog: %s", filepath.Base(path), jsonProblem(err))
	}
	var out []*readStream
	var errs []error
	seen := map[string]bool{}
	for _, cs := range c.Streams {
		r := &readStream{desc: streamDescriptor{Name: cs.Stream.Name, Namespace: cs.Stream.Namespace}, schema: namespaceOr(cs.Stream.Namespace), name: cs.Stream.Name, cursor: cs.CursorField}
		switch cs.SyncMode {
		case "incremental":
			r.incremental = true
		case "full_refresh":
		default:
			errs = append(errs, fmt.Errorf("stream %s: sync_mode %q is not full_refresh or incremental", r.key(), cs.SyncMode))
		}
		if cs.Stream.Name == "" {
			errs = append(errs, errors.New("a configured stream without a name"))
		}
		if seen[r.key()] {
			errs = append(errs, fmt.Errorf("stream %s is configured twice", r.key()))
		}
		seen[r.key()] = true
		if props, ok := cs.Stream.JSONSchema["properties"].(map[string]any); ok && len(props) > 0 {
			r.columns = map[string]bool{}
			for k := range props {
				r.columns[k] = true
			}
		}
		out = append(out, r)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, &configError{fmt.Errorf("the configured catalog is not valid: %w", err)}
	}
	return out, nil
}

// read runs a sync: the incremental streams through the engine (backfill while streaming, until
// caught up, the time budget, or a signal), then the full refresh streams, then a final state.
func (s *source) read(ctx context.Context, catalogPath, statePath string) error {
	streams, err := loadCatalog(catalogPath)
	if err != nil {
		return err
	}
	in, err := loadState(statePath)
	if err != nil {
		return err
	}
	for _, msg := range in.ignored {
		s.log.Warn().Msg("state: ignored " + msg)
	}
	if in.migrated != "" {
		s.log.Info().Str("from", in.migrated).Msg("state migrated from Airbyte's connector: finished streams carry on from its position, the others are backfilled")
	}
	var incremental []*readStream
	for _, r := range streams {
		if r.incremental {
			incremental = append(incremental, r)
		} else {
			r.fr = in.fullRefresh[r.key()]
		}
		if in.pos != nil {
			r.base = in.pos.Tables[r.key()]
			if r.incremental && r.base == nil {
				// A stream the state does not carry under a position: reset by the user (after
				// a TRUNCATE, say) or newly added. Its output starts over with a refresh, so its
				// changes before the backfill, even ones that cannot be placed, do not matter.
				r.base = &merge.TableProgress{Refresh: true}
				in.pos.Tables[r.key()] = r.base
			}
		}
	}
	switch {
	case s.cfg.cdc() && len(in.streams) > 0:
		s.log.Warn().Msg("state: per-stream states (of a Standard or Xmin connection) hold no CDC position: the incremental streams are backfilled")
	case !s.cfg.cdc() && in.pos != nil:
		s.log.Warn().Msg("state: a CDC state holds no cursor or xmin position: the incremental streams are loaded from scratch")
	}

	conn, err := s.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, st := range streams {
		s.out.status(st.desc, "STARTED")
	}
	if err := s.resolve(ctx, conn, streams); err != nil {
		// Nothing is read: every stream ends INCOMPLETE, the missing ones named in the error.
		for _, st := range streams {
			s.out.status(st.desc, "INCOMPLETE")
		}
		return err
	}

	r := &reader{s: s, streams: streams, types: pgjson.NewProfileRegistry(conn, s.cfg.profile()), conn: conn, pos: in.pos}
	if !s.cfg.cdc() {
		r.pos = nil
		if err := r.prepareMethods(ctx, in); err != nil {
			for _, st := range streams {
				s.out.status(st.desc, "INCOMPLETE")
			}
			return err
		}
	}
	err = r.run(ctx, incremental)
	final := "COMPLETE"
	if err != nil {
		final = "INCOMPLETE"
	}
	for _, st := range streams {
		s.out.status(st.desc, final)
	}
	return err
}

// resolve checks that every configured stream's table exists. A missing one fails the read with
// a config error: going on with the other streams would move the state's position past the
// missing table's changes (a table renamed away and back would then resume as if nothing had
// happened), and a stream reported COMPLETE without its data would mislead.
func (s *source) resolve(ctx context.Context, conn *pgx.Conn, streams []*readStream) error {
	var missing []string
	var refusals []error
	for _, st := range streams {
		var kind *string
		name := pgx.Identifier{st.schema, st.name}.Sanitize()
		if err := conn.QueryRow(ctx, `SELECT relkind::text FROM pg_catalog.pg_class WHERE oid = pg_catalog.to_regclass($1)`, name).Scan(&kind); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("look up %s: %w", st.key(), err)
		}
		st.exists = kind != nil
		if !st.exists {
			missing = append(missing, st.key())
			continue
		}
		// A view's functions run as whoever reads it (pgtrust.View); a table's nothing.
		if *kind == "v" {
			if err := pgtrust.View(ctx, conn, "the view of stream "+st.key()+",", name); err != nil {
				if !errors.Is(err, pgtrust.ErrUntrusted) {
					return err
				}
				refusals = append(refusals, err)
			}
		}
	}
	if len(refusals) > 0 {
		return configErrorf("%v", errors.Join(refusals...))
	}
	if len(missing) > 0 {
		return configErrorf("the table of stream(s) %s no longer exists (dropped or renamed), or this role cannot see it: nothing is read, so that no change of it is passed over; refresh the source schema and remove the stream from the connection, rename the table back, or grant SELECT", strings.Join(missing, ", "))
	}
	return nil
}

// reader is one read's progress, shared by its phases.
type reader struct {
	s       *source
	streams []*readStream
	types   *pgjson.Registry // on conn
	conn    *pgx.Conn        // the query connection: type lookups, full refresh reads

	mu      sync.Mutex
	pos     *merge.Position // the last position: the input state's, then each checkpoint's
	current *readStream     // Standard and Xmin: the stream being read (its state is the heartbeat's)
	end     time.Time       // Standard and Xmin: when the time budget runs out
}

// budgetSpent reports that a Standard or Xmin read's time budget ran out: it stops after the
// chunk it is in, and the next read resumes there.
func (r *reader) budgetSpent() bool { return !r.end.IsZero() && time.Now().After(r.end) }

func (r *reader) run(ctx context.Context, incremental []*readStream) error {
	s := r.s
	for _, st := range r.streams {
		s.out.status(st.desc, "RUNNING")
	}
	r.estimates(ctx)

	// The state goes out again when nothing else did for a while (an idle source, a long chunk),
	// so the platform never sees a silent source.
	hctx, stopHeartbeat := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		r.heartbeat(hctx)
	})
	if q := s.cfg.ReplicationMethod.HeartbeatActionQuery; q != "" && s.cfg.cdc() {
		wg.Go(func() {
			s.heartbeatQuery(hctx, q)
		})
	}
	defer func() {
		stopHeartbeat()
		wg.Wait()
	}()

	if !s.cfg.cdc() {
		// Standard and Xmin: each stream in turn, with a state of its own after each chunk.
		r.end = time.Now().Add(s.cfg.budget())
		for _, st := range r.streams {
			r.mu.Lock()
			r.current = st
			r.mu.Unlock()
			var err error
			if st.incremental {
				err = r.methodRead(ctx, st)
			} else {
				err = r.fullRefresh(ctx, st)
			}
			if err != nil {
				return err
			}
			if r.budgetSpent() {
				s.log.Info().Str("budget", s.cfg.budget().String()).Msg("the sync's time budget ran out: the next sync resumes where this one ended")
				break
			}
		}
		return context.Cause(ctx)
	}

	var tables []*readStream
	for _, st := range incremental {
		if st.exists {
			tables = append(tables, st)
		}
	}
	if len(tables) > 0 {
		if err := r.capture(ctx, tables); err != nil {
			return err
		}
	}
	for _, st := range r.streams {
		if st.incremental || !st.exists {
			continue
		}
		if err := r.fullRefresh(ctx, st); err != nil {
			return err
		}
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	// The last message of the read is a state that covers every record.
	return r.emitState(nil)
}

// capture runs the engine over the incremental streams until it has caught up (or the budget
// runs out), handling a state the slot has moved past as configured.
func (r *reader) capture(ctx context.Context, tables []*readStream) error {
	s := r.s
	rm := s.cfg.ReplicationMethod
	sig, _ := s.cfg.signalTable()
	faults, err := testingBreak()
	if err != nil {
		return err
	}
	cfg := merge.Config{
		Source: replicator.Config{
			DSN: s.dsn, Slot: rm.ReplicationSlot, Publication: rm.Publication,
			CreateSlot: s.cfg.createSlot(), Configure: s.configure, ApplicationName: "tidemark-airbyte",
		},
		Watermarks:         s.cfg.watermarks(),
		SignalTable:        sig,
		ChunkSize:          s.cfg.BackfillChunkSize,
		Readers:            s.cfg.BackfillReaders,
		CheckpointInterval: s.cfg.stateInterval(),
		AckCheckpoints:     rm.LSNCommitBehaviour == commitWhileReading,
		StopWhenCaughtUp:   !s.cfg.Continuous,
		RereadPartial:      true,
		Faults:             faults,
	}
	for _, t := range tables {
		cfg.Tables = append(cfg.Tables, merge.TableConfig{Schema: t.schema, Name: t.name})
	}
	bctx, cancel := context.WithTimeoutCause(ctx, s.cfg.budget(), errBudget)
	defer cancel()

	from := r.position()
	for attempt := 0; ; attempt++ {
		sink := newRecordSink(r, tables)
		run := cfg
		if from == nil && attempt == 0 {
			// No position: every table is backfilled from scratch into an empty destination, so
			// its changes before its backfill are passed over (a TRUNCATE, a change that cannot
			// be placed), as a reset stream's are. The slot may hold such changes (an earlier
			// read, killed before its first state, created it), and the reset a stop would ask
			// for gives this same empty state again. Not after a re-sync of a state the slot
			// cannot resume (a later attempt): the destination holds rows, which a TRUNCATE
			// passed over would leave there.
			run.Tables = slices.Clone(cfg.Tables)
			for i := range run.Tables {
				run.Tables[i].Rebackfill = true
			}
		}
		engine, err := merge.New(run, sink, s.log)
		if err != nil {
			return &configError{err}
		}
		err = engine.Run(bctx, from)
		if ferr := sink.flush(); err == nil {
			err = ferr
		}
		if errors.Is(err, errBudget) && ctx.Err() == nil {
			s.log.Info().Str("budget", s.cfg.budget().String()).Msg("the sync's time budget ran out: the next sync resumes where this one ended")
			return nil
		}
		if errors.Is(err, replicator.ErrSlotLost) {
			return lostSlot(rm)
		}
		if attempt == 0 && from != nil && resyncable(err) {
			if rm.InvalidCDCCursorBehaviour != invalidCursorResync {
				return &configError{fmt.Errorf("%w. The state cannot be resumed from slot %q: reset the connection's state (a full re-sync), or set invalid_cdc_cursor_position_behavior to %q to re-sync automatically", err, rm.ReplicationSlot, invalidCursorResync)}
			}
			s.log.Warn().Err(err).Msg("the state cannot be resumed from the slot: every incremental stream is backfilled again (invalid_cdc_cursor_position_behavior: Re-sync data)")
			s.out.trace(&traceMessage{Type: "ANALYTICS", Analytics: &analyticsTrace{Type: "cdc_cursor_invalid", Value: "1"}})
			from = nil
			r.mu.Lock()
			r.pos = nil
			r.mu.Unlock()
			continue
		}
		return err
	}
}

// lostSlot is the error of a read whose slot is invalidated (wal_status lost): it streams nothing
// any more, whatever invalid_cdc_cursor_position_behavior says, and Tidemark drops no slot, so
// the DBA must make it again; what follows depends on the behaviour chosen.
func lostSlot(rm *replicationMethod) error {
	slot := rm.ReplicationSlot
	what := fmt.Sprintf("replication slot %q is invalidated: it lost WAL it still needed (wal_status = lost; see max_slot_wal_keep_size), so the changes it held are gone and it can stream nothing more. "+
		"Tidemark drops no slot: drop it and create it again, with %s %s", slot, sqlfix.DropSlot(slot), sqlfix.CreateSlot(slot))
	if rm.InvalidCDCCursorBehaviour == invalidCursorResync {
		return configErrorf("%s The next sync then backfills every stream from the new slot on its own (invalid_cdc_cursor_position_behavior: %s)", what, invalidCursorResync)
	}
	return configErrorf("%s Then reset the connection's state (a full re-sync), or set invalid_cdc_cursor_position_behavior to %q, with which the next sync backfills every stream from the new slot on its own", what, invalidCursorResync)
}

// resyncable reports a state that cannot be resumed here (the slot passed it, it belongs to
// another cluster, database or slot, the slot was created after it, the server's history forked
// before it or has not reached it): a new backfill of every stream from the slot's position
// repairs it. Its position is never acknowledged.
func resyncable(err error) bool {
	return errors.Is(err, merge.ErrPositionBehindSlot) || errors.Is(err, merge.ErrSystemChanged) ||
		errors.Is(err, merge.ErrForeignPosition) || errors.Is(err, merge.ErrTimelineForked) || errors.Is(err, merge.ErrPositionAhead)
}

func (r *reader) position() *merge.Position {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pos == nil {
		return nil
	}
	return r.pos.Clone()
}

func (r *reader) setPosition(pos *merge.Position) {
	r.mu.Lock()
	r.pos = pos.Clone()
	r.mu.Unlock()
}

// emitState writes a state: with CDC, the GLOBAL state (the position and every configured
// stream's progress); with Standard and Xmin, the STREAM state of st (nil: of the stream being
// read).
func (r *reader) emitState(st *readStream) error {
	make := r.stateMaker(st)
	if make == nil {
		return nil
	}
	return r.s.out.state(make)
}

// emitStateIfIdle is the heartbeat's state: the last one again, written only when nothing was
// written for d and no record waits for a state (output.stateIfIdle).
func (r *reader) emitStateIfIdle(d time.Duration) error {
	make := r.stateMaker(nil)
	if make == nil {
		return nil
	}
	_, err := r.s.out.stateIfIdle(d, make)
	return err
}

// stateMaker returns what makes the state of st (the current stream for nil; nil when there is
// none): the global state for CDC.
func (r *reader) stateMaker(st *readStream) func() *stateMessage {
	if r.s.cfg.cdc() {
		return r.stateMessage
	}
	if st == nil {
		r.mu.Lock()
		st = r.current
		r.mu.Unlock()
		if st == nil {
			return nil
		}
	}
	return func() *stateMessage { return r.streamStateMessage(st) }
}

func (r *reader) stateMessage() *stateMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := &globalState{SharedState: encodeShared(r.pos), StreamStates: []streamState{}}
	for _, st := range r.streams {
		var ts tableState
		switch {
		case !st.incremental && st.fr != nil:
			ts = *st.fr
		case !st.incremental:
			ts = tableState{SyncMode: "full_refresh"}
		default:
			ts.SyncMode = "incremental"
			if r.pos != nil && r.pos.Tables[st.key()] != nil {
				ts.TableProgress = *r.pos.Tables[st.key()]
			} else if st.base != nil && r.pos != nil {
				ts.TableProgress = *st.base
			}
		}
		b, _ := json.Marshal(ts)
		g.StreamStates = append(g.StreamStates, streamState{StreamDescriptor: st.desc, StreamState: b})
	}
	return &stateMessage{Type: "GLOBAL", Global: g}
}

// heartbeat repeats the last state when nothing went out for a state interval and no record is
// waiting for a state: the platform counts states as signs of life. Before the read has a
// position (a slot being created, a first chunk or query still running) the state says so: it
// carries the progress the read started from, and a read resumed from it starts over as this one
// did.
func (r *reader) heartbeat(ctx context.Context) {
	interval := r.s.cfg.stateInterval()
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = r.emitStateIfIdle(interval)
		}
	}
}

// heartbeatQuery runs the configured heartbeat_action_query at the start of the read and every
// minute, on its own connection; a failure is logged, as Airbyte's connector does.
func (s *source) heartbeatQuery(ctx context.Context, q string) {
	conn, err := s.connect(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("heartbeat_action_query: cannot connect")
		}
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		if _, err := conn.Exec(ctx, q); err != nil && ctx.Err() == nil {
			if perr := heartbeatPlan(ctx, conn, q); perr != nil {
				err = perr
			}
			s.log.Warn().Err(err).Msg("heartbeat_action_query failed")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// estimates sends each stream's backfill row estimate (pg_class.reltuples less what is done).
func (r *reader) estimates(ctx context.Context) {
	for _, st := range r.streams {
		if !st.exists {
			continue
		}
		var done int64
		if st.incremental {
			p := st.base
			if r.pos != nil && p != nil && p.Done {
				continue
			}
			if p != nil && r.pos != nil {
				done = p.Rows
			}
		} else if st.fr != nil && !st.fr.Done {
			done = st.fr.Rows
		}
		var n float64
		if err := r.conn.QueryRow(ctx, `SELECT greatest(reltuples, 0)::float8 FROM pg_class WHERE oid = to_regclass($1)`,
			pgx.Identifier{st.schema, st.name}.Sanitize()).Scan(&n); err != nil {
			continue
		}
		left := max(int64(n)-done, 0)
		r.s.out.trace(&traceMessage{Type: "ESTIMATE", Estimate: &estimateTrace{Name: st.desc.Name, Namespace: st.desc.Namespace, Type: "STREAM", RowEstimate: left}})
	}
}

// recordPiece is how many bytes of encoded records a full refresh gathers before writing them.
const recordPiece = 1 << 20

// fullRefresh reads a full refresh stream: by key chunks, with a state after each (an attempt
// that fails resumes within the job), or in one query when the relation has no usable key.
func (r *reader) fullRefresh(ctx context.Context, st *readStream) error {
	t, err := chunker.Discover(ctx, r.conn, st.schema, st.name, nil, "")
	if err != nil {
		if errors.Is(err, chunker.ErrNoKey) || errors.Is(err, chunker.ErrNoTable) {
			return r.readAll(ctx, st)
		}
		return err
	}
	reader, err := chunker.NewReader(r.conn, chunker.Config{})
	if err != nil {
		return err
	}
	r.mu.Lock()
	if st.fr == nil || st.fr.Done || !slices.Equal(st.fr.Key, t.KeyNames()) {
		// A new read: a finished one is read again, as full refresh wants.
		st.fr = &tableState{SyncMode: "full_refresh", TableProgress: merge.TableProgress{Key: t.KeyNames()}}
	}
	fr := st.fr
	r.mu.Unlock()
	enc := newRowEncoder(r.types, st)
	var buf []byte
	for {
		var chunk *chunker.Chunk
		if fr.MaxKey == nil {
			// The first chunk reads the upper bound too (nil: the table is empty).
			if chunk, err = reader.First(ctx, t, r.s.cfg.BackfillChunkSize); err == nil {
				r.mu.Lock()
				fr.MaxKey = chunk.Upper
				r.mu.Unlock()
				if chunk.Upper == nil {
					r.mu.Lock()
					fr.Done = true
					r.mu.Unlock()
					return r.emitState(st)
				}
			}
		} else {
			chunk, err = reader.Next(ctx, t, fr.Cursor, fr.MaxKey, r.s.cfg.BackfillChunkSize)
		}
		if errors.Is(err, chunker.ErrSchemaChanged) {
			if t, err = chunker.Discover(ctx, r.conn, st.schema, st.name, nil, ""); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		cols := chunkColumns(chunk.Table)
		// The records go out in pieces of about recordPiece bytes: a chunk's records held
		// whole would double what the chunk itself holds.
		buf = buf[:0]
		n := 0
		for _, row := range chunk.Rows {
			if buf, err = enc.appendRow(ctx, buf, cols, row); err != nil {
				return err
			}
			if n++; len(buf) >= recordPiece {
				if err := r.s.out.writeRecords(buf, n); err != nil {
					return err
				}
				buf, n = buf[:0], 0
			}
		}
		if err := r.s.out.writeRecords(buf, n); err != nil {
			return err
		}
		r.mu.Lock()
		fr.Rows += int64(len(chunk.Rows))
		fr.Chunks++
		if chunk.Last != nil {
			fr.Cursor = chunk.Last
		}
		fr.Done = chunk.Done
		r.mu.Unlock()
		if err := r.emitState(st); err != nil {
			return err
		}
		if chunk.Done {
			return nil
		}
		if err := context.Cause(ctx); err != nil {
			return err
		}
	}
}

// readAll reads a relation without a usable key (a view, a table without a primary key) in one
// query; it cannot resume mid-way.
func (r *reader) readAll(ctx context.Context, st *readStream) error {
	query := "SELECT * FROM " + pgx.Identifier{st.schema, st.name}.Sanitize()
	// The types are looked up before the rows are read, from the columns of an empty read: the
	// connection is busy while the rows come, and cannot answer a type lookup then.
	cols, err := queryColumns(ctx, r.conn, st, query+" LIMIT 0")
	if err != nil {
		return err
	}
	enc := newRowEncoder(r.types, st)
	if err := enc.prepare(ctx, cols); err != nil {
		return err
	}
	rows, err := r.conn.Query(ctx, query, pgx.QueryResultFormats{pgx.TextFormatCode})
	if err != nil {
		return fmt.Errorf("read %s: %w", st.key(), err)
	}
	defer rows.Close()
	fds := rows.FieldDescriptions()
	cols = columnsOf(st, fds)
	var buf []byte
	n, total := 0, int64(0)
	vals := make(chunker.Row, len(fds))
	flush := func() error {
		err := r.s.out.writeRecords(buf, n)
		buf, n = buf[:0], 0
		return err
	}
	for rows.Next() {
		for i, v := range rows.RawValues() {
			vals[i] = v
		}
		if buf, err = enc.appendRow(ctx, buf, cols, vals); err != nil {
			return err
		}
		n++
		total++
		if len(buf) >= recordPiece {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %s: %w", st.key(), err)
	}
	if err := flush(); err != nil {
		return err
	}
	r.mu.Lock()
	st.fr = &tableState{SyncMode: "full_refresh", TableProgress: merge.TableProgress{Done: true, Rows: total}}
	r.mu.Unlock()
	return r.emitState(st)
}

// queryColumns returns the columns a query's rows have, without reading any (the query should
// return none: LIMIT 0).
func queryColumns(ctx context.Context, conn *pgx.Conn, st *readStream, query string) (*rowColumns, error) {
	rows, err := conn.Query(ctx, query, pgx.QueryResultFormats{pgx.TextFormatCode})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", st.key(), err)
	}
	cols := columnsOf(st, rows.FieldDescriptions())
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", st.key(), err)
	}
	return cols, nil
}

func columnsOf(st *readStream, fds []pgconn.FieldDescription) *rowColumns {
	cols := &rowColumns{schema: st.schema, table: st.name}
	for _, fd := range fds {
		cols.names = append(cols.names, fd.Name)
		cols.types = append(cols.types, fd.DataTypeOID)
	}
	return cols
}
