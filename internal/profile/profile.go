// Package profile tunes the garbage collector of both binaries (TuneGC) and writes a CPU profile
// of a command's run when TIDEMARK_CPUPROFILE names a file:
// both binaries (tidemark and source-postgres) take it, for the profiles of
// docs/benchmarks.md. A path that cannot be written is said on stderr and the run goes on.
package profile

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
)

// Env is the variable that names the profile's file.
const Env = "TIDEMARK_CPUPROFILE"

// Start starts the profile into path ("": none) and returns the function that ends it and
// closes the file; a failure is said on stderr.
func Start(path string, stderr io.Writer) func() {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		if err = pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", Env, err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}
