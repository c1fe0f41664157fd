// Package replicator implements the replication connection of Tidemark: one logical replication
// session on a pgoutput slot, decoded into a small set of typed events.
//
// Open connects, checks the server (PostgreSQL 13 or later, wal_level = logical), the slot (it
// exists, uses pgoutput, belongs to this database, is not lost or in use) and the publication (it
// exists and publishes inserts, updates and deletes), creating the slot or the publication when
// the Config allows it, and runs IDENTIFY_SYSTEM. Run streams from a resume LSN and calls a
// function for every event. Ack records what is durable downstream; only that is ever confirmed
// to the server.
//
// # Events
//
// Begin, Change (insert, update, delete), Truncate, transactional Message and Commit arrive as
// whole transactions, one after the other, in commit order: the stream does not ask for in-progress
// transactions (pgoutput's streaming option stays off). Relation and TypeInfo describe tables and
// types; Origin marks replicated transactions; a non-transactional Message and Keepalive arrive
// between transactions.
//
// # Invariants this package relies on and keeps
//
//   - Commit LSNs strictly increase along the stream. The LSNs of changes do not: a transaction
//     that commits later can hold changes written before an earlier transaction's commit. Nothing
//     here orders anything by change LSN.
//   - The relation cache belongs to one replication session: the server sends a Relation before a
//     table's first change in each session and after its definition changes. A new Stream starts
//     with an empty cache; a Change points at the Relation that was current when it arrived.
//   - An unchanged TOASTed value arrives as Kind Unchanged, never as Null: it is not known here.
//   - The flush position sent to the server is the acknowledged LSN and never more. pglogrepl
//     replaces a zero flush position with the write position, so the write and apply positions
//     sent are the acknowledged LSN too; while nothing is acknowledged all three are zero, which
//     the server ignores. The server starts a stream at the later of the requested LSN and the
//     slot's confirmed_flush_lsn, and sends every transaction whose commit record starts at or
//     after that point: acknowledging a Commit's EndLSN and restarting from it delivers exactly
//     the transactions after it.
//   - Every connection pins the session settings that change text output (TimeZone, DateStyle,
//     IntervalStyle, extra_float_digits, bytea_output, lc_monetary) in its startup packet, so the
//     walsender formats values exactly as Tidemark's query connections do.
//
// # Concurrency
//
// A Stream is not safe for concurrent use, except Ack and Acked. Run is called once, and the
// goroutine running it is the only one that touches the replication connection: it reads with a
// deadline at the next status update, sends status updates and keepalive replies itself, and calls
// fn inline. When fn must wait for a slow consumer, it calls Keepalive (on the same goroutine) so
// the server does not end the session after wal_sender_timeout. Cancelling Run's context ends it
// promptly: a last status update with the acknowledged LSN, then CopyDone.
//
// The message formats are those of
// https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html; the replication
// protocol is https://www.postgresql.org/docs/current/protocol-replication.html.
package replicator
