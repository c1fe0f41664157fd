package main

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// testCode matches the packages of test code and test-only libraries: none may be linked into a
// binary (the test harness, e2e, imports them; the binaries use internal/pgserver and e2e/oracle).
var testCode = regexp.MustCompile(`^testing(/|$)|^github\.com/stretchr/testify/|^github\.com/santhosh-tekuri/jsonschema/|^github\.com/testcontainers/|docker|^github\.com/moby/|^github\.com/tidemark/tidemark/e2e$`)

// TestBinariesLinkNoTestCode checks, with `go list -deps`, that neither binary links `testing`,
// testify, jsonschema, testcontainers-go, a Docker client or the e2e test harness.
func TestBinariesLinkNoTestCode(t *testing.T) {
	for _, pkg := range []string{".", "../source-postgres"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		var bad []string
		for _, p := range strings.Fields(string(out)) {
			if testCode.MatchString(p) {
				bad = append(bad, p)
			}
		}
		if len(bad) > 0 {
			t.Errorf("%s links test code: %s", pkg, strings.Join(bad, " "))
		}
	}
}
