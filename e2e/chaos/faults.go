package chaos

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
)

// The faults, with their weights in the schedule. restart and commit-stall change the server,
// so they run only on a server the harness started.
var faultKinds = []struct {
	name     string
	weight   int
	embedded bool
}{
	{"kill", 35, false},          // kill -9 of the capture process
	{"restart", 6, true},         // PostgreSQL immediate shutdown and start
	{"walsender", 10, false},     // pg_terminate_backend of the slot's walsender
	{"drop", 8, false},           // the proxy closes every connection
	{"reset", 7, false},          // the proxy resets every connection (RST)
	{"stall", 8, false},          // the proxy forwards nothing for 1-4 s
	{"commit-stall", 8, true},    // a committed transaction stays invisible for 1-3 s (see commitStall)
	{"slow-consumer", 12, false}, // the output is not consumed for 1-4 s
}

// noEffect starts the description of a fault that could not be applied (counted apart in the
// report).
const noEffect = "no effect: "

// FaultKinds are the names of the faults.
func FaultKinds() []string {
	var out []string
	for _, k := range faultKinds {
		out = append(out, k.name)
	}
	return out
}

// faultLoop injects faults at random times (drawn from the seed) until end.
func (r *run) faultLoop(ctx context.Context, capt capture, end time.Time) {
	enabled := func(k string, embedded bool) bool {
		return (!embedded || r.srv != nil) && (len(r.cfg.Faults) == 0 || slices.Contains(r.cfg.Faults, k))
	}
	var total int
	for _, k := range faultKinds {
		if enabled(k.name, k.embedded) {
			total += k.weight
		}
	}
	if total == 0 {
		sleep(ctx, time.Until(end))
		return
	}
	mean := float64(r.cfg.FaultEvery)
	for ctx.Err() == nil {
		wait := time.Duration(math.Min(math.Max(r.rng.ExpFloat64()*mean, mean/10), 3*mean))
		if time.Now().Add(wait).After(end) {
			sleep(ctx, time.Until(end))
			return
		}
		sleep(ctx, wait)
		n := r.rng.IntN(total)
		for _, k := range faultKinds {
			if !enabled(k.name, k.embedded) {
				continue
			}
			if n -= k.weight; n < 0 {
				d := time.Duration(1000+r.rng.IntN(3000)) * time.Millisecond
				what := r.inject(ctx, k.name, d, capt)
				r.mu.Lock()
				r.faults[k.name]++
				if strings.HasPrefix(what, noEffect) {
					r.void[k.name]++
				}
				r.mu.Unlock()
				r.log.Info().Str("fault", k.name).Str("what", what).Msg("fault")
				break
			}
		}
	}
}

// inject applies one fault, lasting d when it lasts.
func (r *run) inject(ctx context.Context, kind string, d time.Duration, capt capture) string {
	switch kind {
	case "kill":
		return r.sup.kill()
	case "restart":
		if err := r.srv.Restart(ctx, true); err != nil {
			return noEffect + "restart failed: " + err.Error()
		}
		return "immediate restart"
	case "walsender":
		n := r.exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, r.slot)
		return fmt.Sprintf("%d walsender terminated", n)
	case "drop":
		return fmt.Sprintf("%d connections dropped", r.proxy.drop(false))
	case "reset":
		return fmt.Sprintf("%d connections reset", r.proxy.drop(true))
	case "stall":
		r.proxy.stall(ctx, d)
		return "connections stalled for " + d.String()
	case "commit-stall":
		return r.commitStall(ctx, d*3/4)
	case "slow-consumer":
		return capt.slow(ctx, d)
	}
	return ""
}

// commitStall holds a transaction between its commit record and its visibility for d: the
// window in which PostgreSQL has streamed a transaction that new snapshots do not see yet, which
// the visibility guard (algorithm reference §1.6) is for. The window is normally microseconds
// long; here it lasts: a client updates one in twenty rows all over the main table, its commit
// waits for a synchronous standby that does not exist (its commit record is flushed and streamed
// by then), its backend is stopped (SIGSTOP) while it waits, and the standby requirement is
// lifted so that every other commit, watermarks included, goes on. Chunks read meanwhile have
// the stopped transaction in their snapshot's running list although it precedes their low
// watermark in the stream. SIGCONT ends it. Sending signals to the server's backends needs the
// harness to run as root or as the server's OS user; without that every commit waits for d.
func (r *run) commitStall(ctx context.Context, d time.Duration) string {
	bg := context.WithoutCancel(ctx)
	conn, err := pgx.Connect(ctx, r.dsn)
	if err != nil {
		return noEffect + err.Error()
	}
	defer conn.Close(bg)
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return noEffect + err.Error()
	}
	// The update takes its row locks before commits wait for the standby: a workload transaction
	// waiting for it with a lock the update needs would block the update until the stall ends.
	sql := fmt.Sprintf(`UPDATE %s.accounts SET v = v || 's', ver = nextval('%s.ver') WHERE id %% 20 = %d`, Schema, Schema, r.rng.IntN(20))
	if _, err := conn.Exec(ctx, "BEGIN; "+sql); err != nil {
		return noEffect + err.Error()
	}
	r.exec(bg, `ALTER SYSTEM SET synchronous_standby_names = 'tidemark_chaos_absent_standby'`)
	r.exec(bg, `SELECT pg_reload_conf()`)
	lift := func() {
		r.exec(bg, `ALTER SYSTEM RESET synchronous_standby_names`)
		r.exec(bg, `SELECT pg_reload_conf()`)
	}
	// The setting reaches the backends and the checkpointer (which tells commits to wait)
	// asynchronously.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; {
		var v string
		if conn.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&v) != nil || v != "" {
			break
		}
		sleep(ctx, 20*time.Millisecond)
	}
	sleep(ctx, 200*time.Millisecond)
	spray := make(chan error, 1)
	go func() {
		_, err := conn.Exec(bg, "COMMIT")
		spray <- err
	}()
	// Wait until the spraying commit waits for the standby.
	waiting := false
	for deadline := time.Now().Add(10 * time.Second); !waiting && time.Now().Before(deadline) && ctx.Err() == nil && len(spray) == 0; {
		waiting = r.exec(bg, `SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'`, pid) == 1
		if !waiting {
			sleep(ctx, 20*time.Millisecond)
		}
	}
	if !waiting {
		lift()
		<-spray
		return noEffect + "the spraying transaction did not wait for the standby"
	}
	stopped := syscall.Kill(pid, syscall.SIGSTOP) == nil
	if !stopped {
		// Not allowed to signal the backend: hold every commit instead.
		sleep(ctx, d)
		lift()
		<-spray
		return "commits held back for " + d.String() + " (the backend could not be stopped)"
	}
	lift()
	sleep(ctx, d)
	_ = syscall.Kill(pid, syscall.SIGCONT)
	<-spray
	return "a committed transaction kept invisible for " + d.String()
}

