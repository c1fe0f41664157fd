//go:build tidemark_faults

package merge

// FaultsBuilt: this build has the fault switches (faults.go).
const FaultsBuilt = true

// Faults break the engine on purpose (faults.go). Never set them outside the chaos harness and
// the tests.
type Faults struct {
	AckAhead          bool // acknowledge what was received, ahead of the sink's checkpoint
	NoVisibilityGuard bool // emit chunks the visibility guard would reject
	NoEviction        bool // never drop chunk rows changed inside their window
}

func (f Faults) ackAhead() bool   { return f.AckAhead }
func (f Faults) noGuard() bool    { return f.NoVisibilityGuard }
func (f Faults) noEviction() bool { return f.NoEviction }
