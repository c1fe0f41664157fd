package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// What a connection carries over from Airbyte's own connector and from earlier reads: stream
// states that prove nothing, an invalidated slot, the first seconds of a read.

// TestMigratedEmptyStreamStateIsLoaded: in a state from Airbyte's connector, a stream whose state
// carries nothing ({}) has no finished initial load to show: it is loaded from scratch, while a
// stream in Airbyte's finished form (cursor_field, no ctid) only streams its changes.
func TestMigratedEmptyStreamStateIsLoaded(t *testing.T) {
	e := newEnv(t)
	for _, tb := range []string{"finished_t", "empty_state_t"} {
		e.db.Exec(`CREATE TABLE ` + tb + ` (id int PRIMARY KEY, v text)`)
		e.db.Exec(`INSERT INTO ` + tb + ` SELECT g, 'v' FROM generate_series(1, 100) g`)
	}
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE finished_t, empty_state_t`)
	e.db.Exec(`SELECT pg_create_logical_replication_slot('` + e.db.Slot + `', 'pgoutput')`)
	lsn := e.db.CurrentLSN()
	e.db.Exec(`UPDATE finished_t SET v = 'changed' WHERE id = 1`)
	cat := e.catalog()
	offset, _ := json.Marshal(map[string]any{"transaction_id": nil, "lsn": uint64(lsn), "txId": 1234, "ts_usec": 1700000000000000})
	key, _ := json.Marshal([]any{e.db.Name, map[string]string{"server": e.db.Name}})
	state, _ := json.Marshal([]any{map[string]any{"type": "GLOBAL", "global": map[string]any{
		"shared_state": map[string]any{"state": map[string]string{string(key): string(offset)}},
		"stream_states": []any{
			map[string]any{"stream_descriptor": map[string]any{"name": "finished_t", "namespace": "public"},
				"stream_state": map[string]any{"stream_name": "finished_t", "stream_namespace": "public", "cursor_field": []any{}}},
			map[string]any{"stream_descriptor": map[string]any{"name": "empty_state_t", "namespace": "public"},
				"stream_state": map[string]any{}},
		}}}})
	r := e.read(cat, state)
	counts := map[string]int{}
	for _, m := range r.records() {
		s, _ := recordOf(t, m)
		counts[s]++
	}
	require.Equal(t, 1, counts["public.finished_t"], "the finished stream: its change only")
	require.Equal(t, 100, counts["public.empty_state_t"], "the stream whose state carries nothing: loaded from scratch")
}

// TestHeartbeatBeforeTheFirstPosition: states go out while a read has no position yet (a slot
// creation waiting for a long transaction; a full-refresh-only sync whose first read waits), so
// the platform never sees a silent source; and such a state, resumed from, starts over.
func TestHeartbeatBeforeTheFirstPosition(t *testing.T) {
	// waitState waits (at most a minute) for p to print a STATE, and returns it.
	waitState := func(t *testing.T, p *proc) []byte {
		t.Helper()
		var state []byte
		e2e.WaitFor(t, time.Minute, "a STATE while the read waits", func() bool {
			for _, m := range p.snapshot() {
				if m.Type == "STATE" {
					state, _ = json.Marshal([]any{m.m["state"]})
					return true
				}
			}
			return false
		})
		return state
	}

	t.Run("slot creation", func(t *testing.T) {
		e := ordersEnv(t, 50)
		cat := e.catalog()
		// A transaction with an id, open: creating a slot waits for it to end.
		ctx := context.Background()
		hold := e.db.Connect()
		defer hold.Close(ctx)
		tx, err := hold.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO orders VALUES (1000, 'held', 1)`)
		require.NoError(t, err)
		p := e.start("read", "--config", e.config(), "--catalog", cat)
		early := waitState(t, p)
		var created bool
		require.NoError(t, e.db.Conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn IS NOT NULL)`, e.db.Slot).Scan(&created))
		require.False(t, created, "the state came before the slot existed")
		require.NoError(t, tx.Commit(ctx))
		r := p.wait()
		require.Equal(t, 0, r.code, tail(r.stderr))
		// The early state has no position: a read from it starts over, and loads everything.
		again := e.read(cat, early)
		require.Len(t, again.records(), 51)
		replayEqualsSource(t, e, "public.orders", "id", again)
	})

	t.Run("full refresh only", func(t *testing.T) {
		e := newEnv(t)
		e.db.Exec(`CREATE TABLE nokey (id int, v text)`)
		e.db.Exec(`INSERT INTO nokey SELECT g, 'v' FROM generate_series(1, 30) g`)
		cat := e.catalog("public.nokey")
		ctx := context.Background()
		hold := e.db.Connect()
		defer hold.Close(ctx)
		tx, err := hold.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `LOCK TABLE nokey IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		p := e.start("read", "--config", e.config(), "--catalog", cat)
		early := waitState(t, p)
		require.NoError(t, tx.Commit(ctx))
		r := p.wait()
		require.Equal(t, 0, r.code, tail(r.stderr))
		require.Len(t, r.records(), 30)
		again := e.read(cat, early)
		require.Len(t, again.records(), 30, "a full refresh state taken before any row: read again whole")
	})
}

