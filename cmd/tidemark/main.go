package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/rs/zerolog"
	"golang.org/x/term"

	"github.com/tidemark/tidemark/internal/profile"
	"github.com/tidemark/tidemark/internal/secret"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/sink/kafka"
	"github.com/tidemark/tidemark/sink/nats"
)

// command is one subcommand: it parses its own flags and runs.
type command struct {
	name  string
	short string
	run   func(ctx context.Context, args []string, env *env) error
}

// env is what a command may use of the process: its streams and logger.
type env struct {
	stdout   io.Writer
	stderr   io.Writer
	log      zerolog.Logger
	terminal bool       // stderr is a terminal: show progress bars rather than log lines
	logs     *logOutput // where log lines go; nil: a writer of the caller's (tests)
}

// logOutput is where log lines go: stderr, or, while the progress display is drawn on the
// terminal, above its bars (a line written straight to the terminal would break them).
type logOutput struct {
	base  io.Writer
	mu    sync.Mutex
	over  io.Writer
	scrub *secret.Scrubber // the secrets of this run, replaced in every line
}

func (o *logOutput) Write(b []byte) (int, error) {
	o.mu.Lock()
	over, scrub := o.over, o.scrub
	o.mu.Unlock()
	if scrub != nil {
		n := len(b)
		b = []byte(scrub.Scrub(string(b)))
		if _, err := o.write(over, b); err != nil {
			return 0, err
		}
		return n, nil
	}
	return o.write(over, b)
}

func (o *logOutput) write(over io.Writer, b []byte) (int, error) {
	if over != nil {
		if n, err := over.Write(b); err == nil {
			return n, nil
		}
		// The display ended meanwhile: the line goes to the terminal itself.
	}
	return o.base.Write(b)
}

// above sends log lines to w (the progress display) until the returned function is called.
func (o *logOutput) above(w io.Writer) (restore func()) {
	if o == nil {
		return func() {}
	}
	o.mu.Lock()
	o.over = w
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		o.over = nil
		o.mu.Unlock()
	}
}

var commands = []command{
	{"demo", "run the demo: a throwaway PostgreSQL, a live workload, a sync into a second database, verified", runDemo},
	{"sync", "backfill tables while streaming their changes, into PostgreSQL or a JSON lines file", runSync},
	{"doctor", "check every setting and privilege a capture needs, with the fix for each", runDoctor},
	{"rebackfill", "ask a running sync to start tables' output over (re-read them) while it runs", runRebackfill},
	{"verify", "compare a sync's output (a PostgreSQL target or a JSON lines file) with its source, key by key", runVerify},
	{"status", "show the slot's positions and retained WAL, and the backfill progress of a checkpoint", runStatus},
	{"cleanup", "drop what a capture owns (its slot, its publication, its signal table row), once confirmed", runCleanup},
	{"bench", "measure the backfill against COPY, and live-change latency during a backfill", runBench},
	{"schema", "print the JSON schema of the rows sync writes for each table", runSchema},
	{"chaos", "run the chaos harness: a live workload, the capture under faults, the output checked against the source", runChaos},
	{"consume", "apply a Kafka output to PostgreSQL as a consumer group, exactly once (offsets in the target's transactions)", runConsume},
	{"stream", "print the decoded change stream of a replication slot as JSON lines", runStream},
}

// errUsage marks a usage error: exit code 2.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	profile.TuneGC(os.Getenv)
	stopProfile := profile.Start(os.Getenv(profile.Env), os.Stderr)
	code := run(ctx, os.Args[1:], newEnv(os.Stdout, os.Stderr))
	stopProfile()
	stop()
	os.Exit(code)
}

// newEnv is the environment of a command run from a shell: output to stdout, logs (and, on a
// terminal, the progress display) to stderr.
func newEnv(stdout, stderr *os.File) *env {
	// A terminal without a width (a pseudo-terminal nobody sized) gets log lines: bars would
	// draw nothing there.
	terminal := term.IsTerminal(int(stderr.Fd()))
	if w, _, err := term.GetSize(int(stderr.Fd())); terminal && (err != nil || w <= 0) {
		terminal = false
	}
	logs := &logOutput{base: stderr}
	return &env{stdout: stdout, stderr: stderr, log: newLogger(logs, terminal), terminal: terminal, logs: logs}
}

