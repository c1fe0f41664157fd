package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/term"

	"github.com/tidemark/tidemark/cmd/internal/preflight"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/sqlfix"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/sink/jsonl"
	"github.com/tidemark/tidemark/sink/kafka"
	"github.com/tidemark/tidemark/sink/nats"
	"github.com/tidemark/tidemark/sink/postgres"
)

func runStatus(ctx context.Context, args []string, e *env) error {
	fs := newFlags("status", "status --source DSN [--slot NAME] [--checkpoint FILE | --target DSN [--checkpoint-id ID] | --kafka kafka://... | --nats nats://...]", e)
	source := sourceFlag(fs)
	slot := slotFlag(fs, "logical replication slot")
	checkpoint := fs.String("checkpoint", "", "a JSON lines sync's checkpoint file (OUTPUT.checkpoint)")
	target := targetFlag(fs, "a PostgreSQL sync's target connection string, a `DSN` ($TIDEMARK_TARGET serves only when it is one)")
	checkpointID := fs.String("checkpoint-id", "", "the target's checkpoint row; default the slot name")
	kafkaOut := fs.String("kafka", "", "a Kafka sync's output, its `URL` (kafka://HOST:PORT[,...]/PREFIX): its checkpoint is read from PREFIX.tidemark-checkpoint as a read_committed consumer reads it")
	natsOut := fs.String("nats", "", "a NATS sync's output, its `URL` (nats://HOST:PORT[,...]/STREAM): its checkpoint is read from the bucket tidemark-STREAM, with how far the stream goes past it")
	if err := parse(fs, args); err != nil {
		return err
	}
	conn, err := connectSource(ctx, fs, *source)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	w := e.stdout

	var active bool
	var pid *int32
	var plugin, walStatus, confirmed, restart string
	var retained, unconfirmed int64
	err = conn.QueryRow(ctx, `SELECT active, active_pid, coalesce(plugin, ''), coalesce(wal_status, ''),
		coalesce(confirmed_flush_lsn::text, ''), coalesce(restart_lsn::text, ''),
		coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint,
		coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, *slot).Scan(&active, &pid, &plugin, &walStatus, &confirmed, &restart, &retained, &unconfirmed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		fmt.Fprintf(w, "slot %s: does not exist\n", *slot)
	case err != nil:
		return fmt.Errorf("read slot %q: %w", *slot, err)
	default:
		state := "inactive"
		if active && pid != nil {
			state = fmt.Sprintf("active (pid %d)", *pid)
		}
		fmt.Fprintf(w, "slot %s: %s, plugin %s, wal_status %s\n", *slot, state, plugin, walStatus)
		fmt.Fprintf(w, "  confirmed_flush_lsn %s, restart_lsn %s\n", confirmed, restart)
		fmt.Fprintf(w, "  retained WAL %s, not yet confirmed %s\n", bytesStr(retained), bytesStr(unconfirmed))
	}

	idle, err := preflight.IdleSlots(ctx, conn, *slot)
	if err != nil {
		return fmt.Errorf("read replication slots: %w", err)
	}
	for _, sl := range idle {
		fmt.Fprintf(w, "other slot %s: inactive, retains %s of WAL; %s\n", sl.Name, bytesStr(sl.Retained), preflight.IdleSlotFix(sl.Name))
	}

	var pos *merge.Position
	var where string
	var at time.Time
	switch {
	case *checkpoint != "":
		b, err := os.ReadFile(*checkpoint)
		if err != nil {
			return fmt.Errorf("read checkpoint: %w", err)
		}
		var cp jsonl.CheckpointFile
		if err := json.Unmarshal(b, &cp); err != nil {
			return fmt.Errorf("checkpoint %s: %w", *checkpoint, err)
		}
		pos, where, at = cp.Position, *checkpoint, cp.Time
	case *target != "":
		tc, err := pgconf.OpenDefaultSSL(ctx, *target, "tidemark")
		if err != nil {
			return fmt.Errorf("target: %w", err)
		}
		defer tc.Close(context.WithoutCancel(ctx))
		id := *checkpointID
		if id == "" {
			id = *slot
		}
		var raw []byte
		err = tc.QueryRow(ctx, `SELECT position, updated_at FROM `+postgres.CheckpointTable+` WHERE id = $1`, id).Scan(&raw, &at)
		if err != nil {
			return fmt.Errorf("read the target's checkpoint %q: %w", id, err)
		}
		pos, where = &merge.Position{}, "target row "+id
		if err := json.Unmarshal(raw, pos); err != nil {
			return fmt.Errorf("the target's checkpoint %q: %w", id, err)
		}
	case *kafkaOut != "":
		addr, err := kafka.ParseURL(*kafkaOut)
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		ck, err := kafka.ReadCheckpoint(rctx, addr)
		if err != nil {
			return fmt.Errorf("read the checkpoint of %s: %w", addr, err)
		}
		where = addr.String()
		if ck != nil {
			pos, at = ck.Position, ck.Time
		}
	case *natsOut != "":
		addr, err := nats.ParseURL(*natsOut)
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		ck, err := nats.ReadCheckpoint(rctx, addr)
		if err != nil {
			return fmt.Errorf("read the checkpoint of %s: %w", addr, err)
		}
		where = addr.String()
		if ck != nil {
			pos, at = ck.Position, ck.Time
			if ck.Last != nil && (pos == nil || ck.Last.LSN > pos.LSN) {
				fmt.Fprintf(w, "stream %s: holds changes up to %s, past the checkpoint: the next run passes over them\n", addr.Stream, ck.Last.LSN)
			}
		}
	default:
		return nil
	}
	if pos == nil {
		fmt.Fprintf(w, "checkpoint (%s): none yet\n", where)
		return nil
	}
	fmt.Fprintf(w, "checkpoint (%s, %s ago): position %s\n", where, time.Since(at).Round(time.Second), pos.LSN)
	for _, name := range slices.Sorted(maps.Keys(pos.Tables)) {
		p := pos.Tables[name]
		schema, table, _ := strings.Cut(name, ".")
		var est *float64
		_ = conn.QueryRow(ctx, estimateSQL, pgx.Identifier{schema, table}.Sanitize()).Scan(&est)
		reached := fmt.Sprintf("after key %v", p.Cursor)
		if n := len(p.Ranges); n > 0 {
			done := 0
			for _, r := range p.Ranges {
				if r.Done {
					done++
				}
			}
			reached = fmt.Sprintf("in %d key ranges read at once, %d done", n, done)
		}
		switch {
		case p.Done && len(p.Reread) == 0:
			fmt.Fprintf(w, "  %s: backfill done (%d rows, %d chunks)\n", name, p.Rows, p.Chunks)
		case p.Done:
			fmt.Fprintf(w, "  %s: backfill done, %d rows to read again\n", name, len(p.Reread))
		case est == nil || *est <= 0:
			fmt.Fprintf(w, "  %s: backfill in progress: %d rows so far of an unknown total (%d chunks, %s)\n", name, p.Rows, p.Chunks, reached)
		case float64(p.Rows) >= *est:
			fmt.Fprintf(w, "  %s: backfill in progress: %d rows so far, past the estimate of ~%.0f (%d chunks, %s)\n", name, p.Rows, *est, p.Chunks, reached)
		default:
			fmt.Fprintf(w, "  %s: backfill %.0f%% (%d of ~%.0f rows, %d chunks, %s)\n", name, 100*float64(p.Rows) / *est, p.Rows, *est, p.Chunks, reached)
		}
	}
	return nil
}

// connectSource connects to the --source of a command that needs one, or explains its usage.
func connectSource(ctx context.Context, fs *flag.FlagSet, source string) (*pgx.Conn, error) {
	if source == "" {
		return nil, fmt.Errorf("%w: --source is required", errUsage)
	}
	return pgconf.OpenDefaultSSL(ctx, source, "tidemark")
}

// runCleanup drops what one capture owns, and nothing another capture or a DBA may still use.
// What it owns: its slot (a logical pgoutput slot of this database: any other slot by that name
// belongs to a standby, a backup or another tool), the publication only when Tidemark created it
// for this slot and no other logical pgoutput slot of the database could be streaming it (a slot
// names its publication only when it starts streaming, so the catalog cannot say which slot reads
// which publication), and its own row of its signal table, or the table when no other capture
// has a row in it and no other such slot could be one that has not written yet. What it keeps,
// it names with the statement an operator may run.
func runCleanup(ctx context.Context, args []string, e *env) error {
	fs := newFlags("cleanup", "cleanup --source DSN [--slot NAME] [--publication NAME] [--signal-table SCHEMA.TABLE] [--yes]", e)
	source := sourceFlag(fs)
	slot := slotFlag(fs, "replication slot to drop")
	pub := publicationFlag(fs, "publication to drop when Tidemark created it for this slot and no other slot may stream it; \"\" keeps it")
	signalTable := signalTableFlag(fs, "the capture's signal table, as sync's --signal-table: its row is deleted, the table dropped when no other capture has a row")
	yes := fs.Bool("yes", false, "drop without asking")
	if err := parse(fs, args); err != nil {
		return err
	}
	sigSchema, sigTable, ok := strings.Cut(*signalTable, ".")
	if !ok || sigSchema == "" || sigTable == "" {
		return fmt.Errorf("%w: --signal-table must be schema.table", errUsage)
	}
	conn, err := connectSource(ctx, fs, *source)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	p, err := planCleanup(ctx, conn, *slot, *pub, pgx.Identifier{sigSchema, sigTable})
	if err != nil {
		return err
	}
	for _, k := range p.kept {
		fmt.Fprintln(e.stdout, k)
	}
	if len(p.steps) == 0 {
		fmt.Fprintln(e.stdout, "Nothing to drop.")
		return nil
	}
	fmt.Fprintln(e.stdout, "This drops:")
	for _, s := range p.steps {
		fmt.Fprintf(e.stdout, "  %s\n", s.show)
	}
	if !*yes {
		if !term.IsTerminal(int(os.Stdin.Fd())) {
			return fmt.Errorf("%w: nothing dropped; run again with --yes to confirm", errUsage)
		}
		fmt.Fprintf(e.stdout, "Type the slot name (%s) to confirm: ", *slot)
		answer, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		if strings.TrimSpace(answer) != *slot {
			return fmt.Errorf("not confirmed: nothing dropped")
		}
	}
	for _, s := range p.steps {
		if _, err := conn.Exec(ctx, s.sql, s.args...); err != nil {
			return fmt.Errorf("%s: %w", s.what, err)
		}
	}
	fmt.Fprintln(e.stdout, "Dropped.")
	return nil
}

// cleanupPlan is what cleanup drops, in order, and what it keeps, with why.
type cleanupPlan struct {
	steps []cleanupStep
	kept  []string // one message per object kept: why, and the statement that would drop it
}

type cleanupStep struct {
	show string // the statement as printed for confirmation
	sql  string // the statement run, with args bound
	args []any
	what string // what the statement does, for its error
}

// signalColumns are the columns of a signal table (watermark.CreateTable), and all of them: a
// table with other columns is not one Tidemark created, whatever its name.
var signalColumns = []string{"chunk", "kind", "run", "slot", "written_at"}

// planCleanup decides what cleanup drops for slot, publication pub and signal table sig, reading
// the catalog; it changes nothing. A slot that is not a capture's of this database is an error:
// a mistyped --slot must not go on to drop the rest.
func planCleanup(ctx context.Context, conn *pgx.Conn, slot, pub string, sig pgx.Identifier) (*cleanupPlan, error) {
	p := &cleanupPlan{}
	var db string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		return nil, fmt.Errorf("read the current database: %w", err)
	}

	var typ, plugin, slotDB string
	var active bool
	var pid int32
	err := conn.QueryRow(ctx, `SELECT slot_type, coalesce(plugin, ''), coalesce(database, ''), active, coalesce(active_pid, 0)
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&typ, &plugin, &slotDB, &active, &pid)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, fmt.Errorf("read replication slot %q: %w", slot, err)
	case typ != "logical":
		return nil, fmt.Errorf("replication slot %q is a %s slot (a standby's or a backup's), not a Tidemark capture's: nothing dropped; check --slot", slot, typ)
	case plugin != "pgoutput":
		return nil, fmt.Errorf("replication slot %q uses the plugin %s, not pgoutput: it is not a Tidemark capture's; nothing dropped; check --slot", slot, plugin)
	case slotDB != db:
		return nil, fmt.Errorf("replication slot %q belongs to database %q, not %q: nothing dropped; run cleanup connected to %q", slot, slotDB, db, slotDB)
	case active:
		return nil, fmt.Errorf("replication slot %q is in use by server process %d: stop the capture first; nothing dropped", slot, pid)
	default:
		p.steps = append(p.steps, cleanupStep{
			show: sqlfix.DropSlot(slot),
			sql:  `SELECT pg_drop_replication_slot($1)`, args: []any{slot}, what: fmt.Sprintf("drop slot %q", slot),
		})
	}

	// Any other logical pgoutput slot of the database may be another capture that streams this
	// publication or writes to this signal table (before its first mark, it has no row there).
	otherSlots, err := replicator.OtherSlots(ctx, conn, slot)
	if err != nil {
		return nil, fmt.Errorf("list the other slots of database %q: %w", db, err)
	}

	if pub != "" {
		var comment *string
		err := conn.QueryRow(ctx, `SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1`, pub).Scan(&comment)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return nil, fmt.Errorf("read publication %q: %w", pub, err)
		default:
			drop := "DROP PUBLICATION " + pgx.Identifier{pub}.Sanitize()
			switch {
			case comment == nil || *comment != replicator.PublicationComment(slot):
				p.kept = append(p.kept, fmt.Sprintf("Kept publication %q: it was not created by Tidemark for slot %s (its comment is not %q); "+
					"if no other capture uses it, drop it with:\n  %s;", pub, slot, replicator.PublicationComment(slot), drop))
			case len(otherSlots) > 0:
				p.kept = append(p.kept, fmt.Sprintf("Kept publication %q: other logical slots of this database (%s) may stream it; "+
					"if none of them does, drop it with:\n  %s;", pub, strings.Join(otherSlots, ", "), drop))
			default:
				p.steps = append(p.steps, cleanupStep{show: drop + ";", sql: drop, what: fmt.Sprintf("drop publication %q", pub)})
			}
		}
	}

	name := sig.Sanitize()
	var relkind string
	var cols []string
	err = conn.QueryRow(ctx, `SELECT c.relkind::text, array(SELECT attname::text FROM pg_attribute
			WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped ORDER BY attname)
		FROM pg_class c WHERE c.oid = to_regclass($1)`, name).Scan(&relkind, &cols)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return p, nil
	case err != nil:
		return nil, fmt.Errorf("read signal table %s: %w", name, err)
	case relkind != "r" || !slices.Equal(cols, signalColumns):
		return nil, fmt.Errorf("%s is not a Tidemark signal table (a table of exactly the columns %s): nothing dropped; check --signal-table",
			name, strings.Join(signalColumns, ", "))
	}
	var others int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+name+` WHERE slot <> $1`, slot).Scan(&others); err != nil {
		return nil, fmt.Errorf("read signal table %s: %w", name, err)
	}
	var why string
	switch {
	case others > 0:
		why = fmt.Sprintf("%d other capture(s) have rows in the table", others)
	case len(otherSlots) > 0:
		why = fmt.Sprintf("the captures of slots %s may use the table", strings.Join(otherSlots, ", "))
	default:
		p.steps = append(p.steps, cleanupStep{show: fmt.Sprintf("DROP TABLE %s;", name), sql: "DROP TABLE " + name, what: "drop signal table " + name})
		return p, nil
	}
	p.steps = append(p.steps, cleanupStep{
		show: fmt.Sprintf("DELETE FROM %s WHERE slot = %s;  -- only this slot's row: %s", name, sqlfix.Literal(slot), why),
		sql:  "DELETE FROM " + name + " WHERE slot = $1", args: []any{slot}, what: "delete the slot's row of signal table " + name,
	})
	return p, nil
}
