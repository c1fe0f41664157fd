package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// TestSecondJSONLWriterRefused: a second `tidemark sync` on the same JSON lines output (a cron
// job started twice) must not touch the file while the first writes it: it used to cut the file
// back to its checkpoint before it ever found the slot busy, and the first kept writing at its own
// offset, leaving NUL bytes and lost events inside a checkpointed range.
func TestSecondJSONLWriterRefused(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 20000, 1)
	stop := workload(t, db, 21, 20000)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	args := []string{"--tables", "public.t", "--chunk-size", "500", "--quiet"}
	kill := startSync(t, db, out, args...)
	e2e.WaitFor(t, time.Minute, "the first sync checkpoints", func() bool {
		st, err := os.Stat(out + ".checkpoint")
		return err == nil && st.Size() > 0 && fileSize(out) > 100_000
	})
	_, err := runSyncTo(t, db, out, append(args, "--stop-when-caught-up")...)
	require.Error(t, err)
	require.ErrorContains(t, err, "another tidemark sync")
	time.Sleep(500 * time.Millisecond) // the first goes on writing
	kill()
	stop()
	_, err = runSyncTo(t, db, out, append(args, "--stop-when-caught-up")...)
	require.NoError(t, err)
	o := replayFile(t, out, map[string][]string{"public.t": {"id"}})
	require.Empty(t, o.Violations())
	src, err := e2e.SourceRowsJSON(context.Background(), db.DSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	require.Empty(t, e2e.Diff(o.Rows("public.t"), src))
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// TestSecondPostgresWriterRefused: a second `tidemark sync` into the same target checkpoint is
// refused before it writes anything: the first holds a lock on the target for its whole run.
func TestSecondPostgresWriterRefused(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 5000, 1)
	tgt := targetDB(t, db)
	args := []string{"--tables", "public.t", "--chunk-size", "500", "--quiet"}
	kill := startSync(t, db, tgt, args...)
	conn, err := pgxConnect(context.Background(), tgt)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	e2e.WaitFor(t, time.Minute, "the first sync checkpoints", func() bool {
		var n int
		return conn.QueryRow(context.Background(), `SELECT count(*) FROM tidemark_checkpoint`).Scan(&n) == nil && n > 0
	})
	_, err = runSyncTo(t, db, tgt, append(args, "--stop-when-caught-up")...)
	require.Error(t, err)
	require.ErrorContains(t, err, "another tidemark sync")
	// Another capture (its own slot and checkpoint) into the same target table is refused too.
	_, err = runSyncTo(t, db, tgt, append(args, "--stop-when-caught-up", "--slot", db.Slot+"_b")...)
	require.Error(t, err)
	require.ErrorContains(t, err, "another tidemark sync")
	kill()
}

// TestTargetLockFreedWithinTheWait: a sync killed a moment ago holds its target lock through a
// server process that ends only when the target notices; a restart right after waits for it
// instead of failing (CI met this between two kills of TestSyncPostgresKill9).
func TestTargetLockFreedWithinTheWait(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 100, 1)
	tgt := targetDB(t, db)
	ctx := context.Background()
	holder, err := pgxConnect(ctx, tgt)
	require.NoError(t, err)
	defer holder.Close(ctx)
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('tidemark checkpoint ' || $1, 0))`, db.Slot)
	require.NoError(t, err)
	released := make(chan error, 1)
	go func() {
		time.Sleep(3 * time.Second)
		_, err := holder.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
		released <- err
	}()
	_, err = runSyncTo(t, db, tgt, "--tables", "public.t", "--stop-when-caught-up", "--quiet")
	require.NoError(t, <-released)
	require.NoError(t, err)
}
