package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/sink"
	"github.com/tidemark/tidemark/sink/debezium"
	"github.com/tidemark/tidemark/sink/jsonl"
	"github.com/tidemark/tidemark/sink/kafka"
	"github.com/tidemark/tidemark/sink/nats"
	"github.com/tidemark/tidemark/sink/postgres"
	"github.com/tidemark/tidemark/watermark"
)

func runSync(ctx context.Context, args []string, e *env) error {
	fs := newFlags("sync", "sync --source DSN --tables SCHEMA.TABLE[,...] --to FILE|-|postgres://...|kafka://... [flags]", e)
	f := defineSyncFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	plan, problems := f.check(fs)
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(problems, "; "))
	}
	stats := newSyncStats(plan.tables)
	ctl, err := listenControl(controlPath(*f.control, *f.slot), fmt.Sprintf("slot %s, output %s", *f.slot, describeOutput(*f.to)), e.log)
	if err != nil {
		e.log.Warn().Err(err).Msg("tidemark rebackfill cannot reach this sync; it runs on")
	}
	defer ctl.Close()
	// A lost connection (the source or the target restarted, failed over, or a network fault)
	// does not end a run that got going (one checkpoint): it starts again from the last
	// checkpoint, with a growing wait.
	// Everything else stops it at once, with its cause and fix.
	stalled := 0 // attempts in a row that took no checkpoint
	rewriteRetried := false
	for attempt := 1; ; attempt++ {
		stats.mu.Lock()
		before := stats.checkpoint
		stats.mu.Unlock()
		err := f.syncOnce(ctx, e, plan, stats, ctl)
		// A run that never reached a checkpoint in this process has a setup problem to report
		// (a host name mistyped is a network error too), not a connection to restore.
		stats.mu.Lock()
		running, progressed := !stats.checkpoint.IsZero(), stats.checkpoint.After(before)
		stats.mu.Unlock()
		// A change of the rewritten table that reached the PostgreSQL target before the watch
		// saw the rewrite: the next run finds the rewrite at its start and re-backfills the
		// table, passing over that change. Once: a type change that rewrote nothing stops again.
		if progressed {
			rewriteRetried = false
		}
		if errors.Is(err, postgres.ErrRewriteNotFollowed) && *f.onRewrite == "rebackfill" && !rewriteRetried && running &&
			!errors.Is(err, replicator.ErrLeftBehind) && ctx.Err() == nil {
			rewriteRetried = true
			e.log.Warn().Err(err).Msg("the target met a change of a table whose values the source rewrote, before the re-backfill it asks for: running again, which re-backfills the table from its start")
			continue
		}
		if err == nil || ctx.Err() != nil || !running || !pgerr.Reconnectable(err) || errors.Is(err, replicator.ErrLeftBehind) {
			return err
		}
		if stalled = stalled + 1; progressed {
			stalled = 0
		}
		if stalled >= maxStalledAttempts {
			return fmt.Errorf("gave up after %d attempts in a row that took no checkpoint (about %s): %w", stalled, stalledTime, err)
		}
		wait := min(time.Second<<min(max(stalled, 1)-1, 5), 30*time.Second) // from 1 s again after progress
		stats.mu.Lock()
		stats.reconnects++
		stats.mu.Unlock()
		e.log.Warn().Err(err).Int("attempt", attempt).Str("retry_in", wait.String()).
			Msg("connection lost: reconnecting, then resuming from the last checkpoint")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// maxStalledAttempts bounds the reconnections that make no progress: a failover is done within
// minutes; a connection that keeps breaking at once is a fault of its own to report.
const (
	maxStalledAttempts = 20
	stalledTime        = "8 minutes"
)

// syncOnce runs sync once: it opens the source and the output (reading its checkpoint), and runs
// the engine from there.
func (f *syncFlags) syncOnce(ctx context.Context, e *env, plan syncPlan, stats *syncStats, ctl *controlServer) error {
	srcConn, err := pgconf.OpenDefaultSSL(ctx, *f.source, "tidemark")
	if err != nil {
		return err
	}
	defer srcConn.Close(context.WithoutCancel(ctx))
	// The engine opens its own connections: give it the connection string with the sslmode
	// OpenDefaultSSL used.
	srcDSN, _, err := pgconf.DefaultSSLMode(*f.source)
	if err != nil {
		return err
	}
	out, from, closeOut, err := f.openOutput(ctx, e, srcConn, plan)
	if err != nil {
		return err
	}
	defer closeOut()
	// A re-backfill asked for applies until a checkpoint of this process has recorded it.
	stats.mu.Lock()
	checkpointed := !stats.checkpoint.IsZero()
	stats.mu.Unlock()
	if from != nil && !checkpointed {
		for _, name := range plan.refresh {
			from.Tables[name] = &merge.TableProgress{Refresh: true}
			e.log.Info().Str("table", name).Msg("re-backfill asked for: the table's output starts over")
		}
	}
	stats.resumed(from)
	cfg := f.engineConfig(plan, srcDSN)
	if from == nil && !checkpointed {
		// No position yet (a first run that never checkpointed): the engine starts the tables
		// over itself, passing over their changes before the backfill, as a re-backfill does.
		for i, tc := range cfg.Tables {
			if slices.Contains(plan.refresh, tc.Schema+"."+tc.Name) {
				cfg.Tables[i].Rebackfill = true
			}
		}
	}
	if checkpointed {
		// --types-changed and --maintenance, like --rebackfill, are for the state they were given for: after a
		// checkpoint of this process, a reconnection must compare again.
		for i := range cfg.Tables {
			cfg.Tables[i].TypesChanged, cfg.Tables[i].Maintenance, cfg.Tables[i].Rebackfill = false, false, false
		}
	}
	cfg.Hooks.ChunkAbandoned = stats.abandonedHook
	return withRebackfillHint(runWithProgress(ctx, e, cfg, statsSink{Sink: out, s: stats}, from, stats, srcDSN, *f.metricsAddr, *f.quiet, ctl))
}

// syncFlags are sync's flags.
type syncFlags struct {
	source, tables, to, targetSchema, checkpointID, checkpoint, slot, pub       *string
	rebackfill, metricsAddr, watermarks, signalTable, typesChanged, maintenance *string
	control, onSlotLoss, onRewrite, format                                      *string
	audit, stopCaughtUp, noBackfill, quiet, kafkaCompact                        *bool
	kafkaPartitions, kafkaReplication, kafkaMaxRecord                           *int
	kafkaTopic, dbzDecimal                                                      *string
	dbzSchemas                                                                  *bool
	natsPartitions, natsReplicas                                                *int
	natsDupWindow                                                               *time.Duration
	kafkaTxnTimeout                                                             *time.Duration
	chunkSize, maxChunkBytes, readers, encoders                                 *int
	interval, wmTimeout, watch                                                  *time.Duration
	testing                                                                     testingFlags
	keys                                                                        *[]string
}

func defineSyncFlags(fs *flag.FlagSet) *syncFlags {
	f := &syncFlags{source: sourceFlag(fs)}
	f.tables = fs.String("tables", "", "comma-separated tables to capture, as schema.table")
	f.keys = keyFlag(fs)
	f.to = envFlag(fs, "to", "TIDEMARK_TARGET", nil, "where to write, a `TARGET`: a PostgreSQL connection string (postgres://...), Kafka (kafka://HOST:PORT[,HOST:PORT...]/PREFIX: a topic PREFIX.SCHEMA.TABLE per table), NATS JetStream (nats://HOST:PORT[,HOST:PORT...]/STREAM: subjects STREAM.SCHEMA.TABLE.N), a JSON lines file, or - for standard output")
	f.targetSchema = fs.String("target-schema", "", "PostgreSQL target: put the tables in this schema; default the source's")
	f.checkpointID = fs.String("checkpoint-id", "", "PostgreSQL target: the id of this capture's checkpoint row; default the slot name")
	f.audit = fs.Bool("audit", false, "PostgreSQL target: record every applied source transaction in tidemark_applied, so one applied twice fails")
	f.checkpoint = fs.String("checkpoint", "", "checkpoint file; default TARGET.checkpoint (none for -)")
	f.slot = slotFlag(fs, "logical replication slot (pgoutput); created when missing")
	f.pub = publicationFlag(fs, "publication; created for --tables when missing")
	f.chunkSize = fs.Int("chunk-size", merge.DefaultChunkSize, "rows per backfill chunk")
	f.readers = fs.Int("readers", 1, "backfill readers, each on its own connection to the source (1 to 64): tables read at once, and key ranges of a large table; more finish sooner and hold more connections and snapshots on the source")
	f.encoders = fs.Int("encoders", 0, "--to a file or -: goroutines that encode a batch's lines at once (0: one per core past the first, at most 8; 1: on the merge loop's own)")
	f.interval = fs.Duration("checkpoint-interval", time.Second, "longest time between checkpoints (each is a durable commit on the target)")
	f.stopCaughtUp = fs.Bool("stop-when-caught-up", false, "exit once every backfill is done and the stream has caught up")
	f.noBackfill = fs.Bool("no-backfill", false, "capture changes only: do not read existing rows")
	f.control = controlFlag(fs)
	f.onSlotLoss = fs.String("on-slot-loss", "fail", "what a run does when its slot is gone (dropped) or lost WAL it needed (invalidated by max_slot_wal_keep_size): fail (with the fix), or rebackfill (create the slot again, dropping the invalidated one, and backfill every table again while the changes stream)")
	f.onRewrite = fs.String("on-rewrite", "rebackfill", "what a run does when a change rewrote a table's values with no row event (a column type change that rewrote the table, an enum label renamed, a column added with a volatile default, SET UNLOGGED then SET LOGGED): rebackfill (the table, while the changes stream, with a warning naming the cause; at most once every 5 minutes per table), or fail (with the cause and the fix)")
	f.maintenance = fs.String("maintenance", "", "tables (schema.table,...) whose storage files changed between two runs by maintenance that changed no value (VACUUM FULL, CLUSTER, pg_repack, SET TABLESPACE) and stopped the sync: take them as they are now, for this run, without a re-backfill")
	f.typesChanged = fs.String("types-changed", "", "tables (schema.table,...) whose output's values were converted as the source's by a column type change that stopped the sync: take their column types as they are now, for this run, without a re-backfill")
	f.rebackfill = fs.String("rebackfill", "", "start these tables' output over (schema.table,... or all): each is emptied on the target (a refresh line in JSON lines) and backfilled again, behind any change that could not be placed; all also starts over when the checkpoint cannot be resumed from the slot. For one run")
	f.metricsAddr = fs.String("metrics-addr", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9187; :9187 listens on every interface) at /metrics")
	f.quiet = fs.Bool("quiet", false, "no progress display")
	f.watermarks = fs.String("watermarks", "auto", "how watermarks are written: message (transactional logical messages: no table, no write privilege; PostgreSQL 14+), table (rows of --signal-table), or auto (message on 14+, table before; table when --signal-table is given)")
	f.signalTable = signalTableFlag(fs, "the watermark table of the table transport, as schema.table; created when missing")
	f.wmTimeout = fs.Duration("watermark-timeout", 10*time.Second, "longest wait for a watermark's commit (a synchronous standby that does not answer)")
	f.watch = fs.Duration("watch-interval", 10*time.Second, "time between two looks at what the stream does not carry (a table renamed, dropped or out of the publication, its partitions, UNLOGGED or rewritten, the publish option): a change undone within one interval is not seen")
	f.testing = newTestingFlags(fs)
	f.format = fs.String("format", "tidemark", "JSON lines, Kafka and NATS: what each event is written as: tidemark (Tidemark's line) or debezium (Debezium's change-event envelope, and a key record in Kafka; docs/cli.md)")
	f.dbzDecimal = fs.String("debezium-decimal", "precise", "--format debezium: how numeric and money values are written, as Debezium's decimal.handling.mode: precise (Kafka Connect's Decimal, base64 bytes), double, or string")
	f.dbzSchemas = fs.Bool("debezium-schemas", false, "--format debezium: each key and value carries its schema, as Kafka Connect's JSON converter writes them with schemas.enable ({\"schema\":...,\"payload\":...})")
	f.kafkaPartitions = fs.Int("kafka-partitions", 1, "Kafka: partitions of each topic the sync creates (a key's changes stay in one partition, in order)")
	f.kafkaReplication = fs.Int("kafka-replication", -1, "Kafka: replication factor of each topic the sync creates (-1: the brokers' default)")
	f.kafkaTopic = fs.String("kafka-topic", "table", "Kafka: table (a topic per table, PREFIX.SCHEMA.TABLE) or single (one topic, PREFIX, the table in each record's tidemark.table header); kept for the output's life")
	f.kafkaCompact = fs.Bool("kafka-compact", false, "Kafka: create the tables' topics compacted (cleanup.policy=compact: a key's last record stays, a deleted key goes)")
	f.kafkaMaxRecord = fs.Int("kafka-max-record-bytes", 1000012, "Kafka: the largest batch of records, and so record, the producer sends (its batch.max.bytes); raise it with the topics' max.message.bytes for rows larger than about 1 MB")
	f.kafkaTxnTimeout = fs.Duration("kafka-transaction-timeout", time.Minute, "Kafka: the transaction timeout; the records between two checkpoints (a source transaction's, at least) must be written within it, and the brokers cap it (transaction.max.timeout.ms, 15 minutes by default)")
	f.natsPartitions = fs.Int("nats-partitions", 1, "NATS: subjects per table (STREAM.SCHEMA.TABLE.0 to N-1) a key is hashed to, for consumers to share a table (a key's changes stay on one subject, in order); kept for the output's life")
	f.natsReplicas = fs.Int("nats-replicas", 1, "NATS: replicas of the stream and of the checkpoint bucket the sync creates (3 on a cluster of three or more)")
	f.natsDupWindow = fs.Duration("nats-duplicate-window", 2*time.Minute, "NATS: the stream's duplicate window, when the sync creates it: a message whose id (slot:history:LSN:seq:n) the stream saw within it is dropped")
	f.maxChunkBytes = fs.Int("max-chunk-bytes", 32<<20, "bound on the bytes of one backfill chunk: a chunk read stops there (a row larger than it makes a chunk of its own)")
	return f
}

// syncPlan is what sync's flags say, checked and parsed.
type syncPlan struct {
	tables             []merge.TableConfig
	sigSchema, sigName string
	transport          watermark.Transport
	refresh            []string // tables to re-backfill
	refreshAll         bool
	hooks              merge.Hooks
	faults             merge.Faults
}

// check parses the flags into a plan, and lists every problem with them at once.
func (f *syncFlags) check(fs *flag.FlagSet) (syncPlan, []string) {
	var p syncPlan
	problems := outOfRange(
		intRange("chunk-size", *f.chunkSize, 1, 1_000_000),
		intRange("readers", *f.readers, 1, merge.MaxReaders), intRange("encoders", *f.encoders, 0, jsonl.MaxEncoders),
		durationRange("checkpoint-interval", *f.interval, 10*time.Millisecond, time.Hour),
		durationRange("watermark-timeout", *f.wmTimeout, 100*time.Millisecond, time.Hour),
		durationRange("watch-interval", *f.watch, 100*time.Millisecond, time.Hour),
		intRange("max-chunk-bytes", *f.maxChunkBytes, 1<<10, 1<<30),
		intRange("kafka-partitions", *f.kafkaPartitions, 1, 10000), intRange("kafka-replication", *f.kafkaReplication, -1, 100),
		intRange("kafka-max-record-bytes", *f.kafkaMaxRecord, 1<<10, 1<<30),
		durationRange("kafka-transaction-timeout", *f.kafkaTxnTimeout, 2*time.Second, time.Hour),
		intRange("nats-partitions", *f.natsPartitions, 1, 1024), intRange("nats-replicas", *f.natsReplicas, 1, 5),
		durationRange("nats-duplicate-window", *f.natsDupWindow, time.Second, 7*24*time.Hour))
	if *f.source == "" {
		problems = append(problems, "--source is required")
	}
	if *f.to == "" {
		problems = append(problems, "--to (or $TIDEMARK_TARGET) is required")
	} else if isDSN(*f.to) && *f.encoders != 0 {
		problems = append(problems, "--encoders is for JSON lines (--to a file or -): a PostgreSQL target writes rows, not lines")
	} else if kafka.IsURL(*f.to) {
		if _, err := kafka.ParseURL(*f.to); err != nil {
			problems = append(problems, err.Error())
		}
		if *f.encoders != 0 {
			problems = append(problems, "--encoders is for JSON lines (--to a file or -), not Kafka")
		}
		if *f.checkpoint != "" {
			problems = append(problems, "--checkpoint is for JSON lines: a Kafka output keeps its checkpoint in its topic PREFIX.tidemark-checkpoint")
		}
		switch {
		case *f.kafkaTopic != "table" && *f.kafkaTopic != "single":
			problems = append(problems, fmt.Sprintf("--kafka-topic %q: give table or single", *f.kafkaTopic))
		case *f.kafkaTopic == "single" && *f.kafkaCompact:
			problems = append(problems, "--kafka-compact needs --kafka-topic table: in one topic, two tables' rows of the same key would compact into one")
		}
		if *f.interval*2 > *f.kafkaTxnTimeout {
			problems = append(problems, fmt.Sprintf("--checkpoint-interval %s: each checkpoint commits a Kafka transaction, which must end within --kafka-transaction-timeout (%s): give an interval of half the timeout at most", *f.interval, *f.kafkaTxnTimeout))
		}
	}
	if nats.IsURL(*f.to) {
		if _, err := nats.ParseURL(*f.to); err != nil {
			problems = append(problems, err.Error())
		}
		if *f.encoders != 0 {
			problems = append(problems, "--encoders is for JSON lines (--to a file or -), not NATS")
		}
		if *f.checkpoint != "" {
			problems = append(problems, "--checkpoint is for JSON lines: a NATS output keeps its checkpoint in its bucket tidemark-STREAM")
		}
	} else {
		for _, name := range []string{"nats-partitions", "nats-replicas", "nats-duplicate-window"} {
			if flagGiven(fs, name) {
				problems = append(problems, fmt.Sprintf("--%s is for a NATS output (--to nats://...)", name))
			}
		}
	}
	if *f.format != "tidemark" && *f.format != "debezium" {
		problems = append(problems, fmt.Sprintf("--format %q: give tidemark or debezium", *f.format))
	} else if *f.format == "debezium" && isDSN(*f.to) {
		problems = append(problems, "--format is for JSON lines, Kafka and NATS: a PostgreSQL target writes rows")
	}
	if _, ok := pgjson.DecimalModes[*f.dbzDecimal]; !ok {
		problems = append(problems, fmt.Sprintf("--debezium-decimal %q: give precise, double or string", *f.dbzDecimal))
	}
	if *f.format != "debezium" {
		for _, name := range []string{"debezium-decimal", "debezium-schemas"} {
			if flagGiven(fs, name) {
				problems = append(problems, fmt.Sprintf("--%s is for --format debezium", name))
			}
		}
	}
	if !kafka.IsURL(*f.to) {
		for _, name := range []string{"kafka-partitions", "kafka-replication", "kafka-compact", "kafka-topic", "kafka-transaction-timeout", "kafka-max-record-bytes"} {
			if flagGiven(fs, name) {
				problems = append(problems, fmt.Sprintf("--%s is for a Kafka output (--to kafka://...)", name))
			}
		}
	}
	var err error
	if p.tables, err = parseTables(*f.tables); err != nil {
		problems = append(problems, err.Error())
	}
	for i := range p.tables {
		p.tables[i].NoBackfill = *f.noBackfill
	}
	for _, ack := range []struct {
		flag string
		list string
		set  func(*merge.TableConfig)
	}{
		{"--types-changed", *f.typesChanged, func(t *merge.TableConfig) { t.TypesChanged = true }},
		{"--maintenance", *f.maintenance, func(t *merge.TableConfig) { t.Maintenance = true }},
	} {
		if ack.list == "" {
			continue
		}
		for _, name := range strings.Split(ack.list, ",") {
			i := slices.IndexFunc(p.tables, func(t merge.TableConfig) bool { return t.Schema+"."+t.Name == strings.TrimSpace(name) })
			if i < 0 {
				problems = append(problems, fmt.Sprintf("%s %s: not among --tables", ack.flag, name))
				continue
			}
			ack.set(&p.tables[i])
		}
	}
	if err := applyKeys(*f.keys, p.tables); err != nil {
		problems = append(problems, err.Error())
	}
	if *f.onSlotLoss != "fail" && *f.onSlotLoss != "rebackfill" {
		problems = append(problems, fmt.Sprintf("--on-slot-loss %q: give fail or rebackfill", *f.onSlotLoss))
	}
	if *f.onRewrite != "fail" && *f.onRewrite != "rebackfill" {
		problems = append(problems, fmt.Sprintf("--on-rewrite %q: give rebackfill or fail", *f.onRewrite))
	}
	var ok bool
	if p.sigSchema, p.sigName, ok = strings.Cut(*f.signalTable, "."); !ok || p.sigSchema == "" || p.sigName == "" {
		problems = append(problems, "--signal-table must be schema.table")
	}
	if p.transport, err = watermark.ParseTransport(*f.watermarks); err != nil {
		problems = append(problems, "--watermarks must be auto, message or table")
	}
	if p.transport == watermark.Auto && flagGiven(fs, "signal-table") {
		p.transport = watermark.Table
	}
	if p.refresh, p.refreshAll, err = parseRebackfill(*f.rebackfill, p.tables); err != nil {
		problems = append(problems, err.Error())
	}
	problems = append(problems, f.testing.apply(&p.faults, &p.hooks)...)
	return p, problems
}

// openOutput opens (locks, cuts back to its checkpoint) the output --to names, and returns the
// position to resume from and what closes it (the output, then its connection).
func (f *syncFlags) openOutput(ctx context.Context, e *env, srcConn *pgx.Conn, plan syncPlan) (sink.Output, *merge.Position, func(), error) {
	var names []string
	for _, t := range plan.tables {
		names = append(names, t.Schema+"."+t.Name)
	}
	// dbz is the Debezium encoder of --format debezium (nil for tidemark), its source.name the
	// output's.
	dbz := func(name string) *debezium.Encoder {
		if *f.format != "debezium" {
			return nil
		}
		d := debezium.NewEncoder(pgjson.NewRegistry(srcConn))
		d.Name, d.Database = name, srcConn.Config().Database
		d.Decimal, d.Schemas = pgjson.DecimalModes[*f.dbzDecimal], *f.dbzSchemas
		return d
	}
	ready := func() error { return slotIdle(ctx, srcConn, *f.slot) }
	var out sink.Output
	var pos *merge.Position
	var err error
	switch {
	case nats.IsURL(*f.to):
		var addr nats.Address
		if addr, err = nats.ParseURL(*f.to); err == nil {
			out, pos, err = nats.Open(ctx, nats.Options{Address: addr, Tables: names, Partitions: *f.natsPartitions, Replicas: *f.natsReplicas,
				DuplicateWindow: *f.natsDupWindow, Debezium: dbz(addr.Stream), RereadPartial: *f.format == "debezium" && *f.dbzSchemas, Slot: *f.slot, Types: pgjson.NewRegistry(srcConn), Log: e.log}, ready)
		}
	case kafka.IsURL(*f.to):
		var addr kafka.Address
		if addr, err = kafka.ParseURL(*f.to); err == nil {
			out, pos, err = kafka.Open(ctx, kafka.Options{Address: addr, Tables: names, Partitions: int32(*f.kafkaPartitions), Debezium: dbz(addr.Prefix),
				Replication: int16(*f.kafkaReplication), Compact: *f.kafkaCompact, SingleTopic: *f.kafkaTopic == "single", TransactionTimeout: *f.kafkaTxnTimeout, MaxRecordBytes: int32(*f.kafkaMaxRecord),
				Slot: *f.slot, Types: pgjson.NewRegistry(srcConn), Log: e.log}, ready)
		}
	}
	if out != nil || err != nil {
		if err != nil {
			return nil, nil, nil, err
		}
		return out, pos, func() { _ = out.Close(context.WithoutCancel(ctx)) }, nil
	}
	if !isDSN(*f.to) {
		js, pos, err := jsonl.Open(*f.to, *f.checkpoint, pgjson.NewRegistry(srcConn), func() error { return slotIdle(ctx, srcConn, *f.slot) })
		if err != nil {
			return nil, nil, nil, err
		}
		js.SetEncoders(*f.encoders)
		var ferr error
		if d := dbz("tidemark"); d != nil {
			ferr = js.SetDebezium(d)
		} else {
			ferr = js.CheckFormat()
		}
		if ferr != nil {
			_ = js.Close(context.WithoutCancel(ctx))
			return nil, nil, nil, ferr
		}
		return js, pos, func() { _ = js.Close(context.WithoutCancel(ctx)) }, nil
	}
	tgt, err := pgconf.OpenDefaultSSL(ctx, *f.to, "tidemark")
	if err != nil {
		return nil, nil, nil, fmt.Errorf("target: %w", err)
	}
	id := *f.checkpointID
	if id == "" {
		id = *f.slot
	}
	// Rows a target table holds that the checkpoint does not account for are refused, unless
	// the table is to be re-backfilled (emptied) or nothing is backfilled (they are the user's).
	empty := map[string]bool{}
	for _, t := range plan.tables {
		if n := t.Schema + "." + t.Name; plan.refreshAll || slices.Contains(plan.refresh, n) {
			empty[n] = true
		}
	}
	ps, pos, err := postgres.Open(ctx, tgt, srcConn, postgres.Options{ID: id, Schema: *f.targetSchema, Audit: *f.audit, Log: e.log,
		Empty: empty, KeepRows: *f.noBackfill})
	if err != nil {
		_ = tgt.Close(context.WithoutCancel(ctx))
		return nil, nil, nil, err
	}
	// Before the engine creates anything on the source.
	if err := ps.CheckTables(ctx, names); err != nil {
		_ = ps.Close(context.WithoutCancel(ctx))
		_ = tgt.Close(context.WithoutCancel(ctx))
		return nil, nil, nil, err
	}
	return ps, pos, func() {
		_ = ps.Close(context.WithoutCancel(ctx))
		_ = tgt.Close(context.WithoutCancel(ctx)) // ends the session: releases the target's locks
	}, nil
}

// engineConfig is the engine's configuration for the plan, reading from srcDSN.
func (f *syncFlags) engineConfig(p syncPlan, srcDSN string) merge.Config {
	var pubTables []pgx.Identifier
	for _, t := range p.tables {
		pubTables = append(pubTables, pgx.Identifier{t.Schema, t.Name})
	}
	return merge.Config{
		Source: replicator.Config{DSN: srcDSN, Slot: *f.slot, Publication: *f.pub, CreateSlot: true,
			CreatePublication: true, PublicationTables: pubTables, StatusInterval: time.Second,
			ReplaceLostSlot: *f.onSlotLoss == "rebackfill"},
		Tables:             slices.Clone(p.tables), // a run's acknowledgements are its own
		Hooks:              p.hooks,
		Faults:             p.faults,
		ChunkSize:          *f.chunkSize,
		Readers:            *f.readers,
		MaxChunkBytes:      *f.maxChunkBytes,
		CheckpointInterval: *f.interval,
		AckCheckpoints:     true,
		StopWhenCaughtUp:   *f.stopCaughtUp,
		AddToPublication:   true,
		Watermarks:         p.transport,
		SignalTable:        pgx.Identifier{p.sigSchema, p.sigName},
		WatermarkTimeout:   *f.wmTimeout,
		WatchInterval:      *f.watch,
		// --rebackfill all: a checkpoint that cannot be resumed is replaced by a refresh of
		// every table.
		ResyncInvalidPosition: p.refreshAll,
		ResyncLostSlot:        *f.onSlotLoss == "rebackfill",
		RebackfillRewrites:    *f.onRewrite == "rebackfill",
		// A compacted topic keeps a key's last record only: it must be the whole row, so an
		// update without its unchanged TOASTed values is replaced by the row read again. So it
		// is with Debezium's schemas: its placeholder does not fit most columns' schemas.
		RereadPartial: kafka.IsURL(*f.to) && *f.kafkaCompact || *f.format == "debezium" && *f.dbzSchemas,
	}
}

// runWithProgress runs the engine with the progress display (or log lines), the source poller
// and the metrics server beside it; it owns their goroutines and waits for them.
func runWithProgress(ctx context.Context, e *env, cfg merge.Config, sink merge.Sink, from *merge.Position, stats *syncStats,
	source, metricsAddr string, quiet bool, ctl *controlServer) error {
	// On a terminal, the progress display shows the engine's log lines above its bars.
	eng, err := merge.New(cfg, sink, e.log)
	if err != nil {
		return err
	}
	pollConn, err := pgconf.OpenDefaultSSL(ctx, source, "tidemark")
	if err != nil {
		return err
	}
	defer pollConn.Close(context.WithoutCancel(ctx))
	stats.estimates(ctx, pollConn)
	sideCtx, stopSide := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { stats.poll(sideCtx, pollConn, cfg.Source.Slot) })
	if !quiet {
		wg.Go(func() { stats.display(sideCtx, e) })
	}
	stopMetrics := func() error { return nil }
	if metricsAddr != "" {
		if stopMetrics, err = serveMetrics(ctx, metricsAddr, stats, e.log); err != nil {
			stopSide()
			wg.Wait()
			return err
		}
	}
	ctl.running(eng)
	err = eng.Run(ctx, from)
	ctl.running(nil)
	stopSide()
	wg.Wait()
	if merr := stopMetrics(); merr != nil && err == nil {
		err = merr
	}
	return err
}

