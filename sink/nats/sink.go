package nats

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/sink"
	"github.com/tidemark/tidemark/sink/debezium"
	"github.com/tidemark/tidemark/sink/jsonl"
)

var _ sink.Output = (*Sink)(nil)

// Options configure a NATS JetStream output.
type Options struct {
	Address Address
	// Tables are the captured tables (schema.table).
	Tables []string
	// Partitions is the number of subjects per table a key is hashed to (STREAM.SCHEMA.TABLE.N,
	// N from 0): a key's changes are all on one subject, in order. Zero: 1.
	Partitions int
	// Replicas is the replication of the stream and the checkpoint bucket the output creates
	// (zero: 1); a cluster of three takes 3.
	Replicas int
	// DuplicateWindow is the stream's window for dropping a message whose id it has seen (zero:
	// JetStream's default, two minutes).
	DuplicateWindow time.Duration
	// Slot is the capture's replication slot: a checkpoint of another slot is refused.
	Slot  string
	Types *pgjson.Registry
	Log   zerolog.Logger
	// Debezium, when set, writes Debezium's envelopes instead of Tidemark's lines.
	Debezium *debezium.Encoder
	// RereadPartial is the engine's merge.Config.RereadPartial: an update without its unchanged
	// TOASTed values is no event, its row is read again instead. A row read past the checkpoint
	// is then no promise that the stream holds the row's every change after it (the update may
	// be only in the next reading), so a restart skips none of them: a row may come twice, and
	// none is lost.
	RereadPartial bool
}

// CheckpointVersion is the version of the checkpoint this package writes and reads.
const CheckpointVersion = 1

// Mark is an output message's place in the output's order: its event's (LSN, Seq), and which
// of the event's messages it is (a truncate or a refresh has one per partition subject).
type Mark struct {
	LSN pglogrepl.LSN `json:"lsn"`
	Seq int           `json:"seq"`
	Idx int           `json:"idx"`
	// History is the source's history the message was read in (its system id and timeline): a
	// mark orders only the messages of one history.
	History string `json:"history"`
}

// Less orders marks of one history along the output.
func (m Mark) Less(o Mark) bool {
	if m.LSN != o.LSN {
		return m.LSN < o.LSN
	}
	if m.Seq != o.Seq {
		return m.Seq < o.Seq
	}
	return m.Idx < o.Idx
}

// Checkpoint is the value of the checkpoint key (bucket tidemark-STREAM, key checkpoint).
type Checkpoint struct {
	Version int    `json:"version"`
	Output  string `json:"output"` // the stream
	Slot    string `json:"slot"`
	Format  string `json:"format"`
	// Position is the engine's position to resume from (nil: none yet).
	Position *merge.Position `json:"position"`
	// Stream is true once the output created (or took, empty) its stream; StreamSeq is the
	// stream's last sequence when the checkpoint was written: the messages after it came later.
	Stream    bool   `json:"stream"`
	StreamSeq uint64 `json:"stream_seq"`
	// Last is the mark of the last message the output wrote: a restart skips the events up to
	// it, which the stream has already (they may lie ahead of Position).
	Last *Mark `json:"last,omitempty"`
	// TailFrom, when not zero, is the first stream sequence whose backfilled rows the engine may
	// still read again (a run killed, then another before it read those chunks again): the next
	// run reads the stream from there for the keys to pass over, not from StreamSeq.
	TailFrom   uint64   `json:"tail_from,omitempty"`
	Partitions int      `json:"partitions"`
	Tables     []string `json:"tables"`
	// Owner is the run that took the output over last: each run writes its own on open, with a
	// compare-and-set on the key's revision, which fences the run before it.
	Owner string    `json:"owner"`
	Time  time.Time `json:"time"`
}

// The message headers.
const (
	HeaderOp    = "tidemark.op"    // the event's op, as the JSON line names it
	HeaderLSN   = "tidemark.lsn"   // its commit LSN (a backfilled row's: its chunk's high watermark)
	HeaderSeq   = "tidemark.seq"   // its order among the events of that LSN
	HeaderIdx   = "tidemark.idx"   // which of the event's messages (the partition, for a truncate or a refresh)
	HeaderTable = "tidemark.table" // schema.table
	HeaderKey   = "tidemark.key"   // the row's key as JSON ({} for a truncate or a refresh)
	// HeaderKeyID is the row's key as the engine keys it (hex): one for numeric 8 and 8.0, whose
	// JSON differs (doc.go says for which types); none for a truncate or a refresh.
	HeaderKeyID = "tidemark.keyid"
	// HeaderHistory is the source's history the event was read in: SYSTEMID/TIMELINE.
	HeaderHistory = "tidemark.history"
)

// Bucket is the checkpoint bucket of a stream.
func Bucket(stream string) string { return "tidemark-" + stream }

// checkpointKey is the checkpoint's key in the bucket.
const checkpointKey = "checkpoint"

var badToken = regexp.MustCompile(`[^a-zA-Z0-9_-]`)

// SubjectOf is the subject of partition p of table schema.table: STREAM.SCHEMA.TABLE.P, each
// character outside letters, digits, '_' and '-' written '_'.
func SubjectOf(stream, schema, table string, p int) string {
	return stream + "." + badToken.ReplaceAllString(schema, "_") + "." + badToken.ReplaceAllString(table, "_") + "." + strconv.Itoa(p)
}

// PartitionOf is the partition of a key (its JSON): FNV-1a, 32 bits, modulo the partitions.
func PartitionOf(key []byte, partitions int) int {
	h := fnv.New32a()
	h.Write(key)
	return int(h.Sum32() % uint32(partitions))
}

