package e2e_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/merge"
)

// BenchmarkHotRowBackfill: what rows updated inside every window, each update leaving a TOASTed
// value out, cost their table's backfill: backfills of a 20,000-row table (a 2 kB TOASTed jsonb
// per row, chunks of 1,000) while, after each chunk's SELECT, either three of its rows are
// updated (hot) or a row of another table is (cold: the same writes, no hot row). It reports the
// windows per backfill (chunks, and re-reads of rows a change left without their TOASTed value),
// and this process's CPU seconds per backfill beside the wall time. Before a window filled such
// rows from its chunk, the hot backfill never ended. Run it with
// go test -run '^$' -bench HotRow -benchtime 3x ./e2e.
func BenchmarkHotRowBackfill(b *testing.B) {
	for _, hot := range []bool{false, true} {
		b.Run(fmt.Sprint("hot=", hot), func(b *testing.B) {
			db := e2e.NewTestDB(b, server)
			toastedTable(db, "t", 20000, 60)
			db.Exec(`CREATE TABLE other (id int PRIMARY KEY, n int)`)
			db.Exec(`INSERT INTO other VALUES (1, 0)`)
			update := `UPDATE other SET n = n + 1 WHERE id = 1`
			if hot {
				update = `UPDATE t SET n = n + 1, ver = nextval('ver') WHERE id IN (500, 10500, 19500)`
			}
			conn := db.Connect()
			defer conn.Close(context.Background())
			var windows atomic.Int64
			var cpu time.Duration
			b.ResetTimer()
			for i := range b.N {
				cfg := engineConfig(db, "public.t")
				cfg.ChunkSize = 1000
				cfg.Source.Slot = fmt.Sprintf("%s_%d", db.Slot, i)
				cfg.Hooks.AfterSelect = func(ctx context.Context, _ int64) {
					windows.Add(1)
					if _, err := conn.Exec(ctx, update); err != nil && ctx.Err() == nil {
						b.Errorf("update: %v", err)
					}
				}
				eng, err := merge.New(cfg, newMemSink(), zerolog.Nop())
				if err != nil {
					b.Fatal(err)
				}
				before := rusage()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				err = eng.Run(ctx, nil)
				cancel()
				cpu += rusage() - before
				if err != nil {
					b.Fatal(err)
				}
				db.Exec(`SELECT pg_drop_replication_slot('` + cfg.Source.Slot + `')`)
			}
			b.ReportMetric(float64(windows.Load())/float64(b.N), "windows/backfill")
			b.ReportMetric(cpu.Seconds()/float64(b.N), "engine-cpu-s/backfill")
		})
	}
}

// rusage is this process's user and system CPU time so far.
func rusage() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
