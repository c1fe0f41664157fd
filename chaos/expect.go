package chaos

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
)

// A cause is what a clear stop of the capture names. The capture runs in another process, so its
// stop is known by the text it prints: each cause is the part of the message that the engine's
// error for it always has (the sentinel's own text, where there is one).
type cause string

// The causes of a clear stop.
const (
	causeUnplaceable cause = "unplaceable"   // merge.ErrUnplaceable: a change without its key
	causeKeyChanged  cause = "key-changed"   // merge.ErrKeyChanged: another replica identity at start
	causePublication cause = "publication"   // merge.ErrPublicationChanged
	causeNotInPub    cause = "not-published" // chunker.ErrNotPublished
	causeNoTable     cause = "no-table"      // chunker.ErrNoTable: not under its name at start
	causeGone        cause = "gone"          // chunker.ErrGone: dropped
	causeReplaced    cause = "replaced"      // merge.ErrTableReplaced
	causePartitions  cause = "partitions"    // merge.ErrPartitionsChanged
	causeForeign     cause = "foreign"       // merge.ErrForeignPosition
	causeTimeline    cause = "timeline"      // merge.ErrTimelineForked
	causeSystem      cause = "system"        // merge.ErrSystemChanged
	causeBehindSlot  cause = "behind-slot"   // merge.ErrPositionBehindSlot
	causeAhead       cause = "ahead"         // merge.ErrPositionAhead
	causeSlotMissing cause = "slot-missing"  // replicator.ErrSlotMissing
	causeTruncated   cause = "truncated"     // the Airbyte connector's stop at a TRUNCATE
	causeNoResume    cause = "cannot-resume" // the Airbyte connector's stop at a state it cannot resume
	causeNoKey       cause = "no-usable-key" // chunker.ErrNoKey
	causeStreamGone  cause = "stream-gone"   // the Airbyte connector's stop at a configured stream whose table is gone
	causeColumnGone  cause = "column-gone"   // the PostgreSQL target's stop at a column added while one dropped is still there
	causeRewritten   cause = "rewritten"     // merge.ErrValuesRewritten: a table rewritten under a changed column
	causePublishOff  cause = "publish-off"   // replicator.ErrPublication: a kind of change not published, at start
	causeUnlogged    cause = "unlogged"      // merge.ErrUnlogged: a table UNLOGGED
	causeStorage     cause = "storage"       // merge.ErrStorageReplaced: new storage files between two runs
)

var causeTexts = []struct {
	c    cause
	text string
}{
	{causeUnplaceable, merge.ErrUnplaceable.Error()},
	{causeKeyChanged, merge.ErrKeyChanged.Error()},
	{causePublication, merge.ErrPublicationChanged.Error()},
	{causeNotInPub, chunker.ErrNotPublished.Error()},
	{causeNoTable, chunker.ErrNoTable.Error()},
	{causeGone, chunker.ErrGone.Error()},
	{causeReplaced, merge.ErrTableReplaced.Error()},
	{causePartitions, merge.ErrPartitionsChanged.Error()},
	{causeForeign, merge.ErrForeignPosition.Error()},
	{causeTimeline, merge.ErrTimelineForked.Error()},
	{causeSystem, merge.ErrSystemChanged.Error()},
	{causeBehindSlot, merge.ErrPositionBehindSlot.Error()},
	{causeAhead, "is ahead of the server's WAL position"}, // merge.PositionAheadError
	{causeSlotMissing, replicator.ErrSlotMissing.Error()},
	{causeTruncated, "was truncated on the source"},
	{causeNoResume, "The state cannot be resumed from slot"},
	{causeNoKey, chunker.ErrNoKey.Error()},
	{causeStreamGone, "no longer exists (dropped or renamed)"},
	{causeColumnGone, "a renamed column, or one dropped and another added?"},
	{causeRewritten, merge.ErrValuesRewritten.Error()},
	{causePublishOff, replicator.ErrPublication.Error()},
	{causeUnlogged, merge.ErrUnlogged.Error()},
	{causeStorage, merge.ErrStorageReplaced.Error()},
}

// positionCauses are the refusals of a checkpoint the server's history no longer has (a restore
// to an earlier point, a failover): each is remedied by starting every table over.
var positionCauses = []cause{causeForeign, causeTimeline, causeSystem, causeBehindSlot, causeAhead, causeNoResume}

// causesOf returns the causes a failure message names.
func causesOf(msg string) []cause {
	var out []cause
	for _, ct := range causeTexts {
		if strings.Contains(msg, ct.text) {
			out = append(out, ct.c)
		}
	}
	return out
}

// names reports whether msg names table (schema.table) as a whole word, or quoted
// ("schema"."table").
func names(msg, table string) bool {
	schema, name, _ := strings.Cut(table, ".")
	return regexp.MustCompile(`(^|[^A-Za-z0-9_.])`+regexp.QuoteMeta(table)+`($|[^A-Za-z0-9_])`).MatchString(msg) ||
		strings.Contains(msg, pgx.Identifier{schema, name}.Sanitize())
}

