package e2e_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// A table-rewriting ALTER (ALTER COLUMN ... TYPE) holds its lock while a chunk's transaction
// starts. The chunk must not take its REPEATABLE READ snapshot before it has the table's lock:
// a snapshot from before the rewrite sees none of the rewritten table's rows (their xmin is the
// ALTER's), and the chunk would end the backfill with the rest of the table unread. Found by an
// adversarial review.
func TestRewriteWhileChunkWaits(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 95, 1)
	cfg := engineConfig(db, "public.t")
	conn := db.Connect()
	var once sync.Once
	cfg.Hooks.AfterLow = func(ctx context.Context, id int64) {
		if id != 3 {
			return
		}
		once.Do(func() {
			if _, err := conn.Exec(ctx, `BEGIN; ALTER TABLE t ALTER COLUMN ver TYPE numeric`); err != nil {
				t.Errorf("alter: %v", err)
			}
			go func() {
				time.Sleep(500 * time.Millisecond)
				if _, err := conn.Exec(context.Background(), `COMMIT`); err != nil {
					t.Errorf("commit: %v", err)
				}
			}()
		})
	}
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
}

// TestRewriteWhileFirstChunkWaits: the same while the table's first read (its upper bound, or
// whether it is empty) waits for the rewrite's lock.
func TestRewriteWhileFirstChunkWaits(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 95, 1)
	db.Exec(`SELECT pg_create_logical_replication_slot('` + db.Slot + `', 'pgoutput')`)
	cfg := engineConfig(db, "public.t")
	conn := db.Connect()
	_, err := conn.Exec(context.Background(), `BEGIN; ALTER TABLE t ALTER COLUMN ver TYPE numeric`)
	require.NoError(t, err)
	go func() {
		time.Sleep(1500 * time.Millisecond)
		if _, err := conn.Exec(context.Background(), `COMMIT`); err != nil {
			t.Errorf("commit: %v", err)
		}
	}()
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.t", "id")
}