// maxPending bounds the messages sent and not yet acknowledged.
const maxPending = 4000

// Sink writes events to a JetStream stream. See doc.go for what exactly once means here.
type Sink struct {
	o      Options
	nc     *natsgo.Conn
	closed chan struct{} // closed with the connection
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	rev    uint64 // the checkpoint key's revision this run wrote last
	owner  string
	enc    *jsonl.Encoder
	subj   map[string]string // schema.table: STREAM.SCHEMA.TABLE (without the partition)

	history  string    // the source's system this run reads (Resume)
	timeline string    // and its timeline: SYSTEMID/TIMELINE
	seq      uint64    // the stream's last sequence, with what was sent
	pending  []pending // sent, not yet acknowledged, in order
	err      error     // the first failure since the last checkpoint
	last     *Mark     // the last message written (by this run or one before)
	// horizon is the stream's last message when the run opened (a run before wrote it): the
	// events up to it are read again, not written (place).
	horizon *Mark
	// leftover: the stream holds messages past a checkpoint without a position (merge.Leftover).
	leftover bool
	// replaying is set while the run has not gone past horizon (merge.Replayer).
	replaying atomic.Bool
	skip      map[string]map[string]bool // table: keys (skipKeys) backfilled after the last checkpoint by a run before
	tailFrom  uint64                     // where the stream was read from at open (Checkpoint.TailFrom)
	// replay are the stream's messages past the position the run resumes from, up to last, in
	// order (backfilled rows apart: skip): the events the run reads again must be these, one for
	// one, or the stream holds what this run would not write.
	replay     []tailMsg
	refreshing map[string]bool  // tables whose output this run starts over (their events up to last are not compared)
	restarted  map[string]bool  // tables with a refresh in the stream past the checkpoint
	chunks     map[string]int64 // table: its chunks at this run's first checkpoint
	skipped    int
	buf        []byte
}

type pending struct {
	f   jetstream.PubAckFuture
	seq uint64 // the sequence it must get
}

// Open opens (or resumes) the output: it reads the checkpoint, checks it is this slot's, calls
// ready (the slot idle), takes the output over (a compare-and-set of the checkpoint key, which
// fences a run before it), creates or checks the stream, and reads the stream's last message
// and what came after the checkpoint. It returns the position to resume from (nil: none).
//
// A cluster that lost a node may have no leader for the stream or the bucket for a few seconds:
// Open tries again for up to openPatience while the servers answer so.
func Open(ctx context.Context, o Options, ready func() error) (*Sink, *merge.Position, error) {
	deadline := time.Now().Add(openPatience)
	for {
		s, pos, err := open(ctx, o, ready)
		if err == nil || !leaderless(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return s, pos, err
		}
		o.Log.Warn().Err(err).Msg("the NATS servers do not answer yet: trying again")
		select {
		case <-ctx.Done():
			return nil, nil, err
		case <-time.After(time.Second):
		}
	}
}

// openPatience bounds Open's tries: a JetStream election takes seconds.
const openPatience = 30 * time.Second

