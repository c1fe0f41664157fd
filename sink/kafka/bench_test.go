package kafka_test

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
	"github.com/tidemark/tidemark/sink/kafka"
)

// benchRows is the bench table's size: $TIDEMARK_BENCH_ROWS, or 200,000.
func benchRows() int {
	n := 200_000
	if v := os.Getenv("TIDEMARK_BENCH_ROWS"); v != "" {
		fmt.Sscan(v, &n)
	}
	return n
}

// cpu is this process's CPU time (user and system): the engine, the sink, and with kfake the
// in-process brokers too.
func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkKafkaVsJSONL backfills one table through the engine into the JSON lines writer (a
// file) and into the Kafka output (three partitions, exactly once; the in-process kfake cluster
// unless $TIDEMARK_TEST_KAFKA names one), in the same run, and reports each one's rows per
// second, the Kafka output's as a ratio of the JSON lines one's, and this process's CPU seconds
// per million rows for each (with kfake, the brokers' work is in this process's too).
// docs/benchmarks.md has the figures.
func BenchmarkKafkaVsJSONL(b *testing.B) {
	db := e2e.NewTestDB(b, server)
	rows := benchRows()
	db.Exec(`CREATE TABLE bench (id bigint PRIMARY KEY, a text, b bigint, c timestamptz, d numeric(12,2))`)
	db.Exec(fmt.Sprintf(`INSERT INTO bench SELECT g, md5(g::text), g * 7, '2026-01-01'::timestamptz + g * interval '1 second', g / 100.0 FROM generate_series(1, %d) g`, rows))
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE bench`)
	ctx := context.Background()
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
		addr := e2e.Kafka(b)
		slot := fmt.Sprintf("%s_k%d", db.Slot, i)
		kw, kc := run(slot, func() (sink.Output, *merge.Position) {
			s, from, err := kafka.Open(ctx, kafka.Options{Address: addr, Tables: []string{"public.bench"}, Partitions: 3, Slot: slot,
				Types: pgjson.NewRegistry(db.Connect()), Log: zerolog.Nop()}, func() error { return nil })
			if err != nil {
				b.Fatal(err)
			}
			return s, from
		})
		mrows := float64(rows) / 1e6
		b.ReportMetric(float64(rows)/jw.Seconds(), "jsonl_rows/s")
		b.ReportMetric(float64(rows)/kw.Seconds(), "kafka_rows/s")
		b.ReportMetric(jw.Seconds()/kw.Seconds(), "kafka/jsonl")
		b.ReportMetric(jc.Seconds()/mrows, "jsonl_cpu_s/Mrows")
		b.ReportMetric(kc.Seconds()/mrows, "kafka_cpu_s/Mrows")
	}
}
