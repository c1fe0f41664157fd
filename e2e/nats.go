package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tidemark/tidemark/sink/jsonl/line"
	tmnats "github.com/tidemark/tidemark/sink/nats"
)

// EnvNATS names a real NATS cluster with JetStream for the NATS tests (its servers,
// HOST:PORT,...; three of them for the tests that use replicas). Without it each test gets an
// in-process cluster of three nats-server nodes (the server's own Go module, JetStream on,
// files in the test's directory).
const EnvNATS = "TIDEMARK_TEST_NATS"

// EnvNATSLogs names a directory where the in-process nodes write their logs (one file each),
// kept after the test: for a long chaos run whose cluster misbehaves.
const EnvNATSLogs = "TIDEMARK_TEST_NATS_LOGS"

var natsStreams atomic.Int64

// NATSCluster is an in-process three-node JetStream cluster.
type NATSCluster struct {
	mu      sync.Mutex
	opts    []*server.Options
	servers []*server.Server
}

// NATS returns the address of a NATS JetStream cluster for the test, with a stream of its own:
// an in-process cluster of three nodes closed with the test (c), or the cluster $TIDEMARK_TEST_NATS
// names (c nil: the tests do not disturb a real cluster).
func NATS(t testing.TB) (addr tmnats.Address, c *NATSCluster) {
	t.Helper()
	stream := fmt.Sprintf("t%d_%d", time.Now().UnixNano()%1_000_000_000, natsStreams.Add(1))
	if servers := os.Getenv(EnvNATS); servers != "" {
		return tmnats.Address{Servers: strings.Split(servers, ","), Stream: stream}, nil
	}
	c, err := StartNATSCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatalf("start an in-process NATS cluster: %v", err)
	}
	t.Cleanup(c.Shutdown)
	return tmnats.Address{Servers: c.Addrs(), Stream: stream}, c
}

// natsStarting is held from the choice of a cluster's ports until its nodes listen on them: the
// ports are found free by listening and closing, so two clusters of one test process started at
// once (parallel tests) could otherwise be given the same port, and a node would not start.
var natsStarting sync.Mutex

// StartNATSCluster starts n JetStream nodes clustered together, their files under dir; each of
// configure changes every node's options (users, say).
func StartNATSCluster(dir string, n int, configure ...func(*server.Options)) (*NATSCluster, error) {
	// A port found free can still be taken by another process before its node binds it (the
	// lock below holds within this process only): a node that does not start is tried again,
	// the whole cluster on new ports and empty files. A node that lost its port is known only
	// when its 30 s wait for connections ends (nats-server does not report the failed listen to
	// an embedding process), so an attempt costs that much.
	var c *NATSCluster
	var err error
	for attempt := 1; ; attempt++ {
		if c, err = startNodes(dir, n, configure); err == nil {
			break
		}
		if attempt == natsStartAttempts {
			return nil, fmt.Errorf("%w (%d attempts, each on new ports)", err, attempt)
		}
		for i := range n { // the nodes' own directories, not the caller's
			if rerr := os.RemoveAll(fmt.Sprintf("%s/n%d", dir, i+1)); rerr != nil {
				return nil, fmt.Errorf("%w; and clearing its files for another attempt: %v", err, rerr)
			}
		}
	}
	// Ready when JetStream answers (the cluster elected its meta leader).
	deadline := time.Now().Add(60 * time.Second)
	if len(configure) > 0 {
		return c, nil // ready for connections; JetStream is the test's to wait for
	}
	for {
		nc, err := (tmnats.Address{Servers: c.Addrs()}).Connect()
		if err == nil {
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err = js.AccountInfo(ctx)
			cancel()
			nc.Close()
			if err == nil {
				return c, nil
			}
		}
		if time.Now().After(deadline) {
			c.Shutdown()
			return nil, fmt.Errorf("the NATS cluster did not become ready: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// natsStartAttempts is how many times StartNATSCluster starts a cluster's nodes on new ports
// before it gives up.
const natsStartAttempts = 3

// startNodes starts the n nodes of a cluster on ports free at that moment, holding natsStarting
// until they listen.
func startNodes(dir string, n int, configure []func(*server.Options)) (*NATSCluster, error) {
	natsStarting.Lock()
	defer natsStarting.Unlock()
	ports := make([]int, 2*n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i]))
	}
	c := &NATSCluster{}
	for i := range n {
		o := &server.Options{ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: ports[i], NoLog: true, NoSigs: true,
			JetStream: true, StoreDir: fmt.Sprintf("%s/n%d", dir, i+1), JetStreamMaxMemory: 256 << 20, JetStreamMaxStore: 64 << 30,
			Cluster: server.ClusterOpts{Name: "tidemark", Host: "127.0.0.1", Port: ports[n+i]}, Routes: server.RoutesFromStr(strings.Join(routes, ","))}
		if logs := os.Getenv(EnvNATSLogs); logs != "" {
			o.NoLog, o.LogFile = false, fmt.Sprintf("%s/n%d-%d.log", logs, i+1, ports[i])
		}
		if n == 1 {
			o.Cluster, o.Routes = server.ClusterOpts{}, nil
		}
		for _, f := range configure {
			f(o)
		}
		c.opts = append(c.opts, o)
		c.servers = append(c.servers, nil)
	}
	for i := range n {
		if err := c.start(i); err != nil {
			c.Shutdown()
			return nil, err
		}
	}
	return c, nil
}

func (c *NATSCluster) start(i int) error {
	s, err := server.NewServer(c.opts[i])
	if err != nil {
		return err
	}
	if c.opts[i].LogFile != "" {
		s.ConfigureLogger() // an embedded server logs only when asked to
	}
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return fmt.Errorf("node %s did not start", c.opts[i].ServerName)
	}
	c.mu.Lock()
	c.servers[i] = s
	c.mu.Unlock()
	return nil
}

