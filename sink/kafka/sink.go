package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/sink"
	"github.com/tidemark/tidemark/sink/debezium"
	"github.com/tidemark/tidemark/sink/jsonl"
)

var _ sink.Output = (*Sink)(nil)

// Options configure a Kafka output.
type Options struct {
	Address Address
	// Tables are the captured tables (schema.table): each gets its topic, created or checked
	// when the output opens, before anything is written.
	Tables []string
	// Partitions and Replication are a new topic's; 0 (or -1) takes the broker's default.
	Partitions  int32
	Replication int16
	// SingleTopic writes every table's records to one topic, PREFIX itself, the table in the
	// tidemark.table header (--kafka-topic single), instead of a topic per table.
	SingleTopic bool
	// Compact creates the tables' topics compacted (cleanup.policy=compact): a key's last record
	// stays, a deleted key's tombstone goes after the broker's delete.retention.ms.
	Compact bool
	// TransactionTimeout is the Kafka transaction timeout: one checkpoint's records must be
	// written within it. The broker caps it (transaction.max.timeout.ms, 15 minutes by default).
	TransactionTimeout time.Duration
	// MaxRecordBytes bounds a batch of records, and so a record (the producer's
	// ProducerBatchMaxBytes): it must not pass the topics' max.message.bytes. Zero: 1000012,
	// Kafka's default.
	MaxRecordBytes int32
	// Slot is the replication slot of the capture: a checkpoint of another slot is refused
	// before this output takes over the prefix.
	Slot  string
	Types *pgjson.Registry
	Log   zerolog.Logger
	// Debezium, when set, writes Debezium's key and envelope records instead of Tidemark's
	// lines (--format debezium); a delete is then its envelope followed by a tombstone, as
	// Debezium writes it.
	Debezium *debezium.Encoder
}

// CheckpointVersion is the version of the checkpoint record this package writes for an output of
// a topic per table; CheckpointVersionSingle for one of a single topic, which an earlier
// Tidemark (that knows no layout, and would write per-table topics) refuses. Both are read.
const (
	CheckpointVersion       = 1
	CheckpointVersionSingle = 2
)

// Checkpoint is the value of a checkpoint record: the engine's position, and the partition
// count of each topic the output writes (a key's partition depends on it).
type Checkpoint struct {
	Version  int              `json:"version"`
	Output   string           `json:"output"`   // the prefix
	Slot     string           `json:"slot"`     // the capture's slot, also before its first position
	Format   string           `json:"format"`   // "tidemark", or debezium.Encoder.Format: what the records hold
	Layout   string           `json:"layout"`   // "table" (a topic per table; "" before it was recorded) or "single" (one topic, PREFIX)
	Position *merge.Position  `json:"position"` // nil: none yet (the topics were created)
	Topics   map[string]int32 `json:"topics"`
	Time     time.Time        `json:"time"`
}

// The record headers.
const (
	HeaderOp    = "tidemark.op"    // the event's op, as the JSON line names it (insert, update, delete, ...)
	HeaderLSN   = "tidemark.lsn"   // the commit LSN of its source transaction (or its chunk's high watermark)
	HeaderSeq   = "tidemark.seq"   // its order among the events of that LSN
	HeaderTable = "tidemark.table" // schema.table, as the source names it
)

// BroadcastKey is the key of a record that concerns every key of its table (a truncate, a
// refresh), sent to every partition: no row's key is an empty object (a table has a key of one
// column at least), and a compacted topic takes no record without a key.
const BroadcastKey = "{}"

// CheckpointTopic is the name of the output's checkpoint topic.
func CheckpointTopic(prefix string) string { return prefix + ".tidemark-checkpoint" }

// SingleTopic is the topic of an output written with one topic for every table: the prefix.
func SingleTopic(prefix string) string { return prefix }

// Layouts of an output's topics.
const (
	LayoutTable  = "table"
	LayoutSingle = "single"
)

