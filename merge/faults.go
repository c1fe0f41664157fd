package merge

// Faults break the engine on purpose, for the chaos harness to prove that it notices (see
// docs/chaos.md, "Does it catch a broken engine?"). They exist only in a build with the
// tidemark_faults tag (faults_on.go: go build -tags tidemark_faults); in every other build,
// the product's, Faults is an empty struct (faults_off.go), its switches are constants false and
// the code they guard is compiled out: no flag, variable or setting of a shipped binary can turn
// them on.
//
// The switches:
//   - AckAhead acknowledges every emitted event's LSN to the slot at once, ahead of the sink's
//     durable checkpoint, with frequent status updates, and resumes from a position the slot
//     has passed without complaint: the classic bug of confirming what was received;
//   - NoVisibilityGuard emits chunks the visibility guard would reject;
//   - NoEviction never drops chunk rows changed inside their window.
//
// And three hooks for the tests, which break nothing by themselves: FailMark fails the writing
// of the watermarks it picks, BetweenLooks runs between the watch's look at a table's shape and
// its read of the table's membership (a DDL committed in that gap), and AfterDiscover runs at a
// run's start between the discovery of its tables and the read of their membership (the same).
//
// FaultsBuilt reports whether this build has them.
