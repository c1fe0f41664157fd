package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgserver"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/sink/postgres"
	"github.com/tidemark/tidemark/verify"
)

// demoTables are the demo's source tables.
var demoTables = []string{
	`CREATE TYPE public.order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled')`,
	`CREATE TABLE public.customers (id bigint PRIMARY KEY, name text NOT NULL, email text, country char(2), created timestamptz NOT NULL DEFAULT now())`,
	`CREATE TABLE public.orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, status public.order_status NOT NULL, total numeric(12,2) NOT NULL,
		items jsonb, tags text[], placed timestamptz NOT NULL, updated timestamptz NOT NULL DEFAULT clock_timestamp())`,
	`CREATE TABLE public.products (sku text PRIMARY KEY, title text NOT NULL, price money, weight real, photo bytea)`,
}

func runDemo(ctx context.Context, args []string, e *env) error {
	fs := newFlags("demo", "demo [--rows N] [--live DURATION]", e)
	rows := fs.Int("rows", 1_000_000, "rows of the orders table")
	live := fs.Duration("live", 10*time.Second, "how long the workload keeps writing once the backfills are done")
	rate := fs.Int("rate", 200, "workload transactions per second")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := usageProblems(fs, outOfRange(intRange("rows", *rows, 1, 100_000_000),
		durationRange("live", *live, 0, 24*time.Hour), intRange("rate", *rate, 1, 100_000))); err != nil {
		return err
	}
	start := time.Now()
	srv, err := startDemoServer(ctx, e)
	if err != nil {
		return err
	}
	defer func() {
		if err := srv.Stop(context.WithoutCancel(ctx)); err != nil {
			e.log.Warn().Err(err).Msg("stop the throwaway PostgreSQL")
		}
	}()
	src, tgt, err := createDemoData(ctx, e, srv, *rows)
	if err != nil {
		return err
	}
	srcConn, err := pgconf.OpenDefaultSSL(ctx, src, "tidemark")
	if err != nil {
		return err
	}
	defer srcConn.Close(context.WithoutCancel(ctx))
	tgtConn, err := pgconf.OpenDefaultSSL(ctx, tgt, "tidemark")
	if err != nil {
		return err
	}
	defer tgtConn.Close(context.WithoutCancel(ctx))

	res, err := syncDemo(ctx, e, src, srcConn, tgtConn, *rows, *rate, *live)
	if err != nil {
		return err
	}
	ok, err := verifyDemo(ctx, e, srcConn, tgtConn)
	if err != nil {
		return err
	}
	res.print(e, time.Since(start))
	if !ok {
		return errors.New("verification failed: the target differs from the source")
	}
	fmt.Fprintf(e.stdout, "  verification         passed: the target equals the source\n")
	return nil
}

// startDemoServer starts a throwaway PostgreSQL from the installed server binaries.
func startDemoServer(ctx context.Context, e *env) (*pgserver.Server, error) {
	fmt.Fprintf(e.stderr, "Starting a throwaway PostgreSQL...\n")
	srv, err := pgserver.Start(ctx, pgserver.Options{Log: e.log})
	if err != nil {
		return nil, fmt.Errorf("start a throwaway PostgreSQL: %w", err)
	}
	return srv, nil
}

// createDemoData creates the source database with its tables, rows, publication and slot, and
// the target database; it returns their connection strings.
func createDemoData(ctx context.Context, e *env, srv *pgserver.Server, rows int) (src, tgt string, err error) {
	for _, db := range []string{"demo_source", "demo_target"} {
		if err := srv.CreateDatabase(ctx, db); err != nil {
			return "", "", err
		}
	}
	src, tgt = srv.DSN("demo_source"), srv.DSN("demo_target")
	fmt.Fprintf(e.stderr, "Creating the demo tables: %d orders, %d customers, %d products...\n", rows, rows/20, 1000)
	stmts := append([]string{}, demoTables...)
	stmts = append(stmts,
		fmt.Sprintf(`INSERT INTO public.customers (id, name, email, country) SELECT g, 'Customer ' || g, 'c' || g || '@example.com', (ARRAY['FR','DE','US','JP','BR'])[1 + g %% 5]
			FROM generate_series(1, %d) g`, max(rows/20, 1)),
		fmt.Sprintf(`INSERT INTO public.orders (id, customer_id, status, total, items, tags, placed) SELECT g, 1 + g %% %d, (ARRAY['new','paid','shipped','cancelled'])[1 + g %% 4]::public.order_status,
			(g %% 10000) / 100.0, jsonb_build_object('sku', 'SKU-' || g %% 1000, 'qty', 1 + g %% 5), ARRAY['demo', 'batch-' || g %% 7], now() - g * interval '1 minute'
			FROM generate_series(1, %d) g`, max(rows/20, 1), rows),
		`INSERT INTO public.products SELECT 'SKU-' || g, 'Product ' || g, g * 1.25, g / 3.0, decode(md5(g::text), 'hex') FROM generate_series(0, 999) g`,
		`ANALYZE`,
		`CREATE PUBLICATION demo FOR TABLE public.customers, public.orders, public.products`,
		`SELECT pg_create_logical_replication_slot('demo', 'pgoutput')`,
	)
	if err := execAll(ctx, src, stmts...); err != nil {
		return "", "", err
	}
	// The target needs the enum the orders table uses.
	if err := execAll(ctx, tgt, demoTables[0]); err != nil {
		return "", "", err
	}
	return src, tgt, nil
}

