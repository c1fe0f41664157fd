//go:build tidemark_faults

package faults

// The sinks' breaks (faults.go); set once, before a sink is opened.
var CheckpointApart, NoTruncate, NoFence bool
