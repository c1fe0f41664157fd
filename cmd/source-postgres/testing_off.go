//go:build !tidemark_faults

package main

import (
	"errors"
	"os"

	"github.com/tidemark/tidemark/merge"
)

// testingBreak: the product build cannot break the engine on purpose (testing_on.go is the test
// build's). A TIDEMARK_TESTING_BREAK left in the environment fails the read rather than being
// ignored: a harness that meant to break the engine would otherwise prove nothing.
func testingBreak() (merge.Faults, error) {
	if os.Getenv("TIDEMARK_TESTING_BREAK") != "" {
		return merge.Faults{}, errors.New("TIDEMARK_TESTING_BREAK is set, but this build of the connector has no testing switches: they are in test builds only (go build -tags tidemark_faults); unset it")
	}
	return merge.Faults{}, nil
}
