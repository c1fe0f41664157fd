package e2e

import (
	"errors"
	"fmt"
	"io"
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
// seconds per link. The binary is copied to out, so that out is the caller's to run, move, or
// hand to another user. When the cache gives no executable (an older go command, a cache turned
// off), it builds with go build -o.
//
// Executables from go run are linked without DWARF debugging information (-ldflags=-w by
// default); panics and stack traces are unchanged.
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

// copyExecutable copies the file from to a new file to, executable by everyone.
func copyExecutable(from, to string) (err error) {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	_ = os.Remove(to)
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dst.Close()) }()
	_, err = io.Copy(dst, src)
	return err
}
