// Package postgres is the PostgreSQL output: Sink applies the engine's events to another
// PostgreSQL database (the target), exactly once. Package sink states what every output
// guarantees; this is how this one keeps it.
//
//   - One writer per checkpoint and per target table: Open takes a session advisory lock on the
//     checkpoint's id before it reads or writes anything, and the sink takes one per target table
//     when it first meets the table. They are held until the target connection ends (a crash of
//     the process or of the session releases them). A second sync on either fails, naming the
//     server process that holds the lock.
//   - The checkpoint is in the data transaction: the changes between two checkpoints and the
//     checkpoint row (public.tidemark_checkpoint, one row per capture id) commit in one target
//     transaction. A crash at any point leaves the target at a checkpoint; what was applied
//     after it was never committed, and the engine replays it from the slot. There is nothing to
//     cut on resume: Open reads the row and resumes from its position.
//   - synchronous_commit on: the target transaction sets it locally, whatever the target's
//     setting, because the slot is confirmed up to the checkpoint right after the commit
//     returns (docs/invariants.md I12). A commit a crash of the target could take back would
//     lose those changes for good.
//   - The fence: the checkpoint row moves only from the position this sink last read or wrote
//     (UPDATE ... WHERE position = the last one). A writer whose row another moved (its session
//     was ended and another sync took over, or it was frozen while another ran) has its
//     transaction rolled back and fails, instead of moving the checkpoint back over the other's
//     rows.
//   - A checkpoint names its target schema (--target-schema): read for another schema it is
//     refused, since its tables are done only where it was written.
//   - Within a transaction, each key's events fold into one final state; a batch applies the
//     deleted keys first, then the rows, grouped by the columns they set, staged with COPY in a
//     temporary table and upserted on the key (INSERT ... ON CONFLICT). Backfilled rows are first
//     copied straight into the table under a savepoint; a key the table already has fails the
//     copy, which is undone, and the batch is upserted instead.
//   - A large source transaction is applied in pieces inside the one target transaction once
//     the pending rows pass a bound of rows or bytes: the sink's memory stays bounded and
//     nothing is visible on the target before the checkpoint commits.
//   - A target table has a unique index on exactly the key's columns (created so, or checked when
//     it exists), no foreign key from or to it, and no non-key column GENERATED ALWAYS AS
//     IDENTITY; otherwise the sink stops with the statements that fix it.
//   - Open refuses a target that is the source database itself (a transaction advisory lock the
//     source takes on a random key, looked for in the target's pg_locks: a physical copy of the
//     source does not see it). Before the capture starts, CheckTables refuses an existing target
//     table holding rows the checkpoint does not account for (a first run into a filled table:
//     rows the source lacks would stay), unless the run re-backfills it (emptied, after the
//     checks of a table the sink writes, and never when another capture's checkpoint covers it)
//     or backfills nothing.
//   - An enum a created table needs is created as on the source (schema, name, labels); an
//     existing one must have the same labels and a trusted owner.
//   - A commit with no answer (the connection lost) may have happened: Checkpoint's error then
//     wraps merge.ErrCommitUnknown, and the run keeps what it created on the source.
//   - Unchanged TOASTed values are never written: their columns are left out of the upsert.
//   - The source's definition changes are followed where that is safe (a column added, a type's
//     modifiers changed); otherwise the sink stops with the statements to run (a rename that
//     cannot be told from a drop and an add, a type converted with an unknown USING, a column
//     whose existing rows got values no event carries: the last two wrap ErrRewriteNotFollowed,
//     which tidemark sync answers by running again once, a run that re-backfills the table).
//   - A table with no row since a TRUNCATE or a refresh of this sink (or, met first, one the
//     checkpoint accounts for, found empty under an ACCESS EXCLUSIVE lock) takes the source's
//     column types as they are (ALTER ... TYPE ... USING NULL: no value to convert); the key's
//     operators and the type's domain checks are then read again.
//
// The SQL is built by pure functions (sql.go), golden-tested (testdata/sql.golden; go test
// ./sink/postgres -run TestSQLGolden -update rewrites it): identifiers quoted, values bound
// parameters, except a default the target must give a new column's existing rows, written as a
// quoted literal cast to the column's type.
package postgres
