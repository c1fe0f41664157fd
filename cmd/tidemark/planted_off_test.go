//go:build !tidemark_faults

package main

import (
	"testing"

	"github.com/tidemark/tidemark/e2e"
)

// TestPlantedObjects needs the control run's switch (faults.Unpinned), which only a test build
// has: the README's test command has the tag.
func TestPlantedObjects(t *testing.T) {
	msg := "the planted-objects test needs the fault switches: go test -tags tidemark_faults (the README's test command)"
	if e2e.InCI() {
		t.Fatal("CI runs every test: " + msg)
	}
	t.Skip("SKIPPED, " + msg)
}
