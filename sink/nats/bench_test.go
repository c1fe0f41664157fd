package nats_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/sink"
	"github.com/tidemark/tidemark/sink/jsonl"
	tmnats "github.com/tidemark/tidemark/sink/nats"
)

// BenchmarkNATSVsJSONL backfills one table through the engine into the JSON lines writer (a
// file) and into the NATS output (three subjects; the in-process three-node cluster, the stream
// with one replica and then three, unless $TIDEMARK_TEST_NATS names a cluster), in the same run,
// and reports each one's rows per second, the NATS output's as a ratio of the JSON lines one's,
// and this process's CPU seconds per million rows for each (the in-process servers' work is in
// this process's too). docs/benchmarks.md has the figures.
func BenchmarkNATSVsJSONL(b *testing.B) {
	db := e2e.NewTestDB(b, server)
	rows := 200_000
	if v := os.Getenv("TIDEMARK_BENCH_ROWS"); v != "" {
		fmt.Sscan(v, &rows)
	}
	db.Exec(`CREATE TABLE bench (id bigint PRIMARY KEY, a text, b bigint, c timestamptz, d numeric(12,2))`)
	db.Exec(fmt.Sprintf(`INSERT INTO bench SELECT g, md5(g::text), g * 7, '2026-01-01'::timestamptz + g * interval '1 second', g / 100.0 FROM generate_series(1, %d) g`, rows))
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE bench`)
	ctx := context.Background()
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	run := func(slot string, open func() (sink.Output, *merge.Position)) (time.Duration, time.Duration) {
		out, from := open()
		defer out.Close(ctx)
		cfg := merge.Config{Source: replicator.Config{DSN: db.DSN, Slot: slot, Publication: db.Publication, CreateSlot: true},
			AckCheckpoints: true, StopWhenCaughtUp: true, Tables: []merge.TableConfig{{Schema: "public", Name: "bench"}}}
		eng, err := merge.New(cfg, out, zerolog.Nop())
		if err != nil {
			b.Fatal(err)
		}
		c0, t0 := cpu(), time.Now()
		if err := eng.Run(ctx, from); err != nil {
			b.Fatal(err)
		}
		wall, used := time.Since(t0), cpu()-c0
		db.Exec(`SELECT pg_drop_replication_slot($1)`, slot)
		return wall, used
	}
	for i := 0; b.Loop(); i++ {
		file := filepath.Join(b.TempDir(), "out.jsonl")
		jw, jc := run(fmt.Sprintf("%s_j%d", db.Slot, i), func() (sink.Output, *merge.Position) {
			w, from, err := jsonl.Open(file, "", pgjson.NewRegistry(db.Connect()), func() error { return nil })
			if err != nil {
				b.Fatal(err)
			}
			return w, from
		})
		mrows := float64(rows) / 1e6
		b.ReportMetric(float64(rows)/jw.Seconds(), "jsonl_rows/s")
		b.ReportMetric(jc.Seconds()/mrows, "jsonl_cpu_s/Mrows")
		for _, replicas := range []int{1, 3} {
			addr, _ := e2e.NATS(b)
			slot := fmt.Sprintf("%s_n%d_%d", db.Slot, i, replicas)
			nw, nc := run(slot, func() (sink.Output, *merge.Position) {
				s, from, err := tmnats.Open(ctx, tmnats.Options{Address: addr, Tables: []string{"public.bench"}, Partitions: 3, Replicas: replicas, Slot: slot,
					Types: pgjson.NewRegistry(db.Connect()), Log: zerolog.Nop()}, func() error { return nil })
				if err != nil {
					b.Fatal(err)
				}
				return s, from
			})
			b.ReportMetric(float64(rows)/nw.Seconds(), fmt.Sprintf("nats_r%d_rows/s", replicas))
			b.ReportMetric(jw.Seconds()/nw.Seconds(), fmt.Sprintf("nats_r%d/jsonl", replicas))
			b.ReportMetric(nc.Seconds()/mrows, fmt.Sprintf("nats_r%d_cpu_s/Mrows", replicas))
		}
	}
}