func open(ctx context.Context, o Options, ready func() error) (*Sink, *merge.Position, error) {
	if o.Partitions == 0 {
		o.Partitions = 1
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	closed := make(chan struct{})
	nc, err := o.Address.Connect(natsgo.ClosedHandler(func(*natsgo.Conn) { close(closed) }))
	if err != nil {
		return nil, nil, unavailable(err)
	}
	s := &Sink{closed: closed, o: o, nc: nc, enc: jsonl.NewEncoder(o.Types), subj: map[string]string{}, skip: map[string]map[string]bool{}, chunks: map[string]int64{},
		restarted: map[string]bool{}, refreshing: map[string]bool{}}
	fail := func(err error) (*Sink, *merge.Position, error) {
		s.Close(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	s.js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(maxPending+100), jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		return fail(err)
	}
	owners := map[string]string{}
	for _, t := range o.Tables {
		schema, table, _ := strings.Cut(t, ".")
		subj := SubjectOf(o.Address.Stream, schema, table, 0)
		subj = subj[:strings.LastIndexByte(subj, '.')]
		if other, ok := owners[subj]; ok {
			return fail(fmt.Errorf("tables %s and %s would both go to subjects %s.* (a subject token takes only letters, digits, '_' and '-' here, the rest written '_'): capture them into different streams", other, t, subj))
		}
		owners[subj] = t
		s.subj[t] = subj
	}
	bucket := Bucket(o.Address.Stream)
	s.kv, err = s.js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		s.kv, err = s.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Description: "Tidemark's checkpoint of stream " + o.Address.Stream,
			History: 5, Replicas: o.Replicas, Storage: jetstream.FileStorage})
		if errors.Is(err, jetstream.ErrBucketExists) {
			s.kv, err = s.js.KeyValue(ctx, bucket)
		}
	}
	if err != nil {
		return fail(unavailable(fmt.Errorf("open the checkpoint bucket %s on %s: %w%s", bucket, o.Address, err, jsHint(err))))
	}
	ck, rev, err := s.readCheckpoint(ctx)
	if err != nil {
		return fail(err)
	}
	if err := s.checkOwner(ck); err != nil {
		return fail(err)
	}
	if ck != nil && ck.Stream && ck.Partitions != o.Partitions {
		return fail(fmt.Errorf("%s was written with %d subjects per table (--nats-partitions %d): with %d, a key's next changes would go to another subject than its earlier ones, and be read out of order; give --nats-partitions %d, or start over with another stream",
			o.Address, ck.Partitions, ck.Partitions, o.Partitions, ck.Partitions))
	}
	if err := ready(); err != nil {
		return fail(err)
	}
	// Take the output over: a run still writing it fails its next checkpoint (its revision is
	// gone) and its next message (the stream's last sequence is not the one it expects, once
	// this run wrote).
	var b [8]byte
	_, _ = rand.Read(b[:])
	s.owner = hex.EncodeToString(b[:])
	next := Checkpoint{Version: CheckpointVersion, Output: o.Address.Stream, Slot: o.Slot, Format: s.format(), Partitions: o.Partitions, Tables: o.Tables}
	if ck != nil {
		next = *ck
		next.Slot = cmp(next.Slot, o.Slot)
	}
	s.rev = rev
	if err := s.writeCheckpoint(ctx, next); err != nil {
		return fail(err)
	}
	if err := s.openStream(ctx, ck); err != nil {
		return fail(err)
	}
	if ck != nil && ck.Format != "" && ck.Format != s.format() && s.seq > 0 {
		return fail(fmt.Errorf("%s holds messages in the %s format (its checkpoint says so): a run with --format %s would mix two formats in one stream; give %s, or another stream",
			o.Address, ck.Format, s.format(), debezium.Continue(ck.Format)))
	}
	if ck != nil && ck.Stream && ck.Format != s.format() && s.seq == 0 {
		// Nothing in the stream yet: the output takes this run's format, recorded before its
		// first message, so that a later run in the earlier format is refused once it holds any.
		next.Format = s.format()
		if err := s.writeCheckpoint(ctx, next); err != nil {
			return fail(err)
		}
	}
	var pos *merge.Position
	if ck != nil {
		pos = ck.Position
	}
	if pos != nil && len(s.restarted) > 0 {
		// A run that stopped before its checkpoint started these tables' output over (their
		// refresh is in the stream, and part of their backfill): this run starts them over again,
		// as that run's re-backfill is not in the checkpoint.
		pos = pos.Clone()
		for t := range s.restarted {
			pos.Tables[t] = &merge.TableProgress{Refresh: true}
			o.Log.Warn().Str("table", t).Msg("the stream holds a refresh of the table past the checkpoint (a re-backfill a run started before it stopped): the table's output starts over again")
		}
	}
	if h := s.horizon; h != nil && (pos == nil || pos.LSN <= h.LSN) && ck.Tables != nil && !slices.Equal(sorted(ck.Tables), sorted(o.Tables)) {
		return fail(fmt.Errorf("%s holds changes up to %s, past its checkpoint, written while it captured %s: run it once more with --tables %s until its checkpoint passes %s (tidemark status shows it), then change the tables",
			o.Address, h.LSN, strings.Join(ck.Tables, ","), strings.Join(ck.Tables, ","), h.LSN))
	}
	return s, pos, nil
}

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func (s *Sink) format() string {
	if s.o.Debezium != nil {
		return s.o.Debezium.Format()
	}
	return "tidemark"
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
	return fmt.Errorf("%s holds the checkpoint of slot %s, not %s: it is another capture's output; give this capture another stream, or run it with --slot %s",
		s.o.Address, slot, s.o.Slot, slot)
}

// readCheckpoint reads the checkpoint key (nil: none) and its revision.
func (s *Sink) readCheckpoint(ctx context.Context) (*Checkpoint, uint64, error) {
	e, err := s.kv.Get(ctx, checkpointKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, unavailable(fmt.Errorf("read the checkpoint of %s: %w", s.o.Address, err))
	}
	ck, err := parseCheckpoint(s.o.Address, e.Value())
	return ck, e.Revision(), err
}

func parseCheckpoint(a Address, v []byte) (*Checkpoint, error) {
	var ck Checkpoint
	if err := json.Unmarshal(v, &ck); err != nil {
		return nil, fmt.Errorf("bucket %s: the checkpoint of %s is damaged (%v): start over with another stream", Bucket(a.Stream), a, err)
	}
	if ck.Version != CheckpointVersion || ck.Output != a.Stream {
		return nil, fmt.Errorf("bucket %s: the checkpoint is version %d of output %q; this is version %d of %q", Bucket(a.Stream), ck.Version, ck.Output, CheckpointVersion, a.Stream)
	}
	return &ck, nil
}

// ReadCheckpoint reads the checkpoint of the output at addr (nil: none). A cluster without a
// leader for the bucket for a while (a node lost) is waited for, up to openPatience.
func ReadCheckpoint(ctx context.Context, addr Address) (*Checkpoint, error) {
	deadline := time.Now().Add(openPatience)
	for {
		ck, err := readCheckpoint(ctx, addr)
		if err == nil || !leaderless(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return ck, err
		}
		time.Sleep(time.Second)
	}
}

func readCheckpoint(ctx context.Context, addr Address) (*Checkpoint, error) {
	nc, err := addr.Connect()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, Bucket(addr.Stream))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the checkpoint bucket %s on %s: %w%s", Bucket(addr.Stream), addr, err, jsHint(err))
	}
	e, err := kv.Get(ctx, checkpointKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return parseCheckpoint(addr, e.Value())
}

