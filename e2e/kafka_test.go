package e2e_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/sink/kafka"
)

// TestKafkaCrashPoints is TestCrashPoints with a Kafka output: `tidemark sync --to kafka://`
// killed with SIGKILL at each crash point of a chunk's protocol while a workload with large
// transactions runs, and started again. Whatever it wrote after its last checkpoint is in a
// transaction that the next run's producer aborts (its epoch fences the dead one's), so a
// read_committed consumer sees each change once; the topics replay to the source.
func TestKafkaCrashPoints(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
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
	t.Parallel()
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

// TestKafkaSingleTopic: --kafka-topic single writes every table into one topic, PREFIX, the
// table in each record's header: read back as a read_committed consumer reads it (a truncate of
// one table among the other's changes), applied by tidemark consume, and verified, it gives the
// source. A run with the other layout is refused.
func TestKafkaSingleTopic(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	addr := e2e.Kafka(t)
	url := e2e.KafkaURL(addr)
	versionedTable(t, db, 500, 1)
	db.Exec(`CREATE TABLE u (id int PRIMARY KEY, n text)`)
	db.Exec(`INSERT INTO u SELECT g, 'u' || g FROM generate_series(1, 300) g`)
	db.Exec(`CREATE SCHEMA other`)
	db.Exec(`CREATE TABLE other.t (id int PRIMARY KEY, v text, ver bigint NOT NULL)`)
	db.Exec(`INSERT INTO other.t SELECT g, 'o', 0 FROM generate_series(1, 30) g`)
	db.Exec(`ALTER PUBLICATION ` + db.Publication + ` ADD TABLE u, other.t`)
	args := []string{"--tables", "public.t,public.u,other.t", "--kafka-topic", "single", "--kafka-partitions", "3", "--stop-when-caught-up", "--quiet"}
	_, err := runSyncTo(t, db, url, args...)
	require.NoError(t, err)
	db.Exec(`UPDATE t SET ver = nextval('ver') WHERE id % 5 = 0`)
	db.Exec(`TRUNCATE u`)
	db.Exec(`INSERT INTO u SELECT g, 'again' FROM generate_series(1, 20) g`)
	db.Exec(`DELETE FROM t WHERE id < 10`)
	_, err = runSyncTo(t, db, url, args...)
	require.NoError(t, err)

	opts, err := addr.ClientOpts()
	require.NoError(t, err)
	cl, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	defer cl.Close()
	topics, err := kadm.NewClient(cl).ListTopics(context.Background())
	require.NoError(t, err)
	var ours []string
	for name := range topics {
		if strings.HasPrefix(name, addr.Prefix) {
			ours = append(ours, name)
		}
	}
	require.ElementsMatch(t, []string{addr.Prefix, kafka.CheckpointTopic(addr.Prefix)}, ours)

	o := e2e.ReplayKafka(t, addr, map[string][]string{"public.t": {"id"}, "public.u": {"id"}})
	for _, tb := range []string{"t", "u"} {
		src, err := e2e.SourceRowsJSON(context.Background(), db.DSN, "public", tb, []string{"id"})
		require.NoError(t, err)
		require.Empty(t, e2e.Diff(o.Rows("public."+tb), src), "table %s", tb)
	}
	verifyOutput(t, db, url, "public.t,public.u,other.t")
	tgt := targetDB(t, db)
	conn, err := pgxConnect(context.Background(), tgt)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	for _, q := range []string{`CREATE TABLE t (id int PRIMARY KEY, v text, ver bigint NOT NULL)`, `CREATE TABLE u (id int PRIMARY KEY, n text)`,
		`CREATE SCHEMA other`, `CREATE TABLE other.t (id int PRIMARY KEY, v text, ver bigint NOT NULL)`} {
		_, err := conn.Exec(context.Background(), q)
		require.NoError(t, err)
	}
	out, err := runConsume(t, url, tgt, "single")
	require.NoError(t, err, out)
	verifyOutput(t, db, tgt, "public.t,public.u,other.t")

	// Two source tables of one name, in one topic, into one target schema: refused, not mixed.
	_, err = conn.Exec(context.Background(), `CREATE SCHEMA x; CREATE TABLE x.t (id int PRIMARY KEY, v text, ver bigint NOT NULL); CREATE TABLE x.u (id int PRIMARY KEY, n text)`)
	require.NoError(t, err)
	out, err = runConsume(t, url, tgt, "mixed", "--target-schema", "x")
	require.Error(t, err, out)
	require.Contains(t, out, "a second source table")

	_, err = runSyncTo(t, db, url, "--tables", "public.t,public.u,other.t", "--stop-when-caught-up", "--quiet")
	require.ErrorContains(t, err, "give --kafka-topic single")
}
