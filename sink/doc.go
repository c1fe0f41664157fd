// Package sink names what every output of the engine implements (Sink), and what the outputs
// share. Each output is a package of its own: sink/jsonl (JSON lines in a file or on standard
// output), sink/postgres (another PostgreSQL, exactly once), sink/kafka (Kafka topics, exactly
// once for read_committed consumers) and sink/nats (a NATS JetStream stream, each event published
// once); the Airbyte connector's record writer (cmd/source-postgres)
// implements the same interface. A new output is a new package beside them, and nothing else
// changes.
//
// What an output must guarantee, whatever it writes to (docs/invariants.md):
//
//   - One writer per output. Opening an output takes its lock first (a lock file, a session
//     advisory lock on the target, a Kafka transactional id's epoch) and holds it for the whole run; a second run on the same
//     output fails before reading or touching anything. (The Airbyte connector's records go to
//     standard output, owned by the platform that runs it; its slot is its lock: a second read
//     finds the slot in use.)
//   - The checkpoint travels with the data. Checkpoint returns only once every event emitted
//     before it and the position itself are durable together: the slot is confirmed up to the
//     position right after, so anything the output could still lose would be lost for good.
//   - Resume from the checkpoint, exactly. Opening an output returns the position of its last
//     checkpoint, and whatever was written after that checkpoint is dropped (a file cut back to
//     its checkpointed length; a target transaction that never committed): the engine replays it
//     from the slot. An output that cannot drop what it wrote (a JetStream stream shows a message
//     once it took it) must instead write nothing twice: sink/nats reads what it holds past its
//     checkpoint and checks the replayed events against it before it writes past it.
//   - A checkpoint names its output. One written for another output (another file, another
//     target schema) is refused instead of marking tables done that this output never got.
//   - Where the lock can be lost while the writer runs (a target session ended from outside, a
//     writer frozen while another took over), the checkpoint moves only from where this writer
//     last saw it (the fence): the writer that lost the output fails instead of moving the
//     checkpoint back over the other's.
package sink
