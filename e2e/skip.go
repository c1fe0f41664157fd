package e2e

import (
	"fmt"
	"testing"
)

// A test that needs more of its server than a connection (to restart it, change its settings,
// start a second one beside it, reset its transaction ids) cannot run on a server the tests were
// given. NeedsLocal and NeedsOwned skip it there with a message that says so, naming the server
// and how to run the test; under CI (CI=true) they fail it instead, as every other test that
// cannot run there does: CI runs every test, and a skip would pass unseen (go test prints a
// passing package's skips only with -v).

// NeedsLocal: the test needs a local cluster the tests started (its data directory, its binaries).
func NeedsLocal(t testing.TB, s *Server, why string) {
	t.Helper()
	if s != nil && s.Kind() == Local {
		return
	}
	notHere(t, s, why, "a local cluster the tests start")
}

// NeedsOwned: the test needs a server the tests started, local or in a container (it changes its
// settings or restarts it), not one given by TIDEMARK_TEST_DSN.
func NeedsOwned(t testing.TB, s *Server, why string) {
	t.Helper()
	if s != nil && s.Kind() != External {
		return
	}
	notHere(t, s, why, "a server the tests start")
}

func notHere(t testing.TB, s *Server, why, needs string) {
	t.Helper()
	on := "without a server"
	if s != nil {
		on = "on the " + string(s.Kind()) + " server"
	}
	msg := fmt.Sprintf("not run %s: %s; it needs %s (unset %s, and %s or set it to local)", on, why, needs, EnvDSN, EnvServer)
	if InCI() {
		t.Fatal("CI runs every test: " + msg)
	}
	t.Skip("SKIPPED, " + msg)
}
