package merge

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/sqlfix"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/watermark"
)

// Sink receives the engine's output, in order, from one goroutine.
type Sink interface {
	// Emit hands over the next events. It must not keep the slice after it returns; it may keep
	// the events.
	Emit(ctx context.Context, events []Event) error
	// Checkpoint marks a consistent point: every event emitted so far is covered by pos, none
	// after it will be. When Config.AckCheckpoints is set, the sink must have made those events
	// and pos durable before it returns nil: the slot is then acknowledged up to pos.LSN.
	Checkpoint(ctx context.Context, pos *Position) error
}

// Resumer is a Sink told, before the run's first event, where the run's output resumes: pos is
// the run's starting position, whose SystemID and Timeline are the source's now, and over says
// that the output starts over: a position that could not be resumed was replaced
// (Config.ResyncInvalidPosition, Config.ResyncLostSlot). A sink that passes over the
// events a run before wrote past its checkpoint relies on the run reading them again from the
// same history and the same position; it must not keep pos.
type Resumer interface {
	Resume(pos *Position, over bool)
}

// Leftover is a Sink whose output keeps what a run wrote past its checkpoint (a JetStream
// stream keeps what a killed run published). Leftover is asked, at the start of a run without a
// position (a run before ended before its first checkpoint), with the LSN the run will stream
// from (its slot's confirmed flush): it reports whether the output holds events past its
// checkpoint that this run will not read again, the slot starting after them (a slot created
// again: the run before, ending, dropped the one it had created, or someone did). The changes
// between were in no slot: every table's output starts over (a refresh first, as a
// re-backfill's), or rows written then and deleted since would stay in the output. A slot still
// there (a run killed) starts where that run began, and the sink checks the run reads those
// events again. A wrapping sink must pass it on, as it passes Resumer and Replayer.
type Leftover interface {
	Leftover(start pglogrepl.LSN) bool
}

// Replayer is a Sink that may be writing again, at the start of a run, what its output holds
// past its checkpoint (a JetStream stream keeps what a killed run published): it checks that the
// run reads those events again one for one, so no table's output may start over meanwhile. A
// re-backfill asked of the running engine (Rebackfill) waits until Replaying is false; it is
// called from other goroutines than the merge loop's.
type Replayer interface {
	Replaying() bool
}

// TableConfig names a captured table.
type TableConfig struct {
	Schema     string   // namespace
	Name       string   // table name
	Key        []string // key override; nil: the replica identity's columns (see chunker.Discover)
	NoBackfill bool     // capture changes only; existing rows are not read
	// TypesChanged: the output's values were converted as the source's were by a column type
	// change (ErrValuesRewritten), so the column types are taken as they are now, for this run,
	// without a re-backfill.
	TypesChanged bool
	// Maintenance: the table's storage files changed since the position was taken by maintenance
	// that changed no value (ErrStorageReplaced), so they are taken as they are now, for this
	// run, without a re-backfill.
	Maintenance bool
	// Rebackfill starts the table's output over in this run (a refresh: TableProgress.Refresh),
	// whether or not the position has the table; without a position, it is how a re-backfill is
	// asked for (the table's changes before its backfill, even ones that cannot be placed, are
	// then passed over).
	Rebackfill bool
}

// Hooks are called at the points of the chunk protocol and of the output, with the chunk id or
// the position; tests use them to run SQL between a chunk's steps and to inject crashes. Each
// is optional. Hooks run on the engine's goroutines and must not block for long.
type Hooks struct {
	BeforeLow       func(ctx context.Context, chunk int64) // the worker: before the low watermark is written
	AfterLow        func(ctx context.Context, chunk int64) // after the low watermark committed, before the SELECT
	AfterSelect     func(ctx context.Context, chunk int64) // after the chunk was read and handed over, before the high watermark
	AfterHigh       func(ctx context.Context, chunk int64) // after the high watermark committed
	AfterEmit       func(ctx context.Context, n int)       // the merge loop: after n events went to the sink
	AfterCheckpoint func(ctx context.Context, pos *Position)
	// (With several readers, Config.Readers, the worker's hooks are called from each reader's
	// goroutine, at the same time.)
	// ChunkAbandoned is called by the worker when a chunk of table was abandoned and will be
	// retried, with the reason (for metrics).
	ChunkAbandoned func(ctx context.Context, table string, reason error)
}

// DefaultChunkSize is the most rows a chunk reads unless Config.ChunkSize says otherwise.
const DefaultChunkSize = 10000

// MaxReaders bounds Config.Readers: each reader holds a connection to the source.
const MaxReaders = 64

