package merge

import (
	"slices"

	"github.com/jackc/pglogrepl"

	"github.com/tidemark/tidemark/chunker"
)

// guard is the visibility guard (docs/invariants.md, the visibility guard). PostgreSQL streams a transaction once
// its commit record is flushed, but makes it visible to new snapshots only afterwards (after a
// synchronous standby acknowledged it, for one). So a transaction can come before a chunk's low
// watermark in the stream and still be invisible to the chunk's SELECT: the chunk would hold a
// row older than an event already emitted, and emit it after that event. The guard remembers
// the xid and commit LSN of recent transactions; a chunk is rejected when one that committed
// before its low watermark is not visible to its snapshot (its xid is in the snapshot's running
// set, or at or above its xmax).
//
// Xids from the stream have 32 bits; they are compared with the snapshot's low 32 bits modulo
// 2^32, which is exact while the xids compared are less than 2^31 apart (PostgreSQL's wraparound
// protection keeps live xids closer than that).
type guard struct {
	commits []xidCommit // in commit order
	max     int         // cap on commits; past it the oldest go and the guard becomes conservative
	// before are transactions that may have committed before the position this run resumed
	// from while still invisible (seed): this run's stream does not show them, so they count as
	// committed before every low watermark. Each goes once a snapshot shows it visible
	// (visibility never goes back), or once this run's stream shows its commit after all.
	before map[uint32]bool
	// seeded are the transactions seed gave that a chunk still to be checked may miss: unlike
	// before, a snapshot showing one visible does not end it (a chunk handed over earlier, or
	// registered and not yet read, may hold an older snapshot that misses it); it goes once every
	// such snapshot's xmin is past it (prune), as commits do, or once this run's stream shows its
	// commit (it counts from there, as a commit).
	seeded map[uint32]bool
	// unconfirmed are the commits this run's stream showed that no snapshot has shown visible
	// yet. A checkpoint hands them, with before, to the next run (Position.Invisible).
	unconfirmed     map[uint32]struct{}
	unconfirmedLost bool             // the cap on unconfirmed was reached: the next run cannot trust the set
	last            observedSnapshot // the newest snapshot observed
	haveLast        bool

	overflow   bool   // commits were dropped by the cap
	droppedMax uint32 // the newest xid dropped by the cap
	latestXmin uint64 // xmin of the newest snapshot handed over or observed (a full, 64-bit id: compared as such, never across wraparound)
	haveXmin   bool
	lastPrune  int
}

// observedSnapshot is a snapshot's visibility test, kept to drop at once the commits it shows
// visible.
type observedSnapshot struct {
	xmin, xmax uint32
	running    map[uint32]struct{}
}

type xidCommit struct {
	xid uint32
	lsn pglogrepl.LSN
}

// precedes reports a < b modulo 2^32.
func precedes(a, b uint32) bool { return int32(a-b) < 0 }

// maxUnconfirmed caps the commits kept until a snapshot shows them visible. Snapshots come with
// every chunk and every second from the idle worker, so the cap is only reached when none comes.
const maxUnconfirmed = 1 << 20

func (g *guard) commit(xid uint32, lsn pglogrepl.LSN) {
	delete(g.before, xid)
	delete(g.seeded, xid)
	if g.unconfirmed == nil {
		g.unconfirmed = map[uint32]struct{}{}
	}
	switch {
	case g.haveLast && !invisibleTo(xid, g.last.xmin, g.last.xmax, g.last.running):
		// Visible to a snapshot seen already (a commit streamed well after it was made, in a
		// backlog): nothing to confirm.
	case len(g.unconfirmed) < maxUnconfirmed:
		g.unconfirmed[xid] = struct{}{}
	default:
		g.unconfirmedLost = true
	}
	g.commits = append(g.commits, xidCommit{xid, lsn})
	if len(g.commits) > g.max {
		n := len(g.commits) / 2
		for _, c := range g.commits[:n] {
			if !g.overflow || precedes(g.droppedMax, c.xid) {
				g.droppedMax = c.xid
			}
			g.overflow = true
		}
		g.commits = append(g.commits[:0], g.commits[n:]...)
	}
}

// snapshot notes a snapshot that was handed over: snapshots taken later have an xmin at least as
// high, so commits below it can be forgotten once no pending snapshot needs them.
func (g *guard) snapshot(s chunker.Snapshot) {
	if !g.haveXmin || s.Xmin > g.latestXmin {
		g.latestXmin, g.haveXmin = s.Xmin, true
	}
}

