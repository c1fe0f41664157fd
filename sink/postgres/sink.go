package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/internal/faults"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/internal/pgtrust"
	"github.com/tidemark/tidemark/internal/sqlfix"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/sink"
)

var _ sink.Output = (*Sink)(nil)

// The sink's memory bound: once the changes pending in the open target transaction pass either
// figure, they are applied in it as one piece and dropped from memory. Pieces are applied in
// order and each holds every pending key's last state, so the transaction's final state is the
// same as if it had been applied whole; the checkpoint still commits with all of them. Whatever
// the size of a source transaction (ten million rows in one UPDATE), the sink holds at most about
// this much; the target keeps the rest in its own open transaction, on its disk.
const (
	defaultPieceRows  = 50_000
	defaultPieceBytes = 32 << 20
)

// pendingRowOverhead approximates what a pending key costs beyond its values: the map entry,
// the pendingRow, its place in the batch's order.
const pendingRowOverhead = 160

// Sink applies events to another PostgreSQL, exactly once: the changes between two checkpoints
// and the checkpoint itself commit in one target transaction, so a crash at any point leaves the
// target at a checkpoint, and the capture resumes from it. Inside that transaction the pending
// changes are applied in pieces of bounded size (defaultPieceRows, defaultPieceBytes).
type Sink struct {
	target *pgx.Conn // the target; used only from the merge loop's goroutine
	source *pgx.Conn // the source, for the definitions of tables and columns to create
	id     string    // the checkpoint row's id
	schema string    // target schema; "" keeps the source's
	cpName string    // quoted checkpoint table
	ledger string    // quoted audit ledger; "" for none
	log    zerolog.Logger
	// lastPos is the checkpoint row's position as this sink last read or wrote it (nil: no row
	// yet). A checkpoint replaces it only while the row still holds it: a writer that lost the
	// target to another (or was frozen while another ran) fails instead of moving the checkpoint
	// back over the other's rows.
	lastPos []byte
	// accounted are the tables (source schema.table) the checkpoint read at Open has progress
	// for: rows their target tables hold are this sync's.
	accounted map[string]bool
	empty     map[string]bool // Options.Empty
	keepRows  bool            // Options.KeepRows
	// apart is the connection of the checkpoint when it is broken on purpose
	// (faults.CheckpointApart); nil otherwise.
	apart *pgx.Conn

	tx        pgx.Tx
	txn       int                     // counts the target transactions begun
	tables    map[string]*targetTable // by source schema.table
	batches   []*tableBatch           // pending, in first-seen order
	lastAudit pglogrepl.LSN
	copyBuf   bytes.Buffer
	applied   int64 // events applied (for the summary)
	// The pending rows are applied, inside the open transaction, once they reach either bound.
	maxPendingRows, maxPendingBytes int
	pendingRows, pendingBytes       int   // held in batches: distinct keys, and their estimated size
	pieces                          int64 // pieces applied before their checkpoint (for the summary)
	// Backfilled rows copied straight into their table, and those upserted after a direct copy
	// met a key the target had.
	directRows, fallbackRows int64
}

// targetTable is a target table as the sink knows it.
type targetTable struct {
	ident  string            // quoted target name
	cols   map[string]bool   // columns the target has
	types  map[string]string // their types (format_type, with modifiers)
	bases  map[string]string // their types without modifiers
	oids   map[string]uint32 // their type OIDs
	key    []string          // key columns
	keyOps []chunker.Ops     // the comparison operators of each key column's type
	// overriding: a key column is GENERATED ALWAYS AS IDENTITY (a target made from pg_dump -s
	// of the source): inserts give the source's values with OVERRIDING SYSTEM VALUE.
	overriding bool
	stage      string // quoted temporary staging table
	// oid is the target table's OID when it was checked (pgtrust.Table) or created; guarded the
	// transaction (Sink.txn) in which it was last locked and found still that table.
	oid     uint32
	guarded int
	batch   *tableBatch
	columns *merge.Columns // the Columns the batch's rows have
	// skipDirect counts the batches that go through the staging table before a direct copy is
	// tried again, after directFails failed in a row on a key the target already had.
	skipDirect, directFails int
	// emptied: a TRUNCATE or a refresh emptied the table, and no row was written to it since;
	// a column type it gets then is given without converting values (reconcile).
	emptied bool
}

// tableBatch is a table's pending changes, one final state per key.
type tableBatch struct {
	t     *targetTable
	order []string
	rows  map[string]*pendingRow
	bytes int // estimated size of rows (see pendingRow.size)
}

type pendingRow struct {
	deleted  bool
	snapshot bool // its state comes from a backfill chunk
	keyVals  []replicator.Value
	vals     []replicator.Value // nil for a delete; Unchanged: leave the column as it is
}

// size estimates the memory a pending row holds: its values (which keep the event's buffer
// alive) and their headers.
func (r *pendingRow) size() int {
	n := 24 * (len(r.keyVals) + len(r.vals))
	for _, v := range r.keyVals {
		n += len(v.Data)
	}
	for _, v := range r.vals {
		n += len(v.Data)
	}
	return n
}

// Options are a Sink's settings.
type Options struct {
	// ID is the capture's checkpoint row (one per capture; the CLI defaults it to the slot name).
	ID string
	// Schema puts the target tables in this schema; "" keeps the source's.
	Schema string
	// Audit records every applied source transaction in the audit ledger (LedgerTable), so that
	// one applied twice fails.
	Audit bool
	Log   zerolog.Logger
	// Empty are the tables (source schema.table) to empty on the target when they hold rows
	// the checkpoint does not account for (--rebackfill on a first run; CheckTables).
	Empty map[string]bool
	// KeepRows accepts such rows (a capture without a backfill: the rows are the user's).
	KeepRows bool
}

// ErrTargetIsSource: the target connection reaches the source's own database.
var ErrTargetIsSource = errors.New("the target is the source database itself")

// isSource reports whether target is a session of source's own database. The same system
// identifier is not enough (a physical copy of the source, a restored backup, is a legitimate
// target): the source takes a mark only a session of that very database sees at once, a
// transaction advisory lock on a random key, and the target looks for it.
func isSource(ctx context.Context, target, source *pgx.Conn) (bool, error) {
	key := rand.Uint64()
	var same bool
	err := pgx.BeginFunc(ctx, source, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::bigint)`, int64(key)); err != nil {
			return err
		}
		return target.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
			AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
			AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid AND l.objsubid = 1)`, int64(key>>32), int64(key&0xffffffff)).Scan(&same)
	})
	if err != nil {
		return false, fmt.Errorf("check that the target is not the source: %w", err)
	}
	return same, nil
}

// Open opens the sink on target (a connection it uses alone, from the engine's merge loop),
// with source for the definitions of the tables and columns to create, and returns the position
// to resume from (nil for a first run). It first refuses a target that is the source itself, then takes the checkpoint's lock, then creates the
// checkpoint table (and the ledger) when missing and reads the checkpoint row.
func Open(ctx context.Context, target, source *pgx.Conn, o Options) (*Sink, *merge.Position, error) {
	id, schema, log := o.ID, o.Schema, o.Log
	s := &Sink{target: target, source: source, id: id, schema: schema, tables: map[string]*targetTable{}, log: log,
		accounted: map[string]bool{}, empty: o.Empty, keepRows: o.KeepRows,
		cpName:         CheckpointTable,
		maxPendingRows: defaultPieceRows, maxPendingBytes: defaultPieceBytes}
	if same, err := isSource(ctx, target, source); err != nil {
		return nil, nil, err
	} else if same {
		return nil, nil, fmt.Errorf("%w (database %q of the same server): the sync would capture its own writes and apply them again, for ever; give a target in another database or server",
			ErrTargetIsSource, target.Config().Database)
	}
	// One writer per checkpoint, before anything is read or written: a session lock, held until
	// this connection ends (a crash releases it).
	if !faults.NoFence {
		if err := s.lock(ctx, "checkpoint "+id, fmt.Sprintf("checkpoint %q", id)); err != nil {
			return nil, nil, err
		}
	}
	if faults.CheckpointApart {
		c, err := pgconf.Dial(ctx, target.Config().Copy())
		if err != nil {
			return nil, nil, fmt.Errorf("target: %w", err)
		}
		s.apart = c
	}
	// The checkpoint table and the ledger are created "if not exists": anyone who could create
	// them first is refused (pgtrust.Own) before either is read or written.
	if _, err := target.Exec(ctx, CheckpointTableSQL(s.cpName)); err != nil {
		return nil, nil, fmt.Errorf("create the target's checkpoint table %s: %w", s.cpName, err)
	}
	if err := pgtrust.Own(ctx, target, "the target's checkpoint table", s.cpName); err != nil {
		return nil, nil, err
	}
	if _, err := target.Exec(ctx, CheckpointColumnsSQL(s.cpName)); err != nil {
		return nil, nil, fmt.Errorf("update the target's checkpoint table %s: %w", s.cpName, err)
	}
	if o.Audit {
		s.ledger = LedgerTable
		if _, err := target.Exec(ctx, LedgerTableSQL(s.ledger)); err != nil {
			return nil, nil, fmt.Errorf("create the target's audit ledger %s: %w", s.ledger, err)
		}
		if err := pgtrust.Own(ctx, target, "the target's audit ledger", s.ledger); err != nil {
			return nil, nil, err
		}
	}
	var raw []byte
	var recordedSchema string
	err := target.QueryRow(ctx, ReadCheckpointSQL(s.cpName), id).Scan(&raw, &recordedSchema)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read the target's checkpoint: %w", err)
	}
	if recordedSchema != schema {
		// The checkpoint says which tables are done where it was written: read into another
		// schema, they would be skipped there.
		return nil, nil, fmt.Errorf("the target's checkpoint %q was written for --target-schema %q, not %q: its tables are done in that schema only; run with --target-schema %q, or give this capture another --checkpoint-id (and a slot of its own) to start over in %q",
			id, recordedSchema, schema, recordedSchema, schema)
	}
	var pos merge.Position
	if err := json.Unmarshal(raw, &pos); err != nil {
		return nil, nil, fmt.Errorf("the target's checkpoint %q is damaged (%w); delete its row from %s to start over", id, err, s.cpName)
	}
	s.lastPos = raw
	for name := range pos.Tables {
		s.accounted[name] = true
	}
	return s, &pos, nil
}