// TransactionalID is the output's Kafka transactional id: one per prefix, so that a second
// writer of the prefix fences the first.
func TransactionalID(prefix string) string { return "tidemark-" + prefix }

var badTopicChars = regexp.MustCompile(`[^a-zA-Z0-9_-]`)

// TopicOf is the topic of table schema.table: PREFIX.SCHEMA.TABLE, each character Kafka does not
// take in a topic name (and '.') written '_'.
func TopicOf(prefix, schema, table string) string {
	return prefix + "." + badTopicChars.ReplaceAllString(schema, "_") + "." + badTopicChars.ReplaceAllString(table, "_")
}

// Sink writes events to Kafka, exactly once up to its checkpoint: a transactional producer
// writes the events since the last checkpoint and the checkpoint record in one transaction.
type Sink struct {
	o      Options
	cl     *kgo.Client // the transactional producer; the merge loop's alone
	adm    *kadm.Client
	enc    *jsonl.Encoder
	topics map[string]int32  // topic: partitions
	tables map[string]string // schema.table: topic
	inTxn  bool
	buf    []byte
	// ctx is the records' context: ending the engine's run does not fail records already
	// produced (the open transaction is aborted whole by Close); Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	txnStart time.Time // when the open transaction's first record was produced

	mu    sync.Mutex
	err   error // the first record that failed since the transaction began
	epoch int64 // the producer id and epoch of the transaction's first acknowledged record, +1; 0: none yet
}

