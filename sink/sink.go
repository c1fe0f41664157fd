package sink

import (
	"context"

	"github.com/tidemark/tidemark/merge"
)

// Sink receives the engine's output: events, and the checkpoints that cover them. It is the
// engine's merge.Sink, stated here so that every output (JSON lines, a PostgreSQL target, the
// Airbyte connector's records) names the same contract; a new output is a new package that
// implements it.
type Sink interface {
	// Emit hands over the next events, in output order. The sink must not keep the slice after
	// it returns; it may keep the events.
	Emit(ctx context.Context, events []merge.Event) error
	// Checkpoint marks a consistent point: every event emitted so far is covered by pos, none
	// after it will be. With merge.Config.AckCheckpoints the sink must have made those events
	// and pos durable, together, before it returns nil: the slot is confirmed up to pos.LSN
	// right after. (The one exception is asked for by its operator: the Airbyte connector's
	// "While reading Data" commit behaviour confirms positions as their states go out, before
	// the destination has committed them, as Airbyte's own connector does; see
	// cmd/source-postgres.)
	Checkpoint(ctx context.Context, pos *merge.Position) error
}

// Output is a Sink that owns its output for a run: it was opened (locked, cut back to its
// checkpoint) and returned the position to resume from. Close gives the output up: what no
// checkpoint covered is dropped (or left to be cut on the next open), and the lock released,
// or left to whoever owns the lock's holder (sink/postgres: the target connection's owner,
// whose closing ends the session and its advisory locks).
type Output interface {
	Sink
	Close(ctx context.Context) error
}

// A Sink is what the engine takes.
var _ merge.Sink = Sink(nil)
