package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/chaos/oracle"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/sink/jsonl/line"
	"github.com/tidemark/tidemark/sink/kafka"
	"github.com/tidemark/tidemark/sink/nats"
)

// syncCapture runs `tidemark sync` to a JSON lines file, to PostgreSQL, to Kafka or to NATS.
type syncCapture struct {
	r     *run
	toPG  bool
	out   string         // the JSON lines file
	kafka *kafka.Address // the Kafka output
	nats  *nats.Address  // the NATS output

	mu      sync.Mutex
	seen    map[string]time.Time // txlog id → when its insert first appeared in the output
	at      map[string]time.Time // txlog id → when it was written
	pending map[string]bool      // re-backfills to ask for ("" for every table) until one is durable
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

func (c *syncCapture) prepare(ctx context.Context) error {
	c.seen, c.at, c.pending = map[string]time.Time{}, map[string]time.Time{}, map[string]bool{}
	if !c.toPG && c.kafka == nil && c.nats == nil {
		// Live changes are timed as they reach the file.
		tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		c.stop = cancel
		c.wg.Go(func() {
			c.tailFile(tctx)
		})
	}
	return nil
}

// command is a sync's command: its arguments (args), and its connection strings in the
// environment (TIDEMARK_SOURCE, TIDEMARK_TARGET), where no other user of the machine reads the
// passwords they hold, as the process list would show arguments.
func (c *syncCapture) command(final bool, remedy []string) *exec.Cmd {
	args, source, target := c.args(final, remedy)
	cmd := exec.Command(c.r.cfg.Tidemark, args...)
	cmd.Env = append(os.Environ(), "TIDEMARK_SOURCE="+source, "TIDEMARK_TARGET="+target)
	return cmd
}

// args are the arguments of a sync; remedy are the re-backfills it asks for; source and target
// are the connection strings it reads from the environment (target empty for JSON lines, whose
// file is an argument).
func (c *syncCapture) args(final bool, remedy []string) (args []string, source, target string) {
	r := c.r
	var tabs []string
	for _, t := range tables {
		tabs = append(tabs, r.sch+"."+t.name)
	}
	source, target = r.via, r.tvia
	if final {
		source, target = r.dsn, r.target
	}
	args = []string{"sync", "--slot", r.slot, "--publication", r.slot, "--tables", strings.Join(tabs, ","),
		"--chunk-size", strconv.Itoa(r.cfg.ChunkSize), "--checkpoint-interval", "1s", "--quiet",
		"--watermarks", r.transport, "--signal-table", r.sch + ".signal", "--watermark-timeout", "500ms", "--watch-interval", syncWatch.String(),
		"--max-chunk-bytes", strconv.Itoa(r.cfg.MaxChunkBytes), "--control", r.controlPath(), "--readers", strconv.Itoa(r.cfg.Readers)}
	if c.toPG {
		args = append(args, "--audit")
	}
	if r.cfg.Break != "" {
		args = append(args, "--testing-break", r.cfg.Break)
	}
	if final {
		args = append(args, "--stop-when-caught-up")
	}
	if len(remedy) > 0 {
		args = append(args, "--rebackfill", remedyArg(remedy))
	}
	switch {
	case c.kafka != nil:
		// Three partitions: a key's changes must stay in order in its own; a transaction timeout
		// short enough that one left open by a kill without a next run (the end) goes soon.
		args, target = append(args, "--to", c.kafka.String(), "--kafka-partitions", "3", "--kafka-transaction-timeout", "20s"), ""
	case c.nats != nil:
		// Three subjects per table: a key's changes must stay in order on its own.
		args, target = append(args, "--to", c.nats.String(), "--nats-partitions", "3", "--nats-replicas", strconv.Itoa(max(c.r.cfg.NATSReplicas, 1))), ""
	case !c.toPG:
		args, target = append(args, "--to", c.out), ""
	}
	return args, source, target
}

// remedyArg is --rebackfill's value for the re-backfills remedy ("" for every table).
func remedyArg(remedy []string) string {
	if slices.Contains(remedy, "") {
		return "all"
	}
	return strings.Join(remedy, ",")
}

func (c *syncCapture) start(ctx context.Context) (*process, error) { return c.launch(ctx, false) }

// launch starts a sync with the re-backfills still pending, noting the checkpoint it starts
// from: they are durable once it wrote another (remedied).
func (c *syncCapture) launch(ctx context.Context, final bool) (*process, error) {
	c.mu.Lock()
	var remedy []string
	for t := range c.pending {
		remedy = append(remedy, t)
	}
	c.mu.Unlock()
	slices.Sort(remedy)
	var before string
	if len(remedy) > 0 {
		cp, err := c.checkpoint(ctx)
		if err != nil {
			return nil, err
		}
		if cp != nil {
			before = cp.raw
		}
	}
	if c.toPG && c.r.hist != nil {
		c.r.hist.attachSeen(ctx, c.r.target)
	}
	p, err := spawn(c.command(final, remedy), nil)
	if err != nil {
		return nil, err
	}
	p.remedy, p.before = remedy, before
	if len(remedy) > 0 {
		c.r.note("capture pid %d started with --rebackfill %s", p.cmd.Process.Pid, remedyArg(remedy))
	} else {
		c.r.note("capture pid %d started", p.cmd.Process.Pid)
	}
	if len(remedy) > 0 {
		p.watched = make(chan struct{})
		go c.r.watchRemedy(p) // waited for by exited
	}
	return p, nil
}

// rebackfill asks the next runs to start table's output over (every table's for ""), until one
// of them has a durable checkpoint.
func (c *syncCapture) rebackfill(_ context.Context, table string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if table == "" {
		clear(c.pending)
	}
	if !c.pending[""] {
		c.pending[table] = true
	}
	return "rebackfill"
}

// remedied notes that a run asked for the re-backfills of tables and wrote a checkpoint: the
// checkpoint carries them (as asked, or done), so the next runs need not ask again.
func (c *syncCapture) remedied(tables []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range tables {
		delete(c.pending, t)
	}
}

// checkpoint reads the durable checkpoint: the JSON lines output's file, the target's row.
func (c *syncCapture) checkpoint(ctx context.Context) (*checkpointInfo, error) {
	if c.nats != nil {
		ck, err := nats.ReadCheckpoint(ctx, *c.nats)
		if err != nil {
			return nil, fmt.Errorf("read the NATS output's checkpoint: %w", err)
		}
		if ck == nil || ck.Position == nil {
			return nil, nil
		}
		raw, err := json.Marshal(ck.Position)
		if err != nil {
			return nil, err
		}
		return parsePosition(raw)
	}
	if c.kafka != nil {
		ck, err := kafka.ReadCheckpoint(ctx, *c.kafka)
		if err != nil || ck == nil || ck.Position == nil {
			return nil, err
		}
		raw, err := json.Marshal(ck.Position)
		if err != nil {
			return nil, err
		}
		return parsePosition(raw)
	}
	if !c.toPG {
		b, err := os.ReadFile(c.out + ".checkpoint")
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		var f struct {
			Position json.RawMessage `json:"position"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("checkpoint file: %w", err)
		}
		if len(f.Position) == 0 || string(f.Position) == "null" {
			return nil, nil
		}
		return parsePosition(f.Position)
	}
	conn, err := pgconf.Open(ctx, c.r.target, "tidemark-chaos")
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var raw []byte
	err = conn.QueryRow(ctx, `SELECT position::text FROM public.tidemark_checkpoint WHERE id = $1`, c.r.slot).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) || isUndefinedTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return parsePosition(raw)
}

func (c *syncCapture) slow(ctx context.Context, d time.Duration) string {
	if c.toPG {
		// The target is slow: a lock holds its writes.
		conn, err := pgconf.Open(ctx, c.r.target, "tidemark-chaos")
		if err != nil {
			return "target unreachable"
		}
		defer conn.Close(context.WithoutCancel(ctx))
		tx, err := conn.Begin(ctx)
		if err != nil {
			return "no transaction"
		}
		_, err = tx.Exec(ctx, `LOCK TABLE `+c.r.sch+`.accounts IN ACCESS EXCLUSIVE MODE`)
		sleep(ctx, d)
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if err != nil {
			return noEffect + "target table not there yet"
		}
		return "target locked for " + d.String()
	}
	p := c.r.sup.current()
	if p == nil {
		return noEffect + "no capture running"
	}
	p.freeze(ctx, d)
	return "capture frozen for " + d.String()
}

// finish runs sync until it has caught up, without faults, retrying while an earlier process's
// session still holds the slot, and remedying the stops the faults explain.
func (c *syncCapture) finish(ctx context.Context) error {
	var last string
	for range 20 {
		p, err := c.launch(ctx, true)
		if err != nil {
			return err
		}
		t := time.NewTimer(5 * time.Minute)
		select {
		case <-p.done:
		case <-t.C:
			p.kill()
			<-p.done
			return errors.New("sync did not catch up within 5 minutes")
		}
		t.Stop()
		c.r.exited(ctx, p)
		if p.err == nil {
			if c.stop != nil {
				time.Sleep(300 * time.Millisecond) // the tail reads the end of the file
				c.stop()
				c.wg.Wait()
			}
			return nil
		}
		last = p.failure()
		sleep(ctx, time.Second)
	}
	return errors.New(last)
}

func (c *syncCapture) verify(ctx context.Context, rep *Report) error {
	if c.toPG {
		return c.verifyPG(ctx, rep)
	}
	if c.kafka != nil {
		return c.verifyKafka(ctx, rep)
	}
	if c.nats != nil {
		return c.verifyNATS(ctx, rep)
	}
	b, err := os.ReadFile(c.out + ".checkpoint")
	if err != nil {
		return err
	}
	var cp struct{ Offset int64 }
	if err := json.Unmarshal(b, &cp); err != nil {
		return err
	}
	f, err := os.Open(c.out)
	if err != nil {
		return err
	}
	defer f.Close()
	// The output up to its checkpoint is what a consumer takes.
	if err := c.checkLines(ctx, rep, io.LimitReader(f, cp.Offset), "lines that cannot be read before the checkpoint"); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, seen := range c.seen {
		if at, ok := c.at[id]; ok {
			rep.Latency = append(rep.Latency, seen.Sub(at))
		}
	}
	slices.Sort(rep.Latency)
	return nil
}

// verifyKafka reads the tables' topics as a read_committed consumer of every partition does, in
// the output's order ((LSN, seq), which kafka.ReadLines merges the partitions by), and checks
// them as the JSON lines output is checked: each change once, positions growing.
func (c *syncCapture) verifyKafka(ctx context.Context, rep *Report) error {
	var tables []string
	for name := range c.r.keys() {
		tables = append(tables, name)
	}
	// The topics as one output, in a file of the run's: memory does not grow with the output.
	path := filepath.Join(c.r.cfg.Dir, "kafka.jsonl")
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	problems, err := kafka.WriteLines(ctx, *c.kafka, tables, c.r.cfg.Dir, bw)
	if err != nil {
		return err
	}
	for _, p := range problems {
		rep.Violations = append(rep.Violations, "partitions: "+p)
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return c.checkLines(ctx, rep, f, "records that cannot be read")
}

// verifyNATS reads the stream as a consumer of all of it does (every message is visible once
// the stream took it: there is no checkpoint to stop at), and checks it as the JSON lines output
// is checked: each change once, positions growing.
func (c *syncCapture) verifyNATS(ctx context.Context, rep *Report) error {
	path := filepath.Join(c.r.cfg.Dir, "nats.jsonl")
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	var problems []string
	for try := 0; ; try++ {
		// A node the faults killed may have come back without its leaderships yet.
		if problems, err = nats.WriteLines(ctx, *c.nats, bw); err == nil || try == 100 {
			break
		}
		c.r.note("read the stream back: %v; trying again", err)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		if err := f.Truncate(0); err != nil {
			return err
		}
		bw.Reset(f)
		sleep(ctx, 2*time.Second)
	}
	if err != nil {
		return fmt.Errorf("read the stream back: %w", err)
	}
	for _, p := range problems {
		rep.Violations = append(rep.Violations, "subjects: "+p)
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return c.checkLines(ctx, rep, f, "messages that cannot be read")
}

// checkLines replays JSON lines output through the oracle: each change once, positions growing
// (starting over at a restore's refresh), and the replay equal to the source. Lines that cannot
// be read are a violation (what says which).
func (c *syncCapture) checkLines(ctx context.Context, rep *Report, r io.Reader, what string) error {
	o := oracle.NewOracle("ver")
	o.ExactlyOnce, o.Order = true, oracle.ByLSNSeq
	c.r.mu.Lock()
	o.Resets = c.r.restores
	c.r.mu.Unlock()
	var damaged []string
	err := oracle.ReadJSONL(r, c.r.keys(), o.Apply, func(line int, err error) {
		if len(damaged) < 5 {
			damaged = append(damaged, fmt.Sprintf("line %d: %v", line, err))
		}
	})
	if err != nil {
		return err
	}
	if len(damaged) > 0 {
		rep.Violations = append(rep.Violations, "output: "+what+": "+strings.Join(damaged, "; "))
	}
	return c.r.checkOracle(ctx, o, rep, func(txn string) (uint32, bool) {
		x, err := strconv.ParseUint(txn, 10, 64)
		return uint32(x), err == nil
	})
}

// verifyPG compares the target's tables with the source's, and checks the audit ledger: every
// source transaction (each wrote one txlog row) was applied once.
func (c *syncCapture) verifyPG(ctx context.Context, rep *Report) error {
	src, err := c.r.sourceTables(ctx)
	if err != nil {
		return err
	}
	for name, key := range c.r.keys() {
		dst, err := oracle.SourceRowsJSON(ctx, c.r.target, c.r.sch, strings.TrimPrefix(name, c.r.sch+"."), key)
		if err != nil {
			return err
		}
		rep.Records += len(dst)
		c.r.schema.fillAdded(name, dst, src[name])
		if d := oracle.Diff(dst, src[name]); d != "" {
			rep.Violations = append(rep.Violations, fmt.Sprintf("I1: target %s differs from the source: %s", name, d))
		}
	}
	conn, err := pgconf.Open(ctx, c.r.target, "tidemark-chaos")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	// After a restore of the source, the transactions of the restored history before its re-backfill
	// came to the target as backfilled rows, not applied: the audit covers those after it
	// (auditFrom, the last txlog id then), each of which must be applied once.
	c.r.mu.Lock()
	from := c.r.auditFrom
	c.r.mu.Unlock()
	// The source's transaction log against the target's ledger, and the target's history of its
	// rows (I2, I3 on what the target went through).
	audit, err := c.r.auditLedger(ctx, from)
	if err != nil {
		return err
	}
	rep.Violations = append(rep.Violations, audit...)
	hist, n, err := c.r.hist.check(ctx, c.r)
	if err != nil {
		return err
	}
	rep.Violations = append(rep.Violations, hist...)
	c.r.log.Info().Int("changes", n).Msg("the target's history of its rows checked")
	rows, err := conn.Query(ctx, `SELECT extract(epoch FROM l.applied_at - t.at) FROM public.tidemark_applied l JOIN `+c.r.sch+`.txlog t ON l.xid = t.xid::text::bigint % 4294967296`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var s float64
		if err := rows.Scan(&s); err != nil {
			return err
		}
		rep.Latency = append(rep.Latency, time.Duration(s*float64(time.Second)))
	}
	slices.Sort(rep.Latency)
	return rows.Err()
}

// tailFile follows the output file and notes when each txlog insert first appears in it.
func (c *syncCapture) tailFile(ctx context.Context) {
	var off int64
	var partial []byte
	for ctx.Err() == nil {
		sleep(ctx, 100*time.Millisecond)
		f, err := os.Open(c.out)
		if err != nil {
			continue
		}
		fi, err := f.Stat()
		if err == nil && fi.Size() < off {
			off, partial = fi.Size(), nil // cut back to a checkpoint on a restart
		}
		if _, err := f.Seek(off, io.SeekStart); err == nil {
			b, _ := io.ReadAll(f)
			off += int64(len(b))
			now := time.Now()
			partial = append(partial, b...)
			for {
				i := bytes.IndexByte(partial, '\n')
				if i < 0 {
					break
				}
				c.noteLine(partial[:i], now)
				partial = partial[i+1:]
			}
		}
		f.Close()
	}
}

func (c *syncCapture) noteLine(text []byte, now time.Time) {
	if !bytes.Contains(text, []byte(`"table":"`+c.r.sch+`.txlog"`)) {
		return
	}
	ev, err := line.Decode(text)
	if err != nil || ev.Op != "insert" {
		return
	}
	id, at := string(ev.After["id"]), parseTime(ev.After["at"])
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[id]; !ok && !at.IsZero() {
		c.seen[id], c.at[id] = now, at
	}
}

// parseTime reads a timestamptz in its JSON form.
func parseTime(raw json.RawMessage) time.Time {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return time.Time{}
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999-07", "2006-01-02 15:04:05.999999Z07:00"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t
		}
	}
	return time.Time{}
}

// airbyteCapture runs the connector's read in rounds, handing each round the last state of the
// one before, as the platform does; a round's records count once its state arrives (the
// destination commits up to the state it echoes).
type airbyteCapture struct {
	r       *run
	config  string
	catalog string

	mu       sync.Mutex
	state    []byte // the last state, as the platform keeps it
	oracle   *oracle.Oracle
	pause    time.Time // the consumer reads nothing until then
	seen     map[string]time.Time
	at       map[string]time.Time
	rounds   int
	complete int // rounds that ended with exit 0
}

func newAirbyteCapture(r *run) *airbyteCapture {
	o := oracle.NewOracle("ver")
	// What a destination keeps: the records a state committed, each change once (a backfilled
	// row repeats its key's version only at a later position), positions never going back.
	o.ExactlyOnce, o.Order = true, oracle.ByLSN
	return &airbyteCapture{r: r, oracle: o, seen: map[string]time.Time{}, at: map[string]time.Time{}}
}

func (c *airbyteCapture) prepare(ctx context.Context) error {
	pc, err := pgx.ParseConfig(c.r.via)
	if err != nil {
		return err
	}
	cfg := map[string]any{
		"host": pc.Host, "port": pc.Port, "database": pc.Database, "username": pc.User, "password": pc.Password,
		"ssl_mode":            map[string]any{"mode": "disable"},
		"replication_method":  map[string]any{"method": "CDC", "replication_slot": c.r.slot, "publication": c.r.slot},
		"backfill_chunk_size": c.r.cfg.ChunkSize, "backfill_readers": c.r.cfg.Readers, "state_interval_seconds": 1,
	}
	if c.r.transport == "table" {
		cfg["signal_table"] = c.r.sch + ".signal"
	}
	var streams []any
	for _, t := range tables {
		var pk [][]string
		for _, k := range t.key {
			pk = append(pk, []string{k})
		}
		streams = append(streams, map[string]any{
			"stream": map[string]any{"name": t.name, "namespace": c.r.sch, "json_schema": map[string]any{"type": "object"},
				"supported_sync_modes": []string{"full_refresh", "incremental"}, "source_defined_cursor": true,
				"default_cursor_field": []string{"_ab_cdc_lsn"}, "source_defined_primary_key": pk},
			"sync_mode": "incremental", "destination_sync_mode": "append_dedup", "primary_key": pk,
		})
	}
	write := func(name string, v any) (string, error) {
		b, err := json.Marshal(v)
		if err != nil {
			return "", err
		}
		path := filepath.Join(c.r.cfg.Dir, name)
		return path, os.WriteFile(path, b, 0o600)
	}
	if c.config, err = write("config.json", cfg); err != nil {
		return err
	}
	c.catalog, err = write("catalog.json", map[string]any{"streams": streams})
	return err
}

// round starts one read from the last state.
func (c *airbyteCapture) round(ctx context.Context, cfgPath string) (*process, error) {
	args := []string{"read", "--config", cfgPath, "--catalog", c.catalog}
	c.mu.Lock()
	if c.state != nil {
		path := filepath.Join(c.r.cfg.Dir, "state.json")
		if err := os.WriteFile(path, c.state, 0o600); err != nil {
			c.mu.Unlock()
			return nil, err
		}
		args = append(args, "--state", path)
	}
	c.rounds++
	c.mu.Unlock()
	cmd := exec.Command(c.r.cfg.Connector, args...)
	cmd.Env = append(os.Environ(), "LOG_LEVEL=info", "TIDEMARK_TESTING_BREAK="+c.r.cfg.Break)
	// A pipe of our own, read to its end: the one of cmd.StdoutPipe is closed by Wait as soon as
	// the process exits, which loses what it printed last (its final STATE, its TRACE ERROR).
	out, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = w
	var wg sync.WaitGroup
	tr := &errTrace{}
	p, err := spawn(cmd, func(err error) {
		wg.Wait()
		out.Close()
		if err == nil {
			c.mu.Lock()
			c.complete++
			c.mu.Unlock()
		}
	})
	w.Close() // the child has its copy: the reader sees EOF when the child exits
	if err != nil {
		out.Close()
		return nil, err
	}
	p.trace = tr
	c.r.note("capture pid %d started (a read, state of %d bytes%s)", p.cmd.Process.Pid, len(c.state), stateSummary(c.state))
	wg.Go(func() {
		c.consume(ctx, out, tr)
	})
	return p, nil
}

func (c *airbyteCapture) start(ctx context.Context) (*process, error) { return c.round(ctx, c.config) }

// consume reads a round's messages: records wait for the next state, which commits them; a
// TRACE ERROR goes to tr.
func (c *airbyteCapture) consume(ctx context.Context, out io.Reader, tr *errTrace) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var pending []oracle.Record
	for {
		c.mu.Lock()
		until := c.pause
		c.mu.Unlock()
		if d := time.Until(until); d > 0 {
			sleep(ctx, d)
		}
		if !sc.Scan() {
			_, _ = io.Copy(io.Discard, out) // after a line too long: the connector must not block on a full pipe
			return
		}
		line := sc.Bytes()
		var m struct {
			Type   string          `json:"type"`
			State  json.RawMessage `json:"state"`
			Record struct {
				Namespace string                     `json:"namespace"`
				Stream    string                     `json:"stream"`
				Data      map[string]json.RawMessage `json:"data"`
				Meta      struct {
					Changes []struct {
						Field  string `json:"field"`
						Change string `json:"change"`
					} `json:"changes"`
				} `json:"meta"`
			} `json:"record"`
			Trace struct {
				Type  string `json:"type"`
				Error struct {
					Message         string `json:"message"`
					InternalMessage string `json:"internal_message"`
					FailureType     string `json:"failure_type"`
				} `json:"error"`
			} `json:"trace"`
		}
		if json.Unmarshal(line, &m) != nil {
			continue // a line cut by a kill
		}
		switch m.Type {
		case "RECORD":
			rec := toRecord(c.r.keys(), m.Record.Namespace+"."+m.Record.Stream, m.Record.Data)
			for _, ch := range m.Record.Meta.Changes {
				if ch.Change == "NULLED" && rec.Values != nil {
					lossy := oracle.Lossy // a value without a JSON form (NaN), not NULL
					rec.Values[ch.Field] = &lossy
				}
			}
			pending = append(pending, rec)
			if m.Record.Stream == "txlog" {
				id := string(m.Record.Data["id"])
				c.mu.Lock()
				if _, ok := c.seen[id]; !ok {
					c.seen[id], c.at[id] = time.Now(), parseTime(m.Record.Data["at"])
				}
				c.mu.Unlock()
			}
		case "TRACE":
			if m.Trace.Type == "ERROR" {
				msg := m.Trace.Error.InternalMessage
				if msg == "" {
					msg = m.Trace.Error.Message
				}
				tr.set(m.Trace.Error.FailureType, msg)
			}
		case "STATE":
			for _, rec := range pending {
				c.oracle.Apply(rec)
			}
			pending = pending[:0]
			st, _ := json.Marshal([]json.RawMessage{m.State})
			c.mu.Lock()
			c.state = st
			c.mu.Unlock()
		}
	}
}

// toRecord makes an Airbyte record an oracle record: a delete when _ab_cdc_deleted_at is set,
// the whole row otherwise (an upsert: the record does not say whether it was backfilled).
func toRecord(keys map[string][]string, table string, data map[string]json.RawMessage) oracle.Record {
	rec := oracle.Record{Table: table, Op: "upsert", Values: map[string]*string{}}
	var kv []string
	for _, k := range keys[table] {
		kv = append(kv, string(data[k]))
	}
	rec.Key = strings.Join(kv, oracle.KeySep)
	if d, ok := data["_ab_cdc_deleted_at"]; ok && string(d) != "null" {
		rec.Op = "delete"
	}
	if l, ok := data["_ab_cdc_lsn"]; ok {
		rec.LSN, _ = strconv.ParseUint(string(l), 10, 64)
	}
	for k, v := range data {
		if strings.HasPrefix(k, "_ab_cdc_") {
			continue
		}
		s := string(v)
		rec.Values[k] = &s
	}
	return rec
}

func (c *airbyteCapture) slow(ctx context.Context, d time.Duration) string {
	c.mu.Lock()
	c.pause = time.Now().Add(d)
	c.mu.Unlock()
	return "output not read for " + d.String()
}

// rebackfill does what the platform does when a stream is reset (Airbyte's "Clear data" or
// "Reset"; every stream for ""): the destination drops the stream's rows, and the state loses
// its entry, from which the next read starts the stream over.
func (c *airbyteCapture) rebackfill(_ context.Context, table string) string {
	c.mu.Lock()
	var cleared []string
	if table == "" {
		c.state = nil
		for name := range c.r.keys() {
			cleared = append(cleared, name)
		}
	} else {
		c.state = withoutStream(c.state, table)
		cleared = []string{table}
	}
	c.mu.Unlock()
	if table == "" {
		// Every stream starts over (after a restore of the source: in a history whose
		// positions start anew).
		c.oracle.AllowReset()
	}
	for i, name := range cleared {
		c.oracle.Apply(oracle.Record{Table: name, Op: "refresh", Reset: table == "" && i == 0})
	}
	return "reset"
}

// remedied: a reset is in the state when it is made.
func (c *airbyteCapture) remedied([]string) {}

// withoutStream returns the state (the platform's array of state messages) without table's
// stream state.
func withoutStream(state []byte, table string) []byte {
	var msgs []map[string]any
	if state == nil || json.Unmarshal(state, &msgs) != nil {
		return state
	}
	for _, m := range msgs {
		g, _ := m["global"].(map[string]any)
		if g == nil {
			continue
		}
		streams, _ := g["stream_states"].([]any)
		kept := []any{}
		for _, st := range streams {
			if m, ok := st.(map[string]any); ok {
				if d, ok := m["stream_descriptor"].(map[string]any); ok && fmt.Sprint(d["namespace"])+"."+fmt.Sprint(d["name"]) == table {
					continue
				}
			}
			kept = append(kept, st)
		}
		g["stream_states"] = kept
	}
	b, err := json.Marshal(msgs)
	if err != nil {
		return state
	}
	return b
}

// checkpoint reads the last state the platform keeps.
func (c *airbyteCapture) checkpoint(context.Context) (*checkpointInfo, error) {
	c.mu.Lock()
	state := c.state
	c.mu.Unlock()
	if state == nil {
		return nil, nil
	}
	return parseAirbyteState(state)
}

// finish runs rounds without faults, straight to the server, until one ends well.
func (c *airbyteCapture) finish(ctx context.Context) error {
	pc, err := pgx.ParseConfig(c.r.dsn)
	if err != nil {
		return err
	}
	b, _ := os.ReadFile(c.config)
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return err
	}
	cfg["host"], cfg["port"] = pc.Host, pc.Port
	b, _ = json.Marshal(cfg)
	direct := filepath.Join(c.r.cfg.Dir, "config-direct.json")
	if err := os.WriteFile(direct, b, 0o600); err != nil {
		return err
	}
	var last string
	for range 20 {
		p, err := c.round(ctx, direct)
		if err != nil {
			return err
		}
		<-p.done
		c.r.exited(ctx, p)
		if p.err == nil {
			return nil
		}
		last = p.failure()
		sleep(ctx, time.Second)
	}
	return errors.New(last)
}

func (c *airbyteCapture) verify(ctx context.Context, rep *Report) error {
	if err := c.r.checkOracle(ctx, c.oracle, rep, func(string) (uint32, bool) { return 0, false }); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, seen := range c.seen {
		if at, ok := c.at[id]; ok && !at.IsZero() {
			rep.Latency = append(rep.Latency, seen.Sub(at))
		}
	}
	slices.Sort(rep.Latency)
	c.r.log.Info().Int("rounds", c.rounds).Int("complete", c.complete).Msg("airbyte rounds")
	return nil
}

// stateSummary says, for the journal, where a state resumes: its position, and each stream's
// progress that matters when a run goes wrong (a refresh pending, its publication membership).
func stateSummary(state []byte) string {
	cp, err := parseAirbyteState(state)
	if err != nil || cp == nil {
		return ""
	}
	var streams []string
	for name := range cp.Tables {
		s := name
		if cp.Refresh[name] {
			s += " refresh"
		}
		streams = append(streams, s+" "+cp.Members[name])
	}
	slices.Sort(streams)
	return fmt.Sprintf(": position %s, streams %s", cp.LSN, strings.Join(streams, "; "))
}
