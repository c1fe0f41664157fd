package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// TestVerify: `tidemark verify` with a sync's own flags says equal after the sync (a PostgreSQL
// target and a JSON lines file), and finds a planted difference, naming its key, with exit 1.
func TestVerify(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TYPE mood AS ENUM ('calm', 'glad');
		CREATE TABLE public.t (id int PRIMARY KEY, v text, n numeric, m mood, j jsonb, f float8, at timestamptz);
		INSERT INTO public.t SELECT g, md5(g::text), g * 1.5, 'glad', jsonb_build_object('g', g), CASE WHEN g % 5 = 0 THEN 'NaN'::float8 END, now() FROM generate_series(1, 3000) g`)
	tgtDSN, tgt := targetDatabase(t, db)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	ctx := context.Background()
	common := []string{"--source", db.DSN, "--publication", db.Publication, "--tables", "public.t", "--chunk-size", "1000"}
	for _, to := range []string{tgtDSN, out} {
		e, _, errOut := testEnv(t)
		slot := db.Slot
		if to == out {
			slot += "_j"
		}
		require.Equal(t, 0, run(ctx, append([]string{"sync", "--slot", slot, "--to", to, "--stop-when-caught-up", "--quiet"}, common...), e), errOut.String())
		e, stdout, errOut := testEnv(t)
		require.Equal(t, 0, run(ctx, append([]string{"verify", "--to", to}, common...), e), errOut.String())
		require.Contains(t, stdout.String(), "public.t: equal (3000 rows, 3 chunks")
	}

	_, err := tgt.Exec(ctx, `UPDATE public.t SET v = 'planted' WHERE id = 1234`)
	require.NoError(t, err)
	e, stdout, errOut := testEnv(t)
	require.Equal(t, 3, run(ctx, append([]string{"verify", "--to", tgtDSN, "--recheck-for", "0"}, common...), e))
	require.Contains(t, stdout.String(), "public.t: DIFFERENT: 1 keys differ (source 3000 rows, target 3000)\n  id=1234: values differ (v)\n")
	require.Contains(t, errOut.String(), "tidemark verify: 1 of 1 tables differ from the source")

	db.Exec(`DELETE FROM public.t WHERE id = 7`)
	e, stdout, _ = testEnv(t)
	require.Equal(t, 3, run(ctx, append([]string{"verify", "--to", out, "--recheck-for", "0"}, common...), e))
	require.Contains(t, stdout.String(), "id=7: not in the source")
}

// TestVerifyUsage: verify's usage mistakes, each with exit 2 and what to do.
func TestVerifyUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--source", "postgres://x/y", "--to", "out.jsonl"}, "--tables is required"},
		{[]string{"--source", "postgres://x/y", "--tables", "public.t", "--to", "-"}, "standard output cannot be read back"},
		{[]string{"--source", "postgres://x/y", "--tables", "public.t", "--to", "out.jsonl", "--target-schema", "s"}, "--target-schema is for a PostgreSQL target"},
	} {
		t.Setenv("TIDEMARK_TARGET", "")
		e, _, errOut := testEnv(t)
		require.Equal(t, 2, run(context.Background(), append([]string{"verify"}, c.args...), e), errOut.String())
		require.Contains(t, errOut.String(), c.want)
	}
}

// TestVerifyInterrupted: verify stopped by a signal (Ctrl-C) before it ends does not exit 0, which
// would read as "equal".
func TestVerifyInterrupted(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE public.t (id int PRIMARY KEY); INSERT INTO public.t SELECT g FROM generate_series(1, 10) g`)
	tgtDSN, _ := targetDatabase(t, db)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	e, _, errOut := testEnv(t)
	require.Equal(t, 1, run(ctx, []string{"verify", "--source", db.DSN, "--tables", "public.t", "--to", tgtDSN}, e))
	require.Contains(t, errOut.String(), "interrupted")
}
