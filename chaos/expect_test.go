package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/merge"
)

// TestFailureText: the error a capture process stopped with is what it printed last, not its
// exit status: tidemark's "tidemark sync: ..." line with its hint (after JSON log lines that do
// not say "error"), the Airbyte connector's TRACE ERROR.
// TestUnavailableIsNotStuck: a capture that fails at once, again and again, because the source
// or the target is restarting (a fault that ended with the run; a 5-minute run outside CI, seed
// 2026, postgres, every family: 30 failures in 16 s, "the capture could not resume" though the
// final catch-up then succeeded) is not a capture that cannot resume; the same error about its
// own state is.
func TestUnavailableIsNotStuck(t *testing.T) {
	for _, f := range []string{
		`tidemark sync: connect to database "chaos" on 127.0.0.1:36973 as user "postgres": failed to connect to ` + "`user=postgres database=chaos`" + `: 127.0.0.1:36973 (127.0.0.1): server error: FATAL: the database system is not yet accepting connections (SQLSTATE 57P03)`,
		`tidemark sync: target: failed to connect: dial tcp 127.0.0.1:5432: connect: connection refused`,
	} {
		require.True(t, unavailable(f), f)
	}
	require.False(t, unavailable(`tidemark sync: the position is behind the replication slot`))
}

func TestFailureText(t *testing.T) {
	syncErr := `{"level":"info","message":"starting"}` + "\n" +
		`{"level":"warn","table":"tidemark_chaos.notes","message":"chunk abandoned"}` + "\n" +
		"tidemark sync: a change of a captured table cannot be placed: tidemark_chaos.notes at 0/1A2B3C4: its key column \"code\" arrived NULL; restore it\n" +
		"to re-backfill it, run the same command once with --rebackfill tidemark_chaos.notes\n"
	got := failureText(syncErr, &errTrace{}, errors.New("exit status 1"))
	require.Contains(t, got, "tidemark sync: a change of a captured table cannot be placed: tidemark_chaos.notes")
	require.Contains(t, got, "--rebackfill tidemark_chaos.notes")

	tr := &errTrace{}
	tr.set("config_error", "table tidemark_chaos.items was truncated on the source (transaction 12, commit 0/16)")
	require.Equal(t, "[config_error] table tidemark_chaos.items was truncated on the source (transaction 12, commit 0/16)",
		failureText(`{"level":"error","error":"x"}`, tr, errors.New("exit status 1")))

	// Killed: no message; the exit status is all there is.
	require.Equal(t, "signal: killed", failureText(`{"level":"info","message":"x"}`, &errTrace{}, errors.New("signal: killed")))
	require.Equal(t, `{"level":"error","error":"receive: EOF"}`, failureText(`{"level":"error","error":"receive: EOF"}`+"\n", &errTrace{}, errors.New("exit status 1")))
}

// TestCausesAndExpectations: a stop matches an expectation by its cause and its table, and only
// for processes started before the expectation was retired.
func TestCausesAndExpectations(t *testing.T) {
	un := (&merge.UnplaceableError{Table: "tidemark_chaos.notes", Reason: "its key column \"code\" arrived NULL", Fix: "restore"}).Error()
	require.Equal(t, []cause{causeUnplaceable}, causesOf("tidemark sync: "+un))
	pub := fmt.Errorf("%w: %w; add it back", merge.ErrPublicationChanged, fmt.Errorf("%w: tidemark_chaos.items is not in publication p", chunker.ErrNotPublished)).Error()
	require.ElementsMatch(t, []cause{causePublication, causeNotInPub}, causesOf(pub))
	ahead := (&merge.PositionAheadError{Position: "0/5", Server: "0/4"}).Error()
	require.Equal(t, []cause{causeAhead}, causesOf(ahead))
	require.Empty(t, causesOf("receive message: unexpected EOF"))
	require.Equal(t, []cause{causeStreamGone}, causesOf("[config_error] the table of stream(s) tidemark_chaos.notes no longer exists (dropped or renamed), or this role cannot see it"))
	require.Equal(t, []cause{causeColumnGone}, causesOf(`tidemark sync: target table "tidemark_chaos"."notes" lacks the source's column(s) x3 and has x1, which the source does not: a renamed column, or one dropped and another added? If renamed, run on the target: ...`))

	now := time.Now()
	e := &expectation{kind: "identity", table: "tidemark_chaos.notes", causes: []cause{causeUnplaceable, causeKeyChanged}, refresh: true, undone: make(chan struct{})}
	require.True(t, e.matches(now, un, causesOf(un)))
	require.False(t, e.matches(now, pub, causesOf(pub)), "another cause")
	other := (&merge.UnplaceableError{Table: "tidemark_chaos.notes_x", Reason: "r", Fix: "f"}).Error()
	require.False(t, e.matches(now, other, causesOf(other)), "another table")
	e.retired = now
	require.True(t, e.matches(now.Add(-time.Second), un, causesOf(un)), "a process started before the retirement")
	require.False(t, e.matches(now.Add(time.Second), un, causesOf(un)), "a process started after it")

	all := &expectation{kind: "restore", causes: positionCauses, refresh: true, undone: make(chan struct{})}
	require.True(t, all.matches(now, ahead, causesOf(ahead)))
}