// Config configures an Engine. The zero value of every optional field is documented with it.
type Config struct {
	Source replicator.Config // the source, its slot and publication
	Tables []TableConfig     // the captured tables; at least one
	// Watermarks is how watermarks are written. Zero (watermark.Auto): as transactional logical
	// messages on PostgreSQL 14 and later, which need no table and no privilege beyond PUBLIC's;
	// in the signal table before.
	Watermarks watermark.Transport
	// SignalTable is the watermark table as {schema, table}, for the Table transport. Zero:
	// watermark.DefaultTable.
	SignalTable pgx.Identifier
	// WatermarkTimeout bounds a watermark write, including a wait for a synchronous standby.
	// Zero: 10s.
	WatermarkTimeout time.Duration
	Chunker          chunker.Config
	// ChunkSize is the most rows a chunk reads, unless it grows (ChunkGrowth). Zero:
	// DefaultChunkSize.
	ChunkSize int
	// ChunkGrowth is how many times ChunkSize a chunk may grow to while no change of a captured
	// table commits inside the windows before it (nothing waits behind its rows); one keeps
	// every chunk at ChunkSize (tests that place changes in a given chunk). Zero: 4.
	ChunkGrowth int
	// Readers is the most chunk readers that backfill at once, each on its own query connection
	// (a short transaction per chunk, as one reader's): the tables are dealt to them in their
	// configured order, those with work first (table i to reader i mod Readers), each reader
	// owning its own, with its own windows, verdicts and re-reads; and a table's backfill with
	// two chunks per reader or more is split into key ranges, one per reader, read at once
	// (I23). More readers finish sooner and hold more connections, snapshots and chunks (three
	// per reader, I21) on the source and in memory. Zero: 1.
	Readers int
	// MaxChunkBytes bounds the bytes a chunk holds: a chunk read stops at it (chunker
	// Config.MaxBytes, unless set), and the chunk size shrinks to fit it. It bounds the engine's
	// buffered rows, since at most three chunks are held (I21). Zero: 32 MiB.
	MaxChunkBytes int
	// CheckpointInterval is the longest time between checkpoints while changes flow; there is
	// also one after every chunk. Zero: 1s.
	CheckpointInterval time.Duration
	// WatchInterval is the time between two checks of what the stream does not report: that
	// every captured table still exists (and under which name), belongs to the publication as
	// it did, and has the partitions it had. Zero: 10s.
	WatchInterval time.Duration
	// AckCheckpoints acknowledges each checkpoint's LSN to the slot once Sink.Checkpoint returns;
	// otherwise only the resume position given to Run is acknowledged (Airbyte: the platform
	// persists a state after Run returns).
	AckCheckpoints bool
	// StopWhenCaughtUp ends Run once every backfill is done and the stream has caught up with
	// the WAL position of that moment. Zero: Run streams until its context ends.
	StopWhenCaughtUp bool
	// RereadPartial emits no update that lacks unchanged TOASTed values (REPLICA IDENTITY
	// DEFAULT); the row is read again whole instead, in a key-list chunk, at a later position.
	// For sinks that replace whole rows (Airbyte destinations). Otherwise such updates are
	// emitted with those values Unchanged, and only rows they evict from a chunk are read again.
	RereadPartial bool
	// AddToPublication adds captured tables that are not in the publication to it (the role must
	// own them), when their capture starts now (no progress, or a refresh); otherwise such a
	// table is refused with the statement that adds it.
	AddToPublication bool
	// ResyncInvalidPosition answers a position that cannot be resumed (another cluster, database
	// or slot, a forked timeline, a slot created after it or advanced past it, a position ahead
	// of the server) by starting over from the slot's position with every table refreshed
	// (TableProgress.Refresh) instead of failing. Zero: Run fails with the reason.
	ResyncInvalidPosition bool
	// ResyncLostSlot answers a position whose slot is gone (dropped, or invalidated and created
	// again: Source.ReplaceLostSlot) the same way, and only that: every table is backfilled
	// again from the new slot, in the background of the stream, with a warning.
	ResyncLostSlot bool
	// RebackfillRewrites answers a change that rewrote a table's stored values with no row event
	// by re-backfilling the table in the background of the stream (a refresh, as Rebackfill),
	// logged with its cause, instead of stopping: a column type change that rewrote the table
	// and an enum label renamed (ErrValuesRewritten), while the capture runs or between two
	// runs; a column added with a volatile default, and a persistence round trip the watch saw
	// (SET UNLOGGED, then SET LOGGED), while it runs. What cannot be told from maintenance
	// (ErrStorageReplaced) still stops. Zero: each stops the capture.
	RebackfillRewrites bool
	// RewriteRebackfillEvery is the shortest time between two automatic re-backfills of one
	// table (RebackfillRewrites): a rewrite within it waits for its end. Zero: 5m.
	RewriteRebackfillEvery time.Duration
	Hooks                  Hooks
	Faults                 Faults // empty unless built with the tidemark_faults tag (faults.go)
}

// Errors callers branch on.
var (
	// ErrSystemChanged: the position belongs to another cluster (a restore, a failover to a
	// server that is not a copy, another database).
	ErrSystemChanged = errors.New("the source is not the cluster the position was taken on")
	// ErrPositionBehindSlot: the slot was confirmed past the position, so changes between the
	// two are gone from the slot.
	ErrPositionBehindSlot = errors.New("the position is behind the replication slot")
	// ErrPositionAhead: the position lies beyond the server's WAL (a state from another server,
	// or a server restored to an earlier point). Acknowledging it would make the slot skip
	// changes, so it is refused.
	ErrPositionAhead = errors.New("the position is ahead of the server's WAL")
	// ErrNoTables: nothing to capture.
	ErrNoTables = errors.New("no tables configured")
	// ErrCommitUnknown: a sink's Checkpoint failed while committing, and the checkpoint may be
	// durable (a connection lost after COMMIT was sent). Sinks wrap such errors with it.
	ErrCommitUnknown = errors.New("the checkpoint's commit outcome is unknown")
	// ErrNoPrivilege: this role may not read a table to capture.
	ErrNoPrivilege = errors.New("permission denied")
)

// ErrUnplaceable: a change the engine cannot place correctly (see UnplaceableError). The capture
// stops before it: nothing after the last checkpoint is acknowledged.
var ErrUnplaceable = errors.New("a change of a captured table cannot be placed")

