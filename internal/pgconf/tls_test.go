package pgconf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// clearSSLEnv unsets, for the test, the environment variables that take part in the choice.
func clearSSLEnv(t *testing.T) {
	for _, v := range []string{"PGSSLMODE", "PGHOST", "PGSERVICE", "PGSERVICEFILE", "PGSSLROOTCERT"} {
		t.Setenv(v, "")
	}
}

// TestDefaultSSLMode: an sslmode set anywhere (the connection string, PGSSLMODE, the service
// file) is honoured as given; without one, local hosts connect without TLS and any other host
// with verify-full, never pgx's silent prefer (TLS when offered, plaintext otherwise, and no
// check of who answers).
func TestDefaultSSLMode(t *testing.T) {
	clearSSLEnv(t)
	services := filepath.Join(t.TempDir(), "pg_service.conf")
	require.NoError(t, os.WriteFile(services, []byte("[pinned]\nhost=db.example.com\nsslmode=require\n[bare]\nhost=db.example.com\n"), 0o600))
	cases := []struct {
		name, dsn string
		env       map[string]string
		want      string // the DSN returned
		rule      SSLRule
	}{
		{"explicit key=value", "host=db.example.com sslmode=require", nil, "host=db.example.com sslmode=require", SSLExplicit},
		{"explicit quoted", "host=db.example.com sslmode = 'prefer' password='x y'", nil, "host=db.example.com sslmode = 'prefer' password='x y'", SSLExplicit},
		{"explicit URL", "postgres://u:pw@db.example.com/app?sslmode=verify-ca", nil, "postgres://u:pw@db.example.com/app?sslmode=verify-ca", SSLExplicit},
		{"URL ssl=true", "postgres://u@db.example.com/app?ssl=true", nil, "postgres://u@db.example.com/app?ssl=true", SSLExplicit},
		{"PGSSLMODE", "host=db.example.com", map[string]string{"PGSSLMODE": "allow"}, "host=db.example.com", SSLExplicit},
		{"service with sslmode", "service=pinned", map[string]string{"PGSERVICEFILE": services}, "service=pinned", SSLExplicit},
		{"PGSERVICE with sslmode", "", map[string]string{"PGSERVICEFILE": services, "PGSERVICE": "pinned"}, "", SSLExplicit},
		{"service without sslmode", "service=bare", map[string]string{"PGSERVICEFILE": services}, "service=bare sslmode=verify-full", SSLRemote},
		{"remote key=value", "host=db.example.com user=u", nil, "host=db.example.com user=u sslmode=verify-full", SSLRemote},
		{"remote URL", "postgres://u:p%40ss@db.example.com:5432/app", nil, "postgres://u:p%40ss@db.example.com:5432/app?sslmode=verify-full", SSLRemote},
		{"remote URL with query", "postgres://u@10.1.2.3/app?application_name=x", nil, "postgres://u@10.1.2.3/app?application_name=x&sslmode=verify-full", SSLRemote},
		{"remote from PGHOST", "dbname=app", map[string]string{"PGHOST": "db.example.com"}, "dbname=app sslmode=verify-full", SSLRemote},
		{"empty sslmode is not a choice", "host=db.example.com sslmode='' user=u", nil, "host=db.example.com sslmode='' user=u sslmode=verify-full", SSLRemote},
		{"one remote host of several", "host=127.0.0.1,db.example.com", nil, "host=127.0.0.1,db.example.com sslmode=verify-full", SSLRemote},
		{"loopback IPv4", "host=127.0.0.1 port=5433 dbname=app", nil, "host=127.0.0.1 port=5433 dbname=app sslmode=disable", SSLLocal},
		{"loopback 127/8", "host=127.8.9.10", nil, "host=127.8.9.10 sslmode=disable", SSLLocal},
		{"loopback IPv6", "postgres://u@[::1]:5432/app", nil, "postgres://u@[::1]:5432/app?sslmode=disable", SSLLocal},
		{"localhost", "postgres://u@localhost/app", nil, "postgres://u@localhost/app?sslmode=disable", SSLLocal},
		{"Unix socket", "host=/var/run/postgresql dbname=app", nil, "host=/var/run/postgresql dbname=app sslmode=disable", SSLLocal},
		{"URL without path", "postgres://localhost", nil, "postgres://localhost?sslmode=disable", SSLLocal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			got, rule, err := DefaultSSLMode(tc.dsn)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.rule, rule)
			cfg, err := pgconn.ParseConfig(got)
			require.NoError(t, err, "the result is a connection string pgx reads")
			switch tc.rule {
			case SSLLocal:
				require.Nil(t, cfg.TLSConfig, "local: no TLS")
				require.Empty(t, cfg.Fallbacks, "local: no attempt with TLS")
			case SSLRemote:
				require.NotNil(t, cfg.TLSConfig, "remote: TLS")
				require.False(t, cfg.TLSConfig.InsecureSkipVerify, "remote: the certificate is verified")
				for _, f := range cfg.Fallbacks {
					require.NotNil(t, f.TLSConfig, "remote: no plaintext fallback")
				}
			}
			_, again, err := DefaultSSLMode(got)
			require.NoError(t, err)
			require.Equal(t, SSLExplicit, again, "applying the rule twice changes nothing")
		})
	}

	_, _, err := DefaultSSLMode("host=db.example.com password=hunter2 sslmode='unterminated")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2", "errors never quote the password")
	// A last value that would swallow the setting added (libpq reads "sslmode= sslmode=x" as
	// the value "sslmode=x").
	_, _, err = DefaultSSLMode("host=db.example.com password=hunter2 sslmode=")
	require.ErrorContains(t, err, "add sslmode=verify-full")
	require.NotContains(t, err.Error(), "hunter2")
}

// refusingServer is a server that answers every SSLRequest with 'N', as one without TLS does.
func refusingServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var req [8]byte
			if _, err := io.ReadFull(c, req[:]); err == nil {
				_, _ = c.Write([]byte{'N'})
			}
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// TestExplain: a connection that fails in TLS under the verify-full default says how to choose
// sslmode; other failures (the server answered, the network did not, or the connection was up),
// and sslmodes the user chose, are left as they are.
func TestExplain(t *testing.T) {
	clearSSLEnv(t)
	connect := func(dsn string) error {
		c, err := pgconn.Connect(context.Background(), dsn)
		if err == nil {
			c.Close(context.Background())
		}
		return err
	}
	host, port, _ := net.SplitHostPort(refusingServer(t))
	refused := connect(fmt.Sprintf("host=%s port=%s user=u sslmode=verify-full", host, port))
	require.Error(t, refused)
	got := SSLRemote.Explain(refused)
	require.ErrorIs(t, got, refused)
	require.ErrorContains(t, got, "sslmode=verify-full")
	require.ErrorContains(t, got, "sslmode=require")
	require.Equal(t, refused, SSLExplicit.Explain(refused), "the user chose sslmode")
	require.Equal(t, refused, SSLLocal.Explain(refused))

	free, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := free.Addr().(*net.TCPAddr).Port
	free.Close()
	unreachable := connect(fmt.Sprintf("host=127.0.0.1 port=%d user=u sslmode=verify-full", closed))
	require.Error(t, unreachable)
	for _, err := range []error{
		unreachable, // the network, not TLS
		fmt.Errorf("connect: %w", &pgconn.PgError{Code: "28P01"}), // the server answered: TLS worked
		errors.New("the server ended the replication stream"),     // not a connection failure
		nil,
	} {
		require.Equal(t, err, SSLRemote.Explain(err))
	}
}
