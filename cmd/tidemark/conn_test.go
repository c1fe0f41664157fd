package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// plaintextServer stands for a PostgreSQL server elsewhere that does not offer TLS: it answers
// an SSLRequest with 'N' and counts the connections that then start in plaintext (a startup
// message, which a password exchange follows), which only a client in sslmode prefer, allow or
// disable sends.
type plaintextServer struct {
	addr      string
	mu        sync.Mutex
	plaintext int
}

// startPlaintextServer listens on an address of this machine that is not a loopback one, so
// that the commands treat it as a remote server.
func startPlaintextServer(t *testing.T) *plaintextServer {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	var ip net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			ip = n.IP
			break
		}
	}
	if ip == nil {
		t.Skip("this machine has no address other than loopback")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	require.NoError(t, err)
	s := &plaintextServer{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { s.serve(c) })
		}
	})
	return s
}

func (s *plaintextServer) serve(c net.Conn) {
	defer c.Close()
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		switch binary.BigEndian.Uint32(hdr[4:]) {
		case 80877103, 80877104: // SSLRequest, GSSENCRequest: not offered
			if _, err := c.Write([]byte{'N'}); err != nil {
				return
			}
		default: // a startup message in plaintext: count those of the test's user only
			n := binary.BigEndian.Uint32(hdr[:4])
			if n < 8 || n > 10000 {
				return
			}
			params := make([]byte, n-8)
			if _, err := io.ReadFull(c, params); err != nil {
				return
			}
			if bytes.Contains(params, []byte("user\x00capture\x00")) {
				s.mu.Lock()
				s.plaintext++
				s.mu.Unlock()
			}
			return
		}
	}
}

func (s *plaintextServer) plaintextStarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.plaintext
}

// TestNoSilentPrefer: a connection string without sslmode to a server elsewhere gets
// verify-full in every command, never pgx's default prefer, which would fall back to plaintext
// (and send the startup and password exchange in clear) when the server offers no TLS; the
// error says how to choose sslmode.
func TestNoSilentPrefer(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	fake := startPlaintextServer(t)
	host, port, _ := net.SplitHostPort(fake.addr)
	remoteKV := fmt.Sprintf("host=%s port=%s user=capture dbname=app password=sekrit-pw", host, port)
	remoteURL := fmt.Sprintf("postgres://capture:sekrit-pw@%s/app", fake.addr)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	for _, tc := range []struct {
		name string
		args []string
		hint bool // the error explains the sslmode rule
	}{
		{"status", []string{"status", "--source", remoteKV}, true},
		{"status target", []string{"status", "--source", db.DSN, "--target", remoteURL}, true},
		{"cleanup", []string{"cleanup", "--source", remoteKV, "--yes"}, true},
		{"schema", []string{"schema", "--source", remoteURL, "--tables", "public.t"}, true},
		{"stream", []string{"stream", "--source", remoteKV}, true},
		{"doctor", []string{"doctor", "--source", remoteKV}, true},
		{"sync source", []string{"sync", "--source", remoteURL, "--tables", "public.t", "--to", out}, true},
		{"sync target", []string{"sync", "--source", db.DSN, "--slot", db.Slot, "--publication", db.Publication, "--tables", "public.t", "--to", remoteURL}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, stdout, stderr := testEnv(t)
			require.Equal(t, 1, run(context.Background(), tc.args, e), stderr.String())
			all := stdout.String() + stderr.String()
			require.Zero(t, fake.plaintextStarts(), "no connection fell back to plaintext:\n%s", all)
			if tc.hint {
				require.Contains(t, all, "sslmode=verify-full")
				require.Contains(t, all, "sslmode=require")
			}
			require.NotContains(t, all, "sekrit-pw")
		})
	}
	// An explicit sslmode is honoured as given: prefer falls back to plaintext, as asked.
	e, _, stderr := testEnv(t)
	require.Equal(t, 1, run(context.Background(), []string{"status", "--source", remoteKV + " sslmode=prefer"}, e))
	require.Positive(t, fake.plaintextStarts(), "explicit prefer: %s", stderr.String())
	require.NotContains(t, stderr.String(), "sslmode=verify-full")
}

// TestTargetFromEnvironment: sync takes its target from $TIDEMARK_TARGET when --to is not given,
// as it takes the source from $TIDEMARK_SOURCE, so that no password needs to be in the process's
// arguments; status reads the same variable for its --target.
func TestTargetFromEnvironment(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	db.Exec(`INSERT INTO t SELECT generate_series(1, 50)`)
	tgtDSN, tgt := targetDatabase(t, db)
	t.Setenv("TIDEMARK_SOURCE", db.DSN)
	t.Setenv("TIDEMARK_TARGET", tgtDSN)
	e, _, errOut := testEnv(t)
	require.Equal(t, 0, run(context.Background(), []string{"sync", "--slot", db.Slot, "--publication", db.Publication,
		"--tables", "public.t", "--stop-when-caught-up", "--quiet"}, e), errOut.String())
	var n int
	require.NoError(t, tgt.QueryRow(context.Background(), `SELECT count(*) FROM t`).Scan(&n))
	require.Equal(t, 50, n)

	e, stdout, errOut := testEnv(t)
	require.Equal(t, 0, run(context.Background(), []string{"status", "--slot", db.Slot}, e), errOut.String())
	require.Contains(t, stdout.String(), "checkpoint (target row "+db.Slot)
	require.False(t, strings.Contains(stdout.String()+errOut.String(), "password="))
}
