package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/merge"
)

// TestEstimates: a table's row estimate does not need reltuples: -1 right after a load or a
// restore (never vacuumed or analyzed) and always for a partitioned table, it is made from the
// pages on disk, and a partitioned table's is its partitions' sum.
func TestEstimates(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.plain (id int PRIMARY KEY, v text);
		INSERT INTO public.plain SELECT g, md5(g::text) FROM generate_series(1, 20000) g;
		CREATE TABLE public.parted (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);
		CREATE TABLE public.parted_1 PARTITION OF public.parted FOR VALUES FROM (0) TO (10000);
		CREATE TABLE public.parted_2 PARTITION OF public.parted FOR VALUES FROM (10000) TO (30000);
		INSERT INTO public.parted SELECT g, md5(g::text) FROM generate_series(1, 20000) g;
		CHECKPOINT`)
	// As after a load, whatever autovacuum did meanwhile.
	db.Exec(`UPDATE pg_class SET reltuples = -1 WHERE oid IN ('public.plain'::regclass, 'public.parted'::regclass, 'public.parted_1'::regclass, 'public.parted_2'::regclass)`)
	s := newSyncStats([]merge.TableConfig{{Schema: "public", Name: "plain"}, {Schema: "public", Name: "parted"}})
	s.estimates(context.Background(), db.Conn)
	for _, name := range []string{"public.plain", "public.parted"} {
		require.InDelta(t, 20000, s.estimate[name], 10000, "%s: an estimate within a factor of two of its 20000 rows", name)
	}
	db.Exec(`ANALYZE public.plain`)
	s.estimates(context.Background(), db.Conn)
	require.InDelta(t, 20000, s.estimate["public.plain"], 200)
}

// TestProgressDisplay drives the progress bars on a pseudo-terminal: a table whose size is
// unknown shows its rows and "?", one past a stale estimate stays below 100 %, neither says done;
// a table a previous run finished says "done earlier" with its rows; the live line has no bar;
// and a terminal without a width gets log lines instead.
func TestProgressDisplay(t *testing.T) {
	s := newSyncStats([]merge.TableConfig{{Schema: "public", Name: "unknown"}, {Schema: "public", Name: "stale"}, {Schema: "public", Name: "resumed"}, {Schema: "public", Name: "finished"}})
	s.estimate["public.unknown"], s.snapshot["public.unknown"] = -1, 500
	s.estimate["public.stale"], s.snapshot["public.stale"] = 100, 300
	s.estimate["public.finished"], s.snapshot["public.finished"], s.done["public.finished"] = 50, 50, true
	s.estimate["public.resumed"] = 1000
	s.resumed(&merge.Position{Tables: map[string]*merge.TableProgress{"public.resumed": {Done: true, Rows: 1000}}})
	for _, n := range []string{"public.unknown", "public.stale", "public.finished"} {
		s.firstRow[n] = time.Now().Add(-time.Second)
	}
	lines := onTerminal(t, 140, 20, func(e *env) {
		ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
		defer cancel()
		s.display(ctx, e)
	})
	final := strings.Join(lines, "\n")
	t.Log("\n" + final)
	line := func(name string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, name+" ") {
				return l
			}
		}
		t.Fatalf("no line for %s:\n%s", name, final)
		return ""
	}
	require.Contains(t, line("public.unknown"), "500 / ? rows")
	require.Contains(t, line("public.unknown"), "? %")
	require.NotContains(t, line("public.unknown"), "done")
	require.Contains(t, line("public.stale"), "300 / ~100 rows")
	require.Contains(t, line("public.stale"), "99 %")
	require.NotContains(t, line("public.stale"), "done")
	require.Contains(t, line("public.resumed"), "done earlier (1000 rows)")
	require.Contains(t, line("public.finished"), "100 %")
	require.Contains(t, line("public.finished"), "done")
	for _, l := range lines {
		if strings.HasPrefix(l, "changes ") {
			require.NotContains(t, l, "[", "the live line has no bar: %q", l)
		}
	}

	// A pseudo-terminal nobody sized: log lines, not bars.
	m2, s2, err := openPTY(0, 0)
	require.NoError(t, err)
	defer m2.Close()
	defer s2.Close()
	require.False(t, newEnv(s2, s2).terminal)
}

// optionalSink is an output with every optional interface of merge.Sink that the engine asks
// for by type: the stats wrapper must pass each on (a wrapper that hid Leftover once kept a
// NATS output from starting over on a slot created again).
type optionalSink struct {
	merge.Sink
	calls []string
}

func (o *optionalSink) Replaying() bool              { o.calls = append(o.calls, "replaying"); return true }
func (o *optionalSink) Resume(*merge.Position, bool) { o.calls = append(o.calls, "resume") }
func (o *optionalSink) Leftover(start pglogrepl.LSN) bool {
	o.calls = append(o.calls, "leftover")
	return start == 7
}

func TestStatsSinkPassesOn(t *testing.T) {
	o := &optionalSink{}
	var w merge.Sink = statsSink{Sink: o, s: newSyncStats(nil)}
	r, ok := w.(merge.Replayer)
	require.True(t, ok)
	require.True(t, r.Replaying())
	rs, ok := w.(merge.Resumer)
	require.True(t, ok)
	rs.Resume(&merge.Position{}, false)
	l, ok := w.(merge.Leftover)
	require.True(t, ok)
	require.True(t, l.Leftover(7))
	require.False(t, l.Leftover(8))
	require.Equal(t, []string{"replaying", "resume", "leftover", "leftover"}, o.calls)
}
