package kafka_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/sink/kafka"
)

var server *e2e.Server

func TestMain(m *testing.M) { os.Exit(e2e.Main(m, &server)) }

// failAfter is a Kafka sink whose Checkpoint fails from the nth on, after emitting what came
// before it: a run that ends with records in an open transaction, as one killed would.
type failAfter struct {
	*kafka.Sink
	n, seen int
	emitted *int
	pause   time.Duration // before each checkpoint
}

func (f *failAfter) Emit(ctx context.Context, events []merge.Event) error {
	*f.emitted += len(events)
	return f.Sink.Emit(ctx, events)
}

var errStop = errors.New("stopped by the test")

func (f *failAfter) Checkpoint(ctx context.Context, pos *merge.Position) error {
	time.Sleep(f.pause)
	if f.seen++; f.n > 0 && f.seen >= f.n {
		// What was emitted reaches the brokers, in the transaction the run leaves open.
		if err := f.Sink.Flush(ctx); err != nil {
			return err
		}
		return errStop
	}
	return f.Sink.Checkpoint(ctx, pos)
}

// capture runs the engine into the Kafka output at addr until it has caught up (or the sink's
// nth checkpoint fails, with failAt > 0), and closes the output.
func capture(t *testing.T, db *e2e.TestDB, addr kafka.Address, failAt int, tables ...string) error {
	_, err := captureCount(t, db, addr, failAt, tables...)
	return err
}

// setupCapture is capture to the end, for a test's setup: a run that the in-process broker
// fails with OUT_OF_ORDER_SEQUENCE_NUMBER (seen once, on a loaded machine, on a fresh
// cluster's first transaction: kfake's answer to a produce request retried) is run again from
// its checkpoint, as tidemark sync runs again after a failed transaction.
func setupCapture(t *testing.T, db *e2e.TestDB, addr kafka.Address, tables ...string) error {
	err := capture(t, db, addr, 0, tables...)
	if err != nil && strings.Contains(err.Error(), "OUT_OF_ORDER_SEQUENCE_NUMBER") {
		t.Logf("the broker failed the run, which runs again: %v", err)
		err = capture(t, db, addr, 0, tables...)
	}
	return err
}

// captureCount is capture, and returns the events emitted.
func captureCount(t *testing.T, db *e2e.TestDB, addr kafka.Address, failAt int, tables ...string) (int, error) {
	return captureWith(t, db, addr, failAt, 0, 0, tables...)
}

// captureWith is captureCount with a transaction timeout and a pause before each checkpoint.
func captureWith(t *testing.T, db *e2e.TestDB, addr kafka.Address, failAt int, timeout, pause time.Duration, tables ...string) (int, error) {
	t.Helper()
	ctx := context.Background()
	conn := db.Connect()
	var names []string
	for _, name := range tables {
		names = append(names, "public."+name)
	}
	s, from, err := kafka.Open(ctx, kafka.Options{Address: addr, Tables: names, Partitions: 3, Slot: db.Slot, TransactionTimeout: timeout,
		Types: pgjson.NewRegistry(conn), Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)}, func() error { return nil })
	require.NoError(t, err)
	defer s.Close(ctx)
	cfg := merge.Config{Source: replicator.Config{DSN: db.DSN, Slot: db.Slot, Publication: db.Publication, CreateSlot: true},
		AckCheckpoints: true, StopWhenCaughtUp: true, ChunkSize: 7}
	for _, name := range tables {
		cfg.Tables = append(cfg.Tables, merge.TableConfig{Schema: "public", Name: name})
	}
	var emitted int
	eng, err := merge.New(cfg, &failAfter{Sink: s, n: failAt, emitted: &emitted, pause: pause}, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	err = eng.Run(ctx, from)
	return emitted, err
}

