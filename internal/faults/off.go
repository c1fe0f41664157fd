//go:build !tidemark_faults

package faults

// The sinks' breaks (faults.go): never in this build.
const CheckpointApart, NoTruncate, NoFence = false, false, false
