// Command tidemark captures changes from PostgreSQL and backfills tables while the changes keep
// flowing. Run `tidemark help` for its commands; docs/cli.md describes them.
//
// The commands are wiring: flags, building the engine's configuration and its sink, and
// output for a person (progress, summaries, metrics). The sinks are packages of their own, each
// stating its invariants: sink/jsonl (a JSON lines file or standard output, cut back to its
// checkpoint on resume) and sink/postgres (another PostgreSQL, exactly once, the checkpoint in
// the data transaction); package sink states what every output guarantees.
//
// What the wiring relies on:
//
//   - The slot is confirmed only up to the last checkpoint the sink made durable
//     (merge.Config.AckCheckpoints), and the sink is opened (locked, its resume position read)
//     before the engine starts, with the position it returns as the engine's.
//   - One goroutine owns each connection: the merge loop the target's, the stats poller its own
//     source connection.
package main
