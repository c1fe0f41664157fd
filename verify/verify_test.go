package verify_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/verify"
)

var server *e2e.Server

func TestMain(m *testing.M) { os.Exit(e2e.Main(m, &server)) }

// open connects to dsn with the pinned session settings, as the command does.
func open(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgconf.Open(context.Background(), dsn, "tidemark-test")
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// targetDB creates a second database beside db's.
func targetDB(t *testing.T, db *e2e.TestDB) (string, *pgx.Conn) {
	name := db.Name + "_tgt"
	require.NoError(t, server.CreateDatabase(context.Background(), name))
	t.Cleanup(func() { _ = server.DropDatabase(context.Background(), name) })
	conn, err := pgx.Connect(context.Background(), server.DSN(name))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return server.DSN(name), conn
}

func exec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	_, err := conn.Exec(context.Background(), sql)
	require.NoError(t, err, sql)
}

// found lists a report's differences of one table as strings, in their order.
func found(rep *verify.Report, table string) []string {
	var out []string
	for _, t := range rep.Tables {
		if t.Table != table {
			continue
		}
		if t.Problem != "" {
			out = append(out, "problem: "+t.Problem)
		}
		for _, d := range t.Differences {
			out = append(out, d.String())
		}
	}
	return out
}

// TestPostgresTarget: equal tables are equal across several chunks; each planted difference is
// found and named by its key (a changed value, with its column; a row the target lacks; a row
// only the target has, inside the source's key range and past its end; NULL against an empty
// string), and a target table's definition problems are reported, not compared.
func TestPostgresTarget(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	tgtDSN, tgt := targetDB(t, db)
	const schema = `CREATE TABLE public.t (id int PRIMARY KEY, v text, n numeric, f float8, d date);
		CREATE TABLE public.c (a text, b int, w text, PRIMARY KEY (a, b));
		CREATE TABLE public.gone (id int PRIMARY KEY);
		CREATE TABLE public.narrow (id int PRIMARY KEY, x int)`
	const rows = `INSERT INTO public.t SELECT g, md5(g::text), g * 1.5, CASE WHEN g % 7 = 0 THEN 'NaN' ELSE g / 3.0 END, date '2026-01-01' + g FROM generate_series(1, 2500) g;
		INSERT INTO public.c SELECT 'k' || g, g % 3, NULL FROM generate_series(1, 300) g`
	db.Exec(schema)
	db.Exec(rows)
	exec(t, tgt, strings.ReplaceAll(schema, "public.gone (id int PRIMARY KEY);", "public.other (id int);")+`;
		ALTER TABLE public.narrow DROP COLUMN x, ADD COLUMN y int`)
	exec(t, tgt, rows)
	ctx := context.Background()
	opts := verify.Options{Source: open(t, db.DSN), ChunkSize: 1000,
		Tables: []verify.Table{{Schema: "public", Name: "t"}, {Schema: "public", Name: "c"}, {Schema: "public", Name: "gone"}, {Schema: "public", Name: "narrow"}}}
	target := open(t, tgtDSN)

	rep, err := verify.Postgres(ctx, opts, target, "")
	require.NoError(t, err)
	require.Empty(t, found(rep, "public.t"))
	require.Empty(t, found(rep, "public.c"))
	require.Equal(t, []string{"problem: the target has no table public.gone"}, found(rep, "public.gone"))
	require.Equal(t, []string{"problem: the target table public.narrow has no column [x]"}, found(rep, "public.narrow"))
	require.Equal(t, 3, rep.Tables[0].Chunks)
	require.Equal(t, int64(2500), rep.Tables[0].TargetRows)
	require.False(t, rep.Equal())

	exec(t, tgt, `UPDATE public.t SET v = 'planted' WHERE id = 1500;
		DELETE FROM public.t WHERE id IN (999, 1000, 1001);
		INSERT INTO public.t (id) VALUES (1500000), (-1), (0);
		UPDATE public.c SET w = '' WHERE a = 'k10' AND b = 1;
		UPDATE public.t SET f = 0 WHERE id = 14`)
	rep, err = verify.Postgres(ctx, opts, target, "")
	require.NoError(t, err)
	require.Equal(t, []string{
		"id=-1: not in the source", "id=0: not in the source", "id=14: values differ (f)", "id=999: missing in the target",
		"id=1000: missing in the target", "id=1001: missing in the target", "id=1500: values differ (v)", "id=1500000: not in the source",
	}, found(rep, "public.t"))
	require.Equal(t, []string{"a=k10, b=1: values differ (w)"}, found(rep, "public.c"))
}