// Open opens (or resumes) the Kafka output: it reads the checkpoint the prefix holds, checks
// it belongs to this slot, calls ready (the slot idle), takes the prefix over (the transactional
// id's new epoch fences a writer still running, and aborts its open transaction), reads the
// checkpoint again now that nobody else can write it, and creates or checks the tables' topics.
// It returns the position to resume from (nil for a first run).
func Open(ctx context.Context, o Options, ready func() error) (*Sink, *merge.Position, error) {
	if o.TransactionTimeout == 0 {
		o.TransactionTimeout = time.Minute
	}
	if o.MaxRecordBytes == 0 {
		o.MaxRecordBytes = 1000012
	}
	if o.SingleTopic && o.Compact {
		return nil, nil, errors.New("one topic for every table cannot be compacted: two tables' rows of the same key would compact into one")
	}
	if o.SingleTopic && strings.HasSuffix(o.Address.Prefix, ".tidemark-checkpoint") {
		return nil, nil, fmt.Errorf("%s: with --kafka-topic single the topic is the prefix itself, and this one is another output's checkpoint topic; give another prefix", o.Address)
	}
	opts, err := o.Address.ClientOpts()
	if err != nil {
		return nil, nil, err
	}
	admCl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, nil, err
	}
	s := &Sink{o: o, adm: kadm.NewClient(admCl), enc: jsonl.NewEncoder(o.Types), topics: map[string]int32{}, tables: map[string]string{}}
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	fail := func(err error) (*Sink, *merge.Position, error) {
		s.Close(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	ckTopic := CheckpointTopic(o.Address.Prefix)
	if err := s.ensureCheckpointTopic(ctx, ckTopic); err != nil {
		return fail(err)
	}
	// Before taking the prefix over: a checkpoint of another slot means another capture owns
	// it, and fencing it would stop that capture for nothing.
	ck, err := s.readCheckpoint(ctx)
	if err != nil {
		return fail(err)
	}
	if err := s.checkOwner(ck); err != nil {
		return fail(err)
	}
	if err := ready(); err != nil {
		return fail(err)
	}
	s.cl, err = kgo.NewClient(append(opts,
		kgo.TransactionalID(TransactionalID(o.Address.Prefix)),
		kgo.TransactionTimeout(o.TransactionTimeout),
		kgo.RecordPartitioner(s.partitioner()),
		kgo.ProducerBatchMaxBytes(o.MaxRecordBytes),
		kgo.RecordDeliveryTimeout(o.TransactionTimeout),
		kgo.ProducerLinger(5*time.Millisecond),
	)...)
	if err != nil {
		return fail(err)
	}
	// Loading the producer id bumps the transactional id's epoch: a writer still running is
	// fenced (its next commit fails) and its open transaction aborted.
	if _, _, err := s.cl.ProducerID(ctx); err != nil {
		return fail(fmt.Errorf("take over %s (transactional id %s): %w", o.Address, TransactionalID(o.Address.Prefix), err))
	}
	if ck, err = s.readCheckpoint(ctx); err != nil {
		return fail(err)
	}
	if err := s.checkOwner(ck); err != nil {
		return fail(err)
	}
	var pos *merge.Position
	known := map[string]int32{}
	if ck != nil {
		pos, known = ck.Position, ck.Topics
		held := ck.Format
		if held == "" {
			held = "tidemark"
		}
		if held != s.format() && len(known) > 0 && pos != nil {
			return fail(fmt.Errorf("%s holds records in the %s format (its checkpoint says so): a run with --format %s would mix two formats in its topics; give %s, or another prefix",
				o.Address, held, s.format(), debezium.Continue(held)))
		}
		layout := ck.Layout
		if layout == "" {
			layout = LayoutTable
		}
		if layout != s.layout() && pos == nil {
			// A first run of the other layout, killed before its first position: its topics
			// hold aborted records only, and are not this output's.
			kept := map[string]int32{}
			for t, n := range known {
				if (t == SingleTopic(o.Address.Prefix)) == o.SingleTopic {
					kept[t] = n
				}
			}
			known = kept
		}
		if layout != s.layout() && len(known) > 0 && pos != nil {
			return fail(fmt.Errorf("%s holds its records with --kafka-topic %s (its checkpoint says so): a run with --kafka-topic %s would split the output's history between two layouts; give --kafka-topic %s, or another prefix",
				o.Address, layout, s.layout(), layout))
		}
	}
	created, err := s.ensureTopics(ctx, known)
	if err != nil {
		return fail(err)
	}
	if created {
		// The topics are the output's from their creation: a run killed before its first
		// checkpoint leaves topics with aborted records only, which the next run takes as its own.
		if err := s.Checkpoint(ctx, pos); err != nil {
			return fail(err)
		}
	}
	return s, pos, nil
}

func (s *Sink) checkOwner(ck *Checkpoint) error {
	if ck == nil || s.o.Slot == "" {
		return nil
	}
	slot := ck.Slot
	if ck.Position != nil && ck.Position.Slot != "" {
		slot = ck.Position.Slot
	}
	if slot == "" || slot == s.o.Slot {
		return nil
	}
	return fmt.Errorf("%s holds the checkpoint of slot %s, not %s: it is another capture's output; give this capture another prefix, or run it with --slot %s",
		s.o.Address, slot, s.o.Slot, slot)
}

// ensureCheckpointTopic creates the checkpoint topic (one partition, compacted) if it is missing.
func (s *Sink) ensureCheckpointTopic(ctx context.Context, topic string) error {
	td, err := s.adm.ListTopics(ctx, topic)
	if err != nil {
		return unavailable(fmt.Errorf("reach %s: %w%s", s.o.Address, err, s.o.Address.hint(err)))
	}
	if t, ok := td[topic]; ok && t.Err == nil {
		if len(t.Partitions) != 1 {
			return fmt.Errorf("checkpoint topic %s has %d partitions, not 1: it is not Tidemark's; delete it or give another prefix", topic, len(t.Partitions))
		}
		return nil
	}
	resp, err := s.adm.CreateTopic(ctx, 1, s.o.Replication, map[string]*string{"cleanup.policy": ptr("compact")}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create the checkpoint topic %s: %w", topic, err)
	}
	return nil
}

// readCheckpoint reads the prefix's last committed checkpoint record (nil: none).
func (s *Sink) readCheckpoint(ctx context.Context) (*Checkpoint, error) {
	ctx, cancel := s.readDeadline(ctx)
	defer cancel()
	return ReadCheckpoint(ctx, s.o.Address)
}

// readDeadline bounds a read at open: a transaction another writer holds open ends within the
// transaction timeout (the brokers abort it then), so a read still waiting well after that is
// stuck.
func (s *Sink) readDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	d := s.o.TransactionTimeout + time.Minute
	return context.WithTimeoutCause(ctx, d, fmt.Errorf("%w: could not read %s to its last stable offset within %s (a transaction held open longer than the transaction timeout, or records deleted under the read)", pgerr.ErrTimeout, s.o.Address, d))
}

