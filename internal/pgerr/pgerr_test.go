package pgerr

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestClassification(t *testing.T) {
	wrap := func(code string) error { return fmt.Errorf("context: %w", &pgconn.PgError{Code: code}) }
	for _, tc := range []struct {
		code             string
		mustAct, transit bool
	}{
		{"28P01", true, false}, {"28000", true, false}, {"42501", true, false}, {"3D000", true, false},
		{"42P01", true, false}, {"42704", true, false},
		{"08006", false, true}, {"57P01", false, true}, {"53300", false, true}, {"40001", false, true},
		{"40P01", false, true}, {"55P03", false, true},
		{"XX000", false, false}, {"23505", false, false},
	} {
		err := wrap(tc.code)
		if UserMustAct(err) != tc.mustAct || Transient(err) != tc.transit {
			t.Errorf("%s: UserMustAct %v, Transient %v; want %v, %v", tc.code, UserMustAct(err), Transient(err), tc.mustAct, tc.transit)
		}
	}
	plain := errors.New("not from the server")
	if Code(plain) != "" || Transient(plain) || UserMustAct(plain) || AlreadyExists(plain) {
		t.Error("an error without SQLSTATE is classified")
	}
	for _, c := range []string{"42P07", "42710", "23505"} {
		if !AlreadyExists(wrap(c)) {
			t.Errorf("%s: not AlreadyExists", c)
		}
	}
	if !Canceled(wrap("57014")) || !Privilege(wrap("42501")) || !UndefinedTable(wrap("42P01")) || !UniqueViolation(wrap("23505")) {
		t.Error("a named predicate misses its code")
	}
}

// TestReconnectable: what a new connection may not meet is reconnectable; a name that no longer
// resolves, a refused certificate, and every error a person must act on are not.
func TestReconnectable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{io.EOF, true},
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "42501"}, false},
		{&pgconn.PgError{Code: "53400"}, false},
		{&net.DNSError{Err: "no such host", Name: "db.example", IsNotFound: true}, false},
		{fmt.Errorf("tls: %w", x509.UnknownAuthorityError{}), false},
		{fmt.Errorf("tls: %w", x509.HostnameError{Host: "db"}), false},
		{errors.New("a stop of the engine's own"), false},
	} {
		require.Equal(t, c.want, Reconnectable(c.err), "%v", c.err)
	}
}
