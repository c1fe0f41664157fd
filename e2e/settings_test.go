package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgconf"
)

// TestPinnedSettingsWinOverConnectionString: a connection string's "timezone" and the PGTZ
// environment variable reach the server under another spelling than the pinned TimeZone; every
// connection Tidemark opens still runs in UTC, so the backfill and the stream print the same
// stored timestamptz alike and the output replays to the source.
func TestPinnedSettingsWinOverConnectionString(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE k (ts timestamptz PRIMARY KEY, v text, ver bigint NOT NULL DEFAULT 1)`)
	db.Exec(`INSERT INTO k (ts, v) SELECT '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 hour', 'v' FROM generate_series(1, 30) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE k`)
	t.Setenv("PGTZ", "Asia/Tokyo")
	dsn := db.DSN + " timezone=America/New_York DateStyle='SQL, DMY'"

	ctx := context.Background()
	for range 10 {
		cfg, err := pgconf.Parse(dsn, "test")
		require.NoError(t, err)
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		var tz, ds string
		require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('TimeZone'), current_setting('DateStyle')`).Scan(&tz, &ds))
		conn.Close(ctx)
		require.Equal(t, "UTC", tz)
		require.Equal(t, "ISO, MDY", ds)
	}

	cfg := engineConfig(db, "public.k")
	cfg.Source.DSN = dsn
	cfg.ChunkSize = 7
	cfg.Hooks.AfterLow = onChunk(t, db, 2, `INSERT INTO k (ts, v) VALUES ('2030-06-01 12:00:00+00', 'new')`,
		`UPDATE k SET v = 'changed', ver = 2 WHERE ts = '2024-01-01 05:00:00+00'`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, cfg, sink, nil))
	verify(t, db, sink, "public.k", "ts")
	for _, r := range sink.records {
		require.Regexp(t, `\+00$`, r.Key, "%s of %s is printed in UTC", r.Op, r.Key)
	}
}

// TestRowSecurityFailsTheRead: a row-level security policy that applies to the capture's role
// must fail the chunk read with PostgreSQL's error, not hand over the rows the policy lets
// through as if they were the table (row_security is pinned off, as pg_dump does).
func TestRowSecurityFailsTheRead(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	role := "rls_" + db.Name[2:]
	db.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'pw'`, role))
	t.Cleanup(func() {
		db.Exec(fmt.Sprintf(`DROP OWNED BY %s`, role))
		db.Exec(fmt.Sprintf(`DROP ROLE %s`, role))
	})
	db.Exec(`CREATE TABLE r (id int PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO r SELECT g, 'v' FROM generate_series(1, 10) g`)
	db.Exec(`ALTER TABLE r ENABLE ROW LEVEL SECURITY`)
	db.Exec(fmt.Sprintf(`CREATE POLICY even ON r FOR SELECT TO %s USING (id %% 2 = 0)`, role))
	db.Exec(fmt.Sprintf(`GRANT SELECT ON r TO %s`, role))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgconf.Parse(server.UserDSN(db.Name, role, "pw"), "test")
	require.NoError(t, err)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	tbl, err := chunker.Discover(ctx, conn, "public", "r", nil, "")
	require.NoError(t, err)
	reader, err := chunker.NewReader(conn, chunker.Config{})
	require.NoError(t, err)
	c, err := reader.Next(ctx, tbl, nil, nil, 100)
	if err == nil {
		t.Fatalf("the chunk read %d of the table's 10 rows without an error", len(c.Rows))
	}
	require.ErrorContains(t, err, "row-level security")
}