// exec runs a statement on the source, directly, and returns the rows it affected or returned.
func (r *run) exec(ctx context.Context, sql string, args ...any) int64 {
	conn, err := pgx.Connect(ctx, r.dsn)
	if err != nil {
		return 0
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tag, err := conn.Exec(ctx, sql, args...)
	if err != nil {
		return 0
	}
	return tag.RowsAffected()
}

// process is one run of a capture process.
type process struct {
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{} // closed when it has exited and its output is read
	err     error
	stderr  *tail
	mu      sync.Mutex
	killed  bool
}

// spawn starts cmd; after is called when it has exited, before done is closed.
func spawn(cmd *exec.Cmd, after func(error)) (*process, error) {
	p := &process{cmd: cmd, started: time.Now(), done: make(chan struct{}), stderr: &tail{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = cmd.Wait()
		if after != nil {
			after(p.err)
		}
		close(p.done)
	}()
	return p, nil
}

func (p *process) kill() {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
}

func (p *process) wasKilled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killed
}

// freeze stops the process for d (SIGSTOP, then SIGCONT).
func (p *process) freeze(ctx context.Context, d time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGSTOP)
	sleep(ctx, d)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
}

// failure describes why the process failed: its last error log line.
func (p *process) failure() string {
	lines := strings.Split(strings.TrimSpace(p.stderr.String()), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "error") {
			return lines[i]
		}
	}
	if p.err != nil {
		return p.err.Error()
	}
	return ""
}

// tail keeps the last 16 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if len(t.buf) > 16<<10 {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-16<<10:]...)
	}
	return len(b), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.Clone(t.buf))
}

// supervisor keeps the capture running: it starts it again whenever it ends (killed, failed or,
// for Airbyte rounds, finished), as an operator's service manager or the platform does.
type supervisor struct {
	start func(ctx context.Context) (*process, error)
	log   zerolog.Logger

	mu         sync.Mutex
	cur        *process
	starts     int
	failures   int
	last       string
	quickFails int // failures in a row within seconds of their start, with the same error
	lastQuick  string
}

func (s *supervisor) run(ctx context.Context) {
	for ctx.Err() == nil {
		p, err := s.start(ctx)
		if err != nil {
			s.mu.Lock()
			s.failures++
			s.last = err.Error()
			s.mu.Unlock()
			sleep(ctx, 500*time.Millisecond)
			continue
		}
		s.mu.Lock()
		s.cur = p
		s.starts++
		s.mu.Unlock()
		select {
		case <-p.done:
		case <-ctx.Done():
			p.kill()
			<-p.done
		}
		s.mu.Lock()
		s.cur = nil
		switch {
		case p.wasKilled() || ctx.Err() != nil:
			s.quickFails = 0
		case p.err != nil:
			s.failures++
			s.last = p.failure()
			if time.Since(p.started) < 3*time.Second && s.last == s.lastQuick {
				s.quickFails++
			} else {
				s.quickFails = 1
			}
			s.lastQuick = s.last
			s.log.Debug().Str("failure", s.last).Msg("capture failed; starting it again")
		default:
			s.quickFails = 0
		}
		s.mu.Unlock()
		sleep(ctx, 200*time.Millisecond)
	}
}

// kill kills the running capture process.
func (s *supervisor) kill() string {
	s.mu.Lock()
	p := s.cur
	s.mu.Unlock()
	if p == nil {
		return "no capture running"
	}
	p.kill()
	return fmt.Sprintf("kill -9 after %s", time.Since(p.started).Round(time.Millisecond))
}

func (s *supervisor) current() *process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *supervisor) counts() (starts, failures int, last string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts, s.failures, s.last
}

// stuck reports that the capture kept failing at once with the same error: it cannot resume.
func (s *supervisor) stuck() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quickFails >= 10
}
