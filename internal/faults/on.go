//go:build tidemark_faults

package faults

import (
	"fmt"
	"os"
)

// The sinks' breaks (faults.go); set once, before a sink is opened.
var CheckpointApart, NoTruncate, NoFence bool

// Unpinned leaves search_path out of the settings every connection pins (internal/pgconf), for
// the control run of the test that plants shadowing objects: set by TIDEMARK_TESTING_UNPINNED=1
// in a process's environment, or by a test in its own process before it connects.
var Unpinned = os.Getenv("TIDEMARK_TESTING_UNPINNED") == "1"

// PlantSQL returns the SQL that internal/pgserver runs, as the server's superuser, in every
// database it creates: the content of the file TIDEMARK_TESTING_PLANT names ("" without). The
// planted-objects test plants a hostile role's functions and operators into the demo's and the
// bench's throwaway databases with it.
func PlantSQL() (string, error) {
	path := os.Getenv("TIDEMARK_TESTING_PLANT")
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("TIDEMARK_TESTING_PLANT: %w", err)
	}
	return string(b), nil
}

// ServerLogs returns the directory TIDEMARK_TESTING_SERVER_LOGS names ("" without), where
// internal/pgserver copies the log of a local server it started before it removes it: the
// planted-objects test reads there what ran in the demo's and the bench's throwaway servers.
func ServerLogs() string { return os.Getenv("TIDEMARK_TESTING_SERVER_LOGS") }
