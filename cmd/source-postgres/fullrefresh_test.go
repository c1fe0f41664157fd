package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgjson"
)

// writeSizes records the largest single write it receives, and the total.
type writeSizes struct{ largest, total int }

func (w *writeSizes) Write(p []byte) (int, error) {
	w.largest = max(w.largest, len(p))
	w.total += len(p)
	return len(p), nil
}

// TestFullRefreshWritesInPieces: a full refresh's chunk of wide rows is encoded and written in
// pieces of about a megabyte, not held whole as one buffer of records (a chunk of 10,000 rows
// of megabytes each would be gigabytes).
func TestFullRefreshWritesInPieces(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE w (id int PRIMARY KEY, v text)`)
	// 100 rows of 100 kB: one chunk of 10 MB.
	db.Exec(`INSERT INTO w SELECT g, repeat(md5(g::text), 3200) FROM generate_series(1, 100) g`)
	ctx := context.Background()
	cc, err := pgconf.Parse(db.DSN, "test")
	require.NoError(t, err)
	conn, err := pgx.ConnectConfig(ctx, cc)
	require.NoError(t, err)
	defer conn.Close(ctx)

	w := &writeSizes{}
	s := &source{cfg: &config{BackfillChunkSize: 10000, ReplicationMethod: &replicationMethod{Method: "CDC"}}, out: newOutput(w, nil), log: zerolog.New(zerolog.NewTestWriter(t))}
	st := &readStream{desc: streamDescriptor{Name: "w"}, schema: "public", name: "w", exists: true}
	r := &reader{s: s, streams: []*readStream{st}, types: pgjson.NewRegistry(conn), conn: conn}
	require.NoError(t, r.fullRefresh(ctx, st))
	require.NoError(t, s.out.w.Flush())

	require.True(t, st.fr.Done)
	require.EqualValues(t, 100, st.fr.Rows)
	require.Greater(t, w.total, 10_000_000, "every row written")
	require.LessOrEqual(t, w.largest, 2<<20, "the largest piece written at once")
}

// TestFullRefreshChunksBoundedInBytes: a full refresh reads a table of wide rows in chunks
// bounded in bytes (the chunk reader's default bound, 64 MiB), not in one chunk of its row limit,
// and still reads every row once.
func TestFullRefreshChunksBoundedInBytes(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE w (id int PRIMARY KEY, v text)`)
	// 100 rows of 1 MiB (compressed on disk): 100 MiB, under the row limit of one chunk.
	db.Exec(`INSERT INTO w SELECT g, repeat(md5(g::text), 32768) FROM generate_series(1, 100) g`)
	ctx := context.Background()
	cc, err := pgconf.Parse(db.DSN, "test")
	require.NoError(t, err)
	conn, err := pgx.ConnectConfig(ctx, cc)
	require.NoError(t, err)
	defer conn.Close(ctx)

	w := &writeSizes{}
	s := &source{cfg: &config{BackfillChunkSize: 10000, ReplicationMethod: &replicationMethod{Method: "CDC"}}, out: newOutput(w, nil), log: zerolog.New(zerolog.NewTestWriter(t))}
	st := &readStream{desc: streamDescriptor{Name: "w"}, schema: "public", name: "w", exists: true}
	r := &reader{s: s, streams: []*readStream{st}, types: pgjson.NewRegistry(conn), conn: conn}
	require.NoError(t, r.fullRefresh(ctx, st))

	require.True(t, st.fr.Done)
	require.EqualValues(t, 100, st.fr.Rows, "every row, once")
	require.GreaterOrEqual(t, st.fr.Chunks, int64(2), "chunks of at most 64 MiB")
}