// TestFailedJudges: a stop an expectation allows is counted and remedied; the same stop with no
// expectation, or after it was retired, is a violation; a failure naming no cause is counted.
func TestFailedJudges(t *testing.T) {
	capt := &fakeCapture{}
	r := &run{sch: "tidemark_chaos", stops: map[string]int{}, remedies: map[string]int{}, otherFailures: map[string]int{}, capt: capt}
	un := "tidemark sync: " + (&merge.UnplaceableError{Table: "tidemark_chaos.notes", Reason: "r", Fix: "f"}).Error()
	require.False(t, r.failed(t.Context(), time.Now(), un))
	require.Len(t, r.violations, 1, "a clear stop nothing explains")

	// A fault on the table that never stops the capture: covered by a re-backfill asked after it.
	quiet := r.expect("truncate", "tidemark_chaos.notes", true, nil, causeTruncated)
	require.NoError(t, quiet.restore(t.Context()))
	undone := 0
	e := r.expect("identity", "tidemark_chaos.notes", true, func(context.Context) error { undone++; return nil }, causeUnplaceable, causeKeyChanged)
	capt.cp = &checkpointInfo{raw: "before"}
	require.True(t, r.failed(t.Context(), time.Now(), un))
	require.Equal(t, 1, undone, "the change is undone first")
	require.Equal(t, []string{"tidemark_chaos.notes"}, capt.asked)
	require.Equal(t, map[string]int{"identity": 1}, r.stops)
	require.Equal(t, map[string]int{"undo identity": 1, "rebackfill tidemark_chaos.notes": 1}, r.remedies)
	require.True(t, r.busy("tidemark_chaos.notes"))

	// Retired once the re-backfill has started in a checkpoint written since it was asked for:
	// not while the checkpoint is the one of the stop, nor while it only asks for it.
	all := func(refresh bool) map[string]bool {
		m := map[string]bool{}
		for name := range keysIn("tidemark_chaos") {
			m[name] = refresh
		}
		return m
	}
	capt.cp = &checkpointInfo{raw: "before", Tables: all(true), Refresh: all(false)}
	r.settle(t.Context())
	require.True(t, e.retired.IsZero(), "the checkpoint of the stop")
	capt.cp = &checkpointInfo{raw: "asked", Tables: all(true), Refresh: map[string]bool{"tidemark_chaos.notes": true}}
	r.settle(t.Context())
	require.True(t, e.retired.IsZero(), "asked for, not started")
	require.True(t, r.busy("tidemark_chaos.notes"), "no other fault on the table until it started")
	capt.cp = &checkpointInfo{raw: "started", Tables: all(true), Refresh: all(false)}
	r.settle(t.Context())
	require.False(t, e.retired.IsZero())
	require.False(t, quiet.retired.IsZero(), "covered by the re-backfill")

	// A lasting cause: each of its stops takes the remedy, and it is never retired.
	remedies := 0
	col := r.lasting("column", "tidemark_chaos.notes", func(context.Context) error { remedies++; return nil }, causeColumnGone)
	require.Same(t, col, r.lasting("column", "tidemark_chaos.notes", nil, causeColumnGone))
	require.False(t, r.busy("tidemark_chaos.notes"), "a shared expectation leaves the table to other faults")
	gone := `tidemark sync: target table "tidemark_chaos"."notes" lacks the source's column(s) x3 and has x1, which the source does not: a renamed column, or one dropped and another added?`
	require.True(t, r.failed(t.Context(), time.Now(), gone))
	require.True(t, r.failed(t.Context(), time.Now().Add(time.Minute), gone))
	require.True(t, col.retired.IsZero())
	require.Equal(t, 2, remedies)
	require.Equal(t, 2, r.stops["column"])
	require.False(t, r.busy("tidemark_chaos.notes"))
	require.False(t, r.failed(t.Context(), time.Now().Add(time.Second), un))
	require.Len(t, r.violations, 2, "the same stop after the remedy is durable")

	require.False(t, r.failed(t.Context(), time.Now(), "tidemark sync: receive message: unexpected EOF"))
	require.Equal(t, map[string]int{"tidemark sync: receive message: unexpected EOF": 1}, r.otherFailures)
	require.Len(t, r.violations, 2, "a connection failure is not a violation")
	require.False(t, r.failed(t.Context(), time.Now(), `tidemark sync: apply to target: ERROR: column "x3" of relation "notes" does not exist (SQLSTATE 42703)`))
	require.Len(t, r.violations, 3, "a failure that names no cause and is no connection failure is one")
	require.False(t, r.failed(t.Context(), time.Now(), "[transient_error] read a snapshot: unexpected EOF"))
	require.False(t, r.failed(t.Context(), time.Now(), "[system_error] something unexpected"))
	require.Len(t, r.violations, 4)
}