// TestLostSlotFollowsInvalidCursorBehaviour: a slot invalidated by max_slot_wal_keep_size cannot
// stream, and Tidemark drops no slot: the read fails with a config error that says what to do for
// the invalid_cdc_cursor_position_behavior chosen. Once the DBA has made the slot again, "Re-sync
// data" backfills every stream from the new slot, and the destination equals the source.
func TestLostSlotFollowsInvalidCursorBehaviour(t *testing.T) {
	e2e.NeedsLocal(t, server, "needs to change max_slot_wal_keep_size on a server of its own")
	e := ordersEnv(t, 100)
	e.db.Exec(`CREATE TABLE filler (v text)`)
	e.db.Exec(`SELECT pg_create_logical_replication_slot('` + e.db.Slot + `', 'pgoutput')`)
	e.cfg["create_replication_slot"] = false
	cat := e.catalog("public.orders")
	first := e.read(cat, nil)
	state := first.lastState(t)
	e.db.Exec(`INSERT INTO orders VALUES (1000, 'while the slot was lost', 1)`)

	e.db.Exec(`ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`)
	e.db.Exec(`SELECT pg_reload_conf()`)
	t.Cleanup(func() {
		e.db.Exec(`ALTER SYSTEM RESET max_slot_wal_keep_size`)
		e.db.Exec(`SELECT pg_reload_conf()`)
	})
	e2e.WaitFor(t, 2*time.Minute, "the slot invalidated", func() bool {
		e.db.Exec(`INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 20000)`)
		e.db.Exec(`SELECT pg_switch_wal()`)
		e.db.Exec(`CHECKPOINT`)
		var status string
		require.NoError(t, e.db.Conn.QueryRow(context.Background(), `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, e.db.Slot).Scan(&status))
		return status == "lost"
	})

	failure := func() string {
		t.Helper()
		r := e.run("read", "--config", e.config(), "--catalog", cat, "--state", e.file("state.json", state))
		require.NotEqual(t, 0, r.code)
		require.Empty(t, r.records())
		errs := r.traces("ERROR")
		require.Len(t, errs, 1, r.stdout)
		require.Equal(t, "config_error", errs[0].str("trace", "error", "failure_type"))
		return errs[0].str("trace", "error", "message")
	}
	drop := fmt.Sprintf("pg_drop_replication_slot('%s')", e.db.Slot)
	create := fmt.Sprintf("pg_create_logical_replication_slot('%s', 'pgoutput')", e.db.Slot)

	msg := failure()
	for _, w := range []string{drop, create, "reset", "Re-sync data"} {
		require.Contains(t, msg, w, "Fail sync: %s", msg)
	}
	e.cdc()["invalid_cdc_cursor_position_behavior"] = "Re-sync data"
	msg = failure()
	for _, w := range []string{drop, create, "next sync", "backfill"} {
		require.Contains(t, msg, w, "Re-sync data: %s", msg)
	}
	require.NotContains(t, msg, "reset the connection", "Re-sync data needs no reset")

	// The DBA makes the slot again; the next read re-syncs on its own.
	e.db.Exec(`SELECT ` + drop)
	e.db.Exec(`SELECT ` + create)
	r := e.read(cat, state)
	got := map[string]bool{}
	for _, m := range r.records() {
		_, data := recordOf(t, m)
		got[string(data["id"])] = true
	}
	require.Len(t, got, 101, "every row again")
	require.True(t, got["1000"], "the row written while the slot was lost")
	replayEqualsSource(t, e, "public.orders", "id", first, r)
}

// TestStateOfEarlierReleaseResumes: a state written before checkpoints recorded each table's
// columns, storage files and enum labels (and the last TRUNCATE seen) resumes without a stop:
// changes made before the upgrade cannot be judged, and are not held against it. The state it
// writes then records them, and the next read compares again.
func TestStateOfEarlierReleaseResumes(t *testing.T) {
	e := ordersEnv(t, 50)
	cat := e.catalog()
	state := e.read(cat, nil).lastState(t)
	var msgs []map[string]any
	require.NoError(t, json.Unmarshal(state, &msgs))
	for _, ss := range msgs[0]["global"].(map[string]any)["stream_states"].([]any) {
		st := ss.(map[string]any)["stream_state"].(map[string]any)
		require.Contains(t, st, "files", "this release records the files")
		for _, k := range []string{"columns", "files", "truncated", "labels"} {
			delete(st, k) // as the release before wrote it
		}
	}
	old, err := json.Marshal(msgs)
	require.NoError(t, err)
	e.db.Exec(`VACUUM FULL orders`)
	e.db.Exec(`UPDATE orders SET v = 'after the upgrade' WHERE id = 1`)
	r := e.read(cat, old)
	found := false
	for _, m := range r.records() {
		_, data := recordOf(t, m)
		found = found || string(data["v"]) == `"after the upgrade"`
	}
	require.True(t, found, "the change after the earlier release's state was read")

	e.db.Exec(`VACUUM FULL orders`)
	// The new state records the files: the next change of them is judged.
	e.stopsUntilReset(t, cat, r.lastState(t), "storage files of")
}
