//go:build !tidemark_faults

package faults

// Built: this build has no switches.
const Built = false

// The sinks' breaks (faults.go): never in this build.
const CheckpointApart, NoTruncate, NoFence = false, false, false
