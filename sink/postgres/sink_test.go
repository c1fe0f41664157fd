package postgres

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
)

// pendingProbe wraps the PostgreSQL sink and records, after every Emit, how much it holds in
// memory; at every checkpoint it records whether the target table is visible to another
// session yet.
type pendingProbe struct {
	*Sink
	other        func() bool // whether another session sees the target table
	maxRows      int
	maxBytes     int
	maxCopyBuf   int  // the largest the buffer of COPY text grew
	emitted      int  // events
	total        int  // events in all
	checkpointed bool // a checkpoint covered events
	seenBefore   bool // another session saw the table before a checkpoint that covered events
}

func (p *pendingProbe) Emit(ctx context.Context, evs []merge.Event) error {
	if err := p.Sink.Emit(ctx, evs); err != nil {
		return err
	}
	p.emitted += len(evs)
	p.total += len(evs)
	rows, bytes := 0, 0
	for _, b := range p.batches {
		rows += len(b.rows)
		for _, r := range b.rows {
			for _, v := range r.vals {
				bytes += len(v.Data)
			}
		}
	}
	p.maxRows, p.maxBytes = max(p.maxRows, rows), max(p.maxBytes, bytes)
	p.maxCopyBuf = max(p.maxCopyBuf, p.copyBuf.Cap())
	return nil
}

func (p *pendingProbe) Checkpoint(ctx context.Context, pos *merge.Position) error {
	// The table is created in the first target transaction: another session must not see it
	// before that transaction's checkpoint commits, however many pieces were applied in it.
	if !p.checkpointed && p.emitted > 0 && p.other() {
		p.seenBefore = true
	}
	err := p.Sink.Checkpoint(ctx, pos)
	p.maxCopyBuf = max(p.maxCopyBuf, p.copyBuf.Cap())
	if err == nil && p.emitted > 0 {
		p.checkpointed = true
	}
	return err
}

// TestSinkAppliesLargeTransactionsInPieces: one source transaction far larger than the sink's
// bounds (inserts, updates of the same keys, key changes and deletes, then wide rows) is applied
// to the target in pieces inside one target transaction: what the sink holds stays within its
// bounds of rows and of bytes, a piece's COPY text is streamed rather than built whole, nothing
// is visible on the target before the checkpoint commits, and the target ends equal to the
// source.
func TestSinkAppliesLargeTransactionsInPieces(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxRows    int
		maxBytes   int
		maxCopyBuf int // 0: not checked
		statement  string
	}{
		{"rows", 1000, 1 << 40, 0, `BEGIN;
			INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g;
			UPDATE t SET v = v || '+' WHERE id % 3 = 0;
			UPDATE t SET id = id + 100000 WHERE id % 11 = 0;
			DELETE FROM t WHERE id % 7 = 0;
			UPDATE t SET v = v || '!' WHERE id % 5 = 0;
			COMMIT`},
		// Values of about 100 kB: 30 MB in all, against a bound of 1 MB; COPY text of one row
		// at a time.
		{"bytes", 1 << 30, 1 << 20, 256 << 10, `BEGIN;
			INSERT INTO t SELECT g, repeat(md5(g::text), 3200) FROM generate_series(1, 300) g;
			UPDATE t SET v = v || '+' WHERE id % 3 = 0;
			DELETE FROM t WHERE id % 7 = 0;
			COMMIT`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := e2e.NewTestDB(t, server)
			db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text)`)
			db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE t`)
			db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
			db.Exec(tc.statement)

			ctx := context.Background()
			sink, tgtDSN, other, log := openTestSink(t, db)
			sink.maxPendingRows, sink.maxPendingBytes = tc.maxRows, tc.maxBytes
			probe := &pendingProbe{Sink: sink, other: func() bool {
				var visible bool
				require.NoError(t, other.QueryRow(ctx, `SELECT to_regclass('public.t') IS NOT NULL`).Scan(&visible))
				return visible
			}}

			streamChanges(t, db, probe, log)

			require.Positive(t, probe.total)
			require.LessOrEqual(t, probe.maxRows, tc.maxRows, "rows held by the sink")
			// A bound is checked after each row is added: one row over it at most.
			require.LessOrEqual(t, probe.maxBytes, tc.maxBytes+128<<10, "bytes held by the sink")
			if tc.maxCopyBuf > 0 {
				require.LessOrEqual(t, probe.maxCopyBuf, tc.maxCopyBuf, "COPY text held at once")
			}
			require.False(t, probe.seenBefore, "a piece was visible on the target before its checkpoint committed")
			want, err := e2e.SourceRows(ctx, db.DSN, "public", "t", []string{"id"})
			require.NoError(t, err)
			got, err := e2e.SourceRows(ctx, tgtDSN, "public", "t", []string{"id"})
			require.NoError(t, err)
			require.NotEmpty(t, want)
			require.Empty(t, e2e.Diff(got, want))
		})
	}
}