// ReadCheckpoint reads the last committed checkpoint record of the output at addr (nil: none),
// as a read_committed consumer sees it.
func ReadCheckpoint(ctx context.Context, addr Address) (*Checkpoint, error) {
	var last []byte
	topic := CheckpointTopic(addr.Prefix)
	err := ReadCommitted(ctx, addr, []string{topic}, func(r *kgo.Record) error {
		if string(r.Key) == addr.Prefix {
			last = r.Value
		}
		return nil
	})
	if err != nil {
		return nil, unavailable(fmt.Errorf("read the checkpoint topic %s: %w", topic, err))
	}
	if last == nil {
		return nil, nil
	}
	var ck Checkpoint
	if err := json.Unmarshal(last, &ck); err != nil {
		return nil, fmt.Errorf("checkpoint topic %s: the last checkpoint of %s is damaged (%v): start over with another prefix", topic, addr.Prefix, err)
	}
	if (ck.Version != CheckpointVersion && ck.Version != CheckpointVersionSingle) || ck.Output != addr.Prefix {
		return nil, fmt.Errorf("checkpoint topic %s: the last checkpoint is version %d of output %q; this is version %d of %q", topic, ck.Version, ck.Output, CheckpointVersion, addr.Prefix)
	}
	return &ck, nil
}

