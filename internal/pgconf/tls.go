package pgconf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgservicefile"
	"github.com/jackc/pgx/v5/pgconn"
)

// SSLRule says how the sslmode of a connection was decided by DefaultSSLMode.
type SSLRule int

// The rules of DefaultSSLMode.
const (
	// SSLExplicit: the connection string, PGSSLMODE or the service file sets sslmode; it is
	// honoured as given.
	SSLExplicit SSLRule = iota
	// SSLLocal: no sslmode, and every host is a loopback address, localhost or a Unix socket:
	// sslmode=disable, as the traffic never leaves the machine.
	SSLLocal
	// SSLRemote: no sslmode, and a host is elsewhere: sslmode=verify-full.
	SSLRemote
)

// DefaultSSLMode returns dsn with the sslmode Tidemark chooses when dsn does not choose one,
// and the rule applied. Without it, pgx (like libpq) uses prefer: TLS when the server offers it
// and plaintext otherwise, without checking who answers, so anyone on the path can read the
// password exchange's result and every row, or pose as the server, and nothing says so. An
// sslmode set in the connection string, in PGSSLMODE or in the service file is honoured as
// given; otherwise a connection to loopback addresses, localhost or a Unix socket uses disable,
// and any other uses verify-full (see SSLRule.Explain for the failure of a server without a
// certificate this machine trusts). Errors never contain the password.
func DefaultSSLMode(dsn string) (string, SSLRule, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "", SSLExplicit, ParseError(err)
	}
	if explicitSSLMode(dsn) {
		return dsn, SSLExplicit, nil
	}
	mode, rule := "verify-full", SSLRemote
	if allLocal(cfg) {
		mode, rule = "disable", SSLLocal
	}
	out := dsn + " sslmode=" + mode
	switch {
	case isURL(dsn) && strings.Contains(afterUserinfo(dsn), "?"):
		out = dsn + "&sslmode=" + mode
	case isURL(dsn):
		out = dsn + "?sslmode=" + mode
	case strings.TrimSpace(dsn) == "":
		out = "sslmode=" + mode
	}
	// A last value that is empty and unquoted, or ends with a backslash, would swallow the
	// setting added: check that it took.
	if connStringSettings(out)["sslmode"] != mode {
		return "", SSLExplicit, fmt.Errorf("the connection string sets no sslmode, and one cannot be added after its last value (empty, or ending with a backslash): add sslmode=%s to it, or quote that value", mode)
	}
	return out, rule, nil
}

// Explain adds to err what the rule did and how to choose another sslmode, when err is the
// failure to connect with the sslmode the rule chose and can come from TLS: a server without
// TLS, or whose certificate is not trusted here or not for its name. Failures the server
// reported (it answered, so TLS worked), of the network, or of a connection that was up are
// returned as they are.
func (r SSLRule) Explain(err error) error {
	if err == nil || r != SSLRemote {
		return err
	}
	var connErr *pgconn.ConnectError
	var pgErr *pgconn.PgError
	var netErr net.Error
	if !errors.As(err, &connErr) || errors.As(err, &pgErr) || errors.As(err, &netErr) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w; the connection string sets no sslmode and the server is not on this machine, so Tidemark connects with sslmode=verify-full: "+
		"TLS, with a certificate for the server's name signed by a CA this machine trusts (or by the one sslrootcert=FILE names). "+
		"If the server has no such certificate, choose in the connection string or PGSSLMODE: sslmode=verify-ca sslrootcert=FILE (its CA's certificate), "+
		"or sslmode=require (encrypted, but whoever answers is trusted)", err)
}

// explicitSSLMode reports whether sslmode is chosen for dsn: in the connection string (an empty
// value is no choice: pgx reads it as prefer), in PGSSLMODE, or in its service's entry.
func explicitSSLMode(dsn string) bool {
	if os.Getenv("PGSSLMODE") != "" {
		return true
	}
	settings := connStringSettings(dsn)
	if settings["sslmode"] != "" || settings["ssl"] == "true" {
		return true
	}
	service := settings["service"]
	if service == "" {
		service = os.Getenv("PGSERVICE")
	}
	if service == "" {
		return false
	}
	file := settings["servicefile"]
	if file == "" {
		file = os.Getenv("PGSERVICEFILE")
	}
	if file == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return false
		}
		file = filepath.Join(home, ".pg_service.conf")
	}
	sf, err := pgservicefile.ReadServicefile(file)
	if err != nil {
		return false
	}
	s, err := sf.GetService(service)
	return err == nil && s.Settings["sslmode"] != ""
}

// allLocal reports whether every host cfg may connect to is on this machine.
func allLocal(cfg *pgconn.Config) bool {
	hosts := []string{cfg.Host}
	for _, f := range cfg.Fallbacks {
		hosts = append(hosts, f.Host)
	}
	for _, h := range hosts {
		ip := net.ParseIP(h)
		if !strings.HasPrefix(h, "/") && !strings.EqualFold(h, "localhost") && (ip == nil || !ip.IsLoopback()) {
			return false
		}
	}
	return true
}

func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// afterUserinfo is a URL connection string without its scheme and user information, where a
// '?' can only start the query.
func afterUserinfo(dsn string) string {
	p := dsn[strings.Index(dsn, "://")+3:]
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		p = p[i+1:]
	}
	return p
}

// connStringSettings returns the settings a connection string (URL or key=value, already
// accepted by pgconn.ParseConfig) gives, as pgconn reads them: a later setting replaces an
// earlier one. It reads only what the sslmode rule needs; values it cannot decode are skipped.
func connStringSettings(dsn string) map[string]string {
	settings := map[string]string{}
	if isURL(dsn) {
		_, query, ok := strings.Cut(afterUserinfo(dsn), "?")
		if !ok {
			return settings
		}
		for _, pair := range strings.Split(query, "&") {
			k, v, _ := strings.Cut(pair, "=")
			key, err1 := url.PathUnescape(strings.TrimSpace(k))
			val, err2 := url.PathUnescape(strings.TrimSpace(v))
			if err1 == nil && err2 == nil {
				settings[key] = val
			}
		}
		return settings
	}
	// key=value pairs separated by spaces; a value may be single-quoted; a backslash escapes the
	// next character (libpq's rules, as pgconn implements them).
	const space = " \t\n\r\v\f"
	s := strings.TrimLeft(dsn, space)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			break
		}
		key := strings.Trim(s[:eq], space)
		s = strings.TrimLeft(s[eq+1:], space)
		var val strings.Builder
		quoted := strings.HasPrefix(s, "'")
		if quoted {
			s = s[1:]
		}
		i := 0
		for ; i < len(s); i++ {
			c := s[i]
			if c == '\\' {
				i++
				if i < len(s) {
					val.WriteByte(s[i])
				}
				continue
			}
			if (quoted && c == '\'') || (!quoted && strings.IndexByte(space, c) >= 0) {
				break
			}
			val.WriteByte(c)
		}
		if quoted && i < len(s) {
			i++ // the closing quote
		}
		settings[key] = val.String()
		s = strings.TrimLeft(s[min(i, len(s)):], space)
	}
	return settings
}
