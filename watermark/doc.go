// Package watermark implements the watermarks of the DBLog algorithm: marks committed in their
// own transactions, and their recognition in the change stream.
//
// # Transports
//
// Messages (the default on PostgreSQL 14 and later, docs/adr/0008): each mark is a transactional
// logical decoding message, pg_logical_emit_message(true, Prefix, content), content being JSON
// with the slot, the run, the chunk id and the kind. pgoutput (option messages) sends it between
// its transaction's Begin and Commit, in commit order, and never if the transaction aborts. It
// writes no table: it needs no privilege beyond PUBLIC's EXECUTE on the function, works in a
// read-only transaction, and needs no publication membership. Only transactional messages are
// marks (DecodeMessage is given those only); a non-transactional one is sent at once, outside
// commit order.
//
// Table (PostgreSQL 13, or a signal table configured explicitly, docs/adr/0001): the signal table (DefaultTable, public.tidemark_signal) holds one row per replication slot,
// upserted by every mark, so it never grows; it must be in the publication, which Ensure
// arranges or, without the rights, explains with the exact SQL (docs/adr/0001). Each mark
// carries the slot, the run (a random id per process start) and the chunk id: Decode ignores
// marks of other slots (another engine sharing the table) and of earlier runs (windows are never
// persisted; after a restart their marks are stale).
//
// Every mark is written with the capture role's rights, so Ensure refuses a signal table that
// carries triggers or rules, or whose owner is neither that role nor a superuser (an owner can
// add a trigger at any time): code of someone else's choosing would run as the capture, and
// could forge marks.
//
// # Invariants
//
//   - Both transports give a mark the same place in the stream: inside its transaction, acted on
//     at that transaction's Commit. A transactional message assigns an xid and writes WAL, so
//     its commit is flushed (and waits for synchronous standbys) like a row's.
//   - A mark is committed in a transaction of its own (a chunk's high mark may share it with the
//     next chunk's low one, in that order: merge's I22), with synchronous_commit = on: the walsender
//     sends only flushed WAL, so a lower setting would delay marks by up to wal_writer_delay; on
//     a server with synchronous standbys the mark also waits for them like the application's
//     commits do, which keeps marks from becoming visible ahead of earlier commits (the rest is
//     the merge's visibility guard).
//   - A write whose outcome is unknown may be repeated with the same mark: the merge acts on the
//     first one the stream shows.
//   - Write is bounded by Config.Timeout through a context deadline on a connection that answers
//     cancellation with a cancel request: PostgreSQL disables the statement timeout before it
//     commits, so only a cancel ends a wait for a synchronous standby that does not answer.
//
// # Concurrency
//
// A Writer uses a connection it does not own and is not safe for concurrent use.
//
// The DBLog paper: https://arxiv.org/abs/2010.12597.
package watermark
