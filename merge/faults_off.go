//go:build !tidemark_faults

package merge

import "github.com/tidemark/tidemark/watermark"

// FaultsBuilt: this build has no fault switches (faults.go).
const FaultsBuilt = false

// Faults is empty in this build: the engine cannot be broken on purpose (faults.go).
type Faults struct{}

func (Faults) ackAhead() bool   { return false }
func (Faults) noGuard() bool    { return false }
func (Faults) noEviction() bool { return false }

func (Faults) failMark(watermark.Mark) bool { return false }

func (Faults) betweenLooks(string) {}

func (Faults) afterDiscover() {}