// replay reads the output back as a read_committed consumer and checks it against the source.
func replay(t *testing.T, db *e2e.TestDB, addr kafka.Address, tables ...string) *e2e.Oracle {
	t.Helper()
	keys := map[string][]string{}
	for _, name := range tables {
		keys["public."+name] = []string{"id"}
	}
	o := e2e.ReplayKafka(t, addr, keys)
	require.Empty(t, o.Violations())
	for _, name := range tables {
		src, err := e2e.SourceRowsJSON(context.Background(), db.DSN, "public", name, []string{"id"})
		require.NoError(t, err)
		require.Empty(t, e2e.Diff(o.Rows("public."+name), src), "table %s", name)
	}
	return o
}

// TestExactlyOnceAcrossRuns: a backfill and changes of every kind go to Kafka; a run that stops
// with records in an open transaction leaves none of them visible to a read_committed consumer,
// and the next run, from the committed checkpoint, writes each change once.
func TestExactlyOnceAcrossRuns(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	addr := e2e.Kafka(t)
	db.Exec(`CREATE SEQUENCE ver`)
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text, ver bigint DEFAULT nextval('ver'))`)
	db.Exec(`CREATE TABLE b (id int PRIMARY KEY, ver bigint DEFAULT nextval('ver'))`)
	db.Exec(`INSERT INTO a (id, v) SELECT g, 'x' || g FROM generate_series(1, 100) g`)
	db.Exec(`INSERT INTO b (id) SELECT g FROM generate_series(1, 30) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE a, b`)
	require.NoError(t, capture(t, db, addr, 0, "a", "b"))
	o := replay(t, db, addr, "a", "b")
	require.Zero(t, o.Duplicates())

	// Changes of every kind; the run stops at its first checkpoint, the changes written in the
	// open transaction: a read_committed consumer sees none of them.
	db.Exec(`UPDATE a SET v = 'y', ver = nextval('ver') WHERE id <= 50`)
	db.Exec(`DELETE FROM a WHERE id > 90`)
	db.Exec(`TRUNCATE b`)
	db.Exec(`INSERT INTO b (id) SELECT g FROM generate_series(100, 120) g`)
	db.Exec(`UPDATE a SET id = id + 1000, ver = nextval('ver') WHERE id = 7`)
	for i := 0; i < 5; i++ {
		db.Exec(`UPDATE a SET ver = nextval('ver') WHERE id BETWEEN 60 AND 70`)
	}
	before := lines(t, addr, "a", "b")
	emitted, err := captureCount(t, db, addr, 1, "a", "b")
	require.ErrorIs(t, err, errStop)
	require.Positive(t, emitted)
	t.Logf("emitted %d before %d after %d", emitted, before, lines(t, addr, "a", "b"))
	require.Equal(t, before, lines(t, addr, "a", "b"), "records of a transaction that did not commit are visible")
	require.NoError(t, capture(t, db, addr, 0, "a", "b"))
	o = replay(t, db, addr, "a", "b")
	require.Zero(t, o.Duplicates(), "a change written twice is visible to a read_committed consumer")
}

func lines(t *testing.T, addr kafka.Address, tables ...string) int {
	var names []string
	for _, name := range tables {
		names = append(names, "public."+name)
	}
	ls, err := kafka.ReadLines(context.Background(), addr, names)
	require.NoError(t, err)
	return len(ls)
}

// TestSecondWriterFences: a second output opened on the same prefix takes it over: the first
// one's next checkpoint fails, naming the cause, and nothing it wrote after its last checkpoint
// is visible.
func TestSecondWriterFences(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	addr := e2e.Kafka(t)
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY)`)
	ctx := context.Background()
	open := func() *kafka.Sink {
		s, _, err := kafka.Open(ctx, kafka.Options{Address: addr, Tables: []string{"public.a"}, Slot: db.Slot,
			Types: pgjson.NewRegistry(db.Connect()), Log: zerolog.Nop()}, func() error { return nil })
		require.NoError(t, err)
		return s
	}
	first := open()
	defer first.Close(ctx)
	pos := &merge.Position{Version: merge.PositionVersion, LSN: 100, Slot: db.Slot, Tables: map[string]*merge.TableProgress{}}
	require.NoError(t, first.Checkpoint(ctx, pos))
	second := open()
	defer second.Close(ctx)
	err := first.Checkpoint(ctx, pos)
	require.ErrorContains(t, err, "another tidemark sync took over")
	require.NoError(t, second.Checkpoint(ctx, pos))
}

