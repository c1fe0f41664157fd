package merge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/replicator"
)

// Errors of a position or a table that cannot be resumed. Each says what happened and that the
// way on is a re-backfill (of the table, or of everything: Config.ResyncInvalidPosition).
var (
	// ErrForeignPosition: the position was not read from this slot: another slot's or
	// database's, or the slot did not exist and was created after it.
	ErrForeignPosition = errors.New("the position was not read from this slot")
	// ErrTimelineForked: the server's history forked before the position (a failover to a
	// standby that had not received it, a point-in-time restore): the WAL it covers is gone.
	ErrTimelineForked = errors.New("the position is not in the server's history")
	// ErrTableReplaced: a captured table's name now belongs to another table (dropped and
	// created again).
	ErrTableReplaced = errors.New("the table is not the one the position was taken on")
	// ErrPublicationChanged: a captured table left the publication (and maybe came back), or the
	// way it belongs to it changed so that its changes stopped streaming under its name
	// (publish_via_partition_root turned off, a row filter): its changes in between are not in
	// the slot.
	ErrPublicationChanged = errors.New("the table's membership of the publication changed")
	// ErrPartitionsChanged: a partition was attached to or detached from a captured partitioned
	// table: its rows arrived or left without a row event.
	ErrPartitionsChanged = errors.New("the table's partitions changed")
	// ErrKeyChanged: the columns that identify a captured table's rows changed (a redefined
	// primary key, another replica identity): the output so far is keyed otherwise.
	ErrKeyChanged = errors.New("the table's key changed")
)

// prepare readies a run: it adds new tables to the publication (when allowed), discovers the
// tables, checks the position's identity against the server and the slot, and reconciles the
// position's tables with the configured ones. The resume LSN is acknowledged last, once it is
// known to belong to this slot.
func (e *Engine) prepare(ctx context.Context, conn *pgx.Conn, stream *replicator.Stream, from *Position) (*Position, map[string]*chunker.Table, map[string]*storageCheck, error) {
	resync := false
	if from != nil {
		if err := e.checkIdentity(ctx, from, stream); err != nil {
			lost := e.cfg.ResyncLostSlot && stream.Slot().Created
			if !e.cfg.ResyncInvalidPosition && !lost {
				return nil, nil, nil, err
			}
			if lost {
				e.log.Warn().Str("slot", stream.Slot().Name).Msg("the slot was lost (dropped, or invalidated and created again): every table is backfilled again from the new slot while its changes stream (--on-slot-loss rebackfill)")
			}
			e.log.Warn().Err(err).Msg("the position cannot be resumed: every table is backfilled again from the slot's position, its output started over")
			from, resync = nil, true
		}
	}
	if l, ok := e.sink.(Leftover); ok && from == nil && l.Leftover(stream.Slot().ConfirmedFlush) {
		e.log.Warn().Str("slot", stream.Slot().Name).Stringer("slot_start", stream.Slot().ConfirmedFlush).
			Msg("the output holds events of a run that ended before its first checkpoint, read before this slot's start (the slot was created again): the changes between are in no slot, so every table's output starts over")
		resync = true
	}
	if e.cfg.AddToPublication {
		if err := e.addToPublication(ctx, conn, from); err != nil {
			return nil, nil, nil, err
		}
	}
	tables, err := e.discover(ctx, conn, from)
	if err != nil {
		return nil, nil, nil, err
	}
	e.cfg.Faults.afterDiscover()
	sys, slot := stream.System(), stream.Slot()
	var pos *Position
	if from == nil {
		pos = &Position{LSN: slot.ConfirmedFlush, Tables: map[string]*TableProgress{}}
	} else {
		pos = from.Clone()
	}
	pos.Version, pos.SystemID, pos.Timeline, pos.Database, pos.Slot = PositionVersion, sys.SystemID, sys.Timeline, sys.Database, slot.Name
	storage, err := e.reconcile(ctx, conn, pos, tables, resync)
	if err != nil {
		return nil, nil, nil, err
	}
	if from != nil {
		stream.Ack(from.LSN)
	}
	if r, ok := e.sink.(Resumer); ok {
		r.Resume(pos, resync)
	}
	return pos, tables, storage, nil
}

