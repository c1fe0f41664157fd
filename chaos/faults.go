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

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/internal/pgconf"
)

// The faults, with their weights in the schedule and their family. restart, commit-stall,
// standby-restart and restore change the server, so they run only on a server the harness
// started. The default family is what a run injects unless told otherwise; the ddl family (schema
// changes and operations, ddl.go) is asked for with --faults ddl (or default,ddl for both).
type faultKind struct {
	name     string
	weight   int
	embedded bool
	family   string
	modes    []Mode // the modes it applies to; nil: every mode
}

var faultKinds = []faultKind{
	{"kill", 35, false, "default", nil},          // kill -9 of the capture process
	{"restart", 6, true, "default", nil},         // PostgreSQL immediate shutdown and start
	{"walsender", 10, false, "default", nil},     // pg_terminate_backend of the slot's walsender
	{"drop", 8, false, "default", nil},           // the proxy closes every connection
	{"reset", 7, false, "default", nil},          // the proxy resets every connection (RST)
	{"stall", 8, false, "default", nil},          // the proxy forwards nothing for 1-4 s
	{"commit-stall", 8, true, "default", nil},    // a committed transaction stays invisible for 1-3 s (see commitStall)
	{"slow-consumer", 12, false, "default", nil}, // the output is not consumed for 1-4 s
	{"rename", 8, false, "ddl", nil},             // a table renamed (or moved to another schema) for 1-4 s, then back
	{"column", 8, false, "ddl", nil},             // a nullable column added, or one the harness added dropped
	{"identity", 8, false, "ddl", nil},           // REPLICA IDENTITY FULL, or USING INDEX another unique index, for 1-4 s
	{"publication", 6, false, "ddl", nil},        // a table dropped from the publication for 1-4 s, then added back
	{"truncate", 6, false, "ddl", nil},           // TRUNCATE of a table (the main table is reloaded in the same transaction)
	{"rewrite", 5, false, "ddl", nil},            // ALTER COLUMN v TYPE text USING v || ...: every value changed, no row event
	// The publication's publish option narrowed (truncate left out) for 5 s, then put back;
	// OWNER TO before it must stop nothing.
	{"publish", 4, false, "ddl", []Mode{JSONL, Postgres, Kafka, NATS}},
	// A table UNLOGGED for 5 s (12 s: Airbyte) under a schema publication, written to, then
	// LOGGED again.
	{"persist", 4, false, "ddl", nil},
	// tidemark rebackfill asked of the running sync: a table's output starts over mid-run.
	{"rebackfill", 5, false, "ddl", []Mode{JSONL, Postgres, Kafka, NATS}},
	{"standby-restart", 5, true, "ddl", nil}, // a commit kept invisible across a kill -9 and restart of the capture
	{"restore", 3, true, "ddl", nil},         // the source restored to a base backup taken seconds before, on a new timeline
	// A second capture against the slot and output of the running one, which is frozen and
	// loses its walsender meanwhile: the second must be refused (fence.go).
	// Kafka: a second writer of a prefix takes it over (the transactional id's epoch fences the
	// first); sink/kafka's and e2e's tests check that, not this fault. NATS: the second writer
	// takes the checkpoint over (a compare-and-set), which fences the first; sink/nats's tests.
	{"second-capture", 6, false, "fence", []Mode{JSONL, Postgres, Airbyte}},
	// The PostgreSQL target: an immediate restart of its server (one of its own), its
	// connections dropped by its proxy.
	{"target-restart", 5, false, "target", []Mode{Postgres}},
	{"target-drop", 8, false, "target", []Mode{Postgres}},
	// Kafka: the brokers disturbed for 1-4 s (Config.BrokerFault: requests failed, connections
	// dropped); without it, no effect.
	{"broker", 10, false, "default", []Mode{Kafka}},
	// NATS: a JetStream node killed for 1-4 s, then started again (Config.NodeFault); without
	// it, no effect.
	{"node", 10, false, "default", []Mode{NATS}},
}

