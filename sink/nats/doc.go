// Package nats is the NATS JetStream output: Sink publishes the engine's events to one stream
// (STREAM, subjects STREAM.>), each table's events on the subjects STREAM.SCHEMA.TABLE.N, a
// key's on the one its hash names (N from 0 to Options.Partitions-1), with its checkpoint in a
// key-value bucket (tidemark-STREAM). docs/cli.md gives the message layout, docs/operations.md
// what exactly once means here and its limits.
//
// JetStream has no transaction over several messages: a message is visible once the stream took
// it, before any checkpoint. So exactly once is not "nothing after the checkpoint is visible"
// (Kafka's read_committed) but "nothing is published twice", and the output is built on these:
//
//   - The stream is a gap-free prefix of what the output sent. Every message carries the
//     stream's last sequence it expects (Nats-Expected-Last-Sequence, the sequence of the message
//     before it): a message that failed fails every one after it, and nothing another publisher
//     wrote can fall between two of the output's. The stream is the output's alone: one with
//     other subjects, or holding messages no checkpoint accounts for, is refused.
//   - A message's mark is its event's (LSN, seq) and its index among the event's messages (a
//     truncate or a refresh goes to every subject of its table), with the source's history it
//     was read in (system id and timeline): marks grow along the output. The last message's mark
//     is where the output got, whatever the checkpoint says.
//   - A restart resumes from the checkpoint (the slot was confirmed only up to it). The events up
//     to the stream's last message (the horizon) are not published again, and not taken on
//     trust either: the stream's messages past the checkpoint's position are read at open, and
//     the run must read those events again one for one, by LSN, table, operation, key and index
//     (not seq: a table whose output one run started over and the other not numbers a
//     transaction's events otherwise). Anything else is a divergence, an error naming the tables
//     to re-backfill: a change the stream lacks at an LSN it went past, or one it has that the
//     run does not read. The usual cause is a re-backfill a killed run began that the next run is
//     not asked for (its held-back changes are not in the stream). At the horizon's own LSN (the
//     transaction the killed run stopped in) what the stream lacks is published after its last
//     message, its seq placed after it.
//   - A table whose refresh the stream holds past the checkpoint (a re-backfill the killed run
//     began) starts over again: Open returns the position with the table's refresh asked for,
//     and the tables the run starts over are left out of the comparison (their events are held
//     back until their new refresh, past the horizon). Until the run is past the horizon,
//     Replaying says so and the engine refuses a re-backfill asked of it (merge.Replayer).
//   - The comparison holds only in the history of the source the messages were read in and from
//     the position they followed: merge.Resumer tells the sink the history the run reads and
//     whether its output starts over; in either case nothing is compared or passed over.
//   - The checkpoint records the last mark, and, while the run has not gone past the horizon (or
//     keys may still be read again), where the stream was read from (TailFrom): a run killed
//     again before it got there reads the same messages again.
//   - A backfilled row is read again after a restart at a new high watermark, which no mark
//     covers. The keys the stream has as backfilled rows past the checkpoint are passed over
//     when their chunks are read again: the row the stream has, with every change after it, is
//     the row as of now. (Only the keys written past the checkpoint the run starts from: a run
//     killed twice within one chunk's re-read writes some rows again, each a correct copy at a
//     later point, as a refresh of the row.) A delete of the key, in those messages or in the
//     run, ends that: a row under the key after it is another row, which may have come without
//     its unchanged TOASTed values (moved onto the key) and is the one the engine reads again.
//     Keys are compared by the engine's key (HeaderKeyID), not by their JSON: a numeric key
//     updated from 8 to 8.0 and then deleted is deleted as 8.0, and must end the pass-over of
//     the row backfilled as 8 (TestSkipEndsAtDelete). The engine's key is one for such
//     spellings for the types it reads as values (integers, numeric, floats, bool, uuid, bytea);
//     others (numeric[], interval, jsonb, citext...) it keys by their text, where the gap
//     stays. Messages of an earlier version, without HeaderKeyID, are compared by their JSON
//     (a delete ends both forms).
//   - A run that ended before its first checkpoint dropped the slot it had created; what it
//     published stays. On a slot created again (it starts past those messages), nothing is read
//     again and the changes between are in no slot: merge.Leftover has the engine start every
//     table's output over. On the slot a killed run left, the run starts where that one began.
//   - The message id (Nats-Msg-Id) is SLOT:HISTORY:LSN:SEQ:IDX: the stream's duplicate window drops a
//     message sent twice within it, a net behind the marks; a duplicate reported back is an
//     error, never taken silently.
//   - One writer: the checkpoint is written with a compare-and-set on its revision, and each run
//     writes it on open (with an owner of its own) after the slot was found idle: a run still
//     writing fails its next checkpoint, and its next message too once the new run wrote one.
//   - The checkpoint is written once the stream acknowledged every message before it; the engine
//     confirms the slot after that.
package nats
