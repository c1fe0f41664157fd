// Package kafka is the Kafka output: Sink writes the engine's events to one topic per table
// (PREFIX.SCHEMA.TABLE), exactly once for a read_committed consumer, with franz-go's
// transactional producer. docs/cli.md gives the record layout, docs/operations.md what exactly
// once means here and its limits.
//
// What it relies on (package sink states what every output guarantees; docs/invariants.md I12
// for the slot):
//
//   - The checkpoint travels with the data. The records emitted since the last checkpoint and
//     the checkpoint record (topic PREFIX.tidemark-checkpoint, key PREFIX: the position and each
//     topic's partition count) are written in one Kafka transaction; Checkpoint returns nil only
//     once it committed, and the engine confirms the slot after that. A commit whose outcome is
//     unknown is merge.ErrCommitUnknown. Nothing is committed without a checkpoint record: a
//     source transaction is never split across Kafka transactions (the transaction timeout
//     bounds the time between two checkpoints instead).
//   - One writer per prefix. The transactional id is tidemark-PREFIX: a producer that loads it
//     bumps its epoch, which fences any earlier producer of the prefix (its next produce or
//     commit fails, named as a take-over) and aborts the transaction it left open. Open does it
//     only after the prefix's checkpoint was found to be this slot's (another capture's output
//     is refused, not fenced) and the slot idle (the same capture running is refused), then reads
//     the checkpoint again: now nobody else can write it.
//   - Resume from the checkpoint, exactly. What a killed run wrote after its last checkpoint is in
//     a transaction the next run's producer aborts; read_committed consumers never see it, and
//     the engine replays those changes from the slot.
//   - The records are produced with the sink's own context, not the run's: a record produced and
//     not yet sent when the run ends is aborted with its transaction by Close, not failed alone.
//   - A key's records are in one partition, in output order: the record key is the row's key as
//     JSON, hashed as Kafka's own clients hash keys (murmur2), so the partition depends on the
//     partition count; the checkpoint records it per topic and a topic whose count changed is
//     refused. A truncate or a refresh, which concerns every key, goes to every partition.
//   - The layout (a topic per table, or one topic PREFIX for all with the table in a header) is
//     the output's for its life: the checkpoint records it, and a run with the other is refused
//     once records were written. One topic is never compacted (two tables' rows of one key would
//     compact into one).
//   - A topic is the output's when the checkpoint lists it; one it does not list is taken only
//     when it holds no committed record (what a run killed before its first checkpoint left).
//     Topics the output creates are listed at once, by a checkpoint of the unchanged position,
//     before anything is written to them.
//   - ReadCommitted reads a partition up to its last stable offset (before the oldest open
//     transaction), keeping the control records to know when it got there: the offset before it
//     is a committed record or a marker, since an output's transactions do not interleave.
package kafka
