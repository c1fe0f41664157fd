package e2e_test

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// targetDB creates a second database for a test to sync into.
func targetDB(t *testing.T, db *e2e.TestDB) string {
	name := db.Name + "_tgt"
	require.NoError(t, server.CreateDatabase(context.Background(), name))
	t.Cleanup(func() { _ = server.DropDatabase(context.Background(), name) })
	return server.DSN(name)
}

// verifyOutput runs `tidemark verify` on a sync's output, as a user would after
// --stop-when-caught-up with the writes stopped: exact, no re-check; every table must be equal.
func verifyOutput(t *testing.T, db *e2e.TestDB, to, tables string) {
	t.Helper()
	out, err := exec.Command(tidemarkBinary(t), "verify", "--source", db.DSN, "--publication", db.Publication,
		"--tables", tables, "--to", to, "--recheck-for", "0").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, table := range strings.Split(tables, ",") {
		require.Contains(t, string(out), table+": equal (")
	}
}

// auditedWorkload is workload plus a log row in every transaction, so that every source
// transaction leaves a trace in the target.
func auditedWorkload(t *testing.T, db *e2e.TestDB, seed uint64, maxID int) func() {
	db.Exec(`CREATE TABLE txlog (id bigserial PRIMARY KEY, xid xid8 NOT NULL DEFAULT pg_current_xact_id())`)
	// In the publication before the workload: pgoutput decides membership as of each
	// transaction's commit, so log rows written before would reach the target only by backfill.
	db.Exec(`ALTER PUBLICATION ` + db.Publication + ` ADD TABLE txlog`)
	return workloadWith(t, db, seed, maxID, `INSERT INTO txlog DEFAULT VALUES`, time.Millisecond)
}

// startSync starts `tidemark sync` in the background and returns a function that kills it.
func startSync(t *testing.T, db *e2e.TestDB, to string, args ...string) (kill func()) {
	cmd := exec.Command(tidemarkBinary(t), append([]string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication, "--to", to}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	return func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		err := cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Errorf("sync was not running when killed: %v: %s", err, lastLines(stderr.String(), 15))
		}
	}
}

// killSyncRepeatedly starts sync 20 times and kills it with SIGKILL after 0.2-1.7 s each time
// (the moments drawn from seed).
func killSyncRepeatedly(t *testing.T, db *e2e.TestDB, to string, args []string, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed+1))
	for i := range 20 {
		kill := startSync(t, db, to, args...)
		time.Sleep(time.Duration(200+r.IntN(1500)) * time.Millisecond)
		kill()
		t.Logf("kill %d", i+1)
	}
}

// TestSyncPostgresKill9: sync to PostgreSQL under a live random workload, killed with SIGKILL at
// 20 random moments and restarted each time; at the end the target equals the source, and the
// audit ledger shows every source transaction applied once: one applied twice would have failed
// on the ledger's primary key, one skipped would lack its log row.
func TestSyncPostgresKill9(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 20000, 1)
	tgt := targetDB(t, db)
	// The slot exists before the workload starts, so every workload transaction is streamed
	// (and recorded in the ledger), while the rows before it are backfilled.
	createSlot(t, db)
	stop := auditedWorkload(t, db, 11, 20000)
	args := []string{"--tables", "public.t,public.txlog", "--chunk-size", "1000", "--audit"}
	killSyncRepeatedly(t, db, tgt, args, 5)
	stop()
	killed, err := runSyncTo(t, db, tgt, append(args, "--stop-when-caught-up")...)
	require.NoError(t, err)
	require.False(t, killed)
	ctx := context.Background()
	for _, tc := range []struct{ table, key string }{{"t", "id"}, {"txlog", "id"}} {
		src, err := e2e.SourceRows(ctx, db.DSN, "public", tc.table, []string{tc.key})
		require.NoError(t, err)
		dst, err := e2e.SourceRows(ctx, tgt, "public", tc.table, []string{tc.key})
		require.NoError(t, err)
		require.Empty(t, e2e.Diff(dst, src), "target table %s", tc.table)
	}
	verifyOutput(t, db, tgt, "public.t,public.txlog")
	var logged, applied int
	require.NoError(t, db.Conn.QueryRow(ctx, `SELECT count(*) FROM txlog`).Scan(&logged))
	tc, err := pgxConnect(ctx, tgt)
	require.NoError(t, err)
	defer tc.Close(ctx)
	require.NoError(t, tc.QueryRow(ctx, `SELECT count(*) FROM tidemark_applied`).Scan(&applied))
	require.Equal(t, logged, applied, "every source transaction applied exactly once")
	require.Greater(t, logged, 100, "the workload ran")
}

