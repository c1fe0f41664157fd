package line_test

import (
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/sink/jsonl/line"
)

// TestDecodeEveryField: a line with every field the format has decodes into each of Line's
// fields; a truncate and a refresh have no key and no values.
func TestDecodeEveryField(t *testing.T) {
	l, err := line.Decode([]byte(`{"op":"update","table":"public.t","key":{"id":1},"after":{"id":1,"n":null,"a":[1,2]},"unchanged":["doc","x"],"original":{"n":"NaN","a":"[0:1]={1,2}"},"lsn":"1/16B3748","seq":7,"xid":731,"time":"2026-01-02T03:04:05.123456Z"}` + "\n"))
	require.NoError(t, err)
	require.Equal(t, "update", l.Op)
	require.Equal(t, "public.t", l.Table)
	require.Equal(t, map[string]json.RawMessage{"id": json.RawMessage(`1`)}, l.Key)
	require.Equal(t, map[string]json.RawMessage{"id": json.RawMessage(`1`), "n": json.RawMessage(`null`), "a": json.RawMessage(`[1,2]`)}, l.After)
	require.Equal(t, []string{"doc", "x"}, l.Unchanged)
	require.Equal(t, map[string]string{"n": "NaN", "a": "[0:1]={1,2}"}, l.Original)
	require.Equal(t, line.LSN(1<<32|0x16B3748), l.LSN)
	require.Equal(t, "1/16B3748", l.LSN.String())
	require.Equal(t, 7, l.Seq)
	require.Equal(t, uint32(731), l.XID)
	require.Equal(t, time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC), l.Time)

	for _, op := range []string{"truncate", "refresh"} {
		l, err := line.Decode([]byte(`{"op":"` + op + `","table":"public.t","lsn":"0/10","seq":0}`))
		require.NoError(t, err)
		require.Equal(t, op, l.Op)
		require.Nil(t, l.Key)
		require.Nil(t, l.After)
		require.Zero(t, l.XID)
		require.True(t, l.Time.IsZero())
	}
}

// TestDecodeRefuses: a field the format does not have (or one in another case, or given twice),
// a bad or missing LSN, a line without op or table, or two values on a line are errors, never
// skipped.
func TestDecodeRefuses(t *testing.T) {
	for _, text := range []string{
		`{"op":"insert","table":"public.t","key":{"id":1},"after":{"id":1},"before":{"id":0},"lsn":"0/10","seq":0}`,
		`{"op":"insert","table":"public.t","key":{"id":1},"after":{"id":1},"lsn":"16B3748","seq":0}`,
		`{"table":"public.t","lsn":"0/10","seq":0}`,
		`{"op":"truncate","lsn":"0/10","seq":0}`,
		`{"op":"truncate","table":"public.t","lsn":"0/10","seq":0} {}`,
		`{"op":"insert",`,
		`{"op":"truncate","table":"public.t","seq":0}`,
		`{"op":"truncate","table":"public.t","lsn":null,"seq":0}`,
		`{"op":"truncate","table":"public.t","lsn":"0/0","seq":0}`,
		`{"OP":"truncate","table":"public.t","lsn":"0/10","seq":0}`,
		`{"op":"truncate","Table":"public.t","lsn":"0/10","seq":0}`,
		`{"op":"insert","op":"truncate","table":"public.t","lsn":"0/10","seq":0}`,
		`["op","truncate"]`,
	} {
		_, err := line.Decode([]byte(text))
		require.Error(t, err, text)
	}
}

// TestReaderNamesTheLine: the reader reads line after line, and an error names its line.
func TestReaderNamesTheLine(t *testing.T) {
	in := `{"op":"truncate","table":"public.a","lsn":"0/10","seq":0}
{"op":"truncate","table":"public.b","lsn":"0/10","seq":1}
{"op":"truncate","table":"public.c","lsn":"x","seq":2}
`
	r := line.NewReader(strings.NewReader(in))
	l, err := r.Next()
	require.NoError(t, err)
	require.Equal(t, "public.a", l.Table)
	l, err = r.Next()
	require.NoError(t, err)
	require.Equal(t, 1, l.Seq)
	_, err = r.Next()
	require.ErrorContains(t, err, "line 3")

	ls, err := line.ReadAll(strings.NewReader(in[:strings.LastIndex(in[:len(in)-1], "\n")+1]))
	require.NoError(t, err)
	require.Len(t, ls, 2)
	_, err = line.NewReader(strings.NewReader("")).Next()
	require.ErrorIs(t, err, io.EOF)
}

func TestCanonicalNumber(t *testing.T) {
	for in, want := range map[string]string{"1.0": "1", "1.00": "1", "1": "1", "10": "10", "10.50": "10.5", "-0": "0", "-0.0": "0",
		"0.0": "0", "-1.0": "-1", "1e10": "1e10", `"1.0"`: `"1.0"`, "null": "null", "100": "100", "-0.01": "-0.01"} {
		if got := string(line.CanonicalNumber([]byte(in))); got != want {
			t.Errorf("CanonicalNumber(%s) = %s, want %s", in, got, want)
		}
	}
}
