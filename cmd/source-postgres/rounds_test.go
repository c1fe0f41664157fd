package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Syncs as the platform runs them, one after the other, each from the last state of the one
// before; the acceptance tests of the connector issue.

// liveWorkload writes to the tables (id int primary key, v text) until stop is closed: inserts,
// updates, deletes and key changes, in transactions of one to three statements. committed
// counts the transactions that committed.
func liveWorkload(t *testing.T, e *env, tables []string, ids int) (stop chan struct{}, done chan struct{}, committed *atomic.Int64) {
	stop, done, committed = make(chan struct{}), make(chan struct{}), new(atomic.Int64)
	go func() {
		defer close(done)
		ctx := context.Background()
		conn := e.db.Connect()
		defer conn.Close(ctx)
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				return
			}
			for n := rng.IntN(3) + 1; n > 0; n-- {
				table := tables[rng.IntN(len(tables))]
				id := rng.IntN(ids) + 1
				switch rng.IntN(6) {
				case 0, 1:
					_, err = tx.Exec(ctx, `UPDATE `+table+` SET v = v || 'u' WHERE id = $1`, id)
				case 2:
					_, err = tx.Exec(ctx, `DELETE FROM `+table+` WHERE id = $1`, id)
				case 3:
					_, err = tx.Exec(ctx, `UPDATE `+table+` SET id = $2 WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM `+table+` WHERE id = $2)`, id, rng.IntN(ids)+1)
				default:
					_, err = tx.Exec(ctx, `INSERT INTO `+table+` (id, v) VALUES ($1, 'i') ON CONFLICT (id) DO UPDATE SET v = excluded.v || 'r'`, id)
				}
				if err != nil {
					break
				}
			}
			if err != nil {
				_ = tx.Rollback(ctx)
				continue
			}
			if err := tx.Commit(ctx); err != nil {
				return
			}
			committed.Add(1)
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
	}()
	return stop, done, committed
}

