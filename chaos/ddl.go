package chaos

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/pgserver"
)

// The ddl family: what a DBA does to a captured database on an ordinary day (rename a table, add
// or drop a column, change a replica identity or a publication, truncate), a synchronous standby
// that stalls while the capture restarts, and a restore of the source to an earlier point. The
// capture must follow each, or stop with a clear error naming the cause; the harness then does
// what the error asks (undo the change, re-backfill the table, reset the Airbyte stream) and the
// run goes on. A fault registers the stops it may cause (an expectation, expect.go) before it
// changes anything; any other stop, and any difference at the end, is a violation.

// syncWatch is the watch interval the harness gives its syncs (--watch-interval): the faults
// that only a look sees hold their change for watchHold. The connector looks every 10 s (the
// engine's default).
const syncWatch = 2 * time.Second

// watchHold is how long a fault holds a change that only a look of the capture sees (the publish
// option, a table UNLOGGED): longer than its watch interval.
func (r *run) watchHold() time.Duration {
	if r.cfg.Mode == Airbyte {
		return 12 * time.Second
	}
	return 5 * time.Second
}

// ddlLockTimeout bounds the wait of a fault's DDL for its table lock: the workload's and the
// capture's transactions are short, so a longer wait means a fault of the harness.
const ddlLockTimeout = "5s"

// schemaFault applies a fault of the ddl family.
func (r *run) schemaFault(ctx context.Context, kind string, d time.Duration) string {
	switch kind {
	case "rename":
		return r.renameFault(ctx, d)
	case "column":
		return r.columnFault(ctx)
	case "identity":
		return r.identityFault(ctx, d)
	case "publication":
		return r.publicationFault(ctx, d)
	case "truncate":
		return r.truncateFault(ctx)
	case "rebackfill":
		return r.rebackfillFault(ctx)
	case "rewrite":
		return r.rewriteFault(ctx)
	case "publish":
		return r.publishFault(ctx)
	case "persist":
		return r.persistFault(ctx)
	case "restore":
		return r.restoreFault(ctx, d)
	}
	return noEffect + "unknown fault " + kind
}

// rewriteEvery is the sync's time between two automatic re-backfills of one table (merge.Config's
// RewriteRebackfillEvery, by default): a later rewrite waits for it.
const rewriteEvery = 5 * time.Minute

// autoPick is pickTable among those of candidates the sync has not re-backfilled by itself (a
// rewrite or persist fault's) within rewriteEvery, whose re-backfill would wait; "" when none.
// The connector re-backfills nothing by itself: every candidate is its.
func (r *run) autoPick(rng *rand.Rand, candidates ...string) string {
	if r.cfg.Mode != Airbyte {
		r.mu.Lock()
		candidates = slices.DeleteFunc(slices.Clone(candidates), func(t string) bool { return time.Since(r.autoAt[t]) < rewriteEvery })
		r.mu.Unlock()
	}
	if len(candidates) == 0 {
		_ = rng.IntN(2) // the draw pickTable makes, so the schedule stays the seed's
		return ""
	}
	return r.pickTable(rng, candidates...)
}

// drawAuto draws mostly, or one time in four sometimes, among the tables autoPick allows.
func (r *run) drawAuto(mostly, sometimes string) string {
	t := r.autoPick(r.rng, mostly)
	if r.rng.IntN(4) == 0 {
		t = r.autoPick(r.rng, sometimes)
	}
	return t
}

// pickTable draws one of tables and takes the next one that has no expectation in progress
// (a second fault on a table whose stop is not remedied yet would mix their remedies); "" when
// every one has. The draw is made whatever the outcome, so the schedule stays the seed's.
func (r *run) pickTable(rng *rand.Rand, candidates ...string) string {
	r.settle(context.Background())
	if len(candidates) == 0 {
		candidates = ddlTables
	}
	i := rng.IntN(len(candidates))
	for k := range candidates {
		t := candidates[(i+k)%len(candidates)]
		if !r.busy(r.sch + "." + t) {
			return t
		}
	}
	return ""
}

// ddlExec runs a statement of a fault on the source, with a bounded wait for its locks.
func (r *run) ddlExec(ctx context.Context, sql string, args ...any) error {
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `SET lock_timeout = '`+ddlLockTimeout+`'`); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// undoExec is ddlExec for undoing a fault's change, which must happen: it tries again (a lock
// timeout) for up to a minute.
func (r *run) undoExec(ctx context.Context, sql string) error {
	var err error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); sleep(ctx, 200*time.Millisecond) {
		if err = r.ddlExec(ctx, sql); err == nil || pgerr.DuplicateObject(err) {
			return err // done, or done by someone else: its caller says which it accepts
		}
	}
	return err
}

// killMidway kills the capture while the change holds, when drawn: the next run starts with
// the table changed, which takes the checks at start instead of those of a running capture.
func (r *run) killMidway(kill bool) string {
	if !kill {
		return ""
	}
	return "; capture " + r.sup.kill()
}