// An expectation is a clear stop a fault may cause, and its remedy. It is registered before the
// fault changes anything, and retired once the fault's change is undone and, when a stop needs a
// re-backfill, that re-backfill has started (its table's output started over, in a durable
// checkpoint): from then on the same stop is a violation. A process matches it only if it
// started before it was retired. Until then its table is left to it: a re-backfill asked for
// but not started yet takes the table's key as it is when it starts, so another fault on the
// table meanwhile (another replica identity) would change the key of its output.
type expectation struct {
	kind    string
	table   string  // schema.table; "" for every table
	causes  []cause // the causes of the stops it allows
	refresh bool    // a stop is remedied by a re-backfill of table (of every table when "")
	shared  bool    // other faults may change the table before its stop (its remedy does not mix with theirs)
	// again is a remedy that each of its stops takes (undo is taken once); an expectation with
	// it is never retired: its cause lasts.
	again  func(ctx context.Context) error
	since  time.Time
	undo   func(ctx context.Context) error // undoes the fault's change; nil: nothing to undo
	undone chan struct{}                   // closed once undone

	once     sync.Once
	undoErr  error
	stops    int       // guarded by run.mu
	undoneAt time.Time // when restore undid the change
	asked    bool      // its re-backfill was asked for; guarded by run.mu
	askedAt  string    // the durable checkpoint then (checkpointInfo.raw); guarded by run.mu
	askedAtT time.Time // and the time; guarded by run.mu
	retired  time.Time // guarded by run.mu
}

// restore undoes the fault's change, once.
func (e *expectation) restore(ctx context.Context) error {
	e.once.Do(func() {
		if e.undo != nil {
			e.undoErr = e.undo(context.WithoutCancel(ctx))
		}
		e.undoneAt = time.Now()
		close(e.undone)
	})
	return e.undoErr
}

// hold waits d, or less when a remedy undid the change early.
func (e *expectation) hold(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-e.undone:
	}
}

func (e *expectation) isUndone() bool {
	select {
	case <-e.undone:
		return true
	default:
		return false
	}
}

// matches reports whether a failure of a process that started at started, with message msg and
// causes cs, is this expectation's stop.
func (e *expectation) matches(started time.Time, msg string, cs []cause) bool {
	if !e.retired.IsZero() && !started.Before(e.retired) {
		return false
	}
	if !slices.ContainsFunc(cs, func(c cause) bool { return slices.Contains(e.causes, c) }) {
		return false
	}
	return e.table == "" || names(msg, e.table)
}

// expect registers an expectation of kind on table.
func (r *run) expect(kind, table string, refresh bool, undo func(context.Context) error, causes ...cause) *expectation {
	e := &expectation{kind: kind, table: table, causes: causes, refresh: refresh, since: time.Now(), undo: undo, undone: make(chan struct{})}
	r.mu.Lock()
	r.exps = append(r.exps, e)
	r.mu.Unlock()
	return e
}

// forget removes an expectation whose fault could not be applied.
func (r *run) forget(e *expectation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exps = slices.DeleteFunc(r.exps, func(x *expectation) bool { return x == e })
}

// undone notes that e's change was undone by its fault: without a re-backfill to wait for, it
// is retired.
func (r *run) undone(e *expectation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !e.refresh && e.again == nil && e.retired.IsZero() {
		e.retired = time.Now()
	}
}

// lasting returns the expectation of kind on table that is never retired, registering it with
// remedy when there is none yet.
func (r *run) lasting(kind, table string, remedy func(context.Context) error, causes ...cause) *expectation {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.exps {
		if e.kind == kind && e.table == table && e.again != nil {
			return e
		}
	}
	e := &expectation{kind: kind, table: table, causes: causes, shared: true, again: remedy, since: time.Now(), undone: make(chan struct{})}
	r.exps = append(r.exps, e)
	return e
}

// retired reports whether e is retired.
func (r *run) retired(e *expectation) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !e.retired.IsZero()
}

// busy reports whether table (schema.table) has an expectation that is not retired: a new
// schema fault on it would mix two remedies.
func (r *run) busy(table string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.exps {
		if e.retired.IsZero() && !e.shared && (e.table == table || e.table == "") {
			return true
		}
	}
	return false
}

// settle reads the durable checkpoint and retires the expectations whose re-backfill has started
// since it was asked for: their table's progress (every table's, for "") is there and no longer
// asks for it.
func (r *run) settle(ctx context.Context) {
	r.mu.Lock()
	waiting := slices.ContainsFunc(r.exps, func(e *expectation) bool { return e.asked && e.retired.IsZero() })
	r.mu.Unlock()
	if !waiting {
		return
	}
	cp, err := r.capt.checkpoint(ctx)
	if err != nil || cp == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range r.exps {
		if !x.asked || !x.retired.IsZero() || !x.isUndone() || cp.raw == x.askedAt || !cp.started(x.table, r.keys()) {
			continue
		}
		x.retired = time.Now()
		// The re-backfill also covers a fault on its tables that has not stopped the capture
		// (and never will): one whose change was undone before the re-backfill was asked for.
		for _, e := range r.exps {
			if e.refresh && !e.asked && e.retired.IsZero() && e.isUndone() && e.undoneAt.Before(x.askedAtT) && (x.table == "" || x.table == e.table) {
				e.retired = x.retired
			}
		}
	}
}