// seed notes transactions that may have committed before the position the run resumed from and
// still be invisible. Such a transaction was streamed, emitted and acknowledged by an earlier
// run (or committed before a new slot's consistent point, and was never streamed); if it is
// still invisible (it waits for a synchronous standby that does not answer), this run's stream
// never shows it, and a chunk whose snapshot misses it would emit a row older than what the
// output already has. The earlier run's checkpoint names the commits it saw that no snapshot had
// shown visible (Position.Invisible); without that, the run seeds every transaction invisible at
// its start, which may include running ones that commit later (they only cost retries).
func (g *guard) seed(xids []uint32) {
	if g.before == nil {
		g.before, g.seeded = map[uint32]bool{}, map[uint32]bool{}
	}
	for _, x := range xids {
		g.before[x], g.seeded[x] = true, true
	}
}

// violated reports whether a transaction that committed before lowLSN is invisible to s, and
// which (0 when commits dropped by the cap could be).
func (g *guard) violated(s chunker.Snapshot, lowLSN pglogrepl.LSN) (bool, uint32) {
	xmin, xmax := uint32(s.Xmin), uint32(s.Xmax)
	if g.overflow && !precedes(g.droppedMax, xmin) {
		return true, 0 // a dropped commit could have been invisible: reject to be safe
	}
	running := make(map[uint32]struct{}, len(s.Xip))
	for _, x := range s.Xip {
		running[uint32(x)] = struct{}{}
	}
	for x := range g.seeded {
		if invisibleTo(x, xmin, xmax, running) {
			return true, x
		}
	}
	for _, c := range g.commits {
		if c.lsn >= lowLSN {
			break // commit order: the rest committed after the low watermark
		}
		if precedes(c.xid, xmin) {
			continue
		}
		if _, ok := running[c.xid]; ok || !precedes(c.xid, xmax) {
			return true, c.xid
		}
	}
	return false, 0
}

// prune forgets commits (and seeded transactions) no snapshot still to be checked can need:
// those below the xmin of every pending snapshot and of the newest snapshot (later ones have
// higher xmins). pending has a floor for each window whose chunk has not come
// (core.pendingXmins): its snapshot may be older than the newest one handed over (several
// readers). It runs when the list has doubled since the last prune, so its cost is amortized;
// the seeded ones, few, go at every call.
func (g *guard) prune(pending []uint32) {
	if !g.haveXmin {
		return
	}
	threshold := uint32(g.latestXmin)
	for _, x := range pending {
		if precedes(x, threshold) {
			threshold = x
		}
	}
	for x := range g.seeded {
		if precedes(x, threshold) {
			delete(g.seeded, x)
		}
	}
	if len(g.commits) < 2*g.lastPrune+1024 {
		return
	}
	kept := g.commits[:0]
	for _, c := range g.commits {
		if !precedes(c.xid, threshold) {
			kept = append(kept, c)
		}
	}
	g.commits = kept
	g.lastPrune = len(kept)
	if g.overflow && precedes(g.droppedMax, threshold) {
		g.overflow = false
	}
}

// invisibleTo reports whether xid x is invisible to a snapshot (xmin, xmax, running).
func invisibleTo(x, xmin, xmax uint32, running map[uint32]struct{}) bool {
	if precedes(x, xmin) {
		return false
	}
	_, ok := running[x]
	return ok || !precedes(x, xmax)
}

// observe forgets the unconfirmed and before transactions that snapshot s shows visible; any
// snapshot will do, taken at any time, since visibility never goes back.
func (g *guard) observe(s chunker.Snapshot) {
	xmin, xmax := uint32(s.Xmin), uint32(s.Xmax)
	running := make(map[uint32]struct{}, len(s.Xip))
	for _, x := range s.Xip {
		running[uint32(x)] = struct{}{}
	}
	if !g.haveLast || !precedes(xmax, g.last.xmax) {
		g.last, g.haveLast = observedSnapshot{xmin: xmin, xmax: xmax, running: running}, true
	}
	g.snapshot(s) // a later snapshot: commits below its xmin need no check (prune)
	for x := range g.unconfirmed {
		if !invisibleTo(x, xmin, xmax, running) {
			delete(g.unconfirmed, x)
		}
	}
	for x := range g.before {
		if !invisibleTo(x, xmin, xmax, running) {
			delete(g.before, x)
		}
	}
}

// invisible returns the transactions a checkpoint hands to the next run: those that may have
// committed up to now and still be invisible; nil when the set is not known whole.
func (g *guard) invisible() *XIDs {
	if g.unconfirmedLost {
		return nil
	}
	out := XIDs{}
	for x := range g.unconfirmed {
		out = append(out, x)
	}
	for x := range g.before {
		out = append(out, x)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	return &out
}
