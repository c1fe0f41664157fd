//go:build tidemark_faults

package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/tidemark/tidemark/internal/faults"
	"github.com/tidemark/tidemark/merge"
)

// testingFlags are sync's switches of a test build (-tags tidemark_faults; testing_off.go is the
// product's): --crash-at kills the process at a point of the engine, --testing-break breaks the
// engine or a sink on purpose for the chaos harness to catch.
type testingFlags struct {
	crashAt, breakEngine *string
}

func newTestingFlags(fs *flag.FlagSet) testingFlags {
	return testingFlags{
		crashAt:     fs.String("crash-at", "", "test build: kill this process with SIGKILL at POINT:N (before-low, after-low, after-select, after-high, after-emit, after-checkpoint)"),
		breakEngine: fs.String("testing-break", "", "test build: break the engine or the sink on purpose, for the chaos harness to catch: no-guard, no-eviction, ack-ahead (the engine); checkpoint-apart (PostgreSQL target), no-truncate (JSON lines), no-fence (both)"),
	}
}

// apply sets the engine's faults and crash hooks and the sinks' breaks (only what this run's
// flags say; before a sink is opened). It returns the usage problems.
func (t testingFlags) apply(engine *merge.Faults, hooks *merge.Hooks) []string {
	faults.CheckpointApart, faults.NoTruncate, faults.NoFence = false, false, false
	var problems []string
	switch *t.breakEngine {
	case "":
	case "no-guard":
		engine.NoVisibilityGuard = true
	case "no-eviction":
		engine.NoEviction = true
	case "ack-ahead":
		engine.AckAhead = true
	case "checkpoint-apart":
		faults.CheckpointApart = true
	case "no-truncate":
		faults.NoTruncate = true
	case "no-fence":
		faults.NoFence = true
	default:
		problems = append(problems, "--testing-break must be no-guard, no-eviction, ack-ahead, checkpoint-apart, no-truncate or no-fence")
	}
	if *t.crashAt != "" {
		if err := crashHooks(hooks, *t.crashAt); err != nil {
			problems = append(problems, err.Error())
		}
	}
	return problems
}

// crashHooks kills the process with SIGKILL the Nth time the engine reaches point: a real crash,
// for the tests of recovery.
func crashHooks(h *merge.Hooks, spec string) error {
	point, nStr, ok := strings.Cut(spec, ":")
	n, err := strconv.Atoi(nStr)
	if !ok || err != nil || n < 1 {
		return fmt.Errorf("--crash-at %q: write POINT:N", spec)
	}
	var count atomic.Int64
	crash := func() {
		if count.Add(1) == int64(n) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	chunk := func(context.Context, int64) { crash() }
	switch point {
	case "before-low":
		h.BeforeLow = chunk
	case "after-low":
		h.AfterLow = chunk
	case "after-select":
		h.AfterSelect = chunk
	case "after-high":
		h.AfterHigh = chunk
	case "after-emit":
		h.AfterEmit = func(context.Context, int) { crash() }
	case "after-checkpoint":
		h.AfterCheckpoint = func(context.Context, *merge.Position) { crash() }
	default:
		return fmt.Errorf("--crash-at: unknown point %q", point)
	}
	return nil
}