// UnplaceableError details ErrUnplaceable: which table, where in the stream, why, and what the
// operator does next. Products add how to re-backfill a table in their own terms.
type UnplaceableError struct {
	Table  string        // configured schema.table
	LSN    pglogrepl.LSN // commit LSN of the transaction that holds the change (0: none yet)
	XID    uint32        // its transaction id
	Reason string        // why it cannot be placed
	Fix    string        // what to do
}

func (e *UnplaceableError) Error() string {
	at := ""
	if e.LSN != 0 {
		at = fmt.Sprintf(" (transaction %d, commit %s)", e.XID, e.LSN)
	}
	return fmt.Sprintf("%v: %s%s: %s; %s", ErrUnplaceable, e.Table, at, e.Reason, e.Fix)
}

func (e *UnplaceableError) Unwrap() error { return ErrUnplaceable }

// pgIdent quotes schema.name for messages that show SQL.
func pgIdent(schema, name string) string { return pgx.Identifier{schema, name}.Sanitize() }

// PositionBehindSlotError details ErrPositionBehindSlot.
type PositionBehindSlotError struct {
	Slot           string
	Position       string // the position's LSN
	ConfirmedFlush string // the slot's confirmed_flush_lsn
}

func (e *PositionBehindSlotError) Error() string {
	return fmt.Sprintf("%v: slot %q is confirmed up to %s but the position to resume from is %s; the changes between them cannot be streamed again: start over with a full backfill (no position)",
		ErrPositionBehindSlot, e.Slot, e.ConfirmedFlush, e.Position)
}

func (e *PositionBehindSlotError) Unwrap() error { return ErrPositionBehindSlot }

// PositionAheadError details ErrPositionAhead.
type PositionAheadError struct {
	Position string // the position's LSN
	Server   string // the server's flushed WAL position
}

func (e *PositionAheadError) Error() string {
	return fmt.Sprintf("the position %s is ahead of the server's WAL position %s: it was not taken on this server as it is now (a restore to an earlier point, or another server); it is not acknowledged, since the slot would skip changes", e.Position, e.Server)
}

func (e *PositionAheadError) Unwrap() error { return ErrPositionAhead }

// Validate reports every problem of c at once.
func (c *Config) Validate() error {
	errs := []error{c.Source.Validate(), c.Chunker.Validate()}
	if len(c.Tables) == 0 {
		errs = append(errs, ErrNoTables)
	}
	seen := map[string]bool{}
	for _, t := range c.Tables {
		if t.Schema == "" || t.Name == "" {
			errs = append(errs, fmt.Errorf("table %q.%q: schema and name are required", t.Schema, t.Name))
		}
		if name := t.Schema + "." + t.Name; seen[name] {
			errs = append(errs, fmt.Errorf("table %s is configured twice", name))
		} else {
			seen[name] = true
		}
	}
	if c.Readers < 0 || c.Readers > MaxReaders {
		errs = append(errs, fmt.Errorf("readers %d is out of range: 1 to %d (0: 1)", c.Readers, MaxReaders))
	}
	if c.ChunkSize < 0 || c.ChunkGrowth < 0 || c.MaxChunkBytes < 0 || c.CheckpointInterval < 0 || c.WatchInterval < 0 || c.RewriteRebackfillEvery < 0 {
		errs = append(errs, errors.New("chunk size, chunk growth, chunk bytes, checkpoint, watch and rewrite re-backfill intervals must not be negative"))
	}
	return errors.Join(errs...)
}

func (c *Config) ensureDefaults() {
	if c.Faults.ackAhead() {
		c.Source.StatusInterval = 100 * time.Millisecond
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = DefaultChunkSize
	}
	if c.Readers == 0 {
		c.Readers = 1
	}
	if c.ChunkGrowth == 0 {
		c.ChunkGrowth = 4
	}
	if c.MaxChunkBytes == 0 {
		c.MaxChunkBytes = 32 << 20
	}
	if c.Chunker.MaxBytes == 0 {
		c.Chunker.MaxBytes = c.MaxChunkBytes
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = time.Second
	}
	if c.RewriteRebackfillEvery == 0 {
		c.RewriteRebackfillEvery = 5 * time.Minute
	}
	if c.WatchInterval == 0 {
		c.WatchInterval = 10 * time.Second
	}
	if len(c.SignalTable) == 0 {
		c.SignalTable = watermark.DefaultTable
	}
}

// Engine captures the configured tables: it backfills them chunk by chunk while it streams
// their changes, and hands one ordered stream of Events and Positions to a Sink.
type Engine struct {
	cfg  Config
	sink Sink
	base zerolog.Logger // the caller's logger, for the components' own (one component key each)
	log  zerolog.Logger
	// checkpointing is set once the run's first checkpoint is, or may be, durable: from then on, what
	// the run created on the source (its slot, its publication) may be what the output resumes
	// from, and stays.
	checkpointing atomic.Bool
	// addedTables are the tables this run added to an existing publication (prepare), and the
	// signal table when it added it.
	addedTables []pgx.Identifier
	// signalCreated: this run created the signal table.
	signalCreated bool
	// asks is the running merge loop's input while a run is under way (Rebackfill), nil
	// otherwise; askGone is closed once that merge loop has returned.
	askMu   sync.Mutex
	asks    chan<- any
	askGone <-chan struct{}
}

