// Package pgerr classifies PostgreSQL errors by their SQLSTATE, named with jackc/pgerrcode's
// constants, in one place for both binaries and the engine. Nothing here matches an error's
// text: a message can change with the server's version or language (lc_messages), its code
// cannot.
package pgerr

import (
	"crypto/x509"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// Code returns the SQLSTATE of the PostgreSQL error in err's chain, or "" when there is none.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Is reports whether err carries one of the SQLSTATEs codes.
func Is(err error, codes ...string) bool {
	c := Code(err)
	if c == "" {
		return false
	}
	for _, want := range codes {
		if c == want {
			return true
		}
	}
	return false
}

// Privilege reports a missing privilege (42501).
func Privilege(err error) bool { return Is(err, pgerrcode.InsufficientPrivilege) }

// UndefinedTable reports a table that does not exist (42P01): dropped or renamed.
func UndefinedTable(err error) bool { return Is(err, pgerrcode.UndefinedTable) }

// AlreadyExists reports a CREATE of something that exists: a table (42P07), another object
// (42710, also a table's row type when two sessions create the same table at once), or a row
// of the catalog (23505, the same race met in a unique index).
func AlreadyExists(err error) bool {
	return Is(err, pgerrcode.DuplicateTable, pgerrcode.DuplicateObject, pgerrcode.UniqueViolation)
}

// DuplicateObject reports an object that exists already (42710), such as a table already in a
// publication.
func DuplicateObject(err error) bool { return Is(err, pgerrcode.DuplicateObject) }

// UniqueViolation reports a duplicate key (23505).
func UniqueViolation(err error) bool { return Is(err, pgerrcode.UniqueViolation) }

// Canceled reports a statement cancelled by a statement timeout or a cancel request (57014).
func Canceled(err error) bool { return Is(err, pgerrcode.QueryCanceled) }

// BadPassword reports a failed password authentication (28P01).
func BadPassword(err error) bool { return Is(err, pgerrcode.InvalidPassword) }

// Refused reports a connection pg_hba.conf refused, or a role that may not log in (28000).
func Refused(err error) bool { return Is(err, pgerrcode.InvalidAuthorizationSpecification) }

// NoDatabase reports a database that does not exist (3D000).
func NoDatabase(err error) bool { return Is(err, pgerrcode.InvalidCatalogName) }

// TooManyConnections reports a server at max_connections (53300).
func TooManyConnections(err error) bool { return Is(err, pgerrcode.TooManyConnections) }

// UserMustAct reports errors a retry cannot fix: authentication, authorization, a missing
// database or object.
func UserMustAct(err error) bool {
	return Is(err, pgerrcode.InvalidPassword, pgerrcode.InvalidAuthorizationSpecification, pgerrcode.InsufficientPrivilege,
		pgerrcode.InvalidCatalogName, pgerrcode.UndefinedTable, pgerrcode.UndefinedObject)
}

// Transient reports errors the next attempt may well not meet: connection exceptions (class
// 08), operator intervention such as a shutdown (57), insufficient resources (53), serialization
// failures, deadlocks and lock timeouts.
func Transient(err error) bool {
	c := Code(err)
	if c == "" {
		return false
	}
	return pgerrcode.IsConnectionException(c) || pgerrcode.IsOperatorIntervention(c) || pgerrcode.IsInsufficientResources(c) ||
		c == pgerrcode.SerializationFailure || c == pgerrcode.DeadlockDetected || c == pgerrcode.LockNotAvailable
}

// Reconnectable reports a lost connection that a new one may well not meet: the connection
// broke or was refused (a restart, a failover, a network fault: no SQLSTATE, or class 08), the
// server ended the session (57P01 admin shutdown, 57P02 crash shutdown, 57P03 starting up or
// shutting down), or a replication connection timed out. A run that meets one starts again from
// its last checkpoint. Not reconnectable: every error a person must act on (a privilege, a
// missing object, all slots in use: 53400), and every stop of the engine's own.
func Reconnectable(err error) bool {
	if err == nil {
		return false
	}
	if c := Code(err); c != "" {
		return pgerrcode.IsConnectionException(c) || c == pgerrcode.AdminShutdown || c == pgerrcode.CrashShutdown || c == pgerrcode.CannotConnectNow
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, ErrTimeout) {
		return true
	}
	// A name that no longer resolves, or a certificate refused, is a configuration to fix.
	var dns *net.DNSError
	if errors.As(err, &dns) && dns.IsNotFound {
		return false
	}
	var unknownCA x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	if errors.As(err, &unknownCA) || errors.As(err, &invalid) || errors.As(err, &host) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}

// ErrTimeout marks a connection the server stopped answering on (replication keepalives).
var ErrTimeout = errors.New("connection timed out")
