package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/e2e"
)

// testCode matches the packages of test code and test-only libraries: none may be linked into a
// binary (the test harness, e2e, imports them; the binaries use internal/pgserver and chaos/oracle).
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

// TestProductBuildHasNoFaultSwitches builds both binaries as the product is built (no
// tidemark_faults tag, whatever this test's own build has) and checks that nothing in them can
// break the engine on purpose: sync has no --testing-break or --crash-at, chaos --break asks for
// a test build, and the connector carries the refusal of TIDEMARK_TESTING_BREAK, not its switch.
func TestProductBuildHasNoFaultSwitches(t *testing.T) {
	dir := t.TempDir()
	tm, conn := filepath.Join(dir, "tidemark"), filepath.Join(dir, "source-postgres")
	for bin, pkg := range map[string]string{tm: ".", conn: "../source-postgres"} {
		if err := e2e.GoBuild(bin, pkg, ""); err != nil {
			t.Fatalf("go build %s: %v", pkg, err)
		}
	}
	for _, args := range [][]string{
		{"sync", "--testing-break", "no-guard", "--source", "postgres://x/y", "--tables", "public.t", "--to", "-"},
		{"sync", "--crash-at", "after-high:1", "--source", "postgres://x/y", "--tables", "public.t", "--to", "-"},
	} {
		out, err := exec.Command(tm, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "unknown flag "+args[1]) {
			t.Errorf("tidemark %s: want the flag undefined, got %v:\n%s", strings.Join(args, " "), err, out)
		}
	}
	out, err := exec.Command(tm, "chaos", "--break", "no-guard").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "-tags tidemark_faults") {
		t.Errorf("tidemark chaos --break: want a test build asked for, got %v:\n%s", err, out)
	}
	b, err := os.ReadFile(conn)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte("this build of the connector has no testing switches")) || bytes.Contains(b, []byte("write no-guard, no-eviction or ack-ahead")) {
		t.Error("the connector's product build has the testing switch of TIDEMARK_TESTING_BREAK")
	}
}

// TestArchitectureTable: docs/architecture.md lists every package of the module, each with
// exactly the packages of the module it imports (go list's, tests left out), so that the table
// a newcomer reads is the graph the code has.
func TestArchitectureTable(t *testing.T) {
	const module = "github.com/tidemark/tidemark/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{join .Imports ","}}`, "../../...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	want := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(l, "|")
		var own []string
		for _, i := range strings.Split(imports, ",") {
			if strings.HasPrefix(i, module) {
				own = append(own, strings.TrimPrefix(i, module))
			}
		}
		slices.Sort(own)
		want[strings.TrimPrefix(pkg, module)] = strings.Join(own, " ")
	}
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, l := range strings.Split(string(doc), "\n") {
		cells := strings.Split(l, " | ")
		if !strings.HasPrefix(l, "| `") || len(cells) != 4 {
			continue
		}
		pkg := strings.Trim(strings.TrimPrefix(cells[0], "| "), "`")
		var own []string
		if cells[2] != "none" {
			for _, i := range strings.Split(cells[2], ", ") {
				own = append(own, strings.Trim(i, "`"))
			}
		}
		slices.Sort(own)
		got[pkg] = strings.Join(own, " ")
	}
	for pkg, imports := range want {
		doc, ok := got[pkg]
		switch {
		case !ok:
			t.Errorf("docs/architecture.md has no row for %s (imports: %s)", pkg, imports)
		case doc != imports:
			t.Errorf("docs/architecture.md: %s imports %q, the table says %q", pkg, imports, doc)
		}
	}
	for pkg := range got {
		if _, ok := want[pkg]; !ok {
			t.Errorf("docs/architecture.md has a row for %s, which is not a package of the module", pkg)
		}
	}
}

// TestConnectionsGoThroughPgconf: every connection the binaries open pins the session settings
// (search_path among them: docs/security.md), because internal/pgconf opens it. This checks, in
// the source of every package either binary links (go list -deps), that no call opens one
// another way: pgx.Connect or ConnectConfig, pgconn.Connect, ConnectConfig or
// ConnectWithOptions, or a pgxpool. pgconf.Dial and DialReplication refuse a configuration that
// did not go through pgconf.Pin.
func TestConnectionsGoThroughPgconf(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}} {{.Dir}}{{end}}", ".", "../source-postgres").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	banned := map[string][]string{"pgx": {"Connect", "ConnectConfig"}, "pgconn": {"Connect", "ConnectConfig", "ConnectWithOptions"}}
	var bad []string
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, dir, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(path, "github.com/tidemark/tidemark/") || path == "github.com/tidemark/tidemark/internal/pgconf" {
			continue
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			for _, l := range strings.Split(string(src), "\n") {
				if strings.Contains(l, "pgxpool") {
					bad = append(bad, f+": "+strings.TrimSpace(l))
				}
				for pkg, fns := range banned {
					for _, fn := range fns {
						if strings.Contains(l, pkg+"."+fn+"(") {
							bad = append(bad, f+": "+strings.TrimSpace(l))
						}
					}
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d files checked: the package list is wrong", checked)
	}
	if len(bad) > 0 {
		t.Errorf("connections opened without internal/pgconf (use pgconf.Open, Connect, Dial or DialReplication):\n%s", strings.Join(bad, "\n"))
	}
}

// TestLiteralsGoThroughSqlfix: a string put into SQL by hand ('%s') is how the printed fixes
// carried an injection (a slot name with a quote in it, pasted by a DBA under
// standard_conforming_strings off). Every literal the binaries build goes through
// sqlfix.Literal; this checks the source of every package they link for the pattern. The
// exception is not SQL: postgresql.conf lines.
func TestLiteralsGoThroughSqlfix(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}} {{.Dir}}{{end}}", ".", "../source-postgres").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	handBuilt := regexp.MustCompile(`'%[sv]'|\('"\s*\+|\+\s*"'\)`)
	allowed := map[string]bool{"internal/pgserver/local.go": true}
	var bad []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, dir, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(path, "github.com/tidemark/tidemark/") || path == "github.com/tidemark/tidemark/internal/sqlfix" {
			continue
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			rel := strings.TrimPrefix(path, "github.com/tidemark/tidemark/") + "/" + filepath.Base(f)
			if strings.HasSuffix(f, "_test.go") || allowed[rel] {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for i, l := range strings.Split(string(src), "\n") {
				if handBuilt.MatchString(l) {
					bad = append(bad, fmt.Sprintf("%s:%d: %s", rel, i+1, strings.TrimSpace(l)))
				}
			}
		}
	}
	if len(bad) > 0 {
		t.Errorf("string literals built by hand (use sqlfix.Literal):\n%s", strings.Join(bad, "\n"))
	}
}
