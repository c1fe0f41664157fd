package e2e_test

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// TestForeignMessageNotHeld: pg_logical_emit_message is executable by every role, and what it
// writes reaches every logical slot of the database. A role without privileges writes a
// message of 128 MB while the capture streams: the capture's memory must not grow by it (the
// stream drops a message that is not Tidemark's as it comes, unread), and the capture goes on.
func TestForeignMessageNotHeld(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 50, 1)
	cfg := engineConfig(db, "public.t")
	cfg.StopWhenCaughtUp = true
	// The message is in the WAL before the capture starts: the stream meets it first thing.
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	db.Exec(`SELECT pg_logical_emit_message(true, 'someone-else', repeat('x', 128 << 20))`)
	db.Exec(`SELECT pg_logical_emit_message(false, 'tidemark', repeat('y', 16 << 20))`)
	db.Exec(`INSERT INTO t (id, v) VALUES (1000, 'after the messages')`)
	cfg.Source.CreateSlot = false

	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
		}
	})
	sink := newMemSink()
	err := runEngine(t, cfg, sink, nil)
	close(stop)
	wg.Wait()
	require.NoError(t, err)
	verify(t, db, sink, "public.t", "id")
	grew := int64(peak.Load()) - int64(base.HeapAlloc)
	t.Logf("heap grew by %d MB at most while streaming past a 128 MB message", grew>>20)
	require.Less(t, grew, int64(48<<20), "the capture held the foreign message (or the oversized one of its own prefix)")
}
