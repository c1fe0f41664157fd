package jsonl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/sink/jsonl"
	"github.com/tidemark/tidemark/sink/jsonl/line"
)

var server *e2e.Server

func TestMain(m *testing.M) { os.Exit(e2e.Main(m, &server)) }

func position(lsn pglogrepl.LSN) *merge.Position {
	return &merge.Position{Version: merge.PositionVersion, LSN: lsn, Tables: map[string]*merge.TableProgress{}}
}

// TestWriterLinesDecode: every line the writer writes for a capture with every kind of event
// (backfilled rows, insert, update leaving a TOASTed value out, delete, truncate) and every
// optional field (unchanged, original, xid, time) decodes strictly into a Line, and that Line
// encodes back to the same JSON: the reader knows every field the writer writes, with the same
// names and values.
func TestWriterLinesDecode(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY, v int, n numeric, arr int[], doc text)`)
	db.Exec(`ALTER TABLE a ALTER COLUMN doc SET STORAGE EXTERNAL`)
	db.Exec(`CREATE TABLE b (id int PRIMARY KEY)`)
	db.Exec(`INSERT INTO a SELECT g, g, g, ARRAY[g], repeat('x', 10000) FROM generate_series(1, 5) g`)
	db.Exec(`INSERT INTO b VALUES (1)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE a, b`)
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	db.Exec(`INSERT INTO a VALUES (6, 6, 'NaN', '[0:1]={1,2}', 'small')`)
	db.Exec(`UPDATE a SET v = v + 10 WHERE id = 1`)
	db.Exec(`DELETE FROM a WHERE id = 2`)
	db.Exec(`TRUNCATE b`)

	out, raw, ls := captureToFile(t, db, "a", "b")
	asJSON := func(b []byte) any {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		var v any
		require.NoError(t, d.Decode(&v))
		return v
	}
	ops := map[string]int{}
	var unchanged, original, xid, timed bool
	for i, line := range bytes.Split(bytes.TrimSuffix(raw, []byte("\n")), []byte("\n")) {
		l := ls[i]
		again, err := json.Marshal(l)
		require.NoError(t, err)
		require.Equal(t, asJSON(line), asJSON(again), "line %d: %s", i+1, line)
		require.NotZero(t, l.LSN, "line %d", i+1)
		ops[l.Op]++
		switch {
		case l.Op == "update" && l.Table == "public.a":
			require.Equal(t, []string{"doc"}, l.Unchanged, "the update left the TOASTed doc out")
			require.NotContains(t, l.After, "doc")
			unchanged = true
		case l.Op == "insert":
			require.Equal(t, map[string]string{"n": "NaN", "arr": "[0:1]={1,2}"}, l.Original)
			original = true
		case l.Op == "delete":
			require.Equal(t, map[string]json.RawMessage{"id": json.RawMessage(`2`)}, l.Key)
			require.Nil(t, l.After)
		case l.Op == "truncate":
			require.Equal(t, "public.b", l.Table)
			require.Nil(t, l.Key)
		}
		if l.Op != "snapshot" {
			require.NotZero(t, l.XID, "line %d", i+1)
			xid = true
		} else {
			require.Zero(t, l.XID, "line %d", i+1)
		}
		if !l.Time.IsZero() {
			timed = true
		}
	}
	require.Equal(t, map[string]int{"insert": 1, "update": 1, "delete": 1, "truncate": 1, "snapshot": 5}, ops)
	// Each change's own position: four transactions, four commit LSNs (formatted once per value).
	lsns := map[string]bool{}
	for _, l := range ls {
		if l.Op != "snapshot" {
			lsns[l.LSN.String()] = true
		}
	}
	require.Len(t, lsns, 4, "the changes' positions")
	require.True(t, unchanged && original && xid && timed)

	c, err := jsonl.ReadCheckpointFile(out + ".checkpoint")
	require.NoError(t, err)
	require.Equal(t, int64(len(raw)), c.Offset)
	require.Equal(t, "out.jsonl", c.Output)
	require.NotNil(t, c.Position)
}

// TestCheckpointOfAnotherOutput: a checkpoint names the output it was written for; one given
// for another file is refused instead of marking tables done that the file never got, and the
// file is not touched.
func TestCheckpointOfAnotherOutput(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	ctx := context.Background()
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	idle := func() error { return nil }
	s, _, err := jsonl.Open(a, "", pgjson.NewRegistry(db.Conn), idle)
	require.NoError(t, err)
	require.NoError(t, s.Checkpoint(ctx, position(0x1000)))
	require.NoError(t, s.Close(ctx))
	_, _, err = jsonl.Open(b, a+".checkpoint", pgjson.NewRegistry(db.Conn), idle)
	require.Error(t, err)
	require.ErrorContains(t, err, "belongs to output a.jsonl")
	st, err := os.Stat(b)
	require.True(t, os.IsNotExist(err) || st.Size() == 0)

	// A damaged checkpoint stops the open, and says so.
	require.NoError(t, os.WriteFile(a+".checkpoint", []byte("{"), 0o644))
	_, _, err = jsonl.Open(a, "", pgjson.NewRegistry(db.Conn), idle)
	require.ErrorContains(t, err, "is damaged")
	_, err = jsonl.ReadCheckpointFile(filepath.Join(dir, "none.checkpoint"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestSecondWriterTouchesNothing: while one writer holds an output, a second Open of it is
// refused before it reads or cuts anything; and an Open whose ready check fails (the slot is in
// use) leaves the output as it found it, bytes past the checkpoint included. Only an Open that
// holds the lock and found the slot idle cuts the output back to its checkpoint.
func TestSecondWriterTouchesNothing(t *testing.T) {
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "out.jsonl")
	idle := func() error { return nil }
	first, _, err := jsonl.Open(out, "", nil, idle)
	require.NoError(t, err)
	require.NoError(t, first.Checkpoint(ctx, position(0x1000)))
	// What a writer wrote after its checkpoint, before it died or while it still runs.
	tail := []byte(`{"op":"truncate","table":"public.t","lsn":"0/2000","seq":0}` + "\n")
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write(tail)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	readyCalled := false
	_, _, err = jsonl.Open(out, "", nil, func() error { readyCalled = true; return nil })
	require.ErrorContains(t, err, "another tidemark sync is writing")
	require.False(t, readyCalled, "the lock is taken before anything else")
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, tail, got, "the refused writer left the output alone")
	require.NoError(t, first.Close(ctx))

	busy := errors.New("slot in use")
	_, _, err = jsonl.Open(out, "", nil, func() error { return busy })
	require.ErrorIs(t, err, busy)
	got, err = os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, tail, got, "a writer that found the slot in use cut nothing")

	w, pos, err := jsonl.Open(out, "", nil, idle)
	require.NoError(t, err)
	require.Equal(t, pglogrepl.LSN(0x1000), pos.LSN)
	got, err = os.ReadFile(out)
	require.NoError(t, err)
	require.Empty(t, got, "cut back to the checkpoint")
	require.NoError(t, w.Close(ctx))
}

// TestDeleteOfLossyKey: a delete line keeps a key whose JSON form is lossy (a date's infinity,
// numeric NaN: null in JSON) whole, in "original", as insert and update lines do for their
// values: without it the deletes of (1, infinity) and (1, -infinity) would be the same line.
func TestDeleteOfLossyKey(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE h (id int, valid_to date, PRIMARY KEY (id, valid_to))`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE h`)
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	db.Exec(`INSERT INTO h VALUES (1, 'infinity'), (1, '-infinity')`)
	db.Exec(`DELETE FROM h WHERE valid_to = '-infinity'`)
	_, raw, ls := captureToFile(t, db, "h")
	var deletes []map[string]string
	for _, l := range ls {
		if l.Op == "delete" {
			deletes = append(deletes, l.Original)
		}
	}
	require.Equal(t, []map[string]string{{"valid_to": "-infinity"}}, deletes, "%s", raw)
}

// captureToFile captures the public tables of db (its slot and publication exist) into a fresh
// JSON lines file until caught up, and returns the file's path, its bytes and its lines.
func captureToFile(t *testing.T, db *e2e.TestDB, tables ...string) (string, []byte, []line.Line) {
	t.Helper()
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "out.jsonl")
	types := db.Connect()
	w, from, err := jsonl.Open(out, "", pgjson.NewRegistry(types), func() error { return nil })
	require.NoError(t, err)
	require.Nil(t, from)
	cfg := merge.Config{Source: replicator.Config{DSN: db.DSN, Slot: db.Slot, Publication: db.Publication}, AckCheckpoints: true, StopWhenCaughtUp: true}
	for _, name := range tables {
		cfg.Tables = append(cfg.Tables, merge.TableConfig{Schema: "public", Name: name})
	}
	probe := &durableProbe{Writer: w, out: out}
	eng, err := merge.New(cfg, probe, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	require.NoError(t, eng.Run(ctx, nil))
	require.Positive(t, probe.checkpoints)
	require.NoError(t, w.Close(ctx))
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	ls, err := line.ReadAll(bytes.NewReader(raw))
	require.NoError(t, err)
	return out, raw, ls
}

// durableProbe checks, after each checkpoint of the writer, that the output file already holds
// every byte the checkpoint counts, whole lines only, as another process (a consumer, or the
// next run after a crash) would read it: a checkpoint is written after the output it covers.
type durableProbe struct {
	*jsonl.Writer
	out         string
	checkpoints int
}

// Checkpoint runs on the engine's goroutine: a finding is its error (the run fails with it),
// not a test failure there.
func (p *durableProbe) Checkpoint(ctx context.Context, pos *merge.Position) error {
	if err := p.Writer.Checkpoint(ctx, pos); err != nil {
		return err
	}
	p.checkpoints++
	c, err := jsonl.ReadCheckpointFile(p.out + ".checkpoint")
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(p.out)
	if err != nil {
		return err
	}
	if c.Offset != int64(len(raw)) {
		return fmt.Errorf("checkpoint %d counts %d bytes, the output file holds %d", p.checkpoints, c.Offset, len(raw))
	}
	if len(raw) > 0 && raw[len(raw)-1] != '\n' {
		return fmt.Errorf("the output ends in a partial line at checkpoint %d", p.checkpoints)
	}
	return nil
}

// TestCheckpointAfterItsOutput: a checkpoint is written only once the output it counts is: an
// output that cannot take the bytes (a full disk: /dev/full) fails the checkpoint, and the
// checkpoint file keeps what it had, so the next run does not skip the lines that never landed.
func TestCheckpointAfterItsOutput(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO a SELECT g, md5(g::text) FROM generate_series(1, 50) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE a`)
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	ctx := context.Background()
	cp := filepath.Join(t.TempDir(), "full.checkpoint")
	w, _, err := jsonl.Open("/dev/full", cp, pgjson.NewRegistry(db.Connect()), func() error { return nil })
	require.NoError(t, err)
	before, err := os.ReadFile(cp)
	if errors.Is(err, os.ErrNotExist) {
		before = nil
	} else {
		require.NoError(t, err)
	}
	eng, err := merge.New(merge.Config{Source: replicator.Config{DSN: db.DSN, Slot: db.Slot, Publication: db.Publication},
		Tables: []merge.TableConfig{{Schema: "public", Name: "a"}}, AckCheckpoints: true, StopWhenCaughtUp: true},
		w, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	err = eng.Run(ctx, nil)
	require.ErrorContains(t, err, "write output")
	after, rerr := os.ReadFile(cp)
	if errors.Is(rerr, os.ErrNotExist) {
		after = nil
	} else {
		require.NoError(t, rerr)
	}
	require.Equal(t, string(before), string(after), "the checkpoint file changed though its output was never written")
	_ = w.Close(ctx)
}
