package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/cmd/internal/preflight"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/sqlfix"
)

// source is one run of the connector against the configured database.
type source struct {
	cfg *config
	out *output
	log zerolog.Logger
	dsn string     // the connection string (with the password: never printed)
	tun *tunnel    // nil without an SSH tunnel
	tls *inlineTLS // certificates and key given inline, applied to every connection's TLS
}

// newSource prepares the connection: the certificates given inline (kept in memory: nothing is
// written anywhere, so the connector runs with no writable directory), the SSH tunnel when
// configured.
func newSource(ctx context.Context, cfg *config, out *output, log zerolog.Logger) (*source, error) {
	s := &source{cfg: cfg, out: out, log: log}
	var err error
	if s.dsn, err = cfg.dsn(); err != nil {
		s.close()
		return nil, err
	}
	if s.tls, err = cfg.inlineTLS(); err != nil {
		s.close()
		return nil, err
	}
	_, ignored, _ := cfg.jdbcParams()
	if len(ignored) > 0 {
		log.Warn().Strs("params", ignored).Msg("jdbc_url_params not used by Tidemark")
	}
	if cfg.EntraTenantID != "" || cfg.EntraClientID != "" {
		log.Warn().Msg("entra_tenant_id and entra_client_id have no effect without entra_service_principal_auth (as in Airbyte's connector)")
	}
	if cfg.tunnelled() {
		if s.tun, err = openTunnel(ctx, cfg.TunnelMethod, log); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

func (s *source) close() {
	if s.tun != nil {
		_ = s.tun.Close()
	}
}

// configure adjusts a connection to the source: the SSH tunnel's dialer, the inline
// certificates and key.
func (s *source) configure(c *pgconn.Config) {
	if s.tun != nil {
		s.tun.configure(c)
	}
	s.tls.apply(c)
}

// connConfig is the configuration of a query connection, with Tidemark's pinned settings.
func (s *source) connConfig() (*pgx.ConnConfig, error) {
	c, err := pgconf.Parse(s.dsn, "tidemark-airbyte")
	if err != nil {
		return nil, configErrorf("the connection settings are not valid: %v", err)
	}
	pgconf.CancelOnContext(&c.Config)
	s.configure(&c.Config)
	return c, nil
}

// connect opens a query connection.
func (s *source) connect(ctx context.Context) (*pgx.Conn, error) {
	c, err := s.connConfig()
	if err != nil {
		return nil, err
	}
	conn, err := pgconf.Dial(ctx, c)
	if err != nil {
		return nil, connectError(s.cfg, err)
	}
	return conn, nil
}

// connectError describes a failed connection with what to do, and makes authentication problems
// config errors.
func connectError(cfg *config, err error) error {
	what := "connect to " + cfg.describe()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case pgerrcode.InvalidPassword:
			return configErrorf("%s: the password or user name is wrong (%s)", what, pgErr.Message)
		case pgerrcode.InvalidAuthorizationSpecification:
			return configErrorf("%s: the server refused the connection (%s); the server's pg_hba.conf must allow this user from this address, with the ssl_mode used", what, pgErr.Message)
		case pgerrcode.InvalidCatalogName:
			return configErrorf("%s: the database does not exist (%s)", what, pgErr.Message)
		}
	}
	msg := err.Error()
	if strings.Contains(msg, "tls:") || strings.Contains(msg, "x509:") || strings.Contains(msg, "server refused TLS") {
		return configErrorf("%s: TLS failed (%s); check ssl_mode and its certificates", what, lastCause(err))
	}
	return fmt.Errorf("%s: %w", what, err)
}

// lastCause is the innermost message of err.
func lastCause(err error) string {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err.Error()
		}
		err = u
	}
}