// FaultFamilies are the names that stand for a family of faults in Config.Faults.
func FaultFamilies() []string { return []string{"default", "ddl", "fence", "target"} }

// expandFaults replaces the families in list by their kinds; empty is the default family.
func expandFaults(list []string) ([]string, error) {
	if len(list) == 0 {
		list = []string{"default"}
	}
	var out []string
	for _, f := range list {
		switch {
		case slices.Contains(FaultFamilies(), f):
			for _, k := range faultKinds {
				if k.family == f && !slices.Contains(out, k.name) {
					out = append(out, k.name)
				}
			}
		case slices.Contains(FaultKinds(), f):
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		default:
			return nil, fmt.Errorf("chaos: unknown fault %q (families %s; kinds %s)", f, strings.Join(FaultFamilies(), ", "), strings.Join(FaultKinds(), ", "))
		}
	}
	return out, nil
}

// noEffect starts the description of a fault that could not be applied (counted apart in the
// report).
const noEffect = "no effect: "

// noCapture is what kill says when no capture process runs.
const noCapture = "no capture running"

// effect returns what, marked as without effect unless ok.
func effect(ok bool, what string) string {
	if !ok {
		return noEffect + what
	}
	return what
}

// FaultKinds are the names of the faults.
func FaultKinds() []string {
	var out []string
	for _, k := range faultKinds {
		out = append(out, k.name)
	}
	return out
}

// inTurnGrace bounds how far past its duration an InTurn run goes to meet every kind; the time
// its faults without effect took (a table awaiting a remedy that a loaded machine is slow to
// finish, say) is added to it, up to inTurnCap times the duration in all.
const (
	inTurnGrace = 5
	inTurnCap   = 8
)

// faultLoop injects faults at random times (drawn from the seed) until end (InTurn: see below).
func (r *run) faultLoop(ctx context.Context, capt capture, end time.Time) {
	enabled := func(k string, embedded bool) bool {
		i := slices.IndexFunc(faultKinds, func(f faultKind) bool { return f.name == k })
		if i < 0 || (faultKinds[i].modes != nil && !slices.Contains(faultKinds[i].modes, r.cfg.Mode)) {
			return false
		}
		if k == "target-restart" && r.targetSrv == nil {
			return false // the target is not a server of the harness's own
		}
		if k == "broker" && r.cfg.BrokerFault == nil || k == "node" && r.cfg.NodeFault == nil {
			return false // the brokers are not the harness's to disturb
		}
		return (!embedded || r.srv != nil) && slices.Contains(r.cfg.Faults, k)
	}
	var total int
	var turns []string // InTurn: the enabled kinds, in the order of Config.Faults
	for _, k := range faultKinds {
		if enabled(k.name, k.embedded) {
			total += k.weight
		}
	}
	for _, name := range r.cfg.Faults {
		if i := slices.IndexFunc(faultKinds, func(k faultKind) bool { return k.name == name }); i >= 0 && enabled(name, faultKinds[i].embedded) {
			turns = append(turns, name)
		}
	}
	if total == 0 {
		sleep(ctx, time.Until(end))
		return
	}
	mean := float64(r.cfg.FaultEvery)
	// InTurn: a kind whose fault had no effect (a lock it could not take under load, say) keeps
	// its turn, so that every kind takes effect once before the next is tried; and the run goes
	// past end until each kind has taken effect once (a fault that stops the capture takes the
	// time of its remedy and restart, so on a slow machine the duration alone can end a run
	// before the last kinds had their turn), up to inTurnGrace times the duration more, plus the
	// time its faults without effect took (up to inTurnCap times the duration in all): a fault
	// that waits for another's remedy keeps the later kinds from their turn for as long as the
	// remedy takes, which a loaded machine stretches (CI seed 570387731: 24 publish faults
	// without effect while a re-backfill ran, and the last three kinds never had their turn;
	// CI seed 635767147, with the grace three times the duration: live changes 18 s behind in
	// the postgres mode, each stop's remedy and restart nearly a minute, two kinds unmet).
	last := end
	if r.cfg.InTurn {
		last = end.Add(inTurnGrace * r.cfg.Duration)
	}
	for turn := 0; ctx.Err() == nil; {
		began := time.Now()
		wait := time.Duration(math.Min(math.Max(r.rng.ExpFloat64()*mean, mean/10), 3*mean))
		if met := !r.cfg.InTurn || turn >= len(turns); (met && time.Now().Add(wait).After(end)) || time.Now().Add(wait).After(last) {
			if !met {
				r.mu.Lock()
				r.unmet = slices.Clone(turns[turn:])
				r.mu.Unlock()
				r.note("in turn: the run ran out of time with %d of %d kinds taken effect; never: %s", turn, len(turns), strings.Join(turns[turn:], ", "))
			}
			sleep(ctx, time.Until(end))
			return
		}
		sleep(ctx, wait)
		n := r.rng.IntN(total)
		for _, k := range faultKinds {
			if !enabled(k.name, k.embedded) {
				continue
			}
			if r.cfg.InTurn && k.name != turns[turn%len(turns)] {
				continue
			}
			if n -= k.weight; n < 0 || r.cfg.InTurn {
				d := time.Duration(1000+r.rng.IntN(3000)) * time.Millisecond
				r.note("fault %s begins", k.name)
				what := r.inject(ctx, k.name, d, capt)
				r.mu.Lock()
				r.faults[k.name]++
				if strings.HasPrefix(what, noEffect) {
					r.void[k.name]++
					if r.cfg.InTurn {
						if last = last.Add(time.Since(began)); last.After(end.Add(inTurnCap * r.cfg.Duration)) {
							last = end.Add(inTurnCap * r.cfg.Duration)
						}
					}
				} else {
					turn++
				}
				r.mu.Unlock()
				r.log.Info().Str("fault", k.name).Str("what", what).Msg("fault")
				r.note("fault %s: %s", k.name, what)
				break
			}
		}
	}
}

