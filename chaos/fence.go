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

	"github.com/tidemark/tidemark/internal/pgconf"
)

// The second-capture fault: a second capture started against the slot and the output of the
// running one, as a cron job or a second service instance would. It must be refused before it
// touches the output, and the first must go on unharmed (the oracle checks the output).

// fenceMark is what tidemark sync says when another sync holds the output or the checkpoint.
const fenceMark = "another tidemark sync is writing"

// secondWait is how long a second capture has to be refused: it waits up to 5 s for the lock
// the first holds (replicator.DefaultInUseWait: a writer killed a moment ago still holds it), after
// its own start, on a machine that runs three harnesses at once (10 s was met once in CI).
const secondWait = 20 * time.Second

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
	// Between two attempts of its own (it lost a connection and waits to reconnect), or frozen
	// while it starts, before it opened its output (a restart right after a kill, an attempt
	// after a reconnection), a capture may hold neither the slot nor the output, as one that
	// crashed and waits for its restart: a second one may then take over, and the first is
	// refused when it goes on. It opens its output, taking the output's lock, before it
	// streams, and lets it go before it logs a reconnection (tail.holding).
	if !first.stderr.holding() {
		return noEffect + "the capture had not streamed since it started or reconnected (starting, or between two attempts of its own), and may hold nothing"
	}
	n := r.exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, r.slot)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; sleep(ctx, 50*time.Millisecond) {
		if r.exec(ctx, `SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, r.slot) == 1 {
			break
		}
	}
	p, err := spawn(c.command(false, nil), nil)
	if err != nil {
		return noEffect + err.Error()
	}
	r.note("second capture pid %d started beside pid %d (frozen; %d walsender ended)", p.cmd.Process.Pid, first.cmd.Process.Pid, n)
	t := time.NewTimer(secondWait)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		// Where it waits, for the journal: a Go program prints every goroutine's stack on
		// SIGQUIT.
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.done:
		case <-time.After(3 * time.Second):
			p.kill()
			<-p.done
		}
		out := p.stderr.String()
		r.note("second capture, not refused in %s; its stderr ends:\n%s", secondWait, tailLines(out, 400))
		main := ""
		if i := strings.Index(out, "goroutine 1 ["); i >= 0 {
			main = "; its main goroutine: " + oneLine(firstLines(out[i:], 30))
		}
		r.violate("second capture: a second tidemark sync on the slot and output of a running one was not refused (it ran %s, killed; its stacks are in the journal)%s", secondWait, main)
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
	type claims struct {
		n        int  // states of its own: progress the second read claims
		tookOver bool // when it claimed the first, the first's walsender no longer held the slot
	}
	states := make(chan claims, 1)
	tr := &errTrace{}
	p, err := spawn(cmd, nil)
	if err != nil {
		return noEffect + err.Error()
	}
	p.trace = tr
	go func() {
		var cl claims
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
			if m.Type == "STATE" && claimsProgress(m.State, given) {
				if cl.n++; cl.n == 1 {
					// Two readers at once, or a next read? Who holds the slot now says.
					held, err := r.slotHeldBy(ctx, holder)
					cl.tookOver = err == nil && !held
				}
			}
			if m.Type == "TRACE" && m.Trace.Type == "ERROR" {
				tr.set(m.Trace.Error.FailureType, m.Trace.Error.Message)
			}
		}
		states <- cl
	}()
	t := time.NewTimer(3 * secondWait)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.kill()
		<-p.done
	}
	cl := <-states
	n := cl.n
	why := p.failure()
	switch {
	case n > 0 && cl.tookOver:
		// When the second read claimed progress, the first read's walsender no longer held the
		// slot: the first (frozen) had already let it go (the end of its round, its Terminate sent
		// just before the freeze), and the second, waiting for a slot in use
		// (replicator.DefaultInUseWait), took it over as a next read would. Not two readers at once.
		return noEffect + fmt.Sprintf("the first read was letting the slot go as it was frozen; the second took it over and committed %d states", n)
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

// claimsProgress reports whether a STATE message's state claims progress beyond the state the
// read was given (given: the state file's array of one state, nil for none): records before it
// (its sourceStats), or another shared_state (the position). A read re-emits the position it was
// given while it has nothing newer (its heartbeat, while it waits for a slot in use, say), its
// streams' entries as it reads them (a reset stream marked to start over): that claims nothing,
// and committing it again changes nothing.
func claimsProgress(state json.RawMessage, given []byte) bool {
	var out struct {
		Global struct {
			Shared json.RawMessage `json:"shared_state"`
		} `json:"global"`
		SourceStats struct {
			RecordCount float64 `json:"recordCount"`
		} `json:"sourceStats"`
	}
	if json.Unmarshal(state, &out) != nil {
		return true
	}
	if out.SourceStats.RecordCount > 0 {
		return true
	}
	var in []struct {
		Global struct {
			Shared json.RawMessage `json:"shared_state"`
		} `json:"global"`
	}
	var givenShared any
	if given != nil {
		if json.Unmarshal(given, &in) != nil || len(in) != 1 {
			return true
		}
		if len(in[0].Global.Shared) > 0 && json.Unmarshal(in[0].Global.Shared, &givenShared) != nil {
			return true
		}
	}
	var shared any
	if len(out.Global.Shared) > 0 && json.Unmarshal(out.Global.Shared, &shared) != nil {
		return true
	}
	return !reflect.DeepEqual(shared, givenShared)
}

// slotHeldBy reports whether the walsender pid still holds the run's slot.
func (r *run) slotHeldBy(ctx context.Context, pid int32) (bool, error) {
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var active *int32
	if err := conn.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, r.slot).Scan(&active); err != nil {
		return false, err
	}
	return active != nil && *active == pid, nil
}

// slotHolder returns the pid of the walsender that holds the run's slot, 0 when none does.
func (r *run) slotHolder(ctx context.Context) int32 {
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
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

// tailLines returns the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// firstLines returns the first n lines of s.
func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