// TestSyncJSONLKill9: the same with a JSON lines target: the file, replayed up to its
// checkpoint, equals the source.
func TestSyncJSONLKill9(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 20000, 1)
	stop := auditedWorkload(t, db, 12, 20000)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	args := []string{"--tables", "public.t,public.txlog", "--chunk-size", "1000"}
	killSyncRepeatedly(t, db, out, args, 7)
	stop()
	_, err := runSyncTo(t, db, out, append(args, "--stop-when-caught-up")...)
	require.NoError(t, err)
	keys := map[string][]string{"public.t": {"id"}, "public.txlog": {"id"}}
	o := replayFile(t, out, keys)
	require.Empty(t, o.Violations())
	ctx := context.Background()
	for _, table := range []string{"t", "txlog"} {
		src, err := e2e.SourceRowsJSON(ctx, db.DSN, "public", table, []string{"id"})
		require.NoError(t, err)
		require.Empty(t, e2e.Diff(o.Rows("public."+table), src), "table %s", table)
	}
	verifyOutput(t, db, out, "public.t,public.txlog")
}

// TestSyncKeysEqualAsPostgres: keys that are equal under their type's = but differ as JSON text
// (a numeric key rewritten with another scale) and keys whose JSON form is lossy (a date key's
// infinity and -infinity, both null in JSON) come out of a sync so that a replay keyed as the key's
// = compares (the oracle, and tidemark verify) equals the source, deletes included.
func TestSyncKeysEqualAsPostgres(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.n (k numeric PRIMARY KEY, v text); INSERT INTO public.n VALUES (1.0, 'old'), (2, 'two');
		CREATE TABLE public.h (id int, valid_to date, v text, PRIMARY KEY (id, valid_to)); INSERT INTO public.h VALUES (1, 'infinity', 'a')`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE public.n, public.h`)
	createSlot(t, db)
	db.Exec(`UPDATE public.n SET k = 1.00, v = 'new' WHERE k = 1`)
	db.Exec(`INSERT INTO public.h VALUES (1, '-infinity', 'b'), (2, 'infinity', 'c')`)
	db.Exec(`DELETE FROM public.h WHERE id = 1 AND valid_to = '-infinity'`)
	db.Exec(`UPDATE public.h SET v = 'a2' WHERE id = 1 AND valid_to = 'infinity'`)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	_, err := runSyncTo(t, db, out, "--tables", "public.n,public.h", "--stop-when-caught-up")
	require.NoError(t, err)
	o := replayFile(t, out, map[string][]string{"public.n": {"k"}, "public.h": {"id", "valid_to"}})
	require.Empty(t, o.Violations())
	ctx := context.Background()
	for table, key := range map[string][]string{"n": {"k"}, "h": {"id", "valid_to"}} {
		src, err := e2e.SourceRowsJSON(ctx, db.DSN, "public", table, key)
		require.NoError(t, err)
		require.Empty(t, e2e.Diff(o.Rows("public."+table), src), "table %s", table)
	}
	verifyOutput(t, db, out, "public.n,public.h")
}

// TestRebackfillCommand: tidemark rebackfill asks a running sync, under a workload, to start a
// table's output over: the sync goes on, the output gets the table's refresh and its rows again,
// and a replay of the output equals the source afterwards (with its exactly-once log). A table
// the sync does not capture is refused; with no sync running, it says so.
func TestRebackfillCommand(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 3000, 1)
	stop := auditedWorkload(t, db, 21, 3000)
	dir := t.TempDir()
	out, ctl := filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "ctl", "sync.sock")
	args := []string{"--tables", "public.t,public.txlog", "--chunk-size", "500", "--quiet"}
	rebackfill := func(tables string) (string, error) {
		b, err := exec.Command(tidemarkBinary(t), "rebackfill", "--control", ctl, "--tables", tables).CombinedOutput()
		return string(b), err
	}
	msg, err := rebackfill("public.t")
	require.Error(t, err)
	require.Contains(t, msg, "no running sync answers on")

	kill := startSync(t, db, out, append(args, "--control", ctl)...)
	lines := func(op string) int {
		b, _ := os.ReadFile(out)
		return strings.Count(string(b), `"op":"`+op+`"`)
	}
	require.Eventually(t, func() bool { return lines("snapshot") >= 3000 }, 60*time.Second, 100*time.Millisecond, "the backfill went on")
	msg, err = rebackfill("public.nope")
	require.Error(t, err)
	require.Contains(t, msg, "public.nope is not captured")
	msg, err = rebackfill("public.t")
	require.NoError(t, err, msg)
	require.Contains(t, msg, "re-backfill of public.t taken and recorded by the running sync (slot "+db.Slot)
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(out)
		_, after, refreshed := strings.Cut(string(b), `"op":"refresh"`)
		return refreshed && strings.Count(after, `"op":"snapshot"`) >= 2000
	}, 60*time.Second, 100*time.Millisecond, "the table's output started over and its rows came again")
	require.Equal(t, 1, lines("refresh"))
	kill()
	stop()
	_, err = runSyncTo(t, db, out, append(args, "--stop-when-caught-up")...)
	require.NoError(t, err)
	o := replayFile(t, out, map[string][]string{"public.t": {"id"}, "public.txlog": {"id"}})
	require.Empty(t, o.Violations())
	verifyOutput(t, db, out, "public.t,public.txlog")
}