// renameFault renames a table (or moves it to r.schema.moved) for d and back. The workload follows
// the new name. A running capture follows the table by OID; one started meanwhile stops at
// start (chunker.ErrNoTable, with where the table went), and is remedied by renaming it back.
func (r *run) renameFault(ctx context.Context, d time.Duration) string {
	t := r.pickTable(r.rng)
	move, kill := r.rng.IntN(2) == 0, r.rng.IntN(2) == 0
	if t == "" {
		return noEffect + "every table awaits a remedy"
	}
	orig := pgx.Identifier{r.sch, t}.Sanitize()
	to, sql, back := pgx.Identifier{r.sch, t + "_renamed"}.Sanitize(), "", ""
	if move {
		to = pgx.Identifier{r.schema.moved, t}.Sanitize()
		sql, back = `ALTER TABLE `+orig+` SET SCHEMA `+r.schema.moved, `ALTER TABLE `+to+` SET SCHEMA `+r.sch
	} else {
		sql, back = `ALTER TABLE `+orig+` RENAME TO `+pgx.Identifier{t + "_renamed"}.Sanitize(), `ALTER TABLE `+to+` RENAME TO `+pgx.Identifier{t}.Sanitize()
	}
	e := r.expect("rename", r.sch+"."+t, false, func(ctx context.Context) error {
		if err := r.undoExec(ctx, back); err != nil {
			return err
		}
		r.schema.rename(t, orig)
		return nil
	}, causeNoTable, causeStreamGone)
	if err := r.ddlExec(ctx, sql); err != nil {
		r.forget(e)
		return noEffect + err.Error()
	}
	r.schema.rename(t, to)
	what := "renamed " + orig + " to " + to + " for " + d.String() + r.killMidway(kill)
	e.hold(ctx, d)
	if err := e.restore(ctx); err != nil {
		r.violate("the harness could not rename %s back: %v", to, err)
	}
	r.undone(e)
	return what
}

// columnFault adds a nullable column without a default to a table (the workload then writes
// it), or drops a column it added before. The capture follows: the stream describes the table
// anew with its next change, chunks read the new definition.
//
// The PostgreSQL target keeps a column the source dropped. Once it has one, a column added to
// the table on the source could be that one renamed: the sync stops with both statements, the
// rename and the add. The harness dropped it, so the remedy is the add (on the target, every
// column it added to the table, if missing); the dropped column stays on the target, so every
// later add to the table stops the sync again, each time with this remedy.
func (r *run) columnFault(ctx context.Context) string {
	t := ddlTables[r.rng.IntN(len(ddlTables))]
	drop := r.rng.IntN(3) == 0
	name := r.schema.name(t)
	if drop {
		if col := r.schema.takeOldest(t); col != "" {
			if r.cfg.Mode == Postgres {
				r.lasting("column", r.sch+"."+t, func(ctx context.Context) error { return r.addOnTarget(ctx, t) }, causeColumnGone)
			}
			if err := r.ddlExec(ctx, `ALTER TABLE `+name+` DROP COLUMN `+col); err != nil {
				return noEffect + err.Error()
			}
			return "dropped column " + col + " of " + name
		}
	}
	col := r.schema.newColumn()
	if err := r.ddlExec(ctx, `ALTER TABLE `+name+` ADD COLUMN `+col+` text`); err != nil {
		return noEffect + err.Error()
	}
	r.schema.columnAdded(t, col)
	return "added column " + col + " to " + name
}

// identityFault changes a table's replica identity for d, then restores DEFAULT. FULL is
// followed. USING INDEX on another unique index (ver's) makes the table's updates and deletes
// carry ver instead of the key: the capture stops at the first one (merge.ErrUnplaceable), or,
// started while the identity is the index, at start (merge.ErrKeyChanged; chunker.ErrNoKey when
// the table's capture starts in that run and the identity is restored while it is read: the
// identity still says USING INDEX, and no index is it any more). The remedy is the one the error
// gives: restore the identity, then re-backfill the table (reset its stream).
func (r *run) identityFault(ctx context.Context, d time.Duration) string {
	t := r.pickTable(r.rng)
	index, kill := r.rng.IntN(2) == 0, r.rng.IntN(2) == 0
	if t == "" {
		return noEffect + "every table awaits a remedy"
	}
	name := r.schema.name(t)
	back := `ALTER TABLE ` + name + ` REPLICA IDENTITY DEFAULT`
	undo := func(ctx context.Context) error { return r.undoExec(ctx, back) }
	if !index {
		if err := r.ddlExec(ctx, `ALTER TABLE `+name+` REPLICA IDENTITY FULL`); err != nil {
			return noEffect + err.Error()
		}
		what := "REPLICA IDENTITY FULL on " + name + " for " + d.String() + r.killMidway(kill)
		sleep(ctx, d)
		if err := undo(ctx); err != nil {
			r.violate("the harness could not restore the replica identity of %s: %v", name, err)
		}
		return what
	}
	e := r.expect("identity", r.sch+"."+t, true, undo, causeUnplaceable, causeKeyChanged, causeNoKey)
	if err := r.ddlExec(ctx, `ALTER TABLE `+name+` REPLICA IDENTITY USING INDEX `+pgx.Identifier{t + "_ver_key"}.Sanitize()); err != nil {
		r.forget(e)
		return noEffect + err.Error()
	}
	what := "REPLICA IDENTITY USING INDEX " + t + "_ver_key on " + name + " for " + d.String() + r.killMidway(kill)
	e.hold(ctx, d)
	if err := e.restore(ctx); err != nil {
		r.violate("the harness could not restore the replica identity of %s: %v", name, err)
	}
	r.undone(e)
	return what
}

