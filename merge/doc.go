// Package merge implements the DBLog reconciliation of Tidemark: it backfills tables chunk by
// chunk while their change stream keeps flowing, and hands one ordered stream of Events and
// checkpoint Positions to a Sink.
//
// # The algorithm
//
// For each chunk the worker registers the chunk, writes a low watermark L, reads the chunk (a
// keyset page, in its own short snapshot), hands the rows over, and writes a high watermark H.
// The stream is processed without pause meanwhile: every change of a table whose transaction
// commits between L and H in stream order evicts its key (old and new) from the chunk, or, if the
// rows have not arrived yet, is remembered and applied on arrival. At H's commit the surviving
// rows are emitted as Snapshot events, right after H's transaction, at H's commit LSN. Stream
// events are never filtered, delayed or dropped because of the backfill. See the DBLog paper,
// https://arxiv.org/abs/2010.12597, and ../docs/invariants.md for every invariant named here.
//
// # Invariants this package keeps
//
//   - Window membership is by stream (commit) order, never by comparing change LSNs (I6).
//   - Registration precedes L, and the rows precede H, in the one channel the merge loop reads:
//     the worker sends each before writing the mark, and a mark can only be streamed after it
//     commits (I7).
//   - Between two range chunks of a table, the high watermark of one and the low of the next
//     commit in one transaction, and the next chunk is read while the first one's verdict comes;
//     the worker takes that verdict before the next high watermark and withdraws the next chunk
//     when the first did not leave the table's cursor where it starts (I22). One window is open
//     at a time per reader. Several readers (Config.Readers) backfill different tables, and key
//     ranges of one table, at once, each with its own connection and windows (I23): the
//     reconciliation does not rely on one window (each stands on its own snapshot and marks,
//     and a change evicts its key from every open window of its table); the bookkeeping around
//     it is per reader: chunk ids unique across readers (strided), verdicts routed by id,
//     wakeups to every reader, each table owned by one reader (its refresh, re-reads, watch and
//     split), a split backfill's progress per key range (TableProgress.Ranges: a range chunk
//     completes only from its range's cursor under its range's bound), the guard
//     seeded before any reader registers a window, and a fence from each reader that has
//     nothing left (a bounded run ends at a fence once every reader wrote one and no table has
//     work pending). Chunks grow, up to 4 times the chunk size and within the byte bound, while
//     no change of a captured table commits inside their windows (nothing waits behind their
//     rows).
//   - The visibility guard (guard.go): a chunk whose snapshot does not see a transaction that
//     committed before L in the stream is abandoned and read again (I11). PostgreSQL streams a
//     commit before it makes it visible. Commits no snapshot has shown visible yet are carried
//     by checkpoints to the next run (Position.Invisible), whose stream will not show them.
//   - A chunk whose table changed definition inside its window, was truncated, or whose H never
//     appears in the stream is abandoned; only marks of this slot and run act, and each H acts
//     once (I10, I17). A chunk that read a newer definition than the stream last described (a
//     column added while the table was quiet) is emitted with its own columns.
//   - Each event has a position (LSN, Seq): the commit LSN of its transaction, or H's for
//     snapshot rows; it increases along the output (I13). A key change is a delete of the old key
//     and an insert of the new one. Unchanged TOASTed values are filled from the old row under
//     REPLICA IDENTITY FULL and passed on as Unchanged otherwise, never as NULL; a row that then
//     has no whole copy in the output (a chunk row evicted by such an update, the new key of a
//     key change) is read again whole, and stays pending until a window reads it after its last
//     such change. A chunk row whose changes inside its window were all updates of its key that
//     left the same TOASTed values out goes out whole at H instead (fill: those values did not
//     change across the window, so the chunk has them), and a hot row never waits on a re-read
//     that its next update beats (docs/adr/0005-unchanged-toast.md).
//   - Never silent (I18): tables are known by OID (a renamed table is followed, under its
//     configured name); a change whose key cannot be built (a key column NULL or unsent, a
//     replica identity that does not carry the key), another table under a captured name, a
//     table that left the publication or whose partitions changed, a table rewritten under a
//     changed column (rewrite.go: its catalog row written again and new storage files, since no
//     USING clause is recorded), an UNLOGGED table or partition, storage files replaced between
//     two runs that no streamed TRUNCATE explains (rewrite.go's storageCheck: maintenance and a
//     SET UNLOGGED/SET LOGGED round trip leave the same sign) stop the capture with an
//     UnplaceableError or a sentinel error naming the table, the cause and the fix.
//   - A change that rewrote a table's values with no row event (a type change that rewrote it,
//     an enum label renamed, a column added with a volatile default, SET UNLOGGED then SET
//     LOGGED) is, with Config.RebackfillRewrites, followed by a refresh of the table instead of
//     a stop: the worker asks it of the merge loop with the table's shape now, which the loop
//     records only as it takes the request, so that a position never holds the new shape
//     without the refresh (a run killed before finds the change again at start, and re-backfills
//     from there). A table is re-backfilled this way at most once per RewriteRebackfillEvery; a
//     rewrite within it leaves the shape unrecorded and is found again at each look until its
//     time comes. An UNLOGGED table is recorded as such (Shape.Unlogged) and re-backfilled once
//     LOGGED again, by this run or the next. What cannot be told from maintenance (new storage
//     files alone, between two runs) still stops.
//   - A refresh (TableProgress.Refresh) starts a table's output over at the low watermark of its
//     first window, with a Refresh event; the table's changes before it are not emitted (I20). It
//     is asked for at start (the position, TableConfig.Rebackfill) or while the run goes on
//     (Engine.Rebackfill: the merge loop takes it between two inputs, abandons the table's open
//     windows, and the worker opens the refresh's first window; nothing goes through the
//     database, so no other role can ask for it).
//   - Positions are taken only at transaction boundaries and contain the backfill progress as of
//     that point: a chunk counts iff its H precedes the position. Windows and buffers are never
//     persisted; a crash redoes the chunk in flight (I8). The slot is acknowledged only up to a
//     position the sink made durable (AckCheckpoints) or the position Run resumed from (I12),
//     and a position is resumed only on the cluster, database, slot and timeline history it was
//     read from (resume.go, I19).
//   - The backfill's upper key is captured at its start (I15); every chunk is one short
//     transaction (I16). Memory does not grow with a transaction: a chunk stops at a byte bound,
//     a window keeps only its chunk's keys once they arrived, a table with too many rows to read
//     again starts its backfill over (I21).
//
// The core (core.go) is pure: no I/O, no goroutines, no clock. It is property-tested against a
// model of PostgreSQL with visibility anomalies, failed and repeated watermarks and random
// interleavings (core_test.go, FuzzWindow).
//
// # Concurrency
//
// Engine.Run owns its goroutines, each waited for: the replication loop (sole user of the
// replication connection), a chunk worker per reader (each the sole user of its query
// connection, the first reader's the run's own, the others' opened and closed by the worker: chunks, marks,
// and the watch of what the stream does not report: names, publication membership, publish
// options, partitions, column types and storage, every WatchInterval, between chunks, while idle
// and while it waits for a verdict, so that no wait hides a change undone within it),
// and the merge loop (which owns the core and calls the Sink). They meet in one buffered channel, private to
// this package, read by the merge loop; the merge loop answers the worker with a verdict per
// chunk. A slow sink fills the channel, and the replication loop keeps the server's
// wal_sender_timeout at bay with status updates while it waits. When Run's context ends, the
// merge loop finishes the transaction in progress (for up to 5 seconds), takes a last
// checkpoint, and stops the others.
//
// A table's membership of the publication is the catalog rows that make it a member; a look
// that finds another stops the capture (its changes may have gone to no slot meanwhile), unless
// both looks share one of those rows without a row filter (chunker.MembershipKept): a row there
// at both looks was there in between, so the table was published all along (its schema added
// to the publication, then the table dropped from the list). The new membership is then
// recorded (memberNow), and the next look compares with it. A partition's membership may come
// through an ancestor's row or schema, which DETACH PARTITION takes away without changing a row:
// any change of it stops, as does any change where a row filter is involved. The first look is
// at a run's start, a statement after discovery found the table published without a row filter:
// a table found no member then, or with a row filter (it left the publication, was dropped, made
// UNLOGGED or filtered in between), stops the start with the cause a discovery by its OID names,
// since a membership on record that was never right would compare equal to every later look.
package merge
