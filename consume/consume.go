package consume

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/sink/kafka"
)

// The consumer's own tables on the target.
const (
	// OffsetsTable holds, per group and partition, the offset of the next record to apply:
	// written in the transaction that applies the records before it.
	OffsetsTable = "public.tidemark_consumer_offsets"
	// TablesTable holds which group applies each target table: a second group applying the same
	// table is refused.
	TablesTable = "public.tidemark_consumer_tables"
)

// Options configure a consumer.
type Options struct {
	Address kafka.Address // the Kafka output to read (its brokers and prefix)
	Target  string        // the target PostgreSQL's connection string
	Group   string        // the consumer group
	// TargetSchema, when set, is the schema of every target table; otherwise a table is applied
	// to the table of its source name.
	TargetSchema string
	// StopWhenCaughtUp ends Run once the group has applied every record that was committed to
	// the output when the consumer joined.
	StopWhenCaughtUp bool
	// SessionTimeout is how long the group waits for a member that stopped answering before it
	// gives its tables to the others; 0: 10 s (not Kafka's 45). RebalanceTimeout is how long a
	// rebalance waits for the members to join again; 0: 30 s (a member still applying a batch
	// past it is left out, then finds its offsets moved, and reads again).
	SessionTimeout, RebalanceTimeout time.Duration
	Log                              zerolog.Logger
}

// tp is a topic partition.
type tp struct {
	topic string
	part  int32
}

// mark is a truncate's or refresh's place in the output: the same in each partition it went to.
type mark struct {
	lsn string
	seq string
}

// Consumer applies a Kafka output to PostgreSQL: one goroutine (Run's) owns its target
// connection and its client's records; the group's callbacks hand it assignments under mu.
type Consumer struct {
	o     Options
	conn  *pgx.Conn
	types *pgjson.Registry
	cl    *kgo.Client
	adm   *kadm.Client

	parts  map[string]int32  // topic: partitions
	tables map[string]*table // source schema.table: its target
	pos    map[tp]int64      // the next offset to apply; -1: the partition's start
	buf    map[tp][]*kgo.Record
	block  map[tp]mark // a partition stopped at a truncate or refresh until all of its topic's have
	goal   map[tp]int64
	paused map[tp]bool // partitions stopped at a truncate or refresh are not fetched further

	mu       sync.Mutex
	assigned map[tp]int64 // handed by the group, not yet taken
	revoked  []tp
	fatal    error
	applied  int64 // statements this member committed, said when it caught up
}

// Run consumes the output at o.Address as a member of group o.Group and applies it to the
// target, until ctx ends (nil) or, with StopWhenCaughtUp, the group caught up.
func Run(ctx context.Context, o Options) error {
	c, err := open(ctx, o)
	if err != nil {
		return err
	}
	defer c.close()
	return c.run(ctx)
}