// TestWithoutStream: the platform's reset of a stream drops its entry from the state and keeps
// the others and the shared position.
func TestWithoutStream(t *testing.T) {
	state := `[{"type":"GLOBAL","global":{"shared_state":{"tidemark":1,"lsn":100,"lsn_text":"0/64","timeline":2,"invisible":"7-9,12"},"stream_states":[` +
		`{"stream_descriptor":{"name":"notes","namespace":"tidemark_chaos"},"stream_state":{"sync_mode":"incremental","done":true,"key":["code"]}},` +
		`{"stream_descriptor":{"name":"items","namespace":"tidemark_chaos"},"stream_state":{"sync_mode":"incremental","done":false,"refresh":true,"key":["tenant","sku"]}}]}}]`
	out := withoutStream([]byte(state), "tidemark_chaos.notes")
	cp, err := parseAirbyteState(out)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"tidemark_chaos.items": true}, cp.Tables)
	require.True(t, cp.Refresh["tidemark_chaos.items"])
	require.EqualValues(t, 100, cp.LSN)
	require.EqualValues(t, 2, cp.Timeline)
	require.True(t, cp.invisible(8))
	require.True(t, cp.invisible(12))
	require.False(t, cp.invisible(10))
	var v []map[string]any
	require.NoError(t, json.Unmarshal(out, &v))
	require.Equal(t, "GLOBAL", v[0]["type"])
	require.Nil(t, withoutStream(nil, "tidemark_chaos.notes"))
}

// TestParsePosition reads a checkpoint's position as merge writes it.
func TestParsePosition(t *testing.T) {
	b, err := json.Marshal(merge.Position{Version: merge.PositionVersion, LSN: 0x16B3748, Timeline: 3,
		Tables:    map[string]*merge.TableProgress{"tidemark_chaos.txlog": {Refresh: true}, "tidemark_chaos.notes": {Done: true}},
		Invisible: &merge.XIDs{5, 6, 7, 40}})
	require.NoError(t, err)
	cp, err := parsePosition(b)
	require.NoError(t, err)
	require.EqualValues(t, 0x16B3748, cp.LSN)
	require.EqualValues(t, 3, cp.Timeline)
	require.True(t, cp.Refresh["tidemark_chaos.txlog"])
	require.False(t, cp.Refresh["tidemark_chaos.notes"])
	require.True(t, cp.Tables["tidemark_chaos.notes"])
	require.True(t, cp.invisible(6))
	require.True(t, cp.invisible(40))
	require.False(t, cp.invisible(8))
}

