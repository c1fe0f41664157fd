package main

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// TestControlCloseDoesNotWaitForIdleClients: a sync stopping (Ctrl-C) does not wait for a client
// connected to its control socket that sends nothing (found by review: it waited for the
// connection's one-minute deadline).
func TestControlCloseDoesNotWaitForIdleClients(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ctl")
	path := filepath.Join(dir, "s.sock")
	s, err := listenControl(path, "slot s, output x", zerolog.Nop())
	require.NoError(t, err)
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	defer c.Close()
	time.Sleep(100 * time.Millisecond) // accepted, waiting for a line
	start := time.Now()
	s.Close()
	require.Less(t, time.Since(start), 5*time.Second, "Close waited for the idle client")
	_, err = os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist, "the socket is removed")
}

// TestControlLeavesAFileAlone: a --control path that names a file, not a socket, is refused and
// the file kept (found by review: it was removed).
func TestControlLeavesAFileAlone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ctl")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	path := filepath.Join(dir, "out.checkpoint")
	require.NoError(t, os.WriteFile(path, []byte("keep"), 0o600))
	_, err := listenControl(path, "x", zerolog.Nop())
	require.ErrorContains(t, err, "is not a socket")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "keep", string(b))
}
