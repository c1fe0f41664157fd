//go:build tidemark_faults

package e2e_test

import (
	"testing"

	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/watermark"
)

// breakGuard turns the visibility guard off (a test build's fault switch, merge.Faults).
func breakGuard(_ *testing.T, cfg *merge.Config) {
	cfg.Faults.NoVisibilityGuard = true
}

// failMarks makes the engine fail the writing of the watermarks fail chooses (a test build's
// fault switch, merge.Faults.FailMark): nothing is written for them.
func failMarks(_ *testing.T, cfg *merge.Config, fail func(watermark.Mark) bool) {
	cfg.Faults.FailMark = fail
}

// betweenLooks runs fn in the engine's watch between its look at a table's shape and its read
// of the table's membership (a test build's hook, merge.Faults.BetweenLooks).
func betweenLooks(_ *testing.T, cfg *merge.Config, fn func(table string)) {
	cfg.Faults.BetweenLooks = fn
}

// afterDiscover runs fn at a run's start between the discovery of its tables and the read of
// their membership of the publication (a test build's hook, merge.Faults.AfterDiscover).
func afterDiscover(_ *testing.T, cfg *merge.Config, fn func()) {
	cfg.Faults.AfterDiscover = fn
}
