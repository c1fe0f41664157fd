package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/sink/jsonl/line"
	"github.com/tidemark/tidemark/sink/kafka"
)

// EnvKafka names a real Kafka cluster for the Kafka tests (its brokers, HOST:PORT,...). Without
// it each test gets an in-process cluster (franz-go's kfake), which speaks the protocol,
// transactions and their markers and producer fencing included. docs/testing.md says how to run
// the tests against a real cluster.
const EnvKafka = "TIDEMARK_TEST_KAFKA"

var kafkaPrefixes atomic.Int64

// Kafka returns the address of a Kafka cluster for the test, with a prefix of its own: a
// three-broker kfake cluster closed with the test, or the cluster $TIDEMARK_TEST_KAFKA names.
func Kafka(t testing.TB) kafka.Address {
	addr, _ := KafkaWithFaults(t)
	return addr
}

// KafkaWithFaults is Kafka, and a fault of its in-process cluster for the chaos harness
// (chaos.Config.BrokerFault): for about d, one of produce requests failed with a retriable
// error, produce requests answered as timed out after they were applied (the idempotent
// producer must not write them twice), the transaction coordinator unavailable, or every
// connection dropped; or the partitions' leaders and the coordinators moved. Nil for a real
// cluster, which the tests do not disturb.
func KafkaWithFaults(t testing.TB) (kafka.Address, func(ctx context.Context, seed uint64, d time.Duration) string) {
	t.Helper()
	prefix := fmt.Sprintf("t%d_%d", time.Now().UnixNano()%1_000_000_000, kafkaPrefixes.Add(1))
	if brokers := os.Getenv(EnvKafka); brokers != "" {
		return kafka.Address{Brokers: strings.Split(brokers, ","), Prefix: prefix}, nil
	}
	// On disk (the test's directory), not in memory: a long chaos run writes gigabytes.
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.DataDir(t.TempDir()))
	if err != nil {
		t.Fatalf("start an in-process Kafka cluster: %v", err)
	}
	t.Cleanup(c.Close)
	fault := func(ctx context.Context, seed uint64, d time.Duration) string {
		var h *kfake.FaultHandle
		var what string
		switch seed % 5 {
		case 0:
			h, what = c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotLeaderForPartition, Count: -1}), "produce refused (NOT_LEADER_FOR_PARTITION)"
		case 1:
			h, what = c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.RequestTimedOut, Count: -1}), "produce applied but answered REQUEST_TIMED_OUT"
		case 2:
			h, what = c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn, kmsg.AddPartitionsToTxn, kmsg.InitProducerID}, Err: kerr.CoordinatorNotAvailable, Count: -1}),
				"transaction coordinator unavailable"
		case 3:
			c.ShufflePartitionLeaders()
			c.RehashCoordinators()
			return "partition leaders and coordinators moved"
		case 4:
			var stop atomic.Bool
			c.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
				if stop.Load() {
					c.DropControl() // the fault is over: this control goes
					return nil, nil, false
				}
				c.KeepControl()
				return nil, errors.New("dropped by the chaos harness"), true
			})
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
			stop.Store(true)
			return "every broker connection dropped for " + d.String()
		}
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		h.Remove()
		return fmt.Sprintf("%s for %s (%d requests)", what, d, h.Hits())
	}
	return kafka.Address{Brokers: c.ListenAddrs(), Prefix: prefix}, fault
}

// ReplayKafka reads the Kafka output's committed records of the tables (schema.table: key
// columns) as a read_committed consumer of every partition sees them, in the output's order
// (kafka.ReadLines, which refuses partitions that disagree), and replays them through an oracle.
// No record may be there twice: the (LSN, seq) of each is unique along the output.
func ReplayKafka(t testing.TB, addr kafka.Address, keys map[string][]string) *Oracle {
	t.Helper()
	var tables []string
	for name := range keys {
		tables = append(tables, name)
	}
	lines, err := kafka.ReadLines(context.Background(), addr, tables)
	if err != nil {
		t.Fatalf("read the Kafka output back: %v", err)
	}
	type at struct {
		lsn line.LSN
		seq int
	}
	seen := map[at]bool{}
	var text []byte
	for _, l := range lines {
		d, err := line.Decode(l)
		if err != nil {
			t.Fatalf("a record of the Kafka output: %v: %s", err, l)
		}
		if seen[at{d.LSN, d.Seq}] {
			t.Fatalf("a record is visible twice to a read_committed consumer: %s", l)
		}
		seen[at{d.LSN, d.Seq}] = true
		text = append(append(text, l...), '\n')
	}
	recs, err := ParseJSONL(bytes.NewReader(text), keys)
	if err != nil {
		t.Fatalf("parse the Kafka output: %v", err)
	}
	o := NewOracle("ver")
	for _, r := range recs {
		o.Apply(r)
	}
	return o
}

// KafkaURL is the kafka:// URL of addr.
func KafkaURL(addr kafka.Address) string { return addr.String() }
