package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tidemark/tidemark/chaos"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/merge"
)

// runChaos runs the chaos harness (chaos) in one mode or all, and prints a report per mode;
// any violation makes the exit code 1.
func runChaos(ctx context.Context, args []string, e *env) error {
	fs := newFlags("chaos", "chaos [--mode jsonl|postgres|airbyte|kafka|nats|all] [--seed N] [--duration 10m] [flags]", e)
	mode := fs.String("mode", "all", "what captures: jsonl (tidemark sync to a file), postgres (tidemark sync to PostgreSQL), airbyte (the connector in sync rounds), kafka (tidemark sync to Kafka: needs --kafka), nats (tidemark sync to NATS JetStream: needs --nats), or all (kafka and nats too when --kafka and --nats are given)")
	kafkaBrokers := fs.String("kafka", "", "kafka mode: the brokers of a Kafka cluster to write to (HOST:PORT,...); each run writes topics of a prefix of its own (tidemark_chaos_SEED_ID.*), which it leaves behind")
	natsServers := fs.String("nats", "", "nats mode: the servers of a NATS cluster with JetStream to write to (HOST:PORT,...); each run writes a stream of its own (tidemark_chaos_SEED_ID) and its bucket, which it leaves behind")
	natsReplicas := fs.Int("nats-replicas", 1, "nats mode: the replicas of the run's stream (3 on a cluster of three or more)")
	seed := fs.Uint64("seed", 0, "the seed of the workload and the fault schedule; 0: a random one, printed")
	duration := fs.Duration("duration", time.Minute, "how long the workload runs under faults, per mode")
	every := fs.Duration("fault-every", 3*time.Second, "mean time between faults")
	faults := fs.String("faults", "", "the faults, comma-separated: families ("+strings.Join(chaos.FaultFamilies(), ", ")+") or kinds ("+strings.Join(chaos.FaultKinds(), ", ")+"); default: the default family")
	inTurn := fs.Bool("in-turn", false, "take the faults in turn, in the order --faults lists them, instead of drawing them by weight; the run goes past --duration (up to five times it more, plus the time faults without effect took, eight times it at most) until each took effect once")
	source := fs.String("source", "", "a staging database to run against (each run uses only a schema, slot and publication of its own, named tidemark_chaos_SEED_ID); default a throwaway PostgreSQL")
	target := fs.String("target", "", "postgres mode: the database to write to; default a second database of the throwaway PostgreSQL")
	rows := fs.Int("rows", 20000, "rows of the main table before the run (backfilled under the faults)")
	chunk := fs.Int("chunk-size", 1000, "backfill chunk size")
	connector := fs.String("connector", "", "airbyte mode: the source-postgres binary; default beside this one, on the PATH, or built with go")
	dir := fs.String("dir", "", "where the run's files go; default a temporary directory, kept when a run fails")
	keep := fs.Bool("keep", false, "keep the scratch schema, slot and publication of a staging database")
	breakEngine := fs.String("break", "", "test build only (-tags tidemark_faults): break the capture on purpose ("+strings.Join(chaos.Breaks(), ", ")+") to see the harness catch it; without --faults, with the faults that provoke it")
	maxChunkBytes := fs.Int("max-chunk-bytes", 256<<10, "the capture's bound on the bytes of a chunk (the workload writes values above it now and then)")
	watermarks := fs.String("watermarks", "", "the capture's watermark transport: message or table; default drawn from the seed")
	rate := fs.Int("rate", 0, "bound the workload to this many transactions per second (0: as many as the server takes)")
	readers := fs.Int("readers", 0, "tables the capture backfills at once (sync --readers, the connector's backfill_readers); 0: drawn from the seed, 1 to 3")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := usageProblems(fs, outOfRange(durationRange("duration", *duration, time.Second, 30*24*time.Hour),
		durationRange("fault-every", *every, 10*time.Millisecond, time.Hour),
		intRange("rows", *rows, 1, 100_000_000), intRange("chunk-size", *chunk, 1, 1_000_000),
		intRange("max-chunk-bytes", *maxChunkBytes, 1<<10, 1<<30), intRange("readers", *readers, 0, merge.MaxReaders),
		intRange("nats-replicas", *natsReplicas, 1, 5), intRange("rate", *rate, 0, 1_000_000))); err != nil {
		return err
	}
	if *breakEngine != "" && !merge.FaultsBuilt {
		return fmt.Errorf("%w: --break needs a test build of tidemark, whose sync has the switches that break the capture: go build -tags tidemark_faults ./cmd/tidemark (the product has none)", errUsage)
	}
	modes := []chaos.Mode{chaos.JSONL, chaos.Postgres, chaos.Airbyte}
	switch *mode {
	case "all":
		if *breakEngine != "" {
			modes = chaos.BreakModes(*breakEngine)
		}
		if *kafkaBrokers != "" && *breakEngine == "" {
			modes = append(modes, chaos.Kafka)
		}
		if *natsServers != "" && *breakEngine == "" {
			modes = append(modes, chaos.NATS)
		}
	case "jsonl", "postgres", "airbyte":
		modes = []chaos.Mode{chaos.Mode(*mode)}
	case "kafka":
		if *kafkaBrokers == "" {
			return fmt.Errorf("%w: --mode kafka needs a Kafka cluster to write to: --kafka with its brokers (HOST:PORT, comma-separated)", errUsage)
		}
		modes = []chaos.Mode{chaos.Kafka}
	case "nats":
		if *natsServers == "" {
			return fmt.Errorf("%w: --mode nats needs a NATS cluster with JetStream to write to: --nats with its servers (HOST:PORT, comma-separated)", errUsage)
		}
		modes = []chaos.Mode{chaos.NATS}
	default:
		return fmt.Errorf("%w: --mode must be jsonl, postgres, airbyte, kafka, nats or all", errUsage)
	}
	// A staging database's connection strings get the sslmode rule of every other command.
	for _, dsn := range []*string{source, target} {
		if *dsn == "" {
			continue
		}
		var err error
		if *dsn, _, err = pgconf.DefaultSSLMode(*dsn); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
	}
	if *seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		*seed = binary.LittleEndian.Uint64(b[:])%1_000_000_000 + 1
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	faultList := splitList(*faults)
	if *breakEngine != "" && len(faultList) == 0 {
		faultList = chaos.BreakFaults(*breakEngine)
	}
	failed := false
	for _, m := range modes {
		cfg := chaos.Config{Mode: m, Seed: *seed, Duration: *duration, FaultEvery: *every, Source: *source, Target: *target,
			Tidemark: self, Rows: *rows, Faults: faultList, InTurn: *inTurn, ChunkSize: *chunk, Break: *breakEngine, Keep: *keep, Log: e.log,
			MaxChunkBytes: *maxChunkBytes, Watermarks: *watermarks, Readers: *readers, Rate: *rate}
		if m == chaos.Kafka {
			cfg.Kafka = strings.Split(*kafkaBrokers, ",")
		}
		if m == chaos.NATS {
			cfg.NATS, cfg.NATSReplicas = strings.Split(*natsServers, ","), *natsReplicas
		}
		if *dir != "" {
			cfg.Dir = filepath.Join(*dir, string(m))
			if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
				return err
			}
		}
		if m == chaos.Airbyte {
			if cfg.Connector, err = findConnector(ctx, *connector, self, *breakEngine != ""); err != nil {
				return err
			}
		}
		rep, err := chaos.Run(ctx, cfg)
		if rep != nil {
			rep.Write(e.stdout)
			failed = failed || !rep.OK()
		}
		if err != nil {
			return err
		}
	}
	if failed {
		return fmt.Errorf("%w: the harness found violations (replay with --seed %d)", errProblems, *seed)
	}
	return nil
}