// inject applies one fault, lasting d when it lasts.
func (r *run) inject(ctx context.Context, kind string, d time.Duration, capt capture) string {
	switch kind {
	case "kill":
		what := r.sup.kill()
		if what == noCapture {
			return noEffect + what
		}
		return what
	case "restart":
		if err := r.srv.Restart(ctx, true); err != nil {
			return noEffect + "restart failed: " + err.Error()
		}
		return "immediate restart"
	case "walsender":
		n := r.exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, r.slot)
		return effect(n > 0, fmt.Sprintf("%d walsender terminated", n))
	case "drop":
		n := r.proxy.drop(false)
		return effect(n > 0, fmt.Sprintf("%d connections dropped", n))
	case "reset":
		n := r.proxy.drop(true)
		return effect(n > 0, fmt.Sprintf("%d connections reset", n))
	case "second-capture":
		return capt.second(ctx)
	case "target-restart":
		if err := r.targetSrv.Restart(ctx, true); err != nil {
			return noEffect + "target restart failed: " + err.Error()
		}
		return "target: immediate restart"
	case "target-drop":
		n := r.tproxy.drop(false)
		return effect(n > 0, fmt.Sprintf("target: %d connections dropped", n))
	case "stall":
		r.proxy.stall(ctx, d)
		return "connections stalled for " + d.String()
	case "commit-stall":
		return r.commitStall(ctx, d*3/4, false)
	case "slow-consumer":
		return capt.slow(ctx, d)
	case "node":
		if r.cfg.NodeFault == nil {
			return noEffect + "no control of the nodes"
		}
		return r.cfg.NodeFault(ctx, r.sch, r.rng.Uint64(), d)
	case "broker":
		if r.cfg.BrokerFault == nil {
			return noEffect + "no control of the brokers"
		}
		return r.cfg.BrokerFault(ctx, r.rng.Uint64(), d) // drawn from the seed, as every fault
	case "standby-restart":
		return r.commitStall(ctx, d*3/4, true)
	}
	return r.schemaFault(ctx, kind, d)
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
//
// acrossRestart (the standby-restart fault) keeps it invisible across a restart of the capture:
// once the capture's durable checkpoint has passed the held commit, the capture is killed (-9),
// and the commit stays invisible for d after the supervisor started it again. The next run does
// not see the commit in its stream (it resumes after it): only its checkpoint can tell it that
// the commit is not visible yet (Position.Invisible), and its chunks must wait for it.
func (r *run) commitStall(ctx context.Context, d time.Duration, acrossRestart bool) string {
	bg := context.WithoutCancel(ctx)
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
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
	// Across a restart it lasts longer: it updates fewer rows, so that the workload seldom waits
	// for its locks.
	every := 20
	if acrossRestart {
		every = 200
	}
	sql := fmt.Sprintf(`UPDATE %s SET v = v || 's', ver = nextval('%s.ver') WHERE id %% %d = %d`, r.schema.name("accounts"), r.sch, every, r.rng.IntN(every))
	if _, err := conn.Exec(ctx, "BEGIN; "+sql); err != nil {
		return noEffect + err.Error()
	}
	var xid uint64
	if err := conn.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid); err != nil {
		_, _ = conn.Exec(bg, "ROLLBACK")
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
	// Its commit record is flushed: the WAL position now is past it.
	committed := r.walPosition(bg)
	stopped := syscall.Kill(pid, syscall.SIGSTOP) == nil
	if !stopped {
		// Not allowed to signal the backend: every commit is held instead, which is no window
		// of a commit streamed and invisible.
		sleep(ctx, d)
		lift()
		<-spray
		return noEffect + "commits held back for " + d.String() + " (the backend could not be stopped)"
	}
	lift()
	if !acrossRestart {
		sleep(ctx, d)
		_ = syscall.Kill(pid, syscall.SIGCONT)
		<-spray
		return "a committed transaction kept invisible for " + d.String()
	}
	// Across a restart: wait (up to 20 s) for a durable checkpoint past the commit, kill the
	// capture, let the supervisor start it again, and keep the commit invisible for d more.
	var cp *checkpointInfo
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; sleep(ctx, 200*time.Millisecond) {
		if c, err := r.capt.checkpoint(bg); err == nil && c != nil && committed != 0 && c.LSN >= committed {
			cp = c
			break
		}
	}
	starts, _, _ := r.sup.counts()
	killed := r.sup.kill()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; sleep(ctx, 50*time.Millisecond) {
		if n, _, _ := r.sup.counts(); n > starts {
			break
		}
	}
	sleep(ctx, d)
	_ = syscall.Kill(pid, syscall.SIGCONT)
	<-spray
	if cp == nil {
		return noEffect + "the capture had not checkpointed past the held commit within 20 s (" + killed + ")"
	}
	carried := "not listed"
	if cp.invisible(uint32(xid)) {
		carried = "listed"
	}
	return fmt.Sprintf("a committed transaction (xid %d) kept invisible across a restart of the capture (%s), for %s after it; the checkpoint past its commit %s it as invisible",
		xid, killed, d, carried)
}

