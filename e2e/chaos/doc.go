// Package chaos is Tidemark's chaos harness: a seeded workload against PostgreSQL, the capture
// (tidemark sync to JSON lines or to PostgreSQL, or the Airbyte connector in sync rounds) run
// under faults chosen by the seed (kill -9, immediate restarts of PostgreSQL, walsender
// terminations, connections dropped, reset and stalled by a proxy, a committed transaction kept
// invisible after it was streamed, a slow consumer), and an oracle that checks the output
// against the source at the end:
//
//   - I1: replaying the output gives exactly the source tables;
//   - I2, I3: per key, the emitted versions never go back, and a deleted key never comes back
//     with an older version (the workload's ver column only grows);
//   - duplicates (a version emitted twice) are counted, not hidden;
//   - PostgreSQL target: the audit ledger holds every source transaction once.
//
// A run only touches its own scratch schema (Schema), its slot and publication (named after the
// seed), and, for the PostgreSQL target, the target database; it drops them at the end.
//
// Invariants the harness relies on:
//
//   - The workload's ver column comes from one sequence, so a newer version of a row always has
//     a higher ver, across tables and key changes.
//   - Records count only once they are durable for the mode: the JSON lines up to their
//     checkpoint, the Airbyte records up to the last STATE of a round, the target's committed
//     rows. What the capture printed after that is what a kill may take back.
//   - The fault schedule and the workload are drawn from the seed; the interleaving of processes
//     is not, so a replay repeats the faults, not every race.
package chaos
