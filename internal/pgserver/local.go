package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/internal/faults"
	"github.com/tidemark/tidemark/internal/pgconf"
)

// DefaultSettings returns the server settings of a local cluster before Options.Settings, which
// a container launcher passes too (but listen_addresses and unix_socket_permissions).
func DefaultSettings() map[string]string { return maps.Clone(defaultSettings) }

// defaultSettings are the server settings of a local cluster before Options.Settings.
var defaultSettings = map[string]string{
	"listen_addresses":        "'127.0.0.1'",
	"wal_level":               "logical",
	"max_replication_slots":   "100",
	"max_wal_senders":         "100",
	"max_connections":         "200",
	"fsync":                   "off",
	"shared_buffers":          "128MB",
	"log_min_messages":        "warning",
	"log_line_prefix":         "'%m [%p] %q%a '",
	"wal_sender_timeout":      "60s",
	"max_slot_wal_keep_size":  "-1",
	"unix_socket_permissions": "0700",
}

// localCluster is a PostgreSQL cluster run from the installed binaries, owned by this process.
type localCluster struct {
	binDir string
	dir    string // the cluster's directory: data/, server.log, owner
	port   int
	cred   *syscall.Credential // nil unless running as root
	log    zerolog.Logger

	exited chan error // receives the postmaster's exit once; nil when not running
	pid    int
}