// writeCheckpoint writes ck as this run's, with a compare-and-set on the revision this run
// read or wrote last.
func (s *Sink) writeCheckpoint(ctx context.Context, ck Checkpoint) error {
	ck.Owner, ck.Time = s.owner, time.Now().UTC()
	v, err := json.Marshal(ck)
	if err != nil {
		return err
	}
	var rev uint64
	if s.rev == 0 {
		rev, err = s.kv.Create(ctx, checkpointKey, v)
	} else {
		rev, err = s.kv.Update(ctx, checkpointKey, v, s.rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("another tidemark sync took over %s (the checkpoint in bucket %s changed under this one, which stops; what it wrote since its last checkpoint is in the stream, and the other run resumes after it): stop one of them",
			s.o.Address, Bucket(s.o.Address.Stream))
	}
	if err != nil {
		return fmt.Errorf("%w: write the checkpoint of %s: %w", merge.ErrCommitUnknown, s.o.Address, unavailable(err))
	}
	s.rev = rev
	return nil
}

// openStream creates the stream or checks it, and reads its end: the last message's mark, and
// the keys backfilled since the checkpoint.
func (s *Sink) openStream(ctx context.Context, ck *Checkpoint) error {
	name := s.o.Address.Stream
	st, err := s.js.Stream(ctx, name)
	listed := ck != nil && ck.Stream
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if listed {
			return fmt.Errorf("stream %s, which this output wrote, is gone: the changes it held are lost to its consumers; start the output over (delete the bucket %s too, or give another stream)", name, Bucket(name))
		}
		st, err = s.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Description: "Tidemark's changes",
			Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage, Replicas: s.o.Replicas, Duplicates: s.o.DuplicateWindow,
			Retention: jetstream.LimitsPolicy})
		if err != nil {
			return unavailable(fmt.Errorf("create stream %s: %w%s", name, err, jsHint(err)))
		}
		s.o.Log.Info().Str("stream", name).Int("replicas", s.o.Replicas).Msg("created stream")
	} else if err != nil {
		return unavailable(fmt.Errorf("stream %s: %w%s", name, err, jsHint(err)))
	}
	info, err := st.Info(ctx)
	if err != nil {
		return unavailable(fmt.Errorf("stream %s: %w", name, err))
	}
	if want := name + ".>"; !slices.Equal(info.Config.Subjects, []string{want}) {
		return fmt.Errorf("stream %s takes the subjects %v, not %s alone: it is not this output's (another publisher's messages would be in it); give another stream", name, info.Config.Subjects, want)
	}
	s.seq = info.State.LastSeq
	if !listed {
		// A stream the output did not write: taken only when it holds nothing.
		if info.State.Msgs > 0 {
			return fmt.Errorf("stream %s exists and holds %d messages that no checkpoint of this output accounts for (another output's, or a run's from before): delete the stream, or give this output another stream", name, info.State.Msgs)
		}
		next := Checkpoint{Version: CheckpointVersion, Output: name, Slot: s.o.Slot, Format: s.format(), Stream: true, StreamSeq: s.seq,
			Partitions: s.o.Partitions, Tables: s.o.Tables}
		if ck != nil {
			next.Position, next.Last = ck.Position, ck.Last
		}
		return s.writeCheckpoint(ctx, next)
	}
	s.last = ck.Last
	switch {
	case s.seq < ck.StreamSeq:
		return fmt.Errorf("stream %s ends at sequence %d, before its checkpoint's %d: it was deleted and created again, or restored from a backup; start the output over with another stream", name, s.seq, ck.StreamSeq)
	case s.seq == ck.StreamSeq && ck.TailFrom == 0:
		return nil
	case s.seq > ck.StreamSeq:
		// Messages after the checkpoint: a run stopped (killed, or cut off) before
		// checkpointing them. Consumers may have read them already: they stay, and the events
		// they hold are not written again.
		m, err := st.GetMsg(ctx, s.seq)
		if err != nil {
			return unavailable(fmt.Errorf("stream %s: read its last message (%d), which came after the checkpoint: %w", name, s.seq, err))
		}
		mk, err := markOf(m.Header)
		if err != nil {
			return fmt.Errorf("stream %s: its last message (%d, subject %s) is not this output's: %v; give this output another stream", name, s.seq, m.Subject, err)
		}
		s.last = &mk // the stream's end, whatever history the checkpoint's last mark is of
	}
	if s.last != nil {
		h := *s.last
		s.horizon = &h
		s.replaying.Store(true)
		s.leftover = ck.Position == nil
	}
	// The keys backfilled after the checkpoint (or since TailFrom): the engine reads their
	// chunks again, and their rows are in the stream already (with every change after them).
	s.tailFrom = ck.StreamSeq + 1
	if ck.TailFrom > 0 {
		s.tailFrom = ck.TailFrom
	}
	var from pglogrepl.LSN
	if ck.Position != nil {
		from = ck.Position.LSN
	}
	n := 0
	err = Read(ctx, st, s.tailFrom, s.seq, func(m jetstream.Msg) error {
		h := m.Headers()
		n++
		mk, err := markOf(h)
		if err != nil {
			return fmt.Errorf("message %s is not this output's: %v; give this output another stream", m.Subject(), err)
		}
		t, op := h.Get(HeaderTable), h.Get(HeaderOp)
		switch op {
		case merge.Snapshot.String():
			if s.o.RereadPartial {
				return nil
			}
			if s.skip[t] == nil {
				s.skip[t] = map[string]bool{}
			}
			s.skip[t][storedSkipKey(h)] = true
			return nil
		case merge.Truncate.String(), merge.Refresh.String():
			delete(s.skip, t)
		case merge.Delete.String():
			// The row backfilled before it is gone: a row under its key after it may have been
			// inserted without its unchanged TOASTed values (moved onto the key), which the engine
			// reads again and the stream lacks. Both forms: the row may have been backfilled by an
			// earlier version (no HeaderKeyID) and deleted by this one.
			delete(s.skip[t], storedSkipKey(h))
			delete(s.skip[t], "json:"+h.Get(HeaderKey))
		}
		if mk.LSN < from {
			return nil // covered by the checkpoint: the run does not read it again
		}
		if op == merge.Refresh.String() {
			s.restarted[t] = true
		}
		s.replay = append(s.replay, tailMsg{mark: mk, table: t, op: op, key: h.Get(HeaderKey), timeline: h.Get(HeaderHistory)})
		return nil
	})
	if err != nil {
		return unavailable(fmt.Errorf("stream %s: read the messages after the checkpoint: %w", name, err))
	}
	if s.last != nil {
		s.o.Log.Info().Str("stream", name).Int("messages", n).Str("last", fmt.Sprintf("%s:%d:%d", s.last.LSN, s.last.Seq, s.last.Idx)).
			Msg("the stream holds messages past the checkpoint: resuming exactly after them")
	}
	return nil
}