// ErrNotRunning: a request (Rebackfill) came while no run was under way (before the first, or
// between two: a reconnection).
var ErrNotRunning = errors.New("the capture is not running")

// rebackfillAsk is a request to start tables' output over while the run goes on; done gets its
// outcome once a checkpoint carries it (or why not). A request whose ctx ended before the merge
// loop took it is not taken.
type rebackfillAsk struct {
	ctx    context.Context
	tables []string
	done   chan error
	// cause and shape: a re-backfill the worker asks for itself (Config.RebackfillRewrites),
	// why, and the table's shape to record with it.
	cause string
	shape *Shape
}

// errAskLost: the run ended before a checkpoint carried a request it had taken.
var errAskLost = errors.New("the capture stopped before a checkpoint recorded the request: ask again once it runs")

// Rebackfill starts the output of tables (configured "schema.table" names) over while the run
// goes on: from the moment the merge loop takes the request, their changes are not emitted
// until the low watermark of their re-backfill's first window, where a Refresh event is; the
// backfill then reads them from the start, and the stream never pauses for it (I20). A request
// that comes inside a source transaction is taken at its end, so that the output never holds
// part of a transaction. Nothing is written to the database but the usual watermarks, so no
// other role can ask for it. It returns once a checkpoint carries the request (a restart then
// goes on with it), or an error: no run is under way (ErrNotRunning), a table is not captured,
// the run ended first; when ctx ends after the request was taken, it says so (the re-backfill
// goes on unless the run ends before its next checkpoint).
func (e *Engine) Rebackfill(ctx context.Context, tables []string) error {
	e.askMu.Lock()
	in, gone := e.asks, e.askGone
	e.askMu.Unlock()
	if len(tables) == 0 {
		return errors.New("no table to re-backfill")
	}
	if in == nil {
		return ErrNotRunning
	}
	if r, ok := e.sink.(Replayer); ok && r.Replaying() {
		return fmt.Errorf("%w: it is writing again what its output holds past its checkpoint", ErrNotRunning)
	}
	ask := rebackfillAsk{ctx: ctx, tables: tables, done: make(chan error, 1)}
	select {
	case in <- ask:
	case <-gone:
		return ErrNotRunning
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case err := <-ask.done:
		return err
	case <-gone:
		select {
		case err := <-ask.done:
			return err
		default:
			return errAskLost
		}
	case <-ctx.Done():
		return fmt.Errorf("the request was sent; no checkpoint recorded it yet (%w): the re-backfill goes on unless the capture stops first", context.Cause(ctx))
	}
}

// New returns an Engine. It connects to nothing until Run.
func New(cfg Config, sink Sink, log zerolog.Logger) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.ensureDefaults()
	return &Engine{cfg: cfg, sink: sink, base: log, log: log.With().Str("component", "merge").Logger()}, nil
}

// errFinished ends the engine's goroutines when the merge loop is done.
var errFinished = errors.New("finished")

// Run captures from position from (nil: a first run, which backfills every table) until ctx
// ends, or, with StopWhenCaughtUp, until the backfills are done and the stream caught up. When
// ctx ends, Run finishes the transaction in progress if it can, takes a last checkpoint, and
// returns context.Cause(ctx).
func (e *Engine) Run(ctx context.Context, from *Position) error {
	conn, err := pgconf.Open(ctx, e.cfg.Source.DSN, "tidemark", e.cfg.Source.Configure, pgconf.CancelOnContext, pgconf.LargeReads)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	// Nothing is created on the source before the tables are known to be capturable.
	if err := e.checkTables(ctx, conn, from); err != nil {
		return err
	}
	// The publication must exist before the signal table joins it; the replicator checks it
	// (and creates it when allowed) in Open.
	stream, err := replicator.Open(ctx, e.cfg.Source, e.base)
	if err != nil {
		return err
	}
	defer stream.Close(context.WithoutCancel(ctx))
	e.checkpointing.Store(false)
	e.addedTables, e.signalCreated = nil, false
	err = e.runStream(ctx, conn, stream, from)
	// A run that ends before its first checkpoint leaves the source as it was: what it created
	// there is dropped (a slot left behind would retain WAL for ever, unseen).
	if !e.checkpointing.Load() {
		_ = stream.Close(context.WithoutCancel(ctx))
		if _, pubCreated := stream.Created(); !pubCreated && len(e.addedTables) > 0 {
			if uerr := e.undoAdded(ctx); uerr != nil {
				err = errors.Join(err, uerr)
			}
		}
		if uerr := stream.Undo(ctx); uerr != nil {
			err = errors.Join(err, uerr)
		}
		if e.signalCreated {
			if uerr := e.undoSignalTable(ctx); uerr != nil {
				err = errors.Join(err, uerr)
			}
		}
	}
	return err
}

