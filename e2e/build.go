package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// GoBuild builds the main package in directory pkg (relative to the working directory, as for
// go build) with the build tags given (comma-separated; "" for none) into the file out, as
// go build -o out would, but through the go command's cache of executables (go run keeps
// what it links in the build cache, keyed by every input): the test packages that need the same
// binary (the tidemark of a test build: the chaos, cmd/tidemark and e2e packages) link it once
// per change of its sources instead of once each, which on a 2-core machine cost a few CPU
// seconds per link. The binary is linked or copied to out (copyExecutable), so that out stays
// the caller's whatever the cache does later. When the cache gives no executable (an older go
// command, a cache turned off), it builds with go build -o.
//
// Executables from go run are linked stripped (-s -w: no symbol table, no DWARF); panics and
// stack traces are unchanged, and no test reads a binary's symbols.
func GoBuild(out, pkg, tags string) error {
	args := []string{"run", "-exec", "echo"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, pkg)
	cache, err := exec.Command("go", "env", "GOCACHE").Output()
	if err == nil && strings.TrimSpace(string(cache)) != "" && strings.TrimSpace(string(cache)) != "off" {
		root := filepath.Clean(strings.TrimSpace(string(cache))) + string(filepath.Separator)
		// The first run after a change links into a temporary directory, removed when go run
		// ends, and leaves the executable in the cache; the second finds it there.
		for range 2 {
			var stderr strings.Builder
			cmd := exec.Command("go", args...)
			cmd.Stderr = &stderr
			b, err := cmd.Output()
			if err != nil {
				return fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
			}
			if path := strings.TrimSpace(string(b)); strings.HasPrefix(path, root) {
				return copyExecutable(path, out)
			}
		}
	}
	build := []string{"build", "-o", out}
	if tags != "" {
		build = append(build, "-tags", tags)
	}
	if b, err := exec.Command("go", append(build, pkg)...).CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w: %s", strings.Join(append(build, pkg), " "), err, strings.TrimSpace(string(b)))
	}
	return nil
}

// copyExecutable makes to a copy of the executable from: a hard link when both are on one file
// system (the cache never changes a file in place), else a copy by cp. Neither writes the file
// from this process: a file this process holds open for writing while the test starts children
// (the parallel tests do) would be inherited by them for a moment, and running it then fails
// with "text file busy".
func copyExecutable(from, to string) error {
	_ = os.Remove(to)
	if err := os.Link(from, to); err == nil {
		return nil
	}
	if b, err := exec.Command("cp", from, to).CombinedOutput(); err != nil {
		return fmt.Errorf("cp %s %s: %w: %s", from, to, err, strings.TrimSpace(string(b)))
	}
	return os.Chmod(to, 0o755)
}