// TestSyncRounds: five reads during a live workload, each from the last state of the one
// before; one of them killed with SIGKILL at a random moment and retried by the platform from
// the last state it had. A dedup destination then equals the source. The connector runs as
// the read-only role of Airbyte's setup guide (SELECT and REPLICATION, read-only transactions,
// a slot and publication the DBA made): it writes to no table of the source.
func TestSyncRounds(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	e := newEnv(t)
	for _, tb := range []string{"orders", "events"} {
		e.db.Exec(`CREATE TABLE ` + tb + ` (id int PRIMARY KEY, v text)`)
		e.db.Exec(`INSERT INTO ` + tb + ` SELECT g, 'v' || g FROM generate_series(1, 20000) g`)
	}
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE orders, events`)
	e.readOnlyRole("orders", "events")
	e.cfg["backfill_chunk_size"] = 1000
	status, msg := e.checkStatus()
	require.Equal(t, "SUCCEEDED", status, msg)
	cat := e.catalog()
	d := newDestination(map[string][]string{"public.orders": {"id"}, "public.events": {"id"}})
	stop, done, committed := liveWorkload(t, e, []string{"orders", "events"}, 25000)
	var before int64

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	killed := rng.IntN(3) + 1 // one of the rounds during the workload, not the first
	t.Logf("seed %d: round %d is killed", seed, killed)
	var state []byte
	for round := 0; round < 5; round++ {
		if round == 4 {
			close(stop)
			<-done
			// The rounds ran against a changing source, or they proved nothing.
			require.Greater(t, committed.Load(), int64(100), "the workload committed transactions during the rounds")
		}
		if round == 1 {
			before = committed.Load()
		}
		args := []string{"read", "--config", e.config(), "--catalog", cat}
		if state != nil {
			args = append(args, "--state", e.file("state.json", state))
		}
		if round == killed {
			p := e.start(args...)
			time.Sleep(time.Duration(200+rng.IntN(1500)) * time.Millisecond)
			p.signal(syscall.SIGKILL)
			r := p.wait()
			// The destination got what was sent; the platform keeps the last state it saw.
			d.apply(t, r.records())
			if len(r.states()) > 0 {
				state = r.lastState(t)
			}
			t.Logf("round %d: killed after %d records, %d states", round, len(r.records()), len(r.states()))
			continue
		}
		r := e.read(cat, state)
		d.apply(t, r.records())
		state = r.lastState(t)
		t.Logf("round %d: %d records", round, len(r.records()))
	}
	require.Greater(t, committed.Load(), before, "transactions committed between the rounds")
	d.equalsSource(t, e, "public.orders")
	d.equalsSource(t, e, "public.events")
	var signal bool
	require.NoError(t, e.db.Conn.QueryRow(context.Background(), `SELECT to_regclass('public.tidemark_signal') IS NOT NULL`).Scan(&signal))
	require.False(t, signal, "the connector wrote no signal table")
}

// TestBackfillAcrossSyncs: a table larger than one sync's time budget is backfilled over several
// syncs, each ending with a state the next resumes from mid-table, while the changes of another
// table arrive in every sync.
func TestBackfillAcrossSyncs(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE big (id int PRIMARY KEY, v text)`)
	e.db.Exec(`INSERT INTO big SELECT g, repeat('x', 100) FROM generate_series(1, 200000) g`)
	e.db.Exec(`CREATE TABLE live (id int PRIMARY KEY, v text)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE big, live`)
	// Chunks of 10 rows, 40 at most once they grow (while no change arrives inside a window):
	// 5,000 chunks at least, each with a watermark commit, cannot fit in one second on any
	// machine (with chunks of 100 a fast, idle machine finished in one sync; with 30,000 rows,
	// once chunks grew, so did this one).
	e.cfg["backfill_chunk_size"] = 10
	e.cfg["sync_time_budget_seconds"] = 1
	cat := e.catalog()
	d := newDestination(map[string][]string{"public.big": {"id"}, "public.live": {"id"}})
	// The other table changes all along.
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		conn := e.db.Connect()
		defer conn.Close(context.Background())
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if _, err := conn.Exec(context.Background(), `INSERT INTO live VALUES ($1, 'v')`, i); err != nil {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		<-done
	}()
	var state []byte
	var cursor int
	syncs, writing, starved := 0, 0, 0
	liveRows := func() int {
		var n int
		require.NoError(t, e.db.Conn.QueryRow(context.Background(), `SELECT count(*) FROM live`).Scan(&n))
		return n
	}
	for ; syncs < 600; syncs++ {
		if syncs == 10 {
			// Ten syncs resumed mid-table (about 60 at this pace to the end, a minute and a
			// half of the test run): the rest in larger chunks and a longer budget.
			e.cfg["backfill_chunk_size"] = 5000
			e.cfg["sync_time_budget_seconds"] = 5
		}
		before := liveRows()
		r := e.tryRead(cat, state)
		for try := 0; r.code != 0 && strings.Contains(r.stderr, `"failure_type":"transient_error"`) && try < 3; try++ {
			// A loaded machine: the one-second budget ran out before the read got going (one CI
			// run), which the platform retries from the same state.
			t.Logf("sync %d failed transiently, tried again: %s", syncs, tail(r.stderr))
			r = e.tryRead(cat, state)
		}
		require.Equal(t, 0, r.code, "read failed:\n%s", tail(r.stderr))
		// The writer was starved (a loaded machine: one CI run had it write nothing for a whole
		// sync): there was no change for the sync to deliver.
		wrote := liveRows() - before
		d.apply(t, r.records())
		state = r.lastState(t)
		live, first := 0, -1
		for _, m := range r.records() {
			stream, data := recordOf(t, m)
			if stream == "public.live" {
				live++
			} else if first < 0 {
				fmt.Sscan(string(data["id"]), &first)
			}
		}
		if wrote >= 2 {
			writing++
			if live == 0 {
				// One CI run, its machine loaded: a one-second sync ended before the stream
				// reached any of the 96 rows written during it. A sync now and then may; the
				// backfill holding changes back would starve them all.
				starved++
				t.Logf("sync %d delivered none of the other table's %d changes written during it", syncs, wrote)
			}
		}
		if first >= 0 {
			require.Greater(t, first, cursor, "sync %d resumed after the last sync's cursor", syncs)
		}
		var st []struct {
			Global struct {
				StreamStates []struct {
					Desc  streamDescriptor `json:"stream_descriptor"`
					State tableState       `json:"stream_state"`
				} `json:"stream_states"`
			} `json:"global"`
		}
		require.NoError(t, json.Unmarshal(state, &st))
		var big tableState
		for _, ss := range st[0].Global.StreamStates {
			if ss.Desc.Name == "big" {
				big = ss.State
			}
		}
		if big.Done {
			break
		}
		require.NotEmpty(t, big.Cursor, "sync %d ended mid-table with a cursor", syncs)
		fmt.Sscan(big.Cursor[0], &cursor)
	}
	require.LessOrEqual(t, starved*4, writing, "%d of the %d syncs during which the other table changed delivered none of its changes", starved, writing)
	require.Greater(t, syncs, 1, "the backfill took several syncs")
	require.Less(t, syncs, 600)
	close(stop)
	<-done
	stop = make(chan struct{})
	r := e.read(cat, state)
	d.apply(t, r.records())
	d.equalsSource(t, e, "public.big")
	d.equalsSource(t, e, "public.live")
	t.Logf("backfilled in %d syncs", syncs+1)
}