// undoSignalTable drops the signal table this run created, unless another capture may use it:
// another pgoutput slot of the database exists (as tidemark cleanup decides; its run may have
// checked the table and not written yet), or one has written a mark in it. The check and the
// DROP are one transaction, under the table's ACCESS EXCLUSIVE lock.
func (e *Engine) undoSignalTable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	name := e.cfg.SignalTable.Sanitize()
	conn, err := pgconf.Open(ctx, e.cfg.Source.DSN, "tidemark", e.cfg.Source.Configure)
	if err == nil {
		defer conn.Close(ctx)
		var others []string
		if others, err = replicator.OtherSlots(ctx, conn, e.cfg.Source.Slot); err == nil && len(others) > 0 {
			e.log.Warn().Str("table", name).Strs("other_slots", others).
				Msgf("signal table kept: this run created it, but other pgoutput slots of the database may be captures that use it; once none does, drop it with DROP TABLE %s;", name)
			return nil
		}
		if err == nil {
			err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, "LOCK TABLE "+name+" IN ACCESS EXCLUSIVE MODE"); err != nil {
					return err
				}
				var written bool
				if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+name+" WHERE slot <> $1)", e.cfg.Source.Slot).Scan(&written); err != nil {
					return err
				}
				if written {
					e.log.Warn().Str("table", name).Msg("signal table kept: this run created it, but another capture has written in it since")
					return nil
				}
				if _, err := tx.Exec(ctx, "DROP TABLE "+name); err != nil {
					return err
				}
				e.log.Info().Str("table", name).Msg("signal table dropped again: this run created it and ends before its first checkpoint")
				return nil
			})
			if err == nil {
				return nil
			}
		}
	}
	return fmt.Errorf("%w: signal table %s, which this run created (%w); drop it with DROP TABLE %s;", replicator.ErrLeftBehind, name, err, name)
}

// undoAdded takes the tables this run added to an existing publication out of it again.
func (e *Engine) undoAdded(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	pub := e.cfg.Source.Publication
	var fixes []string
	conn, err := pgconf.Open(ctx, e.cfg.Source.DSN, "tidemark", e.cfg.Source.Configure)
	if err == nil {
		defer conn.Close(ctx)
		// Another capture of the publication may have begun to rely on a table meanwhile: its
		// slot would lose the table's changes. Then the tables stay (they have usable keys:
		// checkTables), and the statements are said.
		var others []string
		others, err = replicator.OtherSlots(ctx, conn, e.cfg.Source.Slot)
		if err == nil && len(others) > 0 {
			for _, t := range e.addedTables {
				fixes = append(fixes, "ALTER PUBLICATION "+sqlfix.Ident(pub)+" DROP TABLE ONLY "+t.Sanitize()+";")
			}
			e.addedTables = nil
			e.log.Warn().Str("publication", pub).Strs("other_slots", others).
				Msgf("tables this run added to the publication stay: other pgoutput slots of the database may stream them; once none does, take them out with %s", strings.Join(fixes, " "))
			return nil
		}
	}
	for _, t := range e.addedTables {
		if err == nil {
			if _, err = conn.Exec(ctx, "ALTER PUBLICATION "+sqlfix.Ident(pub)+" DROP TABLE ONLY "+t.Sanitize()); err == nil {
				e.log.Info().Str("table", t.Sanitize()).Str("publication", pub).Msg("table taken out of the publication again: this run added it and ends before its first checkpoint")
				continue
			}
		}
		fixes = append(fixes, "ALTER PUBLICATION "+sqlfix.Ident(pub)+" DROP TABLE ONLY "+t.Sanitize()+";")
	}
	e.addedTables = nil
	if len(fixes) > 0 {
		return fmt.Errorf("%w: this run added tables to publication %q and could not take them out again (%w): %s",
			replicator.ErrLeftBehind, pub, err, strings.Join(fixes, " "))
	}
	return nil
}

func (e *Engine) runStream(ctx context.Context, conn *pgx.Conn, stream *replicator.Stream, from *Position) error {
	s, err := e.prepareRun(ctx, conn, stream, from)
	if err != nil {
		return err
	}
	return e.runGoroutines(ctx, conn, stream, s)
}

