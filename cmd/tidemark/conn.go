package main

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/pgconf"
)

// connectPinned opens a query connection with the pinned session settings. A connection string
// that sets no sslmode gets the one of pgconf.DefaultSSLMode (disable for this machine,
// verify-full elsewhere), never pgx's prefer, and a failure of that choice says how to make
// another.
func connectPinned(ctx context.Context, dsn string) (*pgx.Conn, error) {
	dsn, rule, err := pgconf.DefaultSSLMode(dsn)
	if err != nil {
		return nil, err
	}
	cfg, err := pgconf.Parse(dsn, "tidemark")
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, rule.Explain(fmt.Errorf("connect to %s: %w", pgconf.Describe(&cfg.Config), err))
	}
	return conn, nil
}

// envTarget is $TIDEMARK_TARGET when it is a PostgreSQL connection string: the default target
// of the commands that read a sync's PostgreSQL target, so that its password need not be in the
// process's arguments.
func envTarget() string {
	if t := os.Getenv("TIDEMARK_TARGET"); isDSN(t) {
		return t
	}
	return ""
}