// walPosition returns the source's current WAL write position (0 when it cannot be read).
func (r *run) walPosition(ctx context.Context) pglogrepl.LSN {
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
	if err != nil {
		return 0
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var s string
	if conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s) != nil {
		return 0
	}
	lsn, _ := pglogrepl.ParseLSN(s)
	return lsn
}

// exec runs a statement on the source, directly, and returns the rows it affected or returned.
func (r *run) exec(ctx context.Context, sql string, args ...any) int64 {
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
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
	trace   *errTrace     // Airbyte: the TRACE ERROR it printed
	remedy  []string      // the re-backfills it was started with ("" for every table)
	before  string        // the durable checkpoint when it started, for remedy
	watched chan struct{} // with remedy: closed when watchRemedy is done
	mu      sync.Mutex
	killed  bool
}

// errTrace is the TRACE ERROR of an Airbyte read.
type errTrace struct {
	mu                   sync.Mutex
	failureType, message string
}

func (t *errTrace) set(failureType, message string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failureType, t.message = failureType, message
}

func (t *errTrace) get() (string, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failureType, t.message
}

// spawn starts cmd; after is called when it has exited, before done is closed.
func spawn(cmd *exec.Cmd, after func(error)) (*process, error) {
	p := &process{cmd: cmd, started: time.Now(), done: make(chan struct{}), stderr: newTail(), trace: &errTrace{}}
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

// failure describes why the process failed: the error tidemark printed last ("tidemark sync:
// ...", with the lines of its hint), the Airbyte connector's TRACE ERROR (its failure type and
// whole message), or else its last error log line.
func (p *process) failure() string {
	return failureText(p.stderr.String(), p.trace, p.err)
}

func failureText(stderr string, trace *errTrace, err error) string {
	if trace != nil {
		if ft, msg := trace.get(); msg != "" {
			return "[" + ft + "] " + msg
		}
	}
	if i := strings.LastIndex("\n"+stderr, "\ntidemark "); i >= 0 {
		if rest := strings.TrimSpace(stderr[i:]); rest != "" && !strings.HasPrefix(rest, "{") {
			return rest
		}
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "error") {
			return lines[i]
		}
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

// tail keeps the last 64 KiB written to it, and follows three marks in the whole output as it
// passes: the capture's own reconnections, its reruns, and its streams started.
type tail struct {
	mu         sync.Mutex
	buf        []byte
	total      int64 // bytes written
	reconnects marks // reconnectMark
	reruns     marks // rerunMark
	streams    marks // streamMark
}

// reconnectMark is what tidemark sync logs when it restarts from its checkpoint after a lost
// connection, by itself: a restart the supervisor does not see.
var reconnectMark = []byte("connection lost: reconnecting")

// rerunMark is what tidemark sync logs when it runs again after its PostgreSQL target met a
// change of a rewritten table (it closes its output and opens it again, without reconnecting).
var rerunMark = []byte("running again, which re-backfills the table")

// streamMark is what a capture logs when it starts streaming from the slot: it has opened its
// output (and taken the output's lock) before.
var streamMark = []byte(`"message":"start replication"`)

// marks counts a mark (never empty) in an output written in pieces, and where its last one ended;
// carry is the end of the last piece, for a mark split across two (shorter than the mark: every
// mark counted ends in the new piece, and none is counted twice).
type marks struct {
	mark  []byte
	carry []byte
	n     int
	last  int64 // the offset in the whole output just past the last one; 0: none yet
}

// add takes piece b, which starts at offset at of the whole output.
func (m *marks) add(b []byte, at int64) {
	window := append(m.carry, b...)
	if i := bytes.LastIndex(window, m.mark); i >= 0 {
		m.n += bytes.Count(window, m.mark)
		m.last = at - int64(len(m.carry)) + int64(i+len(m.mark))
	}
	m.carry = append([]byte(nil), window[max(0, len(window)-len(m.mark)+1):]...)
}

func newTail() *tail {
	return &tail{reconnects: marks{mark: reconnectMark}, reruns: marks{mark: rerunMark}, streams: marks{mark: streamMark}}
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range []*marks{&t.reconnects, &t.reruns, &t.streams} {
		m.add(b, t.total)
	}
	t.total += int64(len(b))
	t.buf = append(t.buf, b...)
	if len(t.buf) > tailBytes {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-tailBytes:]...)
	}
	return len(b), nil
}

