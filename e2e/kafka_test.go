package e2e_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// TestKafkaCrashPoints is TestCrashPoints with a Kafka output: `tidemark sync --to kafka://`
// killed with SIGKILL at each crash point of a chunk's protocol while a workload with large
// transactions runs, and started again. Whatever it wrote after its last checkpoint is in a
// transaction that the next run's producer aborts (its epoch fences the dead one's), so a
// read_committed consumer sees each change once; the topics replay to the source.
func TestKafkaCrashPoints(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	addr := e2e.Kafka(t)
	url := e2e.KafkaURL(addr)
	versionedTable(t, db, 20000, 1)
	stop := workload(t, db, 11, 20000)
	big := db.Connect()
	stopBig := background(t, func(ctx context.Context) {
		for ctx.Err() == nil {
			_, _ = big.Exec(ctx, `UPDATE t SET v = 'big', ver = nextval('ver') WHERE id % 7 = 3 AND id < 8000`)
			time.Sleep(300 * time.Millisecond)
		}
	})
	keys := map[string][]string{"public.t": {"id"}}
	for _, p := range []string{"before-low:3", "after-select:3", "after-high:3", "after-emit:40", "after-checkpoint:4", "after-emit:7"} {
		killed, err := runSync(t, db, url, "--chunk-size", "500", "--kafka-partitions", "3", "--crash-at", p)
		require.NoError(t, err, "crash point %s", p)
		require.True(t, killed, "the process reached crash point %s", p)
		require.Empty(t, e2e.ReplayKafka(t, addr, keys).Violations(), "after a crash at %s", p)
	}
	stop()
	stopBig()
	killed, err := runSync(t, db, url, "--chunk-size", "500", "--stop-when-caught-up")
	require.NoError(t, err)
	require.False(t, killed)
	o := e2e.ReplayKafka(t, addr, keys)
	src, err := e2e.SourceRowsJSON(context.Background(), db.DSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	require.Empty(t, e2e.Diff(o.Rows("public.t"), src))
	require.Empty(t, o.Violations())
	t.Logf("%d records, %d duplicates", o.Records(), o.Duplicates())
	// tidemark status reads the output's checkpoint.
	status, err := exec.Command(tidemarkBinary(t), "status", "--source", db.DSN, "--slot", db.Slot, "--kafka", url).CombinedOutput()
	require.NoError(t, err, "%s", status)
	require.Regexp(t, `checkpoint \(kafka://[^)]*, [0-9]+s ago\): position [0-9A-F]+/[0-9A-F]+`, string(status))
	require.Contains(t, string(status), "public.t")
}

// TestKafkaSecondSync: a second `tidemark sync` of the same slot into the same prefix is
// refused before it touches the output (the slot is in use), and the first goes on.
func TestKafkaSecondSync(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	addr := e2e.Kafka(t)
	url := e2e.KafkaURL(addr)
	versionedTable(t, db, 2000, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := exec.CommandContext(ctx, tidemarkBinary(t), "sync", "--source", db.DSN, "--slot", db.Slot,
		"--publication", db.Publication, "--to", url, "--tables", "public.t", "--quiet", "--control", filepath.Join(t.TempDir(), "ctl"))
	var firstErr e2e.SyncBuffer
	first.Stderr = &firstErr
	require.NoError(t, first.Start())
	defer func() { _ = first.Process.Kill(); _ = first.Wait() }()
	e2e.WaitFor(t, time.Minute, "the first sync's backfill", func() bool {
		return len(e2e.ReplayKafka(t, addr, map[string][]string{"public.t": {"id"}}).Rows("public.t")) == 2000
	})
	_, err := runSync(t, db, url, "--stop-when-caught-up", "--control", filepath.Join(t.TempDir(), "ctl2"))
	require.ErrorContains(t, err, "in use")
	db.Exec(`UPDATE t SET ver = nextval('ver') WHERE id = 1`)
	e2e.WaitFor(t, time.Minute, "the first sync goes on", func() bool {
		o := e2e.ReplayKafka(t, addr, map[string][]string{"public.t": {"id"}})
		src, err := e2e.SourceRowsJSON(context.Background(), db.DSN, "public", "t", []string{"id"})
		require.NoError(t, err)
		return e2e.Diff(o.Rows("public.t"), src) == ""
	})
	require.Nil(t, first.ProcessState, "the first sync ended: %s", firstErr.String())
}