// lock takes the target's session advisory lock named key for this connection, or says who
// holds it. what names it in the message.
func (s *Sink) lock(ctx context.Context, key, what string) error {
	var got bool
	var holder *int32
	err := replicator.UntilFree(ctx, replicator.DefaultInUseWait, func() (bool, error) {
		holder = nil
		err := s.target.QueryRow(ctx, LockSQL, key).Scan(&got, &holder)
		return got, err
	})
	if err != nil {
		return fmt.Errorf("lock %s on the target: %w", what, err)
	}
	if !got {
		pid := "another session"
		if holder != nil {
			pid = fmt.Sprintf("server process %d", *holder)
		}
		return fmt.Errorf("another tidemark sync is writing %s on the target (%s holds its lock): two writers would overwrite each other's rows and checkpoints; stop the other one first", what, pid)
	}
	return nil
}

// begin opens the target transaction. Its commit must be durable before the slot is confirmed
// to the checkpoint it carries, whatever the target's synchronous_commit says.
func (s *Sink) begin(ctx context.Context) error {
	if s.tx != nil {
		return nil
	}
	tx, err := s.target.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin target transaction: %w", err)
	}
	if _, err := tx.Exec(ctx, SynchronousCommitSQL); err != nil {
		_ = tx.Rollback(ctx)
		return fmt.Errorf("begin target transaction: %w", err)
	}
	// The checkpoint table (and the ledger) are still as Open checked them, and stay so until
	// the commit (pgtrust.Guard): one dropped and made again since, or given a trigger, by
	// another role never runs that role's code with this one's rights.
	for _, own := range []struct{ what, name string }{{"the target's checkpoint table", s.cpName}, {"the target's audit ledger", s.ledger}} {
		if own.name == "" {
			continue
		}
		b := &pgx.Batch{}
		b.Queue(pgtrust.LockSQL(own.name))
		b.Queue(pgtrust.Guard(own.what, own.name))
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			_ = tx.Rollback(ctx)
			if terr := pgtrust.Own(context.WithoutCancel(ctx), s.target, own.what, own.name); terr != nil {
				return terr
			}
			return fmt.Errorf("begin target transaction: %w", err)
		}
	}
	s.tx = tx
	s.txn++
	return nil
}

// ErrUnaccountedRows: an existing target table holds rows this sync's checkpoint does not
// account for.
var ErrUnaccountedRows = errors.New("the target table holds rows this sync did not write")

// CheckTables checks, before the capture starts (and creates anything on the source), the
// target table of each captured table (source schema.table) that the checkpoint has no progress
// for: one that holds rows this sync did not write is refused, unless KeepRows; one the run was
// asked to re-backfill (Empty) is emptied, once it has passed the checks of a table the sink
// writes, unless another capture's checkpoint on this target covers it (its rows are that
// capture's). A table checked here that the run never meets (an empty source table) is so
// checked too.
func (s *Sink) CheckTables(ctx context.Context, tables []string) error {
	var errs []error
	for _, name := range tables {
		if s.accounted[name] || s.keepRows {
			continue
		}
		schema, table, _ := strings.Cut(name, ".")
		if s.schema != "" {
			schema = s.schema
		}
		ident := pgx.Identifier{schema, table}.Sanitize()
		var found, rows bool
		if err := s.target.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, ident).Scan(&found); err != nil {
			return fmt.Errorf("look up target table %s: %w", ident, err)
		}
		if !found {
			continue
		}
		if err := s.target.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+ident+")").Scan(&rows); err != nil {
			return fmt.Errorf("read target table %s: %w", ident, err)
		}
		if !rows {
			continue
		}
		var others []string
		if err := s.target.QueryRow(ctx, `SELECT array(SELECT id FROM `+s.cpName+` WHERE id <> $1 AND position->'tables' ? $2
			AND target_schema = $3 ORDER BY 1)`, s.id, name, s.schema).Scan(&others); err != nil {
			return fmt.Errorf("read the target's checkpoints: %w", err)
		}
		switch {
		case len(others) > 0:
			errs = append(errs, fmt.Errorf("%w: target table %s holds the rows of another tidemark sync (checkpoint %s): this one would write over them; give this capture a table of its own (another --target-schema)",
				ErrUnaccountedRows, ident, strings.Join(others, ", ")))
		case s.empty[name]:
			if err := pgx.BeginFunc(ctx, s.target, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, pgtrust.LockSQL(ident)); err != nil {
					return err
				}
				if err := pgtrust.Table(ctx, tx, "target table", ident); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, TruncateSQL(ident))
				return err
			}); err != nil {
				return fmt.Errorf("empty target table %s, as --rebackfill asked: %w", ident, err)
			}
			s.log.Info().Str("table", ident).Msg("target table emptied, as --rebackfill asked: its rows were not this sync's")
		default:
			errs = append(errs, fmt.Errorf("%w: target table %s already holds rows, and this sync's checkpoint accounts for none of them: rows the source does not have would stay there, and the sync would still say the target caught up; sync into an empty table (another --target-schema, or empty this one), or have Tidemark empty it first with --rebackfill %s",
				ErrUnaccountedRows, ident, name))
		}
	}
	return errors.Join(errs...)
}

// guard locks target table t for the open transaction, as its writes would, and checks that it
// is still the table the sink checked or created (pgtrust.GuardTable): between two
// transactions, the owner of its schema may have dropped it and made another of the same name,
// with code of theirs. Once per transaction and table, before its first write.
func (s *Sink) guard(ctx context.Context, t *targetTable) error {
	if t.guarded == s.txn {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(pgtrust.LockSQL(t.ident))
	b.Queue(pgtrust.GuardTable("target table", t.ident, t.oid))
	if err := s.tx.SendBatch(ctx, b).Close(); err != nil {
		_ = s.tx.Rollback(ctx)
		s.tx = nil
		if terr := pgtrust.Table(context.WithoutCancel(ctx), s.target, "target table", t.ident); terr != nil {
			return terr
		}
		return fmt.Errorf("%w: target table %s is not the table this sync checked when it started (%v): it was dropped and made again, or changed owner, while the sync ran; find out who did it, then run the sync again to check the table anew",
			pgtrust.ErrUntrusted, t.ident, err)
	}
	t.guarded = s.txn
	return nil
}

// Emit adds the events to the open target transaction's pending changes.
func (s *Sink) Emit(ctx context.Context, evs []merge.Event) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	for i := range evs {
		ev := &evs[i]
		t, err := s.table(ctx, ev.Columns, ev.Op == merge.Truncate || ev.Op == merge.Refresh)
		if err != nil {
			return err
		}
		if ev.Op == merge.Truncate || ev.Op == merge.Refresh {
			if err := s.flush(ctx); err != nil {
				return err
			}
			if _, err := s.tx.Exec(ctx, TruncateSQL(t.ident)); err != nil {
				return fmt.Errorf("truncate %s: %w", t.ident, err)
			}
			t.emptied = true
			continue
		}
		if t.columns != ev.Columns {
			// Another definition of the table: apply what was pending under the old one.
			if err := s.flushTable(ctx, t); err != nil {
				return err
			}
			if err := s.reconcile(ctx, t, t.columns, ev.Columns); err != nil {
				return err
			}
			t.columns = ev.Columns
		}
		s.pend(t, ev)
		if s.ledger != "" && ev.Op != merge.Snapshot && ev.LSN != s.lastAudit {
			if _, err := s.tx.Exec(ctx, LedgerInsertSQL(s.ledger), ev.LSN.String(), int64(ev.XID)); err != nil {
				return fmt.Errorf("record transaction %d (commit %s) in the audit ledger: %w", ev.XID, ev.LSN, err)
			}
			s.lastAudit = ev.LSN
		}
		if s.pendingRows >= s.maxPendingRows || s.pendingBytes >= s.maxPendingBytes {
			// A large source transaction (or many before a checkpoint): apply what is pending
			// now, in the open transaction, rather than hold all of it until the checkpoint.
			if err := s.flush(ctx); err != nil {
				return err
			}
			s.pieces++
		}
	}
	s.applied += int64(len(evs))
	return nil
}