// checkIdentity accepts a position only on the cluster, database, slot and history it was read
// from. Resuming elsewhere would skip or repeat changes without a word, and acknowledging its LSN
// would confirm to a slot what was never read from it.
func (e *Engine) checkIdentity(ctx context.Context, from *Position, stream *replicator.Stream) error {
	return identityProblem(from, stream.System(), stream.Slot(), e.cfg.Faults.ackAhead(), func(tli int32) (pglogrepl.LSN, bool, error) {
		return stream.TimelineEnd(ctx, tli)
	})
}

// identityProblem is checkIdentity's decision, apart from the server: timelineEnd reports where
// a timeline ended in the server's history (replicator.Stream.TimelineEnd).
func identityProblem(from *Position, sys replicator.SystemInfo, slot replicator.SlotInfo, ackAhead bool,
	timelineEnd func(int32) (pglogrepl.LSN, bool, error)) error {
	const over = "start over with a full backfill (no position, or a re-backfill of every table)"
	switch {
	case from.SystemID != "" && from.SystemID != sys.SystemID:
		return fmt.Errorf("%w: the position was taken on system %s, the source is system %s; %s",
			ErrSystemChanged, from.SystemID, sys.SystemID, over)
	case from.Database != "" && from.Database != sys.Database:
		return fmt.Errorf("%w: it was taken in database %q, the slot is in database %q; %s", ErrForeignPosition, from.Database, sys.Database, over)
	case from.Slot != "" && from.Slot != slot.Name:
		return fmt.Errorf("%w: it was read from slot %q, not %q; %s", ErrForeignPosition, from.Slot, slot.Name, over)
	case slot.Created:
		return fmt.Errorf("%w: slot %q did not exist and was created now, so the changes between the position (%s) and now are in no slot (was it dropped, or is this a restored or failed-over server?); %s",
			ErrForeignPosition, slot.Name, from.LSN, over)
	}
	if from.Timeline != 0 && from.Timeline != sys.Timeline {
		if from.Timeline > sys.Timeline {
			return fmt.Errorf("%w: the position was taken on timeline %d and the server is on timeline %d (restored from before it); %s",
				ErrTimelineForked, from.Timeline, sys.Timeline, over)
		}
		end, ok, err := timelineEnd(from.Timeline)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: the position's timeline %d is not in the history of the server's timeline %d; %s", ErrTimelineForked, from.Timeline, sys.Timeline, over)
		}
		if from.LSN > end {
			return fmt.Errorf("%w: the position %s lies past %s, where its timeline %d ended and the server's current history (timeline %d) began: a failover to a standby that had not received it, or a point-in-time restore, dropped that WAL; %s",
				ErrTimelineForked, from.LSN, end, from.Timeline, sys.Timeline, over)
		}
	}
	if from.LSN > sys.XLogPos {
		return &PositionAheadError{Position: from.LSN.String(), Server: sys.XLogPos.String()}
	}
	if from.LSN < slot.ConfirmedFlush && !ackAhead {
		return &PositionBehindSlotError{Slot: slot.Name, Position: from.LSN.String(), ConfirmedFlush: slot.ConfirmedFlush.String()}
	}
	return nil
}

// addToPublication adds to the publication the captured tables it lacks whose capture starts now
// (no progress in the position, or a refresh asked for), when the role may; a table it may not
// add is left for discovery to refuse with the statement a DBA should run. A table that was
// captured and left the publication is not added back silently: its changes while it was out are
// not in the slot (discover says so).
func (e *Engine) addToPublication(ctx context.Context, conn *pgx.Conn, from *Position) error {
	pub := e.cfg.Source.Publication
	for _, tc := range e.cfg.Tables {
		name := tc.Schema + "." + tc.Name
		if p := progressOf(from, name); p != nil && !p.Refresh && !tc.Rebackfill {
			continue
		}
		added, err := replicator.AddToPublication(ctx, conn, pub, pgx.Identifier{tc.Schema, tc.Name})
		switch {
		case errors.Is(err, replicator.ErrCannotAdd):
			e.log.Warn().Err(err).Str("table", name).Str("publication", pub).Msg("table not added to the publication")
		case err != nil:
			return err
		case added:
			e.addedTables = append(e.addedTables, pgx.Identifier{tc.Schema, tc.Name})
			e.log.Info().Str("table", name).Str("publication", pub).Msg("table added to the publication")
		}
	}
	return nil
}