// ensureTopics creates the tables' topics that are missing, and checks those that exist: a
// topic the checkpoint lists must have the partitions it had (a key's partition depends on
// their number: with more, a key's next changes would go to another partition than its earlier
// ones, and be read out of order); one it does not list must hold no records (they would be
// another output's, or from before). It reports whether it created any.
func (s *Sink) ensureTopics(ctx context.Context, known map[string]int32) (bool, error) {
	owner := map[string]string{CheckpointTopic(s.o.Address.Prefix): "the checkpoint"}
	var names []string
	for _, t := range s.o.Tables {
		if s.o.SingleTopic {
			s.tables[t] = SingleTopic(s.o.Address.Prefix)
			continue
		}
		schema, table, _ := cut(t)
		topic := TopicOf(s.o.Address.Prefix, schema, table)
		if other, ok := owner[topic]; ok {
			return false, fmt.Errorf("tables %s and %s would both go to topic %s (Kafka takes only letters, digits, '_' and '-' in names, the rest written '_'): capture them with different prefixes", other, t, topic)
		}
		owner[topic] = t
		s.tables[t] = topic
		names = append(names, topic)
	}
	if s.o.SingleTopic {
		names = []string{SingleTopic(s.o.Address.Prefix)}
	}
	td, err := s.adm.ListTopics(ctx, names...)
	if err != nil {
		return false, unavailable(fmt.Errorf("list topics: %w", err))
	}
	var missing, unlisted []string
	for _, topic := range names {
		t, ok := td[topic]
		if !ok || errors.Is(t.Err, kerr.UnknownTopicOrPartition) {
			if _, wrote := known[topic]; wrote {
				return false, fmt.Errorf("topic %s, which this output wrote, is gone: the changes it held are lost to its consumers; start the output over (delete the topic %s and the checkpoint topic %s, or give another prefix)",
					topic, topic, CheckpointTopic(s.o.Address.Prefix))
			}
			missing = append(missing, topic)
			continue
		}
		if t.Err != nil {
			return false, fmt.Errorf("topic %s: %w", topic, t.Err)
		}
		n := int32(len(t.Partitions))
		if was, ok := known[topic]; ok {
			if was != n {
				return false, fmt.Errorf("topic %s has %d partitions, but had %d when this output last wrote it: a key's changes would now go to another partition than its earlier ones, and be read out of order; start the output over with another prefix (or give the topic back its %d partitions)",
					topic, n, was, was)
			}
		} else {
			unlisted = append(unlisted, topic)
		}
		s.topics[topic] = n
	}
	// The topics of tables this run does not capture stay in the checkpoint: a table captured
	// again later finds its topic the output's.
	for topic, n := range known {
		if _, ok := s.topics[topic]; !ok && !slices.Contains(names, topic) {
			s.topics[topic] = n
		}
	}
	if len(unlisted) > 0 {
		// Topics this output did not create: only empty ones are taken (what a run killed before
		// its first checkpoint left holds aborted records only).
		held := map[string]bool{}
		rctx, cancel := s.readDeadline(ctx)
		err := ReadCommitted(rctx, s.o.Address, unlisted, func(r *kgo.Record) error {
			held[r.Topic] = true
			return nil
		})
		cancel()
		if err != nil {
			return false, unavailable(err)
		}
		for _, topic := range unlisted {
			if held[topic] {
				return false, fmt.Errorf("topic %s exists and holds records that no checkpoint of %s accounts for (another output's, or a run's from before): delete the topic, or give this output another prefix",
					topic, s.o.Address)
			}
			s.o.Log.Info().Str("topic", topic).Int32("partitions", s.topics[topic]).Msg("writing to a topic that exists, empty")
		}
	}
	if s.o.SingleTopic && len(missing) == 0 {
		// One topic of every table must not be compacted (two tables' rows of one key would
		// compact into one); one made beforehand is checked.
		rcs, err := s.adm.DescribeTopicConfigs(ctx, names...)
		if err != nil {
			return false, unavailable(fmt.Errorf("describe topic %v: %w", names, err))
		}
		for _, rc := range rcs {
			for _, c := range rc.Configs {
				if c.Key == "cleanup.policy" && c.Value != nil && strings.Contains(*c.Value, "compact") {
					return false, fmt.Errorf("topic %s is compacted (cleanup.policy=%s): with --kafka-topic single two tables' rows of one key would compact into one; set cleanup.policy=delete on it, or give another prefix", rc.Name, *c.Value)
				}
			}
		}
	}
	if len(missing) == 0 {
		return len(unlisted) > 0, nil
	}
	configs := map[string]*string{}
	if s.o.Compact {
		configs["cleanup.policy"] = ptr("compact")
	}
	if s.o.SingleTopic {
		configs["cleanup.policy"] = ptr("delete") // whatever the brokers' default: never compacted
	}
	partitions := s.o.Partitions
	if partitions == 0 {
		partitions = -1
	}
	resp, err := s.adm.CreateTopics(ctx, partitions, s.o.Replication, configs, missing...)
	if err != nil {
		return false, unavailable(fmt.Errorf("create topics %v: %w", missing, err))
	}
	for _, r := range resp.Sorted() {
		if r.Err != nil {
			return false, fmt.Errorf("create topic %s: %w (%s)", r.Topic, r.Err, r.ErrMessage)
		}
		s.topics[r.Topic] = r.NumPartitions
		s.o.Log.Info().Str("topic", r.Topic).Int32("partitions", r.NumPartitions).Msg("created topic")
	}
	// CreateTopics may answer before every broker knows the topic: wait until its partitions
	// are listed.
	for _, topic := range missing {
		if s.topics[topic] > 0 {
			continue
		}
		for try := 0; ; try++ {
			td, err := s.adm.ListTopics(ctx, topic)
			if err == nil && td[topic].Err == nil && len(td[topic].Partitions) > 0 {
				s.topics[topic] = int32(len(td[topic].Partitions))
				break
			}
			if try == 50 {
				return false, fmt.Errorf("topic %s was created but is not listed", topic)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return true, nil
}

func cut(t string) (string, string, bool) {
	for i := 0; i < len(t); i++ {
		if t[i] == '.' {
			return t[:i], t[i+1:], true
		}
	}
	return "", t, false
}

func ptr(s string) *string { return &s }

func (s *Sink) layout() string {
	if s.o.SingleTopic {
		return LayoutSingle
	}
	return LayoutTable
}

func (s *Sink) format() string {
	if s.o.Debezium != nil {
		return s.o.Debezium.Format()
	}
	return "tidemark"
}

// Emit produces the events' records in the open transaction (beginning one if none is).
func (s *Sink) Emit(ctx context.Context, events []merge.Event) error {
	if err := s.begin(); err != nil {
		return err
	}
	if s.o.Debezium != nil {
		return s.emitDebezium(ctx, events)
	}
	for i := range events {
		ev := &events[i]
		topic, headers, err := s.route(ev)
		if err != nil {
			return err
		}
		switch ev.Op {
		case merge.Truncate, merge.Refresh:
			// Every key of the table is concerned: the record goes to every partition, so that
			// each partition's consumer meets it in order with that partition's keys.
			line, err := s.enc.Append(ctx, nil, ev)
			if err != nil {
				return err
			}
			line = line[:len(line)-1]
			for p := range s.topics[topic] {
				s.produce(ctx, &kgo.Record{Topic: topic, Partition: p, Key: []byte(BroadcastKey), Value: line, Headers: headers})
			}
			continue
		case merge.Delete:
			// A tombstone: the key and no value, so that a compacted topic forgets the key.
			key, err := s.enc.AppendKey(ctx, nil, ev)
			if err != nil {
				return err
			}
			s.produce(ctx, &kgo.Record{Topic: topic, Key: key, Headers: headers})
			continue
		}
		s.buf, err = s.enc.Append(ctx, s.buf[:0], ev)
		if err != nil {
			return err
		}
		key, err := s.enc.AppendKey(ctx, nil, ev)
		if err != nil {
			return err
		}
		value := slices.Clone(s.buf[:len(s.buf)-1])
		s.produce(ctx, &kgo.Record{Topic: topic, Key: key, Value: value, Headers: headers})
	}
	return s.classify(s.failed())
}

// route is the topic of ev's table and the headers of its records.
func (s *Sink) route(ev *merge.Event) (string, []kgo.RecordHeader, error) {
	name := ev.Columns.Schema + "." + ev.Columns.Table
	topic, ok := s.tables[name]
	if !ok {
		return "", nil, fmt.Errorf("a change of %s, which has no topic in %s (the output was opened for %v)", name, s.o.Address, s.o.Tables)
	}
	return topic, []kgo.RecordHeader{
		{Key: HeaderOp, Value: []byte(ev.Op.String())},
		{Key: HeaderLSN, Value: []byte(ev.LSN.String())},
		{Key: HeaderSeq, Value: strconv.AppendInt(nil, int64(ev.Seq), 10)},
		{Key: HeaderTable, Value: []byte(name)},
	}, nil
}

// emitDebezium produces Debezium's records of the events: a key record and an envelope, a
// delete's envelope followed by a tombstone of its key, a truncate's (or a refresh's) envelope in
// every partition.
func (s *Sink) emitDebezium(ctx context.Context, events []merge.Event) error {
	for i := range events {
		ev := &events[i]
		topic, headers, err := s.route(ev)
		if err != nil {
			return err
		}
		value, err := s.o.Debezium.AppendValue(ctx, nil, ev)
		if err != nil {
			return err
		}
		key, keyed, err := s.o.Debezium.AppendKey(ctx, nil, ev)
		if err != nil {
			return err
		}
		if !keyed {
			for p := range s.topics[topic] {
				s.produce(ctx, &kgo.Record{Topic: topic, Partition: p, Key: []byte(BroadcastKey), Value: value, Headers: headers})
			}
			continue
		}
		s.produce(ctx, &kgo.Record{Topic: topic, Key: key, Value: value, Headers: headers})
		if ev.Op == merge.Delete {
			s.produce(ctx, &kgo.Record{Topic: topic, Key: key, Headers: headers})
		}
	}
	return s.classify(s.failed())
}

func (s *Sink) begin() error {
	if s.inTxn {
		return s.classify(s.failed())
	}
	if err := s.cl.BeginTransaction(); err != nil {
		return fmt.Errorf("begin a Kafka transaction: %w", err)
	}
	s.inTxn, s.txnStart = true, time.Time{}
	s.mu.Lock()
	s.err, s.epoch = nil, 0
	s.mu.Unlock()
	return nil
}

func (s *Sink) produce(_ context.Context, r *kgo.Record) {
	if s.txnStart.IsZero() {
		s.txnStart = time.Now() // the brokers time a transaction from its first record
	}
	s.cl.Produce(s.ctx, r, s.promise)
}

// Flush sends the records produced so far to the brokers, in the open transaction, without
// committing it.
func (s *Sink) Flush(ctx context.Context) error {
	if err := s.cl.Flush(ctx); err != nil {
		return err
	}
	return s.failed()
}

func (s *Sink) promise(r *kgo.Record, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		// Every record of a transaction must be acknowledged under one producer id and epoch: a
		// producer that reloaded its id within the transaction (which franz-go does by itself on
		// some errors) aborted what it had written before, and the commit would cover only the
		// rest.
		e := r.ProducerID<<16 | int64(uint16(r.ProducerEpoch)) + 1
		if s.epoch == 0 {
			s.epoch = e
		} else if s.epoch != e && s.err == nil {
			s.err = fmt.Errorf("%w: the producer's id or epoch changed within a transaction (records of it were aborted); resuming from the last checkpoint", pgerr.ErrTimeout)
		}
		return
	}
	if s.err == nil {
		hint := ""
		if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) {
			hint = fmt.Sprintf(" (a record of %d bytes: raise the topic's max.message.bytes, and the brokers' message.max.bytes)", len(r.Key)+len(r.Value))
		}
		if strings.Contains(err.Error(), "invalid record partitioning choice") {
			hint = fmt.Sprintf(" (the topic has other partitions than the %d this output writes it with: partitions added while the sync ran move keys; give the topic its partitions back, or start the output over with another prefix)", s.topics[r.Topic])
		}
		s.err = unavailable(fmt.Errorf("write to topic %s: %w%s", r.Topic, err, hint))
	}
}

func (s *Sink) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// classify names the cause of an error of the open transaction: the transaction timed out, or
// another writer took the prefix over.
func (s *Sink) classify(err error) error {
	if t := s.timedOut(err); t != err {
		return t
	}
	return s.fenced(err)
}

// timedOut says, when the open transaction has run longer than the transaction timeout, that
// the brokers aborted it (and fenced this producer for it): not another writer's doing.
func (s *Sink) timedOut(err error) error {
	if err == nil || s.txnStart.IsZero() || time.Since(s.txnStart) < s.o.TransactionTimeout {
		return err
	}
	return fmt.Errorf("the Kafka transaction ran %s, longer than the transaction timeout (%s), and the brokers aborted it: a source transaction is written in one Kafka transaction with what came since the last checkpoint; raise --kafka-transaction-timeout (and the brokers' transaction.max.timeout.ms, 15 minutes by default, which bounds it): %w",
		time.Since(s.txnStart).Round(time.Second), s.o.TransactionTimeout, err)
}

// Checkpoint writes pos to the checkpoint topic in the open transaction and commits it: the
// records emitted since the last checkpoint and pos become visible to read_committed consumers
// at once, or neither does.
func (s *Sink) Checkpoint(ctx context.Context, pos *merge.Position) error {
	if err := s.begin(); err != nil {
		return err
	}
	topics := map[string]int32{}
	for t, n := range s.topics {
		topics[t] = n
	}
	version := CheckpointVersion
	if s.o.SingleTopic {
		version = CheckpointVersionSingle
	}
	value, err := json.Marshal(Checkpoint{Version: version, Output: s.o.Address.Prefix, Slot: s.o.Slot, Format: s.format(), Layout: s.layout(),
		Position: pos, Topics: topics, Time: time.Now().UTC()})
	if err != nil {
		return err
	}
	s.produce(ctx, &kgo.Record{Topic: CheckpointTopic(s.o.Address.Prefix), Key: []byte(s.o.Address.Prefix), Value: value})
	if err := s.cl.Flush(ctx); err != nil {
		return s.abort(ctx, fmt.Errorf("flush to %s: %w", s.o.Address, err))
	}
	if err := s.failed(); err != nil {
		return s.abort(ctx, s.classify(err))
	}
	s.inTxn = false
	if err := s.cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		if c := s.classify(err); c != err {
			return c
		}
		// The commit may or may not have been recorded by the transaction coordinator. The
		// documented way on: TryAbort, which reloads the producer id and so fence-aborts the
		// transaction if it is still open (it does nothing to one that committed).
		_ = s.cl.EndTransaction(ctx, kgo.TryAbort)
		return fmt.Errorf("%w: commit the Kafka transaction: %w", merge.ErrCommitUnknown, unavailable(err))
	}
	return nil
}