// markOf reads a message's mark from its headers.
func markOf(h natsgo.Header) (Mark, error) {
	var m Mark
	lsn, err := pglogrepl.ParseLSN(h.Get(HeaderLSN))
	if err != nil {
		return m, fmt.Errorf("no %s header", HeaderLSN)
	}
	seq, err1 := strconv.Atoi(h.Get(HeaderSeq))
	idx, err2 := strconv.Atoi(h.Get(HeaderIdx))
	if err1 != nil || err2 != nil {
		return m, fmt.Errorf("no %s or %s header", HeaderSeq, HeaderIdx)
	}
	history, _, _ := strings.Cut(h.Get(HeaderHistory), "/") // the system id: a timeline continues its history up to its fork
	return Mark{LSN: lsn, Seq: seq, Idx: idx, History: history}, nil
}

// Read hands fn the stream's messages from sequence from to to (inclusive), in order.
func Read(ctx context.Context, st jetstream.Stream, from, to uint64, fn func(jetstream.Msg) error) error {
	if from > to {
		return nil
	}
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from})
	if err != nil {
		return err
	}
	empty, unanswered := 0, 0
	// A pull to a node that stops answers "no responders" or "server shutdown" (the node was
	// killed while it served the pull: a chaos run's node fault met an open's read).
	gone := func(err error) bool {
		return errors.Is(err, natsgo.ErrNoResponders) || errors.Is(err, jetstream.ErrServerShutdown)
	}
	for {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if gone(err) && unanswered < 60 {
			// The ordered consumer is being made again (it does so by itself after a gap or a
			// node lost), or its node is not there yet: it resumes after the last message
			// delivered.
			unanswered++
			time.Sleep(time.Second)
			continue
		}
		if err != nil {
			return err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return err
			}
			if md.Sequence.Stream > to {
				return nil
			}
			if err := fn(m); err != nil {
				return err
			}
			if md.Sequence.Stream == to {
				return nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			if gone(err) && unanswered < 60 {
				unanswered++
				time.Sleep(time.Second)
				continue
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if got == 0 {
			// Nothing up to to: the messages there were removed (limits, or a purge), or the
			// stream has no leader for now.
			info, err := st.Info(ctx)
			if err != nil {
				return err
			}
			if info.State.LastSeq <= to && info.State.Msgs == 0 || info.State.FirstSeq > to {
				return nil
			}
			if empty++; empty == 6 {
				return fmt.Errorf("stream %s: the messages up to sequence %d could not be read within 30s (deleted one by one, or no leader)", info.Config.Name, to)
			}
		}
	}
}

// Emit publishes the events' messages, each expecting the stream's last sequence to be the one
// before it.
func (s *Sink) Emit(ctx context.Context, events []merge.Event) error {
	if err := s.collect(ctx, false); err != nil {
		return err
	}
	for i := range events {
		ev := events[i] // a copy: its seq may be placed after the stream's (place)
		name := ev.Columns.Schema + "." + ev.Columns.Table
		base, ok := s.subj[name]
		if !ok {
			return fmt.Errorf("a change of %s, which has no subjects in %s (the output was opened for %v)", name, s.o.Address, s.o.Tables)
		}
		// A truncate or a refresh concerns every key of the table: it goes to every partition's
		// subject, one message each.
		broadcast := ev.Op == merge.Truncate || ev.Op == merge.Refresh
		key, msgs := []byte("{}"), s.o.Partitions
		if !broadcast {
			var err error
			if key, err = s.enc.AppendKey(ctx, nil, &ev); err != nil {
				return err
			}
			msgs = 1
		}
		from, err := s.place(&ev, name, string(key), msgs)
		if err != nil {
			return s.fail(err)
		}
		if from == msgs {
			s.skipped++
			continue
		}
		if skip := s.skip[name]; len(skip) > 0 && (ev.Op == merge.Snapshot || ev.Op == merge.Delete) {
			ids := skipKeys(&ev, key)
			passed := ev.Op == merge.Snapshot && (skip[ids[0]] || skip[ids[1]])
			// A row written by a run before, after its checkpoint, with every change since: the
			// chunk read again here brings nothing new. A delete, as in the stream's messages
			// read at open: a row under this key after it is not the one the stream has.
			delete(skip, ids[0])
			delete(skip, ids[1])
			if passed {
				s.skipped++
				continue
			}
		}
		var value []byte
		if s.o.Debezium != nil {
			value, err = s.o.Debezium.AppendValue(ctx, nil, &ev)
		} else {
			// The line without its newline, once it was written whole (an error leaves it
			// cut anywhere, empty even).
			if s.buf, err = s.enc.Append(ctx, s.buf[:0], &ev); err == nil {
				value = slices.Clone(s.buf[:len(s.buf)-1])
			}
		}
		if err != nil {
			return err
		}
		if broadcast {
			delete(s.skip, name)
			for p := from; p < msgs; p++ {
				if err := s.publish(&ev, name, base, p, p, key, value); err != nil {
					return err
				}
			}
			continue
		}
		if err := s.publish(&ev, name, base, PartitionOf(key, s.o.Partitions), 0, key, value); err != nil {
			return err
		}
	}
	return nil
}

// place decides what of an event (its msgs messages) the stream lacks: it returns the index of
// the first message to publish (msgs: none), and may move the event's seq after the stream's.
//
// Past the stream's last message, everything is published. Up to it (in the same history), the
// run reads again what a run before wrote past the checkpoint: each event must be the stream's
// next message of the same LSN, table, operation, key and index (seq aside: a table whose output
// one of the runs started over and the other not numbers the events of a transaction otherwise),
// and is not published again. The tables this run starts over are passed (their events are held
// back until their refresh, past the stream's end). At the stream's last LSN (the transaction the
// run before stopped in) the events the stream lacks follow its last message: their seq is placed
// after it. Anything else (a change the stream lacks at an LSN it went past, or one it has that
// the run does not read) is a divergence: an error, never passed over.
func (s *Sink) place(ev *merge.Event, table, key string, msgs int) (int, error) {
	h := s.horizon
	if h == nil || h.History != s.history || ev.LSN > h.LSN {
		if err := s.replayed(); err != nil {
			return 0, err
		}
		s.replaying.Store(false)
		return 0, nil
	}
	if s.refreshing[table] {
		return msgs, nil
	}
	s.dropRefreshing()
	op := ev.Op.String()
	n := 0
	for ; n < msgs && len(s.replay) > 0; n++ {
		r := s.replay[0]
		if r.mark.LSN != ev.LSN || r.table != table || r.op != op || r.key != key || r.mark.Idx != n {
			break
		}
		ev.Seq = r.mark.Seq // the rest of a broadcast the stream has part of goes with it
		s.replay = s.replay[1:]
		s.dropRefreshing()
	}
	if n == msgs {
		return msgs, nil
	}
	if len(s.replay) > 0 {
		r := s.replay[0]
		if r.timeline != s.timeline {
			return 0, s.otherTimeline(r)
		}
		return 0, s.diverged(fmt.Sprintf("at %s the stream has %s %s %s (seq %d, message %d) where this run reads %s %s %s (message %d)",
			ev.LSN, r.op, r.table, r.key, r.mark.Seq, r.mark.Idx, op, table, key, n), table, r.table)
	}
	if ev.LSN < h.LSN {
		return 0, s.diverged(fmt.Sprintf("this run reads %s %s %s at %s, which the stream does not have", op, table, key, ev.LSN), table)
	}
	// The transaction the stream stops in: what it lacks follows its last message.
	if n == 0 {
		ev.Seq = s.last.Seq + 1
	}
	return n, nil
}

// dropRefreshing drops the messages of the tables this run starts over from the head of replay.
func (s *Sink) dropRefreshing() {
	for len(s.replay) > 0 && s.refreshing[s.replay[0].table] {
		s.replay = s.replay[1:]
	}
}

// skipKeys are the forms a key of ev may have in the skip set: by the engine's key (messages
// with HeaderKeyID), and by its JSON (messages of an earlier version, without it). A key must
// not be told apart from itself by its text: numeric 8 and 8.0 are one key, with two JSON forms.
func skipKeys(ev *merge.Event, jsonKey []byte) [2]string {
	return [2]string{"id:" + hex.EncodeToString(ev.Key), "json:" + string(jsonKey)}
}

// storedSkipKey is the skip set's form of the key of a message in the stream (skipKeys).
func storedSkipKey(h natsgo.Header) string {
	if id := h.Get(HeaderKeyID); id != "" {
		return "id:" + id
	}
	return "json:" + h.Get(HeaderKey)
}

// publish sends message idx of ev.
func (s *Sink) publish(ev *merge.Event, table, base string, p, idx int, key, value []byte) error {
	mk := Mark{LSN: ev.LSN, Seq: ev.Seq, Idx: idx, History: s.history}
	for len(s.pending) >= maxPending {
		if err := s.collect(context.Background(), true); err != nil {
			return err
		}
	}
	lsn := ev.LSN.String()
	m := natsgo.NewMsg(base + "." + strconv.Itoa(p))
	m.Data = value
	m.Header.Set(HeaderOp, ev.Op.String())
	m.Header.Set(HeaderLSN, lsn)
	m.Header.Set(HeaderSeq, strconv.Itoa(ev.Seq))
	m.Header.Set(HeaderIdx, strconv.Itoa(idx))
	m.Header.Set(HeaderTable, table)
	m.Header.Set(HeaderKey, string(key))
	if ev.Key != nil {
		m.Header.Set(HeaderKeyID, hex.EncodeToString(ev.Key))
	}
	m.Header.Set(HeaderHistory, s.timeline)
	f, err := s.js.PublishMsgAsync(m, jetstream.WithExpectLastSequence(s.seq), jetstream.WithMsgID(MsgID(s.o.Slot, s.timeline, mk)))
	if err != nil {
		return s.fail(unavailable(fmt.Errorf("publish to %s: %w", m.Subject, err)))
	}
	s.seq++
	s.pending = append(s.pending, pending{f: f, seq: s.seq})
	s.last = &mk
	return nil
}

// tailMsg is a message of the stream the run must read again (Sink.replay).
type tailMsg struct {
	mark           Mark
	table, op, key string
	timeline       string // SYSTEMID/TIMELINE it was read on
}

// replayed checks, at the first event past the stream's last message, that the run read again
// every message the stream had.
func (s *Sink) replayed() error {
	s.dropRefreshing()
	if len(s.replay) == 0 {
		return nil
	}
	r := s.replay[0]
	if r.timeline != s.timeline {
		return s.otherTimeline(r)
	}
	return s.diverged(fmt.Sprintf("the stream has %s %s %s at %s (seq %d, message %d) that this run did not read", r.op, r.table, r.key, r.mark.LSN, r.mark.Seq, r.mark.Idx), r.table)
}

// otherTimeline is the error of a stream whose messages past the checkpoint were read on
// another timeline of the source than the run reads, and differ from it: a failover or a restore
// dropped the WAL they came from, so consumers have changes the source does not.
func (s *Sink) otherTimeline(r tailMsg) error {
	return fmt.Errorf("stream %s holds changes past its checkpoint read on timeline %s, which the source's history (now %s) does not have from %s on (a failover to a standby that had not received them, or a restore): its consumers have changes the source lost; to start every table's output over, run the same command once with --rebackfill all",
		s.o.Address.Stream, r.timeline, s.timeline, r.mark.LSN)
}

// diverged is the error of a run that does not read again what the stream holds past its
// checkpoint: the run that wrote it stopped its tables' output apart from the checkpoint (a
// re-backfill it began, which this run was not asked for), and a consumer of the stream would
// miss changes or keep some the source undid. Never passed over: the fix is to start those
// tables over.
func (s *Sink) diverged(what string, tables ...string) error {
	slices.Sort(tables)
	tables = slices.Compact(tables)
	return fmt.Errorf("stream %s holds changes past its checkpoint that this run does not write again: %s (a run stopped before its checkpoint with these tables' output started over, or with other tables or options); to re-backfill, run the same command once with --rebackfill %s",
		s.o.Address.Stream, what, strings.Join(tables, ","))
}

// collect takes the acknowledgements that came (all of them, waiting, when wait is set) and
// returns the first failure.
func (s *Sink) collect(ctx context.Context, wait bool) error {
	for len(s.pending) > 0 && s.err == nil {
		p := s.pending[0]
		var ack *jetstream.PubAck
		var err error
		if wait {
			select {
			case ack = <-p.f.Ok():
			case err = <-p.f.Err():
			case <-s.closed:
				// The connection is gone (no reconnection: the run starts again); its messages
				// not acknowledged get no answer.
				select {
				case ack = <-p.f.Ok():
				case err = <-p.f.Err():
				default:
					err = natsgo.ErrConnectionClosed
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		} else {
			select {
			case ack = <-p.f.Ok():
			case err = <-p.f.Err():
			default:
				return nil
			}
		}
		s.pending = s.pending[1:]
		switch {
		case err != nil:
			s.fail(s.explain(p, err))
		case ack.Duplicate:
			s.fail(fmt.Errorf("stream %s took message %s (sequence %d) as a duplicate of one it holds: the output wrote an event twice; this is a bug, please report it", s.o.Address.Stream, p.f.Msg().Header.Get(natsgo.MsgIdHdr), ack.Sequence))
		case ack.Sequence != p.seq:
			s.fail(fmt.Errorf("stream %s stored message %s at sequence %d, not %d: another publisher writes to its subjects", s.o.Address.Stream, p.f.Msg().Subject, ack.Sequence, p.seq))
		}
	}
	return s.err
}

// explain names the cause of a message's failure.
func (s *Sink) explain(p pending, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		// The stream did not end where this run expected: an earlier message of its failed
		// (this one follows it), or another writer wrote. The next run reads the stream's end.
		return fmt.Errorf("stream %s did not end at sequence %d when message %s came (%v): an earlier message failed, or another writer wrote to the stream; resuming after the stream's last message (%w)",
			s.o.Address.Stream, p.seq-1, p.f.Msg().Subject, err, pgerr.ErrTimeout)
	}
	return unavailable(fmt.Errorf("publish to %s: %w%s", p.f.Msg().Subject, err, jsHint(err)))
}

func (s *Sink) fail(err error) error {
	if s.err == nil {
		s.err = err
	}
	return s.err
}

// Checkpoint waits until the stream has acknowledged every message, then writes pos to the
// checkpoint key (a compare-and-set on its revision: a run that took the output over fences
// this one).
func (s *Sink) Checkpoint(ctx context.Context, pos *merge.Position) error {
	if err := s.collect(ctx, true); err != nil {
		return err
	}
	if h := s.horizon; h != nil && h.History == s.history && pos.LSN > h.LSN {
		// Every event up to the stream's end was read again: the stream must have no more.
		if err := s.replayed(); err != nil {
			return s.fail(err)
		}
		s.replaying.Store(false)
	}
	if s.skipped > 0 {
		s.o.Log.Info().Int("events", s.skipped).Msg("passed over events the stream had from a run before")
		s.skipped = 0
	}
	ck := Checkpoint{Version: CheckpointVersion, Output: s.o.Address.Stream, Slot: s.o.Slot, Format: s.format(), Position: pos, Stream: true,
		StreamSeq: s.seq, Last: s.last, Partitions: s.o.Partitions, Tables: s.o.Tables}
	if s.stillPending(pos) || s.horizon != nil && pos.LSN <= s.horizon.LSN {
		// Keys that may be read again, or events of the stream not read again yet: the next
		// run reads the stream from where this one did.
		ck.TailFrom = s.tailFrom
	}
	return s.writeCheckpoint(ctx, ck)
}

// pendingChunks is how many chunks per key range a table completes after a restart before the
// keys it may read again are taken as read: the chunks in flight at a kill (one per reader, each
// up to ChunkGrowth times the chunk size) are read again in at most that many.
const pendingChunks = 8

// stillPending reports whether keys to pass over may still be read again as of pos: it drops those of
// the tables whose backfill is done (or gone), or went pendingChunks chunks per range past where
// this run's first checkpoint found it.
func (s *Sink) stillPending(pos *merge.Position) bool {
	for t := range s.skip {
		p := pos.Tables[t]
		if p == nil || p.Done {
			delete(s.skip, t)
			continue
		}
		base, ok := s.chunks[t]
		if !ok || p.Chunks < base {
			s.chunks[t] = p.Chunks
			continue
		}
		if p.Chunks-base >= int64(pendingChunks*max(1, len(p.Ranges))) || len(s.skip[t]) == 0 {
			delete(s.skip, t)
		}
	}
	return len(s.skip) > 0
}

// MsgID is a message's id (Nats-Msg-Id): the slot, the source's history and the mark, so that a
// message sent twice within the duplicate window is dropped, and the same LSNs in another
// history (a restore) are not taken for it.
func MsgID(slot, history string, m Mark) string {
	return slot + ":" + history + ":" + m.LSN.String() + ":" + strconv.Itoa(m.Seq) + ":" + strconv.Itoa(m.Idx)
}

// Resume takes the source's history the run reads, and stops passing over what a run before
// wrote past the checkpoint when the run does not read those events again: the output starts
// over, or the history is another (a restore, a failover), where the same LSNs are other changes.
func (s *Sink) Resume(pos *merge.Position, over bool) {
	s.history, s.timeline = pos.SystemID, fmt.Sprintf("%s/%d", pos.SystemID, pos.Timeline)
	if s.last != nil && (over || s.last.History != s.history) {
		s.o.Log.Warn().Str("history", s.history).Str("written_in", s.last.History).Bool("over", over).
			Msg("the stream's messages past the checkpoint were read in another history of the source, or the output starts over: nothing is passed over")
		s.last, s.horizon, s.skip, s.replay = nil, nil, map[string]map[string]bool{}, nil
		s.replaying.Store(false)
	}
	for t, p := range pos.Tables {
		if p != nil && p.Refresh {
			s.refreshing[t] = true
		}
	}
}

// Leftover reports whether the stream holds messages past a checkpoint without a position (a
// run that ended before its first checkpoint) read before start, where the run's slot starts
// (merge.Leftover): the slot was created again, the run reads none of them again, and it starts
// every table over.
func (s *Sink) Leftover(start pglogrepl.LSN) bool {
	return s.leftover && s.horizon != nil && start > s.horizon.LSN
}

// Replaying reports whether the run has yet to read again what the stream holds past the
// checkpoint (merge.Replayer): a table's output must not start over meanwhile.
func (s *Sink) Replaying() bool { return s.replaying.Load() }

// Close closes the connection; messages not acknowledged stay as the stream took them (the
// next run reads the stream's end).
func (s *Sink) Close(context.Context) error {
	if s.nc != nil {
		s.nc.Close()
		s.nc = nil
	}
	return nil
}

// unavailable marks an error of reaching the servers as one to reconnect after.
func unavailable(err error) error {
	if err == nil || pgerr.Reconnectable(err) {
		return err
	}
	if errors.Is(err, natsgo.ErrConnectionClosed) || errors.Is(err, natsgo.ErrNoServers) || errors.Is(err, natsgo.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, natsgo.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, natsgo.ErrDisconnected) || errors.Is(err, natsgo.ErrConnectionReconnecting) ||
		errors.Is(err, jetstream.ErrJetStreamPublisherClosed) || isClusterUnavailable(err) {
		return fmt.Errorf("%w (%w)", err, pgerr.ErrTimeout)
	}
	return err
}

// leaderless reports an error of servers that answer but have no leader for a stream or bucket
// yet (a node lost, an election): worth waiting for, unlike servers that cannot be reached.
func leaderless(err error) bool {
	return errors.Is(err, natsgo.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, natsgo.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || isClusterUnavailable(err)
}

// isClusterUnavailable: the stream has no leader for now (a node down, an election).
func isClusterUnavailable(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == 503 || apiErr.Code == 408
	}
	return strings.Contains(err.Error(), "no suitable peers") || strings.Contains(err.Error(), "insufficient resources")
}

// jsHint says what a JetStream error may mean.
func jsHint(err error) string {
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return " (JetStream is not enabled on the server, or for this account: start nats-server with -js)"
	case strings.Contains(err.Error(), "insufficient resources"), strings.Contains(err.Error(), "no suitable peers"):
		return " (the cluster has fewer servers than the replicas asked for: --nats-replicas)"
	}
	return ""
}

// Flush waits until the stream has acknowledged every message sent, without a checkpoint.
func (s *Sink) Flush(ctx context.Context) error { return s.collect(ctx, true) }
