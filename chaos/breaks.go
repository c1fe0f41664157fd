package chaos

import (
	"slices"
	"strings"
)

// A break breaks the capture on purpose (tidemark sync --testing-break; the connector's
// TIDEMARK_TESTING_BREAK), to show that the harness catches it: each is provoked by the faults
// it names, and must show as one of the violations it can cause. Which one a run finds depends on
// the schedule: a stale chunk row whose key was deleted in its window stays as a ghost (I1),
// one whose key changed again goes back in version (I2); a run that merely failed, which a crash
// would also do, is not enough.
type breakKind struct {
	name   string
	modes  []Mode
	faults []string // the faults that provoke it
	// causes are the classes of violation it can cause (how their reports start): any of them
	// shows the harness caught it.
	causes []string
}

// The classes of violation (how Report.Violations start).
var (
	// wrongRows: the output differs from the source (I1), a key's version went back (I2), a
	// deleted key came back (I3), and the same seen in the target's history of what each target
	// transaction left.
	wrongRows = []string{"I1:", "I2:", "I3:", "target history:"}
	// lostTransactions: wrong rows, or a source transaction the target's audit ledger lacks.
	lostTransactions = append(slices.Clip(wrongRows), "audit:")
)

var breakKinds = []breakKind{
	// Rows changed inside a chunk's window are emitted stale: a key's version goes back, or a
	// deleted key stays.
	{"no-eviction", []Mode{JSONL, Postgres, Airbyte}, []string{"stall"}, wrongRows},
	// The slot is confirmed past the durable checkpoint: a kill loses transactions.
	{"ack-ahead", []Mode{JSONL, Postgres, Airbyte}, []string{"kill"}, lostTransactions},
	// A chunk that missed a transaction streamed before its low watermark is kept.
	{"no-guard", []Mode{JSONL, Postgres, Airbyte}, []string{"commit-stall"}, wrongRows},
	// The PostgreSQL target's checkpoint is committed apart from the changes it covers, before
	// them: a crash between loses the changes.
	{"checkpoint-apart", []Mode{Postgres}, []string{"kill", "target-drop"}, lostTransactions},
	// A resumed JSON lines output keeps what followed its checkpoint: the replayed stretch is
	// there twice, its positions going back (I13), and its older versions after newer ones.
	{"no-truncate", []Mode{JSONL}, []string{"kill"}, append([]string{"I13:"}, wrongRows...)},
	// No lock of the output or the checkpoint: a second capture is not refused; two writers on
	// one output can also leave wrong rows.
	{"no-fence", []Mode{JSONL, Postgres}, []string{"second-capture"}, append([]string{"second capture:", "I13:"}, wrongRows...)},
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

// BreakCaught returns the violations of a run of a break that show the harness caught it: those
// of the classes the break can cause. None means it was not caught, even if the run failed.
func BreakCaught(name string, violations []string) []string {
	b, _ := breakOf(name)
	var out []string
	for _, v := range violations {
		if slices.ContainsFunc(b.causes, func(c string) bool { return strings.HasPrefix(v, c) }) {
			out = append(out, v)
		}
	}
	return out
}

// BreakCauses returns the classes of violation a break can cause (how their reports start).
func BreakCauses(name string) []string {
	b, _ := breakOf(name)
	return b.causes
}