// pend folds an event into its key's pending state.
func (s *Sink) pend(t *targetTable, ev *merge.Event) {
	t.emptied = false
	b := t.batch
	if b == nil {
		b = &tableBatch{t: t, rows: map[string]*pendingRow{}}
		t.batch = b
		s.batches = append(s.batches, b)
	}
	key := string(ev.Key)
	r := b.rows[key]
	if r == nil {
		r = &pendingRow{}
		b.rows[key] = r
		b.order = append(b.order, key)
		s.pendingRows++
		b.bytes += len(key) + pendingRowOverhead
		s.pendingBytes += len(key) + pendingRowOverhead
	} else {
		b.bytes -= r.size()
		s.pendingBytes -= r.size()
	}
	r.keyVals = r.keyVals[:0]
	for _, k := range ev.Columns.Key {
		r.keyVals = append(r.keyVals, ev.Col(k))
	}
	r.snapshot = ev.Op == merge.Snapshot
	switch ev.Op {
	case merge.Delete:
		r.deleted, r.vals = true, nil
	case merge.Insert, merge.Snapshot:
		r.deleted, r.vals = false, colsOf(ev)
	case merge.Update:
		vals := colsOf(ev)
		if r.vals != nil && !r.deleted {
			for i, v := range vals {
				if v.Kind == replicator.Unchanged {
					vals[i] = r.vals[i] // the value it had in this batch
				}
			}
		}
		r.deleted, r.vals = false, vals
	}
	b.bytes += r.size()
	s.pendingBytes += r.size()
}

func colsOf(ev *merge.Event) []replicator.Value {
	vals := make([]replicator.Value, ev.NumCols())
	for i := range vals {
		vals[i] = ev.Col(i)
	}
	return vals
}

