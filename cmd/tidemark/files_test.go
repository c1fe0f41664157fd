package main

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

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

// TestOutputFilesOfOthersRefused: in a directory other users can write (/tmp), someone else can
// plant what the sync would then use: a link to a device (followed as a stream, like
// /dev/stdout), a pipe or an empty file they read from (the source's rows would go to them), or a
// checkpoint the sync would resume from. A link is followed only when it is this user's or
// root's, as the kernel's protected_symlinks does in sticky directories; a file, pipe or device
// of another user is refused; a block device is never written.
func TestOutputFilesOfOthersRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		require.False(t, e2e.InCI(), "CI runs the tests as root")
		t.Skip("files of another user can be made only as root")
	}
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE f (id int PRIMARY KEY, v text)`)
	db.Exec(`INSERT INTO f SELECT g, md5(g::text) FROM generate_series(1, 20) g`)
	sync := func(out string) (int, string) {
		e, _, errOut := testEnv(t)
		code := run(context.Background(), []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication,
			"--tables", "public.f", "--to", out, "--stop-when-caught-up", "--quiet"}, e)
		return code, errOut.String()
	}
	const other = 65534 // nobody
	for name, plant := range map[string]func(t *testing.T, out string){
		"link to a device": func(t *testing.T, out string) {
			require.NoError(t, os.Symlink("/dev/null", out))
			require.NoError(t, os.Lchown(out, other, other))
		},
		"pipe": func(t *testing.T, out string) {
			require.NoError(t, syscall.Mkfifo(out, 0o666))
			require.NoError(t, os.Chown(out, other, other))
			// The other user reads it (opened without blocking, so that a refused sync does
			// not leave the test waiting for a writer).
			r, err := os.OpenFile(out, os.O_RDONLY|syscall.O_NONBLOCK, 0)
			require.NoError(t, err)
			t.Cleanup(func() { r.Close() })
		},
		"empty file": func(t *testing.T, out string) {
			require.NoError(t, os.WriteFile(out, nil, 0o666))
			require.NoError(t, os.Chown(out, other, other))
		},
		"checkpoint": func(t *testing.T, out string) {
			require.NoError(t, os.WriteFile(out+".checkpoint", []byte(`{}`), 0o666))
			require.NoError(t, os.Chown(out+".checkpoint", other, other))
		},
		"lock": func(t *testing.T, out string) {
			require.NoError(t, os.WriteFile(out+".lock", nil, 0o666))
			require.NoError(t, os.Chown(out+".lock", other, other))
		},
		"block device": func(t *testing.T, out string) {
			// A device number no driver answers (loop device 1048575): nothing is written even
			// if the check were missing.
			dev := filepath.Join(filepath.Dir(out), "blk")
			require.NoError(t, unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 1048575))))
			require.NoError(t, os.Symlink(dev, out))
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.Chmod(dir, 0o1777))
			out := filepath.Join(dir, "out.jsonl")
			plant(t, out)
			code, msg := sync(out)
			require.Equal(t, 1, code, "what another user planted is refused:\n%s", msg)
			require.Regexp(t, `owned by|block device`, msg)
		})
	}
	// A pipe where the checkpoint goes, with no one writing: opening it to read would wait for a
	// writer for ever, holding the output's lock.
	t.Run("checkpoint pipe", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.Chmod(dir, 0o1777))
		out := filepath.Join(dir, "out.jsonl")
		require.NoError(t, syscall.Mkfifo(out+".checkpoint", 0o666))
		require.NoError(t, os.Chown(out+".checkpoint", other, other))
		type result struct {
			code int
			msg  string
		}
		done := make(chan result, 1)
		go func() {
			code, msg := sync(out)
			done <- result{code, msg}
		}()
		select {
		case r := <-done:
			require.Equal(t, 1, r.code, r.msg)
			require.Contains(t, r.msg, "not a regular file")
		case <-time.After(15 * time.Second):
			// Unblock it (a writer opens and closes the pipe), then fail.
			if w, err := os.OpenFile(out+".checkpoint", os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
			<-done
			t.Fatal("the sync waited on a pipe planted where its checkpoint goes")
		}
	})
	// A hard link to a file of this user's (root here), where the output goes: the owner is
	// right, the file is not the sync's to write.
	t.Run("hard link", func(t *testing.T) {
		dir, elsewhere := t.TempDir(), t.TempDir()
		require.NoError(t, os.Chmod(dir, 0o1777))
		victim := filepath.Join(elsewhere, "victim")
		require.NoError(t, os.WriteFile(victim, nil, 0o600))
		out := filepath.Join(dir, "out.jsonl")
		require.NoError(t, os.Link(victim, out))
		code, msg := sync(out)
		require.Equal(t, 1, code, msg)
		require.Contains(t, msg, "hard link")
		b, err := os.ReadFile(victim)
		require.NoError(t, err)
		require.Empty(t, b, "the linked file is untouched")
	})
	// What this user (root here) made is used: its own link to its own pipe, /dev/null.
	dir := t.TempDir()
	code, msg := sync("/dev/null")
	require.Equal(t, 0, code, msg)
	fifo := filepath.Join(dir, "pipe")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	require.NoError(t, os.Symlink(fifo, filepath.Join(dir, "to-pipe")))
	go func() { _, _ = os.ReadFile(fifo) }()
	code, msg = sync(filepath.Join(dir, "to-pipe"))
	require.Equal(t, 0, code, msg)
}
