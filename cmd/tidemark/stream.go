package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/replicator"
)

// newFlags makes a command's flag set. Its errors are not printed by the flag package: run
// prints the error first, then a short usage hint (usageHint); -h prints the whole flag list.
func newFlags(name, synopsis string, e *env) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	synopses.Store(name, synopsis)
	fs.Usage = func() {}
	return fs
}

// synopses are the commands' synopses (newFlags), for the usage hint after an error.
var synopses sync.Map

// printHelp prints command fs's synopsis and every flag to w.
func printHelp(w io.Writer, fs *flag.FlagSet) {
	syn, _ := synopses.Load(fs.Name())
	fmt.Fprintf(w, "Usage: tidemark %s\n\nFlags:\n", syn)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return helpRequest{fs}
		}
		return fmt.Errorf("%w: %s", errUsage, flagError(fs, err))
	}
	applyEnvDefaults(fs)
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q (flags come as --name value)", errUsage, fs.Arg(0))
	}
	// A slot name goes into queries and into the SQL printed for a DBA: one PostgreSQL would
	// refuse is refused here, before anything uses it.
	if f := fs.Lookup("slot"); f != nil {
		if err := replicator.CheckSlotName(f.Value.String()); err != nil {
			return fmt.Errorf("%w: --slot: %w", errUsage, err)
		}
	}
	return nil
}

// flagGiven reports whether the flag name was set on the command line (rather than left at
// its default).
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

func runStream(ctx context.Context, args []string, e *env) error {
	fs := newFlags("stream", "stream --source DSN --slot NAME --publication NAME [flags]", e)
	source := sourceFlag(fs)
	slot := slotFlag(fs, "logical replication slot (pgoutput)")
	pub := publicationFlag(fs, "publication to stream")
	createSlot := fs.Bool("create-slot", false, "create the slot when it does not exist")
	from := fs.String("from", "0/0", "LSN to start from; the server starts at the later of this and the slot's confirmed position")
	// Acknowledging is opt-in: stream is a debugging aid, and pointed at the slot of a running
	// capture (or one that is stopped) it would otherwise let the server discard WAL that capture
	// has not yet made durable downstream, losing those changes for it.
	ack := fs.Bool("ack", false, "confirm each printed transaction to the slot, which lets the server discard its WAL; never on a slot a capture uses")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *source == "" {
		return fmt.Errorf("%w: --source is required (or run `tidemark demo`)", errUsage)
	}
	start, err := pglogrepl.ParseLSN(*from)
	if err != nil {
		return fmt.Errorf("%w: --from %q is not an LSN like 0/16B3748", errUsage, *from)
	}
	dsn, rule, err := pgconf.DefaultSSLMode(*source)
	if err != nil {
		return err
	}
	// Every logical message is printed (a debugging aid), each up to replicator.MaxMessage.
	cfg := replicator.Config{DSN: dsn, Slot: *slot, Publication: *pub, CreateSlot: *createSlot, Messages: "*"}
	out := bufio.NewWriter(e.stdout)
	return rule.Explain(streamJSON(ctx, cfg, start, out, *ack, e.log, nil))
}

