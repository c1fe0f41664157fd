//go:build tidemark_faults

package faults

import "os"

// The sinks' breaks (faults.go); set once, before a sink is opened.
var CheckpointApart, NoTruncate, NoFence bool

// Unpinned leaves search_path out of the settings every connection pins (internal/pgconf), for
// the control run of the test that plants shadowing objects: set by TIDEMARK_TESTING_UNPINNED=1
// in a process's environment, or by a test in its own process before it connects.
var Unpinned = os.Getenv("TIDEMARK_TESTING_UNPINNED") == "1"
