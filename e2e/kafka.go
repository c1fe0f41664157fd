package e2e

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

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
	t.Helper()
	prefix := fmt.Sprintf("t%d_%d", time.Now().UnixNano()%1_000_000_000, kafkaPrefixes.Add(1))
	if brokers := os.Getenv(EnvKafka); brokers != "" {
		return kafka.Address{Brokers: strings.Split(brokers, ","), Prefix: prefix}
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatalf("start an in-process Kafka cluster: %v", err)
	}
	t.Cleanup(c.Close)
	return kafka.Address{Brokers: c.ListenAddrs(), Prefix: prefix}
}

// KafkaURL is the kafka:// URL of addr.
func KafkaURL(addr kafka.Address) string { return addr.String() }
