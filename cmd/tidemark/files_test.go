package main

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// TestOutputFilesSafe: the JSON lines output, its lock and its checkpoint are created readable
// by their owner only (rows and positions are the source's data), and none is opened through a
// symbolic link someone planted in its place: a sync run as root into a directory another user
// can write would otherwise truncate or lock a file the link points at (the output is cut back
// to its checkpoint, empty at first). A link is refused, the file it points at untouched.
func TestOutputFilesSafe(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE f (id int PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO f SELECT g, md5(g::text) FROM generate_series(1, 20) g`)
	sync := func(out string) (int, string) {
		e, _, errOut := testEnv(t)
		code := run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
			"--tables", "public.f", "--to", out, "--stop-when-caught-up", "--quiet"}, e)
		return code, errOut.String()
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	code, msg := sync(out)
	require.Equal(t, 0, code, msg)
	for _, p := range []string{out, out + ".lock", out + ".checkpoint"} {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "%s is readable by its owner only", filepath.Base(p))
	}

	// A link to a pipe (or a device, as /dev/stdout is) the user named is written as a stream.
	fifo := filepath.Join(dir, "pipe")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	require.NoError(t, os.Symlink(fifo, filepath.Join(dir, "to-pipe")))
	got := make(chan []byte)
	go func() {
		b, _ := os.ReadFile(fifo)
		got <- b
	}()
	code, msg = sync(filepath.Join(dir, "to-pipe"))
	require.Equal(t, 0, code, msg)
	require.Contains(t, string(<-got), `"op":"snapshot"`)

	for _, planted := range []string{"out2.jsonl", "out2.jsonl.lock", "out2.jsonl.checkpoint"} {
		t.Run(planted, func(t *testing.T) {
			dir := t.TempDir()
			victim := filepath.Join(dir, "victim")
			require.NoError(t, os.WriteFile(victim, []byte("a root-only file\n"), 0o600))
			require.NoError(t, os.Symlink(victim, filepath.Join(dir, planted)))
			code, msg := sync(filepath.Join(dir, "out2.jsonl"))
			require.Equal(t, 1, code, "a planted link is refused:\n%s", msg)
			require.Contains(t, msg, "symbolic link")
			b, err := os.ReadFile(victim)
			require.NoError(t, err)
			require.Equal(t, "a root-only file\n", string(b), "the file the link points at is untouched")
		})
	}
}
