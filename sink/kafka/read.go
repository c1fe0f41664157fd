package kafka

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

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
	opts, err := addr.ClientOpts()
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
// schema.table) and returns them as JSON lines (the tidemark format's), in the output's order.
// It holds them all in memory: WriteLines is for large outputs.
func ReadLines(ctx context.Context, addr Address, tables []string) ([][]byte, error) {
	dir, err := os.MkdirTemp("", "tidemark-kafka-lines-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var buf bytes.Buffer
	problems, err := WriteLines(ctx, addr, tables, dir, &buf)
	if err != nil {
		return nil, err
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("the topics' partitions disagree: %s", strings.Join(problems, "; "))
	}
	var out [][]byte
	for l := range bytes.Lines(buf.Bytes()) {
		out = append(out, bytes.TrimSuffix(l, []byte("\n")))
	}
	return out, nil
}

// WriteLines writes the committed records of the tables' topics of the output at addr (tables:
// schema.table) to w as JSON lines (the tidemark format's), in the output's order: each
// partition's records in their order, the partitions merged by (LSN, seq), which grows along the
// output. A partition whose records go back stays so in what is written (a merge, not a sort),
// for the reader to see. A tombstone becomes its delete line; a truncate or a refresh, sent to
// every partition, is written once. It is how a test, or the chaos harness's oracle, reads back
// what a read_committed consumer of every partition sees; each partition goes through a file of
// its own in dir first, so memory does not grow with the output. It also checks what the merge
// would hide, and returns what it finds: a truncate or a refresh missing from a partition of its
// topic (that partition's consumer keeps rows the source no longer has), a key in two partitions
// (its changes are not in one order).
func WriteLines(ctx context.Context, addr Address, tables []string, dir string, w io.Writer) ([]string, error) {
	var topics []string
	for _, t := range tables {
		schema, table, _ := cut(t)
		topics = append(topics, TopicOf(addr.Prefix, schema, table))
	}
	// An output of one topic (its checkpoint says so): that topic, its records of the tables.
	ck, err := ReadCheckpoint(ctx, addr)
	if err != nil {
		return nil, err
	}
	var only map[string]bool
	if ck != nil && ck.Layout == LayoutSingle {
		topics, only = []string{SingleTopic(addr.Prefix)}, map[string]bool{}
		for _, t := range tables {
			only[t] = true
		}
	}
	type part struct {
		f   *os.File
		w   *bufio.Writer
		r   *bufio.Reader
		cur line // the next line to merge
		ok  bool
	}
	parts := map[string]*part{}
	defer func() {
		for _, p := range parts {
			p.f.Close()
			os.Remove(p.f.Name())
		}
	}()
	var order []*part
	counts, err := partitionCounts(ctx, addr, topics)
	if err != nil {
		return nil, err
	}
	type at struct {
		topic    string
		lsn, seq int64
	}
	broadcasts := map[at]map[int32]bool{}
	keyPart := map[string]int32{}
	var problems []string
	problem := func(format string, args ...any) {
		if len(problems) < 10 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	err = ReadCommitted(ctx, addr, topics, func(r *kgo.Record) error {
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
		if only != nil && !only[h[HeaderTable]] {
			return nil
		}
		l := r.Value
		if l == nil {
			// A tombstone: the delete of its key.
			l = fmt.Appendf(nil, `{"op":%q,"table":%q,"key":%s,"lsn":%q,"seq":%d}`, h[HeaderOp], h[HeaderTable], r.Key, lsn.String(), seq)
		}
		name := fmt.Sprintf("%s-%d", r.Topic, r.Partition)
		p := parts[name]
		if p == nil {
			f, err := os.CreateTemp(dir, "part-")
			if err != nil {
				return err
			}
			p = &part{f: f, w: bufio.NewWriterSize(f, 1<<16)}
			parts[name] = p
			order = append(order, p)
		}
		broadcast := 0
		if string(r.Key) == BroadcastKey {
			broadcast = 1
			k := at{r.Topic, int64(lsn), seq}
			if broadcasts[k] == nil {
				broadcasts[k] = map[int32]bool{}
			}
			broadcasts[k][r.Partition] = true
		} else {
			k := r.Topic + "\x00" + h[HeaderTable] + "\x00" + string(r.Key)
			if p, ok := keyPart[k]; !ok {
				keyPart[k] = r.Partition
			} else if p != r.Partition {
				problem("key %s of %s (topic %s) is in partitions %d and %d", r.Key, h[HeaderTable], r.Topic, p, r.Partition)
			}
		}
		fmt.Fprintf(p.w, "%d %d %d ", uint64(lsn), seq, broadcast)
		p.w.Write(l)
		return p.w.WriteByte('\n')
	})
	if err != nil {
		return nil, err
	}
	for k, ps := range broadcasts {
		if n := counts[k.topic]; int32(len(ps)) != n {
			problem("the %s at %s seq %d is in %d of the %d partitions of %s", "truncate or refresh", pglogrepl.LSN(k.lsn), k.seq, len(ps), n, k.topic)
		}
	}
	next := func(p *part) error {
		text, err := p.r.ReadBytes('\n')
		if err == io.EOF && len(text) == 0 {
			p.ok = false
			return nil
		}
		if err != nil {
			return err
		}
		var lsn uint64
		var broadcast int
		n, _ := fmt.Sscanf(string(text[:min(len(text), 64)]), "%d %d %d ", &lsn, &p.cur.seq, &broadcast)
		if n != 3 {
			return fmt.Errorf("a line of %s cannot be read back", p.f.Name())
		}
		fields := bytes.SplitN(text, []byte(" "), 4)
		p.cur.lsn, p.cur.broadcast, p.cur.text, p.ok = pglogrepl.LSN(lsn), broadcast == 1, fields[3], true
		return nil
	}
	for i, p := range order {
		if err := p.w.Flush(); err != nil {
			return nil, err
		}
		if _, err := p.f.Seek(0, io.SeekStart); err != nil {
			return nil, err
		}
		p.r = bufio.NewReaderSize(p.f, 1<<16)
		if err := next(p); err != nil {
			return nil, err
		}
		order[i] = p
	}
	var last line
	var lastPart *part
	for {
		var best *part
		for _, p := range order {
			if p.ok && (best == nil || cmp.Or(cmp.Compare(p.cur.lsn, best.cur.lsn), cmp.Compare(p.cur.seq, best.cur.seq)) < 0) {
				best = p
			}
		}
		if best == nil {
			return problems, nil
		}
		c := best.cur
		if !(c.broadcast && last.broadcast && lastPart != best && c.lsn == last.lsn && c.seq == last.seq) {
			if _, err := w.Write(c.text); err != nil {
				return nil, err
			}
		}
		last, lastPart = line{lsn: c.lsn, seq: c.seq, broadcast: c.broadcast}, best
		if err := next(best); err != nil {
			return nil, err
		}
	}
}

// partitionCounts is the number of partitions of each topic.
func partitionCounts(ctx context.Context, addr Address, topics []string) (map[string]int32, error) {
	opts, err := addr.ClientOpts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	out := map[string]int32{}
	for name, t := range td {
		out[name] = int32(len(t.Partitions))
	}
	return out, nil
}

// line is a record of WriteLines's merge.
type line struct {
	lsn       pglogrepl.LSN
	seq       int64
	broadcast bool
	text      []byte // with its newline
}
