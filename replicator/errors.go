package replicator

import (
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"

	"github.com/tidemark/tidemark/internal/pgerr"
)

// Errors callers branch on. Each is wrapped with a message that names the object and the fix.
var (
	ErrSlotMissing        = errors.New("replication slot does not exist")
	ErrSlotInUse          = errors.New("replication slot is in use")
	ErrSlotLost           = errors.New("replication slot is invalidated")
	ErrSlotMismatch       = errors.New("replication slot does not fit")
	ErrSlotsFull          = errors.New("all replication slots are in use")
	ErrPublicationMissing = errors.New("publication does not exist")
	ErrPublication        = errors.New("publication does not publish every change")
	ErrWalLevel           = errors.New("wal_level is not logical")
	ErrServerVersion      = errors.New("server version is not supported")
	ErrTimeout            = fmt.Errorf("replication connection timed out: %w", pgerr.ErrTimeout)
	// ErrLeftBehind: a run could not drop the slot or publication it created (Stream.Undo).
	ErrLeftBehind = errors.New("what this run created is left on the source")
)

// connectError wraps a connection failure with what to do about it. PostgreSQL's own message
// stays in the chain (with its SQLSTATE) for callers that classify errors.
func connectError(what string, user string, err error) error {
	hint := ""
	switch pgerr.Code(err) {
	case pgerrcode.InvalidPassword:
		hint = "; check the user name and password"
	case pgerrcode.InvalidAuthorizationSpecification:
		hint = fmt.Sprintf("; the server's pg_hba.conf must allow user %q, for replication connections too"+
			" (for example: host replication %s 0.0.0.0/0 scram-sha-256, then SELECT pg_reload_conf())", user, user)
	case pgerrcode.InsufficientPrivilege:
		hint = fmt.Sprintf("; grant the REPLICATION attribute: ALTER ROLE %s WITH REPLICATION;"+
			" on Amazon RDS or Aurora: GRANT rds_replication TO %s;", quoteIdent(user), quoteIdent(user))
	case pgerrcode.InvalidCatalogName:
		hint = "; check the database name"
	case pgerrcode.TooManyConnections:
		hint = "; the server has no free connection slots (max_connections, or max_wal_senders for replication connections)"
	}
	return fmt.Errorf("connect to %s: %w%s", what, err, hint)
}
