// Command tidemark captures changes from PostgreSQL and backfills tables while the changes keep
// flowing. Run `tidemark help` for its commands; docs/cli.md describes them.
//
// The commands wire the engine (package merge) to a sink: JSON lines (jsonl.go) or another
// PostgreSQL (pgsink.go). What the sinks rely on:
//
//   - The slot is confirmed only up to the last checkpoint a sink has made durable: the JSON
//     lines file synced and its checkpoint file replaced atomically, or the target's transaction
//     committed with the checkpoint row in it. A crash resumes from that checkpoint, and the JSON
//     lines file is cut back to it.
//   - PostgreSQL target, exactly once: the changes between two checkpoints and the checkpoint row
//     commit in one target transaction. Within it, a batch folds each key's events into one final
//     state; deletes are applied first, then the rows, staged with COPY and upserted on the key.
//   - A target table has a unique index on exactly the key's columns (created so, or checked when
//     it exists). The upsert needs it, and the direct copy relies on it: a chunk's rows are copied
//     straight into the table under a savepoint, and a key the table already has makes the copy
//     fail, be undone, and the batch be upserted instead.
//   - Unchanged TOASTed values are never written: their columns are left out of the upsert.
//   - One goroutine owns each connection: the merge loop the target's, the stats poller its own
//     source connection.
package main
