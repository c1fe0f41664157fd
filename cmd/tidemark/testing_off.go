//go:build !tidemark_faults

package main

import (
	"flag"

	"github.com/tidemark/tidemark/merge"
)

// testingFlags: the product build has no testing switches (testing_on.go has the test build's).
type testingFlags struct{}

func newTestingFlags(*flag.FlagSet) testingFlags { return testingFlags{} }

func (testingFlags) apply(*merge.Faults, *merge.Hooks) []string { return nil }
