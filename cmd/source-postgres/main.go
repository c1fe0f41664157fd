package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/internal/profile"
	"github.com/tidemark/tidemark/internal/secret"
)

// version is the connector's version, set at build time (-ldflags "-X main.version=...").
var version = "0.1.0"

const usage = `Usage: source-postgres COMMAND [--config FILE] [--catalog FILE] [--state FILE]

Commands (the Airbyte protocol, v0):
  spec                                         print the connector's specification
  check    --config FILE                       test the connection and the prerequisites
  discover --config FILE                       list the streams (tables) and their schemas
  read     --config FILE --catalog FILE [--state FILE]
                                               backfill and stream the configured streams
`

// errInterrupted is the cause of a read's end by SIGTERM or SIGINT.
var errInterrupted = errors.New("interrupted by a signal")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	cctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		<-ctx.Done()
		cancel(errInterrupted)
	}()
	profile.TuneGC(os.Getenv)
	stopProfile := profile.Start(os.Getenv(profile.Env), os.Stderr)
	code := run(cctx, os.Args[1:], os.Stdout, os.Stderr)
	stopProfile()
	stop()
	os.Exit(code)
}

// args are a command's file arguments.
type args struct {
	config, catalog, state string
}

func parseArgs(list []string) (args, error) {
	var a args
	for i := 0; i < len(list); i++ {
		name, value, hasValue := cutFlag(list[i])
		var dst *string
		switch name {
		case "config":
			dst = &a.config
		case "catalog":
			dst = &a.catalog
		case "state":
			dst = &a.state
		default:
			return a, fmt.Errorf("unknown argument %q", list[i])
		}
		if !hasValue {
			if i+1 >= len(list) {
				return a, fmt.Errorf("--%s needs a file", name)
			}
			i++
			value = list[i]
		}
		*dst = value
	}
	return a, nil
}

// cutFlag splits "--name=value" or "--name" (one or two dashes).
func cutFlag(s string) (name, value string, hasValue bool) {
	if len(s) < 2 || s[0] != '-' {
		return "", "", false
	}
	s = s[1:]
	if s[0] == '-' {
		s = s[1:]
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '=' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// run runs one command and returns the exit code.
func run(ctx context.Context, argv []string, stdout, stderr io.Writer) int {
	if len(argv) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd := argv[0]
	a, err := parseArgs(argv[1:])
	out := newOutput(stdout, nil)
	log := zerolog.New(&logWriter{w: stderr, out: out}).Level(logLevel()).With().Timestamp().Str("command", cmd).Logger()
	if err != nil {
		return fail(out, log, &configError{fmt.Errorf("%s: %w", cmd, err)})
	}
	switch cmd {
	case "spec":
		if err := out.write(&message{Type: "SPEC", Spec: specJSON}); err != nil {
			fmt.Fprintln(stderr, "write spec:", err)
			return 1
		}
		return 0
	case "check", "discover", "read":
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if a.config == "" {
		return fail(out, log, configErrorf("%s needs --config FILE", cmd))
	}
	// Whatever the config's fate, its secrets never leave the process from here on.
	out.scrub = secret.New(configSecrets(a.config)...)
	cfg, err := loadConfig(a.config)
	if err != nil && cmd == "check" {
		_ = out.write(&message{Type: "CONNECTION_STATUS", ConnectionStatus: &connectionStatus{Status: "FAILED", Message: err.Error()}})
		return 0
	}
	if err != nil {
		return fail(out, log, err)
	}
	out.scrub = secret.New(append(configSecrets(a.config), cfg.secrets()...)...)
	src, err := newSource(ctx, cfg, out, log)
	if cmd == "check" {
		// A check reports every problem as a FAILED status and exits 0 (the platform's convention).
		if err == nil {
			err = src.check(ctx)
		}
		if err != nil {
			log.Warn().Err(err).Msg("check failed")
			_ = out.write(&message{Type: "CONNECTION_STATUS", ConnectionStatus: &connectionStatus{Status: "FAILED", Message: err.Error()}})
		} else {
			_ = out.write(&message{Type: "CONNECTION_STATUS", ConnectionStatus: &connectionStatus{Status: "SUCCEEDED"}})
		}
		if src != nil {
			src.close()
		}
		return 0
	}
	if err != nil {
		return fail(out, log, err)
	}
	defer src.close()
	switch cmd {
	case "discover":
		var c *catalog
		if c, err = src.discover(ctx); err == nil {
			err = out.write(&message{Type: "CATALOG", Catalog: c})
		}
	case "read":
		if a.catalog == "" {
			return fail(out, log, configErrorf("read needs --catalog FILE"))
		}
		err = src.read(ctx, a.catalog, a.state)
	}
	if err != nil {
		return fail(out, log, err)
	}
	return 0
}

// fail reports err as a TRACE ERROR (and in the log) and returns the exit code.
func fail(out *output, log zerolog.Logger, err error) int {
	ft := classify(err)
	log.Error().Err(err).Str("failure_type", ft).Msg("failed")
	out.trace(&traceMessage{Type: "ERROR", Error: &errorTrace{
		Message:         userMessage(err),
		InternalMessage: err.Error(),
		FailureType:     ft,
	}})
	_ = out.flush()
	return 1
}

// logLevel is the level of the stderr log: $LOG_LEVEL (the platform sets it), info by default.
func logLevel() zerolog.Level {
	l, err := zerolog.ParseLevel(strings.ToLower(os.Getenv("LOG_LEVEL")))
	if err != nil || l == zerolog.NoLevel {
		return zerolog.InfoLevel
	}
	return l
}