// publicationFault drops a table from the publication for d, then adds it back. Its changes
// meanwhile are in no slot: the capture stops (merge.ErrPublicationChanged; a running one
// within its watch interval, 10 s), a restart refuses to go on until the table is re-backfilled.
func (r *run) publicationFault(ctx context.Context, d time.Duration) string {
	t := r.pickTable(r.rng)
	kill := r.rng.IntN(2) == 0
	if t == "" {
		return noEffect + "every table awaits a remedy"
	}
	pub := pgx.Identifier{r.slot}.Sanitize()
	name := r.schema.name(t)
	// The WAL span in which the table's changes may be in no slot: from before the drop to after
	// it is added back (whoever adds it back: the fault's end or an early remedy). The target
	// history leaves the versions committed in it out (staleAgainstApplied).
	lo, lerr := r.currentLSN(ctx)
	drop := &pubDrop{table: t, lo: lo, hi: math.MaxUint64}
	readded := false
	e := r.expect("publication", r.sch+"."+t, true, func(ctx context.Context) error {
		err := r.undoExec(ctx, `ALTER PUBLICATION `+pub+` ADD TABLE `+name)
		if pgerr.DuplicateObject(err) {
			// Already back: a run that started with no checkpoint yet adds every table it
			// captures to the publication, this one too (its output had nothing of it).
			err = nil
			r.mu.Lock()
			readded = true
			r.mu.Unlock()
		}
		if hi, herr := r.currentLSN(ctx); err == nil && herr == nil {
			r.mu.Lock()
			drop.hi = hi
			r.mu.Unlock()
		}
		return err
	}, causePublication, causeNotInPub)
	if lerr != nil {
		r.forget(e)
		return noEffect + lerr.Error()
	}
	if err := r.ddlExec(ctx, `ALTER PUBLICATION `+pub+` DROP TABLE `+name); err != nil {
		r.forget(e)
		return noEffect + err.Error()
	}
	r.mu.Lock()
	r.pubDrops = append(r.pubDrops, drop)
	r.mu.Unlock()
	what := "dropped " + name + " from the publication for " + d.String() + r.killMidway(kill)
	e.hold(ctx, d)
	if err := e.restore(ctx); err != nil {
		r.violate("the harness could not add %s back to the publication: %v", name, err)
	}
	r.undone(e)
	r.mu.Lock()
	if readded && e.stops == 0 && e.retired.IsZero() {
		// The capture added the table back itself: a run with no checkpoint, which backfills
		// every table from the start (after the table was back, so its rows are read as they
		// are now) and stops for nothing. No stop will come and no re-backfill is owed: the
		// table is free for the next fault (it was left busy for good, and every later turn of
		// an in-turn run void: seed 149284304).
		e.retired = time.Now()
		what += "; the capture, a run with no checkpoint yet, had added it back itself"
	}
	r.mu.Unlock()
	return what
}

// publishFault narrows the publication's publish option for watchHold (longer than the capture's
// watch interval), then puts it back: ALTER PUBLICATION ... SET (publish = 'insert, update,
// delete'). pgoutput leaves out each change of a kind the option leaves out as it is written, and
// sends nothing for the ALTER: a running capture must stop within its watch interval
// (merge.ErrPublicationChanged), one started meanwhile at start (replicator.ErrPublication); the
// remedy puts the option back. Truncate is the kind left out, and the fault holds every table
// (no truncate fault meanwhile; the workload truncates nothing), so no change is lost and no
// re-backfill is needed: the oracle checks that nothing else went wrong. An OWNER TO of the
// publication before it changes the same catalog row without changing what is published, and
// must stop nothing.
func (r *run) publishFault(ctx context.Context) string {
	for _, t := range ddlTables {
		if r.busy(r.sch + "." + t) {
			return noEffect + "a table awaits a remedy"
		}
	}
	pub := pgx.Identifier{r.slot}.Sanitize()
	if err := r.ddlExec(ctx, `ALTER PUBLICATION `+pub+` OWNER TO CURRENT_USER`); err != nil {
		return noEffect + err.Error()
	}
	e := r.expect("publish", "", false, func(ctx context.Context) error {
		return r.undoExec(ctx, `ALTER PUBLICATION `+pub+` SET (publish = 'insert, update, delete, truncate')`)
	}, causePublication, causePublishOff)
	if err := r.ddlExec(ctx, `ALTER PUBLICATION `+pub+` SET (publish = 'insert, update, delete')`); err != nil {
		r.forget(e)
		return noEffect + err.Error()
	}
	e.hold(ctx, r.watchHold())
	if err := e.restore(ctx); err != nil {
		r.violate("the harness could not put the publish option of %s back: %v", pub, err)
	}
	r.undone(e)
	r.mu.Lock()
	stops := e.stops
	r.mu.Unlock()
	return fmt.Sprintf("publication %s published no truncate for up to %s (after an OWNER TO); the capture stopped %d time(s)", pub, r.watchHold(), stops)
}

