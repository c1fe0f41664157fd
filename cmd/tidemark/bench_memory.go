package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgserver"
	"github.com/tidemark/tidemark/internal/sqlfix"
)

// memoryBench is `tidemark bench --memory`: the peak resident set of `tidemark sync`, run as a
// child process, for a source transaction far larger than anything the sync may hold (every
// row changed in one transaction), and for a backfill of rows of megabytes each.
type memoryBench struct {
	*bench
	tidemark string // the tidemark binary the syncs run
	txRows   int    // rows changed by the one large transaction
	wideRows int    // rows of the wide table
	wideMB   int    // size of each wide row's value, in MB
	msgMB    int    // size of the foreign logical message, in MB
}

func (b *memoryBench) run(ctx context.Context) error {
	b.printf("# tidemark bench --memory %s tx_rows=%d wide_rows=%d wide_mb=%d message_mb=%d\n", time.Now().UTC().Format(time.RFC3339), b.txRows, b.wideRows, b.wideMB, b.msgMB)
	b.machine()
	srv, err := pgserver.Start(ctx, pgserver.Options{Settings: benchSettings})
	if err != nil {
		return err
	}
	defer srv.Stop(context.WithoutCancel(ctx))
	b.srv = srv
	if err := srv.CreateDatabase(ctx, "bench"); err != nil {
		return err
	}
	b.dsn = srv.DSN("bench")
	var version string
	if err := queryRow(ctx, b.dsn, `SELECT version()`, &version); err != nil {
		return err
	}
	b.printf("# %s\n", version)
	dir, err := os.MkdirTemp("", "tidemark-bench-memory-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := b.largeTransaction(ctx, dir); err != nil {
		return err
	}
	if err := b.wideTable(ctx, dir); err != nil {
		return err
	}
	return b.foreignMessage(ctx, dir)
}

// foreignMessage measures a logical message of msgMB written by a role with no privilege at all
// (pg_logical_emit_message is executable by PUBLIC) in the database of a capture: the stream
// reads past it without holding it (replicator's message filter; docs/security.md). The message
// is transactional, between a row inserted before it and one inserted after it, in a slot made
// before both; the sync must deliver both rows.
func (b *memoryBench) foreignMessage(ctx context.Context, dir string) error {
	start := time.Now()
	const role, password = "bench_nobody", "bench-nobody-password"
	if err := execAll(ctx, b.dsn,
		`CREATE TABLE public.bench_msg (id int PRIMARY KEY, v text)`,
		`CREATE PUBLICATION bench_msg FOR TABLE public.bench_msg`,
		`SELECT pg_create_logical_replication_slot('bench_msg', 'pgoutput')`,
		`INSERT INTO public.bench_msg VALUES (1, 'before the message')`,
		fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD %s`, role, sqlfix.Literal(password)),
	); err != nil {
		return fmt.Errorf("prepare the foreign message: %w", err)
	}
	if err := execAll(ctx, b.srv.UserDSN("bench", role, password),
		fmt.Sprintf(`SELECT pg_catalog.pg_logical_emit_message(true, 'not-tidemark', pg_catalog.repeat('m', %d))`, b.msgMB<<20),
	); err != nil {
		return fmt.Errorf("write the foreign message: %w", err)
	}
	if err := execAll(ctx, b.dsn, `INSERT INTO public.bench_msg VALUES (2, 'after the message')`); err != nil {
		return err
	}
	b.printf("# bench_msg: a logical message of %d MB by a role without privileges, between two rows, in %s\n", b.msgMB, time.Since(start).Round(time.Second))
	if err := b.toJSONL(ctx, filepath.Join(dir, "msg.jsonl"), []string{"--tables", "public.bench_msg", "--publication", "bench_msg", "--slot", "bench_msg", "--no-backfill"}, 2,
		"memory.foreign_message", fmt.Sprintf("(a foreign logical message of %d MB streamed past, to JSON lines)", b.msgMB)); err != nil {
		return err
	}
	return execAll(ctx, b.dsn, `DROP TABLE public.bench_msg`, `SELECT pg_drop_replication_slot('bench_msg')`, `DROP PUBLICATION bench_msg`,
		fmt.Sprintf(`DROP ROLE %s`, role), `CHECKPOINT`)
}

// largeTransaction measures one transaction that inserts every row, in the publication and in
// two slots made before it, so that each sync streams it whole (no backfill).
func (b *memoryBench) largeTransaction(ctx context.Context, dir string) error {
	start := time.Now()
	if err := execAll(ctx, b.dsn,
		`CREATE TABLE public.bench_tx (id bigint PRIMARY KEY, k int, v text, ts timestamptz, n numeric, j jsonb)`,
		`CREATE PUBLICATION bench_tx FOR TABLE public.bench_tx`,
		`SELECT pg_create_logical_replication_slot('bench_tx_pg', 'pgoutput')`,
		`SELECT pg_create_logical_replication_slot('bench_tx_jsonl', 'pgoutput')`,
		fmt.Sprintf(`INSERT INTO public.bench_tx SELECT g, g %% 1000, md5(g::text) || repeat('x', 20 + g %% 40), now() - g * interval '1 second',
			(g * 1.0001)::numeric(20, 4), jsonb_build_object('a', g, 'b', md5(g::text)) FROM generate_series(1, %d) g`, b.txRows),
	); err != nil {
		return fmt.Errorf("prepare the large transaction: %w", err)
	}
	var walMB float64
	_ = queryRow(ctx, b.dsn, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) / 1e6 FROM pg_replication_slots WHERE slot_name = 'bench_tx_pg'`, &walMB)
	b.printf("# bench_tx: %d rows inserted in one transaction (%.0f MB of WAL) in %s\n", b.txRows, walMB, time.Since(start).Round(time.Second))
	sync := []string{"--tables", "public.bench_tx", "--publication", "bench_tx", "--no-backfill"}
	if err := b.toPostgres(ctx, "bench_tx", append(sync, "--slot", "bench_tx_pg"), b.txRows,
		"memory.tx_postgres", "(one source transaction, streamed, applied to PostgreSQL exactly once)"); err != nil {
		return err
	}
	if err := b.toJSONL(ctx, filepath.Join(dir, "tx.jsonl"), append(sync, "--slot", "bench_tx_jsonl"), b.txRows,
		"memory.tx_jsonl", "(the same transaction, to JSON lines)"); err != nil {
		return err
	}
	return execAll(ctx, b.dsn, `DROP TABLE public.bench_tx`, `CHECKPOINT`)
}

