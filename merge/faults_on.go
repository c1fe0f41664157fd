//go:build tidemark_faults

package merge

import "github.com/tidemark/tidemark/watermark"

// FaultsBuilt: this build has the fault switches (faults.go).
const FaultsBuilt = true

// Faults break the engine on purpose (faults.go). Never set them outside the chaos harness and
// the tests.
type Faults struct {
	AckAhead          bool // acknowledge what was received, ahead of the sink's checkpoint
	NoVisibilityGuard bool // emit chunks the visibility guard would reject
	NoEviction        bool // never drop chunk rows changed inside their window
	// FailMark, when set, makes the writing of each watermark it returns true for fail before
	// anything is written (the recovery tests' injected failures).
	FailMark func(watermark.Mark) bool
	// BetweenLooks, when set, runs in the watch after it looked at a table's shape and before it
	// reads the table's membership of the publication (the tests' way into that gap).
	BetweenLooks func(table string)
	// AfterDiscover, when set, runs at the start of a run after its tables were discovered and
	// before their membership of the publication is read (the tests' way into that gap).
	AfterDiscover func()
}

func (f Faults) ackAhead() bool   { return f.AckAhead }
func (f Faults) noGuard() bool    { return f.NoVisibilityGuard }
func (f Faults) noEviction() bool { return f.NoEviction }

func (f Faults) failMark(m watermark.Mark) bool { return f.FailMark != nil && f.FailMark(m) }

func (f Faults) afterDiscover() {
	if f.AfterDiscover != nil {
		f.AfterDiscover()
	}
}

func (f Faults) betweenLooks(table string) {
	if f.BetweenLooks != nil {
		f.BetweenLooks(table)
	}
}