// persistFault makes a table UNLOGGED for watchHold (longer than the capture's watch interval) while
// the workload writes to it, then LOGGED again: a bulk-load habit whose writes are in no WAL
// record. PostgreSQL refuses SET UNLOGGED for a table a publication lists by name, so the fault
// first adds the run's schema to the publication (ADD TABLES IN SCHEMA: PostgreSQL 15, a
// superuser) and drops the table from the list; afterwards it adds it back and drops the schema.
// The table stays published all along, and the capture must not stop for it
// (chunker.MembershipKept): the fault takes one step per look of the capture (a durable
// checkpoint that records the membership the step left), and allows a publication stop only when
// no look came in time. tidemark sync (--on-rewrite rebackfill) re-backfills the table once it is
// LOGGED again; the connector stops while it runs (merge.ErrUnlogged). Either stops at start while
// the table is UNLOGGED, and with merge.ErrStorageReplaced when no capture looked meanwhile: the
// remedy makes it LOGGED and re-backfills it. As for a rewrite, the table's changes passed over by
// the re-backfill are left out of the target history's staleness check.
func (r *run) persistFault(ctx context.Context) string {
	// notes mostly: items is the rewrite fault's, whose automatic re-backfill would make this
	// one wait (one per table per 5 minutes).
	t := r.drawAuto("notes", "items")
	if t == "" {
		return noEffect + "the table awaits a remedy, or was re-backfilled by the sync within 5 minutes"
	}
	name, full := r.schema.name(t), r.sch+"."+t
	if v, err := r.queryString(ctx, `SELECT (current_setting('server_version_num')::int >= 150000)::text`); err != nil || v != "true" {
		return noEffect + "FOR TABLES IN SCHEMA needs PostgreSQL 15"
	}
	pub, sch := pgx.Identifier{r.slot}.Sanitize(), pgx.Identifier{r.sch}.Sanitize()
	e := r.expect("persist", full, true, func(ctx context.Context) error {
		return r.undoExec(ctx, `ALTER TABLE `+r.schema.name(t)+` SET LOGGED`)
	}, causeUnlogged, causeStorage)
	// looked waits for a durable checkpoint whose membership of the table has the catalog row
	// (chunker.Membership's form) that query names; when none comes in time, a publication stop
	// is allowed from then on.
	late := 0
	looked := func(query string, args ...any) {
		row, err := r.queryString(ctx, query, args...)
		for deadline := time.Now().Add(time.Minute); err == nil && time.Now().Before(deadline) && ctx.Err() == nil; sleep(ctx, 200*time.Millisecond) {
			if cp, err := r.capt.checkpoint(ctx); err == nil && cp != nil && slices.Contains(strings.Split(cp.Members[full], ","), row) {
				return
			}
		}
		late++
		r.mu.Lock()
		if !slices.Contains(e.causes, causePublication) {
			e.causes = append(e.causes, causePublication)
		}
		r.mu.Unlock()
	}
	if err := r.ddlExec(ctx, `ALTER PUBLICATION `+pub+` ADD TABLES IN SCHEMA `+sch); err != nil {
		r.forget(e)
		return noEffect + err.Error()
	}
	looked(`SELECT 'schema:' || pn.oid FROM pg_publication_namespace pn JOIN pg_publication p ON p.oid = pn.pnpubid
		WHERE p.pubname = $1 AND pn.pnnspid = $2::regnamespace`, r.slot, sch)
	span := r.openSpan(ctx, t)
	lo := span.lo
	err := r.ddlExec(ctx, `ALTER PUBLICATION `+pub+` DROP TABLE `+name)
	if err == nil {
		err = r.ddlExec(ctx, `ALTER TABLE `+name+` SET UNLOGGED`)
	}
	if err == nil {
		e.hold(ctx, r.watchHold())
	}
	if uerr := e.restore(ctx); uerr != nil {
		r.violate("the harness could not make %s LOGGED again: %v", name, uerr)
	}
	// The list back, one step per look.
	if aerr := r.undoExec(ctx, `ALTER PUBLICATION `+pub+` ADD TABLE `+name); aerr != nil && !pgerr.DuplicateObject(aerr) {
		r.violate("the harness could not add %s back to the publication: %v", name, aerr)
	}
	looked(`SELECT 'rel:' || pr.oid FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
		WHERE p.pubname = $1 AND pr.prrelid = $2::regclass`, r.slot, name)
	if derr := r.undoExec(ctx, `ALTER PUBLICATION `+pub+` DROP TABLES IN SCHEMA `+sch); derr != nil {
		r.violate("the harness could not drop schema %s from the publication: %v", r.sch, derr)
	}
	if err != nil {
		r.mu.Lock()
		span.hi = lo
		r.mu.Unlock()
		r.forget(e)
		return noEffect + err.Error()
	}
	if r.cfg.Mode != Airbyte {
		// The sync re-backfills it by itself, or after a stop's remedy; from then on, the same
		// stop would be a violation.
		r.autoRebackfilled(ctx, span, t)
		r.mu.Lock()
		if span.hi != math.MaxUint64 && e.retired.IsZero() {
			e.retired = time.Now()
		}
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	what := fmt.Sprintf("%s UNLOGGED for up to %s under a schema publication; the capture stopped %d time(s)", name, r.watchHold(), e.stops)
	if r.cfg.Mode != Airbyte {
		what += fmt.Sprintf("; its changes passed over from %s to %s", span.lo, span.hi)
	}
	if late > 0 {
		what += fmt.Sprintf("; %d step(s) of the publication's layout met no look in time", late)
	}
	return what
}

// truncateFault truncates a table; the main table is reloaded with its initial rows in the same
// transaction. The JSON lines output says so ("truncate"), the PostgreSQL target truncates too;
// the Airbyte connector stops, since records cannot remove rows, and asks for the stream to be
// reset (the destination cleared, the stream started over behind the truncate).
func (r *run) truncateFault(ctx context.Context) string {
	var t string
	if r.rng.IntN(4) == 0 {
		t = r.pickTable(r.rng, "accounts")
	} else {
		t = r.pickTable(r.rng, "items", "notes")
	}
	if t == "" {
		return noEffect + "the table awaits a remedy"
	}
	var e *expectation
	if r.cfg.Mode == Airbyte {
		e = r.expect("truncate", r.sch+"."+t, true, nil, causeTruncated)
		_ = e.restore(ctx) // nothing to undo
	}
	name := r.schema.name(t)
	sql := `TRUNCATE ` + name
	what := "truncated " + name
	if t == "accounts" {
		sql = fmt.Sprintf(`BEGIN; TRUNCATE %[1]s; INSERT INTO %[1]s (id, ver, v, big) SELECT g, nextval('%[2]s.ver'), md5(g::text), CASE WHEN g %% 50 = 0 THEN repeat(md5(g::text), 300) END FROM generate_series(1, %[3]d) g; COMMIT`,
			name, r.sch, r.cfg.Rows)
		what += fmt.Sprintf(" and reloaded %d rows", r.cfg.Rows)
	}
	if err := r.ddlExec(ctx, sql); err != nil {
		if e != nil {
			r.forget(e)
		}
		return noEffect + err.Error()
	}
	return what
}

// rewriteFault changes every value of a table's column v with no row event: ALTER COLUMN v TYPE
// text USING v || '~' keeps the type and rewrites the table. The connector must stop, naming it
// (merge.ErrValuesRewritten: PostgreSQL records no USING, so the output cannot follow), and the
// remedy re-backfills the table; tidemark sync (--on-rewrite rebackfill, its default) goes on and
// re-backfills the table by itself (rewriteFollowed). Either way the output must equal the
// source again.
func (r *run) rewriteFault(ctx context.Context) string {
	// items: small, so that its re-backfill keeps the ddl run short; accounts one time in four.
	t := r.drawAuto("items", "accounts")
	if t == "" {
		return noEffect + "the table awaits a remedy, or was re-backfilled by the sync within 5 minutes"
	}
	if r.cfg.Mode != Airbyte {
		return r.rewriteFollowed(ctx, t)
	}
	e := r.expect("rewrite", r.sch+"."+t, true, nil, causeRewritten)
	_ = e.restore(ctx) // nothing to undo: the values are the source's from now on
	name := r.schema.name(t)
	if err := r.ddlExec(ctx, `ALTER TABLE `+name+` ALTER COLUMN v TYPE text USING v || '~'`); err != nil {
		r.forget(e)
		return noEffect + err.Error()
	}
	return "rewrote every value of " + name + ".v (ALTER COLUMN v TYPE text USING v || '~')"
}

// rewriteFollowed rewrites table t's values as rewriteFault does, under a sync that re-backfills
// such a table by itself: found by its watch while it runs, or at the next start. The table's
// changes from the re-backfill's request to its refresh are passed over by design, as a
// rebackfill fault's: the span starts at the durable checkpoint, and ends once a checkpoint
// records the table's new storage file with its refresh started (it stays open if none does
// within two minutes).
func (r *run) rewriteFollowed(ctx context.Context, t string) string {
	name := r.schema.name(t)
	span := r.openSpan(ctx, t)
	lo := span.lo
	if err := r.ddlExec(ctx, `ALTER TABLE `+name+` ALTER COLUMN v TYPE text USING v || '~'`); err != nil {
		r.mu.Lock()
		span.hi = lo
		r.mu.Unlock()
		return noEffect + err.Error()
	}
	r.autoRebackfilled(ctx, span, t)
	r.mu.Lock()
	what := fmt.Sprintf("rewrote every value of %s.v (ALTER COLUMN v TYPE text USING v || '~'), for the sync to re-backfill (its changes passed over from %s to %s)", name, span.lo, span.hi)
	r.mu.Unlock()
	return what
}

// rebackfillFault asks the running sync to start a table's output over while it goes on
// (tidemark rebackfill over its control socket, as an operator would): the capture does not stop,
// the table's output gets a refresh and its rows again, and the oracle finds the output equal
// to the source at the end. With no capture running at that moment (between two runs, or one
// reconnecting), it has no effect.
//
// The table's changes from the request to its refresh's first window are passed over by design
// (the refresh replaces them): like a publication fault's, their versions are left out of the
// target history's staleness check (a span of WAL from before the request to after a
// checkpoint shows the refresh done; unreceived).
func (r *run) rebackfillFault(ctx context.Context) string {
	t := r.pickTable(r.rng)
	if t == "" {
		return noEffect + "every table awaits a remedy"
	}
	name := r.sch + "." + t
	// The changes passed over start where the stream is when the sync takes the request, which
	// may lag the server's WAL: at the durable checkpoint, or later.
	cp, err := r.capt.checkpoint(ctx)
	if err != nil || cp == nil {
		return noEffect + fmt.Sprintf("no checkpoint yet (%v)", err)
	}
	lo := cp.LSN
	span := &pubDrop{table: t, lo: lo, hi: math.MaxUint64}
	r.mu.Lock()
	r.pubDrops = append(r.pubDrops, span)
	r.mu.Unlock()
	out, err := exec.CommandContext(ctx, r.cfg.Tidemark, "rebackfill", "--control", r.controlPath(), "--tables", name).CombinedOutput()
	if err != nil {
		r.mu.Lock()
		span.hi = lo // nothing passed over
		r.mu.Unlock()
		return noEffect + oneLine(string(out))
	}
	// The span ends once a checkpoint taken after the request shows the refresh done (its
	// first window's low watermark passed); until then, or if none comes, it stays open.
	after, err := r.currentLSN(ctx)
	if err != nil {
		r.note("rebackfill: %v; the span stays open", err)
	}
	if err == nil {
		r.closeSpan(ctx, span, 90*time.Second, func(cp *checkpointInfo) bool {
			return cp.LSN >= after && cp.Tables[name] && !cp.Refresh[name]
		})
	}
	r.mu.Lock()
	what := fmt.Sprintf("re-backfill of %s asked of the running sync (its changes passed over from %s to %s)", name, span.lo, span.hi)
	r.mu.Unlock()
	return what
}

// autoRebackfilled notes that a fault had the sync re-backfill table t by itself (autoPick), and
// ends span once a durable checkpoint records the table's storage file as it is now with its
// refresh started (within two minutes; it stays open otherwise).
func (r *run) autoRebackfilled(ctx context.Context, span *pubDrop, t string) {
	r.mu.Lock()
	r.autoAt[t] = time.Now()
	r.mu.Unlock()
	file, err := r.queryString(ctx, `SELECT relfilenode::text FROM pg_class WHERE oid = $1::regclass`, r.schema.name(t))
	n, perr := strconv.ParseUint(file, 10, 32)
	if err != nil || perr != nil {
		return
	}
	full := r.sch + "." + t
	r.closeSpan(ctx, span, 2*time.Minute, func(cp *checkpointInfo) bool {
		return slices.Contains(cp.Files[full], uint32(n)) && !cp.Refresh[full]
	})
}

// openSpan starts the span of table t's changes a re-backfill will pass over, at the durable
// checkpoint (0 when there is none yet), open until closeSpan ends it.
func (r *run) openSpan(ctx context.Context, t string) *pubDrop {
	var lo pglogrepl.LSN
	if cp, err := r.capt.checkpoint(ctx); err == nil && cp != nil {
		lo = cp.LSN
	}
	span := &pubDrop{table: t, lo: lo, hi: math.MaxUint64}
	r.mu.Lock()
	r.pubDrops = append(r.pubDrops, span)
	r.mu.Unlock()
	return span
}

// closeSpan ends span (changes passed over by a re-backfill) at the server's WAL position once a
// durable checkpoint shows the re-backfill started (done), polling for up to within; it stays
// open if none does.
func (r *run) closeSpan(ctx context.Context, span *pubDrop, within time.Duration, done func(*checkpointInfo) bool) {
	for deadline := time.Now().Add(within); time.Now().Before(deadline) && ctx.Err() == nil; sleep(ctx, 200*time.Millisecond) {
		if cp, err := r.capt.checkpoint(ctx); err != nil || cp == nil || !done(cp) {
			continue
		}
		if hi, err := r.currentLSN(ctx); err == nil {
			r.mu.Lock()
			span.hi = hi
			r.mu.Unlock()
		}
		return
	}
}

// controlPath is the control socket the run's syncs listen on (short: a Unix socket's path
// has a limit), in a directory of the harness's user alone.
func (r *run) controlPath() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("tidemark-chaos-%d", os.Getuid()), r.slot+".sock")
}