// failed judges a capture process that failed on its own, with message msg: a stop an active
// expectation allows is counted and remedied (the fault's change undone, the table re-backfilled
// or, for Airbyte, its stream reset); any other clear stop is a violation (nothing the harness
// did explains it); anything else is a failure of the kind the other faults cause (a dropped
// connection), which the supervisor answers by starting the capture again. It reports whether
// the stop was expected.
func (r *run) failed(ctx context.Context, started time.Time, msg string) bool {
	cs := causesOf(msg)
	if len(cs) == 0 {
		r.noteFailure(msg)
		if !transient(msg) {
			r.violate("the capture failed with an error that is neither a connection failure nor a stop naming its cause: %s", oneLine(msg))
		}
		return false
	}
	r.mu.Lock()
	var match *expectation
	for _, e := range r.exps {
		if e.matches(started, msg, cs) {
			match = e
			break
		}
	}
	if match == nil {
		r.mu.Unlock()
		r.violate("the capture stopped with a cause no fault of the harness explains: %s", oneLine(msg))
		return false
	}
	match.stops++
	r.stops[match.kind]++
	r.mu.Unlock()
	r.log.Info().Str("fault", match.kind).Str("table", match.table).Str("stop", oneLine(msg)).Msg("expected stop; remedy")
	r.note("expected stop (fault %s, table %q); remedy follows", match.kind, match.table)
	if match.again != nil {
		if err := match.again(ctx); err != nil {
			r.violate("the harness could not remedy %s of %s: %v", match.kind, match.table, err)
		}
		r.remedied("remedy " + match.kind)
	}
	if match.undo != nil && !match.isUndone() {
		if err := match.restore(ctx); err != nil {
			r.violate("the harness could not undo %s of %s: %v", match.kind, match.table, err)
		}
		r.remedied("undo " + match.kind)
		r.undone(match)
	}
	if match.refresh {
		what := match.table
		if what == "" {
			what = "all"
		}
		r.remedied(r.capt.rebackfill(ctx, match.table) + " " + what)
		var at string
		if cp, err := r.capt.checkpoint(ctx); err == nil && cp != nil {
			at = cp.raw
		}
		r.mu.Lock()
		match.asked, match.askedAt, match.askedAtT = true, at, time.Now()
		r.mu.Unlock()
	}
	return true
}

func (r *run) remedied(what string) {
	r.note("remedy: %s", what)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.remedies[what]++
}

func (r *run) violate(format string, args ...any) {
	r.note("violation: "+format, args...)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}

// transientMarks are what the message of a failure the other faults cause has: the connection
// (or the server) went away or did not answer, the slot was still held by the process before.
// The Airbyte connector classifies its own: transient_error.
var transientMarks = []string{
	"[transient_error]",
	"unexpected eof", ": eof", "connection reset by peer", "broken pipe", "connection refused", "failed to connect",
	"terminating connection", "the database system is", "server closed the connection", "conn closed",
	"connection closed", "use of closed network connection", "i/o timeout", "timeout", "deadline exceeded",
	"sqlstate 57p", "sqlstate 08", replicator.ErrSlotInUse.Error(), replicator.ErrTimeout.Error(),
	// The NATS output's expected sequence failed: a message the run counted on was lost with a
	// killed node (the node fault), or a second writer wrote (the fence fault). Not the engine's
	// general mark of a reconnectable failure ("connection timed out"), which it also puts on
	// errors no fault here explains (a Kafka producer's epoch changed, JetStream not enabled).
	"an earlier message failed, or another writer wrote to the stream",
	// The broker fault's dropped connections met at a client's first read (franz-go's
	// ErrFirstReadEOF, an EOF the engine reconnects after; its text guesses at TLS or SASL).
	"broker closed the connection immediately",
	// A JetStream node killed (the node fault) while it served a request.
	"nats: server shutdown", "nats: no responders",
	// The process before, killed, still holds the slot or the output for a moment.
	"is in use by server process", "another tidemark sync is writing",
}

// transient reports whether a failure is one the other faults cause.
func transient(msg string) bool {
	m := strings.ToLower(msg)
	return slices.ContainsFunc(transientMarks, func(t string) bool { return strings.Contains(m, strings.ToLower(t)) })
}

// noteFailure counts a failure that names no cause, by its message without numbers.
func (r *run) noteFailure(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.otherFailures[normalize(msg)]++
}

var digits = regexp.MustCompile(`[0-9A-F]+/[0-9A-F]+|[0-9]+`)

// normalize shortens a failure message to one line without its numbers, to count its kind.
func normalize(msg string) string {
	s := digits.ReplaceAllString(oneLine(msg), "N")
	if len(s) > 160 {
		s = s[:160]
	}
	return s
}

func oneLine(msg string) string {
	s := strings.Join(strings.Fields(msg), " ")
	if len(s) > 600 {
		s = s[:600] + "..."
	}
	return s
}