// Checkpoint applies the pending changes and the position in the open transaction, and
// commits them together.
func (s *Sink) Checkpoint(ctx context.Context, pos *merge.Position) error {
	if s.apart != nil {
		return s.checkpointApart(ctx, pos)
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	if err := s.flush(ctx); err != nil {
		return err
	}
	b, err := json.Marshal(pos)
	if err != nil {
		return err
	}
	// The row moves only from the position this sink knows: had another writer moved it, this
	// one's changes of the transaction are rolled back, not committed over the other's.
	var tag pgconn.CommandTag
	switch {
	case faults.NoFence:
		// Broken on purpose: whatever the row holds.
		tag, err = s.tx.Exec(ctx, ForceCheckpointSQL(s.cpName), s.id, b, s.schema)
	case s.lastPos == nil:
		tag, err = s.tx.Exec(ctx, InsertCheckpointSQL(s.cpName), s.id, b, s.schema)
	default:
		tag, err = s.tx.Exec(ctx, MoveCheckpointSQL(s.cpName), s.id, b, s.lastPos)
	}
	if err != nil {
		return fmt.Errorf("write the target's checkpoint: %w", err)
	}
	if tag.RowsAffected() != 1 {
		_ = s.tx.Rollback(ctx)
		s.tx = nil
		return fmt.Errorf("the target's checkpoint %q changed under this sync (another tidemark sync wrote it): this one's changes since its last checkpoint are rolled back; run one sync per checkpoint", s.id)
	}
	return s.commit(ctx, b)
}

// apartGap is how long checkpointApart waits between the checkpoint's commit and its changes'.
const apartGap = 300 * time.Millisecond

// checkpointApart is Checkpoint broken on purpose (faults.CheckpointApart): the position is
// committed on a connection of its own first, then the changes it covers are applied and
// committed; a crash in between loses them, and the checkpoint says they were written.
func (s *Sink) checkpointApart(ctx context.Context, pos *merge.Position) error {
	b, err := json.Marshal(pos)
	if err != nil {
		return err
	}
	if _, err := s.apart.Exec(ctx, ForceCheckpointSQL(s.cpName), s.id, b, s.schema); err != nil {
		return fmt.Errorf("write the target's checkpoint: %w", err)
	}
	// The checkpoint is committed already: whatever fails now, it stands. The gap is widened to
	// what a slow target's round trips make of it, so that the chaos harness's kills meet it
	// (on a loaded machine three seeds' 34 kills all missed the bare gap).
	time.Sleep(apartGap)
	if err := s.begin(ctx); err != nil {
		return fmt.Errorf("%w: %w", merge.ErrCommitUnknown, err)
	}
	if err := s.flush(ctx); err != nil {
		return fmt.Errorf("%w: %w", merge.ErrCommitUnknown, err)
	}
	if err := s.commit(ctx, b); err != nil {
		return fmt.Errorf("%w: %w", merge.ErrCommitUnknown, err)
	}
	return nil
}

// commit commits the open target transaction, which carries the checkpoint at pos.
func (s *Sink) commit(ctx context.Context, pos []byte) error {
	err := s.tx.Commit(ctx)
	s.tx = nil
	if err != nil {
		if pgerr.Code(err) == "" {
			// No answer to COMMIT (a connection lost): it may have committed.
			return fmt.Errorf("commit target transaction: %w: %w", merge.ErrCommitUnknown, err)
		}
		return fmt.Errorf("commit target transaction: %w", err)
	}
	s.lastPos = pos
	return nil
}

// Close rolls back what was not checkpointed. It leaves the target connection open: its owner
// closes it, which releases the locks.
func (s *Sink) Close(ctx context.Context) error {
	s.log.Debug().Int64("direct_rows", s.directRows).Int64("fallback_rows", s.fallbackRows).Int64("pieces", s.pieces).Msg("backfilled rows written to the target")
	if s.tx != nil {
		_ = s.tx.Rollback(ctx)
		s.tx = nil
	}
	if s.apart != nil {
		_ = s.apart.Close(ctx)
		s.apart = nil
	}
	return nil
}

func (s *Sink) flush(ctx context.Context) error {
	for _, b := range s.batches {
		if err := s.apply(ctx, b); err != nil {
			return err
		}
		b.t.batch = nil
	}
	clear(s.batches)
	s.batches = s.batches[:0]
	s.pendingRows, s.pendingBytes = 0, 0
	return nil
}

func (s *Sink) flushTable(ctx context.Context, t *targetTable) error {
	if t.batch == nil {
		return nil
	}
	if err := s.apply(ctx, t.batch); err != nil {
		return err
	}
	s.pendingRows -= len(t.batch.rows)
	s.pendingBytes -= t.batch.bytes
	s.batches = slices.DeleteFunc(s.batches, func(b *tableBatch) bool { return b == t.batch })
	t.batch = nil
	return nil
}

// apply writes a batch: the deleted keys, then the rows, grouped by the columns they set, each
// group copied into the staging table and upserted from it. A group of backfilled rows is first
// copied straight into the table (see direct).
func (s *Sink) apply(ctx context.Context, b *tableBatch) error {
	err := s.applyBatch(ctx, b)
	if pgerr.Is(err, pgerrcode.InvalidTextRepresentation) {
		// The target's type refused a value: an enum or a composite type the source has changed
		// since.
		if hint := s.typeChanged(ctx, b.t.columns); hint != nil {
			return fmt.Errorf("%w (%w)", hint, err)
		}
	}
	return err
}

// typeChanged says, after a value was refused, whether a type of cols (through arrays, domains
// and composite types' attributes) has changed on the source since the target's was made: an
// enum given labels, a composite type given attributes; with the statements that make the
// target's the same. The failed transaction is rolled back first (the run stops).
func (s *Sink) typeChanged(ctx context.Context, cols *merge.Columns) error {
	if s.tx != nil {
		_ = s.tx.Rollback(ctx)
		s.tx = nil
	}
	seen := map[uint32]bool{}
	for _, typ := range cols.Types {
		if err := s.typeChangedOf(ctx, typ, seen, 0); err != nil {
			return err
		}
	}
	return nil
}

func (s *Sink) typeChangedOf(ctx context.Context, oid uint32, seen map[uint32]bool, depth int) error {
	if depth > 16 || seen[oid] {
		return nil
	}
	seen[oid] = true
	var schema, name string
	var kind byte
	var elem, base uint32
	err := s.source.QueryRow(ctx, `SELECT n.nspname::text, t.typname::text, t.typtype,
			CASE WHEN t.typcategory = 'A' THEN t.typelem ELSE 0 END, t.typbasetype
		FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = $1`, oid).Scan(&schema, &name, &kind, &elem, &base)
	if err != nil {
		return nil // no hint
	}
	ident := pgx.Identifier{schema, name}.Sanitize()
	switch {
	case elem != 0:
		return s.typeChangedOf(ctx, elem, seen, depth+1)
	case kind == 'd':
		return s.typeChangedOf(ctx, base, seen, depth+1)
	case kind == 'e':
		var labels, have []string
		if s.source.QueryRow(ctx, EnumLabelsByOIDSQL, oid).Scan(&schema, &name, &labels) != nil ||
			s.target.QueryRow(ctx, EnumLabelsByNameSQL, schema, name).Scan(&have) != nil {
			return nil
		}
		if adds, ok := enumAdds(ident, have, labels); ok && len(adds) > 0 {
			return fmt.Errorf("%w: enum %s was given labels on the source since the target's was made: it has (%s) on the target and (%s) on the source; add them on the target: %s then run the sync again",
				ErrEnumDiffers, ident, strings.Join(have, ", "), strings.Join(labels, ", "), strings.Join(adds, " "))
		}
		if renames := enumRenames(ident, have, labels); len(renames) > 0 {
			return fmt.Errorf("%w: enum %s had labels renamed on the source (ALTER TYPE ... RENAME VALUE) since the target's was made: it has (%s) on the target and (%s) on the source; rename them on the target too (which renames every stored value, as on the source): %s then run the sync again",
				ErrEnumDiffers, ident, strings.Join(have, ", "), strings.Join(labels, ", "), strings.Join(renames, " "))
		}
	case kind == 'c':
		var attrs, have []string
		var types []uint32
		if s.source.QueryRow(ctx, CompositeAttributesSQL, schema, name).Scan(&attrs, &types) != nil ||
			s.target.QueryRow(ctx, CompositeAttributesSQL, schema, name).Scan(&have, new([]uint32)) != nil {
			return nil
		}
		if !slices.Equal(attrs, have) {
			fix := "make the target's the source's"
			if len(have) < len(attrs) && slices.Equal(attrs[:len(have)], have) {
				var adds []string
				for _, a := range attrs[len(have):] {
					adds = append(adds, "ALTER TYPE "+ident+" ADD ATTRIBUTE "+a+";")
				}
				fix = "add them on the target: " + strings.Join(adds, " ")
			}
			return fmt.Errorf("%w: composite type %s changed on the source since the target's was made: it is (%s) on the target and (%s) on the source; %s then run the sync again",
				ErrTypeDiffers, ident, strings.Join(have, ", "), strings.Join(attrs, ", "), fix)
		}
		for _, t := range types {
			if err := s.typeChangedOf(ctx, t, seen, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// enumAdds returns the statements that make enum ident, with labels have on the target, the
// source's labels, when the source's only adds labels (ok); each new label goes after the one
// before it on the source, or, first, before the target's first.
func enumAdds(ident string, have, labels []string) (adds []string, ok bool) {
	j := 0
	for i, l := range labels {
		if j < len(have) && have[j] == l {
			j++
			continue
		}
		where := ""
		switch {
		case i > 0:
			where = " AFTER " + sqlfix.Literal(labels[i-1])
		case len(have) > 0:
			where = " BEFORE " + sqlfix.Literal(have[0])
		}
		adds = append(adds, "ALTER TYPE "+ident+" ADD VALUE "+sqlfix.Literal(l)+where+";")
	}
	return adds, j == len(have)
}

// enumRenames returns the statements that rename enum ident's labels have on the target to the
// source's labels, when both have as many (PostgreSQL removes no label, so a label the source
// lacks in the same place was renamed).
func enumRenames(ident string, have, labels []string) []string {
	if len(have) != len(labels) {
		return nil
	}
	var out []string
	for i := range have {
		if have[i] != labels[i] {
			out = append(out, "ALTER TYPE "+ident+" RENAME VALUE "+sqlfix.Literal(have[i])+" TO "+sqlfix.Literal(labels[i])+";")
		}
	}
	return out
}

func (s *Sink) applyBatch(ctx context.Context, b *tableBatch) error {
	t, cols := b.t, b.t.columns
	if err := s.guard(ctx, t); err != nil {
		return err
	}
	// A group: rows from a chunk or not, and which columns they set ('v') or leave ('u').
	type group struct {
		snapshot bool
		sig      string
	}
	var deletes [][]replicator.Value
	groups := map[group][]*pendingRow{}
	var groupOrder []group
	for _, k := range b.order {
		r := b.rows[k]
		if r.deleted {
			deletes = append(deletes, r.keyVals)
			continue
		}
		sig := make([]byte, len(r.vals))
		for i, v := range r.vals {
			sig[i] = 'v'
			if v.Kind == replicator.Unchanged {
				sig[i] = 'u'
			}
		}
		g := group{r.snapshot, string(sig)}
		if _, ok := groups[g]; !ok {
			groupOrder = append(groupOrder, g)
		}
		groups[g] = append(groups[g], r)
	}
	keyNames := make([]string, len(cols.Key))
	for i, k := range cols.Key {
		keyNames[i] = cols.Names[k]
	}
	if len(deletes) > 0 {
		if err := s.copyRows(ctx, t, t.stage, keyNames, deletes); err != nil {
			return err
		}
		if _, err := s.tx.Exec(ctx, DeleteSQL(t.ident, t.stage, keyNames, t.keyOps)); err != nil {
			return fmt.Errorf("delete %d rows from %s: %w", len(deletes), t.ident, err)
		}
		if _, err := s.tx.Exec(ctx, TruncateSQL(t.stage)); err != nil {
			return err
		}
	}
	for _, g := range groupOrder {
		rows := groups[g]
		var names []string
		var idx []int
		for i, c := range g.sig {
			if c == 'v' {
				names = append(names, cols.Names[i])
				idx = append(idx, i)
			}
		}
		vals := make([][]replicator.Value, len(rows))
		for j, r := range rows {
			row := make([]replicator.Value, len(idx))
			for n, i := range idx {
				row[n] = r.vals[i]
			}
			vals[j] = row
		}
		if g.snapshot { // a chunk's rows are whole
			done, err := s.direct(ctx, t, names, vals)
			if err != nil {
				return err
			}
			if done {
				continue
			}
		}
		if err := s.copyRows(ctx, t, t.stage, names, vals); err != nil {
			return err
		}
		if _, err := s.tx.Exec(ctx, UpsertSQL(t.ident, t.stage, names, keyNames, t.overriding)); err != nil {
			return fmt.Errorf("upsert %d rows into %s: %w", len(rows), t.ident, err)
		}
		if _, err := s.tx.Exec(ctx, TruncateSQL(t.stage)); err != nil {
			return err
		}
	}
	return nil
}

// direct copies whole backfilled rows straight into the table, which costs the target about
// 60% of staging and upserting them: a chunk's keys are usually not on the target yet. When one
// is (the stream applied a change to it before the chunk was read, or the table was not empty),
// the table's unique key fails the copy, which is undone to a savepoint, and the caller upserts
// the rows instead; after n failures in a row, the next 2^(n-1) batches of the table (at most 64)
// skip the attempt. It reports whether the rows were written.
func (s *Sink) direct(ctx context.Context, t *targetTable, names []string, rows [][]replicator.Value) (bool, error) {
	if t.skipDirect > 0 {
		t.skipDirect--
		return false, nil
	}
	if _, err := s.tx.Exec(ctx, SavepointSQL); err != nil {
		return false, err
	}
	err := s.copyRows(ctx, t, t.ident, names, rows)
	if err == nil {
		if _, err := s.tx.Exec(ctx, ReleaseSavepointSQL); err != nil {
			return false, err
		}
		s.directRows += int64(len(rows))
		t.directFails = 0
		return true, nil
	}
	if !pgerr.UniqueViolation(err) {
		return false, err
	}
	if _, rerr := s.tx.Exec(ctx, RollbackSavepointSQL); rerr != nil {
		return false, rerr
	}
	t.directFails++
	t.skipDirect = 1 << min(t.directFails-1, 6)
	s.fallbackRows += int64(len(rows))
	s.log.Debug().Str("table", t.ident).Int("rows", len(rows)).Msg("a backfilled key is already on the target: the batch is upserted")
	return false, nil
}

// copyRows copies rows of text values into dst (the table's staging table, or the table), in
// COPY's text format: PostgreSQL's text output of each value is valid input for its type. The
// text is produced as COPY reads it, a row at a time: a piece's text built whole would hold as
// much again as its rows (doubled by the buffer's growth).
func (s *Sink) copyRows(ctx context.Context, t *targetTable, dst string, names []string, rows [][]replicator.Value) error {
	s.copyBuf.Reset()
	_, err := s.tx.Conn().PgConn().CopyFrom(ctx, &copyText{rows: rows, buf: &s.copyBuf}, CopySQL(dst, names))
	if err != nil {
		return fmt.Errorf("copy %d rows for %s: %w", len(rows), t.ident, err)
	}
	return nil
}

// copyText reads rows as COPY text, encoding the next row into buf when buf is empty. CopyFrom
// reads it from a goroutine of its own, and returns only once that goroutine has stopped. Each
// Read fills p with as many rows as fit (pgx sends what one Read returns as one CopyData message,
// in one write: a row per Read was a message and a system call per row); buf holds at most one
// row's text at a time, so a piece's text is never built whole.
type copyText struct {
	rows [][]replicator.Value
	buf  *bytes.Buffer
}

func (c *copyText) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if c.buf.Len() == 0 {
			if len(c.rows) == 0 {
				break
			}
			c.buf.Reset()
			appendCopyRow(c.buf, c.rows[0])
			c.rows = c.rows[1:]
		}
		m, _ := c.buf.Read(p[n:])
		n += m
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// copyEscapes gives, for each byte COPY's text format escapes in a value, the letter after the
// backslash (0: the byte goes as it is).
var copyEscapes = [256]byte{'\\': '\\', '\n': 'n', '\r': 'r', '\t': 't'}

// appendCopyRow appends one row in COPY's text format: the runs of bytes between the ones to
// escape are copied whole.
func appendCopyRow(buf *bytes.Buffer, row []replicator.Value) {
	for i, v := range row {
		if i > 0 {
			buf.WriteByte('\t')
		}
		if v.Kind != replicator.Text {
			buf.WriteString(`\N`)
			continue
		}
		d := v.Data
		for len(d) > 0 {
			j := 0
			for j < len(d) && copyEscapes[d[j]] == 0 {
				j++
			}
			buf.Write(d[:j])
			if j == len(d) {
				break
			}
			buf.WriteByte('\\')
			buf.WriteByte(copyEscapes[d[j]])
			d = d[j+1:]
		}
	}
	buf.WriteByte('\n')
}

// table returns the target table of a source table, creating it (with the source's column types
// and key) when it does not exist, and its staging table. An existing table met first for an
// event that empties it (emptying) is fitted to the source's columns at the next row, once
// emptied (reconcile: a re-backfill after the source's values were rewritten brings columns
// the target's rows could not be converted to).
func (s *Sink) table(ctx context.Context, c *merge.Columns, emptying bool) (*targetTable, error) {
	name := c.Schema + "." + c.Table
	if t := s.tables[name]; t != nil {
		if err := s.guard(ctx, t); err != nil {
			return nil, err
		}
		return t, nil
	}
	schema := c.Schema
	if s.schema != "" {
		schema = s.schema
	}
	t := &targetTable{ident: pgx.Identifier{schema, c.Table}.Sanitize(), cols: map[string]bool{}, types: map[string]string{}, bases: map[string]string{}, oids: map[string]uint32{}}
	// One capture per target table, whatever its checkpoint: two would overwrite each other.
	if !faults.NoFence {
		if err := s.lock(ctx, "table "+t.ident, "table "+t.ident); err != nil {
			return nil, err
		}
	}
	for _, k := range c.Key {
		t.key = append(t.key, c.Names[k])
	}
	// An existing table is locked before it is read and checked: so checked, it stays as checked
	// until the commit.
	var found bool
	if err := s.tx.QueryRow(ctx, `SELECT pg_catalog.to_regclass($1) IS NOT NULL`, t.ident).Scan(&found); err != nil {
		return nil, fmt.Errorf("look up target table %s: %w", t.ident, err)
	}
	if found {
		if _, err := s.tx.Exec(ctx, pgtrust.LockSQL(t.ident)); err != nil {
			return nil, fmt.Errorf("lock target table %s: %w", t.ident, err)
		}
	}
	exists, err := s.readTarget(ctx, t)
	if err != nil {
		return nil, err
	}
	if !exists {
		if err := s.create(ctx, t, schema, c); err != nil {
			return nil, err
		}
	} else {
		if err := pgtrust.Table(ctx, s.tx, "target table", t.ident); err != nil {
			return nil, err
		}
		if err := s.checkKey(ctx, t); err != nil {
			return nil, err
		}
		if err := s.checkConstraints(ctx, t); err != nil {
			return nil, err
		}
		if !emptying {
			if err := s.reconcile(ctx, t, nil, c); err != nil {
				return nil, err
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(t.oids)) {
		if err := pgtrust.Domain(ctx, s.tx, fmt.Sprintf("column %s of target table %s", Quote(n), t.ident), t.oids[n]); err != nil {
			return nil, err
		}
	}
	for _, k := range t.key {
		ops, err := chunker.ReadOps(ctx, s.tx, t.oids[k])
		if err != nil {
			return nil, fmt.Errorf("target table %s, key column %s: %w", t.ident, k, err)
		}
		t.keyOps = append(t.keyOps, ops)
	}
	if err := s.tx.QueryRow(ctx, `SELECT pg_catalog.to_regclass($1)::pg_catalog.oid`, t.ident).Scan(&t.oid); err != nil {
		return nil, fmt.Errorf("look up target table %s: %w", t.ident, err)
	}
	t.guarded = s.txn
	t.columns = c
	if exists && emptying {
		t.columns = nil // not fitted yet
	}
	t.stage = StageTable(len(s.tables))
	if _, err := s.tx.Exec(ctx, CreateStageSQL(t.stage, t.ident)); err != nil {
		return nil, fmt.Errorf("create staging table for %s: %w", t.ident, err)
	}
	s.tables[name] = t
	return t, nil
}

// checkKey requires an existing target table to have a unique index on exactly the key's
// columns (no expression, no predicate): the upsert's ON CONFLICT needs it, and a direct copy
// relies on it to refuse a key the table already has.
func (s *Sink) checkKey(ctx context.Context, t *targetTable) error {
	key := slices.Sorted(slices.Values(t.key))
	var ok bool
	err := s.tx.QueryRow(ctx, KeyIndexSQL, t.ident, key).Scan(&ok)
	if err != nil {
		return fmt.Errorf("read the indexes of target table %s: %w", t.ident, err)
	}
	if !ok {
		return fmt.Errorf("target table %s has no unique index on its key (%s), so changes cannot be applied to it exactly once: "+
			"add one (%s), or sync into a schema of its own with --target-schema",
			t.ident, strings.Join(t.key, ", "), AddPrimaryKeyFix(t.ident, t.key))
	}
	return nil
}

// typeNames returns the SQL names of the columns' types, as the source spells them.
func (s *Sink) typeNames(ctx context.Context, c *merge.Columns) ([]string, error) {
	names := make([]string, len(c.Names))
	for i := range c.Names {
		if err := s.source.QueryRow(ctx, FormatTypeSQL, c.Types[i], c.TypeMods[i]).Scan(&names[i]); err != nil {
			return nil, fmt.Errorf("read the type of column %s of %s.%s on the source: %w", c.Names[i], c.Schema, c.Table, err)
		}
	}
	return names, nil
}

func (s *Sink) create(ctx context.Context, t *targetTable, schema string, c *merge.Columns) error {
	types, err := s.typeNames(ctx, c)
	if err != nil {
		return err
	}
	for i, n := range c.Names {
		t.cols[n], t.types[n] = true, types[i]
	}
	ddl := CreateTableSQL(t.ident, c.Names, types, t.key)
	if _, err := s.tx.Exec(ctx, CreateSchemaSQL(schema)); err != nil {
		return fmt.Errorf("create schema %s on the target: %w", schema, err)
	}
	for i := range c.Names {
		if err := s.ensureType(ctx, c.Types[i], 0); err != nil {
			return fmt.Errorf("column %s of %s.%s: %w", Quote(c.Names[i]), c.Schema, c.Table, err)
		}
	}
	if _, err := s.tx.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create %s on the target (%s): %w; create the table, or the types it uses, on the target first", t.ident, ddl, err)
	}
	s.log.Info().Str("table", t.ident).Msg("target table created")
	_, err = s.readTarget(ctx, t) // the types as the target names them
	return err
}

// ErrRewriteNotFollowed: the source rewrote a table's stored values in a way its target cannot
// follow in place (a column given another type, whose USING is unknown; a column added with a
// volatile default). A run that re-backfills such tables (merge.Config.RebackfillRewrites) does
// so at its start, passing over the changes before it: tidemark sync runs again once.
var ErrRewriteNotFollowed = errors.New("the target cannot follow the source's rewrite of a table in place")

// ErrEnumDiffers: an enum a created table needs exists on the target with other labels.
var ErrEnumDiffers = errors.New("the target's enum differs from the source's")

// ErrTypeDiffers: a domain or composite type a created table needs exists on the target with
// another definition.
var ErrTypeDiffers = errors.New("the target's type differs from the source's")

// ensureType makes sure that the user-defined type of a column of a table to create (typeOID on
// the source, or its element type for an array) exists on the target as on the source: an enum
// (ensureEnum), a domain (its base type, collation and NOT NULL), or a composite type (its
// attributes' names, types and collations), each in the schema and with the name it has on the
// source, the types they are made of first. A domain's CHECK constraints and default are not
// copied: they are expressions, code that any role owning a captured table could have written on
// the source (a function of a superuser's, lo_export or set_config, called with chosen
// arguments), which the target would then run with this role's rights on every value written; the
// values written passed them on the source already. They are logged for a DBA to add. A missing one is created (owned by this role); an existing one is used only when its
// definition is the source's and its owner is this role or a superuser. Ranges, base types and
// an extension's types are left to CREATE TABLE: they must exist on the target already.
func (s *Sink) ensureType(ctx context.Context, typeOID uint32, depth int) error {
	if depth > 16 {
		return fmt.Errorf("type %d: nested more than 16 deep", typeOID)
	}
	if err := s.ensureEnum(ctx, typeOID); err != nil {
		return err
	}
	var oid, base uint32
	var schema, name string
	var kind byte
	err := s.source.QueryRow(ctx, `SELECT t.oid, n.nspname::text, t.typname::text, t.typtype, t.typbasetype
		FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
		WHERE t.oid = (SELECT CASE WHEN a.typcategory = 'A' AND a.typelem <> 0 THEN a.typelem ELSE a.oid END FROM pg_type a WHERE a.oid = $1)
			AND (t.typtype = 'd' OR (t.typtype = 'c' AND (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c'))
			AND n.nspname NOT IN ('pg_catalog', 'information_schema')`, typeOID).Scan(&oid, &schema, &name, &kind, &base)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the type on the source: %w", err)
	}
	// What it is made of, first.
	parts := []uint32{base}
	if kind == 'c' {
		parts = nil
		rows, err := s.source.Query(ctx, `SELECT a.atttypid FROM pg_attribute a JOIN pg_type t ON t.typrelid = a.attrelid
			WHERE t.oid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, oid)
		if err != nil {
			return fmt.Errorf("read the type on the source: %w", err)
		}
		if parts, err = pgx.CollectRows(rows, pgx.RowTo[uint32]); err != nil {
			return fmt.Errorf("read the type on the source: %w", err)
		}
	}
	for _, p := range parts {
		if err := s.ensureType(ctx, p, depth+1); err != nil {
			return err
		}
	}
	defSQL, what, create := DomainDefinitionSQL, "domain", "CREATE DOMAIN %s AS %s"
	if kind == 'c' {
		defSQL, what, create = CompositeDefinitionSQL, "composite type", "CREATE TYPE %s AS (%s)"
	}
	ident := pgx.Identifier{schema, name}.Sanitize()
	var def string
	var owner string
	var trusted bool
	if err := s.source.QueryRow(ctx, defSQL, schema, name).Scan(&def, &owner, &trusted); err != nil {
		return fmt.Errorf("read %s %s on the source: %w", what, ident, err)
	}
	var have string
	read := func() error { return s.tx.QueryRow(ctx, defSQL, schema, name).Scan(&have, &owner, &trusted) }
	err = read()
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := s.tx.Exec(ctx, CreateSchemaSQL(schema)); err != nil {
			return fmt.Errorf("create schema %s on the target: %w", schema, err)
		}
		// Another sync may create it at the same moment: then its type is the one checked.
		if _, err := s.tx.Exec(ctx, "SAVEPOINT tidemark_type"); err != nil {
			return err
		}
		_, err = s.tx.Exec(ctx, fmt.Sprintf(create, ident, def))
		switch {
		case err == nil:
			ev := s.log.Info().Str("type", ident).Str("definition", def)
			if kind == 'd' {
				var checks string
				if err := s.source.QueryRow(ctx, DomainChecksSQL, schema, name).Scan(&checks); err == nil && checks != "" {
					ev = ev.Str("checks_not_copied", checks)
				}
			}
			ev.Msg(what + " created on the target, as on the source (a domain's CHECK constraints and default are not copied: they are code, which the target would run with this role's rights)")
			_, err = s.tx.Exec(ctx, "RELEASE SAVEPOINT tidemark_type")
			return err
		case pgerr.Is(err, pgerrcode.DuplicateObject, pgerrcode.UniqueViolation):
			if _, rerr := s.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT tidemark_type"); rerr != nil {
				return rerr
			}
			err = read()
		default:
			return fmt.Errorf("create %s %s on the target (%s): %w; create it on the target first", what, ident, fmt.Sprintf(create, ident, def), err)
		}
	}
	if err != nil {
		return fmt.Errorf("read %s %s on the target: %w", what, ident, err)
	}
	if !trusted {
		return fmt.Errorf("%w: %s %s on the target is owned by role %s, which is neither this role nor a superuser: its owner could change what it accepts or drop it with the columns that use it; run ALTER TYPE %s OWNER TO CURRENT_USER; (as a superuser or its owner), or create the table first",
			pgtrust.ErrUntrusted, what, ident, sqlfix.Ident(owner), ident)
	}
	if have != def {
		return fmt.Errorf("%w: %s %s is %s on the target and %s on the source; make the target's the source's, or create the table on the target first",
			ErrTypeDiffers, what, ident, have, def)
	}
	return nil
}

// ensureEnum makes sure that the enum a column of a table to create has (typeOID on the source,
// or its element type for an array) exists on the target, in the schema and with the name it has
// on the source, with the same labels in the same order: it creates a missing one (owned by this
// role), uses an equal one, and refuses one with other labels, with the statements that make it
// equal when the source's only adds labels to it. Other types are left to CREATE TABLE (a
// domain, a composite or an extension's type must exist on the target already).
func (s *Sink) ensureEnum(ctx context.Context, typeOID uint32) error {
	var schema, name string
	var labels []string
	err := s.source.QueryRow(ctx, EnumLabelsByOIDSQL, typeOID).Scan(&schema, &name, &labels)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the type on the source: %w", err)
	}
	ident := pgx.Identifier{schema, name}.Sanitize()
	var have []string
	var owner string
	var trusted bool
	read := func() error {
		return s.tx.QueryRow(ctx, `SELECT array(SELECT e.enumlabel::text FROM pg_enum e WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder),
				r.rolname::text, (r.rolname = current_user OR r.rolsuper)
			FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace JOIN pg_roles r ON r.oid = t.typowner
			WHERE n.nspname = $1 AND t.typname = $2 AND t.typtype = 'e'`, schema, name).Scan(&have, &owner, &trusted)
	}
	err = read()
	if errors.Is(err, pgx.ErrNoRows) {
		quoted := make([]string, len(labels))
		for i, l := range labels {
			quoted[i] = sqlfix.Literal(l)
		}
		var found bool
		if err := s.tx.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL`, pgx.Identifier{schema}.Sanitize()).Scan(&found); err != nil {
			return fmt.Errorf("look up schema %s on the target: %w", schema, err)
		}
		if !found {
			if _, err := s.tx.Exec(ctx, CreateSchemaSQL(schema)); err != nil {
				return fmt.Errorf("create schema %s on the target: %w", schema, err)
			}
		}
		// Another sync may create it at the same moment: then its enum is the one checked.
		if _, err := s.tx.Exec(ctx, "SAVEPOINT tidemark_enum"); err != nil {
			return err
		}
		_, err := s.tx.Exec(ctx, "CREATE TYPE "+ident+" AS ENUM ("+strings.Join(quoted, ", ")+")")
		switch {
		case err == nil:
			s.log.Info().Str("type", ident).Int("labels", len(labels)).Msg("enum created on the target, as on the source")
			_, err = s.tx.Exec(ctx, "RELEASE SAVEPOINT tidemark_enum")
			return err
		case pgerr.Is(err, pgerrcode.DuplicateObject, pgerrcode.UniqueViolation):
			if _, rerr := s.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT tidemark_enum"); rerr != nil {
				return rerr
			}
			if err := read(); err != nil {
				return fmt.Errorf("read enum %s on the target: %w", ident, err)
			}
		default:
			return fmt.Errorf("create enum %s on the target: %w", ident, err)
		}
	}
	if err != nil {
		return fmt.Errorf("read enum %s on the target: %w", ident, err)
	}
	if !trusted {
		// Its owner could rename its labels (relabelling the rows written) or drop it with the
		// columns using it.
		return fmt.Errorf("%w: enum %s on the target is owned by role %s, which is neither this role nor a superuser: its owner could rename its labels or drop it with the columns that use it; run ALTER TYPE %s OWNER TO CURRENT_USER; (as a superuser or its owner), or create the table first",
			pgtrust.ErrUntrusted, ident, sqlfix.Ident(owner), ident)
	}
	if slices.Equal(have, labels) {
		return nil
	}
	// The target's labels in the source's order, the source having more: ADD VALUE makes them
	// equal (each in a transaction of its own before PostgreSQL 12 allows it in one).
	if adds, ok := enumAdds(ident, have, labels); ok {
		return fmt.Errorf("%w: enum %s has the labels (%s) on the target, and (%s) on the source; add the missing ones on the target: %s",
			ErrEnumDiffers, ident, strings.Join(have, ", "), strings.Join(labels, ", "), strings.Join(adds, " "))
	}
	return fmt.Errorf("%w: enum %s has the labels (%s) on the target, and (%s) on the source, in another order or with labels the source lacks: values would be compared and sorted otherwise; make the target's enum the source's (or use another schema on the target)",
		ErrEnumDiffers, ident, strings.Join(have, ", "), strings.Join(labels, ", "))
}

// readTarget reads an existing target table's columns and their types; it reports false when
// there is no such table.
func (s *Sink) readTarget(ctx context.Context, t *targetTable) (bool, error) {
	rows, err := s.tx.Query(ctx, TargetColumnsSQL, t.ident)
	if err != nil {
		return false, fmt.Errorf("read target table %s: %w", t.ident, err)
	}
	defer rows.Close()
	n := 0
	var always []string // non-key columns GENERATED ALWAYS AS IDENTITY
	for rows.Next() {
		var name, typ, base, identity string
		var oid uint32
		if err := rows.Scan(&name, &typ, &base, &identity, &oid); err != nil {
			return false, fmt.Errorf("read target table %s: %w", t.ident, err)
		}
		n++
		t.cols[name], t.types[name], t.bases[name], t.oids[name] = true, typ, base, oid
		if identity == "a" {
			if slices.Contains(t.key, name) {
				t.overriding = true
			} else {
				always = append(always, name)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("read target table %s: %w", t.ident, err)
	}
	if len(always) > 0 {
		var fixes []string
		for _, c := range always {
			fixes = append(fixes, GeneratedByDefaultFix(t.ident, c))
		}
		return false, fmt.Errorf("target table %s has columns GENERATED ALWAYS AS IDENTITY that are not its key (%s): an update cannot set them to the source's values; run %s",
			t.ident, strings.Join(always, ", "), strings.Join(fixes, " "))
	}
	return n > 0, nil
}

// checkConstraints refuses a target table with foreign keys, from it or to it: the sink applies
// each table's changes in its own order (deletes, then upserts) and backfills the tables one
// after the other, committing at checkpoints in between, so a valid source state can violate
// them on the target, and the capture would stop at an arbitrary point.
func (s *Sink) checkConstraints(ctx context.Context, t *targetTable) error {
	rows, err := s.tx.Query(ctx, ForeignKeysSQL, t.ident)
	if err != nil {
		return fmt.Errorf("read the constraints of target table %s: %w", t.ident, err)
	}
	type fk struct{ name, table string }
	var fks []fk
	for rows.Next() {
		var f fk
		if err := rows.Scan(&f.name, &f.table); err != nil {
			rows.Close()
			return err
		}
		fks = append(fks, f)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(fks) == 0 {
		return nil
	}
	var drops []string
	for _, f := range fks {
		drops = append(drops, DropConstraintFix(f.table, f.name))
	}
	return fmt.Errorf("target table %s has a foreign key (%s): Tidemark applies each table's changes in its own order and backfills tables one after the other, so a valid source state could violate it on the target; drop it (%s), or sync into a schema of its own with --target-schema",
		t.ident, fks[0].name, strings.Join(drops, " "))
}

// reconcile brings the target table to the source's columns c (before: the columns the rows had
// until now, nil when the table is first met in this run), where that is safe, or stops with
// the statements to run:
//
//   - a column of another type: the same type with other modifiers (numeric(12,2) to
//     numeric(12,4), varchar(10) to varchar(20)) is altered on the target too; another type is
//     not (the source's USING is unknown): the statement is printed;
//   - a column the target lacks: added, with the value the source gives the rows it had (its
//     non-volatile default, which PostgreSQL keeps without rewriting them); one whose existing
//     rows got values no row event carries (a volatile default) stops the sync;
//   - a column the target lacks while another the source no longer has is still there: a rename
//     or a drop and an add cannot be told apart; both statements are printed;
//   - a column the source dropped stays on the target, no longer maintained.
func (s *Sink) reconcile(ctx context.Context, t *targetTable, before, c *merge.Columns) error {
	types, err := s.typeNames(ctx, c)
	if err != nil {
		return err
	}
	in := map[string]bool{}
	var missing []int
	for i, n := range c.Names {
		in[n] = true
		switch {
		case !t.cols[n]:
			missing = append(missing, i)
		case t.types[n] != types[i]:
			if err := s.alterType(ctx, t, c, i, types[i], before == nil); err != nil {
				return err
			}
		}
	}
	var gone []string // target columns the source does not have (any more)
	for n := range t.cols {
		if !in[n] {
			gone = append(gone, n)
		}
	}
	slices.Sort(gone)
	if len(missing) > 0 && len(gone) > 0 {
		var renames, adds []string
		for _, g := range gone {
			for _, i := range missing {
				renames = append(renames, RenameColumnFix(t.ident, g, c.Names[i]))
			}
		}
		for _, i := range missing {
			adds = append(adds, AddColumnFix(t.ident, c.Names[i], types[i]))
		}
		var names []string
		for _, i := range missing {
			names = append(names, c.Names[i])
		}
		return fmt.Errorf("target table %s lacks the source's column(s) %s and has %s, which the source does not: a renamed column, or one dropped and another added? If renamed, run on the target: %s Otherwise: %s Then run the sync again",
			t.ident, strings.Join(names, ", "), strings.Join(gone, ", "), strings.Join(renames, " "), strings.Join(adds, " "))
	}
	if len(gone) > 0 && before != nil {
		for _, g := range gone {
			if slices.Contains(before.Names, g) {
				s.log.Warn().Str("table", t.ident).Str("column", g).Msg("the source dropped this column: the target keeps it, no longer maintained; drop it when it is not needed (a column added later on the source stops the sync until then, since it could be this one renamed)")
			}
		}
	}
	for _, i := range missing {
		if err := s.addColumn(ctx, t, c, c.Names[i], types[i], before == nil); err != nil {
			return err
		}
	}
	return nil
}

// alterType changes the type of column i on the target to the source's when only the modifiers
// differ; otherwise it stops with the statement.
func (s *Sink) alterType(ctx context.Context, t *targetTable, c *merge.Columns, i int, typ string, firstMet bool) error {
	name := c.Names[i]
	var base string
	if err := s.source.QueryRow(ctx, BaseTypeSQL, c.Types[i]).Scan(&base); err != nil {
		return fmt.Errorf("read the type of column %s of %s.%s on the source: %w", name, c.Schema, c.Table, err)
	}
	if base != t.bases[name] && unqualified(base) == unqualified(t.bases[name]) {
		// Types are named schema-qualified (search_path is pinned to pg_catalog): an extension
		// installed in one schema on the source and another on the target.
		return fmt.Errorf("column %s of %s.%s is %s on the source and %s on target table %s: a type of the same name in another schema (an extension installed in another schema?); Tidemark uses the source's type, schema-qualified: install it in schema %s on the target too, or create the target table with the source's type, then run the sync again",
			name, c.Schema, c.Table, base, t.bases[name], t.ident, strings.TrimSuffix(base, "."+unqualified(base)))
	}
	alter := AlterTypeSQL
	if base != t.bases[name] {
		empty, err := s.isEmptied(ctx, t, c, firstMet)
		switch {
		case err != nil:
			return err
		case empty:
		case firstMet:
			// A table made on the target before the sync, with another type.
			return fmt.Errorf("column %s of %s.%s is %s on the source and %s on the existing target table %s: give the target's column the source's type (%s), or sync into a new table (--target-schema), then run the sync again",
				name, c.Schema, c.Table, typ, t.types[name], t.ident, ConvertTypeFix(t.ident, name, typ))
		default:
			return fmt.Errorf("%w: column %s of %s.%s is %s on the source and %s on target table %s: the source converted its rows with a USING clause Tidemark cannot know; convert the target's rows the same way (%s), then run the sync again with --types-changed %s.%s; or re-backfill the table (a run with --on-rewrite rebackfill, the default, does it by itself when the source's table was rewritten)",
				ErrRewriteNotFollowed, name, c.Schema, c.Table, typ, t.types[name], t.ident, ConvertTypeFix(t.ident, name, typ), c.Schema, c.Table)
		}
		alter = ReplaceTypeSQL // emptied by a re-backfill: no value to convert
		if err := s.ensureType(ctx, c.Types[i], 0); err != nil {
			return err
		}
	}
	for _, tbl := range []string{t.ident, t.stage} {
		if tbl == "" {
			continue
		}
		if _, err := s.tx.Exec(ctx, alter(tbl, name, typ)); err != nil {
			return fmt.Errorf("change column %s of %s on the target from %s to %s (as on the source): %w", name, tbl, t.types[name], typ, err)
		}
	}
	s.log.Info().Str("table", t.ident).Str("column", name).Str("was", t.types[name]).Str("now", typ).Msg("target column type changed as on the source")
	t.types[name] = typ
	if base == t.bases[name] {
		return nil
	}
	// Another type: what the sink knows of it is read again (its domains' checks, and a key
	// column's comparison operators, which the deletes use).
	var oid uint32
	if err := s.tx.QueryRow(ctx, TargetBaseTypeSQL, t.ident, name).Scan(&base, &oid); err != nil {
		return fmt.Errorf("read column %s of %s on the target: %w", name, t.ident, err)
	}
	t.bases[name], t.oids[name] = base, oid
	if err := pgtrust.Domain(ctx, s.tx, fmt.Sprintf("column %s of target table %s", Quote(name), t.ident), oid); err != nil {
		return err
	}
	if k := slices.Index(t.key, name); k >= 0 {
		ops, err := chunker.ReadOps(ctx, s.tx, oid)
		if err != nil {
			return fmt.Errorf("target table %s, key column %s: %w", t.ident, name, err)
		}
		t.keyOps[k] = ops
	}
	return nil
}

// isEmptied reports whether target table t, the target of c's table, has no row, and may take the
// source's column types as they are: emptied by this sink (a TRUNCATE or a refresh), or, met
// first (a new sink, after a crash or a reconnection that followed a refresh's commit), a table
// this sync's checkpoint accounts for. An empty table the operator made with other types is
// fitted too once a checkpoint of this sync names its table (it has no value to lose); before,
// it is refused with the statement (alterType). The table is locked against every writer first,
// so that no row arrives between the look and the change.
func (s *Sink) isEmptied(ctx context.Context, t *targetTable, c *merge.Columns, firstMet bool) (bool, error) {
	if !t.emptied && !(firstMet && s.accounted[c.Schema+"."+c.Table]) {
		return false, nil
	}
	if _, err := s.tx.Exec(ctx, "LOCK TABLE "+t.ident+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		return false, fmt.Errorf("lock %s: %w", t.ident, err)
	}
	var found bool
	if err := s.tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+t.ident+")").Scan(&found); err != nil {
		return false, fmt.Errorf("look for rows in %s: %w", t.ident, err)
	}
	return !found, nil
}

// unqualified is a type's name (format_type's text) without its schema.
func unqualified(typ string) string {
	// format_type quotes a name that needs it; a schema-qualified one has a dot outside quotes.
	inQuote := false
	for i := 0; i < len(typ); i++ {
		switch {
		case typ[i] == '"':
			inQuote = !inQuote
		case typ[i] == '.' && !inQuote:
			return typ[i+1:]
		case typ[i] == '(' && !inQuote:
			return typ
		}
	}
	return typ
}

// addColumn adds a column of the source to the target, with the value the source's existing
// rows have for it.
func (s *Sink) addColumn(ctx context.Context, t *targetTable, c *merge.Columns, name, typ string, firstMet bool) error {
	var hasDefault, hasMissing bool
	var missing *string
	delim := ","
	err := s.source.QueryRow(ctx, SourceColumnDefaultSQL, pgx.Identifier{c.Schema, c.Table}.Sanitize(), name).Scan(&hasDefault, &hasMissing, &missing, &delim)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read column %s of %s.%s on the source: %w", name, c.Schema, c.Table, err)
	}
	var def *string
	switch {
	case hasMissing && missing != nil:
		// The value the source's rows had when the column was added, in its text form.
		val, null, err := pgjson.ArrayElement(*missing, delim[0])
		if err != nil {
			return fmt.Errorf("read the value column %s of %s.%s gives existing rows on the source: %w", name, c.Schema, c.Table, err)
		}
		if !null {
			def = &val
		}
	case hasDefault:
		empty, err := s.isEmptied(ctx, t, c, firstMet)
		if err != nil {
			return err
		}
		if empty {
			break // emptied by a re-backfill, which brings the rows with their values
		}
		return fmt.Errorf("%w: column %s of %s.%s has a default, and the source's rows got its values without a row event (a volatile default, or the table was rewritten since): target table %s cannot get them; add the column on the target (%s) and re-backfill the table (--rebackfill %s.%s; a run with --on-rewrite rebackfill, the default, does it by itself)",
			ErrRewriteNotFollowed, name, c.Schema, c.Table, t.ident, AddColumnFix(t.ident, name, typ), c.Schema, c.Table)
	}
	// The type's domains run their constraints as the column is added (on every row the target
	// has): checked first (pgtrust.Domain).
	var typOID *uint32
	if err := s.tx.QueryRow(ctx, `SELECT pg_catalog.to_regtype($1)::pg_catalog.oid`, typ).Scan(&typOID); err != nil {
		return fmt.Errorf("look up type %s on the target: %w", typ, err)
	}
	if typOID != nil {
		if err := pgtrust.Domain(ctx, s.tx, fmt.Sprintf("column %s of target table %s", Quote(name), t.ident), *typOID); err != nil {
			return err
		}
	}
	if _, err := s.tx.Exec(ctx, AddColumnSQL(t.ident, name, typ, def)); err != nil {
		return fmt.Errorf("add column %s to %s on the target: %w", name, t.ident, err)
	}
	if t.stage != "" {
		if _, err := s.tx.Exec(ctx, AddColumnSQL(t.stage, name, typ, nil)); err != nil {
			return fmt.Errorf("add column %s to the staging table of %s: %w", name, t.ident, err)
		}
	}
	t.cols[name], t.types[name] = true, typ
	var base string
	var oid uint32
	if err := s.tx.QueryRow(ctx, TargetBaseTypeSQL, t.ident, name).Scan(&base, &oid); err != nil {
		return fmt.Errorf("read column %s of %s on the target: %w", name, t.ident, err)
	}
	t.bases[name], t.oids[name] = base, oid
	s.log.Info().Str("table", t.ident).Str("column", name).Msg("target column added")
	return nil
}
