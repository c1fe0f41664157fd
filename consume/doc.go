// Package consume is the consumer side of the Kafka output, shown end to end: tidemark consume
// reads a Tidemark output's topics as a member of a consumer group, read_committed, and applies
// them to a PostgreSQL target with each partition's offset committed in the same target
// transaction as the rows it covers (the transactional-consumer pattern). docs/operations.md
// ("Consuming a Kafka output") says how to run it; this is what it rests on.
//
//   - The offsets live on the target, not in Kafka. Table public.tidemark_consumer_offsets holds,
//     per group, topic and partition, the offset of the next record to apply; a target
//     transaction applies a batch of records and moves their partitions' offsets, or does
//     neither. A member starts a partition it is given at the target's offset (the group's
//     assignment callback reads them over a connection of its own). A kill at any point leaves
//     the target at a commit; the records after it are read again. The group's offsets in Kafka
//     are moved after each commit for the tools that show a group's lag, and never read.
//   - read_committed, with the transactions' control records kept: records of aborted output
//     transactions are never seen, and a partition's offset passes its commit markers, so the
//     group's offset reaches the partition's last stable offset (how --stop-when-caught-up
//     knows it is done).
//   - The offsets move only from where this member read them (SELECT ... FOR UPDATE, compared):
//     a member that lost a partition (thought dead, its session expired) and still applies it
//     finds its offset moved by the new owner, rolls back, and reads the partition again from
//     the target's offset. Every partition it holds of the step's topics is compared and read
//     again, not only those the step advanced: one stopped at a truncate may have been moved
//     past it. No batch is applied twice. A member starts a partition at an exact offset
//     (never "the start", which would follow a log start moved by retention), and a topic whose
//     partitions are not all its own, or not the checkpoint's count, stops it.
//   - A rebalance waits for the batch being applied (BlockRebalanceOnPoll): a member never
//     applies records of a partition the group already gave another.
//   - A table's topic goes whole to one member (the group protocol tidemark-table): a truncate
//     or refresh is in every partition of its topic, at the same place (the same LSN and seq).
//     A partition that reaches one stops (and is no longer fetched) until every partition of the
//     topic has; it is then applied once, as a delete of the table's rows, and all go on. A
//     partition whose key changes come after it are never applied before it. Partitions that
//     disagree on where it is stop the consumer.
//   - Each record is applied by its key: an insert, update or backfilled row is an upsert of the
//     columns it carries (an update's unchanged TOASTed columns are left as they are), a
//     tombstone a delete of its key. Values are written as their text, which the target parses
//     as the column's type: the JSON form read back (pgjson.Type.Text), or the record's
//     original text where the form is lossy. The target's tables must exist with the source's
//     column types and a unique index on exactly the key's columns; a column, table or index
//     missing stops the consumer with the statement to run. A key value a tombstone cannot
//     carry (NaN, infinity) stops it too: that row could not be found.
//   - One group and one source table per target table (public.tidemark_consumer_tables): a
//     second group would apply the same changes again, interleaved with the first's; a second
//     table (two schemas into one --target-schema) would mix rows, and its truncates empty both.
//   - No record is skipped: an offset out of range (records deleted by retention before the
//     group applied them, a topic deleted and made again) stops the consumer instead of
//     starting the partition over at its start or end (ConsumeResetOffset none), and so do a
//     stored offset past a partition's end and records the brokers lost (ErrDataLoss, an
//     unclean leader election). Group errors that do not pass (another protocol in the group, a
//     session timeout the brokers refuse) stop it; the others are logged and retried. Compacted topics are refused: compaction drops
//     tombstones and all but one of a table's truncates per partition.
//   - Only the topics the output's checkpoint lists are read (re-read every 30 s for tables
//     the sync added): a prefix may be the start of another output's topics.
//   - The target's constraints are the sink's: no foreign key from or to a table (each table,
//     each partition, is applied in its own order); with several partitions, no unique index or
//     exclusion constraint besides the key's (a value that moved between two keys of two
//     partitions could meet itself); no non-key column GENERATED ALWAYS AS
//     IDENTITY (a key one takes the source's values, OVERRIDING SYSTEM VALUE); keys compared
//     with their type's own equality (chunker.ReadOps), whatever search_path says.
//   - An insert that left TOASTed values out (a key change) makes no row with those columns
//     empty: it updates a row already there, and the row read again whole follows it in the
//     same partition.
//   - A target that is the output's source database is refused (its system identifier and
//     database are the checkpoint's): every change applied would be captured again.
package consume
