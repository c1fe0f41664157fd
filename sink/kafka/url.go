package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/tidemark/tidemark/internal/secret"
)

// Address is a parsed kafka:// URL: kafka://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]/PREFIX
// [?tls=true&tls-ca=FILE&sasl=plain|scram-sha-256|scram-sha-512].
type Address struct {
	Brokers []string
	Prefix  string // the topics' prefix: PREFIX.SCHEMA.TABLE, and the checkpoint topic PREFIX.tidemark-checkpoint
	TLS     bool
	TLSCA   string // a PEM file of the CAs to trust instead of the system's
	SASL    string // "", plain, scram-sha-256, scram-sha-512
	User    string
	// Password is the SASL password: from the URL, or from $TIDEMARK_KAFKA_PASSWORD when the
	// URL has none (so that it need not be on a command line).
	Password string
}

// PasswordEnv names the environment variable the SASL password is read from when the URL has
// none.
const PasswordEnv = "TIDEMARK_KAFKA_PASSWORD"

// IsURL reports whether s names a Kafka output.
func IsURL(s string) bool { return strings.HasPrefix(s, "kafka://") }

// topicName is what Kafka takes as a topic name.
var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

// ParseURL parses a kafka:// URL. Its errors never repeat the password.
func ParseURL(s string) (Address, error) {
	var a Address
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "kafka" {
		return a, fmt.Errorf("--to %s: a Kafka output is kafka://HOST:PORT[,HOST:PORT...]/PREFIX", Redact(s))
	}
	for _, b := range strings.Split(u.Host, ",") {
		if b == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			return a, fmt.Errorf("--to %s: broker %q: give HOST:PORT (Kafka's is usually 9092)", Redact(s), b)
		}
		a.Brokers = append(a.Brokers, b)
	}
	if len(a.Brokers) == 0 {
		return a, fmt.Errorf("--to %s: no broker: give kafka://HOST:PORT[,HOST:PORT...]/PREFIX", Redact(s))
	}
	a.Prefix = strings.Trim(u.Path, "/")
	if a.Prefix == "" || !topicName.MatchString(a.Prefix) || len(a.Prefix) > 100 {
		return a, fmt.Errorf("--to %s: the path is the topics' prefix (letters, digits, '.', '_', '-', at most 100): for example kafka://localhost:9092/shop", Redact(s))
	}
	if u.User != nil {
		a.User = u.User.Username()
		a.Password, _ = u.User.Password()
	}
	q := u.Query()
	for k := range q {
		switch k {
		case "tls", "tls-ca", "sasl":
		default:
			return a, fmt.Errorf("--to %s: unknown option %q (known: tls, tls-ca, sasl)", Redact(s), k)
		}
	}
	switch v := q.Get("tls"); v {
	case "", "false", "0":
	case "true", "1":
		a.TLS = true
	default:
		return a, fmt.Errorf("--to %s: tls=%q: give true or false", Redact(s), v)
	}
	if a.TLSCA = q.Get("tls-ca"); a.TLSCA != "" {
		a.TLS = true
	}
	switch a.SASL = strings.ToLower(q.Get("sasl")); a.SASL {
	case "":
		if a.User != "" {
			return a, fmt.Errorf("--to %s: a user is given but no mechanism: add ?sasl=plain, scram-sha-256 or scram-sha-512", Redact(s))
		}
	case "plain", "scram-sha-256", "scram-sha-512":
		if a.User == "" {
			return a, fmt.Errorf("--to %s: sasl=%s needs a user: kafka://USER@HOST:PORT/PREFIX, the password in $%s", Redact(s), a.SASL, PasswordEnv)
		}
		if a.Password == "" {
			a.Password = os.Getenv(PasswordEnv)
		}
		if a.SASL == "plain" && !a.TLS {
			return a, fmt.Errorf("--to %s: sasl=plain sends the password as it is: add tls=true", Redact(s))
		}
	default:
		return a, fmt.Errorf("--to %s: sasl=%q: give plain, scram-sha-256 or scram-sha-512", Redact(s), a.SASL)
	}
	return a, nil
}

// Redact returns a kafka:// URL with its password replaced by xxxxx.
func Redact(s string) string { return secret.RedactURL(s) }

// String is the address without its password.
func (a Address) String() string {
	return "kafka://" + strings.Join(a.Brokers, ",") + "/" + a.Prefix
}

// hint says what an error of reaching the brokers may mean for this address.
func (a Address) hint(err error) string {
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return fmt.Sprintf(" (the brokers refused user %s: check the password, in the URL or $%s, and the mechanism, sasl=%s)", a.User, PasswordEnv, a.SASL)
	case errors.Is(err, io.EOF) && a.SASL != "":
		return fmt.Sprintf(" (the broker closed the connection: it may have refused user %s, whose password is in the URL or $%s, or the mechanism sasl=%s; or its listener wants TLS: tls=true)", a.User, PasswordEnv, a.SASL)
	case errors.Is(err, io.EOF) && !a.TLS:
		return " (the broker closed the connection: its listener may want TLS (tls=true) or SASL (sasl=...))"
	}
	return ""
}

// ClientOpts are the connection options of every client of the address (the output's own, and
// a consumer's of it).
func (a Address) ClientOpts() ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(a.Brokers...), kgo.ClientID("tidemark")}
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
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	var m sasl.Mechanism
	switch a.SASL {
	case "plain":
		m = plain.Auth{User: a.User, Pass: a.Password}.AsMechanism()
	case "scram-sha-256":
		m = scram.Auth{User: a.User, Pass: a.Password}.AsSha256Mechanism()
	case "scram-sha-512":
		m = scram.Auth{User: a.User, Pass: a.Password}.AsSha512Mechanism()
	}
	if m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}
