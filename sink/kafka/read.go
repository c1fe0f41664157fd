package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pglogrepl"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ReadCommitted reads what the partitions of topics hold up to their last stable offsets at
// the call, as a read_committed consumer sees it (records of aborted transactions left out),
// and hands each committed record to fn in its partition's order (partitions one after another
// are not in any order between them). The last stable offset is the first offset of the oldest
// transaction still open (a writer killed in the middle of one leaves it open until the next
// writer of its transactional id aborts it, or it times out): what lies before it is decided.
// It returns once every partition was read to that offset: it keeps the transactions' control
// records (commit and abort markers) to see how far it got, since the last offset before it is
// a committed record or a marker when the transactions do not interleave, which holds for a
// Tidemark output (one transactional producer at a time).
func ReadCommitted(ctx context.Context, addr Address, topics []string, fn func(r *kgo.Record) error) error {
	opts, err := addr.clientOpts()
	if err != nil {
		return err
	}
	adm, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer adm.Close()
	ends, err := kadm.NewClient(adm).ListCommittedOffsets(ctx, topics...)
	if err != nil {
		return fmt.Errorf("list the end offsets of %v: %w", topics, err)
	}
	starts, err := kadm.NewClient(adm).ListStartOffsets(ctx, topics...)
	if err != nil {
		return fmt.Errorf("list the start offsets of %v: %w", topics, err)
	}
	want := map[string]map[int32]kgo.Offset{}
	left := map[string]map[int32]int64{} // the last offset to see, per partition
	n := 0
	var listErr error
	ends.Each(func(o kadm.ListedOffset) {
		if errors.Is(o.Err, kerr.UnknownTopicOrPartition) {
			return // no such topic (yet): nothing to read
		}
		if o.Err != nil {
			listErr = fmt.Errorf("topic %s partition %d: %w", o.Topic, o.Partition, o.Err)
			return
		}
		start, _ := starts.Lookup(o.Topic, o.Partition)
		if o.Offset <= start.Offset {
			return // empty
		}
		if want[o.Topic] == nil {
			want[o.Topic], left[o.Topic] = map[int32]kgo.Offset{}, map[int32]int64{}
		}
		want[o.Topic][o.Partition] = kgo.NewOffset().AtStart()
		left[o.Topic][o.Partition] = o.Offset - 1
		n++
	})
	if listErr != nil {
		return listErr
	}
	if n == 0 {
		return nil
	}
	cl, err := kgo.NewClient(append(opts, kgo.ConsumePartitions(want), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords())...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for n > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if ferr == nil && !errors.Is(err, context.Canceled) {
				ferr = fmt.Errorf("read %s partition %d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		var rerr error
		fs.EachRecord(func(r *kgo.Record) {
			if rerr != nil {
				return
			}
			last, ok := left[r.Topic][r.Partition]
			if !ok || r.Offset > last {
				return // beyond the end at the call
			}
			if !r.Attrs.IsControl() {
				rerr = fn(r)
			}
			if r.Offset == last {
				delete(left[r.Topic], r.Partition)
				n--
			}
		})
		if rerr != nil {
			return rerr
		}
	}
	return nil
}

// ReadLines reads the committed records of the tables' topics of the output at addr (tables:
// schema.table) and returns them as JSON lines (the tidemark format's), in the output's order:
// each partition keeps its keys' order, and (LSN, seq), which grows along the output, merges the
// partitions back into one sequence. A tombstone becomes its delete line; a truncate or a refresh,
// sent to every partition, is one line. It is how a test, or the chaos harness's oracle, reads
// back what a read_committed consumer of every partition sees.
func ReadLines(ctx context.Context, addr Address, tables []string) ([][]byte, error) {
	var topics []string
	for _, t := range tables {
		schema, table, _ := cut(t)
		topics = append(topics, TopicOf(addr.Prefix, schema, table))
	}
	type rec struct {
		lsn       pglogrepl.LSN
		seq       int64
		partition int32
		keyless   bool
		line      []byte
	}
	var recs []rec
	err := ReadCommitted(ctx, addr, topics, func(r *kgo.Record) error {
		h := map[string]string{}
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		lsn, err := pglogrepl.ParseLSN(h[HeaderLSN])
		if err != nil {
			return fmt.Errorf("topic %s partition %d offset %d: header %s: %w", r.Topic, r.Partition, r.Offset, HeaderLSN, err)
		}
		seq, err := strconv.ParseInt(h[HeaderSeq], 10, 64)
		if err != nil {
			return fmt.Errorf("topic %s partition %d offset %d: header %s: %w", r.Topic, r.Partition, r.Offset, HeaderSeq, err)
		}
		l := r.Value
		if l == nil {
			// A tombstone: the delete of its key.
			l = fmt.Appendf(nil, `{"op":%q,"table":%q,"key":%s,"lsn":%q,"seq":%d}`, h[HeaderOp], h[HeaderTable], r.Key, lsn.String(), seq)
		}
		recs = append(recs, rec{lsn: lsn, seq: seq, partition: r.Partition, keyless: string(r.Key) == BroadcastKey, line: l})
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(recs, func(a, b rec) int {
		return cmp.Or(cmp.Compare(a.lsn, b.lsn), cmp.Compare(a.seq, b.seq))
	})
	var out [][]byte
	for i, r := range recs {
		if r.keyless && i > 0 && recs[i-1].keyless && recs[i-1].lsn == r.lsn && recs[i-1].seq == r.seq && recs[i-1].partition != r.partition {
			continue // the same truncate or refresh, in another partition
		}
		out = append(out, r.line)
	}
	return out, nil
}
