package postgres

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgconf"
)

// TestSinkCheckpointFence: the checkpoint row moves only from the position the sink read or
// wrote. A writer whose row another writer moved (it was frozen while another ran, say) fails,
// and its transaction is rolled back, instead of moving the checkpoint back over the other's.
func TestSinkCheckpointFence(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	ctx := context.Background()
	tgtDSN, other := targetDatabase(t, db)
	tgt, err := pgconf.OpenDefaultSSL(ctx, tgtDSN, "tidemark")
	require.NoError(t, err)
	defer tgt.Close(ctx)
	sink, from, err := Open(ctx, tgt, db.Conn, Options{ID: "fence", Log: zerolog.Nop()})
	require.NoError(t, err)
	defer sink.Close(ctx)
	require.Nil(t, from)
	require.NoError(t, sink.Checkpoint(ctx, position(0x1000)))
	require.NoError(t, sink.Checkpoint(ctx, position(0x2000)))
	// Another writer moves the checkpoint (as one that ran while this one was frozen would).
	_, err = other.Exec(ctx, `UPDATE public.tidemark_checkpoint SET position = jsonb_set(position, '{lsn}', '"0/9000"') WHERE id = 'fence'`)
	require.NoError(t, err)
	err = sink.Checkpoint(ctx, position(0x3000))
	require.Error(t, err)
	require.ErrorContains(t, err, "changed under this sync")
	var lsn string
	require.NoError(t, other.QueryRow(ctx, `SELECT position->>'lsn' FROM public.tidemark_checkpoint WHERE id = 'fence'`).Scan(&lsn))
	require.Equal(t, "0/9000", lsn, "the other writer's checkpoint stands")
}

// TestSinkCheckpointDurable: the transaction that carries a checkpoint commits with
// synchronous_commit on, whatever the target's setting: the slot is confirmed to it right after,
// and a commit that a crash of the target could take back would lose those changes for good.
// A trigger on the target table (its owner, and the trigger function's, the test's superuser,
// which the sink trusts) records the setting each write of a checkpoint's transaction sees.
func TestSinkCheckpointDurable(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE t`)
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	db.Exec(`INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 10) g`)
	db.Exec(`UPDATE t SET v = 'x' WHERE id = 3`)
	ctx := context.Background()
	tgtDSN, other := targetDatabase(t, db)
	_, err := other.Exec(ctx, `ALTER DATABASE `+db.Name+`_tgt SET synchronous_commit = off`)
	require.NoError(t, err)
	_, err = other.Exec(ctx, `CREATE TABLE public.seen (setting text);
		CREATE TABLE public.t (id int PRIMARY KEY, v text);
		CREATE FUNCTION public.note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO public.seen VALUES (current_setting('synchronous_commit')); RETURN NEW; END $$;
		CREATE TRIGGER note BEFORE INSERT OR UPDATE ON public.t FOR EACH ROW EXECUTE FUNCTION public.note()`)
	require.NoError(t, err)
	tgt, src, closeConns := sinkConns(t, tgtDSN, db.DSN)
	defer closeConns()
	sink, _, err := Open(ctx, tgt, src, Options{ID: "durable", Log: zerolog.Nop()})
	require.NoError(t, err)
	defer sink.Close(ctx)
	streamChanges(t, db, sink, zerolog.Nop())
	var settings []string
	rows, err := other.Query(ctx, `SELECT DISTINCT setting FROM public.seen`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		settings = append(settings, s)
	}
	require.Equal(t, []string{"on"}, settings)
}

// TestCheckpointOfAnotherSchema: a checkpoint names the target schema it was written for; one
// read for another schema is refused instead of marking tables done that the schema never got.
func TestCheckpointOfAnotherSchema(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	ctx := context.Background()
	tgtDSN, _ := targetDatabase(t, db)
	tgt, err := pgconf.OpenDefaultSSL(ctx, tgtDSN, "tidemark")
	require.NoError(t, err)
	sink, _, err := Open(ctx, tgt, db.Conn, Options{ID: "schemas", Schema: "copy1", Log: zerolog.Nop()})
	require.NoError(t, err)
	require.NoError(t, sink.Checkpoint(ctx, position(0x1000)))
	sink.Close(ctx)
	tgt.Close(ctx) // the run ends: its locks go with its connection
	tgt2, err := pgconf.OpenDefaultSSL(ctx, tgtDSN, "tidemark")
	require.NoError(t, err)
	defer tgt2.Close(ctx)
	_, _, err = Open(ctx, tgt2, db.Conn, Options{ID: "schemas", Schema: "copy2", Log: zerolog.Nop()})
	require.Error(t, err)
	require.ErrorContains(t, err, `--target-schema "copy1"`)
}

// TestSecondOpenRefused: while one sink holds a checkpoint id on the target, a second Open of
// the same id (on another connection: another sync) is refused before it reads or writes
// anything, naming the server process that holds the lock; once the first's connection ends,
// the id is free again.
func TestSecondOpenRefused(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	ctx := context.Background()
	tgtDSN, other := targetDatabase(t, db)
	first, err := pgconf.OpenDefaultSSL(ctx, tgtDSN, "tidemark")
	require.NoError(t, err)
	s, _, err := Open(ctx, first, db.Conn, Options{ID: "one", Log: zerolog.Nop()})
	require.NoError(t, err)
	require.NoError(t, s.Checkpoint(ctx, position(0x1000)))
	pid := first.PgConn().PID()

	second, err := pgconf.OpenDefaultSSL(ctx, tgtDSN, "tidemark")
	require.NoError(t, err)
	defer second.Close(ctx)
	_, _, err = Open(ctx, second, db.Conn, Options{ID: "one", Log: zerolog.Nop()})
	require.ErrorContains(t, err, "another tidemark sync is writing")
	require.ErrorContains(t, err, fmt.Sprintf("server process %d", pid))
	var lsn string
	require.NoError(t, other.QueryRow(ctx, `SELECT position->>'lsn' FROM tidemark_checkpoint WHERE id = 'one'`).Scan(&lsn))
	require.Equal(t, "0/1000", lsn, "the refused sink changed nothing")

	require.NoError(t, s.Close(ctx))
	require.NoError(t, first.Close(ctx))
	s2, from, err := Open(ctx, second, db.Conn, Options{ID: "one", Log: zerolog.Nop()})
	require.NoError(t, err)
	require.Equal(t, pglogrepl.LSN(0x1000), from.LSN)
	require.NoError(t, s2.Close(ctx))
}
