// Package chaos is Tidemark's chaos harness: a seeded workload against PostgreSQL, the capture
// (tidemark sync to JSON lines or to PostgreSQL, or the Airbyte connector in sync rounds) run
// under faults chosen by the seed, and an oracle that checks the output against the source at
// the end:
//
//   - I1: replaying the output gives exactly the source tables (each record is the whole row but
//     for the columns it lists as unchanged; values in their JSON form, NaN kept apart from NULL);
//   - I2, I3: per key, the emitted versions never go back, and a deleted key never comes back
//     with an older version (the workload's ver column only grows), checked also against the
//     version the source's delete removed (its deaths table);
//   - I13: the output's positions grow; exactly once: a change is not delivered twice up to the
//     checkpoint (a backfilled row repeating its key's version is counted as a duplicate);
//   - PostgreSQL target: the source's transaction log against the target's audit ledger (each
//     transaction applied once), and I2, I3 on the history of the target's rows (audit.go).
//
// The faults come in families. The default one (faults.go): kill -9, immediate restarts of
// PostgreSQL, walsender terminations, connections dropped, reset and stalled by a proxy, a
// committed transaction kept invisible after it was streamed, a slow consumer. The ddl family
// (ddl.go), asked for by name: renames, columns added and dropped, replica identities, a table
// out of the publication and back, TRUNCATE, a column's values rewritten, the publish option
// narrowed, a table UNLOGGED and LOGGED again under a schema publication, a re-backfill asked of
// the running sync, a commit kept invisible across a restart of the capture, a restore of the
// source to an earlier point. The fence family (fence.go): a second
// capture against the slot and output of the running one, which must be refused. The target
// family: the PostgreSQL target restarted, its connections dropped. A fault that did nothing is
// counted apart, without effect. Breaks (breaks.go) break the capture on purpose: each must be
// caught with the violation it causes.
//
// # Stops
//
// The supervisor starts the capture again whenever it ends, as a service manager would. A
// failure is judged (expect.go): a failure of the connection (what the default faults cause) is
// counted; a stop that names a cause (a sentinel of merge, chunker or replicator, by the stable
// part of its text: the capture is another process) must be one a fault registered beforehand
// as an expectation, and is then remedied as the error says (the change undone, the table
// re-backfilled with --rebackfill, the Airbyte stream reset); anything else is a violation. An
// expectation is retired once its change is undone and its re-backfill is in a durable
// checkpoint: the same stop after that is a violation too.
//
// A run only touches its own scratch schemas (SchemaPrefix, the seed and a random id; with the
// ddl family that name and _moved), its slot and publication (of the same name), and, for the
// PostgreSQL target, the target database (the run's schema and its _history); it drops them at
// the end. Its files (Config.Dir) hold a journal: the faults, each
// capture process and how it ended, with its last log lines.
//
// Invariants the harness relies on:
//
//   - The workload's ver column comes from one sequence, so a newer version of a row always has
//     a higher ver, across tables and key changes. A restore takes the sequence back with the
//     rest: the harness moves it past every version handed out and gives every row a new one
//     before the capture sees the restored server.
//   - Records count only once they are durable for the mode: the JSON lines up to their
//     checkpoint, the Airbyte records up to the last STATE of a round, the target's committed
//     rows. What the capture printed after that is what a kill may take back.
//   - The schema faults run one at a time, like the others, and a fault leaves alone a table
//     whose stop is not remedied yet: each table has at most one expectation in progress.
//   - The fault schedule and the workload are drawn from the seed; the interleaving of processes
//     is not, so a replay repeats the faults, not every race.
package chaos