// TestSyncRebackfillOnceAcrossReconnects: --rebackfill given to a sync whose output has no
// checkpoint yet applies to that first run only: a reconnection after its first checkpoint does
// not start the table over again (found by review: the request stayed on the tables the
// reconnections share, and each emptied the table again).
func TestSyncRebackfillOnceAcrossReconnects(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 500, 1)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	cmd := exec.Command(tidemarkBinary(t), "sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication, "--to", out,
		"--tables", "public.t", "--chunk-size", "100", "--rebackfill", "public.t", "--checkpoint-interval", "200ms")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := func(op string) int {
		b, _ := os.ReadFile(out)
		return strings.Count(string(b), `"op":"`+op+`"`)
	}
	require.Eventually(t, func() bool { return lines("snapshot") >= 500 }, 60*time.Second, 100*time.Millisecond)
	refreshes := lines("refresh")
	for range 2 {
		// Every connection of the sync: the run ends, and the sync starts another.
		db.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'tidemark%' AND pid <> pg_backend_pid()`)
		db.Exec(`UPDATE t SET v = 'after', ver = nextval('ver') WHERE id = 1`)
		require.Eventually(t, func() bool {
			b, _ := os.ReadFile(out)
			return strings.Count(string(b), `"after"`) >= 1
		}, 60*time.Second, 100*time.Millisecond, "the sync reconnected and went on")
		db.Exec(`UPDATE t SET v = 'x', ver = nextval('ver') WHERE id = 1`)
	}
	time.Sleep(time.Second)
	require.Contains(t, stderr.String(), "reconnecting", "the sync reconnected")
	require.Equal(t, refreshes, lines("refresh"), "no reconnection started the table over again")
	require.Less(t, lines("snapshot"), 1000, "the rows were not read again")
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer = e2e.SyncBuffer

// TestOnSlotLossRebackfill: a slot invalidated by max_slot_wal_keep_size (wal_status lost: the
// changes it needed are gone) stops the next sync with the fix; with --on-slot-loss rebackfill,
// the sync drops the invalidated slot, creates it again, and backfills every table again while
// the changes stream: the output equals the source afterwards, the changes made while the slot
// was lost included.
func TestOnSlotLossRebackfill(t *testing.T) {
	t.Parallel()
	e2e.NeedsLocal(t, server, "needs a local cluster of its own with a small max_slot_wal_keep_size")
	ctx := context.Background()
	srv, err := e2e.Start(ctx, e2e.Options{Settings: map[string]string{"max_slot_wal_keep_size": "1MB", "wal_keep_size": "0", "max_wal_size": "32MB", "min_wal_size": "32MB"}})
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.Stop(ctx)) }()
	dsn := srv.DSN("postgres")
	conn, err := pgxConnect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	run := func(sql string) {
		t.Helper()
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	run(`CREATE TABLE t (id int PRIMARY KEY, v text)`)
	run(`INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 1000) g`)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	sync := func(args ...string) (string, error) {
		b, err := exec.Command(tidemarkBinary(t), append([]string{"sync", "--source", dsn, "--slot", "lost", "--publication", "lost",
			"--tables", "public.t", "--to", out, "--stop-when-caught-up", "--quiet"}, args...)...).CombinedOutput()
		return string(b), err
	}
	msg, err := sync()
	require.NoError(t, err, msg)

	// The slot's consumer away: changes, then more WAL than the slot may keep, and checkpoints.
	run(`UPDATE t SET v = 'while lost' WHERE id <= 10`)
	run(`DELETE FROM t WHERE id BETWEEN 11 AND 20`)
	run(`INSERT INTO t VALUES (5000, 'new while lost')`)
	require.Eventually(t, func() bool {
		run(`CREATE TABLE IF NOT EXISTS filler (g int, pad text)`)
		run(`INSERT INTO filler SELECT g, repeat('x', 1000) FROM generate_series(1, 20000) g`)
		run(`SELECT pg_switch_wal()`)
		run(`CHECKPOINT`)
		var status string
		require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = 'lost'`).Scan(&status))
		return status == "lost"
	}, 2*time.Minute, 100*time.Millisecond, "the slot lost WAL it needed")

	msg, err = sync()
	require.Error(t, err)
	require.Contains(t, msg, "lost WAL it needed")
	msg, err = sync("--on-slot-loss", "rebackfill")
	require.NoError(t, err, msg)
	require.Contains(t, msg, "every table is backfilled again from the new slot")
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Contains(t, string(b), `"op":"refresh"`)
	got := replayFile(t, out, map[string][]string{"public.t": {"id"}})
	require.Empty(t, got.Violations())
	src, err := e2e.SourceRowsJSON(ctx, dsn, "public", "t", []string{"id"})
	require.NoError(t, err)
	require.Empty(t, e2e.Diff(got.Rows("public.t"), src))
}
