package jsonl_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/sink/jsonl"
)

// twoPools encodes every batch with one encoder and with a pool of four, and keeps the first
// batch whose lines differ.
type twoPools struct {
	one, four *jsonl.Pool
	diff      string
	lines     int
	big       int // batches large enough for the pool to split
}

func (s *twoPools) Emit(ctx context.Context, evs []merge.Event) error {
	var a, b bytes.Buffer
	writes := 0
	if err := s.one.Encode(ctx, evs, func(p []byte) error { a.Write(p); return nil }); err != nil {
		return err
	}
	if err := s.four.Encode(ctx, evs, func(p []byte) error { b.Write(p); writes++; return nil }); err != nil {
		return err
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) && s.diff == "" {
		s.diff = fmt.Sprintf("a batch of %d events:\none encoder:\n%.2000s\nfour:\n%.2000s", len(evs), a.String(), b.String())
	}
	s.lines += bytes.Count(a.Bytes(), []byte("\n"))
	if writes > 1 && writes < len(evs) {
		s.big++
	}
	return nil
}

func (s *twoPools) Checkpoint(context.Context, *merge.Position) error { return nil }

// TestPoolLinesAsOneEncoder: the ordered pool's lines, four encoders at once, are one
// encoder's, byte for byte and in order, for a backfill of several tables and types (chunks of
// thousands of rows, split among the encoders) and for large transactions of changes (times,
// xids, lossy values, unchanged TOASTed values), whatever the part each event falls in.
func TestPoolLinesAsOneEncoder(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY, v int, n numeric, ts timestamptz, arr int[], doc text, f float8)`)
	db.Exec(`ALTER TABLE a ALTER COLUMN doc SET STORAGE EXTERNAL`)
	db.Exec(`CREATE TABLE b (k text PRIMARY KEY, j jsonb)`)
	db.Exec(`INSERT INTO a SELECT g, g % 7, g / 3.0, '2026-01-01'::timestamptz + g * interval '1 second', ARRAY[g, NULL], CASE WHEN g % 100 = 0 THEN repeat('x', 5000) END,
		CASE WHEN g % 50 = 0 THEN 'NaN'::float8 ELSE g / 7.0 END FROM generate_series(1, 5000) g`)
	db.Exec(`INSERT INTO b SELECT 'k' || g, jsonb_build_object('g', g) FROM generate_series(1, 3000) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE a, b`)
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	db.Exec(`UPDATE a SET v = v + 1 WHERE id <= 2000`) // unchanged TOASTed doc on every hundredth
	db.Exec(`INSERT INTO b SELECT 'n' || g, NULL FROM generate_series(1, 1500) g`)
	db.Exec(`DELETE FROM a WHERE id > 4000`)
	types := pgjson.NewRegistry(db.Connect())
	s := &twoPools{one: jsonl.NewPool(types, 1), four: jsonl.NewPool(types, 4)}
	require.Equal(t, 4, s.four.Encoders())
	cfg := merge.Config{Source: replicator.Config{DSN: db.DSN, Slot: db.Slot, Publication: db.Publication}, StopWhenCaughtUp: true, ChunkSize: 2500,
		Tables: []merge.TableConfig{{Schema: "public", Name: "a"}, {Schema: "public", Name: "b"}}}
	eng, err := merge.New(cfg, s, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	require.NoError(t, eng.Run(context.Background(), nil))
	require.Empty(t, s.diff)
	require.GreaterOrEqual(t, s.lines, 8000+2000+1500+1000, "the backfill and the changes")
	require.Positive(t, s.big, "batches split among the encoders")
}