// TestExpandFaults: families stand for their kinds; the default is the default family.
func TestExpandFaults(t *testing.T) {
	def, err := expandFaults(nil)
	require.NoError(t, err)
	require.Equal(t, []string{"kill", "restart", "walsender", "drop", "reset", "stall", "commit-stall", "slow-consumer", "broker", "node"}, def)
	both, err := expandFaults([]string{"ddl", "kill"})
	require.NoError(t, err)
	require.Equal(t, []string{"rename", "column", "identity", "publication", "truncate", "rewrite", "publish", "persist", "rebackfill", "standby-restart", "restore", "kill"}, both)
	_, err = expandFaults([]string{"ddl", "nope"})
	require.ErrorContains(t, err, `unknown fault "nope"`)
}

// TestFillAdded: a replayed row without a column the harness added (written before the column
// existed) has NULL there, as in the source; a value the output has is kept, so a difference
// stays one; columns the harness did not add are left alone.
func TestFillAdded(t *testing.T) {
	s := newSchemaState("tidemark_chaos")
	s.columnAdded("notes", "x1")
	str := func(v string) *string { return &v }
	src := map[string]map[string]*string{
		`"n-1"`: {"code": str(`"n-1"`), "body": str(`"b"`), "x1": str("null")},
		`"n-2"`: {"code": str(`"n-2"`), "body": str(`"b"`), "x1": str(`"x"`)},
	}
	replay := map[string]map[string]*string{
		`"n-1"`: {"code": str(`"n-1"`)},
		`"n-2"`: {"code": str(`"n-2"`), "x1": str(`"y"`)},
	}
	s.fillAdded("tidemark_chaos.notes", replay, src)
	require.Equal(t, "null", *replay[`"n-1"`]["x1"])
	require.Equal(t, `"y"`, *replay[`"n-2"`]["x1"])
	_, has := replay[`"n-1"`]["body"]
	require.False(t, has)
}

// fakeCapture records the re-backfills asked of it, and has the checkpoint cp.
type fakeCapture struct {
	asked []string
	cp    *checkpointInfo
}

func (f *fakeCapture) prepare(context.Context) error                       { return nil }
func (f *fakeCapture) start(context.Context) (*process, error)             { return nil, errors.New("fake") }
func (f *fakeCapture) slow(context.Context, time.Duration) string          { return "" }
func (f *fakeCapture) second(context.Context) string                       { return "" }
func (f *fakeCapture) finish(context.Context) error                        { return nil }
func (f *fakeCapture) verify(context.Context, *Report) error               { return nil }
func (f *fakeCapture) remedied([]string)                                   {}
func (f *fakeCapture) checkpoint(context.Context) (*checkpointInfo, error) { return f.cp, nil }
func (f *fakeCapture) rebackfill(_ context.Context, table string) string {
	f.asked = append(f.asked, table)
	return "rebackfill"
}

// TestRoundReadsToTheEnd: a round's output is read to its end, however fast the connector
// exits after printing it: the last records, their STATE and the TRACE ERROR after them are
// not lost (the harness once closed the pipe when the process exited, before reading it all).
func TestRoundReadsToTheEnd(t *testing.T) {
	dir := t.TempDir()
	var out []byte
	for i := range 3000 {
		out = fmt.Appendf(out, `{"type":"RECORD","record":{"namespace":"tidemark_chaos","stream":"notes","data":{"code":"n-%d","ver":%d,"body":"%0200d"}}}`+"\n", i, i+1, i)
	}
	out = append(out, `{"type":"STATE","state":{"type":"GLOBAL","global":{"shared_state":{"lsn":7},"stream_states":[]}}}`+"\n"...)
	out = append(out, `{"type":"TRACE","trace":{"type":"ERROR","emitted_at":1.0,"error":{"message":"m","internal_message":"boom","failure_type":"system_error"}}}`+"\n"...)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "out"), out, 0o600))
	script := filepath.Join(dir, "connector")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\ncat "+filepath.Join(dir, "out")+"\nexit 1\n"), 0o700))
	for i := range 20 {
		r := &run{cfg: Config{Connector: script, Dir: dir}}
		c := newAirbyteCapture(r)
		p, err := c.round(t.Context(), filepath.Join(dir, "config.json"))
		require.NoError(t, err)
		<-p.done
		require.Equal(t, "[system_error] boom", p.failure(), "round %d", i)
		require.Equal(t, 3000, c.oracle.Records(), "round %d", i)
		cp, err := c.checkpoint(t.Context())
		require.NoError(t, err)
		require.EqualValues(t, 7, cp.LSN)
	}
}