// checkTables checks, before the run creates anything on the source, that each table whose
// capture starts now exists, has a key the stream carries, and may be read by this role. A
// table resumed from the position is left to discovery, which knows what became of it.
func (e *Engine) checkTables(ctx context.Context, conn *pgx.Conn, from *Position) error {
	var errs []error
	for _, tc := range e.cfg.Tables {
		if p := progressOf(from, tc.Schema+"."+tc.Name); p != nil && !p.Refresh && !tc.Rebackfill {
			continue
		}
		t, err := chunker.Discover(ctx, conn, tc.Schema, tc.Name, tc.Key, e.cfg.Source.Publication)
		if errors.Is(err, chunker.ErrNotPublished) && (e.cfg.AddToPublication || e.cfg.Source.CreatePublication) {
			t, err = chunker.Discover(ctx, conn, tc.Schema, tc.Name, tc.Key, "") // added to the publication (or created with it) later
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		id := pgx.Identifier{tc.Schema, tc.Name}
		var readable *bool // NULL: no table with that OID any more
		var role string
		if err := conn.QueryRow(ctx, `SELECT has_table_privilege($1::oid, 'SELECT'), current_user::text`, t.OID).Scan(&readable, &role); err != nil {
			return fmt.Errorf("check the privileges on %s.%s: %w", tc.Schema, tc.Name, err)
		}
		if readable == nil {
			errs = append(errs, fmt.Errorf("%w: %s.%s was dropped as the run started", chunker.ErrNoTable, tc.Schema, tc.Name))
			continue
		}
		if !*readable {
			errs = append(errs, fmt.Errorf("%w: role %s may not read %s.%s; grant it: %s",
				ErrNoPrivilege, sqlfix.Ident(role), tc.Schema, tc.Name, sqlfix.GrantSelect(id, role)))
		}
	}
	return errors.Join(errs...)
}

// runSetup is what a run starts from: its watermark writer, the position and tables resolved
// against the server, and the chunk reader.
type runSetup struct {
	writer  *watermark.Writer
	pos     *Position
	tables  map[string]*chunker.Table
	storage map[string]*storageCheck // the tables whose storage change the stream must explain
	reader  *chunker.Reader
	seed    bool // the guard starts with the transactions running at the start (worker.seed)
}

// prepareRun makes the watermarks' transport ready (the signal table in the publication, when it
// is the table transport), resolves the position against the server and its tables (prepare),
// and opens the chunk reader on conn.
func (e *Engine) prepareRun(ctx context.Context, conn *pgx.Conn, stream *replicator.Stream, from *Position) (*runSetup, error) {
	transport, err := e.cfg.Watermarks.Resolve(stream.System().ServerVersion)
	if err != nil {
		return nil, err
	}
	// Logical messages are read only when they carry the watermarks, and only Tidemark's.
	if transport == watermark.Messages {
		stream.KeepMessages(watermark.Prefix)
	}
	wcfg := watermark.Config{Transport: transport, Table: e.cfg.SignalTable, Slot: e.cfg.Source.Slot, Publication: e.cfg.Source.Publication, Timeout: e.cfg.WatermarkTimeout}
	prepared, err := watermark.Ensure(ctx, conn, wcfg, e.log)
	if prepared.AddedToPublication {
		e.addedTables = append(e.addedTables, e.cfg.SignalTable)
	}
	e.signalCreated = prepared.TableCreated
	if err != nil {
		return nil, err
	}
	writer, err := watermark.New(wcfg)
	if err != nil {
		return nil, err
	}
	pos, tables, storage, err := e.prepare(ctx, conn, stream, from)
	if err != nil {
		return nil, err
	}
	reader, err := chunker.NewReader(conn, e.cfg.Chunker)
	if err != nil {
		return nil, err
	}
	// The guard starts with every transaction running now when the position does not say which
	// commits may still be invisible, and when a table's capture starts in this run: the list
	// the position carries holds only the commits of the tables the run before captured (a
	// commit of a table only its publication held, still invisible, is in neither the list nor
	// this run's stream).
	seed := pos.Invisible == nil
	for _, tc := range e.cfg.Tables {
		name := tc.Schema + "." + tc.Name
		if p, now := progressOf(from, name), pos.Tables[name]; p == nil || p.Refresh || tc.Rebackfill || now == nil || now.Refresh {
			seed = true
		}
	}
	return &runSetup{writer: writer, pos: pos, tables: tables, storage: storage, reader: reader, seed: seed}, nil
}

// runGoroutines runs the stream, the chunk workers (one per reader) and the merge loop, each on
// its goroutine, and waits for all of them. The stream's goroutine owns the replication
// connection, the first worker owns conn and each other its own; the merge loop owns the core
// and the sink.
func (e *Engine) runGoroutines(ctx context.Context, conn *pgx.Conn, stream *replicator.Stream, s *runSetup) error {
	pos, tables := s.pos, s.tables
	core := newCore(s.writer.Config(), pos, tables)
	core.storage = s.storage
	core.noGuard, core.noEviction = e.cfg.Faults.noGuard(), e.cfg.Faults.noEviction()
	core.rereadPartial = e.cfg.RereadPartial
	// The engine's goroutines run until the merge loop is done, not until ctx ends: when ctx
	// ends, the stream must still deliver the rest of the transaction in progress.
	runCtx, cancelRun := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelRun(nil)
	g, gctx := errgroup.WithContext(runCtx)
	in := make(chan any, 1024)
	askGone := make(chan struct{})
	e.askMu.Lock()
	e.asks, e.askGone = in, askGone
	e.askMu.Unlock()
	defer func() {
		e.askMu.Lock()
		e.asks, e.askGone = nil, nil
		e.askMu.Unlock()
	}()
	// The readers (I23): the tables in their configured order, dealt to them in turn, those
	// with work first (a resumed run's done tables would otherwise leave readers idle).
	all := &worker{}
	for name, t := range tables {
		p := pos.Tables[name]
		// A copy of its own: the core writes the position's progress (a split's ranges in place)
		// on the merge loop's goroutine.
		all.tables = append(all.tables, &workTable{name: name, table: t, progress: p.clone(), parts: t.Partitions, storage: p.Storage, shape: p.Shape, member: p.Publication})
	}
	all.order(e.cfg.Tables)
	slices.SortStableFunc(all.tables, func(a, b *workTable) int {
		return cmp.Compare(boolInt(!a.progress.hasWork()), boolInt(!b.progress.hasWork()))
	})
	// With more readers than tables, the others read key ranges of split backfills (I23).
	n := max(1, e.cfg.Readers)
	seeded := make(chan struct{})
	workers := make([]*worker, n)
	verdicts := make([]chan verdict, n)
	wakes := make([]chan wakeup, n)
	for k := range workers {
		verdicts[k], wakes[k] = make(chan verdict, 8), make(chan wakeup, 1)
		log := e.base.With().Str("component", "chunker").Logger()
		if n > 1 {
			log = log.With().Int("reader", k+1).Logger()
		}
		workers[k] = &worker{cfg: &e.cfg, writer: s.writer, in: in, verdicts: verdicts[k], wake: wakes[k], log: log,
			index: k, readers: n, nextID: int64(k + 1 - n), seeded: seeded, seedRunning: s.seed}
	}
	for i, t := range all.tables {
		t.mine, t.owner = true, i%n
		workers[i%n].tables = append(workers[i%n].tables, t)
	}
	if n > 1 {
		// Each reader also holds the others' tables, to read the key ranges of their split
		// backfills that fall to it; their owners do everything else.
		for i, t := range all.tables {
			for k, w := range workers {
				if k != i%n {
					c := *t
					c.mine, c.progress = false, t.progress.clone()
					w.tables = append(w.tables, &c)
				}
			}
		}
	}
	workers[0].conn, workers[0].reader = conn, s.reader
	m := &mergeLoop{e: e, core: core, in: in, verdicts: verdicts, wake: wakes, stream: stream, fenced: make([]bool, n)}

	g.Go(func() error {
		return stream.Run(gctx, pos.LSN, func(ctx context.Context, ev replicator.Event) error {
			return sendEvent(ctx, in, ev, stream)
		})
	})
	for _, w := range workers {
		g.Go(func() error {
			if w.conn == nil {
				// A reader of its own: its connection, opened and closed on its goroutine.
				conn, err := pgconf.Open(gctx, e.cfg.Source.DSN, "tidemark", e.cfg.Source.Configure, pgconf.CancelOnContext, pgconf.LargeReads)
				if err != nil {
					return fmt.Errorf("source (reader %d): %w", w.index+1, err)
				}
				defer conn.Close(context.WithoutCancel(gctx))
				if w.reader, err = chunker.NewReader(conn, e.cfg.Chunker); err != nil {
					return err
				}
				w.conn = conn
			}
			err := w.run(ctx, gctx)
			if err != nil && gctx.Err() != nil && (errors.Is(err, context.Canceled) || pgerr.Canceled(err)) {
				// Cancelled with the others (a query cancelled as the merge loop finished comes
				// back as the server's 57014, not as the context's error): the cause is theirs.
				// A failure of its own stands.
				return context.Cause(gctx)
			}
			return err
		})
	}
	g.Go(func() error {
		defer close(askGone)
		defer m.core.dropAsks()
		err := m.run(ctx, gctx)
		if err == nil {
			cancelRun(errFinished)
		}
		return err
	})
	err := g.Wait()
	if errors.Is(err, errFinished) || errors.Is(context.Cause(runCtx), errFinished) && (err == nil || errors.Is(err, context.Canceled)) {
		err = nil
	}
	if err == nil && ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sendEvent queues a stream event for the merge loop. While the queue is full (a slow sink), it
// keeps the replication connection alive with status updates, on the replicator's goroutine.
func sendEvent(ctx context.Context, in chan<- any, ev replicator.Event, stream *replicator.Stream) error {
	select {
	case in <- ev:
		return nil
	default:
	}
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		select {
		case in <- ev:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
			if err := stream.Keepalive(); err != nil {
				return err
			}
			t.Reset(time.Second)
		}
	}
}

// mergeLoop feeds the core and hands its output to the sink. It owns no connection.
type mergeLoop struct {
	e         *Engine
	core      *core
	in        <-chan any
	verdicts  []chan verdict // each reader's, by chunk id (readerOf)
	wake      []chan wakeup  // each reader's tables with rows to read (again), for it idle (latest only)
	stream    *replicator.Stream
	rereadGen int // core.rereadGen when the worker was last told
	// fenced are the readers whose fence the stream showed (fencedReaders of them).
	fenced        []bool
	fencedReaders int

	lastCheckpoint time.Time
	checkpointed   *Position       // the last position given to the sink
	held           []rebackfillAsk // re-backfill requests waiting for the sink to be past replaying (step)
	chunkDone      bool            // a chunk completed since the last checkpoint
}

// run processes inputs until ctx ends (then until a transaction boundary, and a last checkpoint)
// or, with StopWhenCaughtUp, until the fence after the backfills has been seen.
func (m *mergeLoop) run(ctx, gctx context.Context) error {
	e := m.e
	ticker := time.NewTicker(e.cfg.CheckpointInterval)
	defer ticker.Stop()
	// stop is nil once ctx has ended (and for a context that never ends): stopping says which.
	stop, stopping := ctx.Done(), false
	var drainUntil <-chan time.Time
	m.lastCheckpoint = time.Now()
	for {
		select {
		case v := <-m.in:
			if err := m.step(v); err != nil {
				return err
			}
			// Take what else is queued, up to a batch, before handing output to the sink.
			for n := 0; n < 256 && len(m.core.out) < 4096; n++ {
				if m.core.consistent() && (len(m.core.verdicts) > 0 || m.checkpointDue()) {
					break
				}
				var v any
				select {
				case v = <-m.in:
				default:
				}
				if v == nil {
					break
				}
				if err := m.step(v); err != nil {
					return err
				}
			}
		case <-ticker.C:
		case <-stop:
			stop, stopping = nil, true
			e.log.Info().Msg("stopping at the next transaction boundary")
			drainUntil = time.After(5 * time.Second)
		case <-drainUntil:
			e.log.Warn().Msg("stopping inside a transaction: the last checkpoint stands")
			return m.flush(gctx)
		case <-gctx.Done():
			return context.Cause(gctx)
		}
		if err := m.flush(gctx); err != nil {
			return err
		}
		if err := m.release(); err != nil {
			return err
		}
		if !m.core.consistent() {
			continue
		}
		m.wakeWorker()
		// A bounded run ends at a fence with no work pending anywhere, once every reader has
		// written one (each after its first look at its tables, so none is left unwatched).
		m.noteFences()
		finished := stopping || e.cfg.StopWhenCaughtUp && len(m.core.fences) > 0 && m.fencedReaders == len(m.verdicts) && !m.core.pendingWork()
		if finished || m.checkpointDue() {
			if err := m.checkpoint(gctx); err != nil {
				return err
			}
		}
		if finished {
			if !stopping {
				e.log.Info().Msg("backfills done and stream caught up")
			}
			return nil
		}
	}
}

// step feeds the core one input. A re-backfill request (the worker's, after a rewrite; or one
// asked of the engine) waits while the sink writes again what its output holds past its
// checkpoint (Replayer): started over meanwhile, the table's events would no longer be the ones
// the output holds.
func (m *mergeLoop) step(v any) error {
	if ask, ok := v.(rebackfillAsk); ok {
		if r, ok := m.e.sink.(Replayer); ok && r.Replaying() {
			m.held = append(m.held, ask)
			return nil
		}
	}
	return m.core.step(v)
}

// release feeds the core the re-backfill requests step held, once the sink is past replaying.
func (m *mergeLoop) release() error {
	if len(m.held) == 0 {
		return nil
	}
	if r, ok := m.e.sink.(Replayer); ok && r.Replaying() {
		return nil
	}
	held := m.held
	m.held = nil
	for _, ask := range held {
		if err := m.core.step(ask); err != nil {
			return err
		}
	}
	return nil
}

// wakeWorker tells an idle worker about rows to read again, whenever any table's pending
// re-reads changed since it last did (not only their count: one table's done and another's
// queued leave it equal). The channel holds the latest set only: a stale one is replaced.
func (m *mergeLoop) wakeWorker() {
	if m.core.rereadGen == m.rereadGen {
		return
	}
	m.rereadGen = m.core.rereadGen
	pending := m.core.workByTable()
	for _, wake := range m.wake {
		select {
		case <-wake:
		default:
		}
		if len(pending) > 0 {
			wake <- wakeup{gen: m.core.rereadGen, tables: pending}
		}
	}
}

// noteFences counts the readers whose fence the stream showed. It takes the core's fencesSeen,
// which new work does not clear (core.fences is): a fence followed by new work for another
// reader's table in the batch taken before this look still counts, and the reader that wrote
// it, with nothing to do, writes no other.
func (m *mergeLoop) noteFences() {
	for _, id := range m.core.fencesSeen {
		if k := m.readerOf(id); !m.fenced[k] {
			m.fenced[k] = true
			m.fencedReaders++
		}
	}
	m.core.fencesSeen = m.core.fencesSeen[:0]
}

// readerOf is the index of the reader whose chunk id is (worker.newID).
func (m *mergeLoop) readerOf(id int64) int {
	return int((id - 1) % int64(len(m.verdicts)))
}

func (m *mergeLoop) checkpointDue() bool {
	return m.chunkDone || len(m.core.asked) > 0 || time.Since(m.lastCheckpoint) >= m.e.cfg.CheckpointInterval && m.core.pos.LSN != m.lastLSN()
}

func (m *mergeLoop) lastLSN() pglogrepl.LSN {
	if m.checkpointed == nil {
		return 0
	}
	return m.checkpointed.LSN
}

// flush hands the core's verdicts to the worker and its events to the sink. Verdicts go first:
// the worker reads its next chunk while the sink takes this one's rows.
func (m *mergeLoop) flush(ctx context.Context) error {
	for _, v := range m.core.verdicts {
		if v.completed {
			m.chunkDone = true
		}
		select {
		case m.verdicts[m.readerOf(v.id)] <- v:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	m.core.verdicts = m.core.verdicts[:0]
	for _, n := range m.core.notices {
		m.e.log.Warn().Msg(n)
	}
	m.core.notices = m.core.notices[:0]
	if n := len(m.core.out); n > 0 {
		if err := m.e.sink.Emit(ctx, m.core.out); err != nil {
			return err
		}
		if m.e.cfg.Faults.ackAhead() {
			m.stream.Ack(m.core.out[n-1].LSN)
		}
		clear(m.core.out)
		m.core.out = m.core.out[:0]
		if h := m.e.cfg.Hooks.AfterEmit; h != nil {
			h(ctx, n)
		}
	}
	return nil
}

// checkpoint gives the sink the current position, at a transaction boundary, and acknowledges
// it to the slot when the sink made it durable.
func (m *mergeLoop) checkpoint(ctx context.Context) error {
	m.core.pos.Invisible = m.core.guard.invisible()
	pos := m.core.pos.Clone()
	if err := m.e.sink.Checkpoint(ctx, pos); err != nil {
		// A commit whose outcome is unknown may have made the checkpoint durable: what the run
		// created is kept then, as the output may resume from it.
		if errors.Is(err, ErrCommitUnknown) {
			m.e.checkpointing.Store(true)
		}
		return fmt.Errorf("%w (writing the output up to %s)", err, pos.LSN)
	}
	m.e.checkpointing.Store(true)
	m.checkpointed, m.lastCheckpoint, m.chunkDone = pos, time.Now(), false
	for _, a := range m.core.asked {
		a.done <- nil // recorded: a restart goes on with it
	}
	m.core.asked = m.core.asked[:0]
	if h := m.e.cfg.Hooks.AfterCheckpoint; h != nil {
		h(ctx, pos)
	}
	if m.e.cfg.AckCheckpoints {
		m.stream.Ack(pos.LSN)
	}
	return nil
}
