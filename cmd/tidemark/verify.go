package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/secret"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/sink/jsonl"
	"github.com/tidemark/tidemark/sink/kafka"
	"github.com/tidemark/tidemark/sink/nats"
	"github.com/tidemark/tidemark/verify"
)

// runVerify compares a sync's output with its source: a PostgreSQL target, or a JSON lines file
// replayed. It takes sync's own flags for what they share, so that a sync's command line with
// "verify" for "sync" checks that sync.
func runVerify(ctx context.Context, args []string, e *env) (err error) {
	fs := newFlags("verify", "verify --source DSN --tables schema.table,... --to TARGET [--target-schema NAME] [--recheck-for DURATION]", e)
	source := sourceFlag(fs)
	tables := fs.String("tables", "", "comma-separated tables to compare, as schema.table")
	keys := keyFlag(fs)
	to := envFlag(fs, "to", "TIDEMARK_TARGET", nil, "the sync's output, a `TARGET`: a PostgreSQL connection string (postgres://...), a JSON lines file, or a Kafka or NATS output (kafka://..., nats://..., read as a consumer reads it)")
	targetSchema := fs.String("target-schema", "", "PostgreSQL target: the schema of its tables, as sync's; default the source's")
	pub := publicationFlag(fs, "the sync's publication: a table in it is compared within its column list")
	chunkSize := fs.Int("chunk-size", merge.DefaultChunkSize, "rows per source chunk")
	recheckFor := fs.Duration("recheck-for", 30*time.Second, "longest time a differing key is read again while the source or the output still changes it (a live sync's lag); 0 compares once")
	show := fs.Int("show", 10, "differing keys printed per table")
	if err := parse(fs, args); err != nil {
		return err
	}
	var problems []string
	if *tables == "" {
		problems = append(problems, "--tables is required")
	}
	if *to == "" {
		problems = append(problems, "--to is required: the sync's target or JSON lines file")
	}
	if *to == "-" {
		problems = append(problems, "--to -: standard output cannot be read back; verify a file or a PostgreSQL target")
	}
	if *to != "" && (!isDSN(*to) || isFile(*to) || kafka.IsURL(*to) || nats.IsURL(*to)) && *targetSchema != "" {
		problems = append(problems, "--target-schema is for a PostgreSQL target")
	}
	problems = append(problems, outOfRange(intRange("chunk-size", *chunkSize, 1, 1_000_000),
		durationRange("recheck-for", *recheckFor, 0, 24*time.Hour), intRange("show", *show, 0, 1_000_000))...)
	if err := usageProblems(fs, problems); err != nil {
		return err
	}
	parsed, err := parseTables(*tables)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if err := applyKeys(*keys, parsed); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	defer func() {
		if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
			// Not context.Canceled, which exits 0: an unfinished comparison is no "equal".
			err = errors.New("interrupted: the comparison did not end, so it says nothing of the tables it did not finish")
		}
	}()
	conn, err := connectSource(ctx, fs, *source)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	opts := verify.Options{Source: conn, Publication: *pub, ChunkSize: *chunkSize, RecheckFor: *recheckFor, Log: e.log,
		Progress: func(t *verify.TableReport) { printTableReport(e.stdout, t, *show) }}
	for _, t := range parsed {
		opts.Tables = append(opts.Tables, verify.Table{Schema: t.Schema, Name: t.Name, Key: t.Key})
	}
	var rep *verify.Report
	if isDSN(*to) && !isFile(*to) {
		tc, cerr := pgconf.OpenDefaultSSL(ctx, *to, "tidemark")
		if cerr != nil {
			return fmt.Errorf("target: %w", cerr)
		}
		defer tc.Close(context.WithoutCancel(ctx))
		rep, err = verify.Postgres(ctx, opts, tc, *targetSchema)
	} else if kafka.IsURL(*to) || nats.IsURL(*to) {
		var found []string
		rep, found, err = verifyLog(ctx, opts, *to, parsed)
		if err == nil && len(found) > 0 {
			for _, f := range found {
				fmt.Fprintf(e.stdout, "%s: DIFFERENT: %s\n", secret.RedactURL(*to), f)
			}
			return fmt.Errorf("%w: what the output's partitions hold differs from one order (a consumer per partition would see another history): %s", errDiffers, found[0])
		}
	} else {
		// A file in the Debezium format (its checkpoint beside it says so) is refused by name,
		// not at its first line.
		var ck jsonl.CheckpointFile
		if b, rerr := os.ReadFile(*to + ".checkpoint"); rerr == nil && json.Unmarshal(b, &ck) == nil && strings.HasPrefix(ck.Format, "debezium") {
			return checkLogFormat(*to, true, true)
		}
		rep, err = verify.JSONLines(ctx, opts, *to)
	}
	if err != nil {
		return err
	}
	return verdict(rep)
}

