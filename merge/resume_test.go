package merge

import (
	"errors"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/replicator"
)

// TestPositionIdentity: a position is resumed only on the cluster, database, slot and history
// it was read from; anything else stops with the reason, before anything is acknowledged.
func TestPositionIdentity(t *testing.T) {
	sys := replicator.SystemInfo{SystemID: "7001", Timeline: 3, XLogPos: 0x9000, Database: "app"}
	slot := replicator.SlotInfo{Name: "tm", ConfirmedFlush: 0x1000}
	// Timeline 2 ended at 0x5000 (a promotion), timeline 1 at 0x3000.
	history := func(tli int32) (pglogrepl.LSN, bool, error) {
		switch tli {
		case 1:
			return 0x3000, true, nil
		case 2:
			return 0x5000, true, nil
		}
		return 0, false, nil
	}
	good := Position{SystemID: "7001", Timeline: 3, Database: "app", Slot: "tm", LSN: 0x2000}
	for _, tc := range []struct {
		name string
		edit func(*Position, *replicator.SlotInfo)
		want error
	}{
		{"the same", func(*Position, *replicator.SlotInfo) {}, nil},
		{"an older state without identity", func(p *Position, _ *replicator.SlotInfo) { *p = Position{LSN: 0x2000} }, nil},
		{"another cluster", func(p *Position, _ *replicator.SlotInfo) { p.SystemID = "7002" }, ErrSystemChanged},
		{"another database", func(p *Position, _ *replicator.SlotInfo) { p.Database = "other" }, ErrForeignPosition},
		{"another slot", func(p *Position, _ *replicator.SlotInfo) { p.Slot = "old" }, ErrForeignPosition},
		{"a slot created after the position", func(_ *Position, s *replicator.SlotInfo) { s.Created = true }, ErrForeignPosition},
		{"an earlier timeline, before its end", func(p *Position, _ *replicator.SlotInfo) { p.Timeline, p.LSN = 2, 0x4000 }, nil},
		{"an earlier timeline, past its end (failover lost it)", func(p *Position, _ *replicator.SlotInfo) { p.Timeline, p.LSN = 2, 0x6000 }, ErrTimelineForked},
		{"a later timeline (restored from before it)", func(p *Position, _ *replicator.SlotInfo) { p.Timeline = 4 }, ErrTimelineForked},

		{"ahead of the server", func(p *Position, _ *replicator.SlotInfo) { p.LSN = 0xA000 }, ErrPositionAhead},
		{"behind the slot", func(p *Position, _ *replicator.SlotInfo) { p.LSN = 0x800 }, ErrPositionBehindSlot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, s := good, slot
			tc.edit(&p, &s)
			err := identityProblem(&p, sys, s, false, history)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.True(t, errors.Is(err, tc.want), "%v is not %v", err, tc.want)
		})
	}
}