// wideTable measures rows of wideMB each, backfilled with the default chunk size: what a chunk
// holds is bounded by the chunk reader's byte cap, not by its rows.
func (b *memoryBench) wideTable(ctx context.Context, dir string) error {
	start := time.Now()
	if err := execAll(ctx, b.dsn,
		`CREATE TABLE public.bench_wide (id int PRIMARY KEY, v text)`,
		// Incompressible text: the rows take their size on disk too, as real wide rows do.
		fmt.Sprintf(`INSERT INTO public.bench_wide SELECT g, (SELECT string_agg(md5(g::text || '.' || i), '') FROM generate_series(1, %d) i)
			FROM generate_series(1, %d) g`, b.wideMB<<20/32, b.wideRows),
		`VACUUM ANALYZE public.bench_wide`,
		`CREATE PUBLICATION bench_wide FOR TABLE public.bench_wide`,
	); err != nil {
		return fmt.Errorf("prepare the wide table: %w", err)
	}
	var heapMB float64
	_ = queryRow(ctx, b.dsn, `SELECT pg_table_size('public.bench_wide') / 1e6`, &heapMB)
	b.printf("# bench_wide: %d rows of %d MB, %.0f MB on disk, built in %s\n", b.wideRows, b.wideMB, heapMB, time.Since(start).Round(time.Second))
	wide := []string{"--tables", "public.bench_wide", "--publication", "bench_wide"}
	if err := b.toPostgres(ctx, "bench_wide", append(wide, "--slot", "bench_wide_pg"), b.wideRows,
		"memory.wide_postgres", fmt.Sprintf("(rows of %d MB, backfilled in chunks of 10000 rows at most)", b.wideMB)); err != nil {
		return err
	}
	return b.toJSONL(ctx, filepath.Join(dir, "wide.jsonl"), append(wide, "--slot", "bench_wide_jsonl"), b.wideRows,
		"memory.wide_jsonl", fmt.Sprintf("(rows of %d MB, backfilled, to JSON lines)", b.wideMB))
}

// toPostgres syncs table into a target database of its own with args, checks that the target
// has every row, and prints the run's memory line.
func (b *memoryBench) toPostgres(ctx context.Context, table string, args []string, rows int, name, note string) error {
	tgt := table + "_target"
	if err := b.srv.CreateDatabase(ctx, tgt); err != nil {
		return err
	}
	res, err := b.sync(ctx, b.srv.DSN(tgt), args)
	if err != nil {
		return err
	}
	var n int64
	if err := queryRow(ctx, b.srv.DSN(tgt), `SELECT count(*) FROM public.`+table, &n); err != nil {
		return err
	}
	if err := b.srv.DropDatabase(ctx, tgt); err != nil {
		return err
	}
	if err := want("the target of "+name, n, rows); err != nil {
		return err
	}
	b.memLine(name, res, n, 0, note)
	return nil
}

