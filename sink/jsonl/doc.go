// Package jsonl is the JSON lines output: Writer writes the engine's events, one JSON object a
// line, to a file or to standard output, exactly once up to its checkpoint. The format is defined
// once, in package sink/jsonl/line (Line's fields, in the order Encoder writes them, and the strict
// reader that reads them back); the tests check that every line Encoder writes decodes into a
// Line and encodes back to the same JSON.
//
// What the writer relies on (package sink states what every output guarantees; docs/invariants.md
// I12 for the slot):
//
//   - One writer per output: Open takes an exclusive flock on PATH.lock (CHECKPOINT.lock for
//     standard output) before it reads anything, and holds it until Close or the end of the
//     process. A second sync of the same output fails before touching it.
//   - The checkpoint file (PATH.checkpoint unless given) holds the engine's position and the
//     output's length at that position. Checkpoint flushes and fsyncs the output first, then
//     replaces the checkpoint file atomically (a temporary file, fsynced, renamed over the old
//     one, the directory fsynced): a crash at any point leaves a checkpoint whose length the
//     file has.
//   - Truncation to the checkpoint on resume: Open cuts the output back to the checkpointed
//     length, after the slot was found idle (ready) and only then, since whatever was written
//     after it is replayed by the engine. The file then holds every change exactly once up to
//     its checkpoint.
//   - An output is resumed only with its own checkpoint: the checkpoint names its output file,
//     a non-empty file without a checkpoint is not one to resume, and a file shorter than its
//     checkpoint says was cut by someone else. Each stops with what to do.
//   - Standard output cannot be cut: a run to - with a checkpoint file resumes from it and writes
//     again what followed it (at least once); its consumer keeps per key the event with the
//     highest (lsn, seq), which increases along the output (docs/invariants.md I13).
//   - Values have their type's JSON form (internal/pgjson, docs/types.md); a TOASTed value the
//     server did not send is never written as a value: its column is listed in "unchanged".
//   - The lines are written in the events' order whatever encodes them: Pool splits a large
//     batch (a chunk's rows, a large transaction's changes) into contiguous parts encoded at once
//     by encoders of their own, and writes the parts in order; each line is the one a single
//     Encoder writes (its caches only save work), and the batch's column types are looked up
//     before the parts start, so no encoder queries the source.
package jsonl
