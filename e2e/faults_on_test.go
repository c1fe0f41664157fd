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
