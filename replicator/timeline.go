package replicator

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
)

// TimelineSwitch is one line of a timeline history file: timeline Timeline ended at LSN Switch,
// where its child began (a promotion or a point-in-time recovery).
type TimelineSwitch struct {
	Timeline int32
	Switch   pglogrepl.LSN
}

// ParseTimelineHistory parses a timeline history file ("parentTLI<TAB>switchpoint<TAB>reason"
// per line; blank and # lines are skipped), as TIMELINE_HISTORY returns it.
func ParseTimelineHistory(content []byte) ([]TimelineSwitch, error) {
	var out []TimelineSwitch
	sc := bufio.NewScanner(bytes.NewReader(content))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			return nil, fmt.Errorf("timeline history line %d %q: want parent timeline and switch point", n, line)
		}
		tli, err := strconv.ParseInt(f[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("timeline history line %d: timeline %q: %w", n, f[0], err)
		}
		lsn, err := pglogrepl.ParseLSN(f[1])
		if err != nil {
			return nil, fmt.Errorf("timeline history line %d: switch point %q: %w", n, f[1], err)
		}
		out = append(out, TimelineSwitch{Timeline: int32(tli), Switch: lsn})
	}
	return out, sc.Err()
}

// TimelineEnd reports where timeline tli ended in the history of the server's current timeline:
// its switch point, and whether tli is an ancestor at all. The current timeline has not ended
// (ok is false). Call it before Run.
func (s *Stream) TimelineEnd(ctx context.Context, tli int32) (end pglogrepl.LSN, ok bool, err error) {
	if tli >= s.sys.Timeline {
		return 0, false, nil
	}
	res, err := pglogrepl.TimelineHistory(ctx, s.conn, s.sys.Timeline)
	if err != nil {
		return 0, false, fmt.Errorf("read the history of timeline %d: %w", s.sys.Timeline, err)
	}
	hist, err := ParseTimelineHistory(res.Content)
	if err != nil {
		return 0, false, err
	}
	for _, h := range hist {
		if h.Timeline == tli {
			return h.Switch, true, nil
		}
	}
	return 0, false, nil
}