// printTableReport prints one table's result, with up to show of its differing keys.
func printTableReport(w io.Writer, t *verify.TableReport, show int) {
	switch {
	case t.Problem != "":
		fmt.Fprintf(w, "%s: DIFFERENT: %s\n", t.Table, t.Problem)
		return
	case t.Equal():
		fmt.Fprintf(w, "%s: equal (%d rows, %d chunks, %s)\n", t.Table, t.SourceRows, t.Chunks, t.Elapsed.Round(time.Millisecond))
	default:
		n := int64(len(t.Differences)) + t.Unchecked
		fmt.Fprintf(w, "%s: DIFFERENT: %d keys differ (source %d rows, target %d)\n", t.Table, n, t.SourceRows, t.TargetRows)
	}
	for i, d := range t.Differences {
		if i == show {
			fmt.Fprintf(w, "  ... and %d more\n", int64(len(t.Differences)-show)+t.Unchecked)
			break
		}
		fmt.Fprintf(w, "  %s\n", d)
	}
	if len(t.Differences) <= show && t.Unchecked > 0 {
		fmt.Fprintf(w, "  ... and %d more, not re-checked\n", t.Unchecked)
	}
	if len(t.Ignored) > 0 {
		fmt.Fprintf(w, "  not compared: the target's columns %v, which the capture does not carry\n", t.Ignored)
	}
}

// errDiffers: verify found the output different from its source (exit 3, apart from an error's 1).
var errDiffers = errors.New("differs")

// verdict is verify's result: nil when every table is equal.
func verdict(rep *verify.Report) error {
	var different, changing int
	for _, t := range rep.Tables {
		if !t.Equal() {
			different++
		}
		for _, d := range t.Differences {
			if d.Changing {
				changing++
				break
			}
		}
	}
	switch {
	case different == 0:
		return nil
	case changing > 0:
		return fmt.Errorf("%w: %d of %d tables differ from the source; in %d, keys were still changing on the source when the re-check ended (--recheck-for): run verify again, or after `sync --stop-when-caught-up` with the writes stopped, for an exact answer", errDiffers, different, len(rep.Tables), changing)
	default:
		return fmt.Errorf("%w: %d of %d tables differ from the source", errDiffers, different, len(rep.Tables))
	}
}

// isFile says whether path names an existing file: a JSON lines output whose name happens to
// look like a connection string (host=... in a directory name) is still a file.
func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// verifyLog compares a Kafka or NATS output with its source: its records, read as a consumer
// reads them (read_committed, every partition; the whole stream), are written into a JSON lines
// file in the output's order, which is then replayed and compared. It also returns what a
// consumer per partition (or subject) would see otherwise than that order: a truncate missing
// from one, a key in two. The output is read once: a re-check (--recheck-for) reads the source
// again, not the output, so a live sync's lag shows as differences; compare after
// --stop-when-caught-up for an exact answer.
func verifyLog(ctx context.Context, opts verify.Options, to string, tables []merge.TableConfig) (*verify.Report, []string, error) {
	dir, err := os.MkdirTemp("", "tidemark-verify-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	f, err := os.Create(filepath.Join(dir, "output.jsonl"))
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	var found []string
	if kafka.IsURL(to) {
		addr, perr := kafka.ParseURL(to)
		if perr != nil {
			return nil, nil, fmt.Errorf("%w: --to: %w", errUsage, perr)
		}
		ck, cerr := kafka.ReadCheckpoint(ctx, addr)
		if cerr != nil {
			return nil, nil, cerr
		}
		if err := checkLogFormat(to, ck != nil, ck != nil && strings.HasPrefix(ck.Format, "debezium")); err != nil {
			return nil, nil, err
		}
		var names []string
		for _, t := range tables {
			names = append(names, t.Schema+"."+t.Name)
		}
		found, err = kafka.WriteLines(ctx, addr, names, dir, w)
	} else {
		addr, perr := nats.ParseURL(to)
		if perr != nil {
			return nil, nil, fmt.Errorf("%w: --to: %w", errUsage, perr)
		}
		ck, cerr := nats.ReadCheckpoint(ctx, addr)
		if cerr != nil {
			return nil, nil, cerr
		}
		if err := checkLogFormat(to, ck != nil, ck != nil && strings.HasPrefix(ck.Format, "debezium")); err != nil {
			return nil, nil, err
		}
		found, err = nats.WriteLines(ctx, addr, w)
	}
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read %s back: %w", secret.RedactURL(to), err)
	}
	rep, err := verify.JSONLines(ctx, opts, f.Name())
	return rep, found, err
}

// checkLogFormat refuses an output verify cannot replay: none there, or Debezium's envelopes.
func checkLogFormat(to string, exists, debezium bool) error {
	switch {
	case !exists:
		return fmt.Errorf("%s holds no Tidemark output (no checkpoint): check the URL, or run sync first", secret.RedactURL(to))
	case debezium:
		return fmt.Errorf("%s holds records in the Debezium format: verify replays the tidemark format (a sync without --format debezium)", secret.RedactURL(to))
	}
	return nil
}