// toJSONL syncs with args into the JSON lines file out, checks that it has every row, removes
// it, and prints the run's memory line.
func (b *memoryBench) toJSONL(ctx context.Context, out string, args []string, rows int, name, note string) error {
	res, err := b.sync(ctx, out, args)
	if err != nil {
		return err
	}
	lines, size, err := countLines(out)
	if err != nil {
		return err
	}
	if err := os.Remove(out); err != nil {
		return err
	}
	if err := want("the output of "+name, lines, rows); err != nil {
		return err
	}
	b.memLine(name, res, lines, size, note)
	return nil
}

// want checks that a sync delivered every row: a figure of an incomplete sync means nothing.
func want(what string, got int64, rows int) error {
	if got != int64(rows) {
		return fmt.Errorf("%s has %d rows, not %d", what, got, rows)
	}
	return nil
}

// syncRun is one `tidemark sync` child: how long it took and its peak resident set.
type syncRun struct {
	d      time.Duration
	rssKiB int64         // the child's peak resident set (VmHWM), in KiB
	cpu    time.Duration // the child's user and system CPU time
}

// sync runs `tidemark sync --stop-when-caught-up` from the bench database to target (a DSN or a
// file) as a child process, and measures it.
func (b *memoryBench) sync(ctx context.Context, target string, args []string) (syncRun, error) {
	cmd := exec.CommandContext(ctx, b.tidemark, append([]string{"sync", "--stop-when-caught-up", "--quiet"}, args...)...)
	// The connection strings go through the environment, out of the process list.
	cmd.Env = append(os.Environ(), "TIDEMARK_SOURCE="+b.dsn, "TIDEMARK_TARGET="+target)
	var stderr tailBuffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return syncRun{}, fmt.Errorf("tidemark sync: %w", err)
	}
	// The child's peak resident set is read from its VmHWM while it runs, not from its rusage:
	// ru_maxrss carries over the parent's peak from before the exec (Go starts children with
	// vfork semantics, sharing the parent's memory until the exec), which would report a large
	// parent (a test binary) as the child's peak. VmHWM only grows, so the last reading before
	// the child exits holds all but its last 10 ms.
	done := make(chan struct{})
	peak := make(chan int64, 1)
	go func() {
		var max int64
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			if kib := vmHWM(cmd.Process.Pid); kib > max {
				max = kib
			}
			select {
			case <-done:
				peak <- max
				return
			case <-t.C:
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	r := syncRun{d: time.Since(start), rssKiB: <-peak}
	if err != nil {
		return syncRun{}, fmt.Errorf("tidemark sync %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return r, nil
}

// vmHWM is the peak resident set of process pid so far, in KiB (0 when it cannot be read: the
// process has exited).
func vmHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kib
		}
	}
	return 0
}

func (b *memoryBench) memLine(name string, r syncRun, rows, outBytes int64, note string) {
	out := ""
	if outBytes > 0 {
		out = fmt.Sprintf(" output_MB=%.1f", float64(outBytes)/1e6)
	}
	b.printf("%-24s rows=%d s=%.1f rows_per_s=%.0f cpu_s=%.2f peak_rss_MB=%.0f%s %s\n", name, rows, r.d.Seconds(), float64(rows)/r.d.Seconds(),
		r.cpu.Seconds(), float64(r.rssKiB)*1024/1e6, out, note)
}

// tailBuffer keeps the last 4 kB written to it (a child's stderr, for its error).
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return strings.TrimSpace(string(t.b)) }

// countLines counts the lines of a file and its size.
func countLines(path string) (lines, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	buf := make([]byte, 1<<20)
	for {
		n, err := r.Read(buf)
		lines += int64(bytes.Count(buf[:n], []byte{'\n'}))
		size += int64(n)
		if errors.Is(err, io.EOF) {
			return lines, size, nil
		}
		if err != nil {
			return 0, 0, fmt.Errorf("read %s: %w", path, err)
		}
	}
}

func queryRow(ctx context.Context, dsn, sql string, dst ...any) error {
	conn, err := pgconf.OpenDefaultSSL(ctx, dsn, "tidemark")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, sql).Scan(dst...); err != nil {
		return fmt.Errorf("run %q: %w", sql, err)
	}
	return nil
}

// findTidemark returns the tidemark binary for child syncs: this one, or, when this process is a
// test binary, one built from the module it runs in.
func findTidemark(ctx context.Context, self string) (string, error) {
	if !strings.HasSuffix(self, ".test") {
		return self, nil
	}
	dir, _ := os.Getwd()
	for ; dir != filepath.Dir(dir); dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "cmd", "tidemark", "main.go")); err != nil {
			continue
		}
		out := filepath.Join(os.TempDir(), "tidemark-bench-tidemark")
		build := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/tidemark")
		build.Dir = dir
		if b, err := build.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build tidemark: %v: %s", err, strings.TrimSpace(string(b)))
		}
		return out, nil
	}
	return "", errors.New("the tidemark binary is needed for the child syncs: run the bench from a built tidemark")
}
