package merge

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/watermark"
)

// The Refresh of a watch-driven re-backfill must come at a low watermark written after the
// look that asked for it: writes before that look may be in no WAL record (UNLOGGED), and
// the backfill never deletes a key it does not read.
func TestRefreshNotAtWindowRegisteredBeforeAsk(t *testing.T) {
	r := newCoreRun(t, nil, toastTable)
	r.must(toastRel)
	r.must(register{id: 7, table: "public.t"}) // old backfill's chunk; its L written before SET UNLOGGED
	r.must(rebackfillAsk{ctx: context.Background(), tables: []string{"public.t"}, done: make(chan error, 1),
		cause: "its values were rewritten with no row event"}) // the look saw LOGGED again
	r.mark(7, watermark.Low)                               // streamed only now (lag)
	r.mustTxn(ins(toastRel, text("5"), text("x")))         // before SET UNLOGGED; key 5 then deleted while UNLOGGED
	r.window(9, toastTable, nil, chunkRows("1"), nil, nil) // new backfill, after the look: no key 5
	require.Equal(t, []Op{Refresh, Snapshot}, ops(r.out), "key 5 must not reach the output after the Refresh")
}