// TestReportEffective: faults without effect are counted apart, and the report's replay command
// carries everything a run needs to be replayed.
func TestReportEffective(t *testing.T) {
	r := &run{sup: &supervisor{}}
	require.Equal(t, noEffect+"no capture running", r.inject(t.Context(), "kill", time.Second, nil), "a kill with no capture did nothing")

	rep := &Report{Mode: JSONL, Seed: 7, Faults: map[string]int{"kill": 3, "walsender": 2, "stall": 1}, Void: map[string]int{"kill": 1, "walsender": 2}}
	require.Equal(t, map[string]int{"kill": 2, "stall": 1}, rep.Effective())
	var b strings.Builder
	rep.Write(&b)
	require.Contains(t, b.String(), "faults: 6 injected, 3 effective (kill=2 stall=1), without effect: kill=1 walsender=2")

	r = &run{cfg: Config{Mode: Postgres, Seed: 9, Duration: 3 * time.Minute, FaultEvery: 2 * time.Second, Rows: 500, ChunkSize: 70,
		MaxChunkBytes: 4096, Break: "no-fence", InTurn: true, Source: "postgres://u:secret@h/db"}, transport: "table", faultsArg: "default,fence"}
	cmd := r.command()
	require.Equal(t, "tidemark chaos --mode postgres --seed 9 --duration 3m0s --fault-every 2s --rows 500 --chunk-size 70 --max-chunk-bytes 4096 --faults default,fence --watermarks table --in-turn --break no-fence --source SOURCE", cmd)
	require.NotContains(t, cmd, "secret")
}

// TestStaleAgainstApplied: a row the target took is at least as new as what the source
// transactions applied with it or before wrote of its key; a stale chunk row folded with the
// change it hides (one row in the target's history, no version going back) is caught.
func TestStaleAgainstApplied(t *testing.T) {
	versions := map[uint32][]written{1: {{"accounts", "5", 7}}, 2: {{"accounts", "5", 8}}, 3: {{"accounts", "5", 9}}, 4: {{"accounts", "5", 12}}}
	ledger := []ledgerEntry{{20, 3, "0/3"}, {10, 1, "0/1"}, {20, 2, "0/2"}, {30, 4, "0/4"}}
	good := []histChange{
		{"accounts", "INSERT", "5", 7, 10},
		// Pieces of one target transaction: the last row counts.
		{"accounts", "UPDATE", "5", 8, 20},
		{"accounts", "UPDATE", "5", 9, 20},
		// A backfilled row newer than anything applied.
		{"accounts", "UPDATE", "6", 11, 20},
	}
	require.Empty(t, staleAgainstApplied(good, ledger, versions, nil))
	// Transaction 4 (version 12) applied at 30, but the target took a stale chunk row instead.
	bad := append(slices.Clone(good), histChange{"accounts", "UPDATE", "5", 10, 30})
	v := staleAgainstApplied(bad, ledger, versions, nil)
	require.Len(t, v, 1)
	require.Contains(t, v[0], `target history: I2: accounts key "5" took version 10, older than version 12 that source transaction 4`)
	// Unless transaction 4 committed while the table was out of the publication: the engine never
	// received its version, so the chunk could not be told of it.
	require.Empty(t, staleAgainstApplied(bad, ledger, versions, unreceived([]pubDrop{{"accounts", 4, 4}})))
	// A span before it leaves transaction 4's version in: the stale row is still caught, however
	// late the target applied it.
	require.Len(t, staleAgainstApplied(bad, ledger, versions, unreceived([]pubDrop{{"accounts", 1, 3}})), 1)
	// Another table's span leaves nothing of this one out.
	require.Len(t, staleAgainstApplied(bad, ledger, versions, unreceived([]pubDrop{{"items", 1, 10}})), 1)
}