// demoResult is what the demo's sync did, for its summary.
type demoResult struct {
	stats   *syncStats
	txns    int           // workload transactions
	elapsed time.Duration // the sync's time
}

// syncDemo runs the live workload and the sync into the target until the backfills are done,
// the workload has run live for a while and stopped, and the target has caught up.
func syncDemo(ctx context.Context, e *env, src string, srcConn, tgtConn *pgx.Conn, rows, rate int, live time.Duration) (*demoResult, error) {
	// The live workload: new orders, status changes, cancellations, new customers.
	workCtx, stopWork := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var txns, workErr = 0, error(nil)
	wg.Go(func() {
		txns, workErr = demoWorkload(workCtx, src, rows, rate)
	})
	defer func() { stopWork(); wg.Wait() }()

	sink, from, err := postgres.Open(ctx, tgtConn, srcConn, postgres.Options{ID: "demo", Log: e.log})
	if err != nil {
		return nil, err
	}
	defer sink.Close(context.WithoutCancel(ctx))
	tables := []merge.TableConfig{{Schema: "public", Name: "customers"}, {Schema: "public", Name: "orders"}, {Schema: "public", Name: "products"}}
	cfg := merge.Config{
		Source:             replicator.Config{DSN: src, Slot: "demo", Publication: "demo", StatusInterval: time.Second},
		Tables:             tables,
		AckCheckpoints:     true,
		CheckpointInterval: 250 * time.Millisecond,
	}
	stats := newSyncStats(tables)
	cfg.Hooks.ChunkAbandoned = stats.abandonedHook

	syncCtx, stopSync := context.WithCancelCause(ctx)
	var caught error
	wg.Go(func() {
		caught = demoWatch(syncCtx, stats, srcConn, live, stopWork)
		stopSync(errDemoDone)
	})
	fmt.Fprintf(e.stderr, "Syncing into a second database while the workload runs (%d transactions/s)...\n", rate)
	syncStart := time.Now()
	err = runWithProgress(syncCtx, e, cfg, statsSink{Sink: sink, s: stats}, from, stats, src, "", false, nil)
	elapsed := time.Since(syncStart)
	stopSync(nil)
	stopWork()
	wg.Wait()
	if err != nil && !errors.Is(err, errDemoDone) {
		return nil, err
	}
	if caught != nil {
		return nil, caught
	}
	if workErr != nil {
		return nil, fmt.Errorf("workload: %w", workErr)
	}
	return &demoResult{stats: stats, txns: txns, elapsed: elapsed}, nil
}

// verifyDemo compares every demo table on the source and the target with tidemark verify's
// comparison: row counts and per-chunk digests in key order, key by key where they differ.
func verifyDemo(ctx context.Context, e *env, srcConn, tgtConn *pgx.Conn) (bool, error) {
	fmt.Fprintf(e.stdout, "\nVerifying that the target equals the source (tidemark verify)...\n")
	opts := verify.Options{Source: srcConn, Publication: "demo", RecheckFor: 10 * time.Second, Log: e.log}
	for _, t := range []string{"customers", "orders", "products"} {
		opts.Tables = append(opts.Tables, verify.Table{Schema: "public", Name: t})
	}
	opts.Progress = func(t *verify.TableReport) {
		fmt.Fprintf(e.stdout, "  ")
		printTableReport(e.stdout, t, 5)
	}
	rep, err := verify.Postgres(ctx, opts, tgtConn, "")
	if err != nil {
		return false, err
	}
	return rep.Equal(), nil
}

