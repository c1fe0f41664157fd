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

	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/watermark"
)

func runStatus(ctx context.Context, args []string, e *env) error {
	fs := newFlags("status", "status --source DSN [--slot NAME] [--checkpoint FILE | --target DSN [--checkpoint-id ID]]", e)
	source := fs.String("source", os.Getenv("TIDEMARK_SOURCE"), "source connection string; default $TIDEMARK_SOURCE")
	slot := fs.String("slot", "tidemark", "logical replication slot")
	checkpoint := fs.String("checkpoint", "", "a JSON lines sync's checkpoint file (OUTPUT.checkpoint)")
	target := fs.String("target", "", "a PostgreSQL sync's target connection string")
	checkpointID := fs.String("checkpoint-id", "", "the target's checkpoint row; default the slot name")
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

	var pos *merge.Position
	var where string
	var at time.Time
	switch {
	case *checkpoint != "":
		b, err := os.ReadFile(*checkpoint)
		if err != nil {
			return fmt.Errorf("read checkpoint: %w", err)
		}
		var cp checkpointFile
		if err := json.Unmarshal(b, &cp); err != nil {
			return fmt.Errorf("checkpoint %s: %w", *checkpoint, err)
		}
		pos, where, at = cp.Position, *checkpoint, cp.Time
	case *target != "":
		tc, err := connectPinned(ctx, *target)
		if err != nil {
			return fmt.Errorf("target: %w", err)
		}
		defer tc.Close(context.WithoutCancel(ctx))
		id := *checkpointID
		if id == "" {
			id = *slot
		}
		var raw []byte
		err = tc.QueryRow(ctx, `SELECT position, updated_at FROM public.tidemark_checkpoint WHERE id = $1`, id).Scan(&raw, &at)
		if err != nil {
			return fmt.Errorf("read the target's checkpoint %q: %w", id, err)
		}
		pos, where = &merge.Position{}, "target row "+id
		if err := json.Unmarshal(raw, pos); err != nil {
			return fmt.Errorf("the target's checkpoint %q: %w", id, err)
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
		var est float64
		_ = conn.QueryRow(ctx, `SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = to_regclass($1)`, pgx.Identifier{schema, table}.Sanitize()).Scan(&est)
		switch {
		case p.Done && len(p.Reread) == 0:
			fmt.Fprintf(w, "  %s: backfill done (%d rows, %d chunks)\n", name, p.Rows, p.Chunks)
		case p.Done:
			fmt.Fprintf(w, "  %s: backfill done, %d rows to read again\n", name, len(p.Reread))
		default:
			pct := 0.0
			if est > 0 {
				pct = min(100, 100*float64(p.Rows)/est)
			}
			fmt.Fprintf(w, "  %s: backfill %.0f%% (%d of ~%.0f rows, %d chunks, after key %v)\n", name, pct, p.Rows, est, p.Chunks, p.Cursor)
		}
	}
	return nil
}

// connectSource connects to the --source of a command that needs one, or explains its usage.
func connectSource(ctx context.Context, fs *flag.FlagSet, source string) (*pgx.Conn, error) {
	if source == "" {
		fs.Usage()
		return nil, fmt.Errorf("%w: --source is required", errUsage)
	}
	return connectPinned(ctx, source)
}

func runCleanup(ctx context.Context, args []string, e *env) error {
	fs := newFlags("cleanup", "cleanup --source DSN [--slot NAME] [--publication NAME] [--yes]", e)
	source := fs.String("source", os.Getenv("TIDEMARK_SOURCE"), "source connection string; default $TIDEMARK_SOURCE")
	slot := fs.String("slot", "tidemark", "replication slot to drop")
	pub := fs.String("publication", "tidemark", "publication to drop; \"\" keeps it")
	yes := fs.Bool("yes", false, "drop without asking")
	if err := parse(fs, args); err != nil {
		return err
	}
	conn, err := connectSource(ctx, fs, *source)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	signal := watermark.DefaultTable.Sanitize()

	var plan []string
	var slotExists, slotActive, pubExists, sigExists bool
	var others int
	err = conn.QueryRow(ctx, `SELECT
		EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1),
		EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active),
		EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $2),
		to_regclass($3) IS NOT NULL`, *slot, *pub, signal).Scan(&slotExists, &slotActive, &pubExists, &sigExists)
	if err != nil {
		return fmt.Errorf("look up what to drop: %w", err)
	}
	if slotActive {
		return fmt.Errorf("replication slot %q is in use: stop the capture first", *slot)
	}
	if slotExists {
		plan = append(plan, fmt.Sprintf("SELECT pg_drop_replication_slot('%s');", *slot))
	}
	if pubExists && *pub != "" {
		plan = append(plan, fmt.Sprintf("DROP PUBLICATION %s;", pgx.Identifier{*pub}.Sanitize()))
	}
	if sigExists {
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+signal+` WHERE slot <> $1`, *slot).Scan(&others); err != nil {
			return fmt.Errorf("read the signal table: %w", err)
		}
		if others == 0 {
			plan = append(plan, fmt.Sprintf("DROP TABLE %s;", signal))
		} else {
			plan = append(plan, fmt.Sprintf("DELETE FROM %s WHERE slot = '%s';  -- %d other capture(s) still use the table", signal, *slot, others))
		}
	}
	if len(plan) == 0 {
		fmt.Fprintln(e.stdout, "Nothing to drop.")
		return nil
	}
	fmt.Fprintln(e.stdout, "This drops:")
	for _, p := range plan {
		fmt.Fprintf(e.stdout, "  %s\n", p)
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
	if slotExists {
		if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, *slot); err != nil {
			return fmt.Errorf("drop slot %q: %w", *slot, err)
		}
	}
	if pubExists && *pub != "" {
		if _, err := conn.Exec(ctx, "DROP PUBLICATION "+pgx.Identifier{*pub}.Sanitize()); err != nil {
			return fmt.Errorf("drop publication %q: %w", *pub, err)
		}
	}
	if sigExists {
		q := "DROP TABLE " + signal
		if others > 0 {
			q = "DELETE FROM " + signal + " WHERE slot = $1"
		}
		var err error
		if others > 0 {
			_, err = conn.Exec(ctx, q, *slot)
		} else {
			_, err = conn.Exec(ctx, q)
		}
		if err != nil {
			return fmt.Errorf("clean the signal table: %w", err)
		}
	}
	fmt.Fprintln(e.stdout, "Dropped.")
	return nil
}