// tailBytes is how much of a process's output a tail keeps: enough for the stacks of a capture
// (SIGQUIT) that a fault found stuck.
const tailBytes = 64 << 10

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.Clone(t.buf))
}

// supervisor keeps the capture running: it starts it again whenever it ends (killed, failed or,
// for Airbyte rounds, finished), as an operator's service manager or the platform does. A
// failure is first judged by exited (an expected stop is remedied there, and does not count as a
// failure in a row).
type supervisor struct {
	start  func(ctx context.Context) (*process, error)
	exited func(ctx context.Context, p *process) (expected bool) // after each process; nil: none
	log    zerolog.Logger

	mu         sync.Mutex
	cur        *process
	held       chan struct{} // non-nil while held: closed to resume
	starts     int
	reconnects int // by the processes that ended (tail.reconnects)
	failures   int
	expected   int // failures that were stops a fault explains
	last       string
	quickFails int // failures in a row within seconds of their start, with the same error
	lastQuick  string
}

func (s *supervisor) run(ctx context.Context) {
	for ctx.Err() == nil {
		s.mu.Lock()
		if held := s.held; held != nil {
			s.mu.Unlock()
			select {
			case <-held:
			case <-ctx.Done():
				return
			}
			continue
		}
		p, err := s.start(ctx)
		if err != nil {
			s.failures++
			s.last = err.Error()
			s.mu.Unlock()
			sleep(ctx, 500*time.Millisecond)
			continue
		}
		s.cur = p
		s.starts++
		s.mu.Unlock()
		select {
		case <-p.done:
		case <-ctx.Done():
			p.kill()
			<-p.done
		}
		expected := false
		if s.exited != nil && ctx.Err() == nil {
			expected = s.exited(ctx, p)
		} else if p.watched != nil {
			<-p.watched
		}
		s.mu.Lock()
		s.cur = nil
		s.reconnects += p.stderr.count()
		switch {
		case p.wasKilled() || ctx.Err() != nil:
			s.quickFails = 0
		case p.err != nil && expected:
			s.failures++
			s.expected++
			s.quickFails = 0
		case p.err != nil:
			s.failures++
			s.last = p.failure()
			if unavailable(s.last) {
				// A server the faults restart or restore is not up yet: the capture cannot
				// start, which says nothing of whether it can resume (the final catch-up,
				// once the server is back, says that).
				s.quickFails = 0
			} else if time.Since(p.started) < 3*time.Second && s.last == s.lastQuick {
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

// hold kills the running capture process and starts none until resume.
func (s *supervisor) hold() {
	s.mu.Lock()
	if s.held == nil {
		s.held = make(chan struct{})
	}
	p := s.cur
	s.mu.Unlock()
	if p != nil {
		p.kill()
		<-p.done
	}
	// The run loop judges the killed process and clears cur; wait for it, so that nothing of
	// the capture runs when hold returns.
	for {
		s.mu.Lock()
		idle := s.cur == nil
		s.mu.Unlock()
		if idle {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// resume ends a hold.
func (s *supervisor) resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held != nil {
		close(s.held)
		s.held = nil
	}
}

// kill kills the running capture process.
func (s *supervisor) kill() string {
	s.mu.Lock()
	p := s.cur
	s.mu.Unlock()
	if p == nil {
		return noCapture
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

// reconnects counts the times the capture restarted by itself after a lost connection, in the
// processes that ended and the one running.
func (s *supervisor) reconnectCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.reconnects
	if s.cur != nil {
		n += s.cur.stderr.count()
	}
	return n
}

func (t *tail) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reconnects.n
}

// holding reports whether the process has streamed since it last let its output go: each
// attempt of tidemark sync opens its output (taking its lock) before it streams, and closes it
// before it logs a reconnection or a rerun. The marks' order tells, not their counts (an attempt
// may fail before it streams). False may also be a capture that opened its output and does not
// stream yet (holding it): what it is used for (the second-capture fault) then tries nothing.
func (t *tail) holding() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.streams.last > max(t.reconnects.last, t.reruns.last)
}

// unavailable reports whether a capture's failure is a server that does not accept
// connections yet (starting up, in recovery, shutting down) or at all (refused).
func unavailable(failure string) bool {
	for _, s := range []string{"SQLSTATE 57P03", "SQLSTATE 57P01", "connection refused"} {
		if strings.Contains(failure, s) {
			return true
		}
	}
	return false
}

// stuck reports that the capture kept failing at once with the same error: it cannot resume.
func (s *supervisor) stuck() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quickFails >= 10
}