// restoreFault restores the source to an earlier point, as a failover to a standby that lags, or
// a point-in-time restore, does: a base backup of the whole server (pg_basebackup), d of
// workload later, is started in place of the server and promoted, on a new timeline; the slot,
// which a base backup leaves out, is created again on it, as an operator does after a failover.
// The capture's checkpoint is of a history the server no longer has: it must refuse it (one of
// the position errors) and, run once with --rebackfill all (the Airbyte connection reset), start
// every table over from the new slot. The oracle then compares with the restored source.
//
// The restored source's history is older than what the output has seen: its versions (ver)
// would go back. So, while the workload is paused, the sequence is moved past every version
// handed out before the restore and every row is given a new version, before the new slot
// exists (the re-backfill reads them). For the PostgreSQL target, the audit ledger's
// transactions of the lost history are deleted (their commit positions come again on the new
// timeline), and the audit covers the transactions after the re-backfill.
func (r *run) restoreFault(ctx context.Context, d time.Duration) string {
	bg := context.WithoutCancel(ctx)
	r.restores++
	n := r.restores
	dataDir, err := r.queryString(ctx, `SHOW data_directory`)
	if err != nil {
		return noEffect + err.Error()
	}
	cluster := filepath.Dir(dataDir)
	backup := filepath.Join(cluster, fmt.Sprintf("restore-%d", n))
	if err := r.baseBackup(ctx, backup); err != nil {
		_ = os.RemoveAll(backup)
		return noEffect + "base backup: " + err.Error()
	}
	sleep(ctx, d)

	r.work.pause()
	paused := true
	defer func() {
		if paused {
			r.work.resume()
		}
	}()
	r.sup.hold()
	held := true
	defer func() {
		if held {
			r.sup.resume()
		}
	}()
	lastVer, err := r.queryString(ctx, `SELECT last_value::text FROM `+r.sch+`.ver`)
	if err != nil {
		_ = os.RemoveAll(backup)
		return noEffect + err.Error()
	}
	if err := prepareRecovery(backup, dataDir); err != nil {
		_ = os.RemoveAll(backup)
		return noEffect + err.Error()
	}
	// A running server works in its data directory by relative paths: the directories can be
	// swapped under it; the immediate restart then starts the backup.
	old := filepath.Join(cluster, fmt.Sprintf("replaced-%d", n))
	if err := os.Rename(dataDir, old); err != nil {
		return noEffect + err.Error()
	}
	if err := os.Rename(backup, dataDir); err != nil {
		r.violate("restore: could not put the backup in place (%v); the source is gone", err)
		return "restore failed: " + err.Error()
	}
	e := r.expect("restore", "", true, nil, positionCauses...)
	_ = e.restore(ctx) // nothing to undo
	if err := r.srv.Restart(bg, true); err != nil {
		r.violate("restore: the restored server did not start: %v", err)
		return "restore failed: " + err.Error()
	}
	_ = os.RemoveAll(old)
	if err := r.afterRestore(bg, lastVer); err != nil {
		r.violate("restore: %v", err)
		return "restore failed: " + err.Error()
	}
	tli, switchpoint, err := r.timelineSwitch(bg)
	if err != nil {
		r.violate("restore: %v", err)
	}
	if r.cfg.Mode == Postgres && switchpoint != 0 {
		// The WAL positions past the switchpoint come again on the new timeline: a publication
		// fault's span there was of the lost history.
		r.mu.Lock()
		r.pubDrops = slices.DeleteFunc(r.pubDrops, func(d *pubDrop) bool { return d.lo >= switchpoint })
		for _, d := range r.pubDrops {
			d.hi = min(d.hi, switchpoint)
		}
		r.mu.Unlock()
		if err := r.forgetLostHistory(bg, switchpoint); err != nil {
			r.violate("restore: the audit ledger: %v", err)
		}
	}
	held = false
	r.sup.resume()
	what := fmt.Sprintf("restored the source to a base backup taken %s before, promoted to timeline %d (history forked at %s)", d, tli, switchpoint)
	if r.cfg.Mode == Postgres {
		// The target's audit covers the transactions after the re-backfill of txlog: wait for it
		// (the workload paused), then let the workload go on.
		from, err := r.waitRebackfilled(bg, tli)
		if err != nil {
			r.violate("restore: %v", err)
		} else {
			r.mu.Lock()
			r.auditFrom = from
			r.mu.Unlock()
		}
	}
	paused = false
	r.work.resume()
	// The next fault comes once the capture has started over (every table is busy until then).
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; sleep(ctx, 200*time.Millisecond) {
		if r.settle(bg); r.retired(e) {
			break
		}
	}
	return what
}

