package pgjson

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAppendStringMatchesEncodingJSON: the output decodes to the input (invalid UTF-8 replaced),
// as encoding/json's does.
func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", `q"b\s`, "tab\tnl\nCR\r", "\x00\x01\x1f\x7f", "é日本\U0001F600", "bad\xffutf8\xc3", "<&>", "\u2028\u2029"} {
		got := AppendString(nil, s)
		var back string
		require.NoError(t, json.Unmarshal(got, &back), "%q -> %s", s, got)
		want, _ := json.Marshal(s)
		var wantBack string
		require.NoError(t, json.Unmarshal(want, &wantBack))
		require.Equal(t, wantBack, back, "%q", s)
		require.Equal(t, string(AppendString(nil, []byte(s))), string(got))
	}
}

func FuzzAppendString(f *testing.F) {
	f.Add("a\"b\\c\x00\xff")
	f.Fuzz(func(t *testing.T, s string) {
		var back, want string
		if err := json.Unmarshal(AppendString(nil, s), &back); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		ref, _ := json.Marshal(s)
		_ = json.Unmarshal(ref, &want)
		if back != want {
			t.Fatalf("%q decoded to %q, encoding/json gives %q", s, back, want)
		}
	})
}

func BenchmarkAppendString(b *testing.B) {
	s := []byte(strings.Repeat("abcdefghij", 10))
	var buf []byte
	for b.Loop() {
		buf = AppendString(buf[:0], s)
	}
}
