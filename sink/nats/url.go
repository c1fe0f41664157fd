package nats

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/tidemark/tidemark/internal/secret"
)

// Address is a parsed nats:// URL:
// nats://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]/STREAM[?tls=true&tls-ca=FILE&tls-cert=FILE&tls-key=FILE&creds=FILE&nkey=FILE].
type Address struct {
	Servers []string // HOST:PORT
	Stream  string   // the stream; its subjects are STREAM.>, its checkpoint bucket tidemark-STREAM
	TLS     bool
	TLSCA   string // a PEM file of the CAs to trust instead of the system's
	TLSCert string // a client certificate (PEM), with TLSKey: the server may ask for one
	TLSKey  string
	Creds   string // a credentials file (a user JWT and its NKey seed), as nsc writes it
	NKey    string // a file holding an NKey seed
	User    string
	// Password is the user's: from the URL, or from $TIDEMARK_NATS_PASSWORD when the URL has
	// none (so that it need not be on a command line).
	Password string
	// Token is the server's authorization token, from $TIDEMARK_NATS_TOKEN (when no user is given).
	Token string
}

// The environment variables secrets are read from.
const (
	PasswordEnv = "TIDEMARK_NATS_PASSWORD"
	TokenEnv    = "TIDEMARK_NATS_TOKEN"
)

// IsURL reports whether s names a NATS output.
func IsURL(s string) bool { return strings.HasPrefix(s, "nats://") }

// streamName is what the output takes as a stream name: JetStream refuses '.', '*', '>',
// spaces and path separators; the bucket name (tidemark-STREAM) takes only these.
var streamName = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// ParseURL parses a nats:// URL. Its errors never repeat the password.
func ParseURL(s string) (Address, error) {
	var a Address
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "nats" {
		return a, fmt.Errorf("--to %s: a NATS output is nats://HOST:PORT[,HOST:PORT...]/STREAM", Redact(s))
	}
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(h); err != nil || port == "" {
			return a, fmt.Errorf("--to %s: server %q: give HOST:PORT (NATS's is usually 4222)", Redact(s), h)
		}
		a.Servers = append(a.Servers, h)
	}
	if len(a.Servers) == 0 {
		return a, fmt.Errorf("--to %s: no server: give nats://HOST:PORT[,HOST:PORT...]/STREAM", Redact(s))
	}
	a.Stream = strings.Trim(u.Path, "/")
	if a.Stream == "" || !streamName.MatchString(a.Stream) || len(a.Stream) > 100 {
		return a, fmt.Errorf("--to %s: the path is the JetStream stream's name (letters, digits, '_', '-', at most 100): for example nats://localhost:4222/shop", Redact(s))
	}
	if u.User != nil {
		a.User = u.User.Username()
		a.Password, _ = u.User.Password()
	}
	q := u.Query()
	for k := range q {
		switch k {
		case "tls", "tls-ca", "tls-cert", "tls-key", "creds", "nkey":
		default:
			return a, fmt.Errorf("--to %s: unknown option %q (known: tls, tls-ca, tls-cert, tls-key, creds, nkey)", Redact(s), k)
		}
	}
	switch v := q.Get("tls"); v {
	case "", "false", "0":
	case "true", "1":
		a.TLS = true
	default:
		return a, fmt.Errorf("--to %s: tls=%q: give true or false", Redact(s), v)
	}
	a.TLSCA, a.TLSCert, a.TLSKey = q.Get("tls-ca"), q.Get("tls-cert"), q.Get("tls-key")
	if (a.TLSCert == "") != (a.TLSKey == "") {
		return a, fmt.Errorf("--to %s: a client certificate needs both tls-cert and tls-key", Redact(s))
	}
	if a.TLSCA != "" || a.TLSCert != "" {
		a.TLS = true
	}
	a.Creds, a.NKey = q.Get("creds"), q.Get("nkey")
	n := 0
	for _, given := range []bool{a.User != "", a.Creds != "", a.NKey != ""} {
		if given {
			n++
		}
	}
	if n > 1 {
		return a, fmt.Errorf("--to %s: give one way to log in: a user (and password), creds=FILE or nkey=FILE", Redact(s))
	}
	if a.User != "" && a.Password == "" {
		a.Password = os.Getenv(PasswordEnv)
	}
	if n == 0 {
		a.Token = os.Getenv(TokenEnv)
	}
	return a, nil
}

// Redact returns a nats:// URL with its password replaced by xxxxx.
func Redact(s string) string { return secret.RedactURL(s) }

// String is the address without its password.
func (a Address) String() string {
	return "nats://" + strings.Join(a.Servers, ",") + "/" + a.Stream
}

// options are the connection options of the address.
func (a Address) options() ([]natsgo.Option, error) {
	opts := []natsgo.Option{natsgo.Name("tidemark"), natsgo.Timeout(10 * time.Second),
		// A connection lost is the run's to report (it resumes from its checkpoint), not the
		// client's to hide behind a buffer.
		natsgo.NoReconnect()}
	if a.TLS {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if a.TLSCA != "" {
			pem, err := os.ReadFile(a.TLSCA)
			if err != nil {
				return nil, fmt.Errorf("tls-ca: %w", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("tls-ca %s: no PEM certificate in it", a.TLSCA)
			}
		}
		if a.TLSCert != "" {
			cert, err := tls.LoadX509KeyPair(a.TLSCert, a.TLSKey)
			if err != nil {
				return nil, fmt.Errorf("tls-cert, tls-key: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, natsgo.Secure(cfg))
	}
	switch {
	case a.User != "":
		opts = append(opts, natsgo.UserInfo(a.User, a.Password))
	case a.Creds != "":
		opts = append(opts, natsgo.UserCredentials(a.Creds))
	case a.NKey != "":
		o, err := natsgo.NkeyOptionFromSeed(a.NKey)
		if err != nil {
			return nil, fmt.Errorf("nkey %s: %w", a.NKey, err)
		}
		opts = append(opts, o)
	case a.Token != "":
		opts = append(opts, natsgo.Token(a.Token))
	}
	return opts, nil
}

// Connect connects to the servers of the address, with more options if given.
func (a Address) Connect(more ...natsgo.Option) (*natsgo.Conn, error) {
	opts, err := a.options()
	if err != nil {
		return nil, err
	}
	opts = append(opts, more...)
	urls := make([]string, len(a.Servers))
	for i, s := range a.Servers {
		urls[i] = "nats://" + s
		if a.TLS {
			urls[i] = "tls://" + s
		}
	}
	nc, err := natsgo.Connect(strings.Join(urls, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("reach %s: %w%s", a, err, a.hint(err))
	}
	return nc, nil
}

// hint says what an error of connecting may mean for this address.
func (a Address) hint(err error) string {
	switch {
	case errors.Is(err, natsgo.ErrAuthorization) && a.User != "":
		return fmt.Sprintf(" (the server refused user %s: check the password, in the URL or $%s)", a.User, PasswordEnv)
	case errors.Is(err, natsgo.ErrAuthorization):
		return fmt.Sprintf(" (the server wants credentials: a user in the URL, creds=FILE, nkey=FILE, or a token in $%s)", TokenEnv)
	case errors.Is(err, natsgo.ErrSecureConnRequired):
		return " (the server wants TLS: add tls=true)"
	case errors.Is(err, natsgo.ErrNoServers):
		return " (no server answered: check the host and port, 4222 by default)"
	}
	return ""
}
