package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgconf"
)

// TestChunkByteBound: rows of a megabyte each, a chunk limit of 100 rows and a bound of 3 MB: a
// chunk ends at the bound (not done), so a table of wide rows is read a few rows at a time
// instead of a hundred at once; every row is read once over the chunks.
func TestChunkByteBound(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE w (id int PRIMARY KEY, v text)`)
	// Random text: TOAST's compression would shrink a repeated one.
	db.Exec(`INSERT INTO w SELECT g, (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 32768) i) FROM generate_series(1, 20) g`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgconf.Parse(db.DSN, "test")
	require.NoError(t, err)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	tbl, err := chunker.Discover(ctx, conn, "public", "w", nil, "")
	require.NoError(t, err)
	reader, err := chunker.NewReader(conn, chunker.Config{MaxBytes: 3 << 20})
	require.NoError(t, err)
	var after []string
	seen := 0
	for range 20 {
		c, err := reader.Next(ctx, tbl, after, []string{"20"}, 100)
		require.NoError(t, err)
		require.LessOrEqual(t, c.Bytes, 4<<20, "a chunk holds about the bound, not its row limit")
		seen += len(c.Rows)
		if c.Done {
			break
		}
		require.True(t, c.Capped)
		after = c.Last
	}
	require.Equal(t, 20, seen)
}
