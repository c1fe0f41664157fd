package replicator

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseTimelineHistory: the history of timeline 3 after two promotions, as TIMELINE_HISTORY
// returns it.
func TestParseTimelineHistory(t *testing.T) {
	h, err := ParseTimelineHistory([]byte("1\t0/3000000\tno recovery target specified\n\n2\t0/5A00028\tbefore 2026-11-30 12:00:00+00\n"))
	require.NoError(t, err)
	require.Equal(t, []TimelineSwitch{{1, 0x3000000}, {2, 0x5A00028}}, h)
	_, err = ParseTimelineHistory([]byte("1 nonsense\n"))
	require.Error(t, err)
}
