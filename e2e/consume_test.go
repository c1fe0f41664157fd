package e2e_test

import (
	"context"
	"math/rand/v2"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/sink/kafka"
)

// consumer is a `tidemark consume` process of the test.
type consumer struct {
	cmd    *exec.Cmd
	stderr *e2e.SyncBuffer
}

func startConsume(t *testing.T, from, to, group string, args ...string) *consumer {
	t.Helper()
	cmd := exec.Command(tidemarkBinary(t), append([]string{"consume", "--from", from, "--to", to, "--group", group}, append(quickGroup, args...)...)...)
	c := &consumer{cmd: cmd, stderr: &e2e.SyncBuffer{}}
	cmd.Stderr = c.stderr
	require.NoError(t, cmd.Start())
	return c
}

// kill ends the consumer with SIGKILL, and says whether it was still running.
func (c *consumer) kill() bool {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	err := c.cmd.Wait()
	ee, ok := err.(*exec.ExitError)
	return ok && ee.Sys().(syscall.WaitStatus).Signaled()
}

// quickGroup are the group timeouts of the tests' members: a killed member's tables move on
// after 6 s (the brokers' least), and a rebalance waits 6 s for the members, not the 10 s and
// 30 s of the defaults, which the kills of TestConsumeKilled would otherwise wait out again and again.
var quickGroup = []string{"--session-timeout", "6s", "--rebalance-timeout", "6s"}

// runConsume runs `tidemark consume --stop-when-caught-up` to its end.
func runConsume(t *testing.T, from, to, group string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, tidemarkBinary(t), append([]string{"consume", "--from", from, "--to", to, "--group", group,
		"--stop-when-caught-up"}, append(quickGroup, args...)...)...).CombinedOutput()
	return string(out), err
}

// TestConsumeKilled: `tidemark consume` applies a Kafka output to PostgreSQL as a consumer
// group of two members, each killed with SIGKILL again and again (in the middle of a target
// transaction or not) while a sync writes the output and a workload (a TRUNCATE among its
// changes) runs. The target's offsets commit with the rows they cover: once caught up, the
// target equals the source (tidemark verify), every change applied once.
func TestConsumeKilled(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	db := e2e.NewTestDB(t, server)
	addr := e2e.Kafka(t)
	url := e2e.KafkaURL(addr)
	versionedTable(t, db, 3000, 1)
	const u = `CREATE TABLE u (id int PRIMARY KEY, n numeric, b bytea, ts timestamptz, tags text[])`
	db.Exec(u)
	db.Exec(`INSERT INTO u SELECT g, g * 1.5, decode(md5(g::text), 'hex'), now(), ARRAY['a b', NULL, g::text] FROM generate_series(1, 400) g`)
	db.Exec(`ALTER PUBLICATION ` + db.Publication + ` ADD TABLE u`)
	tgt := targetDB(t, db)
	conn, err := pgxConnect(context.Background(), tgt)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	for _, q := range []string{`CREATE TABLE t (id int PRIMARY KEY, v text, ver bigint NOT NULL)`, u} {
		_, err := conn.Exec(context.Background(), q)
		require.NoError(t, err)
	}
	stop := workload(t, db, 23, 3000)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	syncCmd := exec.CommandContext(ctx, tidemarkBinary(t), "sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
		"--to", url, "--tables", "public.t,public.u", "--kafka-partitions", "3", "--chunk-size", "500", "--quiet")
	var syncErr e2e.SyncBuffer
	syncCmd.Stderr = &syncErr
	require.NoError(t, syncCmd.Start())
	e2e.WaitFor(t, time.Minute, "the sync's first checkpoint", func() bool {
		out, _ := exec.Command(tidemarkBinary(t), "status", "--source", db.DSN, "--slot", db.Slot, "--kafka", url).CombinedOutput()
		return strings.Contains(string(out), "position")
	})

	t.Logf("%s: first checkpoint", time.Now().Format(time.TimeOnly))
	r := rand.New(rand.NewPCG(7, 8))
	members := []*consumer{startConsume(t, url, tgt, "g"), startConsume(t, url, tgt, "g")}
	var mu sync.Mutex
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range members {
			m.kill()
		}
	}()
	kills := 0
	deadline := time.Now().Add(18 * time.Second)
	truncated := false
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(300+r.IntN(1500)) * time.Millisecond)
		i := r.IntN(len(members))
		mu.Lock()
		if members[i].kill() {
			kills++
		} else {
			t.Logf("a member had ended: %s", members[i].stderr.String())
		}
		members[i] = startConsume(t, url, tgt, "g")
		mu.Unlock()
		if !truncated && time.Until(deadline) < 10*time.Second {
			// Every partition of u's topic gets the truncate: applied once all reached it.
			db.Exec(`TRUNCATE u`)
			db.Exec(`INSERT INTO u SELECT g, g / 3.0, '\x00ff', '2024-02-29 01:02:03.5+00', '{}' FROM generate_series(1, 50) g`)
			truncated = true
		}
	}
	t.Logf("%s: kills done", time.Now().Format(time.TimeOnly))
	stop()
	require.Nil(t, syncCmd.ProcessState, "the sync ended: %s", syncErr.String())
	_ = syncCmd.Process.Kill()
	_ = syncCmd.Wait()
	_, err = runSyncTo(t, db, url, "--tables", "public.t,public.u", "--stop-when-caught-up", "--quiet")
	require.NoError(t, err)
	// The members running last stop as an operator stops them (they leave the group); those
	// killed before are given up by the group after their session timeout.
	mu.Lock()
	for _, m := range members {
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
		_ = m.cmd.Wait()
	}
	members = nil
	mu.Unlock()
	require.Greater(t, kills, 5, "the members were killed while they ran")
	t.Logf("%s: the output is complete", time.Now().Format(time.TimeOnly))
	out, err := runConsume(t, url, tgt, "g")
	t.Logf("%s: consumed", time.Now().Format(time.TimeOnly))
	require.NoError(t, err, "%s", out)
	verifyOutput(t, db, tgt, "public.t,public.u")
	t.Logf("%d kills", kills)
}

