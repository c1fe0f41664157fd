//go:build tidemark_faults

package faults

// Built: this build has the switches.
const Built = true

// The sinks' breaks (faults.go); set once, before a sink is opened.
var CheckpointApart, NoTruncate, NoFence bool
