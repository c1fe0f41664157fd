package main

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFlagRanges: every numeric flag is range-checked before anything runs, so that a huge value
// (a duration that overflows, a count that would take forever) or a zero or negative one is a
// usage error that names the flag and its range, never a panic, a hang or a run. The runs get a
// cancelled context, so that a value that wrongly passed the check ends at once.
func TestFlagRanges(t *testing.T) {
	source := "host=127.0.0.1 port=1 user=u dbname=d sslmode=disable"
	base := map[string][]string{
		"sync":    {"--source", source, "--tables", "public.t", "--to", t.TempDir() + "/out.jsonl"},
		"demo":    nil,
		"bench":   nil,
		"chaos":   {"--mode", "jsonl"},
		"consume": {"--from", "kafka://127.0.0.1:1/p", "--to", source, "--group", "g"},
	}
	type limit struct {
		cmd, flag string
		lo, hi    int64 // inclusive; durations in nanoseconds
		duration  bool
		extra     []string // more arguments (a Kafka --to for the Kafka flags)
	}
	kafkaTo := []string{"--to", "kafka://127.0.0.1:1/p"}
	natsTo := []string{"--to", "nats://127.0.0.1:1/p"}
	limits := []limit{
		{"sync", "chunk-size", 1, 1_000_000, false, nil},
		{"sync", "readers", 1, 64, false, nil},
		{"sync", "encoders", 0, 64, false, nil},
		{"sync", "checkpoint-interval", int64(10 * time.Millisecond), int64(time.Hour), true, nil},
		{"sync", "watermark-timeout", int64(100 * time.Millisecond), int64(time.Hour), true, nil},
		{"demo", "rows", 1, 100_000_000, false, nil},
		{"demo", "live", 0, int64(24 * time.Hour), true, nil},
		{"demo", "rate", 1, 100_000, false, nil},
		{"bench", "rows", 1, 1_000_000_000, false, nil},
		{"bench", "reps", 1, 100, false, nil},
		{"bench", "chunk-size", 1, 1_000_000, false, nil},
		{"bench", "encoders", 0, 64, false, nil},
		{"bench", "changes", 1, 1_000_000_000, false, nil},
		{"chaos", "duration", int64(time.Second), int64(30 * 24 * time.Hour), true, nil},
		{"chaos", "fault-every", int64(10 * time.Millisecond), int64(time.Hour), true, nil},
		{"chaos", "rows", 1, 100_000_000, false, nil},
		{"chaos", "chunk-size", 1, 1_000_000, false, nil},
		{"chaos", "readers", 0, 64, false, nil},
		{"sync", "kafka-partitions", 1, 10000, false, kafkaTo},
		{"sync", "kafka-replication", -1, 100, false, kafkaTo},
		{"sync", "kafka-transaction-timeout", int64(2 * time.Second), int64(time.Hour), true, kafkaTo},
		{"sync", "kafka-max-record-bytes", 1 << 10, 1 << 30, false, kafkaTo},
		{"sync", "nats-partitions", 1, 1024, false, natsTo},
		{"sync", "nats-replicas", 1, 5, false, natsTo},
		{"sync", "nats-duplicate-window", int64(time.Second), int64(7 * 24 * time.Hour), true, natsTo},
		{"chaos", "nats-replicas", 1, 5, false, nil},
		{"consume", "session-timeout", int64(time.Second), int64(time.Hour), true, nil},
		{"consume", "rebalance-timeout", int64(3 * time.Second), int64(time.Hour), true, nil},
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	show := func(l limit, v int64) string {
		if l.duration {
			return time.Duration(v).String()
		}
		return strconv.FormatInt(v, 10)
	}
	for _, l := range limits {
		bad := []string{show(l, math.MinInt64), show(l, math.MaxInt64), show(l, l.hi+1)}
		if l.lo > math.MinInt64 {
			bad = append(bad, show(l, l.lo-1))
		}
		if l.duration {
			bad = append(bad, "99999999999h") // beyond a time.Duration: the flag package refuses it
		} else {
			bad = append(bad, "99999999999999999999")
		}
		for _, v := range bad {
			t.Run(l.cmd+"/"+l.flag+"="+v, func(t *testing.T) {
				e, _, errOut := testEnv(t)
				code := run(ctx, append(append(append([]string{l.cmd}, base[l.cmd]...), l.extra...), "--"+l.flag, v), e)
				require.Equal(t, 2, code, "a usage error:\n%s", errOut.String())
				require.Contains(t, errOut.String(), "-"+l.flag)
			})
		}
		for _, v := range []int64{l.lo, l.hi} {
			t.Run(l.cmd+"/"+l.flag+"="+show(l, v)+" accepted", func(t *testing.T) {
				e, _, errOut := testEnv(t)
				code := run(ctx, append(append(append([]string{l.cmd}, base[l.cmd]...), l.extra...), "--"+l.flag, show(l, v)), e)
				require.NotEqual(t, 2, code, "within the range:\n%s", errOut.String())
			})
		}
	}
}
