// Package pgconf holds the connection facts every Tidemark connection shares: the session settings
// pinned on each connection, the one way to parse a connection string with them, and the
// redaction of connection strings for messages.
//
// # Why the settings are pinned
//
// PostgreSQL's text output of several types depends on session settings: timestamptz on TimeZone,
// date and timestamp on DateStyle, interval on IntervalStyle, float4/float8 on extra_float_digits,
// bytea on bytea_output, money on lc_monetary. The replication connection (pgoutput sends values in
// text form, produced by the walsender with its own session settings) and the query connections
// (chunk SELECTs) must produce the same text for the same stored value, or a key read by the
// backfill would not equal the same key seen in the stream (docs/invariants.md, key identity),
// and a value would have two JSON forms. So every connection sets them in its startup packet,
// before any query runs, whatever the server's or the role's defaults say.
//
// row_security is pinned off, as pg_dump does: a row-level security policy that applies to the
// capture's role must make a chunk read fail, not silently return fewer rows.
// standard_conforming_strings is pinned on: the PostgreSQL sink copies a column's default into
// the target as a string literal, and a target database with it off would read the default's
// backslashes as escapes, giving the target's existing rows another value than the source's.
//
// search_path is pinned to pg_catalog, then pg_temp, as pg_dump does (CVE-2018-1058): a role
// with CREATE on a schema of the default path (public, on databases created before PostgreSQL
// 15) can create there a function or operator whose argument types match a call better than the
// builtin's, and PostgreSQL would then run it, as Tidemark's role, for an unqualified call. With
// only pg_catalog searched (pg_temp last: it is never searched for functions and operators, and
// last for relations), every builtin resolves to itself; every object of Tidemark's or of the
// user's is named schema-qualified; and a comparison of a key whose type lives in another schema
// (citext) names its operator, OPERATOR(schema.op), from the type's default btree operator class
// (chunker.KeyOps), so that it sorts as ORDER BY does.
//
// # How a pin can be lost, and why it cannot here
//
// Setting names are case-insensitive on the server, but the startup parameters are a map on the
// client: a connection string's "timezone" (or the PGTZ environment variable, which pgx maps to
// "timezone") would be sent beside the pinned "TimeZone", in random order, and the last one the
// server reads wins. Pin removes every spelling of a pinned name before setting it, and Parse
// checks on each new connection that the server reports the pinned values (an "options"
// parameter, a role's ALTER ROLE SET or a proxy could still interfere), failing the connection
// with ErrPinned otherwise.
package pgconf

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/tidemark/tidemark/internal/faults"
	"github.com/tidemark/tidemark/internal/sqlfix"
)

// Settings are the session settings pinned on every connection Tidemark opens, with the value the
// server reports for each once it is set.
var Settings = map[string]string{
	"TimeZone":           "UTC",
	"DateStyle":          "ISO, MDY",
	"IntervalStyle":      "iso_8601",
	"extra_float_digits": "3",
	"bytea_output":       "hex",
	"lc_monetary":        "C",
	"client_encoding":    "UTF8",
	"row_security":       "off",
	// Literals the sinks write into SQL (a column's default copied to the target) read a
	// backslash as itself, whatever the target database's default.
	"standard_conforming_strings": "on",
	// Only builtins resolve unqualified names (see the package comment); the text of reg*
	// values is schema-qualified outside pg_catalog, alike on every connection.
	"search_path": SearchPath,
}

// SearchPath is the search_path every connection pins.
const SearchPath = "pg_catalog, pg_temp"

// pinned is Settings without what a test build's control run leaves out (faults.Unpinned).
func pinned() map[string]string {
	if !faults.Unpinned {
		return Settings
	}
	out := maps.Clone(Settings)
	delete(out, "search_path")
	return out
}

// ErrPinned reports a connection on which a pinned setting did not take its value.
var ErrPinned = errors.New("a pinned session setting was overridden")

// Pin sets Settings on cfg, replacing what the connection string or the environment asked for
// under any spelling of the same names, checks them on every connection cfg opens (Verify, before
// any AfterConnect cfg already had), and names the application so that pg_stat_activity shows
// who is connected.
func Pin(cfg *pgconn.Config, application string) {
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	settings := pinned()
	for k := range cfg.RuntimeParams {
		for name := range Settings {
			if strings.EqualFold(k, name) {
				delete(cfg.RuntimeParams, k)
			}
		}
	}
	for k, v := range settings {
		cfg.RuntimeParams[k] = v
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok && application != "" {
		cfg.RuntimeParams["application_name"] = application
	}
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		if err := Verify(ctx, c); err != nil {
			return err
		}
		if after != nil {
			return after(ctx, c)
		}
		return nil
	}
}

// Parse parses a connection string (URL or key=value pairs, with the PG* environment variables
// pgx reads) and pins Settings on it. Errors never contain the password.
func Parse(dsn, application string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, ParseError(err)
	}
	Pin(&cfg.Config, application)
	return cfg, nil
}