// TestClaimsProgress: a state the second read re-emits with the position it was given and no
// records before it claims nothing, whatever its streams' entries say; another position, or
// records, do; and with no state given, a state without a position claims nothing.
func TestClaimsProgress(t *testing.T) {
	given := []byte(`[{"type":"GLOBAL","global":{"shared_state":{"lsn":10},"stream_states":[{"a":1}]},"sourceStats":{"recordCount":5}}]`)
	require.False(t, claimsProgress([]byte(`{"type":"GLOBAL","global":{"shared_state":{"lsn":10},"stream_states":[{"a":1},{"b":"refresh"}]},"sourceStats":{"recordCount":0}}`), given))
	require.True(t, claimsProgress([]byte(`{"type":"GLOBAL","global":{"shared_state":{"lsn":11}},"sourceStats":{"recordCount":0}}`), given))
	require.True(t, claimsProgress([]byte(`{"type":"GLOBAL","global":{"shared_state":{"lsn":10}},"sourceStats":{"recordCount":3}}`), given), "records before it")
	require.False(t, claimsProgress([]byte(`{"type":"GLOBAL","global":{"shared_state":null,"stream_states":[]}}`), nil))
	require.True(t, claimsProgress([]byte(`{"type":"GLOBAL","global":{"shared_state":{"lsn":10}}}`), nil), "a position of its own")
}

// TestStateBeforePositionStartsNothing: before a read's first checkpoint the connector's state
// has no shared position and streams without progress (a heartbeat while the slot is made or
// the first chunk is read). Such a state must not count as every re-backfill started: the
// harness took a restore's reset as done then, and the next fault met a run that had not yet
// recorded anything (found reviewing a CI failure, 2026-12-02).
func TestStateBeforePositionStartsNothing(t *testing.T) {
	state := `[{"type":"GLOBAL","global":{"shared_state":null,"stream_states":[` +
		`{"stream_descriptor":{"name":"accounts","namespace":"tidemark_chaos"},"stream_state":{"sync_mode":"incremental"}},` +
		`{"stream_descriptor":{"name":"items","namespace":"tidemark_chaos"},"stream_state":{"sync_mode":"incremental"}}]}}]`
	cp, err := parseAirbyteState([]byte(state))
	require.NoError(t, err)
	all := map[string][]string{"tidemark_chaos.accounts": nil, "tidemark_chaos.items": nil}
	require.False(t, cp.started("", all), "no stream has progress yet")
	require.False(t, cp.started("tidemark_chaos.accounts", all))
}

// TestStateSummary: the journal's line for a round names the state's position and each stream's
// pending refresh and membership.
func TestStateSummary(t *testing.T) {
	state := `[{"type":"GLOBAL","global":{"shared_state":{"tidemark":1,"lsn":100},"stream_states":[` +
		`{"stream_descriptor":{"name":"notes","namespace":"c"},"stream_state":{"sync_mode":"incremental","key":["code"],"publication":"rel:5"}},` +
		`{"stream_descriptor":{"name":"items","namespace":"c"},"stream_state":{"sync_mode":"incremental","refresh":true,"key":["tenant","sku"]}}]}}]`
	require.Equal(t, ": position 0/64, streams c.items refresh ; c.notes rel:5", stateSummary([]byte(state)))
	require.Empty(t, stateSummary(nil))
}