// crashAfterPiece wraps the PostgreSQL sink and, once it has applied a piece of a transaction
// (before its checkpoint), ends the target's session from the server as a crash would, and
// fails.
type crashAfterPiece struct {
	*Sink
	kill func()
}

var errCrashed = errors.New("crashed after a piece")

func (c *crashAfterPiece) Emit(ctx context.Context, evs []merge.Event) error {
	if err := c.Sink.Emit(ctx, evs); err != nil {
		return err
	}
	if c.pieces > 0 {
		c.kill()
		return errCrashed
	}
	return nil
}

// TestSinkPiecesAcrossACrash: a target session that dies after pieces of a source transaction
// were applied, before its checkpoint, leaves nothing of the transaction on the target, and the
// next run applies it once: the target equals the source, and the audit ledger holds the
// transaction once.
func TestSinkPiecesAcrossACrash(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE t`)
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	db.Exec(`BEGIN;
		INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g;
		UPDATE t SET v = v || '+' WHERE id % 3 = 0;
		DELETE FROM t WHERE id % 7 = 0;
		COMMIT`)
	ctx := context.Background()
	tgtDSN, other := targetDatabase(t, db)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	run := func(wrap func(*Sink, *pgx.Conn) merge.Sink) error {
		tgt, src, closeConns := sinkConns(t, tgtDSN, db.DSN)
		defer closeConns()
		sink, pos, err := Open(ctx, tgt, src, Options{ID: "test", Audit: true, Log: log})
		require.NoError(t, err)
		defer sink.Close(ctx)
		sink.maxPendingRows = 1000
		eng, err := merge.New(merge.Config{
			Source:           replicator.Config{DSN: db.DSN, Slot: db.Slot, Publication: db.Publication},
			Tables:           []merge.TableConfig{{Schema: "public", Name: "t", NoBackfill: true}},
			AckCheckpoints:   true,
			StopWhenCaughtUp: true,
		}, wrap(sink, tgt), log)
		require.NoError(t, err)
		return eng.Run(ctx, pos)
	}
	err := run(func(s *Sink, tgt *pgx.Conn) merge.Sink {
		return &crashAfterPiece{Sink: s, kill: func() {
			_, err := other.Exec(ctx, `SELECT pg_terminate_backend($1)`, tgt.PgConn().PID())
			require.NoError(t, err)
		}}
	})
	require.ErrorIs(t, err, errCrashed)
	var visible bool
	require.NoError(t, other.QueryRow(ctx, `SELECT to_regclass('public.t') IS NOT NULL`).Scan(&visible))
	require.False(t, visible, "nothing of the transaction is on the target before its checkpoint")

	require.NoError(t, run(func(s *Sink, _ *pgx.Conn) merge.Sink { return s }))
	want, err := e2e.SourceRows(ctx, db.DSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	got, err := e2e.SourceRows(ctx, tgtDSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	require.Len(t, want, 20000-20000/7)
	require.Empty(t, e2e.Diff(got, want))
	var applied int
	require.NoError(t, other.QueryRow(ctx, `SELECT count(*) FROM tidemark_applied`).Scan(&applied))
	require.Equal(t, 1, applied, "the source transaction applied once")
}

// TestAddColumnDefaultKeepsBackslashes: a column's default is copied to the target as a string
// literal; on a target database whose standard_conforming_strings is off, a backslash in it would
// be read as an escape and the target's existing rows would get another value than the source's.
// Every connection pins the setting on (internal/pgconf), so the value arrives as it is.
func TestAddColumnDefaultKeepsBackslashes(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	ctx := context.Background()
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	db.Exec(`INSERT INTO t VALUES (1)`)
	db.Exec(`ALTER DATABASE ` + pgx.Identifier{db.Name}.Sanitize() + ` SET standard_conforming_strings = off`)
	conn, err := pgconf.Open(ctx, db.DSN, "tidemark-test")
	require.NoError(t, err)
	defer conn.Close(ctx)
	want := `a\b\\c'd`
	_, err = conn.Exec(ctx, AddColumnSQL(`"public"."t"`, "p", "text", &want))
	require.NoError(t, err)
	var got string
	require.NoError(t, conn.QueryRow(ctx, `SELECT p FROM public.t WHERE id = 1`).Scan(&got))
	require.Equal(t, want, got)
}

// crashAfterRefresh wraps the PostgreSQL sink and stops (as a crash would, with nothing more
// applied) at the first rows after a checkpoint that committed a refresh's TRUNCATE.
type crashAfterRefresh struct {
	*Sink
	refreshed, committed bool
}

func (c *crashAfterRefresh) Emit(ctx context.Context, evs []merge.Event) error {
	if c.committed {
		return errCrashed
	}
	for _, ev := range evs {
		c.refreshed = c.refreshed || ev.Op == merge.Refresh
	}
	return c.Sink.Emit(ctx, evs)
}