// ErrParse reports a connection string that does not parse.
var ErrParse = errors.New("the connection string does not parse")

// ParseError is the error of a connection string that did not parse, with the driver's reason
// and never the string: the driver quotes it, redacting the password it can find, which a
// password with an escaped space defeats (the rest of it would be printed).
func ParseError(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		msg := pe.Error()
		// "cannot parse `STRING`: REASON": keep the reason.
		if i := strings.LastIndex(msg, "`: "); i >= 0 {
			return fmt.Errorf("%w: %s", ErrParse, msg[i+3:])
		}
		return ErrParse
	}
	return fmt.Errorf("%w: %w", ErrParse, err)
}

// ErrNotPinned reports a connection configuration that did not go through Pin: a defect of the
// caller, refused before anything is sent.
var ErrNotPinned = errors.New("connection configuration without the pinned session settings")

// Dial opens a query connection of cfg, which must come from Parse or have gone through Pin
// (ErrNotPinned otherwise): with Connect, Open and DialReplication, the only ways Tidemark opens a
// connection (a test checks that no other package calls pgx or pgconn to connect). Its error is
// pgx's.
func Dial(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	if err := isPinned(&cfg.Config); err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cfg)
}

// DialReplication opens a connection of cfg at the protocol level (a replication connection),
// under the same rule as Dial.
func DialReplication(ctx context.Context, cfg *pgconn.Config) (*pgconn.PgConn, error) {
	if err := isPinned(cfg); err != nil {
		return nil, err
	}
	return pgconn.ConnectConfig(ctx, cfg)
}

func isPinned(cfg *pgconn.Config) error {
	for k, v := range pinned() {
		if cfg.RuntimeParams[k] != v {
			return fmt.Errorf("%w (%s)", ErrNotPinned, k)
		}
	}
	return nil
}

// Connect opens a query connection of cfg (from Parse: its settings pinned and verified). An
// error names the server, database and user, never the password.
func Connect(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := Dial(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", Describe(&cfg.Config), err)
	}
	return conn, nil
}

// Open is Parse, then each option in order on the configuration (nil ones are skipped), then
// Connect: the one way a query connection is opened.
func Open(ctx context.Context, dsn, application string, options ...func(*pgconn.Config)) (*pgx.Conn, error) {
	cfg, err := Parse(dsn, application)
	if err != nil {
		return nil, err
	}
	for _, o := range options {
		if o != nil {
			o(&cfg.Config)
		}
	}
	return Connect(ctx, cfg)
}

// OpenDefaultSSL opens a query connection to dsn as Open does, with the sslmode DefaultSSLMode
// chooses when dsn chooses none (disable for this machine, verify-full elsewhere, never pgx's
// prefer); a failure that choice can have caused says how to make another (SSLRule.Explain).
func OpenDefaultSSL(ctx context.Context, dsn, application string) (*pgx.Conn, error) {
	dsn, rule, err := DefaultSSLMode(dsn)
	if err != nil {
		return nil, err
	}
	conn, err := Open(ctx, dsn, application)
	if err != nil {
		return nil, rule.Explain(err)
	}
	return conn, nil
}

// verifySQL reads every pinned setting in one round trip; it runs on replication connections too
// (replication=database accepts SQL). It names pg_catalog.current_setting: it runs exactly when
// the pin may have been lost (a proxy that drops startup parameters), when an unqualified name
// could resolve to a function another role planted to answer as if nothing had changed.
var verifySQL, verifyNames = func() (string, []string) {
	names := slices.Sorted(maps.Keys(Settings))
	var cols []string
	for _, n := range names {
		cols = append(cols, "pg_catalog.current_setting("+sqlfix.Literal(n)+")")
	}
	return "SELECT " + strings.Join(cols, ", "), names
}()

// Verify checks that the session on c has every pinned setting's value. It uses the simple query
// protocol, the only one a replication connection accepts.
func Verify(ctx context.Context, c *pgconn.PgConn) error {
	results, err := c.Exec(ctx, verifySQL).ReadAll()
	if err != nil {
		return fmt.Errorf("read the session settings: %w", err)
	}
	if len(results) != 1 || len(results[0].Rows) != 1 || len(results[0].Rows[0]) != len(verifyNames) {
		return errors.New("read the session settings: no row")
	}
	row := results[0].Rows[0]
	settings := pinned()
	var bad []string
	for i, name := range verifyNames {
		if _, ok := settings[name]; !ok {
			continue
		}
		if got := string(row[i]); got != Settings[name] {
			bad = append(bad, fmt.Sprintf("%s is %q, not %q", name, got, Settings[name]))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s; Tidemark pins these settings so that both of its paths print values alike: remove them from the connection's options (PGOPTIONS, the options parameter) or from the proxy in between",
			ErrPinned, strings.Join(bad, "; "))
	}
	return nil
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