func open(ctx context.Context, o Options) (*Consumer, error) {
	if o.Group == "" {
		return nil, errors.New("a consumer group is needed (--group)")
	}
	ck, err := kafka.ReadCheckpoint(ctx, o.Address)
	if err != nil {
		return nil, err
	}
	if ck == nil {
		return nil, fmt.Errorf("%s is no Tidemark output yet (its checkpoint topic %s holds no checkpoint): run tidemark sync --to %s first, or check the prefix",
			o.Address, kafka.CheckpointTopic(o.Address.Prefix), o.Address)
	}
	if strings.HasPrefix(ck.Format, "debezium") {
		return nil, fmt.Errorf("%s holds records in the Debezium format: tidemark consume reads the tidemark format; read it with a Debezium consumer (Kafka Connect, Flink's debezium-json), or sync into another prefix without --format debezium", o.Address)
	}
	conn, err := pgconf.OpenDefaultSSL(ctx, o.Target, "tidemark-consume")
	if err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	c := &Consumer{o: o, conn: conn, types: pgjson.NewRegistry(conn), parts: map[string]int32{}, tables: map[string]*table{},
		pos: map[tp]int64{}, buf: map[tp][]*kgo.Record{}, block: map[tp]mark{}, paused: map[tp]bool{}, assigned: map[tp]int64{}}
	fail := func(err error) (*Consumer, error) {
		c.close()
		return nil, err
	}
	if err := c.ownTables(ctx); err != nil {
		return fail(err)
	}
	if err := c.notSource(ctx, ck.Position); err != nil {
		return fail(err)
	}
	var topics []string
	for t, n := range ck.Topics {
		topics = append(topics, t)
		c.parts[t] = n
	}
	slices.Sort(topics)
	if len(topics) == 0 {
		return fail(fmt.Errorf("%s has no table topics yet: run tidemark sync --to %s first", o.Address, o.Address))
	}
	opts, err := o.Address.ClientOpts()
	if err != nil {
		return fail(err)
	}
	admCl, err := kgo.NewClient(opts...)
	if err != nil {
		return fail(err)
	}
	c.adm = kadm.NewClient(admCl)
	if err := c.notCompacted(ctx, topics); err != nil {
		return fail(err)
	}
	c.cl, err = kgo.NewClient(append(opts,
		kgo.ConsumerGroup(o.Group),
		// A member killed holds its tables until the group gives up on it (Options).
		kgo.SessionTimeout(orDefault(o.SessionTimeout, 10*time.Second)),
		kgo.HeartbeatInterval(min(time.Second, orDefault(o.SessionTimeout, 10*time.Second)/3, orDefault(o.RebalanceTimeout, 30*time.Second)/3)),
		kgo.RebalanceTimeout(orDefault(o.RebalanceTimeout, 30*time.Second)),
		kgo.ConsumeTopics(topics...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// An offset out of range (records deleted under the consumer, a topic made again) is an
		// error, not a jump to the log's start or end: either would skip records.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.KeepControlRecords(),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.Balancers(tableBalancer{}),
		kgo.AdjustFetchOffsetsFn(c.adjust),
		kgo.OnPartitionsRevoked(c.revoke),
		kgo.OnPartitionsLost(c.revoke),
	)...)
	if err != nil {
		return fail(err)
	}
	return c, nil
}

func (c *Consumer) close() {
	if c.cl != nil {
		c.cl.Close() // leaves the group: its tables go to the other members at once
	}
	if c.adm != nil {
		c.adm.Close()
	}
	if c.conn != nil {
		_ = c.conn.Close(context.Background())
	}
}

// ownTables creates the consumer's tables on the target when missing (only then: a role
// without CREATE on public uses tables made for it).
func (c *Consumer) ownTables(ctx context.Context) error {
	for _, t := range []struct{ name, def string }{
		{OffsetsTable, `(group_id text NOT NULL, topic text NOT NULL, partition integer NOT NULL,
			next_offset bigint NOT NULL, updated timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (group_id, topic, partition))`},
		{TablesTable, `(target_table text PRIMARY KEY, group_id text NOT NULL, topic text NOT NULL, source_table text NOT NULL)`},
	} {
		var exists bool
		if err := c.conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.name).Scan(&exists); err != nil {
			return fmt.Errorf("target: %w", err)
		}
		if exists {
			continue
		}
		// Members starting at once would race to create it (CREATE TABLE IF NOT EXISTS is not
		// safe against a concurrent one): one at a time.
		q := `CREATE TABLE IF NOT EXISTS ` + t.name + ` ` + t.def
		err := pgx.BeginFunc(ctx, c.conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('tidemark consume tables', 0))`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, q)
			return err
		})
		if err != nil {
			return fmt.Errorf("create the consumer's table on the target: %w (the target role needs CREATE on schema public, or create it first: %s)", err, q)
		}
	}
	return nil
}

// notCompacted refuses compacted topics: compaction keeps a key's last record only, so a
// consumer would miss deletes (tombstones go too), and the truncates and refreshes, all under
// one key, would be kept in some partitions and not in others.
func (c *Consumer) notCompacted(ctx context.Context, topics []string) error {
	rcs, err := c.adm.DescribeTopicConfigs(ctx, topics...)
	if err != nil {
		return fmt.Errorf("describe the topics of %s: %w", c.o.Address, err)
	}
	for _, rc := range rcs {
		if errors.Is(rc.Err, kerr.UnknownTopicOrPartition) {
			continue // a table the output no longer captures, whose topic was deleted: never read
		}
		if rc.Err != nil {
			return fmt.Errorf("describe topic %s: %w", rc.Name, rc.Err)
		}
		for _, cfg := range rc.Configs {
			if cfg.Key == "cleanup.policy" && cfg.Value != nil && strings.Contains(*cfg.Value, "compact") {
				return fmt.Errorf("topic %s is compacted (cleanup.policy=%s): compaction keeps a key's last record only, so a consumer would miss deletes and the table's truncates would be kept in some partitions and not others; tidemark consume reads an output synced without --kafka-compact",
					rc.Name, *cfg.Value)
			}
		}
	}
	return nil
}

// notSource refuses a target that is the output's own source database: what the consumer
// applies would be captured again, and come back, without end.
// It compares the target's system identifier and database with the source's, which the
// output's checkpoint records; a target role that may not read the system identifier
// (pg_control_system) is not checked, and the log says so.
func (c *Consumer) notSource(ctx context.Context, pos *merge.Position) error {
	if pos == nil || pos.SystemID == "" {
		return nil
	}
	var sysid, db string
	err := c.conn.QueryRow(ctx, `SELECT system_identifier::text, current_database() FROM pg_control_system()`).Scan(&sysid, &db)
	if err != nil {
		c.o.Log.Warn().Err(err).Msg("could not read the target's system identifier: whether the target is the output's source database is not checked")
		return nil
	}
	if sysid == pos.SystemID && db == pos.Database {
		return fmt.Errorf("the target is database %s of the server the output %s captures (system identifier %s): what the consumer applies would be captured again and come back without end; give a target on another server or database",
			db, c.o.Address, sysid)
	}
	return nil
}

// adjust runs in the group's goroutine when partitions are assigned: it reads their offsets
// from the target (over a connection of its own), and starts each partition there.
func (c *Consumer) adjust(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	conn, err := pgconf.OpenDefaultSSL(ctx, c.o.Target, "tidemark-consume")
	if err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var topics []string
	for t, ps := range offsets {
		topics = append(topics, t)
		for p := range ps {
			if _, err := conn.Exec(ctx, `INSERT INTO `+OffsetsTable+` (group_id, topic, partition, next_offset) VALUES ($1, $2, $3, -1) ON CONFLICT DO NOTHING`,
				c.o.Group, t, p); err != nil {
				return nil, fmt.Errorf("target: %w", err)
			}
		}
	}
	stored, err := scanOffsets(conn.Query(ctx, `SELECT topic, partition, next_offset FROM `+OffsetsTable+` WHERE group_id = $1 AND topic = ANY($2)`, c.o.Group, topics))
	if err != nil {
		return nil, err
	}
	starts, err := c.adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list the start offsets of %v: %w", topics, err)
	}
	ends, err := c.adm.ListEndOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list the end offsets of %v: %w", topics, err)
	}
	out := map[string]map[int32]kgo.Offset{}
	got := map[tp]int64{}
	var fatal error
	for t, ps := range offsets {
		out[t] = map[int32]kgo.Offset{}
		for p := range ps {
			k := tp{t, p}
			v := stored[k]
			start, _ := starts.Lookup(t, p)
			if start.Offset > max(v, 0) && fatal == nil {
				from := "its start"
				if v >= 0 {
					from = "offset " + strconv.FormatInt(v, 10)
				}
				fatal = fmt.Errorf("topic %s partition %d starts at offset %d, and group %s has applied it up to %s: the records between were deleted (retention) before the target got them; start the target over (empty its tables, drop the group's rows of %s) from a sync that re-backfills them (--rebackfill), and give the topics a retention that outlasts the consumer's downtime",
					t, p, start.Offset, c.o.Group, from, OffsetsTable)
			}
			if end, _ := ends.Lookup(t, p); v > end.Offset && fatal == nil {
				fatal = fmt.Errorf("group %s has applied topic %s partition %d up to offset %d, and the partition ends at %d: the topic was deleted and made again (another output under the same prefix); start the target over (empty its tables, drop the group's rows of %s), or give this output's consumers another group",
					c.o.Group, t, p, v, end.Offset, OffsetsTable)
			}
			// An exact offset, never "the start": records deleted after the check above make
			// the fetch fail (out of range) instead of starting past them.
			out[t][p] = kgo.NewOffset().At(max(v, 0)).WithEpoch(-1)
			got[k] = v
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range got {
		c.assigned[k] = v
	}
	if fatal != nil && c.fatal == nil {
		c.fatal = fatal
	}
	return out, nil
}

// revoke runs in the group's goroutine when partitions are taken away.
func (c *Consumer) revoke(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range lost {
		for _, p := range ps {
			c.revoked = append(c.revoked, tp{t, p})
			delete(c.assigned, tp{t, p})
		}
	}
}

// take applies what the group's callbacks handed over since the last poll.
func (c *Consumer) take() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.revoked {
		delete(c.pos, k)
		delete(c.buf, k)
		delete(c.block, k)
	}
	c.throttle()
	c.revoked = nil
	for k, v := range c.assigned {
		c.pos[k], c.buf[k] = v, nil
		delete(c.block, k)
		c.o.Log.Info().Str("topic", k.topic).Int32("partition", k.part).Int64("from", v).Msg("partition assigned")
	}
	clear(c.assigned)
	if c.fatal != nil {
		return c.fatal
	}
	// A topic is held whole (the barrier needs every partition), with the partitions the
	// output's checkpoint recorded (a key's partition depends on their number).
	held := map[string]int32{}
	for k := range c.pos {
		if k.part < 0 || k.part >= c.parts[k.topic] {
			return fmt.Errorf("topic %s has a partition %d, and had %d partitions when the output last wrote it: partitions were added (keys moved between them) or the topic was made again; start the output and the target over",
				k.topic, k.part, c.parts[k.topic])
		}
		held[k.topic]++
	}
	for t, n := range held {
		if n != c.parts[t] {
			return fmt.Errorf("this member of group %s was given %d of the %d partitions of topic %s: the group has members that share a table's partitions (not tidemark consume's protocol %s); give this consumer a group of its own",
				c.o.Group, n, c.parts[t], t, BalancerName)
		}
	}
	return nil
}

func (c *Consumer) run(ctx context.Context) error {
	if c.o.StopWhenCaughtUp {
		if err := c.setGoal(ctx); err != nil {
			return err
		}
	}
	lastList, lastCheck := time.Now(), time.Now()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := c.cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			c.cl.AllowRebalance()
			return nil
		}
		if err := c.take(); err != nil {
			c.cl.AllowRebalance()
			return err
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			switch {
			case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			case errors.Is(err, kerr.OffsetOutOfRange):
				if ferr == nil {
					ferr = fmt.Errorf("read topic %s partition %d: %w: the records the group was to apply next are gone (deleted by retention, or the topic made again); start the target over (empty its tables, drop the group's rows of %s) from a sync that re-backfills them",
						t, p, err, OffsetsTable)
				}
			case errors.As(err, new(*kgo.ErrDataLoss)):
				if ferr == nil {
					ferr = fmt.Errorf("read topic %s partition %d: %w: the brokers lost records the group may have applied (an unclean leader election); start the target over (empty its tables, drop the group's rows of %s) from a sync that re-backfills them",
						t, p, err, OffsetsTable)
				}
			case errors.Is(err, kerr.InconsistentGroupProtocol), errors.Is(err, kerr.InvalidSessionTimeout),
				errors.Is(err, kerr.GroupMaxSizeReached), errors.Is(err, kerr.InvalidGroupID):
				if ferr == nil {
					ferr = fmt.Errorf("join group %s: %w (a group of tidemark consume members only, a --session-timeout (%s) that the brokers allow (group.min.session.timeout.ms, 6 s by default, to group.max.session.timeout.ms, 30 min), room for one more member)", c.o.Group, err, orDefault(c.o.SessionTimeout, 10*time.Second))
				}
			case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.GroupAuthorizationFailed),
				errors.Is(err, kerr.ClusterAuthorizationFailed), errors.Is(err, kerr.SaslAuthenticationFailed):
				if ferr == nil {
					ferr = fmt.Errorf("read %s: %w (the consumer's principal needs READ and DESCRIBE on the output's topics, %s.* or %s itself, and READ on group %s)",
						c.o.Address, err, c.o.Address.Prefix, c.o.Address.Prefix, c.o.Group)
				}
			default:
				// The client retries by itself (brokers away, a group that is rebalancing):
				// said, and waited for.
				c.o.Log.Warn().Err(err).Str("topic", t).Int32("partition", p).Msg("reading the output")
			}
		})
		if ferr != nil {
			c.cl.AllowRebalance()
			return ferr
		}
		fs.EachPartition(func(f kgo.FetchTopicPartition) {
			k := tp{f.Topic, f.Partition}
			pos, ok := c.pos[k]
			if !ok {
				return // not (or no longer) this member's
			}
			// A record before the next one to buffer was fetched before a seek (or twice).
			if b := c.buf[k]; len(b) > 0 {
				pos = b[len(b)-1].Offset + 1
			}
			for _, r := range f.Records {
				if r.Offset >= pos {
					c.buf[k] = append(c.buf[k], r)
					pos = r.Offset + 1
				}
			}
		})
		n, err := c.step(ctx)
		c.throttle()
		c.cl.AllowRebalance()
		if err != nil {
			return err
		}
		if time.Since(lastList) > 30*time.Second {
			lastList = time.Now()
			if err := c.newTopics(ctx); err != nil {
				return err
			}
		}
		if c.o.StopWhenCaughtUp && (n == 0 || time.Since(lastCheck) > 5*time.Second) {
			lastCheck = time.Now()
			done, err := c.caughtUp(ctx)
			if err != nil || done {
				return err
			}
		}
	}
}

// throttle pauses the fetching of the partitions stopped at a truncate or refresh (their
// records wait in memory until the topic's other partitions reach it), and resumes the others.
func (c *Consumer) throttle() {
	pause, resume := map[string][]int32{}, map[string][]int32{}
	for k := range c.paused {
		if _, b := c.block[k]; !b {
			resume[k.topic] = append(resume[k.topic], k.part)
			delete(c.paused, k)
		}
	}
	for k := range c.block {
		if !c.paused[k] {
			pause[k.topic] = append(pause[k.topic], k.part)
			c.paused[k] = true
		}
	}
	if len(pause) > 0 {
		c.cl.PauseFetchPartitions(pause)
	}
	if len(resume) > 0 {
		c.cl.ResumeFetchPartitions(resume)
	}
}

// newTopics adds the topics of tables the output got since the consumer started: those its
// checkpoint lists (no other topic under the prefix is taken: a prefix may be the start of
// another output's).
func (c *Consumer) newTopics(ctx context.Context) error {
	ck, err := kafka.ReadCheckpoint(ctx, c.o.Address)
	if err != nil || ck == nil {
		return nil // the next try may reach the brokers
	}
	var add []string
	for name, n := range ck.Topics {
		if _, ok := c.parts[name]; !ok && n > 0 {
			add = append(add, name)
		}
	}
	if len(add) == 0 {
		return nil
	}
	slices.Sort(add)
	if err := c.notCompacted(ctx, add); err != nil {
		return err
	}
	for _, name := range add {
		c.parts[name] = ck.Topics[name]
	}
	c.o.Log.Info().Strs("topics", add).Msg("consuming the topics of tables added to the output")
	c.cl.AddConsumeTopics(add...)
	return nil
}

// setGoal takes the last stable offset of every partition of the output now: the group is
// caught up once its offsets reached them.
func (c *Consumer) setGoal(ctx context.Context) error {
	var topics []string
	for t := range c.parts {
		topics = append(topics, t)
	}
	ends, err := c.adm.ListCommittedOffsets(ctx, topics...)
	if err != nil {
		return fmt.Errorf("list the end offsets of %v: %w", topics, err)
	}
	starts, err := c.adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return fmt.Errorf("list the start offsets of %v: %w", topics, err)
	}
	c.goal = map[tp]int64{}
	var lerr error
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			if lerr == nil && !errors.Is(o.Err, kerr.UnknownTopicOrPartition) {
				lerr = fmt.Errorf("topic %s partition %d: %w", o.Topic, o.Partition, o.Err)
			}
			return
		}
		if s, ok := starts.Lookup(o.Topic, o.Partition); ok && s.Err == nil && o.Offset <= s.Offset {
			return // empty
		}
		c.goal[tp{o.Topic, o.Partition}] = o.Offset
	})
	return lerr
}

// caughtUp says whether the group's offsets on the target reached the goal.
func (c *Consumer) caughtUp(ctx context.Context) (bool, error) {
	have, err := scanOffsets(c.conn.Query(ctx, `SELECT topic, partition, next_offset FROM `+OffsetsTable+` WHERE group_id = $1`, c.o.Group))
	if err != nil {
		return false, err
	}
	for k, want := range c.goal {
		if have[k] < want {
			return false, nil
		}
	}
	c.o.Log.Info().Str("group", c.o.Group).Int64("applied", c.applied).Msg("caught up")
	return true, nil
}

// scanOffsets reads rows of (topic, partition, next_offset).
func scanOffsets(rows pgx.Rows, err error) (map[tp]int64, error) {
	if err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	out := map[tp]int64{}
	var k tp
	var v int64
	if _, err := pgx.ForEachRow(rows, []any{&k.topic, &k.part, &v}, func() error { out[k] = v; return nil }); err != nil {
		return nil, fmt.Errorf("target: read the group's offsets: %w", err)
	}
	return out, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
