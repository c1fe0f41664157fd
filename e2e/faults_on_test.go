//go:build tidemark_faults

package e2e_test

import (
	"testing"

	"github.com/tidemark/tidemark/merge"
)

// breakGuard turns the visibility guard off (a test build's fault switch, merge.Faults).
func breakGuard(_ *testing.T, cfg *merge.Config) {
	cfg.Faults.NoVisibilityGuard = true
}