// TestConsumeTypes: every fixture value of every type goes through the Kafka output's JSON and
// back into a target table of the same definition, equal to the source's (tidemark verify
// compares their texts).
func TestConsumeTypes(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	addr := e2e.Kafka(t)
	url := e2e.KafkaURL(addr)
	tgt := targetDB(t, db)
	conn, err := pgxConnect(context.Background(), tgt)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var tables []string
	for _, tb := range typeTables {
		tables = append(tables, "public."+tb)
	}
	for _, s := range append(typeFixtures, edgeFixtures...) {
		db.Exec(s)
		_, err := conn.Exec(context.Background(), s)
		require.NoError(t, err, "%s", s)
	}
	_, err = conn.Exec(context.Background(), `TRUNCATE `+strings.Join(typeTables, ", "))
	require.NoError(t, err)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE ` + strings.Join(typeTables, ", "))
	all := strings.Join(tables, ",")
	_, err = runSyncTo(t, db, url, "--tables", all, "--stop-when-caught-up", "--quiet")
	require.NoError(t, err)
	out, err := runConsume(t, url, tgt, "types")
	require.NoError(t, err, "%s", out)
	verifyOutput(t, db, tgt, all)
	// Through the stream too: every row updated, and a delete.
	for _, tb := range typeTables {
		db.Exec(`UPDATE ` + tb + ` SET id = id`)
	}
	db.Exec(`DELETE FROM nums WHERE id = (SELECT min(id) FROM nums)`)
	_, err = runSyncTo(t, db, url, "--tables", all, "--stop-when-caught-up", "--quiet")
	require.NoError(t, err)
	out, err = runConsume(t, url, tgt, "types")
	require.NoError(t, err, "%s", out)
	verifyOutput(t, db, tgt, all)
}

// TestConsumeRefuses: what tidemark consume cannot apply exactly stops it with the cause and
// the fix, before it writes: a missing target table, a foreign key on one, a second group on a
// table, a compacted output; and a topic partition whose records were deleted before the group
// applied them.
func TestConsumeRefuses(t *testing.T) {
	t.Parallel()
	db, addr, url, tgt, conn := syncedToKafka(t, 100)
	var err error
	exec := func(q string) {
		t.Helper()
		_, err := conn.Exec(context.Background(), q)
		require.NoError(t, err, q)
	}

	out, err := runConsume(t, url, tgt, "g")
	require.Error(t, err)
	require.Contains(t, out, `target table public.t does not exist`)
	require.Contains(t, out, `pg_dump --schema-only --table '"public"."t"'`)

	exec(`CREATE TABLE p (id int PRIMARY KEY)`)
	exec(`CREATE TABLE t (id int PRIMARY KEY REFERENCES p, v text, ver bigint NOT NULL)`)
	out, err = runConsume(t, url, tgt, "g")
	require.Error(t, err)
	require.Contains(t, out, "has a foreign key")
	require.Contains(t, out, `ALTER TABLE public.t DROP CONSTRAINT "t_id_fkey";`)
	exec(`ALTER TABLE t DROP CONSTRAINT t_id_fkey`)

	out, err = runConsume(t, url, tgt, "g")
	require.NoError(t, err, out)
	verifyOutput(t, db, tgt, "public.t")
	out, err = runConsume(t, url, tgt, "other")
	require.Error(t, err)
	require.Contains(t, out, "is applied from public.t (topic")
	require.Contains(t, out, "consumer group g")

	// The group's offset past the partition's end: the topic was made again.
	exec(`UPDATE public.tidemark_consumer_offsets SET next_offset = next_offset + 1000 WHERE group_id = 'g'`)
	db.Exec(`UPDATE t SET ver = nextval('ver') WHERE id = 1`)
	_, err = runSync(t, db, url, "--stop-when-caught-up", "--quiet")
	require.NoError(t, err)
	out, err = runConsume(t, url, tgt, "g")
	require.Error(t, err)
	require.Contains(t, out, "the topic was deleted and made again")

	// Records deleted (retention) before a new group applied them.
	opts, err := addr.ClientOpts()
	require.NoError(t, err)
	cl, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	defer cl.Close()
	var cut kadm.Offsets
	cut.Add(kadm.Offset{Topic: kafka.TopicOf(addr.Prefix, "public", "t"), Partition: 0, At: 5})
	deleted, err := kadm.NewClient(cl).DeleteRecords(context.Background(), cut)
	require.NoError(t, err)
	require.NoError(t, deleted.Error())
	exec(`CREATE SCHEMA r`)
	exec(`CREATE TABLE r.t (id int PRIMARY KEY, v text, ver bigint NOT NULL)`)
	out, err = runConsume(t, url, tgt, "r", "--target-schema", "r")
	require.Error(t, err)
	require.Contains(t, out, "were deleted (retention) before the target got them")

	// A compacted output.
	db2 := e2e.NewTestDB(t, server)
	versionedTable(t, db2, 10, 1)
	addr2 := e2e.Kafka(t)
	_, err = runSync(t, db2, e2e.KafkaURL(addr2), "--stop-when-caught-up", "--quiet", "--kafka-compact")
	require.NoError(t, err)
	out, err = runConsume(t, e2e.KafkaURL(addr2), tgt, "c")
	require.Error(t, err)
	require.Contains(t, out, "is compacted (cleanup.policy=compact)")
}

// TestConsumeFence: a member whose partition's offset another member moved meanwhile (here the
// test, standing in for a member that was given the partition while this one was thought dead)
// applies nothing of its batch: its transaction is rolled back when it finds the offset moved,
// and it reads the partition again from the target's offset.
func TestConsumeFence(t *testing.T) {
	t.Parallel()
	db, _, url, tgt, conn := syncedToKafka(t, 50)
	var err error
	_, err = conn.Exec(context.Background(), `CREATE TABLE t (id int PRIMARY KEY, v text, ver bigint NOT NULL)`)
	require.NoError(t, err)
	out, err := runConsume(t, url, tgt, "g")
	require.NoError(t, err, out)

	m := startConsume(t, url, tgt, "g")
	defer m.kill()
	e2e.WaitFor(t, time.Minute, "the member's assignment", func() bool { return strings.Contains(m.stderr.String(), "partition assigned") })
	// Another member applied the partition far ahead (past its end: the records this member
	// reads again are then gone, which stops it).
	_, err = conn.Exec(context.Background(), `UPDATE public.tidemark_consumer_offsets SET next_offset = next_offset + 1000000 WHERE group_id = 'g'`)
	require.NoError(t, err)
	db.Exec(`UPDATE t SET v = 'after' WHERE id = 1`)
	_, err = runSync(t, db, url, "--stop-when-caught-up", "--quiet")
	require.NoError(t, err)
	e2e.WaitFor(t, time.Minute, "the member stops", func() bool { return m.cmd.ProcessState != nil || strings.Contains(m.stderr.String(), "are gone") })
	require.Contains(t, m.stderr.String(), "another member of the group applied this partition meanwhile")
	var v string
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT v FROM t WHERE id = 1`).Scan(&v))
	require.Equal(t, "v1", v, "the member's batch was rolled back")
}

