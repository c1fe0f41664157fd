package chaos

import "slices"

// A break breaks the capture on purpose (tidemark sync --testing-break; the connector's
// TIDEMARK_TESTING_BREAK), to show that the harness catches it: each is caught by the faults it
// names, and must show as the violation it names.
type breakKind struct {
	name   string
	modes  []Mode
	faults []string // the faults that provoke it
	// expect is how the violation it causes starts, by mode.
	expect map[Mode]string
}

var breakKinds = []breakKind{
	// Rows changed inside a chunk's window are emitted stale: a key's version goes back.
	{"no-eviction", []Mode{JSONL, Postgres, Airbyte}, []string{"stall"},
		map[Mode]string{JSONL: "I2:", Postgres: "target history: I2:", Airbyte: "I2:"}},
	// The slot is confirmed past the durable checkpoint: a kill loses transactions.
	{"ack-ahead", []Mode{JSONL, Postgres, Airbyte}, []string{"kill"},
		map[Mode]string{JSONL: "I1:", Postgres: "audit:", Airbyte: "I1:"}},
	// A chunk that missed a transaction streamed before its low watermark is kept.
	{"no-guard", []Mode{JSONL, Postgres, Airbyte}, []string{"commit-stall"},
		map[Mode]string{JSONL: "I2:", Postgres: "target history: I2:", Airbyte: "I2:"}},
	// The PostgreSQL target's checkpoint is committed apart from the changes it covers, before
	// them: a crash between loses the changes.
	{"checkpoint-apart", []Mode{Postgres}, []string{"kill", "target-drop"}, map[Mode]string{Postgres: "audit:"}},
	// A resumed JSON lines output keeps what followed its checkpoint: the replayed stretch is
	// there twice, its positions going back.
	{"no-truncate", []Mode{JSONL}, []string{"kill"}, map[Mode]string{JSONL: "I13:"}},
	// No lock of the output or the checkpoint: a second capture is not refused.
	{"no-fence", []Mode{JSONL, Postgres}, []string{"second-capture"},
		map[Mode]string{JSONL: "second capture:", Postgres: "second capture:"}},
}

// Breaks are the names of the breaks.
func Breaks() []string {
	var out []string
	for _, b := range breakKinds {
		out = append(out, b.name)
	}
	return out
}

func breakOf(name string) (breakKind, bool) {
	i := slices.IndexFunc(breakKinds, func(b breakKind) bool { return b.name == name })
	if i < 0 {
		return breakKind{}, false
	}
	return breakKinds[i], true
}

// BreakModes returns the modes a break applies to.
func BreakModes(name string) []Mode {
	b, _ := breakOf(name)
	return b.modes
}

// BreakFaults returns the faults that provoke a break.
func BreakFaults(name string) []string {
	b, _ := breakOf(name)
	return b.faults
}

// BreakViolation returns how the violation a break must cause in mode starts.
func BreakViolation(name string, mode Mode) string {
	b, _ := breakOf(name)
	return b.expect[mode]
}
