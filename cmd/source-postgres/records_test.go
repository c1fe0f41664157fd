package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/merge"
)

// recordLines parses the RECORD lines written to it, keeping what the test looks at.
type recordLines struct {
	partial []byte
	records []outRecord
	err     error
}

type outRecord struct {
	updatedAt string
	emittedAt int64
}

func (w *recordLines) Write(p []byte) (int, error) {
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		var m struct {
			Record struct {
				Data      map[string]any `json:"data"`
				EmittedAt int64          `json:"emitted_at"`
			} `json:"record"`
		}
		if err := json.Unmarshal(w.partial[:i], &m); err != nil && w.err == nil {
			w.err = err
		}
		at, _ := m.Record.Data["_ab_cdc_updated_at"].(string)
		w.records = append(w.records, outRecord{updatedAt: at, emittedAt: m.Record.EmittedAt})
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

// TestRecordSinkBoundsEarlyKeys: a transaction whose records outgrow what the sink holds back is
// written in parts; the keys already written, remembered so that a later record of one of them
// gets a later emitted_at, stay within a bound however many rows the transaction has, and every
// later record of a key already written still gets a later emitted_at than its earlier one.
func TestRecordSinkBoundsEarlyKeys(t *testing.T) {
	out := &recordLines{}
	r := &reader{s: &source{out: newOutput(out, nil)}}
	// Records of about 1 kB (the stream's name is long): a part of maxTxBytes holds fewer keys
	// than maxEarlyKeys, so the first part's keys are remembered one by one, and the later
	// parts' go past the bound.
	name := "t" + strings.Repeat("x", 1200)
	ns := "public"
	st := &readStream{desc: streamDescriptor{Name: name, Namespace: &ns}, schema: "public", name: name}
	s := newRecordSink(r, []*readStream{st})
	cols := &merge.Columns{Schema: "public", Table: name}

	// A key's records carry its number in their commit time: inserts from t0, updates from t1.
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(24 * time.Hour)
	const lsn = 0x1000
	event := func(op merge.Op, k int) merge.Event {
		at := t0
		if op == merge.Update {
			at = t1
		}
		return merge.Event{Op: op, Columns: cols, Key: []byte(strconv.Itoa(k)), LSN: lsn, Time: at.Add(time.Duration(k) * time.Microsecond)}
	}
	ctx := context.Background()
	maxEarly := 0
	// Each call hands over a key's insert and its update with the parts written in between:
	// the records of one call share their emitted_at unless the sink waits for a later one.
	emit := func(evs ...merge.Event) {
		require.NoError(t, s.Emit(ctx, evs))
		maxEarly = max(maxEarly, len(s.early))
	}
	inserts := func(from, to int) []merge.Event {
		var evs []merge.Event
		for k := from; k < to; k++ {
			evs = append(evs, event(merge.Insert, k))
		}
		return evs
	}
	const keys = 200_000
	// Keys 0 and 1 are written in the first part, and remembered.
	emit(append(inserts(0, 60_000), event(merge.Update, 0), event(merge.Update, 1))...)
	// Keys 100,000 and 150,000 are written in parts past the bound; the last key is still held
	// when it is updated, and collapses into one record.
	emit(append(inserts(60_000, keys), event(merge.Update, 2), event(merge.Update, 100_000), event(merge.Update, 150_000), event(merge.Update, keys-1))...)
	require.NoError(t, s.flush())
	require.NoError(t, out.err)

	require.LessOrEqual(t, maxEarly, maxEarlyKeys, "keys remembered for one transaction")
	first := map[string]int64{}  // insert records by commit time
	second := map[string]int64{} // update records by the same key's insert commit time
	for _, rec := range out.records {
		at, err := time.Parse("2006-01-02T15:04:05.000000Z", rec.updatedAt)
		require.NoError(t, err)
		if at.Before(t1) {
			first[at.Format(time.RFC3339Nano)] = rec.emittedAt
		} else {
			second[at.Add(-24*time.Hour).Format(time.RFC3339Nano)] = rec.emittedAt
		}
	}
	key := func(k int) string { return t0.Add(time.Duration(k) * time.Microsecond).Format(time.RFC3339Nano) }
	require.Len(t, second, 6)
	require.Len(t, first, keys-1, "every insert written once, but the one collapsed into its update")
	require.NotContains(t, first, key(keys-1))
	for _, k := range []int{0, 1, 2, 100_000, 150_000} {
		require.Contains(t, first, key(k))
		require.Greater(t, second[key(k)], first[key(k)], "key %d: its later record must have a later emitted_at", k)
	}
}

// TestHeartbeatStateNeverFollowsRecords: the heartbeat's state is written only when no record
// waits for a state, checked under the lock records are written under. It used to check first
// and write after, so a batch of records could slip in between and be committed by a state at
// the older position (emitted again by a read resumed from it). Found reviewing a CI failure.
func TestHeartbeatStateNeverFollowsRecords(t *testing.T) {
	var buf bytes.Buffer
	o := newOutput(&buf, nil)
	make := func() *stateMessage { return &stateMessage{Type: "GLOBAL"} }
	require.NoError(t, o.writeRecords([]byte("{\"type\":\"RECORD\"}\n"), 1))
	wrote, err := o.stateIfIdle(0, make)
	require.NoError(t, err)
	require.False(t, wrote, "a record waits for a state")
	require.NoError(t, o.state(make))
	wrote, err = o.stateIfIdle(time.Hour, make)
	require.NoError(t, err)
	require.False(t, wrote, "a state went out within the interval")
	wrote, err = o.stateIfIdle(0, make)
	require.NoError(t, err)
	require.True(t, wrote)
	require.NoError(t, o.flush())
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 3)
	require.Contains(t, lines[0], "RECORD")
	require.Contains(t, lines[1], `"recordCount":1.0`)
	require.Contains(t, lines[2], `"recordCount":0.0`)
}