// streamJSON streams the slot as JSON lines to out until ctx ends or stop returns true after a
// commit. With ack, each transaction is acknowledged once its lines are flushed.
func streamJSON(ctx context.Context, cfg replicator.Config, from pglogrepl.LSN, out *bufio.Writer, ack bool, log zerolog.Logger, stop func(commits int) bool) error {
	st, err := replicator.Open(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer st.Close(context.WithoutCancel(ctx))
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	enc := json.NewEncoder(out)
	commits := 0
	errDone := errors.New("done")
	err = st.Run(ctx, from, func(ctx context.Context, ev replicator.Event) error {
		if line := eventJSON(ev); line != nil {
			if err := enc.Encode(line); err != nil {
				return fmt.Errorf("write output: %w", err)
			}
		}
		if c, ok := ev.(*replicator.Commit); ok {
			if err := out.Flush(); err != nil {
				return fmt.Errorf("write output: %w", err)
			}
			if ack {
				st.Ack(c.EndLSN)
			}
			commits++
			if stop != nil && stop(commits) {
				cancel(errDone)
			}
		}
		return nil
	})
	if errors.Is(err, errDone) {
		return nil
	}
	// A slot this run created and never acknowledged from is dropped when the run fails: it
	// would retain WAL for nothing.
	if err != nil && ctx.Err() == nil && !(ack && commits > 0) {
		_ = st.Close(context.WithoutCancel(ctx))
		err = errors.Join(err, st.Undo(ctx))
	}
	return err
}

// eventJSON is the JSON line of one stream event; nil for events not printed.
func eventJSON(ev replicator.Event) any {
	type line struct {
		Type      string            `json:"type"`
		LSN       string            `json:"lsn,omitempty"`
		EndLSN    string            `json:"end_lsn,omitempty"`
		XID       uint32            `json:"xid,omitempty"`
		Time      string            `json:"time,omitempty"`
		Op        string            `json:"op,omitempty"`
		Schema    string            `json:"schema,omitempty"`
		Table     string            `json:"table,omitempty"`
		Key       []string          `json:"key,omitempty"`
		After     map[string]any    `json:"after,omitempty"`
		Before    map[string]any    `json:"before,omitempty"`
		Unchanged []string          `json:"unchanged,omitempty"`
		Tables    []string          `json:"tables,omitempty"`
		Prefix    string            `json:"prefix,omitempty"`
		Content   string            `json:"content,omitempty"`
		Columns   map[string]string `json:"columns,omitempty"`
	}
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	switch ev := ev.(type) {
	case *replicator.Begin:
		return line{Type: "begin", LSN: ev.FinalLSN.String(), XID: ev.XID, Time: ts(ev.Time)}
	case *replicator.Commit:
		return line{Type: "commit", LSN: ev.LSN.String(), EndLSN: ev.EndLSN.String(), XID: ev.XID, Time: ts(ev.Time)}
	case *replicator.Change:
		l := line{Type: "change", Op: ev.Op.String(), LSN: ev.LSN.String(), XID: ev.XID, Schema: ev.Rel.Schema, Table: ev.Rel.Table}
		for _, i := range ev.Rel.KeyColumns() {
			l.Key = append(l.Key, ev.Rel.Columns[i].Name)
		}
		l.After, l.Unchanged = rowJSON(ev.Rel, ev.New)
		l.Before, _ = rowJSON(ev.Rel, ev.Old)
		return l
	case *replicator.Truncate:
		l := line{Type: "truncate", LSN: ev.LSN.String(), XID: ev.XID}
		for _, r := range ev.Rels {
			l.Tables = append(l.Tables, r.Schema+"."+r.Table)
		}
		return l
	case *replicator.Message:
		return line{Type: "message", LSN: ev.LSN.String(), XID: ev.XID, Prefix: ev.Prefix, Content: string(ev.Content)}
	case *replicator.Relation:
		l := line{Type: "relation", Schema: ev.Schema, Table: ev.Table, Columns: map[string]string{}}
		for _, c := range ev.Columns {
			l.Columns[c.Name] = fmt.Sprintf("oid %d", c.TypeOID)
		}
		return l
	}
	return nil
}

// rowJSON maps a tuple to column name → text value (or null), and lists the unchanged TOASTed
// columns, which have no value in the tuple. (Typed JSON values come with the engine.)
func rowJSON(rel *replicator.Relation, t replicator.Tuple) (map[string]any, []string) {
	if t == nil {
		return nil, nil
	}
	row := make(map[string]any, len(t))
	var unchanged []string
	for i, v := range t {
		name := rel.Columns[i].Name
		switch v.Kind {
		case replicator.Null:
			row[name] = nil
		case replicator.Unchanged:
			unchanged = append(unchanged, name)
		default:
			row[name] = string(v.Data)
		}
	}
	return row, unchanged
}

// execAll runs statements in order on one connection.
func execAll(ctx context.Context, dsn string, stmts ...string) error {
	conn, err := pgconf.OpenDefaultSSL(ctx, dsn, "tidemark")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("run %q: %w", s, err)
		}
	}
	return nil
}