// addOnTarget adds to the PostgreSQL target's table every column the harness added to it on
// the source, when missing, as the sync's stop says to when a column was dropped, not renamed.
func (r *run) addOnTarget(ctx context.Context, table string) error {
	conn, err := pgconf.Open(ctx, r.target, "tidemark-chaos")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, col := range r.schema.everAdded(table) {
		if _, err := conn.Exec(ctx, `ALTER TABLE `+pgx.Identifier{r.sch, table}.Sanitize()+` ADD COLUMN IF NOT EXISTS `+col+` text`); err != nil {
			return err
		}
	}
	return nil
}

// queryString runs a query of one text value on the source.
// currentLSN reads the source's current WAL insert position.
func (r *run) currentLSN(ctx context.Context) (pglogrepl.LSN, error) {
	s, err := r.queryString(ctx, `SELECT pg_current_wal_lsn()::text`)
	if err != nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(s)
}

func (r *run) queryString(ctx context.Context, sql string, args ...any) (string, error) {
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var s string
	err = conn.QueryRow(ctx, sql, args...).Scan(&s)
	return s, err
}

// serverUser is the OS user the local server runs as (the owner of its data directory), which
// the backup's files must belong to; nil when this process is not root.
func serverUser(dataDir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	fi, err := os.Stat(dataDir)
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("owner of %s unknown", dataDir)
	}
	if _, err := user.LookupId(strconv.Itoa(int(st.Uid))); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: st.Uid, Gid: st.Gid}, nil
}

