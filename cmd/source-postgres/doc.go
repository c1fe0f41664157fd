// Command source-postgres is Tidemark's Airbyte source connector: spec, check, discover and read
// of the Airbyte protocol (v0), over Tidemark's backfill-while-streaming engine (CDC), or with
// queries (the Standard and Xmin methods, methods.go). Its config is a superset of Airbyte's own
// source-postgres config. See docs/airbyte.md.
//
// stdout carries protocol messages only, one per line; logs go to stderr, and warnings also as
// LOG messages. Every failure ends in a TRACE ERROR with its failure_type and a non-zero exit.
//
// # Invariants this command relies on and keeps
//
//   - With CDC, a STATE is written only for an engine Position (a transaction boundary, every
//     chunk counted in it already emitted) or after a full refresh chunk; it lists every
//     configured stream. With Standard and Xmin, a STATE is one stream's, written after its
//     records: after a key chunk, between two cursor values, at the end of a scan.
//   - sourceStats.recordCount is the number of RECORD lines written since the previous STATE:
//     records and states go through one output, and a state takes its count and resets it under
//     the same lock as the records are written (output.state).
//   - The slot is confirmed only to the LSN of the state the read was given, which the platform
//     passes only once the destination committed it; never to a state of the read itself, unless
//     lsn_commit_behaviour is "While reading Data". A state ahead of the server's WAL is never
//     confirmed (merge.ErrPositionAhead).
//   - _ab_cdc_lsn is the engine's event LSN: the commit LSN, or the high watermark's for a
//     backfilled row; it never decreases along a stream's records, and a transaction yields one
//     record per key (recordSink collapses the rest), so a destination's dedup by the highest
//     _ab_cdc_lsn is exact. A transaction too large to hold back is written in parts; a key
//     written again after such a part gets a later emitted_at, the destinations' tie-break.
//   - No secret of the config leaves the process: LOG, TRACE and CONNECTION_STATUS text and the
//     stderr log are scrubbed of every secret value, raw and JSON-escaped.
//   - Nothing is written to the filesystem: certificates and a client key given inline are kept
//     in memory and set on each connection's TLS configuration (inlineTLS), so every command runs
//     with a read-only root and no writable directory, and a killed run leaves no key behind.
//
// # Goroutines
//
// main runs the command. During read, the engine's goroutines (merge.Engine.Run) call the sink;
// the reader owns a heartbeat goroutine (repeating the last state when nothing was written for a
// state interval) and, when configured, the heartbeat query's goroutine with its own connection,
// and waits for both. The SSH tunnel owns one goroutine per SSH connection and two per channel,
// and its Close waits for them.
package main
