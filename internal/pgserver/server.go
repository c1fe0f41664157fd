package pgserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/internal/faults"
	"github.com/tidemark/tidemark/internal/pgconf"
)

// ErrUnsupported reports an operation the server's kind cannot do (restarting an external server).
var ErrUnsupported = errors.New("not supported by this kind of server")

// Kind says where a Server runs.
type Kind string

// The kinds of Server.
const (
	Local     Kind = "local"     // started here from the installed server binaries
	External  Kind = "external"  // given by a connection string; never started or stopped here
	Container Kind = "container" // started in a Docker engine by the e2e package (New)
)

// Options configures Start (and the e2e package's StartContainer, which takes Settings and Log).
type Options struct {
	// BinDir holds the PostgreSQL server binaries (initdb, postgres). Zero: `pg_config --bindir`,
	// then the newest /usr/lib/postgresql/*/bin, then the PATH.
	BinDir string
	// Dir is where the cluster's directory is made. Zero: the system's temporary directory, or
	// /tmp when running as root (the server's user must be able to reach it).
	Dir string
	// RunAs is the OS user that runs the server when this process is root (PostgreSQL refuses to
	// run as root). Zero: "postgres".
	RunAs string
	// Settings are server settings over the defaults: wal_level=logical, 100 replication slots
	// and WAL senders, 200 connections, fsync=off (a throwaway cluster needs no crash safety
	// against power loss; a process crash or immediate shutdown is still recovered).
	Settings map[string]string
	// Log receives the launcher's progress messages. Zero: nothing is logged.
	Log zerolog.Logger
	// NextXID, when not zero, is the 64-bit transaction id (epoch << 32 | xid) the cluster's
	// next transaction gets, set with pg_resetwal after initdb (every row initdb wrote is frozen
	// first): a test crosses a 32-bit wraparound after a few thousand transactions. Local only.
	NextXID uint64
}

// Server is one PostgreSQL server with wal_level=logical that tests, the demo, the benchmarks and
// the chaos harness create databases in. Start, Connect or New make one; Stop removes what was
// started.
type Server struct {
	kind     Kind
	host     string
	port     int
	user     string
	password string
	adminDB  string // database for administrative connections
	log      zerolog.Logger

	local *localCluster // Local only
	stop  func(context.Context) error
}

// Spec describes, for New, a server that a launcher outside this package started.
type Spec struct {
	Kind     Kind
	Host     string
	Port     int
	User     string // a superuser
	Password string
	AdminDB  string // the database for administrative connections; zero: "postgres"
	Log      zerolog.Logger
	// Stop stops the server and removes what was started for it; nil: Server.Stop does nothing.
	Stop func(context.Context) error
}

// New returns the Server that spec describes; the launcher that started it (the e2e package's
// containers) owns its lifecycle through spec.Stop. Restart is not supported for it.
func New(spec Spec) *Server {
	s := &Server{kind: spec.Kind, host: spec.Host, port: spec.Port, user: spec.User, password: spec.Password,
		adminDB: spec.AdminDB, log: spec.Log, stop: spec.Stop}
	if s.adminDB == "" {
		s.adminDB = "postgres"
	}
	return s
}

// Kind says where the server runs.
func (s *Server) Kind() Kind { return s.kind }