// Addrs are the nodes' client addresses.
func (c *NATSCluster) Addrs() []string {
	var out []string
	for _, o := range c.opts {
		out = append(out, fmt.Sprintf("127.0.0.1:%d", o.Port))
	}
	return out
}

// Kill stops node i at once (its clients lose their connections; its files stay).
func (c *NATSCluster) Kill(i int) {
	c.mu.Lock()
	s := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Leader is the index of the node that leads stream (-1: none found).
func (c *NATSCluster) Leader(stream string) int {
	nc, err := (tmnats.Address{Servers: c.Addrs()}).Connect()
	if err != nil {
		return -1
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return -1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return -1
	}
	info, err := st.Info(ctx)
	if err != nil || info.Cluster == nil {
		return -1
	}
	for i, o := range c.opts {
		if o.ServerName == info.Cluster.Leader {
			return i
		}
	}
	return -1
}

// Restart starts node i again, from its files.
func (c *NATSCluster) Restart(i int) error { return c.start(i) }

// Fault is the chaos harness's JetStream fault (chaos.Config.NodeFault): a node killed for about
// d, then started again from its files (a stream of three replicas keeps a quorum of two): the
// leader of stream for an even seed, node seed/2 % 3 otherwise.
func (c *NATSCluster) Fault(ctx context.Context, stream string, seed uint64, d time.Duration) string {
	i := int(seed / 2 % uint64(len(c.opts)))
	what := "node"
	if seed%2 == 0 {
		if l := c.Leader(stream); l >= 0 {
			i, what = l, "the stream's leader, node"
		}
	}
	c.Kill(i)
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	if err := c.Restart(i); err != nil {
		return fmt.Sprintf("%s %s killed; it did not start again: %v", what, c.opts[i].ServerName, err)
	}
	return fmt.Sprintf("%s %s killed for %s", what, c.opts[i].ServerName, d)
}

// Shutdown stops every node.
func (c *NATSCluster) Shutdown() {
	for i := range c.servers {
		c.Kill(i)
	}
}

// ReplayNATS reads the stream of the NATS output at addr (tables: schema.table: key columns) as
// a consumer of the whole stream sees it (tmnats.WriteLines, which reports a truncate missing
// from a subject and a key on two subjects), and replays it through an oracle. No event may be
// there twice: the (LSN, seq) of each is unique along the output.
func ReplayNATS(t testing.TB, addr tmnats.Address, keys map[string][]string) *Oracle {
	t.Helper()
	var buf bytes.Buffer
	var problems []string
	var err error
	for try := 0; try < 5; try++ { // a node just started again may not answer yet
		buf.Reset()
		if problems, err = tmnats.WriteLines(context.Background(), addr, &buf); err == nil {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if err != nil {
		t.Fatalf("read the NATS output back: %v", err)
	}
	if len(problems) > 0 {
		t.Fatalf("the NATS output's subjects disagree: %v", problems)
	}
	type at struct {
		lsn line.LSN
		seq int
	}
	seen := map[at]bool{}
	for _, l := range bytes.Split(bytes.TrimSuffix(buf.Bytes(), []byte("\n")), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		d, err := line.Decode(l)
		if err != nil {
			t.Fatalf("a message of the NATS output: %v: %s", err, l)
		}
		if seen[at{d.LSN, d.Seq}] {
			t.Fatalf("an event is in the stream twice: %s", l)
		}
		seen[at{d.LSN, d.Seq}] = true
	}
	recs, err := ParseJSONL(bytes.NewReader(buf.Bytes()), keys)
	if err != nil {
		t.Fatalf("parse the NATS output: %v", err)
	}
	// Every message is visible: each change once, positions growing; a backfilled row may
	// repeat the version a change brought (its chunk read it later), never a change itself.
	o := NewOracle("ver")
	o.ExactlyOnce, o.Order = true, ByLSNSeq
	for _, r := range recs {
		o.Apply(r)
	}
	return o
}
