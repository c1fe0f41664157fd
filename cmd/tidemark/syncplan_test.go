package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/merge"
)

// TestEngineConfigTablesAreTheRunsOwn: what one run sets on its tables (a re-backfill without a
// position, acknowledgements cleared after a checkpoint) stays with that run: the next attempt
// of the same sync (a reconnection) builds its tables from the plan again. Found by review: the
// runs shared the plan's tables, so a first run's re-backfill started the table over again at
// every reconnection.
func TestEngineConfigTablesAreTheRunsOwn(t *testing.T) {
	e, _, _ := testEnv(t)
	fs := newFlags("sync", "sync", e)
	f := defineSyncFlags(fs)
	require.NoError(t, fs.Parse(nil))
	plan := syncPlan{tables: []merge.TableConfig{{Schema: "public", Name: "t"}}}
	cfg := f.engineConfig(plan, "host=x")
	cfg.Tables[0].Rebackfill = true
	require.False(t, f.engineConfig(plan, "host=x").Tables[0].Rebackfill, "the next run's tables")
	require.False(t, plan.tables[0].Rebackfill)
}