// abort ends the open transaction without committing it, and returns err.
func (s *Sink) abort(ctx context.Context, err error) error {
	s.inTxn = false
	if aerr := s.cl.AbortBufferedRecords(ctx); aerr == nil {
		_ = s.cl.EndTransaction(ctx, kgo.TryAbort)
	}
	return err
}

// fenced names the cause when err says that another writer took the prefix over.
func (s *Sink) fenced(err error) error {
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		return fmt.Errorf("another tidemark sync took over %s (transactional id %s; its epoch fenced this one, whose records since the last checkpoint are aborted): %w; stop one of them",
			s.o.Address, TransactionalID(s.o.Address.Prefix), err)
	}
	return err
}

// unavailable marks an error of reaching the brokers as one to reconnect after.
func unavailable(err error) error {
	if err == nil || pgerr.Reconnectable(err) {
		return err
	}
	if errors.Is(err, kgo.ErrRecordTimeout) || errors.Is(err, context.DeadlineExceeded) || kerr.IsRetriable(err) {
		return fmt.Errorf("%w (%w)", err, pgerr.ErrTimeout)
	}
	return err
}

// Close aborts the open transaction, if any, and closes the clients.
func (s *Sink) Close(ctx context.Context) error {
	if s.cl != nil {
		if s.inTxn {
			_ = s.abort(ctx, nil)
		}
		s.cl.Close()
		s.cl = nil
	}
	if s.adm != nil {
		s.adm.Close()
		s.adm = nil
	}
	s.cancel()
	return nil
}

// Topics is each table's topic (schema.table: topic).
func (s *Sink) Topics() map[string]string { return s.tables }

// partitioner puts a record with a row's key in the partition of the key's murmur2 hash, as
// Kafka's own clients do (so that any producer of the same keys agrees), and a broadcast record
// (a truncate or a refresh, sent to every partition) in the partition it names. A topic whose
// partition count is not the one the output writes it with (partitions added while it runs)
// gets no partition: the record fails, and the transaction with it.
func (s *Sink) partitioner() kgo.Partitioner {
	return kgo.BasicConsistentPartitioner(func(topic string) func(*kgo.Record, int) int {
		hash := kgo.KafkaHasher(murmur2)
		want, checked := s.topics[topic] // written before the first record, read only after
		return func(r *kgo.Record, n int) int {
			if checked && int(want) != n {
				return -1
			}
			if string(r.Key) == BroadcastKey {
				return int(r.Partition)
			}
			return hash(r.Key, n)
		}
	})
}

// murmur2 is Kafka's key hash (org.apache.kafka.common.utils.Utils.murmur2).
func murmur2(b []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(b))
	for len(b) >= 4 {
		k := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
		b = b[4:]
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