// findConnector finds the source-postgres binary: the flag, beside this binary, on the PATH, or
// built from the module this command runs in.
func findConnector(ctx context.Context, flag, self string, broken bool) (string, error) {
	if flag != "" {
		return flag, nil
	}
	// A broken capture (--break) needs a connector of a test build: one found beside this binary
	// or on the PATH may be the product's, which refuses the break; build it instead.
	if !broken {
		if p := filepath.Join(filepath.Dir(self), "source-postgres"); isExecutable(p) {
			return p, nil
		}
		if p, err := exec.LookPath("source-postgres"); err == nil {
			return p, nil
		}
	}
	// In the repository (go run, go test): build it, as this binary was built (a test build's
	// apart from the product's, so that two runs do not overwrite each other's).
	dir, _ := os.Getwd()
	for ; dir != filepath.Dir(dir); dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "cmd", "source-postgres", "main.go")); err != nil {
			continue
		}
		out := filepath.Join(os.TempDir(), "tidemark-source-postgres")
		args := []string{"build", "-o", out, "./cmd/source-postgres"}
		if merge.FaultsBuilt {
			out += "-faults"
			args = []string{"build", "-tags", "tidemark_faults", "-o", out, "./cmd/source-postgres"}
		}
		build := exec.CommandContext(ctx, "go", args...)
		build.Dir = dir
		if b, err := build.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build the connector: %v: %s", err, strings.TrimSpace(string(b)))
		}
		return out, nil
	}
	if broken {
		return "", errors.New("--break needs a test build of the source-postgres connector: give --connector (go build -tags tidemark_faults ./cmd/source-postgres), or run inside the repository")
	}
	return "", errors.New("the source-postgres binary is needed: give --connector, or run inside the repository")
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
