package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// The second-capture fault: a second capture started against the slot and the output of the
// running one, as a cron job or a second service instance would. It must be refused before it
// touches the output, and the first must go on unharmed (the oracle checks the output).

// fenceMark is what tidemark sync says when another sync holds the output or the checkpoint.
const fenceMark = "another tidemark sync is writing"

// secondWait is how long a second capture has to be refused.
const secondWait = 10 * time.Second

// second runs a second tidemark sync while the first is frozen (SIGSTOP) and its walsender is
// ended, so that the slot is free: only the output's lock (JSON lines) or the target's advisory
// lock (PostgreSQL) can refuse it. One that is still running after secondWait was not refused:
// a violation.
func (c *syncCapture) second(ctx context.Context) string {
	r := c.r
	first := r.sup.current()
	if first == nil {
		return noEffect + "no capture running"
	}
	if err := first.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return noEffect + "the capture could not be frozen: " + err.Error()
	}
	defer func() { _ = first.cmd.Process.Signal(syscall.SIGCONT) }()
	n := r.exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, r.slot)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; sleep(ctx, 50*time.Millisecond) {
		if r.exec(ctx, `SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, r.slot) == 1 {
			break
		}
	}
	p, err := spawn(exec.Command(r.cfg.Tidemark, c.args(false, nil)...), nil)
	if err != nil {
		return noEffect + err.Error()
	}
	r.note("second capture pid %d started beside pid %d (frozen; %d walsender ended)", p.cmd.Process.Pid, first.cmd.Process.Pid, n)
	t := time.NewTimer(secondWait)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.kill()
		<-p.done
		r.violate("second capture: a second tidemark sync on the slot and output of a running one was not refused (it ran %s, killed)", secondWait)
		return "a second capture ran (not refused)"
	case <-ctx.Done():
		p.kill()
		<-p.done
		return noEffect + "the run ended"
	}
	why := p.failure()
	switch {
	case p.err == nil:
		r.violate("second capture: a second tidemark sync on the slot and output of a running one ended well: it was not refused")
		return "a second capture ran (not refused)"
	case strings.Contains(why, fenceMark):
		return "a second capture refused: " + firstLine(why)
	case n == 0:
		// The slot was still held: refused by it, the fence untried.
		return noEffect + "the first capture's walsender was not there to end; the second stopped on: " + firstLine(why)
	default:
		r.violate("second capture: a second tidemark sync on the slot and output of a running one stopped without naming the other writer: %s", firstLine(why))
		return "a second capture stopped: " + firstLine(why)
	}
}

// second runs a second read of the connector while the first is frozen, from the same state:
// the slot is held, and the second must fail without committing anything (no STATE).
func (c *airbyteCapture) second(ctx context.Context) string {
	r := c.r
	first := r.sup.current()
	if first == nil {
		return noEffect + "no capture running"
	}
	if err := first.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return noEffect + "the capture could not be frozen: " + err.Error()
	}
	defer func() { _ = first.cmd.Process.Signal(syscall.SIGCONT) }()
	holder := r.slotHolder(ctx)
	if holder == 0 {
		return noEffect + "the first read does not hold the slot"
	}
	args := []string{"read", "--config", c.config, "--catalog", c.catalog}
	c.mu.Lock()
	given := c.state
	if c.state != nil {
		path := filepath.Join(r.cfg.Dir, "state-second.json")
		if err := os.WriteFile(path, c.state, 0o600); err != nil {
			c.mu.Unlock()
			return noEffect + err.Error()
		}
		args = append(args, "--state", path)
	}
	c.mu.Unlock()
	cmd := exec.Command(r.cfg.Connector, args...)
	cmd.Env = append(os.Environ(), "LOG_LEVEL=info", "TIDEMARK_TESTING_BREAK="+r.cfg.Break)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return noEffect + err.Error()
	}
	states := make(chan int, 1)
	tr := &errTrace{}
	p, err := spawn(cmd, nil)
	if err != nil {
		return noEffect + err.Error()
	}
	p.trace = tr
	go func() {
		n := 0
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			var m struct {
				Type  string          `json:"type"`
				State json.RawMessage `json:"state"`
				Trace struct {
					Type  string `json:"type"`
					Error struct {
						Message     string `json:"message"`
						FailureType string `json:"failure_type"`
					} `json:"error"`
				} `json:"trace"`
			}
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				continue
			}
			if m.Type == "STATE" && !sameState(m.State, given) {
				n++ // a state of its own: progress the read claims
			}
			if m.Type == "TRACE" && m.Trace.Type == "ERROR" {
				tr.set(m.Trace.Error.FailureType, m.Trace.Error.Message)
			}
		}
		states <- n
	}()
	t := time.NewTimer(3 * secondWait)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.kill()
		<-p.done
	}
	n := <-states
	why := p.failure()
	switch {
	case n > 0 && r.exec(ctx, `SELECT 1 FROM pg_stat_activity WHERE pid = $1`, holder) == 0:
		// The first read's walsender ended while the read was frozen: it had already let the
		// slot go (the end of its round, its Terminate sent just before the freeze), and the
		// second read, waiting for a slot in use (replicator.DefaultInUseWait), took it over as a
		// next read would. Not two readers at once.
		return noEffect + fmt.Sprintf("the first read was letting the slot go as it was frozen (its walsender ended); the second took it over and committed %d states", n)
	case n > 0:
		r.violate("second capture: a second read of the slot of a running one committed %d states", n)
		return fmt.Sprintf("a second read committed %d states", n)
	case p.wasKilled():
		r.violate("second capture: a second read of the slot of a running one was not refused in %s", 3*secondWait)
		return "a second read was not refused"
	default:
		return "a second read refused: " + firstLine(why)
	}
}

// sameState reports whether a STATE message's state is the one the read was given (given: the
// state file's array of one), its statistics left aside. A read re-emits the state it was given
// while it has nothing newer (its heartbeat, while it waits for a slot in use, say): that claims
// no progress, and committing it again changes nothing.
func sameState(state json.RawMessage, given []byte) bool {
	var in []map[string]any
	var out map[string]any
	if json.Unmarshal(given, &in) != nil || len(in) != 1 || json.Unmarshal(state, &out) != nil {
		return false
	}
	for _, m := range []map[string]any{in[0], out} {
		delete(m, "sourceStats")
		delete(m, "destinationStats")
	}
	return reflect.DeepEqual(in[0], out)
}

// slotHolder returns the pid of the walsender that holds the run's slot, 0 when none does.
func (r *run) slotHolder(ctx context.Context) int32 {
	conn, err := pgx.Connect(ctx, r.dsn)
	if err != nil {
		return 0
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var pid int32
	if conn.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND active`, r.slot).Scan(&pid) != nil {
		return 0
	}
	return pid
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
