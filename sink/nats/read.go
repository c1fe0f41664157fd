package nats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// WriteLines writes the messages of the output at addr to w as JSON lines (the tidemark
// format's), in the stream's order, which is the output's: a truncate or a refresh, sent to every
// partition's subject, is written once. It is how a test, or the chaos harness's oracle, reads
// back what a consumer of the whole stream sees. It also returns what one consumer per subject
// would see otherwise: a truncate or a refresh missing from a subject of its table, a key on two
// subjects, a message that is not the output's.
func WriteLines(ctx context.Context, addr Address, w io.Writer) ([]string, error) {
	nc, err := addr.Connect()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	// A cluster that just lost or got back a node may have no leader for the stream for a while.
	var st jetstream.Stream
	var info *jetstream.StreamInfo
	for try := 0; ; try++ {
		st, err = js.Stream(ctx, addr.Stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, nil
		}
		if err == nil {
			info, err = st.Info(ctx)
		}
		if err == nil || try == 60 || ctx.Err() != nil || unavailable(err) == err {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		return nil, err
	}
	if info.State.Msgs == 0 {
		return nil, nil
	}
	partitions := 0
	if kv, err := js.KeyValue(ctx, Bucket(addr.Stream)); err == nil {
		if e, err := kv.Get(ctx, checkpointKey); err == nil {
			if ck, err := parseCheckpoint(addr, e.Value()); err == nil {
				partitions = ck.Partitions
			}
		}
	}
	var problems []string
	subjectOf := map[string]string{} // table + key: subject
	type broadcast struct {
		mark  Mark
		table string
		seen  map[int]bool
	}
	var open *broadcast
	parts := map[string]int{} // table: subjects seen (the most partitions of the table)
	closeOpen := func() {
		if open == nil {
			return
		}
		if n := parts[open.table]; len(open.seen) < n {
			problems = append(problems, fmt.Sprintf("the truncate or refresh of %s at %s:%d is on %d of its %d subjects", open.table, open.mark.LSN, open.mark.Seq, len(open.seen), n))
		}
		open = nil
	}
	err = Read(ctx, st, info.State.FirstSeq, info.State.LastSeq, func(m jetstream.Msg) error {
		h := m.Headers()
		mk, err := markOf(h)
		if err != nil {
			problems = append(problems, fmt.Sprintf("message on %s is not the output's: %v", m.Subject(), err))
			return nil
		}
		table, key := h.Get(HeaderTable), h.Get(HeaderKey)
		p, _ := strconv.Atoi(lastToken(m.Subject()))
		parts[table] = max(parts[table], p+1, partitions)
		if open != nil && (open.mark.LSN != mk.LSN || open.mark.Seq != mk.Seq) {
			closeOpen()
		}
		switch op := h.Get(HeaderOp); op {
		case "truncate", "refresh":
			if open == nil {
				open = &broadcast{mark: mk, table: table, seen: map[int]bool{}}
			}
			open.seen[p] = true
			if mk.Idx > 0 {
				return nil
			}
		default:
			if s, ok := subjectOf[table+"\x00"+key]; ok && s != m.Subject() {
				problems = append(problems, fmt.Sprintf("key %s of %s is on subjects %s and %s: its changes are not in one order", key, table, s, m.Subject()))
			}
			subjectOf[table+"\x00"+key] = m.Subject()
		}
		if _, err := w.Write(m.Data()); err != nil {
			return err
		}
		_, err = w.Write([]byte{'\n'})
		return err
	})
	closeOpen()
	return problems, err
}

func lastToken(subject string) string {
	for i := len(subject) - 1; i >= 0; i-- {
		if subject[i] == '.' {
			return subject[i+1:]
		}
	}
	return subject
}