// isDSN reports whether a --to target is a PostgreSQL connection string rather than a file.
func isDSN(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") ||
		strings.Contains(s, "dbname=") || strings.Contains(s, "host=")
}

// parseTables parses "schema.table,schema.table".
func parseTables(s string) ([]merge.TableConfig, error) {
	if s == "" {
		return nil, fmt.Errorf("--tables is required")
	}
	var out []merge.TableConfig
	for _, t := range strings.Split(s, ",") {
		schema, name, ok := strings.Cut(strings.TrimSpace(t), ".")
		if !ok || schema == "" || name == "" {
			return nil, fmt.Errorf("table %q: write it as schema.table", t)
		}
		if strings.ContainsAny(schema+name, "*?%") {
			return nil, fmt.Errorf("table %q: patterns are not taken; list the tables (schema.table,...): a table created later would need its own backfill", t)
		}
		out = append(out, merge.TableConfig{Schema: schema, Name: name})
	}
	return out, nil
}

// parseRebackfill parses --rebackfill: captured tables (schema.table,...) or all.
func parseRebackfill(s string, tcs []merge.TableConfig) (names []string, all bool, err error) {
	if s == "" {
		return nil, false, nil
	}
	captured := map[string]bool{}
	for _, t := range tcs {
		captured[t.Schema+"."+t.Name] = true
	}
	if s == "all" {
		for _, t := range tcs {
			names = append(names, t.Schema+"."+t.Name)
		}
		return names, true, nil
	}
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if !captured[n] {
			return nil, false, fmt.Errorf("--rebackfill: %q is not among --tables (write schema.table, or all)", n)
		}
		names = append(names, n)
	}
	return names, false, nil
}

