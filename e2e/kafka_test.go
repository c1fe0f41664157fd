package e2e_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/sink/jsonl/line"
	"github.com/tidemark/tidemark/sink/kafka"
)

// replayKafka reads the Kafka output's committed records (what a read_committed consumer of
// every partition sees) and replays them through an oracle. No record may be there twice: the
// (LSN, seq) of each keyed record is unique along the output (a truncate or a refresh is one
// record per partition, merged back into one by kafka.ReadLines).
func replayKafka(t *testing.T, addr kafka.Address, keys map[string][]string) *e2e.Oracle {
	t.Helper()
	var tables []string
	for name := range keys {
		tables = append(tables, name)
	}
	lines, err := kafka.ReadLines(context.Background(), addr, tables)
	require.NoError(t, err)
	type at struct {
		lsn line.LSN
		seq int
	}
	seen := map[at]bool{}
	for _, l := range lines {
		d, err := line.Decode(l)
		require.NoError(t, err)
		require.False(t, seen[at{d.LSN, d.Seq}], "a record is visible twice to a read_committed consumer: %s", l)
		seen[at{d.LSN, d.Seq}] = true
	}
	var text []byte
	for _, l := range lines {
		text = append(append(text, l...), '\n')
	}
	recs, err := e2e.ParseJSONL(bytes.NewReader(text), keys)
	require.NoError(t, err)
	o := e2e.NewOracle("ver")
	for _, r := range recs {
		o.Apply(r)
	}
	return o
}

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
		require.Empty(t, replayKafka(t, addr, keys).Violations(), "after a crash at %s", p)
	}
	stop()
	stopBig()
	killed, err := runSync(t, db, url, "--chunk-size", "500", "--stop-when-caught-up")
	require.NoError(t, err)
	require.False(t, killed)
	o := replayKafka(t, addr, keys)
	src, err := e2e.SourceRowsJSON(context.Background(), db.DSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	require.Empty(t, e2e.Diff(o.Rows("public.t"), src))
	require.Empty(t, o.Violations())
	t.Logf("%d records, %d duplicates", o.Records(), o.Duplicates())
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
		return len(replayKafka(t, addr, map[string][]string{"public.t": {"id"}}).Rows("public.t")) == 2000
	})
	_, err := runSync(t, db, url, "--stop-when-caught-up", "--control", filepath.Join(t.TempDir(), "ctl2"))
	require.ErrorContains(t, err, "in use")
	db.Exec(`UPDATE t SET ver = nextval('ver') WHERE id = 1`)
	e2e.WaitFor(t, time.Minute, "the first sync goes on", func() bool {
		o := replayKafka(t, addr, map[string][]string{"public.t": {"id"}})
		src, err := e2e.SourceRowsJSON(context.Background(), db.DSN, "public", "t", []string{"id"})
		require.NoError(t, err)
		return e2e.Diff(o.Rows("public.t"), src) == ""
	})
	require.Nil(t, first.ProcessState, "the first sync ended: %s", firstErr.String())
}