// check tests the connection and every prerequisite of a read, and returns one error listing
// every problem with its fix.
func (s *source) check(ctx context.Context) error {
	c, err := s.connConfig()
	if err != nil {
		return err
	}
	conn, err := pgconf.Dial(ctx, c)
	if err != nil {
		return connectError(s.cfg, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if !s.cfg.cdc() {
		return s.checkQueries(ctx, conn)
	}
	rm := s.cfg.ReplicationMethod
	tables, err := s.publishedTables(ctx, conn)
	if err != nil {
		return err
	}
	sig, _ := s.cfg.signalTable()
	findings := preflight.Check(ctx, c, preflight.Options{
		Slot: rm.ReplicationSlot, Publication: rm.Publication, Tables: tables, CreateSlot: s.cfg.createSlot(),
		Watermarks: s.cfg.watermarks(), SignalTable: sig,
	})
	// Warnings (a slot nobody streams from, retaining WAL) are logged: the check still passes.
	for _, f := range findings {
		if f.Warn {
			s.log.Warn().Strs("fix", f.Fix).Msg(f.What)
		}
	}
	problems := preflight.Problems(findings)
	if q := rm.HeartbeatActionQuery; q != "" {
		if err := heartbeatPlan(ctx, conn, q); err != nil {
			problems = append(problems, preflight.Finding{What: err.Error()})
		}
	}
	if len(problems) == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d problem(s) found on %s:", len(problems), s.cfg.describe())
	for i, p := range problems {
		fmt.Fprintf(&b, " (%d) %s", i+1, p.What)
		if len(p.Fix) > 0 {
			fmt.Fprintf(&b, "; fix: %s", strings.Join(p.Fix, " "))
		}
	}
	return &configError{errors.New(b.String())}
}

// heartbeatPlan checks that the heartbeat_action_query names what it uses so that it resolves
// on Tidemark's connections, whose search_path is pg_catalog only (internal/pgconf): it
// prepares the query (an unnamed statement: parsed and analysed, run never, and one statement
// only, where EXPLAIN of a string of two would run the second) and reports a table, function or
// type it cannot find with the fix. Other failures are left to the read, which logs them as
// Airbyte's connector does.
func heartbeatPlan(ctx context.Context, conn *pgx.Conn, q string) error {
	_, err := conn.PgConn().Prepare(ctx, "", q, nil)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.UndefinedTable || pgErr.Code == pgerrcode.UndefinedFunction || pgErr.Code == pgerrcode.UndefinedObject) {
		return fmt.Errorf("heartbeat_action_query cannot run: %s; Tidemark runs it with search_path = %s, so that no other role's function can take the place of a builtin (docs/security.md): name its tables, and any function or type of your own, with their schema, such as INSERT INTO public.airbyte_heartbeat (...) VALUES (...)", pgErr.Message, pgconf.SearchPath)
	}
	return nil
}

// checkQueries checks what a Standard or Xmin read needs: a server Tidemark supports, and SELECT
// on tables or views of the configured schemas (no slot, publication or REPLICATION).
func (s *source) checkQueries(ctx context.Context, conn *pgx.Conn) error {
	var problems []string
	var version int
	var user string
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_user`).Scan(&version, &user); err != nil {
		return fmt.Errorf("read the server version: %w", err)
	}
	if version < 130000 {
		problems = append(problems, fmt.Sprintf("PostgreSQL %d: Tidemark needs PostgreSQL 13 or later", version))
	}
	readable := 0
	for _, schema := range s.cfg.Schemas {
		var exists, usage bool
		var n int
		err := conn.QueryRow(ctx, `
			SELECT n.oid IS NOT NULL, coalesce(has_schema_privilege(n.oid, 'USAGE'), false),
			       (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
			          AND has_table_privilege(c.oid, 'SELECT'))
			FROM (SELECT $1::text AS name) q LEFT JOIN pg_namespace n ON n.nspname = q.name`, schema).Scan(&exists, &usage, &n)
		if err != nil {
			return fmt.Errorf("check schema %q: %w", schema, err)
		}
		switch {
		case !exists:
			problems = append(problems, fmt.Sprintf("schema %q does not exist; fix: correct schemas in the config", schema))
		case !usage:
			problems = append(problems, fmt.Sprintf("role %q may not use schema %q; fix: %s", user, schema, sqlfix.GrantUsage(schema, user)))
		default:
			readable += n
		}
	}
	if readable == 0 && len(problems) == 0 {
		var grants []string
		for _, schema := range s.cfg.Schemas {
			grants = append(grants, sqlfix.GrantSelectAll(schema, user))
		}
		problems = append(problems, fmt.Sprintf("role %q may read no table or view in schemas %s; fix: %s", user, strings.Join(s.cfg.Schemas, ", "), strings.Join(grants, " ")))
	}
	if len(problems) == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d problem(s) found on %s:", len(problems), s.cfg.describe())
	for i, p := range problems {
		fmt.Fprintf(&b, " (%d) %s", i+1, p)
	}
	return &configError{errors.New(b.String())}
}

// publishedTables lists the publication's tables within the configured schemas (none when the
// publication does not exist: preflight reports that).
func (s *source) publishedTables(ctx context.Context, conn *pgx.Conn) ([]pgx.Identifier, error) {
	rows, err := conn.Query(ctx, `SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1 AND schemaname = ANY($2) ORDER BY 1, 2`,
		s.cfg.ReplicationMethod.Publication, s.cfg.Schemas)
	if err != nil {
		return nil, fmt.Errorf("list the publication's tables: %w", err)
	}
	var out []pgx.Identifier
	sig, _ := s.cfg.signalTable()
	for rows.Next() {
		var schema, table string
		if err := rows.Scan(&schema, &table); err != nil {
			return nil, err
		}
		if schema == sig[0] && table == sig[1] {
			continue
		}
		out = append(out, pgx.Identifier{schema, table})
	}
	return out, rows.Err()
}
