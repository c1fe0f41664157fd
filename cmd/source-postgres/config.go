package main

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/internal/secret"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/watermark"
)

//go:embed spec.json
var specJSON []byte

// config is the connector's configuration: every key of Airbyte's source-postgres config, and
// Tidemark's own. Unknown keys are ignored; each key of Airbyte's is honoured, or refused with a
// config error where Tidemark cannot do what it asks (docs/airbyte.md lists them all).
type config struct {
	Host          string   `json:"host"`
	Port          *int     `json:"port"`
	Database      string   `json:"database"`
	Schemas       []string `json:"schemas"`
	Username      string   `json:"username"`
	Password      string   `json:"password"`
	JDBCURLParams string   `json:"jdbc_url_params"`

	SSLMode           *sslMode           `json:"ssl_mode"`
	TunnelMethod      *tunnelMethod      `json:"tunnel_method"`
	ReplicationMethod *replicationMethod `json:"replication_method"`

	// Keys of Airbyte's connector (the legacy ssl flag, the Kotlin version's keys).
	SSL                             *bool  `json:"ssl"`
	EntraServicePrincipalAuth       bool   `json:"entra_service_principal_auth"`
	EntraTenantID                   string `json:"entra_tenant_id"`
	EntraClientID                   string `json:"entra_client_id"`
	CheckpointTargetIntervalSeconds int    `json:"checkpoint_target_interval_seconds"`
	MaxDBConnections                *int   `json:"max_db_connections"`
	CheckPrivileges                 *bool  `json:"check_privileges"`

	// Tidemark's own options.
	CreateReplicationSlot *bool  `json:"create_replication_slot"`
	SignalTable           string `json:"signal_table"`
	BackfillChunkSize     int    `json:"backfill_chunk_size"`
	BackfillReaders       int    `json:"backfill_readers"`
	SyncTimeBudgetSeconds int    `json:"sync_time_budget_seconds"`
	Continuous            bool   `json:"continuous"`
	StateIntervalSeconds  int    `json:"state_interval_seconds"`
	ValueForms            string `json:"value_forms"`
}

type sslMode struct {
	Mode              string `json:"mode"`
	CACertificate     string `json:"ca_certificate"`
	ClientCertificate string `json:"client_certificate"`
	ClientKey         string `json:"client_key"`
	ClientKeyPassword string `json:"client_key_password"`
}

type tunnelMethod struct {
	Method    string `json:"tunnel_method"`
	Host      string `json:"tunnel_host"`
	Port      *int   `json:"tunnel_port"`
	User      string `json:"tunnel_user"`
	SSHKey    string `json:"ssh_key"`
	Password  string `json:"tunnel_user_password"`
	KnownHost string `json:"tunnel_known_host"`
	// AcceptUnknownHostKey trusts the key the jump server presents when tunnel_known_host pins
	// none (it never overrides a pinned or @revoked key). Nothing is remembered between runs.
	AcceptUnknownHostKey bool `json:"tunnel_accept_unknown_host_key"`
	portNumber           int
}

type replicationMethod struct {
	Method                    string `json:"method"`
	Plugin                    string `json:"plugin"`
	ReplicationSlot           string `json:"replication_slot"`
	Publication               string `json:"publication"`
	LSNCommitBehaviour        string `json:"lsn_commit_behaviour"`
	HeartbeatActionQuery      string `json:"heartbeat_action_query"`
	InvalidCDCCursorBehaviour string `json:"invalid_cdc_cursor_position_behavior"`
	InitialLoadTimeoutHours   int    `json:"initial_load_timeout_hours"`
}

// The values of the enumerated options.
const (
	commitWhileReading   = "While reading Data"
	commitAfterLoading   = "After loading Data in the destination"
	invalidCursorFail    = "Fail sync"
	invalidCursorResync  = "Re-sync data"
	defaultStateInterval = 5 * time.Second
)

// configError is a problem with the configuration, the catalog or the state: the user must fix
// it, so the platform does not retry (failure_type config_error).
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

func configErrorf(format string, args ...any) error {
	return &configError{fmt.Errorf(format, args...)}
}

