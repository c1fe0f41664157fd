//go:build tidemark_faults

package main

import (
	"fmt"
	"os"

	"github.com/tidemark/tidemark/merge"
)

// testingBreak breaks the engine on purpose when TIDEMARK_TESTING_BREAK names a break (no-guard,
// no-eviction, ack-ahead), for the chaos harness to prove that it notices. A test build only
// (-tags tidemark_faults); testing_off.go is the product's.
func testingBreak() (merge.Faults, error) {
	var f merge.Faults
	switch b := os.Getenv("TIDEMARK_TESTING_BREAK"); b {
	case "":
	case "no-guard":
		f.NoVisibilityGuard = true
	case "no-eviction":
		f.NoEviction = true
	case "ack-ahead":
		f.AckAhead = true
	default:
		return f, fmt.Errorf("TIDEMARK_TESTING_BREAK=%q: write no-guard, no-eviction or ack-ahead", b)
	}
	return f, nil
}