// withRebackfillHint adds to an error whose way out is a re-backfill how to ask for one.
func withRebackfillHint(err error) error {
	var un *merge.UnplaceableError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &un):
		return fmt.Errorf("%w\nto re-backfill it, run the same command once with --rebackfill %s", err, un.Table)
	case errors.Is(err, merge.ErrPublicationChanged), errors.Is(err, merge.ErrTableReplaced), errors.Is(err, merge.ErrPartitionsChanged),
		errors.Is(err, merge.ErrKeyChanged):
		return fmt.Errorf("%w\nto re-backfill, run the same command once with --rebackfill and the table (or all)", err)
	case errors.Is(err, merge.ErrForeignPosition), errors.Is(err, merge.ErrTimelineForked), errors.Is(err, merge.ErrSystemChanged),
		errors.Is(err, merge.ErrPositionBehindSlot), errors.Is(err, merge.ErrPositionAhead):
		return fmt.Errorf("%w\nto start over from the slot, every table's output rebuilt, run the same command once with --rebackfill all", err)
	}
	return err
}

// slotIdle fails when another process streams from slot: a second capture of the same slot,
// found before its output is touched.
func slotIdle(ctx context.Context, conn *pgx.Conn, slot string) error {
	var pid *int32
	idle := false
	err := replicator.UntilFree(ctx, replicator.DefaultInUseWait, func() (bool, error) {
		err := conn.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND active`, slot).Scan(&pid)
		idle = errors.Is(err, pgx.ErrNoRows)
		if idle {
			return true, nil
		}
		return false, err
	})
	if idle {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check replication slot %q: %w", slot, err)
	}
	p := int32(0)
	if pid != nil {
		p = *pid
	}
	return fmt.Errorf("replication slot %q is in use by server process %d: another tidemark sync (or another consumer) reads it; the output was not touched; stop the other one first", slot, p)
}