// loadConfig reads and checks the config file, reporting every problem at once.
func loadConfig(path string) (*config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, configErrorf("read the config file: %w", err)
	}
	var c config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, configErrorf("the config file %s is not a valid config: %s", filepath.Base(path), jsonProblem(err))
	}
	if err := c.check(); err != nil {
		return nil, &configError{err}
	}
	return &c, nil
}

// jsonProblem describes a JSON decoding error without quoting the document (it holds secrets).
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		want := "a " + te.Type.String()
		switch te.Type.Kind() {
		case reflect.Int, reflect.Int64:
			// A number too large for an int (or with a fraction) is refused here.
			want = "a whole number within the key's range (docs/airbyte.md)"
		case reflect.String:
			want = "a string"
		case reflect.Bool:
			want = "true or false"
		}
		return fmt.Sprintf("%s must be %s, not a %s", te.Field, want, te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at byte %d", se.Offset)
	}
	return "invalid JSON"
}

// check fills in the defaults and then checks every key, reporting every problem at once.
func (c *config) check() error {
	c.applyDefaults()
	return errors.Join(
		c.checkServer(),
		c.checkSSL(),
		c.checkTunnel(),
		c.checkReplication(),
		c.checkSignalTable(),
		c.checkIntervals(),
		c.checkAirbyteKeys(),
		c.checkJDBCParams(),
		c.checkValueForms(),
	)
}

// applyDefaults fills in every key left out, as Airbyte's connector reads it (the port, the
// schemas, ssl_mode from the legacy ssl flag or require, the Standard method) or as Tidemark's
// defaults are; it also spells the enumerations' aliases in their one form. It reports nothing:
// the checks that follow judge the values, defaults included.
func (c *config) applyDefaults() {
	if c.Port == nil {
		p := 5432
		c.Port = &p
	}
	if len(c.Schemas) == 0 {
		c.Schemas = []string{"public"}
	}
	if c.SSL != nil && c.SSLMode == nil {
		// Airbyte's legacy flag, from before ssl_mode: true asks for TLS, false for none.
		c.SSLMode = &sslMode{Mode: "disable"}
		if *c.SSL {
			c.SSLMode.Mode = "require"
		}
	}
	if c.SSLMode == nil {
		c.SSLMode = &sslMode{Mode: "require"}
	}
	switch c.SSLMode.Mode {
	case "verify_ca":
		c.SSLMode.Mode = "verify-ca"
	case "verify_full":
		c.SSLMode.Mode = "verify-full"
	case "":
		c.SSLMode.Mode = "require"
	}
	if t := c.TunnelMethod; t != nil && (t.Method == "SSH_KEY_AUTH" || t.Method == "SSH_PASSWORD_AUTH") {
		t.portNumber = 22
		if t.Port != nil {
			t.portNumber = *t.Port
		}
	}
	if c.ReplicationMethod == nil {
		// As Airbyte's connector: without a replication method, tables are read with queries.
		c.ReplicationMethod = &replicationMethod{Method: "Standard"}
	}
	r := c.ReplicationMethod
	if r.Method == "" {
		r.Method = "CDC"
	}
	if r.LSNCommitBehaviour == "" {
		r.LSNCommitBehaviour = commitAfterLoading
	}
	if r.InvalidCDCCursorBehaviour == "" {
		r.InvalidCDCCursorBehaviour = invalidCursorFail
	}
	if r.InitialLoadTimeoutHours == 0 {
		r.InitialLoadTimeoutHours = 8
	}
	if c.BackfillChunkSize == 0 {
		c.BackfillChunkSize = merge.DefaultChunkSize
	}
	if c.BackfillReaders == 0 {
		c.BackfillReaders = 1
	}
	if c.ValueForms == "" {
		c.ValueForms = pgjson.Airbyte.String()
	}
}

