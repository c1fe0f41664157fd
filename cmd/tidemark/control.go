package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/sink/kafka"
	"github.com/tidemark/tidemark/sink/nats"
)

// The control channel: a running sync listens on a Unix socket of its own (--control; by default
// <runtime dir>/tidemark/<slot>.sock, in a directory that is its OS user's alone), and tidemark
// rebackfill asks it there, in one JSON line, to start tables' output over while it runs
// (merge.Engine.Rebackfill). Only the sync's OS user (and root) can connect. The request never
// goes through the database: pgoutput does not say who wrote a logical message and every role
// may write one, so a request written there could be forged by any role, and a re-backfill
// empties tables on a PostgreSQL target. It works the same with either watermark transport and
// on PostgreSQL 13, and needs no privilege beyond the capture's.

// controlRequest is what tidemark rebackfill sends; controlReply is the answer.
type controlRequest struct {
	Rebackfill []string `json:"rebackfill"`
}

type controlReply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	Sync  string `json:"sync,omitempty"` // which sync answered: its slot and output
}

// controlPath is the control socket of the sync of slot: flag when given, else
// $XDG_RUNTIME_DIR/tidemark/SLOT.sock, or TMPDIR/tidemark-UID/SLOT.sock.
func controlPath(flag, slot string) string {
	if flag != "" {
		return flag
	}
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
		return filepath.Join(dir, "tidemark", slot+".sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("tidemark-%d", os.Getuid()), slot+".sock")
}

// controlFlag defines --control.
func controlFlag(fs *flag.FlagSet) *string {
	return fs.String("control", "", "the control socket of the running sync (tidemark rebackfill asks it there); default `PATH` $XDG_RUNTIME_DIR/tidemark/SLOT.sock, or TMPDIR/tidemark-UID/SLOT.sock")
}

// controlServer is a sync's control socket. Its goroutine answers one request at a time; Close
// stops it and waits for it.
type controlServer struct {
	ln     net.Listener
	path   string
	who    string // this sync, as a reply names it: its slot and output
	log    zerolog.Logger
	engine atomic.Pointer[merge.Engine] // the engine of the run under way; nil between runs
	cur    atomic.Pointer[net.Conn]     // the connection being answered
	wg     sync.WaitGroup
}

// listenControl opens the control socket at path. Its directory must be the user's alone (made
// so when missing); a socket a live sync answers on is left alone (another sync of the slot), a
// stale one is replaced.
func listenControl(path, who string, log zerolog.Logger) (*controlServer, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := ownDir(dir); err != nil {
		return nil, fmt.Errorf("control socket: %w, or another user could ask this sync to re-backfill; fix it (chmod 700) or give --control a path in one", err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		_ = c.Close()
		return nil, fmt.Errorf("control socket: a sync already listens on %s (another sync of this slot?); give this one --control", path)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != os.ModeSocket {
		return nil, fmt.Errorf("control socket: %s is not a socket (a file of yours?): it is left alone; give --control another path", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	s := &controlServer{ln: ln, path: path, log: log, who: who}
	s.wg.Go(s.serve)
	log.Debug().Str("control", path).Msg("control socket ready (tidemark rebackfill)")
	return s, nil
}

func (s *controlServer) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return // closed
		}
		s.cur.Store(&c)
		s.handle(c)
		s.cur.Store(nil)
	}
}

// handle answers one request of connection c.
func (s *controlServer) handle(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	reply := func(r controlReply) {
		r.Sync = s.who
		b, _ := json.Marshal(r)
		_, _ = c.Write(append(b, '\n'))
	}
	line, err := bufio.NewReader(&limitedConn{c, 1 << 16}).ReadBytes('\n')
	if err != nil && len(line) == 0 {
		return
	}
	var req controlRequest
	if err := json.Unmarshal(line, &req); err != nil || len(req.Rebackfill) == 0 {
		reply(controlReply{Error: "not a request: send {\"rebackfill\": [\"schema.table\", ...]}"})
		return
	}
	eng := s.engine.Load()
	if eng == nil {
		reply(controlReply{Error: "the sync's capture is not running at this moment (starting, or reconnecting): ask again shortly"})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := eng.Rebackfill(ctx, req.Rebackfill); err != nil {
		if errors.Is(err, merge.ErrNotRunning) {
			err = errors.New("the sync's capture is not running at this moment (starting, or reconnecting): ask again shortly")
		}
		reply(controlReply{Error: err.Error()})
		return
	}
	s.log.Info().Strs("tables", req.Rebackfill).Msg("re-backfill asked for over the control socket: the tables' output starts over while the capture runs")
	reply(controlReply{OK: true})
}

// ownDir checks that dir is a directory of this user's alone (no access for group or others):
// the sync listens there, and tidemark rebackfill trusts what answers there.
func ownDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 || ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("the directory %s must be a directory of this user's alone (mode 0700)", dir)
	}
	return nil
}

// limitedConn reads at most n bytes of a connection.
type limitedConn struct {
	c net.Conn
	n int
}

func (l *limitedConn) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errors.New("request too long")
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	n, err := l.c.Read(p)
	l.n -= n
	return n, err
}

