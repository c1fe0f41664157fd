package merge

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPositionJSON: the persisted format round-trips, names its version, writes LSNs in
// PostgreSQL's form, and refuses other versions.
func TestPositionJSON(t *testing.T) {
	p := Position{Version: PositionVersion, LSN: 0x16B3748, SystemID: "7301", Slot: "s", Tables: map[string]*TableProgress{
		"public.t": {Cursor: []string{"a", "1"}, MaxKey: []string{"z", "9"}, Key: []string{"k", "n"}, Rows: 10, Chunks: 2},
	}}
	b, err := json.Marshal(p)
	require.NoError(t, err)
	require.JSONEq(t, `{"version":1,"lsn":"0/16B3748","system_id":"7301","slot":"s","tables":{"public.t":{"done":false,"cursor":["a","1"],"max_key":["z","9"],"key":["k","n"],"rows":10,"chunks":2}}}`, string(b))
	var back Position
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, p, back)

	require.ErrorContains(t, json.Unmarshal([]byte(`{"version":2,"lsn":"0/1","tables":{}}`), &back), "version 2")
	require.ErrorContains(t, json.Unmarshal([]byte(`{"version":1,"lsn":"zz","tables":{}}`), &back), "position lsn")

	c := p.Clone()
	c.Tables["public.t"].Rows = 99
	require.Equal(t, int64(10), p.Tables["public.t"].Rows, "a clone is deep")
}
