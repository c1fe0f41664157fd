package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTruncateStopsUntilReset: Airbyte records cannot remove rows, so a TRUNCATE of a captured
// table stops the read with a config error that says to reset the stream, and the state does not
// move past it (the next read stops again). Once the stream is reset (the platform clears its
// rows and its state), the read starts the stream over behind the truncate.
func TestTruncateStopsUntilReset(t *testing.T) {
	e := ordersEnv(t, 50)
	cat := e.catalog()
	r := e.read(cat, nil)
	state := r.lastState(t)
	e.db.Exec(`TRUNCATE orders`)
	e.db.Exec(`INSERT INTO orders VALUES (1000, 'after', 1)`)
	for range 2 {
		failed := e.run("read", "--config", e.config(), "--catalog", cat, "--state", e.file("state.json", state))
		require.NotEqual(t, 0, failed.code)
		errs := failed.traces("ERROR")
		require.Len(t, errs, 1)
		require.Equal(t, "config_error", errs[0].str("trace", "error", "failure_type"))
		msg := errs[0].str("trace", "error", "message")
		require.Contains(t, msg, "truncated")
		require.Contains(t, msg, "reset the stream")
		for _, st := range failed.states() {
			state = mustJSON(t, []any{st.m["state"]})
		}
	}
	reset := withoutStream(t, state, "orders")
	r3 := e.read(cat, reset)
	require.Len(t, r3.records(), 1, "the stream starts over with the table as it is")
	replayEqualsSource(t, e, "public.orders", "id", r3)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// withoutStream returns a GLOBAL state without the stream's entry, as the platform's reset of one
// stream leaves it.
func withoutStream(t *testing.T, state []byte, name string) []byte {
	t.Helper()
	var msgs []map[string]any
	require.NoError(t, json.Unmarshal(state, &msgs))
	g := msgs[0]["global"].(map[string]any)
	var kept []any
	for _, ss := range g["stream_states"].([]any) {
		if ss.(map[string]any)["stream_descriptor"].(map[string]any)["name"] != name {
			kept = append(kept, ss)
		}
	}
	g["stream_states"] = kept
	return mustJSON(t, msgs)
}