// Close stops the socket, waits for its goroutine and removes the socket file.
func (s *controlServer) Close() {
	if s == nil {
		return
	}
	_ = s.ln.Close()
	if c := s.cur.Load(); c != nil {
		_ = (*c).Close() // a client that sends nothing does not hold the sync's exit
	}
	s.wg.Wait()
	_ = os.Remove(s.path)
}

// running sets the engine of the run under way (nil once it ended).
func (s *controlServer) running(eng *merge.Engine) {
	if s != nil {
		s.engine.Store(eng)
	}
}

func runRebackfill(ctx context.Context, args []string, e *env) error {
	fs := newFlags("rebackfill", "rebackfill --tables SCHEMA.TABLE[,...] [--slot NAME | --control PATH]", e)
	slot := slotFlag(fs, "the slot of the running sync to ask")
	tables := fs.String("tables", "", "the tables whose output starts over (schema.table,...), among those the sync captures")
	control := controlFlag(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	list, err := parseTables(*tables)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	var names []string
	for _, t := range list {
		names = append(names, t.Schema+"."+t.Name)
	}
	path := controlPath(*control, *slot)
	if err := ownDir(filepath.Dir(path)); err != nil && !errors.Is(err, os.ErrNotExist) {
		// Another user's directory: whatever answers there could say yes and do nothing.
		return fmt.Errorf("%w; not asking what listens on %s", err, path)
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return fmt.Errorf("no running sync answers on %s (%v): start tidemark sync for slot %q first (or give --control the path its --control has); a sync that is not running re-backfills with its own --rebackfill", path, err, *slot)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	b, _ := json.Marshal(controlRequest{Rebackfill: names})
	if _, err := c.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("ask the sync on %s: %w", path, err)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("the sync on %s did not answer: %w", path, err)
	}
	var r controlReply
	if err := json.Unmarshal(line, &r); err != nil {
		return fmt.Errorf("the sync on %s answered %q", path, strings.TrimSpace(string(line)))
	}
	if !r.OK {
		return fmt.Errorf("the sync (%s) refused: %s", r.Sync, r.Error)
	}
	fmt.Fprintf(e.stdout, "re-backfill of %s taken and recorded by the running sync (%s): their output starts over (a refresh) and they are read again from the start, while changes keep flowing; its progress and status show it\n", strings.Join(names, ", "), r.Sync)
	return nil
}

// describeOutput names a sync's --to without its secrets: a file's path, or a PostgreSQL
// target's host, port and database.
func describeOutput(to string) string {
	if kafka.IsURL(to) {
		if a, err := kafka.ParseURL(to); err == nil {
			return a.String()
		}
		return kafka.Redact(to)
	}
	if nats.IsURL(to) {
		if a, err := nats.ParseURL(to); err == nil {
			return a.String()
		}
		return nats.Redact(to)
	}
	if !isDSN(to) {
		return to
	}
	cfg, err := pgconn.ParseConfig(to)
	if err != nil {
		return "a PostgreSQL target"
	}
	return fmt.Sprintf("PostgreSQL %s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}
