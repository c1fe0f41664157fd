package e2e

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/internal/pgserver"
)

// The server launcher lives in internal/pgserver, which the product links (demo, bench, chaos);
// these names let the tests keep writing e2e.Server, e2e.Start and so on.

type (
	// Server is pgserver.Server.
	Server = pgserver.Server
	// Options is pgserver.Options.
	Options = pgserver.Options
	// Kind is pgserver.Kind.
	Kind = pgserver.Kind
)

// The kinds of Server (pgserver's).
const (
	Local     = pgserver.Local
	External  = pgserver.External
	Container = pgserver.Container
)

// ErrUnsupported is pgserver.ErrUnsupported.
var ErrUnsupported = pgserver.ErrUnsupported

// Start is pgserver.Start: a throwaway local cluster from the installed server binaries.
func Start(ctx context.Context, opts Options) (*Server, error) { return pgserver.Start(ctx, opts) }

// Connect is pgserver.Connect: the external server that dsn names.
func Connect(ctx context.Context, dsn string, log zerolog.Logger) (*Server, error) {
	return pgserver.Connect(ctx, dsn, log)
}

// FindBinDir is pgserver.FindBinDir.
func FindBinDir() (string, error) { return pgserver.FindBinDir() }

// DSN is pgserver.DSN.
func DSN(host string, port int, user, password, db string) string {
	return pgserver.DSN(host, port, user, password, db)
}
