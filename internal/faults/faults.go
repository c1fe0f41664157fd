// Package faults holds the sinks' switches for breaking them on purpose, so that the chaos
// harness can prove it notices (docs/chaos.md, "Does it catch a broken engine?"); the engine's
// own are merge.Faults. They exist only in a build with the tidemark_faults tag (on.go: go build
// -tags tidemark_faults), where tidemark sync --testing-break sets them. In every other build,
// the product's, they are constants false (off.go) and the code they guard is compiled out: no
// flag, variable or setting of a shipped binary turns them on.
//
//   - CheckpointApart: the PostgreSQL target commits the checkpoint in a transaction of its own,
//     before the data it covers;
//   - NoTruncate: a JSON lines resume appends after what the output has, without cutting it back
//     to its checkpoint;
//   - NoFence: no lock of the output, its checkpoint or the target table; JSON lines is cut back
//     to its checkpoint before the slot is checked.
//
// And one switch that breaks no engine but the defence against other database roles:
//
//   - Unpinned: connections do not pin search_path (internal/pgconf), so that the test of planted
//     shadowing functions and operators can show them firing without the pin (docs/security.md);
//   - PlantSQL and ServerLogs: internal/pgserver plants them into the databases it creates and
//     keeps the logs of the servers it removes, for the same test to reach the demo's and the
//     bench's throwaway servers.
package faults
