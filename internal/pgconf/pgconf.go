// Package pgconf holds the connection facts every Tidemark connection shares: the session settings
// pinned on each connection, and the redaction of connection strings for messages.
//
// # Why the settings are pinned
//
// PostgreSQL's text output of several types depends on session settings: timestamptz on TimeZone,
// date and timestamp on DateStyle, interval on IntervalStyle, float4/float8 on extra_float_digits,
// bytea on bytea_output, money on lc_monetary. The replication connection (pgoutput sends values in
// text form, produced by the walsender with its own session settings) and the query connections
// (chunk SELECTs) must produce the same text for the same stored value, or a key read by the
// backfill would not equal the same key seen in the stream (invariant I9 of the algorithm
// reference), and a value would have two JSON forms. So every connection sets them in its startup
// packet, before any query runs, whatever the server's or the role's defaults say.
package pgconf

import (
	"bufio"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Settings are the session settings pinned on every connection Tidemark opens.
var Settings = map[string]string{
	"TimeZone":           "UTC",
	"DateStyle":          "ISO, MDY",
	"IntervalStyle":      "iso_8601",
	"extra_float_digits": "3",
	"bytea_output":       "hex",
	"lc_monetary":        "C",
	"client_encoding":    "UTF8",
}

// Pin sets Settings on cfg, overriding what the connection string asked for, and names the
// application so that pg_stat_activity shows who is connected.
func Pin(cfg *pgconn.Config, application string) {
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	for k, v := range Settings {
		cfg.RuntimeParams[k] = v
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok && application != "" {
		cfg.RuntimeParams["application_name"] = application
	}
}

// CancelOnContext makes a query connection answer a cancelled context by sending PostgreSQL a
// cancel request, and keep the connection, instead of closing it (pgx's default). It matters for
// a commit waiting for a synchronous standby: no statement timeout applies there, but a cancel
// ends the wait (the commit stands, with a warning), so a context deadline bounds the wait.
// DeadlineDelay is how long the server has to answer before the connection is closed anyway.
func CancelOnContext(cfg *pgconn.Config) {
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 10 * time.Second}
	}
}

// LargeReads makes the connection read from its socket in pieces of up to 256 KiB instead of
// pgx's 8 KiB: a chunk read streams megabytes, and each read is a system call.
func LargeReads(cfg *pgconn.Config) {
	cfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		return pgproto3.NewFrontend(bufio.NewReaderSize(r, 256<<10), w)
	}
}

// Describe names the server, database and user of cfg for messages and logs. It never includes the
// password or any other part of the connection string.
func Describe(cfg *pgconn.Config) string {
	return fmt.Sprintf("database %q on %s:%d as user %q", cfg.Database, cfg.Host, cfg.Port, cfg.User)
}
