package postgres

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
)

var server *e2e.Server

func TestMain(m *testing.M) { os.Exit(e2e.Main(m, &server)) }

// targetDatabase creates a target database beside the test's, and returns its connection string
// and a connection to it for the test's own queries.
func targetDatabase(t *testing.T, db *e2e.TestDB) (string, *pgx.Conn) {
	ctx := context.Background()
	name := db.Name + "_tgt"
	require.NoError(t, server.CreateDatabase(ctx, name))
	t.Cleanup(func() { _ = server.DropDatabase(context.Background(), name) })
	conn, err := pgx.Connect(ctx, server.DSN(name))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return server.DSN(name), conn
}

// sinkConns opens a sink's two connections, to the target and to the source, as tidemark sync
// does; done closes both.
func sinkConns(t *testing.T, tgtDSN, srcDSN string) (tgt, src *pgx.Conn, done func()) {
	t.Helper()
	ctx := context.Background()
	tgt, err := pgconf.OpenDefaultSSL(ctx, tgtDSN, "tidemark")
	require.NoError(t, err)
	src, err = pgconf.OpenDefaultSSL(ctx, srcDSN, "tidemark")
	if err != nil {
		tgt.Close(ctx)
	}
	require.NoError(t, err)
	return tgt, src, func() { src.Close(ctx); tgt.Close(ctx) }
}

func position(lsn pglogrepl.LSN) *merge.Position {
	return &merge.Position{Version: merge.PositionVersion, LSN: lsn, Tables: map[string]*merge.TableProgress{}}
}

// openTestSink opens a sink (id "test", logging to the test) on a target database beside the
// test's, as tidemark sync does; it and its connections are closed at the test's end. It returns
// the target's connection string and a connection of the test's own to it.
func openTestSink(t *testing.T, db *e2e.TestDB) (*Sink, string, *pgx.Conn, zerolog.Logger) {
	t.Helper()
	ctx := context.Background()
	tgtDSN, other := targetDatabase(t, db)
	tgt, src, closeConns := sinkConns(t, tgtDSN, db.DSN)
	t.Cleanup(closeConns)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	sink, _, err := Open(ctx, tgt, src, Options{ID: "test", Log: log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close(ctx) })
	return sink, tgtDSN, other, log
}

// streamChanges runs a capture of public.t's changes (no backfill) from the test's slot into
// sink until it has caught up, as tidemark sync does.
func streamChanges(t *testing.T, db *e2e.TestDB, sink merge.Sink, log zerolog.Logger) {
	t.Helper()
	eng, err := merge.New(merge.Config{
		Source:           replicator.Config{DSN: db.DSN, Slot: db.Slot, Publication: db.Publication},
		Tables:           []merge.TableConfig{{Schema: "public", Name: "t", NoBackfill: true}},
		AckCheckpoints:   true,
		StopWhenCaughtUp: true,
	}, sink, log)
	require.NoError(t, err)
	require.NoError(t, eng.Run(context.Background(), nil))
}
