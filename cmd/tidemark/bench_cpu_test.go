package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseStat: /proc/PID/stat's fields after a command name with a space and a parenthesis
// (proc(5): pid (comm) state ppid ... utime stime cutime cstime ...).
func TestParseStat(t *testing.T) {
	line := "4242 (postgres: x) ) S 4100 4100 4100 0 -1 4194560 1200 0 0 0 731 95 12 7 20 0 1 0 5000 230000000 3000 18446744073709551615\n"
	st, err := parseStat(line)
	require.NoError(t, err)
	require.Equal(t, stat{state: 'S', ppid: 4100, utime: 731, stime: 95, cutime: 12, cstime: 7}, st)
	_, err = parseStat("4242 (x) S 1")
	require.Error(t, err)
}