// TestPostgresTargetKeep: past Options.Keep differing keys, the rest are counted, not kept.
func TestPostgresTargetKeep(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	tgtDSN, tgt := targetDB(t, db)
	db.Exec(`CREATE TABLE public.t (id int PRIMARY KEY, v int); INSERT INTO public.t SELECT g, g FROM generate_series(1, 100) g`)
	exec(t, tgt, `CREATE TABLE public.t (id int PRIMARY KEY, v int); INSERT INTO public.t SELECT g, -g FROM generate_series(1, 100) g`)
	rep, err := verify.Postgres(context.Background(), verify.Options{Source: open(t, db.DSN), ChunkSize: 30, Keep: 5,
		Tables: []verify.Table{{Schema: "public", Name: "t"}}}, open(t, tgtDSN), "")
	require.NoError(t, err)
	require.Len(t, rep.Tables[0].Differences, 5)
	require.Equal(t, int64(95), rep.Tables[0].Unchecked)
	require.False(t, rep.Equal())
}

// TestRecheck: on a live source a difference that the output catches up with during the
// re-check is dropped; one whose source row keeps changing is reported as changing; one that
// stays is a difference.
func TestRecheck(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	tgtDSN, tgt := targetDB(t, db)
	db.Exec(`CREATE TABLE public.t (id int PRIMARY KEY, v int); INSERT INTO public.t SELECT g, g FROM generate_series(1, 10) g`)
	exec(t, tgt, `CREATE TABLE public.t (id int PRIMARY KEY, v int); INSERT INTO public.t SELECT g, g FROM generate_series(1, 10) g;
		UPDATE public.t SET v = 0 WHERE id IN (2, 5, 8)`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writer := db.Connect()
	done := make(chan struct{})
	go func() {
		defer close(done)
		caughtUp := false
		for i := 0; ctx.Err() == nil; i++ {
			time.Sleep(150 * time.Millisecond)
			_, _ = writer.Exec(ctx, fmt.Sprintf(`UPDATE public.t SET v = %d WHERE id = 5`, 100+i))
			if !caughtUp {
				_, _ = tgt.Exec(ctx, `UPDATE public.t SET v = 2 WHERE id = 2`)
				caughtUp = true
			}
		}
	}()
	rep, err := verify.Postgres(context.Background(), verify.Options{Source: open(t, db.DSN), RecheckFor: 4 * time.Second, RecheckEvery: 500 * time.Millisecond,
		Tables: []verify.Table{{Schema: "public", Name: "t"}}}, open(t, tgtDSN), "")
	cancel()
	<-done
	require.NoError(t, err)
	require.Equal(t, []string{"id=5: values differ, and still changing on the source", "id=8: values differ (v)"}, found(rep, "public.t"))
}

// jsonLines writes a JSON lines output as sync writes it: snapshot rows, changes, a table
// emptied and backfilled again, another table's lines and a last line still being written.
func jsonLines(t *testing.T, lines ...string) string {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	var b strings.Builder
	for i, l := range lines {
		fmt.Fprintf(&b, `{"op":%s,"lsn":"0/%X","seq":%d}`+"\n", l, 0x1000+i, i)
	}
	b.WriteString(`{"op":"insert","table":"public.t","key":{"id":77},"after":{"id":77`) // being written
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// TestJSONLines: the output is replayed per key (updates with unchanged columns keep their
// values, deletes, a refresh that starts the table over, lines of other tables ignored) and
// compared with the source in the output's JSON forms; the same comparison split into partition
// files gives the same differences.
func TestJSONLines(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.t (id int PRIMARY KEY, v text, f float8, big text);
		INSERT INTO public.t VALUES (1, 'a', 1.5, 'x'), (2, 'b', 'NaN', 'y'), (3, 'c', NULL, 'z'), (4, 'd', 0, 'w');
		CREATE TABLE public.k (a text, b date, PRIMARY KEY (a, b)); INSERT INTO public.k VALUES ('q', '2026-01-02')`)
	path := jsonLines(t,
		`"snapshot","table":"public.t","key":{"id":1},"after":{"id":1,"v":"old","f":1.5,"big":"x"}`,
		`"snapshot","table":"public.t","key":{"id":9},"after":{"id":9,"v":"gone","f":1,"big":"x"}`,
		`"refresh","table":"public.t"`,
		`"snapshot","table":"public.t","key":{"id":1},"after":{"id":1,"v":"old","f":1.5,"big":"x"}`,
		`"snapshot","table":"public.t","key":{"id":2},"after":{"id":2,"v":"b","f":null,"big":"y"},"original":{"f":"NaN"}`,
		`"insert","table":"public.other","key":{"id":1},"after":{"id":1}`,
		`"update","table":"public.t","key":{"id":1},"after":{"id":1,"v":"a","f":1.5},"unchanged":["big"]`,
		`"insert","table":"public.t","key":{"id":3},"after":{"id":3,"v":"c","f":null,"big":"z"}`,
		`"insert","table":"public.t","key":{"id":5},"after":{"id":5,"v":"e","f":null,"big":"v"}`,
		`"insert","table":"public.t","key":{"id":6},"after":{"id":6,"v":"f","f":null,"big":"v"}`,
		`"delete","table":"public.t","key":{"id":6}`,
		`"insert","table":"public.t","key":{"id":4},"after":{"id":4,"v":"d","f":1,"big":"w"}`,
		`"snapshot","table":"public.k","key":{"a":"q","b":"2026-01-02"},"after":{"a":"q","b":"2026-01-02"}`,
	)
	opts := verify.Options{Source: open(t, db.DSN), Tables: []verify.Table{{Schema: "public", Name: "t"}, {Schema: "public", Name: "k"}}}
	rep, err := verify.JSONLines(context.Background(), opts, path)
	require.NoError(t, err)
	want := []string{"id=4: values differ (f)", "id=5: not in the source"}
	require.Equal(t, want, found(rep, "public.t"))
	require.Empty(t, found(rep, "public.k"))
	require.Equal(t, int64(5), rep.Tables[0].TargetRows)

	opts.PartBytes = 300 // several partitions
	rep, err = verify.JSONLines(context.Background(), opts, path)
	require.NoError(t, err)
	require.Equal(t, []string{"id=4: values differ", "id=5: not in the source"}, found(rep, "public.t"))
	require.Empty(t, found(rep, "public.k"))
	require.Equal(t, int64(5), rep.Tables[0].TargetRows)

	// Re-checked, the differences stay (the output is read again, and the key only the output
	// has is looked up on the source from its JSON form)...
	opts.RecheckFor, opts.RecheckEvery = 3*time.Second, 200*time.Millisecond
	rep, err = verify.JSONLines(context.Background(), opts, path)
	require.NoError(t, err)
	require.Equal(t, []string{"id=4: values differ", "id=5: not in the source"}, found(rep, "public.t"))
	// ...until the output catches up.
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	caughtUp := string(b[:strings.LastIndexByte(string(b), '\n')+1]) +
		`{"op":"update","table":"public.t","key":{"id":4},"after":{"id":4,"v":"d","f":0,"big":"w"},"lsn":"0/2000","seq":0}` + "\n" +
		`{"op":"delete","table":"public.t","key":{"id":5},"lsn":"0/2000","seq":1}` + "\n"
	go func() {
		time.Sleep(300 * time.Millisecond)
		tmp := path + ".tmp"
		if os.WriteFile(tmp, []byte(caughtUp), 0o600) == nil {
			_ = os.Rename(tmp, path)
		}
	}()
	rep, err = verify.JSONLines(context.Background(), opts, path)
	require.NoError(t, err)
	require.Empty(t, found(rep, "public.t"))
	require.True(t, rep.Equal())

	// A damaged line stops the comparison with its number.
	require.NoError(t, os.WriteFile(path, []byte(`{"op":"insert","table":"public.t","key":{"id":1},"lsn":"0/1","seq":0,"extra":1}`+"\n"), 0o600))
	_, err = verify.JSONLines(context.Background(), opts, path)
	require.ErrorContains(t, err, "line 1")
}

// TestPostgresTargetDuplicates: a target table without a unique key that holds a row twice is
// different, even though each copy equals the source's row.
func TestPostgresTargetDuplicates(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	tgtDSN, tgt := targetDB(t, db)
	db.Exec(`CREATE TABLE public.t (id int PRIMARY KEY, v int); INSERT INTO public.t SELECT g, g FROM generate_series(1, 10) g`)
	exec(t, tgt, `CREATE TABLE public.t (id int NOT NULL, v int); INSERT INTO public.t SELECT g, g FROM generate_series(1, 10) g; INSERT INTO public.t VALUES (3, 3)`)
	rep, err := verify.Postgres(context.Background(), verify.Options{Source: open(t, db.DSN), Tables: []verify.Table{{Schema: "public", Name: "t"}}}, open(t, tgtDSN), "")
	require.NoError(t, err)
	require.Equal(t, []string{"id=3: on more than one row of the target"}, found(rep, "public.t"))
}

// TestJSONLinesKeys: keys are matched as the key's = matches them, not as JSON text: a numeric
// key written 1.0 by the backfill and 1.00 by an update is one key; a date key's infinity and
// -infinity (null in JSON) are two, told apart by their original text, deletes included.
func TestJSONLinesKeys(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.n (k numeric PRIMARY KEY, v text); INSERT INTO public.n VALUES (1.00, 'new'), (-0.0, 'zero');
		CREATE TABLE public.h (id int, valid_to date, PRIMARY KEY (id, valid_to)); INSERT INTO public.h VALUES (1, 'infinity')`)
	path := jsonLines(t,
		`"snapshot","table":"public.n","key":{"k":1.0},"after":{"k":1.0,"v":"old"}`,
		`"snapshot","table":"public.n","key":{"k":0.0},"after":{"k":0.0,"v":"zero"}`,
		`"update","table":"public.n","key":{"k":1.00},"after":{"k":1.00,"v":"new"}`,
		`"snapshot","table":"public.h","key":{"id":1,"valid_to":null},"after":{"id":1,"valid_to":null},"original":{"valid_to":"infinity"}`,
		`"snapshot","table":"public.h","key":{"id":1,"valid_to":null},"after":{"id":1,"valid_to":null},"original":{"valid_to":"-infinity"}`,
		`"delete","table":"public.h","key":{"id":1,"valid_to":null},"original":{"valid_to":"-infinity"}`,
	)
	rep, err := verify.JSONLines(context.Background(), verify.Options{Source: open(t, db.DSN),
		Tables: []verify.Table{{Schema: "public", Name: "n"}, {Schema: "public", Name: "h"}}}, path)
	require.NoError(t, err)
	require.Empty(t, found(rep, "public.n"))
	require.Empty(t, found(rep, "public.h"))
	require.True(t, rep.Equal())
}
