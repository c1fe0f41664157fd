package e2e_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// TestNATSCrashPoints is TestCrashPoints with a NATS JetStream output (a cluster of three, the
// stream with three replicas): `tidemark sync --to nats://` killed with SIGKILL at each crash
// point of a chunk's protocol while a workload with large transactions runs, and started again.
// What it published after its last checkpoint stays in the stream (JetStream has no transaction
// to abort): the next run reads the stream's end and writes nothing twice, so the stream holds
// each change once and replays to the source.
func TestNATSCrashPoints(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	db := e2e.NewTestDB(t, server)
	addr, _ := e2e.NATS(t)
	url := addr.String()
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
		killed, err := runSync(t, db, url, "--chunk-size", "500", "--nats-partitions", "3", "--nats-replicas", "3", "--crash-at", p)
		require.NoError(t, err, "crash point %s", p)
		require.True(t, killed, "the process reached crash point %s", p)
		require.Empty(t, e2e.ReplayNATS(t, addr, keys).Violations(), "after a crash at %s", p)
	}
	stop()
	stopBig()
	killed, err := runSync(t, db, url, "--chunk-size", "500", "--nats-partitions", "3", "--stop-when-caught-up")
	require.NoError(t, err)
	require.False(t, killed)
	o := e2e.ReplayNATS(t, addr, keys)
	src, err := e2e.SourceRowsJSON(context.Background(), db.DSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	require.Empty(t, e2e.Diff(o.Rows("public.t"), src))
	require.Empty(t, o.Violations())
	t.Logf("%d records, %d duplicates", o.Records(), o.Duplicates())
	// tidemark status reads the output's checkpoint.
	status, err := exec.Command(tidemarkBinary(t), "status", "--source", db.DSN, "--slot", db.Slot, "--nats", url).CombinedOutput()
	require.NoError(t, err, "%s", status)
	require.Regexp(t, `checkpoint \(nats://[^)]*, [0-9]+s ago\): position [0-9A-F]+/[0-9A-F]+`, string(status))
	require.Contains(t, string(status), "public.t")
}
