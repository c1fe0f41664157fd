package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
)

// TestFailureTypeClassification: every kind of failure maps to the failure type the platform acts
// on (config_error is never retried, transient_error is).
func TestFailureTypeClassification(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("read: %w", err) }
	cases := []struct {
		err  error
		want string
	}{
		{configErrorf("bad catalog"), configFailure},
		{wrap(replicator.ErrSlotMissing), configFailure},
		{wrap(replicator.ErrSlotLost), configFailure},
		{wrap(replicator.ErrPublicationMissing), configFailure},
		{wrap(replicator.ErrWalLevel), configFailure},
		{wrap(&merge.PositionBehindSlotError{Slot: "s", Position: "0/1", ConfirmedFlush: "0/2"}), configFailure},
		{wrap(merge.ErrSystemChanged), configFailure},
		{wrap(chunker.ErrNoKey), configFailure},
		{wrap(chunker.ErrNotPublished), configFailure},
		{wrap(chunker.ErrGone), configFailure}, // dropped while captured, or as a read started
		{wrap(chunker.ErrRowFilter), configFailure},
		{wrap(&merge.UnplaceableError{Table: "public.t", Reason: "its key column arrived NULL"}), configFailure},
		{wrap(merge.ErrKeyChanged), configFailure},
		{wrap(merge.ErrTableReplaced), configFailure},
		{wrap(merge.ErrPublicationChanged), configFailure},
		{wrap(merge.ErrPartitionsChanged), configFailure},
		{wrap(&pgconn.PgError{Code: "28P01"}), configFailure},
		{wrap(&pgconn.PgError{Code: "42501"}), configFailure},
		{wrap(&net.DNSError{Err: "no such host", Name: "db.invalid", IsNotFound: true}), configFailure},
		{wrap(replicator.ErrSlotInUse), transientFailure},
		{wrap(replicator.ErrTimeout), transientFailure},
		{wrap(&pgconn.PgError{Code: "57P01"}), transientFailure},
		{wrap(&pgconn.PgError{Code: "08006"}), transientFailure},
		{wrap(&pgconn.PgError{Code: "53300"}), transientFailure},
		{wrap(&pgconn.PgError{Code: "40001"}), transientFailure},
		{wrap(&net.OpError{Op: "dial", Err: errors.New("connection refused")}), transientFailure},
		{wrap(io.ErrUnexpectedEOF), transientFailure},
		{wrap(context.DeadlineExceeded), transientFailure},
		// A query on a connection a cancelled one closed (one CI run: the one-second budget of
		// TestBackfillAcrossSyncs ran out while the read started).
		{fmt.Errorf("read server version: %w", pgconn.ErrConnClosed), transientFailure},
		{wrap(&tunnelError{errors.New("ssh down")}), transientFailure},
		{errInterrupted, transientFailure},
		{wrap(&pgconn.PgError{Code: "XX000"}), systemFailure},
		{wrap(replicator.ErrProtocol), systemFailure},
		{errors.New("something unexpected"), systemFailure},
	}
	for _, c := range cases {
		require.Equal(t, c.want, classify(c.err), "%v", c.err)
		require.NotEmpty(t, userMessage(c.err))
	}
	// A stop whose way on is a new backfill says how to get one in Airbyte.
	require.Contains(t, userMessage(wrap(merge.ErrKeyChanged)), "Refresh the stream")
	require.NotContains(t, userMessage(wrap(chunker.ErrNoKey)), "Refresh the stream")
}
