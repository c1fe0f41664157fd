// Package oracle checks a capture's output against its source, for the end-to-end tests and the
// chaos harness (which the `tidemark` binary links, so this package imports no test code).
//
// An Oracle replays Records, whichever product wrote them (tidemark sync's JSON lines, read by
// ParseJSONL; the PostgreSQL target; the Airbyte connector's RECORDs), onto one map of rows per
// table and checks, as they come, that per key the versions in a version column never go back and
// that a deleted key never comes back with an older version (docs/invariants.md, I2 and I3).
// SourceRows and SourceRowsJSON read a source table in the same form (text values, or the JSON
// that pgjson writes for them, in a profile), and Diff says how a replay differs from them (I1).
package oracle
