package secret

import (
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestScrub: a secret is replaced raw, as JSON escapes it (a PEM key's newlines), as %q quotes
// it, as a connection string escapes it, and percent-encoded; short and empty ones are not.
func TestScrub(t *testing.T) {
	key := "-----BEGIN KEY-----\nabc\"def\n-----END KEY-----"
	pw := `a b'c\d"e`
	s := New("pw1234", key, "", "ab", pw)
	require.Equal(t, "x **** y", s.Scrub("x pw1234 y"))
	require.Equal(t, "k=****", s.Scrub("k="+key))
	require.Equal(t, `{"m":"****"}`, s.Scrub(`{"m":"-----BEGIN KEY-----\nabc\"def\n-----END KEY-----"}`))
	require.Equal(t, "ab stays", s.Scrub("ab stays"))
	for _, form := range []string{pw, `a b'c\\d\"e`, `a\ b\'c\\d"e`, `a b\'c\\d"e`, url.QueryEscape(pw), url.PathEscape(pw)} {
		require.Equal(t, "[****]", s.Scrub("["+form+"]"), form)
	}
	var b strings.Builder
	w := s.Writer(&b)
	_, err := w.Write([]byte("password=pw1234\n"))
	require.NoError(t, err)
	require.Equal(t, "password=****\n", b.String())
}

// TestFromDSN: the passwords of a connection string, as parsed and as spelled.
func TestFromDSN(t *testing.T) {
	for dsn, want := range map[string]string{
		`host=h password=s3cret dbname=d`:                     "s3cret",
		`host=h password='se cr\'et' dbname=d`:                "se cr'et",
		`host=h password=se\ cret dbname=d`:                   "se cret",
		`postgres://u:p%20ss@h/d`:                             "p ss",
		`postgres://u@h/d?password=qp4ss`:                     "qp4ss",
		`postgres://u:bro ken@h/d?x=%zz`:                      "bro ken",
		`host=h password=unterminated\ sp'ace dbname='broken`: `unterminated\ sp'ace`,
	} {
		require.Contains(t, FromDSN(dsn), want, dsn)
	}
}