func progressOf(pos *Position, name string) *TableProgress {
	if pos == nil {
		return nil
	}
	return pos.Tables[name]
}

// discover reads every configured table's definition, with what the position knows of a table
// that cannot be found or published.
func (e *Engine) discover(ctx context.Context, conn *pgx.Conn, from *Position) (map[string]*chunker.Table, error) {
	tables := map[string]*chunker.Table{}
	var errs []error
	for _, tc := range e.cfg.Tables {
		name := tc.Schema + "." + tc.Name
		t, err := chunker.Discover(ctx, conn, tc.Schema, tc.Name, tc.Key, e.cfg.Source.Publication)
		if err != nil {
			p := progressOf(from, name)
			switch {
			case p == nil || p.Refresh || tc.Rebackfill:
			case errors.Is(err, chunker.ErrNoTable) && p.OID != 0:
				if schema, now, nerr := chunker.NameOf(ctx, conn, p.OID); nerr == nil {
					err = fmt.Errorf("%w; the table captured as %s (OID %d) is now %s.%s: rename it back, or capture it under its new name (a new output: it is backfilled under that name)", err, name, p.OID, schema, now)
				}
			case errors.Is(err, chunker.ErrNotPublished):
				err = fmt.Errorf("%w: %w; it was captured, so its changes since it left the publication are not in the slot: add it back, then re-backfill it", ErrPublicationChanged, err)
			}
			errs = append(errs, err)
			continue
		}
		tables[t.String()] = t
	}
	return tables, errors.Join(errs...)
}