// TestTailCountsMarksAcrossWrites: the marks a capture's output carries are counted wherever the
// writes cut them, once each, past what the tail keeps; the second-capture fault tells a capture
// that holds its output (it streamed since it last let it go: a reconnection, a rerun) from one
// still starting by the marks' order.
func TestTailCountsMarksAcrossWrites(t *testing.T) {
	stream, rerun := `{"message":"start replication"}`+"\n", string(rerunMark)+"\n"
	reconnect := string(reconnectMark) + "\n"
	for _, cut := range []int{1, 3, 7, 64, 4096} {
		tl := newTail()
		write := func(s string) {
			for i := 0; i < len(s); i += cut {
				_, err := tl.Write([]byte(s[i:min(len(s), i+cut)]))
				require.NoError(t, err)
			}
		}
		require.False(t, tl.holding())
		write(stream)
		require.True(t, tl.holding(), "cut %d: streaming", cut)
		write(reconnect + reconnect)
		require.False(t, tl.holding(), "cut %d: reconnecting", cut)
		write(stream)
		require.True(t, tl.holding(), "cut %d: an attempt that failed before it streamed, then one that streams", cut)
		write(rerun)
		require.False(t, tl.holding(), "cut %d: run again", cut)
		write(stream + reconnect + strings.Repeat("y", 70<<10))
		require.Equal(t, 3, tl.count(), "cut %d", cut)
		require.False(t, tl.holding(), "cut %d", cut)
		require.NotContains(t, tl.String(), "start replication", "the tail keeps the end only")
		write(stream)
		require.True(t, tl.holding(), "cut %d: streaming again", cut)
	}
}

// TestNodeLossIsTransient: a capture that failed because a JetStream node it was reading from
// was killed (the node fault) failed as a dropped connection does, not on a cause of its own
// (a CI run: "read the messages after the checkpoint: nats: server shutdown").
func TestNodeLossIsTransient(t *testing.T) {
	require.True(t, transient(`tidemark sync: stream tidemark_chaos_687333_14eaa1: read the messages after the checkpoint: nats: server shutdown`))
	require.True(t, transient(`tidemark sync: stream s: read its last message (9), which came after the checkpoint: nats: no responders available for request`))
	require.False(t, transient(`tidemark sync: stream s holds messages that no checkpoint of this output accounts for`))
	// The leader killed with a message the run counted on (one CI run): the next message's
	// expected sequence fails, and the sink ends the run as a connection failure does, to
	// resume after the stream's last message. The engine's general mark alone is not enough.
	require.True(t, transient(`tidemark sync: stream tidemark_chaos_416762_0295b2 did not end at sequence 34898 when message tidemark_chaos_416762_0295b2.tidemark_chaos_416762_0295b2.accounts.1 came (nats: API error: code=400 err_code=10071 description=wrong last sequence: 34897): an earlier message failed, or another writer wrote to the stream; resuming after the stream's last message (connection timed out)`))
	require.False(t, transient(`tidemark sync: the producer's id or epoch changed within a transaction (records of it were aborted); resuming from the last checkpoint: connection timed out`))
}

// TestBrokerDropIsTransient: a capture started while the broker fault drops every connection
// (one CI run: 14 starts in its 3 s) fails with franz-go's first-read EOF, which the engine
// counts as a failure to reconnect after (pgerr.Reconnectable: an EOF); its text names no EOF.
func TestBrokerDropIsTransient(t *testing.T) {
	require.True(t, transient(`tidemark sync: reach kafka://127.0.0.1:45021,127.0.0.1:45681,127.0.0.1:43001/tidemark_chaos_21828_49435d: broker closed the connection immediately during api versions negotiation, which often happens when the broker requires TLS but the client is using plaintext: is TLS missing? (the broker closed the connection: its listener may want TLS (tls=true) or SASL (sasl=...))`))
	require.True(t, transient(`tidemark sync: list topics: broker closed the connection immediately during api versions negotiation, which often happens when the broker requires TLS but the client is using plaintext: is TLS missing?`))
}

// TestPacerSpacesTransactions: the pacer (Config.Rate) gives out start times one interval apart,
// to all connections together, so n waits take at least n-1 intervals; without a rate it never
// waits.
func TestPacerSpacesTransactions(t *testing.T) {
	require.Nil(t, newPacer(0))
	newPacer(0).wait(context.Background()) // a nil pacer returns at once
	p := newPacer(200)                     // 5 ms apart
	start := time.Now()
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for range 7 {
				p.wait(context.Background())
			}
		})
	}
	wg.Wait()
	require.GreaterOrEqual(t, time.Since(start), 20*5*time.Millisecond, "21 starts, 5 ms apart")
}
