package profile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
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
