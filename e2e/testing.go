package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
)

// Main runs a test package's tests against one server, started from the environment as
// StartFromEnv does, and stops it afterwards. Call it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(e2e.Main(m, &server)) }
//
// When no server can be started, the tests fail in CI (CI=true) or when $TIDEMARK_TEST_SERVER
// asked for a kind, and are skipped elsewhere.
func Main(m *testing.M, srv **Server) int {
	ctx := context.Background()
	s, err := StartFromEnv(ctx, zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(zerolog.WarnLevel))
	if err != nil {
		if InCI() || os.Getenv(EnvServer) != "" {
			fmt.Fprintf(os.Stderr, "e2e: CI=%s %s=%s and %v\n", os.Getenv("CI"), EnvServer, os.Getenv(EnvServer), err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "e2e: skipping the tests that need PostgreSQL: %v\n", err)
		return m.Run()
	}
	*srv = s
	// Stop runs after m.Run even when tests fail; a panic or os.Exit in a test kills the
	// postmaster through its parent-death signal instead.
	defer func() {
		if err := s.Stop(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: stop server: %v\n", err)
		}
	}()
	return m.Run()
}

// TestDB is a database of its own for one test, with names for its slot and publication. It is
// dropped, with its slots, when the test ends, whether it passed or not.
type TestDB struct {
	Name        string    // database name
	DSN         string    // superuser connection string to the database
	Slot        string    // a replication slot name for the test
	Publication string    // a publication name for the test
	Conn        *pgx.Conn // superuser connection for the test's setup SQL
	Server      *Server   // the server
	t           testing.TB
}

// NewTestDB creates a database for t, named after a hash of t.Name(). It skips t when srv is nil
// (no server outside CI, see Main).
func NewTestDB(t testing.TB, srv *Server) *TestDB {
	t.Helper()
	if srv == nil {
		t.Skip("no PostgreSQL server (see the e2e package documentation)")
	}
	sum := sha256.Sum256([]byte(t.Name()))
	h := hex.EncodeToString(sum[:])[:12]
	ctx := context.Background()
	d := &TestDB{Name: "t_" + h, Slot: "s_" + h, Publication: "p_" + h, Server: srv, t: t}
	if err := srv.CreateDatabase(ctx, d.Name); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		if d.Conn != nil {
			d.Conn.Close(context.Background())
		}
		if err := srv.DropDatabase(context.Background(), d.Name); err != nil {
			t.Errorf("drop test database: %v", err)
		}
	})
	d.DSN = srv.DSN(d.Name)
	conn, err := pgx.Connect(ctx, d.DSN)
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	d.Conn = conn
	return d
}

// Exec runs sql (with args) and fails the test on error.
func (d *TestDB) Exec(sql string, args ...any) {
	d.t.Helper()
	if _, err := d.Conn.Exec(context.Background(), sql, args...); err != nil {
		d.t.Fatalf("exec %q: %v", sql, err)
	}
}

// Connect opens another superuser connection to the database, closed when the test ends.
func (d *TestDB) Connect() *pgx.Conn {
	d.t.Helper()
	conn, err := pgx.Connect(context.Background(), d.DSN)
	if err != nil {
		d.t.Fatalf("connect to test database: %v", err)
	}
	d.t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// CurrentLSN returns the server's current WAL insert position.
func (d *TestDB) CurrentLSN() pglogrepl.LSN {
	d.t.Helper()
	var s string
	if err := d.Conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		d.t.Fatalf("read current LSN: %v", err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		d.t.Fatalf("parse LSN %q: %v", s, err)
	}
	return lsn
}

// SlotLSNs returns the confirmed flush and restart LSNs of slot.
func (d *TestDB) SlotLSNs(slot string) (confirmed, restart pglogrepl.LSN) {
	d.t.Helper()
	var c, r string
	err := d.Conn.QueryRow(context.Background(),
		`SELECT coalesce(confirmed_flush_lsn, '0/0')::text, coalesce(restart_lsn, '0/0')::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&c, &r)
	if err != nil {
		d.t.Fatalf("read slot %q: %v", slot, err)
	}
	confirmed, _ = pglogrepl.ParseLSN(c)
	restart, _ = pglogrepl.ParseLSN(r)
	return confirmed, restart
}

// WaitFor polls cond every 20ms until it holds, failing the test with reason after timeout.
func WaitFor(t testing.TB, timeout time.Duration, reason string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SyncBuffer collects what a process or a logger writes while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
