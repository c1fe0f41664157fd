package e2e

import (
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

// KafkaURL is the kafka:// URL of addr.
func KafkaURL(addr kafka.Address) string { return addr.String() }