// reconcile fits the position's tables to the configured ones: progress of tables no longer
// captured goes, a table whose key changed stops the run, and a captured table must still be the
// same table (OID) with the same membership of the publication and the same partitions, unless a
// refresh was asked for. resync starts every table over.
func (e *Engine) reconcile(ctx context.Context, conn *pgx.Conn, pos *Position, tables map[string]*chunker.Table, resync bool) (map[string]*storageCheck, error) {
	// A table captured under a new name (renamed) is a new output: its progress under the old
	// name does not carry over, or its new output would lack the rows backfilled under the old.
	for name := range pos.Tables {
		if tables[name] == nil {
			delete(pos.Tables, name) // no longer captured
		}
	}
	configs := map[string]TableConfig{}
	for _, tc := range e.cfg.Tables {
		configs[tc.Schema+"."+tc.Name] = tc
	}
	checks := map[string]*storageCheck{}
	var errs []error
	for name, t := range tables {
		key := t.KeyNames()
		member, err := chunker.Membership(ctx, conn, t.OID, e.cfg.Source.Publication)
		if err != nil {
			return nil, err
		}
		p := pos.Tables[name]
		tc := configs[name]
		if resync || tc.Rebackfill {
			p = &TableProgress{Refresh: true}
		}
		if (member == "" || strings.Contains(member, ":filter:")) && e.cfg.Source.Publication != "" {
			// Discovery found it published without a row filter, a statement before: it left
			// the publication, was dropped, or took a row filter since. Recorded so, the watch
			// would compare that with itself while changes go to no slot
			// (TestChangedBetweenDiscoveryAndMembership).
			if err := memberAtStart(ctx, conn, e.cfg.Source.Publication, name, t, tc.Key, p, member); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		var kept bool
		if p != nil && p.Publication != "" {
			if kept, err = membershipKept(ctx, conn, t.OID, p.Publication, member); err != nil {
				return nil, err
			}
		}
		switch {
		case p != nil && !p.Refresh && len(p.Key) > 0 && !slices.Equal(p.Key, key):
			// The output so far is keyed by the old columns, and changes logged under the new
			// identity carry only the new ones: starting a backfill keyed otherwise would leave
			// both. (A progress without a key, a migrated state, takes the key it finds.)
			errs = append(errs, fmt.Errorf("%w: %s is keyed by (%s) now (its %s), and was keyed by (%s) when the position was taken: restore its primary key or replica identity, or re-backfill it with the new key",
				ErrKeyChanged, name, strings.Join(key, ", "), t.KeySource, strings.Join(p.Key, ", ")))
		case p == nil:
			p = &TableProgress{Done: tc.NoBackfill}
		case p.Refresh:
		case p.OID != 0 && p.OID != t.OID:
			errs = append(errs, fmt.Errorf("%w: %s had OID %d when the position was taken and has OID %d now: it was dropped and created again, and what happened to it in between is not in the slot; re-backfill it",
				ErrTableReplaced, name, p.OID, t.OID))
		case p.Publication != "" && !kept:
			errs = append(errs, fmt.Errorf("%w: %s belonged to publication %q as %q when the position was taken, and now as %q: it left the publication and came back, or publish_via_partition_root or a row filter changed, so changes made meanwhile are not in the slot; re-backfill it",
				ErrPublicationChanged, name, e.cfg.Source.Publication, p.Publication, member))
		case p.OID != 0 && !slices.Equal(p.Partitions, t.Partitions):
			errs = append(errs, fmt.Errorf("%w: %s had partitions %v when the position was taken and has %v now: a partition attached or detached brought or took rows without a row event; re-backfill it",
				ErrPartitionsChanged, name, p.Partitions, t.Partitions))
		}
		if strings.Contains(member, "via_root") && len(t.Partitions) > 0 {
			storage, err := chunker.Storage(ctx, conn, t.Partitions)
			if err != nil {
				return nil, err
			}
			if gone := chunker.Truncated(p.Storage, storage); len(gone) > 0 && !p.Refresh {
				errs = append(errs, fmt.Errorf("%w: partition(s) %v of %s were truncated since the position was taken (emptied into a new file): published through the root, a TRUNCATE of one partition is not streamed, so their rows are still in the output; re-backfill it",
					ErrPartitionsChanged, gone, name))
			}
			p.Storage = storage
		}
		before := p.Shape
		if p.Refresh || tc.TypesChanged {
			before = Shape{} // started over, or converted: nothing to compare
		}
		shape, err := checkShape(ctx, conn, name, t.Ident(), t.OID, before)
		var cause error // a rewrite the table is re-backfilled for (RebackfillRewrites)
		switch {
		case e.cfg.RebackfillRewrites && errors.Is(err, ErrValuesRewritten):
			cause, err = err, nil
		case e.cfg.RebackfillRewrites && err == nil && before.Unlogged:
			cause = fmt.Errorf("%s was UNLOGGED when the position was taken, and is LOGGED now (ALTER TABLE ... SET LOGGED): the writes made in between are in no WAL record", name)
		case err != nil:
			errs = append(errs, err)
		}
		shape.Truncated = p.Truncated
		if err == nil && cause == nil && len(before.Files) > 0 && !slices.Equal(before.Files, shape.Files) && !tc.Maintenance {
			// New files with no column change: a TRUNCATE explains them, or maintenance, or a
			// persistence round trip (storageCheck).
			writers, err := lastWriters(ctx, conn, t.OID, before.Files, shape.Files)
			if err != nil {
				return nil, fmt.Errorf("read the storage of %s: %w", name, err)
			}
			sc := &storageCheck{table: name, ident: t.Ident(), before: before.Files, files: shape.Files, writers: writers}
			for _, c := range shape.Columns {
				if !slices.ContainsFunc(before.Columns, func(b ColumnType) bool { return b.Attnum == c.Attnum }) {
					sc.added = append(sc.added, c.Name)
				}
			}
			if !sc.explainedBy(p.Truncated) {
				added, err := volatileAdded(ctx, conn, t.OID, before.Columns, shape.Columns)
				if err != nil {
					return nil, fmt.Errorf("read the columns added to %s: %w", name, err)
				}
				if len(added) > 0 && e.cfg.RebackfillRewrites {
					cause = errVolatileAdded(name, added)
				} else {
					checks[name] = sc
					shape.Files = before.Files
				}
			}
		}
		if cause != nil {
			e.log.Warn().Str("table", name).Str("cause", rewriteCause(cause)).Msg("re-backfilling the table while the capture goes on: a change rewrote its values with no row event")
			p = &TableProgress{Refresh: true, Storage: p.Storage}
		}
		p.Key, p.OID, p.Publication, p.Partitions, p.Shape = key, t.OID, member, t.Partitions, shape
		pos.Tables[name] = p
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(checks) > 0 {
		// Whatever changed the files committed before now: the stream must explain it before
		// it is past this position.
		var until pglogrepl.LSN
		if err := conn.QueryRow(ctx, `SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END`).Scan(&until); err != nil {
			return nil, fmt.Errorf("read the server's WAL position: %w", err)
		}
		for _, s := range checks {
			s.until = until
		}
	}
	return checks, nil
}

// memberAtStart names what became of table t (name), found in publication pub without a row
// filter by discovery, and found no member (or with a row filter) a statement later: dropped,
// UNLOGGED, published through its partitions, filtered, or out of the publication (a table not
// captured yet is added back; a captured one was out meanwhile, and is re-backfilled). It returns
// nil only for a captured table with a membership on record, which the membership check that
// follows names.
func memberAtStart(ctx context.Context, conn *pgx.Conn, pub, name string, t *chunker.Table, key []string, p *TableProgress, member string) error {
	// Discovered again by the OID: it names the cause, when there is one now.
	_, err := chunker.DiscoverOID(ctx, conn, t.OID, key, pub)
	switch {
	case errors.Is(err, chunker.ErrGone):
		return fmt.Errorf("%w: %s (OID %d) was dropped as the run started; take it out of the capture (or, if it was created again, re-backfill it)", chunker.ErrGone, name, t.OID)
	case err != nil && !errors.Is(err, chunker.ErrNotPublished):
		return err
	}
	// A partition made UNLOGGED meanwhile (the table itself, discovery names): the table left a
	// FOR ALL TABLES or schema publication for that reason, which the shape names (as the watch
	// does).
	if _, err := checkShape(ctx, conn, name, t.Ident(), t.OID, Shape{}); errors.Is(err, ErrUnlogged) {
		return err
	}
	captured := p != nil && !p.Refresh
	switch {
	case captured && p.Publication != "":
		return nil // the membership check that follows names it
	case member != "":
		then := ""
		if captured {
			then = ", then re-backfill it (changes may not be in the slot)"
		}
		return fmt.Errorf("%w: %s in publication %q took a row filter, or lost one, as the run started (%q); start again%s", ErrPublicationChanged, name, pub, member, then)
	case !captured:
		return fmt.Errorf("%w: %s left publication %q as the run started, so its changes would not be streamed; add it back with: ALTER PUBLICATION %s ADD TABLE ONLY %s;",
			chunker.ErrNotPublished, name, pub, pgx.Identifier{pub}.Sanitize(), t.Ident())
	default:
		return fmt.Errorf("%w: %s is no longer in publication %q, so its changes since it left are not in the slot; add it back (ALTER PUBLICATION %s ADD TABLE ONLY %s), then re-backfill it",
			ErrPublicationChanged, name, pub, pgx.Identifier{pub}.Sanitize(), t.Ident())
	}
}

// membershipKept reports whether the table with OID oid, a member of the publication as before
// at the last look and as now, was published all along: the same membership, or a change
// chunker.MembershipKept keeps (it reads whether the table is a partition only then).
func membershipKept(ctx context.Context, conn *pgx.Conn, oid uint32, before, now string) (bool, error) {
	if before == now {
		return true, nil
	}
	part, err := chunker.IsPartition(ctx, conn, oid)
	if err != nil {
		return false, err
	}
	return chunker.MembershipKept(before, now, part), nil
}
