//go:build !tidemark_faults

package e2e_test

import (
	"testing"

	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/watermark"
)

// breakGuard: a build without the tidemark_faults tag cannot turn the visibility guard off; the
// README's test command has the tag, so that CI runs the broken-engine cases.
func breakGuard(t *testing.T, _ *merge.Config) {
	t.Skip("the broken-engine case needs the fault switches: go test -tags tidemark_faults (the README's test command)")
}

// failMarks: a build without the tidemark_faults tag cannot fail watermarks on purpose.
func failMarks(t *testing.T, _ *merge.Config, _ func(watermark.Mark) bool) {
	t.Skip("the injected watermark failures need the fault switches: go test -tags tidemark_faults (the README's test command)")
}

// betweenLooks: a build without the tidemark_faults tag has no way into the watch.
func betweenLooks(t *testing.T, _ *merge.Config, _ func(string)) {
	t.Skip("the hook into the watch needs the fault switches: go test -tags tidemark_faults (the README's test command)")
}

// afterDiscover: a build without the tidemark_faults tag has no way into a run's start.
func afterDiscover(t *testing.T, _ *merge.Config, _ func()) {
	t.Skip("the hook into a run's start needs the fault switches: go test -tags tidemark_faults (the README's test command)")
}
