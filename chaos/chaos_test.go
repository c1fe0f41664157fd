package chaos_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chaos"
	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgserver"
	"github.com/tidemark/tidemark/sink/kafka"
)

// Each run starts its own PostgreSQL (the faults restart and reconfigure it), so the runs go in
// parallel. With TIDEMARK_TEST_DSN set, they run against that server instead, without the
// faults that change the server.

var tidemarkBin, connectorBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tidemark-chaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tidemarkBin, connectorBin = filepath.Join(dir, "tidemark"), filepath.Join(dir, "source-postgres")
	if _, err := exec.LookPath("go"); err != nil {
		fmt.Fprintln(os.Stderr, "the chaos tests build the binaries with the go command:", err)
		os.Exit(1)
	}
	for bin, pkg := range map[string]string{tidemarkBin: "../cmd/tidemark", connectorBin: "../cmd/source-postgres"} {
		if err := e2e.GoBuild(bin, pkg, "tidemark_faults"); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", pkg, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// config is a short run of mode.
func config(t *testing.T, mode chaos.Mode, seed uint64) chaos.Config {
	if os.Getenv(e2e.EnvDSN) == "" {
		if _, err := pgserver.FindBinDir(); err != nil && !e2e.InCI() {
			t.Skipf("no PostgreSQL server binaries (%v) and no %s", err, e2e.EnvDSN)
		}
	}
	// Warnings go to the test's log; every event (the faults, the stops, the remedies, with
	// their times) to the run's harness.log, which the test prints when the run finds a
	// violation: a CI failure carries its own timeline.
	dir := t.TempDir()
	f, err := os.Create(dir + harnessLog) // beside the run's directory, which must start empty
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	w := zerolog.MultiLevelWriter(
		&zerolog.FilteredLevelWriter{Writer: zerolog.LevelWriterAdapter{Writer: zerolog.NewTestWriter(t)}, Level: zerolog.WarnLevel},
		zerolog.LevelWriterAdapter{Writer: f})
	cfg := chaos.Config{Mode: mode, Seed: seed, Duration: 25 * time.Second, FaultEvery: 2 * time.Second,
		Source: os.Getenv(e2e.EnvDSN), Tidemark: tidemarkBin, Connector: connectorBin, Dir: dir,
		Log: zerolog.New(w).Level(zerolog.InfoLevel).With().Timestamp().Logger()}
	if mode == chaos.Kafka {
		var addr kafka.Address
		addr, cfg.BrokerFault = e2e.KafkaWithFaults(t)
		cfg.Kafka = addr.Brokers
	}
	if mode == chaos.NATS {
		addr, c := e2e.NATS(t)
		cfg.NATS, cfg.NATSReplicas = addr.Servers, 3
		if c != nil {
			cfg.NodeFault = c.Fault
		}
	}
	return cfg
}

// harnessLog ends the name of the file, beside a run's directory, of every event the harness
// logged.
const harnessLog = ".harness.log"

// logTimeline prints the harness's events and the run's journal (the faults, the capture's runs
// and how they ended) of a run that found a violation (the last 400 lines of each). A run
// given a new directory (another seed) logs on into the file of its configuration's first.
func logTimeline(t *testing.T, cfg chaos.Config) {
	path := cfg.Dir + harnessLog
	if _, err := os.Stat(path); err != nil {
		if m, _ := filepath.Glob(filepath.Join(filepath.Dir(cfg.Dir), "*"+harnessLog)); len(m) > 0 {
			path = m[0]
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Logf("%s seed %d: no timeline: %v", cfg.Mode, cfg.Seed, err)
		return
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 400 {
		lines = lines[len(lines)-400:]
	}
	t.Logf("%s seed %d: the harness's events (%s):\n%s", cfg.Mode, cfg.Seed, harnessLog, strings.Join(lines, "\n"))
	if b, err := os.ReadFile(filepath.Join(cfg.Dir, "journal.log")); err == nil {
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 400 {
			lines = lines[len(lines)-400:]
		}
		t.Logf("%s seed %d: the run's journal:\n%s", cfg.Mode, cfg.Seed, strings.Join(lines, "\n"))
	}
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])%1_000_000_000 + 1
}

// concurrently runs the configurations at the same time (each with its own PostgreSQL; the
// test runner would run only GOMAXPROCS parallel subtests at once) and returns their reports.
func concurrently(t *testing.T, cfgs []chaos.Config) []*chaos.Report {
	reps := make([]*chaos.Report, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Go(func() {
			reps[i], errs[i] = chaos.Run(context.Background(), cfg)
		})
	}
	wg.Wait()
	for i, rep := range reps {
		require.NoError(t, errs[i], "%s seed %d", cfgs[i].Mode, cfgs[i].Seed)
		var b bytes.Buffer
		rep.Write(&b)
		t.Log("\n" + b.String())
		if len(rep.Violations) > 0 {
			logTimeline(t, cfgs[i])
		}
	}
	return reps
}

// TestChaos runs each mode under the default, fence and target faults for a random seed
// (printed: replay it with tidemark chaos --mode M --seed N --rate 50, the bound of suiteRate) and, in the long run
// (TIDEMARK_TEST_LONG=1), a fixed one too; the oracle finds nothing wrong.
func TestChaos(t *testing.T) {
	random := randomSeed()
	t.Logf("random seed %d", random)
	seeds := []uint64{random}
	if e2e.Long() {
		seeds = []uint64{1, random}
	}
	for _, seed := range seeds {
		var cfgs []chaos.Config
		for _, mode := range []chaos.Mode{chaos.JSONL, chaos.Postgres, chaos.Airbyte, chaos.Kafka, chaos.NATS} {
			cfg := config(t, mode, seed)
			// Three readers: the tables are backfilled at once, each by a reader of its own.
			cfg.Faults, cfg.Readers, cfg.Rate = []string{"default", "fence", "target"}, 3, suiteRate()
			if mode == chaos.Kafka || mode == chaos.NATS {
				// A minute: the broker or node faults (in the default family) come on top of the
				// others.
				cfg.Duration = time.Minute
			}
			cfgs = append(cfgs, cfg)
		}
		for _, rep := range concurrently(t, cfgs) {
			require.True(t, rep.OK(), "%s seed %d: %s", rep.Mode, seed, strings.Join(rep.Violations, "\n"))
			require.Greater(t, rep.Transactions, int64(500), "the workload ran")
			requirePaced(t, rep, suiteRate())
			// Restarted by the supervisor (killed, or stopped), or by itself from its checkpoint
			// (a database restart or a network fault: tidemark sync reconnects), when the draw
			// held a fault that ends the capture's connection or process: a short run may draw
			// only stalls and slow consumers (one CI run: 5 faults, none of them).
			if ended := endingFaults(rep); ended > 0 {
				require.Greater(t, rep.Starts+rep.Reconnects, 1, "the capture was restarted (%d faults ended it)", ended)
			}
			require.NotEmpty(t, rep.Faults)
		}
	}
}

// suiteRate is the bound on the workload of TestChaos's and TestChaosDDL's runs (transactions
// per second, Config.Rate): 50 in a default run, none in the long run (TIDEMARK_TEST_LONG=1).
// Unbounded, a run's workload takes what the machine gives, and every stage (the server, the
// capture, the target, the oracle) follows it: on this suite's two cores the eight runs of both
// tests cost about 400 CPU seconds, a third of the whole test run, and their cost grew with the
// machine's speed. At 50 a run still writes 1,000 to 2,800 transactions (500 are required). The
// breaks (TestChaosCatchesBrokenEngines) and the runs of docs/chaos.md are not bounded.
func suiteRate() int {
	if e2e.Long() {
		return 0
	}
	return 50
}

// requirePaced fails a run whose workload went faster than suiteRate over the time it ran (plus
// one transaction in flight per connection): the pacer is what keeps the suite's cost.
func requirePaced(t *testing.T, rep *chaos.Report, rate int) {
	t.Helper()
	if rate == 0 {
		return
	}
	require.Positive(t, rep.WorkloadTime)
	require.LessOrEqual(t, rep.Transactions, int64(float64(rate)*rep.WorkloadTime.Seconds())+3,
		"%s: the workload ran faster than --rate %d (%d transactions in %s)", rep.Mode, rate, rep.Transactions, rep.WorkloadTime)
}

// endingFaults counts the effective faults of rep that end the capture's process or its source
// connection (a kill, a restart of the source, its walsender ended, the proxy's connections
// dropped or reset).
func endingFaults(rep *chaos.Report) int {
	n := 0
	for _, k := range []string{"kill", "restart", "walsender", "drop", "reset"} {
		n += rep.Faults[k] - rep.Void[k]
	}
	return n
}

// TestChaosDDL runs each mode under the schema and operations faults (the ddl family: renames,
// columns, replica identities, the publication, TRUNCATE, a column's values rewritten by ALTER
// COLUMN ... TYPE ... USING, the publish option narrowed, a table UNLOGGED and LOGGED again under
// a schema publication, a re-backfill asked of the running sync, a commit kept invisible across a
// restart of the capture, a restore of the source to an earlier point), taken in turn so that
// a short run meets each, with a random seed (printed). The capture follows each change or stops
// with an error naming its cause; the harness checks the cause, applies the remedy the error
// gives, and the run goes on; the oracle finds the output equal to the source. A stop that names
// no cause, or one no fault explains, or a difference, fails it.
func TestChaosDDL(t *testing.T) {
	// Not beside TestChaosCatchesBrokenEngines: its restores (base backups of three servers) slowed
	// the no-eviction runs beside them so much that they met no chunk window (one .ci/run).
	seed := randomSeed()
	// The turns in an order drawn from the seed; standby-restart last: it waits (up to 20 s) for
	// a checkpoint past its held commit. (An identity fault right before a restore once led to a
	// loop of stops: a first run killed before its first checkpoint left changes that cannot be
	// placed in the slot, and a re-backfill without a position was dropped; fixed, see
	// TestRebackfillWithoutPosition.)
	turns := []string{"restore", "identity", "publication", "rename", "truncate", "rewrite", "column", "rebackfill", "publish", "persist"}
	order := mrand.New(mrand.NewPCG(seed, seed))
	order.Shuffle(len(turns), func(i, j int) { turns[i], turns[j] = turns[j], turns[i] })
	turns = append(turns, "standby-restart")
	t.Logf("seed %d; replay with tidemark chaos --mode M --seed %d --faults %s --in-turn --duration 30s --fault-every 2s --rate %d", seed, seed, strings.Join(turns, ","), suiteRate())
	var cfgs []chaos.Config
	for _, mode := range []chaos.Mode{chaos.JSONL, chaos.Postgres, chaos.Airbyte} {
		cfg := config(t, mode, seed)
		cfg.Faults, cfg.InTurn, cfg.Duration, cfg.Rate = turns, true, 30*time.Second, suiteRate()
		cfgs = append(cfgs, cfg)
	}
	for i, rep := range concurrently(t, cfgs) {
		require.True(t, rep.OK(), "%s seed %d: %s", rep.Mode, seed, strings.Join(rep.Violations, "\n"))
		require.Greater(t, rep.Transactions, int64(500), "the workload ran")
		requirePaced(t, rep, cfgs[i].Rate)
		effective := func(kind string) int { return rep.Faults[kind] - rep.Void[kind] }
		kinds := []string{"identity", "publication", "rename", "truncate", "rewrite", "column", "persist"}
		if rep.Mode != chaos.Airbyte {
			kinds = append(kinds, "rebackfill", "publish") // tidemark rebackfill asks a running sync; publish: a sync's stop and remedy
		}
		for _, kind := range kinds {
			require.Positive(t, effective(kind), "%s: the %s fault took effect", rep.Mode, kind)
		}
		if cfgs[i].Source == "" {
			// A restore always leaves the capture a checkpoint of a history the server no longer
			// has: it must have stopped on it.
			require.Positive(t, effective("restore"), "%s: the source was restored", rep.Mode)
			require.Positive(t, rep.Stops["restore"], "%s: the capture refused its checkpoint after the restore", rep.Mode)
		}
		stops := 0
		for _, n := range rep.Stops {
			stops += n
		}
		require.Positive(t, stops, "%s: the capture stopped on a fault's cause, and went on after the remedy", rep.Mode)
	}
}

// defaultBreakMode is the mode each break runs in by default: every mode meets one, and the
// package stays within its budget (README). The long run (TIDEMARK_TEST_LONG=1) runs every break
// in every mode it applies to.
var defaultBreakMode = map[string]chaos.Mode{
	"no-eviction": chaos.JSONL, "ack-ahead": chaos.Postgres, "no-guard": chaos.Airbyte,
	"checkpoint-apart": chaos.Postgres, "no-truncate": chaos.JSONL, "no-fence": chaos.Postgres,
}

// TestChaosCatchesBrokenEngines: the harness is only worth something if it fails a broken
// capture. Each break (chaos.Breaks: the engine's, and the sinks' checkpoint committed apart from
// its data, a resume without cutting the output, no fence) is run under the faults that provoke
// it, in one mode by default (defaultBreakMode) and in each mode it applies to in the long run,
// and must be reported with a violation it can cause (a run that merely failed, which a crash
// would also do, is not enough). A default run checks drawnBreaks of them, drawn at random (the
// others skip, saying so). Run one with TIDEMARK_CHAOS_BREAKS=BREAK and -run
// 'TestChaosCatchesBrokenEngines/MODE/BREAK' (with TIDEMARK_TEST_LONG=1 for a mode not run by
// default).
func TestChaosCatchesBrokenEngines(t *testing.T) {
	t.Parallel()
	drawn := drawBreaks(t)
	for _, name := range chaos.Breaks() {
		mode, ok := defaultBreakMode[name]
		require.True(t, ok, "break %s has no default mode", name)
		require.Contains(t, chaos.BreakModes(name), mode, "break %s", name)
		for _, mode := range chaos.BreakModes(name) {
			if !e2e.Long() && mode != defaultBreakMode[name] {
				continue
			}
			t.Run(string(mode)+"/"+name, func(t *testing.T) {
				if !drawn[name] {
					t.Skipf("not drawn this run (each run draws %d of the %d breaks); run it with %s=%s, every one with %s=all or %s=1",
						drawnBreaks, len(chaos.Breaks()), envBreaks, name, envBreaks, e2e.EnvLong)
				}
				if mode != chaos.Postgres || name != "no-eviction" {
					// That one runs first, alone (see below): a capture slowed by the runs
					// beside it applies more source time per target transaction, which
					// folds more stale rows away.
					t.Parallel()
				}
				cfg := config(t, mode, 5)
				if name == "no-guard" && cfg.Source != "" {
					msg := "not run against " + e2e.EnvDSN + ": no-guard needs a server the harness starts (it sets synchronous_standby_names)"
					if e2e.InCI() {
						t.Fatal("CI runs every test: " + msg)
					}
					t.Skip("SKIPPED, " + msg)
				}
				// One reader: the seeds and rates below were found with one (readers drawn from
				// the seed would change which windows the faults meet).
				cfg.Break, cfg.Faults, cfg.Readers = name, chaos.BreakFaults(name), 1
				switch name {
				case "no-eviction", "no-guard":
					// A long backfill: stalled connections (or commits held invisible) meet
					// chunks' windows.
					cfg.Rows = 100000
					cfg.FaultEvery = time.Second
					if mode == chaos.Postgres && name == "no-eviction" {
						// A stale chunk row is rarer here: the target applies a key's changes
						// between two checkpoints as one, and a later change of the key in the
						// same target transaction hides the stale row (it never reaches the
						// target); the harness checks each row a target transaction leaves
						// against the source transactions applied with it. More windows.
						cfg.Duration, cfg.FaultEvery = time.Minute, 700*time.Millisecond
					}
				default:
					cfg.FaultEvery = 1500 * time.Millisecond
				}
				rep := concurrently(t, []chaos.Config{cfg})[0]
				// A break shows only when a fault meets its moment: no-eviction's stale rows need a
				// stall to meet a chunk's window (PostgreSQL: and to be left at a target
				// checkpoint), most runs find some (1 to 41 seen), not all; checkpoint-apart's
				// loss needs a kill or a dropped connection between the checkpoint's commit and its
				// changes', and a CI run's seven kills all missed that gap. Up to four more seeds;
				// the harness must catch it in one. (A loaded CI run once had seeds 5 to 7 all miss
				// no-eviction in jsonl mode, the capture 8-25 s behind the workload; seed 5 alone
				// catches it.)
				for seed := uint64(6); len(chaos.BreakCaught(name, rep.Violations)) == 0 && seed <= 9; seed++ {
					t.Logf("seed %d found nothing wrong; seed %d", cfg.Seed, seed)
					cfg.Seed, cfg.Dir = seed, t.TempDir()
					rep = concurrently(t, []chaos.Config{cfg})[0]
				}
				caught := chaos.BreakCaught(name, rep.Violations)
				require.NotEmpty(t, caught, "%s, %s: the harness must catch the broken capture with a violation it can cause (%s); got:\n%s",
					name, mode, strings.Join(chaos.BreakCauses(name), " "), strings.Join(rep.Violations, "\n"))
				t.Logf("caught: %s", caught[0])
			})
		}
	}
}

// envBreaks names the breaks TestChaosCatchesBrokenEngines runs (comma-separated, or all).
const envBreaks = "TIDEMARK_CHAOS_BREAKS"

// drawnBreaks is how many of the breaks a default run draws: each run takes a minute of the
// package's time (two at a time, the test runner's limit here), the six of them three, which
// kept the test run over its time budget. A break proves the harness, not the engine, and
// every one comes round in turn; the long run (TIDEMARK_TEST_LONG=1) runs them all.
const drawnBreaks = 2

// drawBreaks returns the breaks this run checks: those $TIDEMARK_CHAOS_BREAKS names, every one
// in the long run, else drawnBreaks at random (logged).
func drawBreaks(t *testing.T) map[string]bool {
	drawn := map[string]bool{}
	names := chaos.Breaks()
	switch env := os.Getenv(envBreaks); {
	case env == "all" || e2e.Long():
		for _, n := range names {
			drawn[n] = true
		}
	case env != "":
		for _, n := range strings.Split(env, ",") {
			require.Contains(t, names, n, "%s names a break that does not exist", envBreaks)
			drawn[n] = true
		}
	default:
		seed := randomSeed()
		order := mrand.New(mrand.NewPCG(seed, seed))
		names = slices.Clone(names)
		order.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		for _, n := range names[:drawnBreaks] {
			drawn[n] = true
		}
		t.Logf("breaks drawn this run: %s (%s=NAME,... or all runs others)", strings.Join(names[:drawnBreaks], ", "), envBreaks)
	}
	return drawn
}

// TestChaosNATSLong runs the nats mode for $TIDEMARK_CHAOS_NATS (a duration, 10m say) under
// every family that applies to it, JetStream nodes killed included (a cluster of three, the
// stream with three replicas), with the seed $TIDEMARK_CHAOS_SEED (default random): the long run
// of docs/chaos.md. Without the variable it does not run: TestChaos runs the mode for a minute.
func TestChaosNATSLong(t *testing.T) { longRun(t, chaos.NATS, "TIDEMARK_CHAOS_NATS") }

// TestChaosKafkaLong runs the kafka mode for $TIDEMARK_CHAOS_KAFKA (a duration, 10m say) under
// every family that applies to it, the in-process cluster's broker faults included, with the
// seed $TIDEMARK_CHAOS_SEED (default random): the long run of docs/chaos.md. Without the
// variable it does not run: TestChaos runs the mode for a minute.
func TestChaosKafkaLong(t *testing.T) { longRun(t, chaos.Kafka, "TIDEMARK_CHAOS_KAFKA") }

// longRun runs mode for the duration $env gives, under the default, ddl and target families.
func longRun(t *testing.T, mode chaos.Mode, env string) {
	d, err := time.ParseDuration(os.Getenv(env))
	if err != nil || d <= 0 {
		t.Skipf("a long run, asked for with %s=10m", env)
	}
	seed := randomSeed()
	if v, err := strconv.ParseUint(os.Getenv("TIDEMARK_CHAOS_SEED"), 10, 64); err == nil && v > 0 {
		seed = v
	}
	cfg := config(t, mode, seed)
	cfg.Duration, cfg.Readers, cfg.FaultEvery = d, 3, 3*time.Second
	cfg.Faults = []string{"default", "ddl", "target"}
	for _, rep := range concurrently(t, []chaos.Config{cfg}) {
		require.True(t, rep.OK(), "%s seed %d: %s", mode, seed, strings.Join(rep.Violations, "\n"))
	}
}