// ClientDSN returns a connection string for database db that holds no password, and the
// environment that gives it to libpq (PGPASSWORD): for the tools the benchmarks run, whose
// arguments every user of the machine can read in the process list, their environment not.
func (s *Server) ClientDSN(db string) (dsn string, env []string) {
	q := func(v string) string { return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'" }
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", q(s.host), s.port, q(s.user), q(db)), []string{"PGPASSWORD=" + s.password}
}

// Passfile writes a password file of the superuser's password in a local server's directory,
// readable by the server's user only, and returns its path: for a subscription's connection
// string (passfile=PATH), which the server's own libpq reads, so that no password is in the
// statement or in the catalog.
func (s *Server) Passfile() (string, error) {
	if s.local == nil {
		return "", fmt.Errorf("passfile of %s server: %w", s.kind, ErrUnsupported)
	}
	path := filepath.Join(s.local.dir, "pgpass")
	esc := strings.NewReplacer(`\`, `\\`, `:`, `\:`).Replace
	line := fmt.Sprintf("*:*:*:%s:%s\n", esc(s.user), esc(s.password))
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		return "", fmt.Errorf("write passfile: %w", err)
	}
	if c := s.local.cred; c != nil {
		if err := os.Chown(path, int(c.Uid), int(c.Gid)); err != nil {
			return "", fmt.Errorf("hand the passfile to the server's user: %w", err)
		}
	}
	return path, nil
}

// LogFile is the server log of a local server ("" for any other).
func (s *Server) LogFile() string {
	if s.local == nil {
		return ""
	}
	return filepath.Join(s.local.dir, "server.log")
}

// Port is the server's TCP port on Host.
func (s *Server) Port() int { return s.port }

// Host is the server's host name or address.
func (s *Server) Host() string { return s.host }

// DSN returns a key=value connection string for database db, as the superuser.
func (s *Server) DSN(db string) string {
	return DSN(s.host, s.port, s.user, s.password, db)
}

// UserDSN returns a key=value connection string for database db as another user.
func (s *Server) UserDSN(db, user, password string) string {
	return DSN(s.host, s.port, user, password, db)
}

// DSN builds a key=value connection string with sslmode=disable.
func DSN(host string, port int, user, password, db string) string {
	q := func(v string) string { return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'" }
	return fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s sslmode=disable", q(host), port, q(user), q(password), q(db))
}

// Admin connects to the server's administrative database as the superuser.
func (s *Server) Admin(ctx context.Context) (*pgx.Conn, error) {
	return pgconf.Open(ctx, s.DSN(s.adminDB), "tidemark-server")
}

// CreateDatabase creates database name, replacing one of that name left by an earlier run.
func (s *Server) CreateDatabase(ctx context.Context, name string) error {
	if err := s.DropDatabase(ctx, name); err != nil {
		return err
	}
	conn, err := s.Admin(ctx)
	if err != nil {
		return fmt.Errorf("connect to %s server: %w", s.kind, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create database %q: %w", name, err)
	}
	return s.plant(ctx, name)
}

// plant runs faults.PlantSQL in database name (a test build's planted-objects test; nothing in
// the product's build).
func (s *Server) plant(ctx context.Context, name string) error {
	sql, err := faults.PlantSQL()
	if err != nil || sql == "" {
		return err
	}
	conn, err := pgconf.Open(ctx, s.DSN(name)+" application_name=planted-harness", "planted-harness")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("plant into database %q: %w", name, err)
	}
	return nil
}

// DropDatabase drops database name with its replication slots and publications, ending the
// sessions that use it. A missing database is not an error.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	conn, err := s.Admin(ctx)
	if err != nil {
		return fmt.Errorf("connect to %s server: %w", s.kind, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// A logical slot's database cannot be dropped while a walsender uses the slot, and an
	// inactive slot is dropped with the database; walsenders end asynchronously, so wait.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, name); err != nil {
			return fmt.Errorf("end sessions of database %q: %w", name, err)
		}
		var active int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = $1 AND active`, name).Scan(&active); err != nil {
			return fmt.Errorf("list slots of database %q: %w", name, err)
		}
		if active == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("drop database %q: %d replication slots stay active", name, active)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name); err != nil {
		return fmt.Errorf("drop slots of database %q: %w", name, err)
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %q: %w", name, err)
	}
	return nil
}

// Restart stops the server and starts it again on the same port. With immediate, the stop is an
// immediate shutdown (as after a crash: the server recovers from WAL on start).
func (s *Server) Restart(ctx context.Context, immediate bool) error {
	if s.local == nil {
		return fmt.Errorf("restart %s server: %w", s.kind, ErrUnsupported)
	}
	return s.local.restart(ctx, immediate)
}

// Stop stops a server this package started and removes its files; an external server is left
// alone.
func (s *Server) Stop(ctx context.Context) error {
	if s.stop == nil {
		return nil
	}
	return s.stop(ctx)
}

// Connect uses the external server that dsn names. Its role must be able to create databases and
// replication slots.
func Connect(ctx context.Context, dsn string, log zerolog.Logger) (*Server, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("external server: %w", pgconf.ParseError(err))
	}
	s := &Server{kind: External, host: cfg.Host, port: int(cfg.Port), user: cfg.User, password: cfg.Password, adminDB: cfg.Database, log: log}
	if s.adminDB == "" {
		s.adminDB = "postgres"
	}
	conn, err := s.Admin(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect to external server: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return nil, fmt.Errorf("read wal_level of external server: %w", err)
	}
	if walLevel != "logical" {
		return nil, fmt.Errorf("external server has wal_level=%s; set wal_level = logical and restart it", walLevel)
	}
	return s, nil
}

// FindBinDir finds the PostgreSQL server binaries as Options.BinDir documents.
func FindBinDir() (string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	var tried []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if has(dir) {
			return dir, nil
		}
		tried = append(tried, dir)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, dir := range dirs {
		if has(dir) {
			return dir, nil
		}
		tried = append(tried, dir)
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb, postgres) found (looked in pg_config --bindir, /usr/lib/postgresql/*/bin and PATH; tried %v); "+
		"install them, for example: apt-get install postgresql-15", tried)
}

func pgMajor(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// runAs returns the credential to run the server with: nil unless this process is root.
func runAs(name string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	if name == "" {
		name = "postgres"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL refuses to run as root and there is no user %q to run it as: %w (create one, for example: useradd --system postgres)", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