// baseBackup takes a base backup of the source's server into dir, with the WAL it needs.
func (r *run) baseBackup(ctx context.Context, dir string) error {
	bin, err := pgserver.FindBinDir()
	if err != nil {
		return err
	}
	pc, err := pgx.ParseConfig(r.dsn)
	if err != nil {
		return err
	}
	cred, err := serverUser(filepath.Dir(dir))
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_basebackup"), "-D", dir, "-X", "stream", "-c", "fast", "--no-sync",
		"-h", pc.Host, "-p", strconv.Itoa(int(pc.Port)), "-U", pc.User, "-w")
	cmd.Dir = filepath.Dir(dir)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+pc.Password, "PGSSLMODE=disable")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// prepareRecovery makes the backup recover to its consistent point and promote itself: a
// targeted recovery (recovery.signal) from its own WAL; restore_command is required and finds
// nothing.
func prepareRecovery(backup, dataDir string) error {
	cred, err := serverUser(dataDir)
	if err != nil {
		return err
	}
	settings := "\n# tidemark chaos: restore\nrestore_command = 'false'\nrecovery_target = 'immediate'\nrecovery_target_action = 'promote'\n"
	f, err := os.OpenFile(filepath.Join(backup, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(settings); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	signal := filepath.Join(backup, "recovery.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		return err
	}
	if cred != nil {
		return os.Chown(signal, int(cred.Uid), int(cred.Gid))
	}
	return nil
}

// afterRestore waits for the restored server's promotion, then, with the workload paused and
// before the new slot exists, moves every version past those handed out before the restore
// (lastVer), and creates the slot again.
func (r *run) afterRestore(ctx context.Context, lastVer string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		s, err := r.queryString(ctx, `SELECT pg_is_in_recovery()::text`)
		if err == nil && s == "false" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the restored server was not promoted within 2 minutes (%v)", err)
		}
		sleep(ctx, 200*time.Millisecond)
	}
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	stmts := []string{fmt.Sprintf(`SELECT setval('%s.ver', %s + 1000)`, r.sch, lastVer)}
	for _, t := range ddlTables {
		stmts = append(stmts, fmt.Sprintf(`UPDATE %s SET ver = nextval('%s.ver')`, r.schema.name(t), r.sch))
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%.60s: %w", s, err)
		}
	}
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput') WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, r.slot); err != nil {
		return fmt.Errorf("create the slot again: %w", err)
	}
	return nil
}

