package merge

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestXIDsBounded: a state or checkpoint comes from outside (an Airbyte state file, a checkpoint
// file, a target's row), and a few bytes of ranges of invisible transactions expand to one
// entry per transaction: eight ranges of 2^24 are 512 MB. More than MaxInvisible transactions
// are refused before any is expanded.
func TestXIDsBounded(t *testing.T) {
	var ranges []string
	for i := range 8 {
		ranges = append(ranges, fmt.Sprintf("%d-%d", i<<24, i<<24+1<<24-1))
	}
	var x XIDs
	err := json.Unmarshal([]byte(`"`+strings.Join(ranges, ",")+`"`), &x)
	require.ErrorContains(t, err, "more than")
	require.Nil(t, x)
	require.NoError(t, json.Unmarshal([]byte(`"1042-1050,1077"`), &x))
	require.Len(t, x, 10)
}

// TestPositionChecked: a position's tables are checked as they are decoded: a cursor, a bound or
// a key to read again with another number of values than the key has columns (none, without a
// key), a negative count, a key of more columns than an index can have.
func TestPositionChecked(t *testing.T) {
	good := func() *TableProgress {
		return &TableProgress{Key: []string{"a", "b"}, Cursor: []string{"1", "2"}, MaxKey: []string{"9", "9"}, Rows: 3, Chunks: 1, Reread: [][]string{{"1", "1"}}}
	}
	decode := func(tp *TableProgress) error {
		b, err := json.Marshal(&Position{Version: PositionVersion, Tables: map[string]*TableProgress{"public.t": tp}})
		require.NoError(t, err)
		var p Position
		return json.Unmarshal(b, &p)
	}
	require.NoError(t, decode(good()))
	require.NoError(t, decode(&TableProgress{Refresh: true}), "a table not started has no key yet")
	for name, edit := range map[string]func(*TableProgress){
		"cursor":   func(p *TableProgress) { p.Cursor = []string{"1"} },
		"max_key":  func(p *TableProgress) { p.MaxKey = []string{"1", "2", "3"} },
		"reread":   func(p *TableProgress) { p.Reread = [][]string{{"1"}} },
		"rows":     func(p *TableProgress) { p.Rows = -1 },
		"chunks":   func(p *TableProgress) { p.Chunks = -5 },
		"no key":   func(p *TableProgress) { p.Key = nil },
		"long key": func(p *TableProgress) { p.Key, p.Cursor, p.MaxKey, p.Reread = make([]string, 40), nil, nil, nil },
	} {
		tp := good()
		edit(tp)
		require.Error(t, decode(tp), name)
	}
}

// FuzzPositionDecode: a position from outside (a checkpoint file, a target's row, inside an
// Airbyte state) decodes or is refused; it never panics, and what decodes passes Check.
func FuzzPositionDecode(f *testing.F) {
	f.Add([]byte(`{"version":` + fmt.Sprint(PositionVersion) + `,"lsn":"0/10","invisible":"1-3,7","tables":{"public.t":{"key":["a"],"cursor":["1"],"rows":1}}}`))
	f.Add([]byte(`{"version":` + fmt.Sprint(PositionVersion) + `,"lsn":"0/0","invisible":"0-16777216,16777217-33554433","tables":{}}`))
	f.Add([]byte(`{"version":` + fmt.Sprint(PositionVersion) + `,"lsn":"0/0","tables":{"t":null}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Position
		if json.Unmarshal(b, &p) != nil {
			return
		}
		if p.Invisible != nil {
			require.LessOrEqual(t, len(*p.Invisible), MaxInvisible)
		}
		for _, tp := range p.Tables {
			require.NoError(t, tp.Check())
		}
	})
}
