//go:build !tidemark_faults

package faults

// The sinks' breaks (faults.go): never in this build.
const CheckpointApart, NoTruncate, NoFence = false, false, false

// Unpinned leaves search_path out of the settings every connection pins (internal/pgconf): never
// in this build.
const Unpinned = false

// PlantSQL: never in this build (on.go has the test build's).
func PlantSQL() (string, error) { return "", nil }

// ServerLogs: never in this build (on.go has the test build's).
func ServerLogs() string { return "" }