// checkServer checks what names the server and the role: host, port, database, username.
func (c *config) checkServer() error {
	var errs []error
	if c.Host == "" {
		errs = append(errs, errors.New("host is required"))
	}
	if c.Database == "" {
		errs = append(errs, errors.New("database is required"))
	}
	if c.Username == "" {
		errs = append(errs, errors.New("username is required"))
	}
	if err := inRange("port", *c.Port, 1, 65535, 0); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkSSL checks ssl_mode, its certificates, the legacy ssl flag beside it, and Airbyte Cloud's
// rule that an untunnelled connection is encrypted.
func (c *config) checkSSL() error {
	var errs []error
	switch c.SSLMode.Mode {
	case "disable", "allow", "prefer", "require":
	case "verify-ca", "verify-full":
		if c.SSLMode.CACertificate == "" {
			errs = append(errs, fmt.Errorf("ssl_mode %s needs ca_certificate", c.SSLMode.Mode))
		}
	default:
		errs = append(errs, fmt.Errorf("ssl_mode.mode %q is not one of disable, allow, prefer, require, verify-ca, verify-full", c.SSLMode.Mode))
	}
	if c.SSL != nil && *c.SSL == (c.SSLMode.Mode == "disable") {
		errs = append(errs, fmt.Errorf("ssl is %t but ssl_mode is %s: remove the legacy ssl key, or make the two agree", *c.SSL, c.SSLMode.Mode))
	}
	if (c.SSLMode.ClientCertificate == "") != (c.SSLMode.ClientKey == "") {
		errs = append(errs, errors.New("ssl_mode needs both client_certificate and client_key, or neither"))
	}
	if os.Getenv("DEPLOYMENT_MODE") == "CLOUD" && !c.tunnelled() {
		switch c.SSLMode.Mode {
		case "disable", "allow", "prefer":
			errs = append(errs, fmt.Errorf("ssl_mode %s is not allowed in Airbyte Cloud without an SSH tunnel: use require, verify-ca or verify-full", c.SSLMode.Mode))
		}
	}
	return errors.Join(errs...)
}

// checkTunnel checks tunnel_method: the method, and the keys it needs.
func (c *config) checkTunnel() error {
	t := c.TunnelMethod
	if t == nil {
		return nil
	}
	var errs []error
	switch t.Method {
	case "", "NO_TUNNEL":
	case "SSH_KEY_AUTH", "SSH_PASSWORD_AUTH":
		if t.Host == "" || t.User == "" {
			errs = append(errs, fmt.Errorf("tunnel_method %s needs tunnel_host, tunnel_port and tunnel_user", t.Method))
		}
		if err := inRange("tunnel_port", t.portNumber, 1, 65535, 0); err != nil {
			errs = append(errs, err)
		}
		if t.Method == "SSH_KEY_AUTH" && t.SSHKey == "" {
			errs = append(errs, errors.New("tunnel_method SSH_KEY_AUTH needs ssh_key"))
		}
		if t.Method == "SSH_PASSWORD_AUTH" && t.Password == "" {
			errs = append(errs, errors.New("tunnel_method SSH_PASSWORD_AUTH needs tunnel_user_password"))
		}
	default:
		errs = append(errs, fmt.Errorf("tunnel_method %q is not one of NO_TUNNEL, SSH_KEY_AUTH, SSH_PASSWORD_AUTH", t.Method))
	}
	return errors.Join(errs...)
}

// checkReplication checks replication_method: the method, what CDC needs (slot, publication,
// pgoutput), and the enumerations and range of its other keys.
func (c *config) checkReplication() error {
	var errs []error
	r := c.ReplicationMethod
	switch r.Method {
	case "CDC":
		if r.ReplicationSlot == "" {
			errs = append(errs, errors.New("replication_method CDC needs replication_slot"))
		} else if err := replicator.CheckSlotName(r.ReplicationSlot); err != nil {
			errs = append(errs, fmt.Errorf("replication_method.replication_slot: %w", err))
		}
		if r.Publication == "" {
			errs = append(errs, errors.New("replication_method CDC needs publication"))
		}
		if r.Plugin != "" && r.Plugin != "pgoutput" {
			errs = append(errs, fmt.Errorf("replication_method.plugin %q is not supported: Tidemark decodes pgoutput", r.Plugin))
		}
	case "Standard", "Xmin":
	default:
		errs = append(errs, fmt.Errorf("replication_method.method %q is not one of CDC, Xmin, Standard", r.Method))
	}
	switch r.LSNCommitBehaviour {
	case commitAfterLoading, commitWhileReading:
	default:
		errs = append(errs, fmt.Errorf("lsn_commit_behaviour %q is not one of %q, %q", r.LSNCommitBehaviour, commitWhileReading, commitAfterLoading))
	}
	switch r.InvalidCDCCursorBehaviour {
	case invalidCursorFail, invalidCursorResync:
	default:
		errs = append(errs, fmt.Errorf("invalid_cdc_cursor_position_behavior %q is not one of %q, %q", r.InvalidCDCCursorBehaviour, invalidCursorFail, invalidCursorResync))
	}
	if err := inRange("initial_load_timeout_hours", r.InitialLoadTimeoutHours, 4, 24, 8); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkSignalTable checks signal_table's form (schema.table).
func (c *config) checkSignalTable() error {
	_, err := c.signalTable()
	return err
}

// checkIntervals checks the sizes and durations: backfill_chunk_size, sync_time_budget_seconds,
// and the longest time between two states, under either of its two names.
func (c *config) checkIntervals() error {
	var errs []error
	if err := inRange("backfill_chunk_size", c.BackfillChunkSize, 1, 1_000_000, merge.DefaultChunkSize); err != nil {
		errs = append(errs, err)
	}
	if err := inRange("backfill_readers", c.BackfillReaders, 1, merge.MaxReaders, 1); err != nil {
		errs = append(errs, err)
	}
	if c.SyncTimeBudgetSeconds != 0 {
		if err := inRange("sync_time_budget_seconds", c.SyncTimeBudgetSeconds, 1, 365*24*3600, 0); err != nil {
			errs = append(errs, err)
		}
	}
	if c.StateIntervalSeconds != 0 {
		if err := inRange("state_interval_seconds", c.StateIntervalSeconds, 1, 3600, int(defaultStateInterval/time.Second)); err != nil {
			errs = append(errs, err)
		}
	}
	if c.CheckpointTargetIntervalSeconds != 0 {
		// Airbyte's name for the longest time between two states, with its bound (positive;
		// Airbyte's form fills in 300, so state_interval_seconds, Tidemark's own, wins).
		if err := inRange("checkpoint_target_interval_seconds", c.CheckpointTargetIntervalSeconds, 1, math.MaxInt32, int(defaultStateInterval/time.Second)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkAirbyteKeys checks the keys of Airbyte's connector that Tidemark honours or refuses:
// entra_service_principal_auth (refused) and max_db_connections (at least what the method
// holds).
func (c *config) checkAirbyteKeys() error {
	var errs []error
	if c.EntraServicePrincipalAuth {
		errs = append(errs, errors.New("entra_service_principal_auth: Tidemark does not authenticate as a Microsoft Entra service principal (it fetches no token from Microsoft's identity platform); connect with a database role and its password, and set entra_service_principal_auth to false"))
	}
	if n := c.MaxDBConnections; n != nil {
		need, why := c.connectionsNeeded()
		switch {
		case *n < 1:
			errs = append(errs, fmt.Errorf("max_db_connections %d is out of range: give at least %d, or leave it out", *n, need))
		case *n < need:
			errs = append(errs, fmt.Errorf("max_db_connections %d is too few: %s; give at least %d, or leave it out", *n, why, need))
		}
	}
	return errors.Join(errs...)
}

// checkJDBCParams checks jdbc_url_params' form and the values Tidemark honours.
func (c *config) checkJDBCParams() error {
	_, _, err := c.jdbcParams()
	return err
}

// checkValueForms checks value_forms names a profile.
func (c *config) checkValueForms() error {
	if _, ok := pgjson.Profiles[c.ValueForms]; !ok {
		return fmt.Errorf("value_forms %q is not one of airbyte (the forms of Airbyte's own Postgres source, the default) or exact (Tidemark's exact forms; docs/types.md)", c.ValueForms)
	}
	return nil
}

// inRange reports a numeric key whose value v is outside [lo, hi], naming the key and its range
// (and the default that 0 stands for, when def is not 0). The ranges are the spec's (a test
// holds them equal), and keep every duration made from a key far below time.Duration's limit,
// which a product such as n * time.Second would otherwise overflow into a negative or wrong
// duration without a word.
func inRange(key string, v, lo, hi, def int) error {
	if v >= lo && v <= hi {
		return nil
	}
	if def != 0 {
		return fmt.Errorf("%s %d is out of range: give %d to %d, or leave it out for the default (%d)", key, v, lo, hi, def)
	}
	return fmt.Errorf("%s %d is out of range: give %d to %d", key, v, lo, hi)
}

func (c *config) cdc() bool { return c.ReplicationMethod.Method == "CDC" }

// profile is the value forms' profile: value_forms, Airbyte's by default.
func (c *config) profile() pgjson.Profile {
	if p, ok := pgjson.Profiles[c.ValueForms]; ok {
		return p
	}
	return pgjson.Airbyte
}

func (c *config) tunnelled() bool {
	return c.TunnelMethod != nil && c.TunnelMethod.Method != "" && c.TunnelMethod.Method != "NO_TUNNEL"
}

// createSlot reports whether a read creates a missing slot: only when asked, as Airbyte's
// connector never creates one (its setup guide has the DBA create it).
func (c *config) createSlot() bool { return c.CreateReplicationSlot != nil && *c.CreateReplicationSlot }

// connectionsNeeded is the most connections a read holds open at once, and why.
func (c *config) connectionsNeeded() (int, string) {
	if !c.cdc() {
		return 1, "a " + c.ReplicationMethod.Method + " read uses one connection"
	}
	// Its queries, the replication stream, and one per backfill reader (backfill_readers).
	n, chunks := 2+c.BackfillReaders, "the backfill's chunks"
	if c.BackfillReaders > 1 {
		chunks = fmt.Sprintf("the chunks of its %d backfill readers", c.BackfillReaders)
	}
	if c.ReplicationMethod.HeartbeatActionQuery != "" {
		return n + 1, fmt.Sprintf("a CDC read holds %d connections at once (its queries, %s, the replication stream, and heartbeat_action_query's)", n+1, chunks)
	}
	return n, fmt.Sprintf("a CDC read holds %d connections at once (its queries, %s and the replication stream)", n, chunks)
}

// signalTable is the signal table of the table transport: signal_table, or the default.
func (c *config) signalTable() (pgx.Identifier, error) {
	if c.SignalTable == "" {
		return watermark.DefaultTable, nil
	}
	schema, table, ok := strings.Cut(c.SignalTable, ".")
	if !ok || schema == "" || table == "" || strings.Contains(table, ".") {
		return nil, fmt.Errorf("signal_table %q must be schema.table", c.SignalTable)
	}
	return pgx.Identifier{schema, table}, nil
}

// watermarks is the watermark transport: the signal table when signal_table is set, logical
// messages otherwise where the server supports them (which need no privilege beyond Airbyte's
// read-only role's).
func (c *config) watermarks() watermark.Transport {
	if c.SignalTable != "" {
		return watermark.Table
	}
	return watermark.Auto
}

// budget is the longest a read runs.
func (c *config) budget() time.Duration {
	if c.SyncTimeBudgetSeconds > 0 {
		return time.Duration(c.SyncTimeBudgetSeconds) * time.Second
	}
	return time.Duration(c.ReplicationMethod.InitialLoadTimeoutHours) * time.Hour
}

func (c *config) stateInterval() time.Duration {
	if c.StateIntervalSeconds > 0 {
		return time.Duration(c.StateIntervalSeconds) * time.Second
	}
	if c.CheckpointTargetIntervalSeconds > 0 {
		return time.Duration(c.CheckpointTargetIntervalSeconds) * time.Second
	}
	return defaultStateInterval
}

// jdbcParams maps the JDBC URL parameters Tidemark honours to libpq settings; the others are
// returned by name, to be logged as ignored.
func (c *config) jdbcParams() (map[string]string, []string, error) {
	out := map[string]string{}
	var ignored []string
	if strings.TrimSpace(c.JDBCURLParams) == "" {
		return out, nil, nil
	}
	for _, part := range strings.Split(c.JDBCURLParams, "&") {
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return nil, nil, fmt.Errorf("jdbc_url_params: %q is not key=value (pairs are separated by &)", k)
		}
		if uv, err := url.QueryUnescape(v); err == nil {
			v = uv
		}
		switch strings.ToLower(k) {
		case "connecttimeout", "connect_timeout":
			// libpq's connect_timeout, in seconds: pgx multiplies it into a time.Duration.
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 3600 {
				return nil, nil, fmt.Errorf("jdbc_url_params: connectTimeout %q is not a number of seconds from 0 (no limit) to 3600", v)
			}
			out["connect_timeout"] = v
		case "applicationname", "application_name":
			out["application_name"] = v
		case "options":
			out["options"] = v
		case "tcpkeepalive":
		case "user", "password", "ssl", "sslmode", "currentschema":
			// Overwritten by the config's own fields, as Airbyte's connector does.
		default:
			ignored = append(ignored, k)
		}
	}
	return out, ignored, nil
}

// dsn builds the libpq connection string: sslmode, never certificate files (the certificates
// and key given inline are applied to the parsed configuration, inlineTLS). The password is in
// the string, which is never printed (pgconf.Describe leaves it out).
func (c *config) dsn() (string, error) {
	params, _, err := c.jdbcParams()
	if err != nil {
		return "", err
	}
	kv := map[string]string{
		"host": c.Host, "port": strconv.Itoa(*c.Port), "dbname": c.Database, "user": c.Username,
		"sslmode": c.SSLMode.Mode, "connect_timeout": "60",
	}
	if c.Password != "" {
		kv["password"] = c.Password
	}
	for k, v := range params {
		kv[k] = v
	}
	var b strings.Builder
	for _, k := range []string{"host", "port", "dbname", "user", "password", "sslmode", "connect_timeout", "application_name", "options"} {
		v, ok := kv[k]
		if !ok {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(quoteDSN(v))
	}
	return b.String(), nil
}

// quoteDSN quotes a libpq key=value connection string value.
func quoteDSN(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// describe names the source for messages: user, host, port and database, never the password.
func (c *config) describe() string {
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d dbname=%s user=%s sslmode=disable", quoteDSN(c.Host), *c.Port, quoteDSN(c.Database), quoteDSN(c.Username)))
	if err != nil {
		return fmt.Sprintf("%s:%d/%s", c.Host, *c.Port, c.Database)
	}
	return pgconf.Describe(&cfg.Config)
}

// secrets are the config's secret values, for scrubbing them from any text that leaves the
// process.
func (c *config) secrets() []string {
	var s []string
	add := func(v string) {
		if len(v) >= 4 {
			s = append(s, v)
		}
	}
	add(c.Password)
	add(c.EntraTenantID)
	if c.SSLMode != nil {
		add(c.SSLMode.ClientKey)
		add(c.SSLMode.ClientKeyPassword)
	}
	if c.TunnelMethod != nil {
		add(c.TunnelMethod.SSHKey)
		add(c.TunnelMethod.Password)
	}
	return s
}

// configSecrets reads the secrets of a config file however broken the file is (not JSON, or a
// config that does not validate): every string under a key that names a secret, at any depth,
// so that no message about the file shows one.
func configSecrets(path string) []string {
	b, err := readBounded(path, maxStateFile)
	if err != nil {
		return nil
	}
	var v any
	if json.Unmarshal(b, &v) != nil {
		return nil
	}
	var out []string
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(k, e)
			}
		case []any:
			for _, e := range x {
				walk(key, e)
			}
		case string:
			k := strings.ToLower(key)
			if strings.Contains(k, "password") || strings.Contains(k, "key") || strings.Contains(k, "secret") || strings.Contains(k, "token") {
				out = append(out, x)
			}
			if k == "jdbc_url_params" {
				out = append(out, secret.FromDSN(strings.ReplaceAll(x, "&", " "))...)
			}
		}
	}
	walk("", v)
	return out
}