// Start starts a throwaway local cluster from the installed server binaries, on a free loopback
// port, with scram-sha-256 password authentication for TCP connections. When this process is
// root, the server runs as Options.RunAs. The postmaster is killed if this process dies; Stop
// removes the cluster's files.
func Start(ctx context.Context, opts Options) (*Server, error) {
	binDir := opts.BinDir
	if binDir == "" {
		var err error
		if binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	cred, err := runAs(opts.RunAs)
	if err != nil {
		return nil, err
	}
	parent := opts.Dir
	if parent == "" {
		parent = os.TempDir()
		if cred != nil {
			parent = "/tmp"
		}
	}
	reapStale(parent, opts.Log)
	dir, err := os.MkdirTemp(parent, "tidemark-pg-")
	if err != nil {
		return nil, fmt.Errorf("make cluster directory: %w", err)
	}
	c := &localCluster{binDir: binDir, dir: dir, cred: cred, log: opts.Log}
	password := randomHex(16)
	if err := c.initdb(ctx, password, opts.Settings); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if opts.NextXID != 0 {
		if err := c.setNextXID(ctx, opts.NextXID); err != nil {
			_ = c.shutdown(context.Background(), syscall.SIGQUIT)
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	// A port found free can be taken before the server binds it: try a few.
	for attempt := 0; ; attempt++ {
		if c.port, err = FreePort(); err == nil {
			err = c.start(ctx)
		}
		if err == nil {
			break
		}
		if attempt == 2 || ctx.Err() != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	s := &Server{kind: Local, host: "127.0.0.1", port: c.port, user: "postgres", password: password, adminDB: "postgres", log: opts.Log, local: c}
	s.stop = func(ctx context.Context) error {
		err := c.shutdown(ctx, syscall.SIGINT)
		if keep := faults.ServerLogs(); keep != "" {
			if b, rerr := os.ReadFile(filepath.Join(dir, "server.log")); rerr == nil {
				_ = os.WriteFile(filepath.Join(keep, fmt.Sprintf("server-%d-%d.log", c.port, time.Now().UnixNano())), b, 0o600)
			}
		}
		if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
			err = rerr
		}
		return err
	}
	c.log.Info().Str("dir", dir).Int("port", c.port).Msg("local postgres started")
	return s, nil
}

func (c *localCluster) initdb(ctx context.Context, password string, settings map[string]string) error {
	if err := os.WriteFile(filepath.Join(c.dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("write cluster owner: %w", err)
	}
	pwfile := filepath.Join(c.dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(password+"\n"), 0o600); err != nil {
		return fmt.Errorf("write password file: %w", err)
	}
	if c.cred != nil {
		for _, p := range []string{c.dir, pwfile} {
			if err := os.Chown(p, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				return fmt.Errorf("hand the cluster directory to the server's user: %w", err)
			}
		}
	}
	data := filepath.Join(c.dir, "data")
	args := []string{"-D", data, "-U", "postgres", "--pwfile", pwfile, "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "-N"}
	out, err := c.run(ctx, "initdb", append(args, "--locale=C.UTF-8")...)
	if err != nil {
		// Not every system has the C.UTF-8 locale.
		_ = os.RemoveAll(data)
		out, err = c.run(ctx, "initdb", append(args, "--no-locale")...)
	}
	if err != nil {
		return fmt.Errorf("initdb: %w: %s", err, lastLines(out, 10))
	}
	_ = os.Remove(pwfile)

	all := maps.Clone(defaultSettings)
	all["unix_socket_directories"] = c.dir
	maps.Copy(all, settings)
	var conf bytes.Buffer
	conf.WriteString("\n# tidemark throwaway cluster (internal/pgserver)\n")
	for _, k := range slices.Sorted(maps.Keys(all)) {
		// Every value quoted: paths and lists need it, numbers and words accept it.
		fmt.Fprintf(&conf, "%s = '%s'\n", k, strings.ReplaceAll(strings.Trim(all[k], "'"), "'", "''"))
	}
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open postgresql.conf: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(conf.Bytes()); err != nil {
		return fmt.Errorf("write postgresql.conf: %w", err)
	}
	return nil
}

// setNextXID makes next the cluster's next transaction id: it freezes every row of every
// database (their xmins would otherwise look like the future), stops the server, sets the id with
// pg_resetwal, and adds the commit log segment the id falls in (pg_resetwal does not).
func (c *localCluster) setNextXID(ctx context.Context, next uint64) error {
	var err error
	if c.port, err = FreePort(); err != nil {
		return err
	}
	if err := c.start(ctx); err != nil {
		return err
	}
	out, err := c.run(ctx, "vacuumdb", "-h", c.dir, "-p", strconv.Itoa(c.port), "-U", "postgres", "--all", "--freeze", "-q")
	if serr := c.shutdown(ctx, syscall.SIGINT); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("freeze before setting the next transaction id: %w: %s", err, lastLines(out, 10))
	}
	data := filepath.Join(c.dir, "data")
	if out, err := c.run(ctx, "pg_resetwal", "-D", data, "-e", strconv.FormatUint(next>>32, 10), "-x", strconv.FormatUint(next&0xFFFFFFFF, 10)); err != nil {
		return fmt.Errorf("pg_resetwal: %w: %s", err, lastLines(out, 10))
	}
	// A commit log segment holds 32 pages of 32768 transactions.
	seg := filepath.Join(data, "pg_xact", fmt.Sprintf("%04X", (next&0xFFFFFFFF)/(32*32768)))
	if _, err := os.Stat(seg); err == nil {
		return nil
	}
	if err := os.WriteFile(seg, make([]byte, 32*8192), 0o600); err != nil {
		return fmt.Errorf("write commit log segment: %w", err)
	}
	if c.cred != nil {
		if err := os.Chown(seg, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("hand the commit log segment to the server's user: %w", err)
		}
	}
	return nil
}

// run runs one of the server's programs as the server's user and returns its output.
func (c *localCluster) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, prog), args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	return cmd.CombinedOutput()
}

// start starts the postmaster and waits until it accepts connections.
func (c *localCluster) start(ctx context.Context) error {
	logPath := filepath.Join(c.dir, "server.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("open server log: %w", err)
	}
	cmd := exec.Command(filepath.Join(c.binDir, "postgres"), "-D", filepath.Join(c.dir, "data"), "-p", strconv.Itoa(c.port))
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Pdeathsig kills the postmaster when the thread that started it ends: the supervising
	// goroutine keeps that thread until the postmaster exits. Backends exit when their postmaster
	// dies, so nothing outlives a test binary that crashed or was killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	started := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer logFile.Close()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	c.exited, c.pid = exited, cmd.Process.Pid

	// Wait until the server accepts connections, or fail with the end of its log.
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			c.exited = nil
			return fmt.Errorf("postgres exited during start-up (%v): %s", err, tailFile(logPath, 15))
		default:
		}
		conn, err := pgconf.Open(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", c.dir, c.port), "tidemark-server")
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			_ = c.shutdown(context.Background(), syscall.SIGQUIT)
			return fmt.Errorf("postgres did not accept connections: %w: %s", err, tailFile(logPath, 15))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// shutdown stops the postmaster with sig (SIGINT: fast, SIGQUIT: immediate) and waits for it,
// killing it if it takes more than 30 seconds.
func (c *localCluster) shutdown(ctx context.Context, sig syscall.Signal) error {
	if c.exited == nil {
		return nil
	}
	defer func() { c.exited = nil }()
	if err := syscall.Kill(c.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal postgres: %w", err)
	}
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case <-c.exited:
		return nil
	case <-timer.C:
	case <-ctx.Done():
	}
	_ = syscall.Kill(-c.pid, syscall.SIGKILL)
	<-c.exited
	return fmt.Errorf("postgres did not stop on %v; killed", sig)
}

func (c *localCluster) restart(ctx context.Context, immediate bool) error {
	sig := syscall.SIGINT
	if immediate {
		sig = syscall.SIGQUIT
	}
	if err := c.shutdown(ctx, sig); err != nil {
		return err
	}
	c.log.Info().Bool("immediate", immediate).Msg("local postgres restarting")
	return c.start(ctx)
}

// reapStale removes cluster directories left by processes that no longer run (their servers died
// with them).
func reapStale(parent string, log zerolog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(parent, "tidemark-pg-*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) == nil || pid == os.Getpid() {
			continue
		}
		if os.RemoveAll(dir) == nil {
			log.Debug().Str("dir", dir).Msg("removed stale cluster")
		}
	}
}

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on now (another process may take
// it before the caller binds it: callers retry).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	return lastLines(b, n)
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
