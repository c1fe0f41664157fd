package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// tidemarkBinary builds cmd/tidemark once per test binary.
func tidemarkBinary(t *testing.T) string {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tidemark-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "tidemark")
		buildErr = e2e.GoBuild(binPath, "../cmd/tidemark", "tidemark_faults")
	})
	require.NoError(t, buildErr)
	return binPath
}

// runSync runs `tidemark sync` of public.t into out with args, and returns how it ended: nil for
// exit 0, killed for SIGKILL, an error otherwise.
func runSync(t *testing.T, db *e2e.TestDB, out string, args ...string) (killed bool, err error) {
	t.Helper()
	return runSyncTo(t, db, out, append([]string{"--tables", "public.t"}, args...)...)
}

// runSyncTo runs `tidemark sync` into to with args.
// killed reports a SIGKILL of the process (a crash point's); a run still going after syncLimit
// is an error.
func runSyncTo(t *testing.T, db *e2e.TestDB, to string, args ...string) (killed bool, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), syncLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, tidemarkBinary(t), append([]string{"sync", "--source", db.DSN, "--slot", db.Slot,
		"--publication", db.Publication, "--to", to}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = cmd.Run()
	if ctx.Err() != nil {
		// The kill of the timeout, not of a crash point: a point the run never reached (one of
		// the backfill's, after the backfill was done, say) must not pass for one it reached.
		return false, fmt.Errorf("tidemark sync %s did not end within %s (killed): %s", strings.Join(args, " "), syncLimit, lastLines(stderr.String(), 15))
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true, nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("%w: %s", err, lastLines(stderr.String(), 15))
	}
	return false, nil
}

// syncLimit bounds a run of runSyncTo.
const syncLimit = 3 * time.Minute

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// replayFile parses a sync output file up to its checkpoint and replays it through an oracle.
func replayFile(t *testing.T, path string, keys map[string][]string) *e2e.Oracle {
	t.Helper()
	b, err := os.ReadFile(path + ".checkpoint")
	require.NoError(t, err)
	var cp struct{ Offset int64 }
	require.NoError(t, json.Unmarshal(b, &cp))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	recs, err := e2e.ParseJSONL(io.LimitReader(f, cp.Offset), keys)
	require.NoError(t, err)
	o := e2e.NewOracle("ver")
	for _, r := range recs {
		o.Apply(r)
	}
	return o
}

// TestCrashPoints kills a real `tidemark sync` process with SIGKILL at each crash point of a
// chunk's protocol (before and after the low watermark, after the select, after the high
// watermark, after an emit, after a checkpoint) while a workload with large transactions runs, restarts it from its
// durable checkpoint each time, and checks that the output replays to the source with no key ever
// going back to an older version. The output file is cut back to its checkpoint on every
// restart, so it holds no duplicate from a replay.
func TestCrashPoints(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 20000, 1)
	stop := workload(t, db, 7, 20000)
	big := db.Connect()
	stopBig := background(t, func(ctx context.Context) {
		for ctx.Err() == nil {
			// Large transactions span several writes of the output: a crash can land inside one.
			_, _ = big.Exec(ctx, `UPDATE t SET v = 'big', ver = nextval('ver') WHERE id % 7 = 3 AND id < 8000`)
			time.Sleep(300 * time.Millisecond)
		}
	})
	out := filepath.Join(t.TempDir(), "out.jsonl")
	// The backfill's points first: each of those runs ends within its first three chunks (at
	// most 500 + 1,000 + 2,000 rows, chunks growing from --chunk-size on quiet windows), so the
	// 20,000 rows cannot all be read before them (a point never reached fails the run, see
	// runSyncTo); emits and checkpoints come from the stream too.
	points := []string{"before-low:3", "after-low:3", "after-select:3", "after-high:3", "after-high:1", "after-emit:40", "after-checkpoint:4", "after-emit:7"}
	for _, p := range points {
		start := time.Now()
		killed, err := runSync(t, db, out, "--chunk-size", "500", "--crash-at", p)
		require.NoError(t, err, "crash point %s", p)
		require.True(t, killed, "the process reached crash point %s", p)
		ran := time.Since(start)
		rows := replayFile(t, out, map[string][]string{"public.t": {"id"}})
		require.Empty(t, rows.Violations(), "after a crash at %s", p)
		t.Logf("crash point %s: the sync ran %s, the replay of %d records %s", p, ran.Round(time.Millisecond), rows.Records(), (time.Since(start) - ran).Round(time.Millisecond))
	}
	stop()
	stopBig()
	killed, err := runSync(t, db, out, "--chunk-size", "500", "--stop-when-caught-up")
	require.NoError(t, err)
	require.False(t, killed)
	o := replayFile(t, out, map[string][]string{"public.t": {"id"}})
	src, err := e2e.SourceRowsJSON(context.Background(), db.DSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	require.Empty(t, e2e.Diff(o.Rows("public.t"), src))
	require.Empty(t, o.Violations())
	t.Logf("%d records, %d duplicates", o.Records(), o.Duplicates())
}

// TestResumeFromOlderCheckpoint: a checkpoint older than what the slot was confirmed to
// (the newer one was lost) is refused with the slot's and the position's LSNs.
func TestResumeFromOlderCheckpoint(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 3000, 1)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	killed, err := runSync(t, db, out, "--chunk-size", "500", "--crash-at", "after-checkpoint:2")
	require.NoError(t, err)
	require.True(t, killed)
	old, err := os.ReadFile(out + ".checkpoint")
	require.NoError(t, err)
	db.Exec(fmt.Sprintf(upd, "later", 10))
	_, err = runSync(t, db, out, "--chunk-size", "500", "--stop-when-caught-up")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(out+".checkpoint", old, 0o644))
	_, err = runSync(t, db, out, "--stop-when-caught-up")
	require.Error(t, err)
	require.Contains(t, err.Error(), "position is behind the replication slot")
	require.Contains(t, err.Error(), fmt.Sprintf("slot %q is confirmed up to", db.Slot))
	require.Contains(t, err.Error(), "start over with a full backfill")
}

func pgxConnect(ctx context.Context, dsn string) (*pgx.Conn, error) { return pgx.Connect(ctx, dsn) }
