// Package secret keeps secrets out of what the products print: one Scrubber, for the CLI's
// standard error (logs, errors, usage) and the connector's LOG, TRACE and CONNECTION_STATUS
// messages alike.
//
// A secret can reach a message in more forms than it was given in: as it is; escaped as JSON
// (the connector's messages and the CLI's JSON logs are JSON), as a Go quoted string (%q), as a
// connection string writes it (a backslash before a quote, a backslash or a space), or
// percent-encoded (in a URL). A Scrubber replaces every one of these forms. A connection string
// that fails to parse is a harder case: the driver's error quotes it, redacting the password it
// can find, and with an escaped space in the password it finds only its start; so parse errors
// never carry the string (internal/pgconf.Parse keeps only the reason), and Scrubber is the net
// behind that.
package secret

import (
	"encoding/json"
	"io"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// Scrubber replaces secrets, in every form they can take in a message, with ****.
type Scrubber struct {
	r *strings.Replacer
}

// minLen is the shortest secret replaced: a shorter one would turn ordinary words into ****.
const minLen = 4

// New returns a Scrubber of secrets (empty and very short ones are left out).
func New(secrets ...string) *Scrubber {
	seen := map[string]bool{}
	var forms []string
	add := func(s string) {
		if len(s) >= minLen && !seen[s] {
			seen[s] = true
			forms = append(forms, s)
		}
	}
	for _, s := range secrets {
		if len(s) < minLen {
			continue
		}
		add(s)
		if b, err := json.Marshal(s); err == nil {
			add(string(b[1 : len(b)-1]))
		}
		q := strconv.Quote(s)
		add(q[1 : len(q)-1])
		add(strings.NewReplacer(`\`, `\\`, `'`, `\'`, ` `, `\ `).Replace(s))
		add(strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s))
		add(url.QueryEscape(s))
		add(url.PathEscape(s))
		add(strings.ReplaceAll(url.QueryEscape(s), "+", "%20"))
	}
	// Longer forms first: one form may contain another.
	slices.SortFunc(forms, func(a, b string) int { return len(b) - len(a) })
	var pairs []string
	for _, f := range forms {
		pairs = append(pairs, f, "****")
	}
	return &Scrubber{r: strings.NewReplacer(pairs...)}
}

// Scrub returns text with every secret replaced.
func (s *Scrubber) Scrub(text string) string {
	if s == nil {
		return text
	}
	return s.r.Replace(text)
}

// Writer returns a writer that scrubs what it writes to w (whole writes: a secret split across
// two writes is not seen, and every writer of the products writes whole lines).
func (s *Scrubber) Writer(w io.Writer) io.Writer { return &writer{s: s, w: w} }

type writer struct {
	mu sync.Mutex
	s  *Scrubber
	w  io.Writer
}

func (w *writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := io.WriteString(w.w, w.s.Scrub(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// rawPassword finds a password as a connection string spells it: password=VALUE (quoted or
// not, with backslash escapes) or the userinfo of a URL.
var rawPassword = regexp.MustCompile(`(?:^|\s)(?:password|sslpassword)\s*=\s*('(?:[^'\\]|\\.)*'|(?:[^\s\\]|\\.)+)`)

// FromDSN returns the secrets of a connection string: its passwords as the driver reads them
// (the fallback hosts' too) and as the string spells them, so that a message quoting the
// string in any form is scrubbed.
func FromDSN(dsn string) []string {
	var out []string
	if cfg, err := pgconn.ParseConfig(dsn); err == nil {
		out = append(out, cfg.Password)
	}
	for _, m := range rawPassword.FindAllStringSubmatch(dsn, -1) {
		v := strings.Trim(m[1], "'")
		out = append(out, v, strings.NewReplacer(`\\`, `\`, `\'`, `'`, `\ `, ` `).Replace(v))
	}
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			out = append(out, p)
		}
		for _, k := range []string{"password", "sslpassword"} {
			if v := u.Query().Get(k); v != "" {
				out = append(out, v)
			}
		}
	}
	// A URL that does not parse: what lies between the scheme's user and the @.
	if i := strings.Index(dsn, "://"); i >= 0 {
		rest := dsn[i+3:]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if c := strings.Index(rest[:at], ":"); c >= 0 {
				out = append(out, rest[c+1:at])
				if p, err := url.PathUnescape(rest[c+1 : at]); err == nil {
					out = append(out, p)
				}
			}
		}
	}
	return out
}

// RedactURL returns a URL (kafka://, nats://, ...) with its password replaced by xxxxx, also
// when it does not parse.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		if i, j := strings.Index(s, "://"), strings.LastIndex(s, "@"); i >= 0 && j > i {
			return s[:i+3] + "xxxxx" + s[j:]
		}
		return s
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}