// timelineSwitch returns the restored server's timeline and where its history forked from the
// one before (the last line of its timeline history file).
func (r *run) timelineSwitch(ctx context.Context) (int32, pglogrepl.LSN, error) {
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(ctx)
	var name string
	err = conn.QueryRow(ctx, `SELECT name FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{8}\.history$' ORDER BY name DESC LIMIT 1`).Scan(&name)
	if err != nil {
		return 0, 0, fmt.Errorf("find the timeline history: %w", err)
	}
	var text string
	if err := conn.QueryRow(ctx, `SELECT pg_read_file('pg_wal/' || $1)`, name).Scan(&text); err != nil {
		return 0, 0, fmt.Errorf("read %s: %w", name, err)
	}
	tli, err := strconv.ParseInt(strings.TrimSuffix(name, ".history"), 16, 32)
	if err != nil {
		return 0, 0, err
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	fields := strings.Fields(lines[len(lines)-1])
	if len(fields) < 2 {
		return int32(tli), 0, fmt.Errorf("timeline history %s: %q", name, text)
	}
	lsn, err := pglogrepl.ParseLSN(fields[1])
	return int32(tli), lsn, err
}

// forgetLostHistory deletes from the target's audit ledger the transactions of the history the
// restore dropped (committed at or after switchpoint): the new timeline's commits take their
// positions again, and the ledger would refuse them.
func (r *run) forgetLostHistory(ctx context.Context, switchpoint pglogrepl.LSN) error {
	conn, err := pgconf.Open(ctx, r.target, "tidemark-chaos")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `DELETE FROM public.tidemark_applied WHERE commit_lsn >= $1::pg_lsn`, switchpoint.String())
	if isUndefinedTable(err) {
		return nil
	}
	return err
}

// waitRebackfilled waits (up to 3 minutes) for the target's checkpoint to be of timeline tli
// with the re-backfill of txlog started (its output started over), and returns the last txlog id
// of the source then: every later transaction is applied, not backfilled.
func (r *run) waitRebackfilled(ctx context.Context, tli int32) (int64, error) {
	txlog := r.sch + ".txlog"
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); sleep(ctx, 200*time.Millisecond) {
		cp, err := r.capt.checkpoint(ctx)
		if err != nil || cp == nil || cp.Timeline != tli || !cp.Tables[txlog] || cp.Refresh[txlog] {
			continue
		}
		s, err := r.queryString(ctx, `SELECT coalesce(max(id), 0)::text FROM `+txlog)
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(s, 10, 64)
	}
	return 0, fmt.Errorf("the capture did not start over from the restored server within 3 minutes")
}
