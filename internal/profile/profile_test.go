package profile

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStart: the file is a profile once the run ends (gzip-compressed protocol buffers); an
// unwritable path is said, not fatal; no path, no profile.
func TestStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	var stderr bytes.Buffer
	stop := Start(path, &stderr)
	for i := 0; i < 1e6; i++ {
		_ = fmt.Sprint(i)
	}
	stop()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b, "a gzip stream")
	require.Empty(t, stderr.String())
	Start(filepath.Join(t.TempDir(), "missing", "cpu.prof"), &stderr)()
	require.Contains(t, stderr.String(), Env+": ")
	Start("", &stderr)()
}

// TestTuneGC: the settings apply unless the environment sets its own.
func TestTuneGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	TuneGC(func(string) string { return "" })
	require.Equal(t, GCPercent, debug.SetGCPercent(100))
	require.Equal(t, int64(MemoryLimit), debug.SetMemoryLimit(math.MaxInt64))
	TuneGC(func(k string) string { return map[string]string{"GOGC": "50", "GOMEMLIMIT": "1GiB"}[k] })
	require.Equal(t, 100, debug.SetGCPercent(100), "GOGC set: left to the runtime")
	require.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "GOMEMLIMIT set: left to the runtime")
}