func (c *crashAfterRefresh) Checkpoint(ctx context.Context, pos *merge.Position) error {
	err := c.Sink.Checkpoint(ctx, pos)
	c.committed = err == nil && c.refreshed
	return err
}

// TestRefreshedTableFittedAfterACrash: a re-backfill after the source's values were rewritten
// (a column given another type) empties the target's table, and its rows then carry the new
// type. A sink that stops after the TRUNCATE committed and before those rows leaves the table
// empty with the old type; the next sink meets the table first on such a row, and fits it (the
// checkpoint accounts for the table, and it is empty) instead of taking it for a table made by
// the operator with another type.
func TestRefreshedTableFittedAfterACrash(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY, price numeric(12,2))`)
	db.Exec(`INSERT INTO t SELECT g, g * 1.25 FROM generate_series(1, 50) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE t`)
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	ctx := context.Background()
	tgtDSN, _ := targetDatabase(t, db)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	run := func(wrap func(*Sink) merge.Sink) error {
		tgt, src, closeConns := sinkConns(t, tgtDSN, db.DSN)
		defer closeConns()
		sink, pos, err := Open(ctx, tgt, src, Options{ID: "test", Log: log})
		require.NoError(t, err)
		defer sink.Close(ctx)
		eng, err := merge.New(merge.Config{
			Source:             replicator.Config{DSN: db.DSN, Slot: db.Slot, Publication: db.Publication},
			Tables:             []merge.TableConfig{{Schema: "public", Name: "t"}},
			AckCheckpoints:     true,
			StopWhenCaughtUp:   true,
			RebackfillRewrites: true,
		}, wrap(sink), log)
		require.NoError(t, err)
		return eng.Run(ctx, pos)
	}
	plain := func(s *Sink) merge.Sink { return s }
	require.NoError(t, run(plain))
	db.Exec(`ALTER TABLE t ALTER COLUMN price TYPE bigint USING (price * 100)::bigint`)
	require.ErrorIs(t, run(func(s *Sink) merge.Sink { return &crashAfterRefresh{Sink: s} }), errCrashed)
	require.NoError(t, run(plain))
	want, err := e2e.SourceRows(ctx, db.DSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	got, err := e2e.SourceRows(ctx, tgtDSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	require.Empty(t, e2e.Diff(got, want))
}

// TestSinkBatchFoldsAndEscapes: what the sink folds and encodes on its own, through a real
// target. One source transaction inserts a key with a TOASTed value and then updates it without
// touching that value (the stream sends it as unchanged): the target must get the value the
// insert carried, not NULL; a key inserted, deleted and inserted again is there. Another
// truncates the table after a row pending in the same batch, and adds a column between two rows. Values with COPY text's special characters (a backslash, `\N`, a tab,
// a newline, a carriage return) land as they are, inserted and updated alike.
func TestSinkBatchFoldsAndEscapes(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text, big text)`)
	db.Exec(`ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE t`)
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	// One transaction that truncates after rows pending in the same batch, and changes the
	// table's definition between two rows: the rows before each go first.
	db.Exec(`BEGIN;
		INSERT INTO t VALUES (20, 'before the truncate', NULL);
		TRUNCATE t;
		INSERT INTO t VALUES (21, 'after the truncate', NULL);
		ALTER TABLE t ADD COLUMN extra int;
		INSERT INTO t VALUES (22, 'with extra', NULL, 7);
		ALTER TABLE t DROP COLUMN extra;
		INSERT INTO t (id, v, big) VALUES (23, 'without extra', NULL);
		COMMIT`)
	db.Exec(`BEGIN;
		INSERT INTO t (id, v, big) VALUES (1, 'first', repeat('x', 10000)), (2, E'back\\slash \\N', repeat('y', 10000));
		INSERT INTO t (id, v, big) VALUES (5, 'gone', NULL);
		DELETE FROM t WHERE id = 5;
		INSERT INTO t (id, v, big) VALUES (5, 'back after its delete', NULL);
		UPDATE t SET v = 'second' WHERE id = 1;
		UPDATE t SET v = v || E'\ttab\nnewline\rreturn\\' WHERE id = 2;
		INSERT INTO t (id, v, big) VALUES (3, E'\\N', NULL), (4, E'\\\\', E'\\.');
		COMMIT`)

	ctx := context.Background()
	sink, tgtDSN, _, log := openTestSink(t, db)
	streamChanges(t, db, sink, log)

	want, err := e2e.SourceRows(ctx, db.DSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	got, err := e2e.SourceRows(ctx, tgtDSN, "public", "t", []string{"id"})
	require.NoError(t, err)
	require.Len(t, want, 8)
	require.Empty(t, e2e.Diff(got, want))
}