// TestVerifyLogOutputs: tidemark verify reads a Kafka or NATS output back as a consumer does and
// compares it with the source: equal after the sync caught up, DIFFERENT (exit 3) once the
// source changed without a sync.
func TestVerifyLogOutputs(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 300, 1)
	db.Exec(`TRUNCATE t`)
	db.Exec(`INSERT INTO t (id, v) SELECT g, 'w' || g FROM generate_series(1, 200) g`)
	kafkaURL := e2e.KafkaURL(e2e.Kafka(t))
	natsAddr, _ := e2e.NATS(t)
	natsURL := natsAddr.String()
	_, err := runSyncTo(t, db, kafkaURL, "--tables", "public.t", "--stop-when-caught-up", "--quiet", "--slot", db.Slot+"_k", "--kafka-partitions", "2")
	require.NoError(t, err)
	_, err = runSyncTo(t, db, natsURL, "--tables", "public.t", "--stop-when-caught-up", "--quiet", "--slot", db.Slot+"_n", "--nats-partitions", "2")
	require.NoError(t, err)
	for _, to := range []string{kafkaURL, natsURL} {
		verifyOutput(t, db, to, "public.t")
	}
	db.Exec(`DELETE FROM t WHERE id = 7`)
	for _, to := range []string{kafkaURL, natsURL} {
		out, err := exec.Command(tidemarkBinary(t), "verify", "--source", db.DSN, "--publication", db.Publication,
			"--tables", "public.t", "--to", to, "--recheck-for", "0").CombinedOutput()
		require.Error(t, err, "%s", out)
		require.Equal(t, 3, err.(*exec.ExitError).ExitCode(), "%s", out)
		require.Contains(t, string(out), "id=7: not in the source")
	}
}

// syncedToKafka is a table t of rows rows synced into a Kafka output (caught up), and an empty
// target database for a consumer, with a connection to it.
func syncedToKafka(t *testing.T, rows int) (db *e2e.TestDB, addr kafka.Address, url, tgt string, conn *pgx.Conn) {
	t.Helper()
	db = e2e.NewTestDB(t, server)
	addr = e2e.Kafka(t)
	url = e2e.KafkaURL(addr)
	versionedTable(t, db, rows, 1)
	_, err := runSync(t, db, url, "--stop-when-caught-up", "--quiet")
	require.NoError(t, err)
	tgt = targetDB(t, db)
	conn, err = pgxConnect(context.Background(), tgt)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return db, addr, url, tgt, conn
}
