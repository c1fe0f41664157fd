package profile

import (
	"runtime/debug"
)

// GCPercent and MemoryLimit are the garbage collector's settings in both binaries, unless GOGC
// or GOMEMLIMIT say otherwise. The engine's heap is small and short-lived (a chunk's rows, a
// batch of changes: 20-50 MB) and Go's default (GOGC=100) spends a fifth of a backfill's CPU
// collecting it; at 400 the heap may grow to five times what is live, and the soft limit keeps a
// large live heap (one very large row, a transaction applied in pieces) from growing five times:
// near it the collector runs more often instead (docs/benchmarks.md, "GC").
const (
	GCPercent   = 400
	MemoryLimit = 512 << 20
)

// TuneGC applies GCPercent and MemoryLimit where the environment (getenv) sets neither GOGC nor
// GOMEMLIMIT, which the runtime reads itself.
func TuneGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(MemoryLimit)
	}
}
