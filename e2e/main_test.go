package e2e_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/replicator"
)

var server *e2e.Server

func TestMain(m *testing.M) { os.Exit(e2e.Main(m, &server)) }

// txn is one transaction as the stream delivered it.
type txn struct {
	Begin   *replicator.Begin
	Events  []replicator.Event // everything between Begin and Commit
	Commit  *replicator.Commit
	Changes []*replicator.Change
}

// streamer runs a replicator.Stream in a goroutine it owns and collects whole transactions.
type streamer struct {
	t      *testing.T
	stream *replicator.Stream
	cancel context.CancelFunc
	done   chan error
	txns   chan txn

	mu         sync.Mutex
	keepalives int
}

func testLogger(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
}

// openStream opens a stream on db's slot and publication, applying mod to the config.
func openStream(t *testing.T, db *e2e.TestDB, mod func(*replicator.Config)) (*replicator.Stream, error) {
	cfg := replicator.Config{DSN: db.DSN, Slot: db.Slot, Publication: db.Publication, StatusInterval: 500 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	return replicator.Open(context.Background(), cfg, testLogger(t))
}

// startStream opens a stream and runs it from lsn.
func startStream(t *testing.T, db *e2e.TestDB, from pglogrepl.LSN, mod func(*replicator.Config)) *streamer {
	t.Helper()
	st, err := openStream(t, db, mod)
	require.NoError(t, err)
	return runStream(t, st, from)
}

func runStream(t *testing.T, st *replicator.Stream, from pglogrepl.LSN) *streamer {
	ctx, cancel := context.WithCancel(context.Background())
	s := &streamer{t: t, stream: st, cancel: cancel, done: make(chan error, 1), txns: make(chan txn, 10000)}
	var cur *txn
	go func() {
		s.done <- st.Run(ctx, from, func(_ context.Context, ev replicator.Event) error {
			switch ev := ev.(type) {
			case *replicator.Begin:
				if cur != nil {
					return errors.New("begin inside a transaction")
				}
				cur = &txn{Begin: ev}
			case *replicator.Commit:
				if cur == nil {
					return errors.New("commit outside a transaction")
				}
				cur.Commit = ev
				s.txns <- *cur
				cur = nil
			case *replicator.Keepalive:
				s.mu.Lock()
				s.keepalives++
				s.mu.Unlock()
			default:
				if cur == nil {
					if _, ok := ev.(*replicator.Message); ok {
						return nil // non-transactional message
					}
					return errors.New("event outside a transaction")
				}
				cur.Events = append(cur.Events, ev)
				if c, ok := ev.(*replicator.Change); ok {
					cur.Changes = append(cur.Changes, c)
				}
			}
			return nil
		})
	}()
	t.Cleanup(func() { s.stop() })
	return s
}

// stop cancels the stream, waits for Run to return and closes the connection.
func (s *streamer) stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	if err := <-s.done; err != nil && !errors.Is(err, context.Canceled) {
		s.t.Errorf("stream ended with: %v", err)
	}
	_ = s.stream.Close(context.Background())
}

// next waits for the next whole transaction.
func (s *streamer) next(timeout time.Duration) txn {
	s.t.Helper()
	select {
	case tx := <-s.txns:
		return tx
	case err := <-s.done:
		s.done <- err // for stop, which waits for it
		s.t.Fatalf("stream ended early: %v", err)
	case <-time.After(timeout):
		s.t.Fatalf("no transaction within %s", timeout)
	}
	return txn{}
}

// none checks that no transaction arrives within d.
func (s *streamer) none(d time.Duration) {
	s.t.Helper()
	select {
	case tx := <-s.txns:
		s.t.Fatalf("unexpected transaction %d with %d changes", tx.Begin.XID, len(tx.Changes))
	case <-time.After(d):
	}
}

// text returns the text of value i of a tuple, "<null>" or "<unchanged>".
func text(tu replicator.Tuple, i int) string {
	switch tu[i].Kind {
	case replicator.Null:
		return "<null>"
	case replicator.Unchanged:
		return "<unchanged>"
	}
	return string(tu[i].Data)
}