// TestTopicsRefused: a topic that holds records no checkpoint accounts for, and a topic whose
// partition count changed since the output wrote it, are refused before anything is written;
// a checkpoint of another slot too.
func TestTopicsRefused(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	ctx := context.Background()
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY, ver int)`)
	db.Exec(`INSERT INTO a VALUES (1, 1)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE a`)
	opts := func(addr kafka.Address, slot string) kafka.Options {
		return kafka.Options{Address: addr, Tables: []string{"public.a"}, Slot: slot, Partitions: 2,
			Types: pgjson.NewRegistry(db.Connect()), Log: zerolog.Nop()}
	}
	client := func(addr kafka.Address) *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addr.Brokers...))
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		return cl
	}

	// Someone else's records in the topic.
	addr := e2e.Kafka(t)
	cl := client(addr)
	_, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, nil, kafka.TopicOf(addr.Prefix, "public", "a"))
	require.NoError(t, err)
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: kafka.TopicOf(addr.Prefix, "public", "a"), Value: []byte("theirs")}).FirstErr())
	_, _, err = kafka.Open(ctx, opts(addr, db.Slot), func() error { return nil })
	require.ErrorContains(t, err, "holds records that no checkpoint")

	// The partitions changed after a run.
	addr = e2e.Kafka(t)
	require.NoError(t, setupCapture(t, db, addr, "a"))
	_, err = kadm.NewClient(client(addr)).CreatePartitions(ctx, 3, kafka.TopicOf(addr.Prefix, "public", "a"))
	require.NoError(t, err)
	_, _, err = kafka.Open(ctx, opts(addr, db.Slot), func() error { return nil })
	require.ErrorContains(t, err, "has 6 partitions, but had 3")

	// A topic the output wrote, deleted: refused, not created again empty.
	_, err = kadm.NewClient(client(addr)).DeleteTopic(ctx, kafka.TopicOf(addr.Prefix, "public", "a"))
	require.NoError(t, err)
	_, _, err = kafka.Open(ctx, opts(addr, db.Slot), func() error { return nil })
	require.ErrorContains(t, err, "which this output wrote, is gone")

	// A first run's checkpoint, before any position, names its slot too.
	addr1 := e2e.Kafka(t)
	s, _, err := kafka.Open(ctx, opts(addr1, "first_slot"), func() error { return nil })
	require.NoError(t, err)
	require.NoError(t, s.Close(ctx))
	_, _, err = kafka.Open(ctx, opts(addr1, "second_slot"), func() error { t.Fatal("ready called"); return nil })
	require.ErrorContains(t, err, "holds the checkpoint of slot first_slot")

	// Another slot's checkpoint: refused before ready (the slot check) runs.
	addr2 := e2e.Kafka(t)
	require.NoError(t, setupCapture(t, db, addr2, "a"))
	_, _, err = kafka.Open(ctx, opts(addr2, "another_slot"), func() error { t.Fatal("ready called"); return nil })
	require.ErrorContains(t, err, "holds the checkpoint of slot "+db.Slot)
}

// TestMurmur2: the partitioner's hash is Kafka's (the values of Kafka's own test of
// Utils.murmur2), so other producers of the same keys agree on their partitions.
func TestMurmur2(t *testing.T) {
	for s, want := range map[string]int32{
		"21": -973932308, "foobar": -790332482, "a-little-bit-long-string": -985981536,
		"a-little-bit-longer-string": -1486304829, "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, "abc": 479470107,
	} {
		require.Equal(t, want, int32(kafka.Murmur2([]byte(s))), s)
	}
}

// TestParseURL: the URL's forms, and mistakes refused with what to write, never with the
// password.
func TestParseURL(t *testing.T) {
	a, err := kafka.ParseURL("kafka://b1:9092,b2:9093/shop")
	require.NoError(t, err)
	require.Equal(t, []string{"b1:9092", "b2:9093"}, a.Brokers)
	require.Equal(t, "shop", a.Prefix)
	a, err = kafka.ParseURL("kafka://app:s3cret@b1:9092/shop?sasl=scram-sha-512&tls=true")
	require.NoError(t, err)
	require.Equal(t, "s3cret", a.Password)
	require.True(t, a.TLS)
	for _, bad := range []struct{ url, want string }{
		{"kafka://b1/shop", "HOST:PORT"},
		{"kafka://b1:9092/", "prefix"},
		{"kafka://b1:9092/a/b", "prefix"},
		{"kafka://app:s3cret@b1:9092/shop", "no mechanism"},
		{"kafka://app:s3cret@b1:9092/shop?sasl=plain", "add tls=true"},
		{"kafka://app:s3cret@b1:9092/shop?sasl=md5", "sasl="},
		{"kafka://b1:9092/shop?acks=1", "unknown option"},
	} {
		_, err := kafka.ParseURL(bad.url)
		require.ErrorContains(t, err, bad.want, bad.url)
		require.NotContains(t, err.Error(), "s3cret", bad.url)
	}
	require.Equal(t, "kafka://app:xxxxx@b1:9092/shop", kafka.Redact("kafka://app:s3cret@b1:9092/shop"))
	require.False(t, strings.Contains(kafka.Redact("kafka://app:s3cret@b1:9092,b2:9092/shop"), "s3cret"))
}

// TestTransactionTimeout: a transaction kept open longer than the transaction timeout is aborted
// by the brokers; the sync stops saying so and how to fix it, not as if another sync had taken
// the output over.
func TestTransactionTimeout(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	addr := e2e.Kafka(t)
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY, ver int)`)
	db.Exec(`INSERT INTO a SELECT g, g FROM generate_series(1, 20) g`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE a`)
	_, err := captureWith(t, db, addr, 0, 2*time.Second, 5*time.Second, "a")
	require.ErrorContains(t, err, "longer than the transaction timeout")
	require.NotContains(t, err.Error(), "took over")
}

// TestEncodeFails: an event whose line cannot be encoded (its column types not readable: the
// source connection lost, say) fails the batch with the encoder's error, a truncate or a refresh
// (sent to every partition) as a row's change. The NATS output's broadcast path panicked so in a
// chaos run (sink/nats TestBroadcastEncodeFails).
func TestEncodeFails(t *testing.T) {
	db := e2e.NewTestDB(t, server)
	addr := e2e.Kafka(t)
	db.Exec(`CREATE TABLE a (id int PRIMARY KEY)`)
	ctx := context.Background()
	conn := db.Connect()
	s, _, err := kafka.Open(ctx, kafka.Options{Address: addr, Tables: []string{"public.a"}, Slot: db.Slot,
		Types: pgjson.NewRegistry(conn), Log: zerolog.Nop()}, func() error { return nil })
	require.NoError(t, err)
	defer s.Close(ctx)
	require.NoError(t, conn.Close(ctx)) // the types can no longer be read
	cols := &merge.Columns{Schema: "public", Table: "a", Names: []string{"id"}, Types: []uint32{23}, TypeMods: []int32{-1}, Key: []int{0}}
	for _, op := range []merge.Op{merge.Truncate, merge.Refresh} {
		var err error
		require.NotPanics(t, func() { err = s.Emit(ctx, []merge.Event{{Op: op, Columns: cols, LSN: 0x1000000}}) }, "%s", op)
		require.ErrorContains(t, err, "conn closed", "%s: the encoder's error", op)
	}
}