func run(ctx context.Context, args []string, e *env) int {
	e = e.scrubbed(secret.New(runSecrets(args)...), len(args) > 0 && (args[0] == "sync" || args[0] == "stream"))
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(e.stdout)
		return 0
	}
	if args[0] == "version" || args[0] == "--version" || args[0] == "-version" {
		fmt.Fprintf(e.stdout, "tidemark %s\n", version())
		return 0
	}
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], e)
		if h, ok := isHelp(err); ok {
			printHelp(e.stdout, h.fs)
			return 0
		}
		switch {
		case errors.Is(err, replicator.ErrLeftBehind):
			// Even when stopped by a signal: what is left on the source must be said.
			fmt.Fprintf(e.stderr, "tidemark %s: %v\n", c.name, err)
			return 1
		case err == nil, errors.Is(err, context.Canceled):
			return 0
		case errors.Is(err, errProblems):
			return 1
		case errors.Is(err, errDiffers):
			fmt.Fprintf(e.stderr, "tidemark %s: %s\n", c.name, strings.TrimPrefix(err.Error(), errDiffers.Error()+": "))
			return 3
		case errors.Is(err, errUsage):
			// The error first, then a short hint: the whole flag list is -h's.
			fmt.Fprintf(e.stderr, "tidemark %s: %s\n", c.name, strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
			usageHint(e.stderr, c.name)
			return 2
		default:
			fmt.Fprintf(e.stderr, "tidemark %s: %v\n", c.name, err)
			return 1
		}
	}
	if m := closest(strings.TrimLeft(args[0], "-"), names); m != "" {
		fmt.Fprintf(e.stderr, "tidemark: unknown command %q; did you mean %s?\n", args[0], m)
	} else {
		fmt.Fprintf(e.stderr, "tidemark: unknown command %q\n", args[0])
	}
	fmt.Fprintln(e.stderr, "Run `tidemark -h` for the commands; docs/cli.md for more.")
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Tidemark captures every change from PostgreSQL and backfills tables while changes keep flowing.")
	fmt.Fprintln(w, "\nUsage: tidemark <command> [flags]\n\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.short)
	}
	fmt.Fprintln(w, "\nRun `tidemark <command> -h` for a command's flags. Documentation: docs/cli.md")
}

// runSecrets are the secrets a run could print: the passwords of the connection strings in
// $TIDEMARK_SOURCE, $TIDEMARK_TARGET and the arguments, and $PGPASSWORD.
func runSecrets(args []string) []string {
	var out []string
	for _, v := range []string{os.Getenv("TIDEMARK_SOURCE"), os.Getenv("TIDEMARK_TARGET")} {
		out = append(out, secret.FromDSN(v)...)
	}
	out = append(out, os.Getenv("PGPASSWORD"), os.Getenv("PGSSLPASSWORD"), os.Getenv(kafka.PasswordEnv),
		os.Getenv(nats.PasswordEnv), os.Getenv(nats.TokenEnv))
	for _, a := range args {
		if _, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(a, "-") {
			a = v
		}
		out = append(out, secret.FromDSN(a)...)
	}
	return out
}

// scrubbed is e with every secret of the run replaced in what it writes: standard error (logs,
// errors, usage), and standard output unless data is true (sync and stream write the source's
// rows there, which are not to be changed).
func (e *env) scrubbed(s *secret.Scrubber, data bool) *env {
	c := *e
	c.stderr = s.Writer(e.stderr)
	if !data {
		c.stdout = s.Writer(e.stdout)
	}
	if e.logs != nil {
		e.logs.mu.Lock()
		e.logs.scrub = s
		e.logs.mu.Unlock()
	}
	return &c
}

// newLogger logs for people on a terminal and as JSON lines otherwise.
func newLogger(w io.Writer, terminal bool) zerolog.Logger {
	if terminal {
		return zerolog.New(zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05"}).With().Timestamp().Logger().Level(zerolog.InfoLevel)
	}
	return zerolog.New(w).With().Timestamp().Logger().Level(zerolog.InfoLevel)
}