// TestStreamsAddedAndRemoved: a stream added to the catalog is backfilled while the others keep
// streaming; a stream removed is no longer emitted.
func TestStreamsAddedAndRemoved(t *testing.T) {
	e := newEnv(t)
	for _, tb := range []string{"a", "b"} {
		e.db.Exec(`CREATE TABLE ` + tb + ` (id int PRIMARY KEY, v text)`)
		e.db.Exec(`INSERT INTO ` + tb + ` SELECT g, 'v' FROM generate_series(1, 3000) g`)
	}
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE a, b`)
	e.cfg["backfill_chunk_size"] = 500
	d := newDestination(map[string][]string{"public.a": {"id"}, "public.b": {"id"}})
	onlyA := e.catalog("public.a")
	r := e.read(onlyA, nil)
	d.apply(t, r.records())

	// b joins while a changes.
	e.db.Exec(`UPDATE a SET v = 'changed' WHERE id <= 10`)
	both := e.catalog("public.a", "public.b")
	stop, done, committed := liveWorkload(t, e, []string{"a", "b"}, 3000)
	r = e.read(both, r.lastState(t))
	close(stop)
	<-done
	require.Positive(t, committed.Load(), "the workload committed during the read")
	d.apply(t, r.records())
	counts := map[string]int{}
	for _, m := range r.records() {
		s, _ := recordOf(t, m)
		counts[s]++
	}
	require.GreaterOrEqual(t, counts["public.a"], 10, "a's changes flowed")
	require.GreaterOrEqual(t, counts["public.b"], 2900, "b was backfilled")
	r = e.read(both, r.lastState(t))
	d.apply(t, r.records())
	d.equalsSource(t, e, "public.a")
	d.equalsSource(t, e, "public.b")

	// a leaves: its changes are no longer emitted, and its state is gone.
	onlyB := e.catalog("public.b")
	e.db.Exec(`UPDATE a SET v = 'after removal'`)
	e.db.Exec(`UPDATE b SET v = 'b changed' WHERE id = 1`)
	r = e.read(onlyB, r.lastState(t))
	for _, m := range r.records() {
		s, _ := recordOf(t, m)
		require.Equal(t, "public.b", s)
	}
	require.Len(t, r.records(), 1)
	require.NotContains(t, string(r.lastState(t)), `"name":"a"`)
}

// TestMigrationFromAirbyteState: a state written by Airbyte's own source-postgres (a Debezium
// offset, per-stream ctid or cursor states) carries on: finished streams stream from its LSN,
// streams in their initial load are backfilled.
func TestMigrationFromAirbyteState(t *testing.T) {
	e := newEnv(t)
	for _, tb := range []string{"done_t", "loading_t"} {
		e.db.Exec(`CREATE TABLE ` + tb + ` (id int PRIMARY KEY, v text)`)
		e.db.Exec(`INSERT INTO ` + tb + ` SELECT g, 'v' FROM generate_series(1, 100) g`)
	}
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE done_t, loading_t`)
	e.db.Exec(`SELECT pg_create_logical_replication_slot('` + e.db.Slot + `', 'pgoutput')`)
	lsn := e.db.CurrentLSN()
	e.db.Exec(`INSERT INTO done_t VALUES (101, 'after the state')`)
	e.db.Exec(`UPDATE done_t SET v = 'changed' WHERE id = 1`)
	cat := e.catalog()
	offset, _ := json.Marshal(map[string]any{"transaction_id": nil, "lsn": uint64(lsn), "txId": 1234, "ts_usec": 1700000000000000})
	key, _ := json.Marshal([]any{e.db.Name, map[string]string{"server": e.db.Name}})
	shared := map[string]any{"state": map[string]string{string(key): string(offset)}}
	for name, state := range map[string]any{
		"global": []any{map[string]any{"type": "GLOBAL", "global": map[string]any{
			"shared_state": shared,
			"stream_states": []any{
				map[string]any{"stream_descriptor": map[string]any{"name": "done_t", "namespace": "public"},
					"stream_state": map[string]any{"version": 2, "state_type": "cursor_based", "stream_name": "done_t", "stream_namespace": "public", "cursor_field": []any{}}},
				map[string]any{"stream_descriptor": map[string]any{"name": "loading_t", "namespace": "public"},
					"stream_state": map[string]any{"version": 2, "state_type": "ctid", "ctid": "(0,42)", "relation_filenode": 16400}},
			}}, "sourceStats": map[string]any{"recordCount": 0.0}}},
		"legacy": map[string]any{"cdc": true, "cdc_state": shared,
			"streams": []any{map[string]any{"stream_name": "done_t", "stream_namespace": "public", "cursor_field": []any{}}}},
	} {
		t.Run(name, func(t *testing.T) {
			e.t = t
			b, _ := json.Marshal(state)
			r := e.read(cat, b)
			counts := map[string]int{}
			for _, m := range r.records() {
				s, _ := recordOf(t, m)
				counts[s]++
			}
			require.Equal(t, 2, counts["public.done_t"], "only the changes after the Airbyte state")
			require.Equal(t, 100, counts["public.loading_t"], "the stream in its initial load is backfilled")
			require.Contains(t, r.stderr, "migrated")
			d := newDestination(map[string][]string{"public.done_t": {"id"}, "public.loading_t": {"id"}})
			d.apply(t, r.records())
			require.Equal(t, "\"changed\"", string(d.rows["public.done_t"]["1"]["v"]))
		})
	}
}
