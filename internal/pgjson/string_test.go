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
		likeEncodingJSON(t, s)
	}
}

// likeEncodingJSON checks that AppendString's output for s decodes to what encoding/json's
// decodes to, the same from a string and from bytes, and returns it.
func likeEncodingJSON(t *testing.T, s string) []byte {
	t.Helper()
	got := AppendString(nil, s)
	var back, wantBack string
	require.NoError(t, json.Unmarshal(got, &back), "%q -> %s", s, got)
	want, _ := json.Marshal(s)
	require.NoError(t, json.Unmarshal(want, &wantBack))
	require.Equal(t, wantBack, back, "%q", s)
	require.Equal(t, string(got), string(AppendString(nil, []byte(s))), "%q", s)
	return got
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

// TestAppendStringEveryPosition: each byte that needs a look (a quote, a backslash, control
// characters, the start of a multibyte or an invalid sequence), at every position of strings
// longer than the eight-byte steps, decodes to what encoding/json's output decodes to, and the
// plain runs around it are copied as they are.
func TestAppendStringEveryPosition(t *testing.T) {
	for _, special := range []string{`"`, `\`, "\x00", "\x1f", "\n", "\x7f", "é", "\xff", "\xc3", "日", "\U0001F600"} {
		for n := 1; n <= 26; n++ {
			for p := 0; p <= n; p++ {
				s := strings.Repeat("a", p) + special + strings.Repeat("b", n-p)
				got := likeEncodingJSON(t, s)
				// Only the special byte may change: the plain runs around it are copied as they are.
				require.True(t, strings.HasPrefix(string(got), `"`+strings.Repeat("a", p)), "%q -> %s", s, got)
				require.True(t, strings.HasSuffix(string(got), strings.Repeat("b", n-p)+`"`), "%q -> %s", s, got)
			}
		}
	}
}