// print writes the demo's summary; total is the demo's whole time.
func (r *demoResult) print(e *env, total time.Duration) {
	stats := r.stats
	stats.mu.Lock()
	backfilled := int64(0)
	for _, n := range stats.snapshot {
		backfilled += n
	}
	changes, backfillTime := stats.changes, stats.backfilled
	stats.mu.Unlock()
	fmt.Fprintf(e.stdout, "\nSummary\n")
	fmt.Fprintf(e.stdout, "  rows backfilled      %d in %s (%.0f rows/s), while the workload ran\n", backfilled, backfillTime.Round(time.Millisecond),
		float64(backfilled)/max(backfillTime.Seconds(), 0.001))
	fmt.Fprintf(e.stdout, "  live changes applied %d, from %d workload transactions\n", changes, r.txns)
	fmt.Fprintf(e.stdout, "  change latency       p50 %.0f ms, p99 %.0f ms (commit on the source to commit on the target)\n", stats.percentile(0.5), stats.percentile(0.99))
	fmt.Fprintf(e.stdout, "  sync time            %s (total %s)\n", r.elapsed.Round(time.Millisecond), total.Round(time.Millisecond))
}

var errDemoDone = errors.New("demo done")

// demoWatch waits for the backfills, lets the workload run live, stops it, and returns once the
// sink has every change the source has.
func demoWatch(ctx context.Context, stats *syncStats, src *pgx.Conn, live time.Duration, stopWork func()) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	allDone := func() bool {
		stats.mu.Lock()
		defer stats.mu.Unlock()
		for _, t := range stats.tables {
			if !stats.done[t] {
				return false
			}
		}
		return true
	}
	for !allDone() {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
		}
	}
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(live):
	}
	stopWork()
	// Everything committed before now must reach the sink: wait for a checkpoint past it.
	var wal string
	if err := src.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&wal); err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		stats.mu.Lock()
		at := stats.lastLSN.String()
		reached := stats.lastLSN >= mustLSN(wal) && !stats.checkpoint.IsZero()
		stats.mu.Unlock()
		if reached {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the sync did not catch up with %s (at %s)", wal, at)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
		}
	}
}

// demoWorkload writes to the demo tables at rate transactions per second until ctx ends.
func demoWorkload(ctx context.Context, dsn string, rows, rate int) (int, error) {
	conn, err := pgconf.OpenDefaultSSL(ctx, dsn, "tidemark")
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	r := rand.New(rand.NewPCG(1, 2))
	next := int64(rows) + 1
	t := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
	defer t.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return n, nil
		case <-t.C:
		}
		var stmts []string
		switch k := r.IntN(10); {
		case k < 4:
			stmts = append(stmts, fmt.Sprintf(`INSERT INTO public.orders (id, customer_id, status, total, items, placed) VALUES (%d, %d, 'new', %d.%02d, '{"live": true}', now())`,
				next, 1+r.IntN(max(rows/20, 1)), r.IntN(500), r.IntN(100)))
			next++
		case k < 8:
			stmts = append(stmts, fmt.Sprintf(`UPDATE public.orders SET status = 'paid', total = total + 1, updated = clock_timestamp() WHERE id = %d`, 1+r.IntN(rows)))
		case k < 9:
			stmts = append(stmts, fmt.Sprintf(`DELETE FROM public.orders WHERE id = %d`, 1+r.IntN(rows)))
		default:
			c := int64(rows/20) + next
			stmts = append(stmts, fmt.Sprintf(`INSERT INTO public.customers (id, name) VALUES (%d, 'New customer')`, c),
				fmt.Sprintf(`INSERT INTO public.orders (id, customer_id, status, total, placed) VALUES (%d, %d, 'new', 9.99, now())`, next, c))
			next++
		}
		if _, err := conn.Exec(ctx, "BEGIN; "+joinStmts(stmts)+"; COMMIT"); err != nil {
			if ctx.Err() != nil {
				return n, nil
			}
			return n, err
		}
		n++
	}
}

func joinStmts(s []string) string { return strings.Join(s, "; ") }

func mustLSN(s string) pglogrepl.LSN {
	lsn, _ := pglogrepl.ParseLSN(s)
	return lsn
}
