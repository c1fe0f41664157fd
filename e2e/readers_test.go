package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/merge"
)

// windowSpans records, from the hooks, when each chunk's window was open (its low watermark
// committed to its high one), to tell whether windows of several readers were open at once.
type windowSpans struct {
	mu    sync.Mutex
	low   map[int64]time.Time
	spans [][3]int64 // chunk id, opened, closed (UnixNano)
}

func newWindowSpans() *windowSpans { return &windowSpans{low: map[int64]time.Time{}} }

func (s *windowSpans) opened(_ context.Context, id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.low[id] = time.Now()
}

func (s *windowSpans) closed(_ context.Context, id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if at, ok := s.low[id]; ok {
		s.spans = append(s.spans, [3]int64{id, at.UnixNano(), time.Now().UnixNano()})
		delete(s.low, id)
	}
}

// overlaps counts the pairs of windows of different readers (chunk ids are strided: reader
// (id-1) mod readers) that were open at once.
func (s *windowSpans) overlaps(readers int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for i, a := range s.spans {
		for _, b := range s.spans[i+1:] {
			if (a[0]-1)%readers != (b[0]-1)%readers && a[1] < b[2] && b[1] < a[2] {
				n++
			}
		}
	}
	return n
}

// TestReadersInParallel: three tables backfilled by three readers at once (Config.Readers)
// while a workload writes all three; windows of different readers are open at the same time,
// each table's output replays to the source, and the bounded run ends once every table is done
// (each reader writes its fence when it has nothing left; the run ends at a fence with no work
// pending anywhere).
func TestReadersInParallel(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE SEQUENCE ver`)
	names := []string{"a", "b", "c"}
	for i, n := range names {
		db.Exec(fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, v text, ver bigint NOT NULL DEFAULT nextval('ver'))`, n))
		db.Exec(fmt.Sprintf(`INSERT INTO %s (id, v) SELECT g, 'v' || g FROM generate_series(1, $1) g`, n), 2000*(i+1))
	}
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE a, b, c`)
	conn := db.Connect()
	stop := background(t, func(ctx context.Context) {
		r := rand.New(rand.NewPCG(20, 12))
		for ctx.Err() == nil {
			n, id := names[r.IntN(len(names))], 1+r.IntN(7000)
			var sql string
			switch r.IntN(4) {
			case 0:
				sql = fmt.Sprintf(`INSERT INTO %s (id, v) VALUES (%d, 'ins') ON CONFLICT (id) DO NOTHING`, n, id)
			case 1:
				sql = fmt.Sprintf(`DELETE FROM %s WHERE id = %d`, n, id)
			default:
				sql = fmt.Sprintf(`UPDATE %s SET v = 'upd', ver = nextval('ver') WHERE id = %d`, n, id)
			}
			_, _ = conn.Exec(ctx, sql)
		}
	})
	cfg := engineConfig(db, "public.a", "public.b", "public.c")
	cfg.ChunkSize, cfg.ChunkGrowth, cfg.Readers = 100, 1, 3
	spans := newWindowSpans()
	cfg.Hooks.AfterLow, cfg.Hooks.AfterHigh = spans.opened, spans.closed
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	for _, n := range names {
		require.True(t, sink.last().Tables["public."+n].Done, "the bounded run ended with %s done", n)
	}
	stop()
	catchUp(t, cfg, sink)
	for _, n := range names {
		verify(t, db, sink, "public."+n, "id")
	}
	require.Greater(t, sink.count("update"), 20, "the workload ran during the backfill")
	require.Positive(t, spans.overlaps(3), "windows of different readers were open at once")
}

// TestKeyRangeReaders: one table, three readers. Its backfill is split into key ranges after
// its first chunk, from a sample of its pages, and the readers read them at once while a
// workload writes the table; windows of different readers are open together. The run is
// stopped in the middle and resumed with two readers from its last checkpoint, whose ranges
// (three) are dealt to the two; the output replays to the source.
func TestKeyRangeReaders(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 9000, 1)
	db.Exec(`ANALYZE t`)
	stop := workload(t, db, 3, 9500)
	cfg := engineConfig(db, "public.t")
	cfg.ChunkSize, cfg.ChunkGrowth, cfg.Readers = 100, 1, 3
	cfg.StopWhenCaughtUp = false
	spans := newWindowSpans()
	cfg.Hooks.AfterLow, cfg.Hooks.AfterHigh = spans.opened, spans.closed
	sink := newMemSink()
	eng, err := merge.New(cfg, sink, testLogger(t))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- eng.Run(ctx, nil) }()
	var mid *merge.Position
	e2e.WaitFor(t, 2*time.Minute, "a third of the ranges' rows", func() bool {
		mid = sink.last()
		return mid != nil && len(mid.Tables["public.t"].Ranges) == 3 && mid.Tables["public.t"].Rows >= 3000
	})
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	mid = sink.last()
	p := mid.Tables["public.t"]
	require.False(t, p.Done, "stopped mid-backfill")
	require.Len(t, p.Ranges, 3, "split into one range per reader")
	moved := 0
	for i, r := range p.Ranges {
		require.NotNil(t, r.Cursor, "range %d", i)
		if i > 0 && !slices.Equal(r.Cursor, p.Ranges[i-1].To) {
			moved++
		}
	}
	require.Positive(t, moved, "ranges after the first were read from their start")
	require.Positive(t, spans.overlaps(3), "windows of different readers were open at once")

	stop()
	cfg.StopWhenCaughtUp, cfg.Readers = true, 2
	cfg.Source.CreateSlot = false
	cfg.Hooks = merge.Hooks{}
	require.NoError(t, runEngine(t, cfg, sink, mid))
	last := sink.last().Tables["public.t"]
	require.True(t, last.Done)
	for i, r := range last.Ranges {
		require.True(t, r.Done, "range %d", i)
	}
	verify(t, db, sink, "public.t", "id")
	require.Greater(t, sink.count("update"), 20, "the workload ran during the backfill")
}
