package watermark

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/pgtrust"
	"github.com/tidemark/tidemark/internal/sqlfix"
)

// Transport is how marks reach the change stream.
type Transport string

// The transports.
const (
	// Auto is Messages where the server supports them (PostgreSQL 14 and later), Table before.
	Auto Transport = ""
	// Messages writes each mark as a transactional logical decoding message
	// (pg_logical_emit_message): it writes to no table, so it needs no privilege beyond what
	// PUBLIC has, works in a read-only transaction, and needs no publication membership.
	Messages Transport = "message"
	// Table writes each mark as an upsert of the slot's row in a signal table, which must be in
	// the publication.
	Table Transport = "table"
)

// ParseTransport reads a transport's name: auto (or empty), message or table.
func ParseTransport(s string) (Transport, error) {
	switch s {
	case "", "auto":
		return Auto, nil
	case "message", "messages":
		return Messages, nil
	case "table":
		return Table, nil
	}
	return Auto, fmt.Errorf("watermark transport %q is not one of auto, message, table", s)
}

func (t Transport) String() string {
	if t == Auto {
		return "auto"
	}
	return string(t)
}

// messagesVersion is the first server version whose pgoutput sends logical messages (the
// messages option).
const messagesVersion = 140000

// Resolve returns the transport t stands for on a server of version serverVersion
// (server_version_num): Auto becomes Messages on PostgreSQL 14 and later, Table before.
// Messages on an older server is an error.
func (t Transport) Resolve(serverVersion int) (Transport, error) {
	switch t {
	case Auto:
		if serverVersion >= messagesVersion {
			return Messages, nil
		}
		return Table, nil
	case Messages:
		if serverVersion < messagesVersion {
			return "", fmt.Errorf("%w: watermarks as logical messages need PostgreSQL 14 or later (pgoutput's messages option); this server is %d: use the signal table transport", ErrSetup, serverVersion)
		}
	}
	return t, nil
}

// Prefix is the prefix of every mark written as a logical message. Messages of other prefixes
// are not marks.
const Prefix = "tidemark"

// messageContent is a message mark's content, as JSON.
type messageContent struct {
	Slot  string `json:"slot"`
	Run   string `json:"run"`
	Chunk int64  `json:"chunk"`
	Kind  string `json:"kind"`
}

// emit writes one message mark. Bound parameters: prefix, content.
const emit = `SELECT pg_catalog.pg_logical_emit_message(true, $1, $2)`

// DefaultTable is the signal table used when Config.Table is zero.
var DefaultTable = pgx.Identifier{"public", "tidemark_signal"}

// CreateTable is the signal table's definition; %s is the quoted table name. It holds one row
// per replication slot, updated in place by every mark, so it never grows.
const CreateTable = `CREATE TABLE IF NOT EXISTS %s (
    slot       text PRIMARY KEY,
    run        text NOT NULL,
    chunk      bigint NOT NULL,
    kind       text NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
)`

// upsert writes one mark. Bound parameters: slot, run, chunk, kind.
const upsert = `INSERT INTO %s (slot, run, chunk, kind, written_at) VALUES ($1, $2, $3, $4, now())
ON CONFLICT (slot) DO UPDATE SET run = EXCLUDED.run, chunk = EXCLUDED.chunk, kind = EXCLUDED.kind, written_at = EXCLUDED.written_at`

// Kind is the kind of a mark.
type Kind byte

// The mark kinds.
const (
	Low   Kind = 'L' // opens a chunk's window
	High  Kind = 'H' // closes it
	Fence Kind = 'F' // a commit position to stream up to, written when the stream must catch up
)

func (k Kind) String() string { return string(rune(k)) }

// Mark identifies one watermark: the chunk (or fence) it belongs to and its kind. Marks of
// other slots or other runs are never decoded as a Mark.
type Mark struct {
	ID   int64 // chunk or fence id, unique within the run
	Kind Kind
}

// Config configures a Writer and the recognition of its marks.
type Config struct {
	// Transport is how marks are written: Messages or Table. Auto must be resolved (see
	// Transport.Resolve) before Ensure or New; Decode and DecodeMessage recognize marks of
	// either transport whatever it is.
	Transport Transport
	// Table is the signal table as {schema, table}. Zero: DefaultTable.
	Table pgx.Identifier
	// Slot namespaces the marks: marks written for other slots are ignored. Required.
	Slot string
	// Run namespaces the marks of one process start: marks of earlier runs are ignored. Zero: a
	// random id.
	Run string
	// Publication is the publication the signal table must belong to. Required by Ensure.
	Publication string
	// Timeout bounds a mark write. When it expires the write is cancelled; a cancel that arrives
	// while COMMIT waits for a synchronous standby ends the wait with the mark committed locally
	// (a statement timeout cannot: PostgreSQL disables it before committing), so the write
	// returns. The connection must answer cancelled contexts with a cancel request (see
	// internal/pgconf.CancelOnContext). Zero: 10s.
	Timeout time.Duration
}

// Validate reports every problem of c at once.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Table) != 0 && len(c.Table) != 2 {
		errs = append(errs, fmt.Errorf("signal table %q must be {schema, table}", []string(c.Table)))
	}
	if c.Slot == "" {
		errs = append(errs, errors.New("watermark slot is empty"))
	}
	if c.Timeout < 0 {
		errs = append(errs, errors.New("watermark timeout must not be negative"))
	}
	switch c.Transport {
	case Messages, Table:
	case Auto:
		errs = append(errs, errors.New("watermark transport is not resolved (auto): see Transport.Resolve"))
	default:
		errs = append(errs, fmt.Errorf("watermark transport %q is not one of message, table", string(c.Transport)))
	}
	return errors.Join(errs...)
}

// EnsureDefaults fills the zero fields with their documented defaults.
func (c *Config) EnsureDefaults() {
	if len(c.Table) == 0 {
		c.Table = DefaultTable
	}
	if c.Run == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		c.Run = hex.EncodeToString(b[:])
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
}

// ErrSetup reports a watermark transport that cannot work: a signal table that is missing,
// misshapen, not in the publication, not writable, or not trusted (another owner, triggers,
// rules), or logical messages this role may not write or this server cannot send; with the SQL
// a DBA should run.
var ErrSetup = errors.New("watermarks are not ready")

// Prepared says what Ensure changed on the source: a run that fails before its first
// checkpoint undoes it.
type Prepared struct {
	TableCreated       bool // the signal table was created
	AddedToPublication bool // the signal table was added to the publication
}

// Ensure checks that marks can be written with cfg's transport, and for the Table transport
// prepares the signal table (see ensureTable).
func Ensure(ctx context.Context, conn *pgx.Conn, cfg Config, log zerolog.Logger) (Prepared, error) {
	cfg.EnsureDefaults()
	switch cfg.Transport {
	case Messages:
		return Prepared{}, ensureMessages(ctx, conn)
	case Table:
		var p Prepared
		err := ensureTable(ctx, conn, cfg, log, &p)
		return p, err
	}
	return Prepared{}, cfg.Validate()
}

// emitSignature is the function a message mark calls.
const emitSignature = "pg_catalog.pg_logical_emit_message(boolean, text, text)"

// ensureMessages checks that this role may call pg_logical_emit_message: PUBLIC may by default,
// but a DBA can revoke it.
func ensureMessages(ctx context.Context, conn *pgx.Conn) error {
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT has_function_privilege($1, 'EXECUTE')`, emitSignature).Scan(&ok); err != nil {
		return fmt.Errorf("check the privilege to write logical messages: %w", err)
	}
	if !ok {
		return fmt.Errorf("%w: this role may not call %s, which writes the watermarks; a DBA should run:\n  GRANT EXECUTE ON FUNCTION %s TO %s;\nor use the signal table transport",
			ErrSetup, emitSignature, emitSignature, quoteIdent(conn.Config().User))
	}
	return nil
}

// ensureTable creates the signal table when it is missing and adds it to the publication when it is
// not in it. When the role may not do either, the error prints the exact SQL a DBA should run.
// An existing table is refused when it carries triggers or rules, or is owned by a role other
// than this one or a superuser (see checkTrusted).
func ensureTable(ctx context.Context, conn *pgx.Conn, cfg Config, log zerolog.Logger, p *Prepared) error {
	name := cfg.Table.Sanitize()
	create := fmt.Sprintf(CreateTable, name)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil {
		return fmt.Errorf("look up signal table %s: %w", name, err)
	}
	if !exists {
		// Without IF NOT EXISTS here: a table another session made meanwhile is not this run's.
		if _, err := conn.Exec(ctx, strings.Replace(create, "IF NOT EXISTS ", "", 1)); err != nil && !createdConcurrently(err) {
			if isPrivilege(err) {
				return fmt.Errorf("%w: %s does not exist and this role may not create it (%w); a DBA should run:\n  %s;\n  ALTER TABLE %s OWNER TO %s;",
					ErrSetup, name, err, create, name, quoteIdent(conn.Config().User))
			}
			return fmt.Errorf("create signal table %s: %w", name, err)
		} else if err == nil {
			p.TableCreated = true
		}
		log.Info().Str("table", name).Msg("signal table created")
	}
	// A table of that name that is not ours would make every mark write fail later.
	var cols int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped
		AND attname IN ('slot', 'run', 'chunk', 'kind', 'written_at')`, name).Scan(&cols); err != nil {
		return fmt.Errorf("read signal table %s: %w", name, err)
	}
	if cols != 5 {
		return fmt.Errorf("%w: %s exists but is not a Tidemark signal table (it lacks the columns slot, run, chunk, kind, written_at); choose another signal table name", ErrSetup, name)
	}
	if err := checkTrusted(ctx, conn, name); err != nil {
		return err
	}
	var writable bool
	if err := conn.QueryRow(ctx, `SELECT has_table_privilege($1, 'INSERT, UPDATE')`, name).Scan(&writable); err != nil {
		return fmt.Errorf("check privileges on signal table %s: %w", name, err)
	}
	if !writable {
		return fmt.Errorf("%w: this role may not write to %s; a DBA should run:\n  GRANT SELECT, INSERT, UPDATE ON %s TO %s;",
			ErrSetup, name, name, quoteIdent(conn.Config().User))
	}

	var inPub, pubExists bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
		EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)`,
		cfg.Publication, cfg.Table[0], cfg.Table[1]).Scan(&pubExists, &inPub)
	if err != nil {
		return fmt.Errorf("check publication %q for signal table: %w", cfg.Publication, err)
	}
	if !pubExists {
		return fmt.Errorf("%w: publication %q does not exist; create it with: CREATE PUBLICATION %s FOR TABLE %s, <your tables>;",
			ErrSetup, cfg.Publication, quoteIdent(cfg.Publication), name)
	}
	if inPub {
		return nil
	}
	alter := fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", quoteIdent(cfg.Publication), name)
	if _, err := conn.Exec(ctx, alter); err != nil && !addedConcurrently(err) {
		if isPrivilege(err) {
			return fmt.Errorf("%w: %s is not in publication %q and this role may not add it (%w); a DBA should run:\n  %s;",
				ErrSetup, name, cfg.Publication, err, alter)
		}
		return fmt.Errorf("add signal table to publication %q: %w", cfg.Publication, err)
	} else if err == nil {
		p.AddedToPublication = true // not when another run added it meanwhile
	}
	log.Info().Str("table", name).Str("publication", cfg.Publication).Msg("signal table added to the publication")
	return nil
}

// checkTrusted refuses a signal table that someone other than this role could turn against it
// (pgtrust.Own). Every mark is an INSERT or UPDATE by this role, so a trigger, a rule or a
// policy on the table runs code of its author's choosing with this role's rights (REPLICATION,
// SELECT on the captured tables, or a superuser's), and could also change or forge marks,
// corrupting the backfill. So the table must be this role's own, carrying nothing Tidemark did
// not create; a DBA who creates it for a role that may not gives it to that role (OWNER TO).
func checkTrusted(ctx context.Context, conn *pgx.Conn, name string) error {
	if err := pgtrust.Own(ctx, conn, "signal table", name); err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	return nil
}

// createdConcurrently reports the error of a CREATE TABLE IF NOT EXISTS that raced another
// session creating the same table (two engines starting at once): the table exists now. The
// race shows as a unique violation in the catalog, as the table existing, or as its row type
// existing (42710), depending on where the two creations met.
func createdConcurrently(err error) bool { return pgerr.AlreadyExists(err) }

// addedConcurrently reports the error of adding a table that another session added meanwhile.
func addedConcurrently(err error) bool { return pgerr.DuplicateObject(err) }

func isPrivilege(err error) bool { return pgerr.Privilege(err) }

func quoteIdent(s string) string { return sqlfix.Ident(s) }

// Writer writes marks on a query connection it does not own.
type Writer struct {
	cfg Config
	sql string
}

// New returns a Writer. It writes nothing until Write.
func New(cfg Config) (*Writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.EnsureDefaults()
	w := &Writer{cfg: cfg, sql: emit}
	if cfg.Transport == Table {
		w.sql = fmt.Sprintf(upsert, cfg.Table.Sanitize())
	}
	return w, nil
}

// Config returns the writer's configuration with its defaults, including its run id.
func (w *Writer) Config() Config { return w.cfg }

// Write commits marks (one, or a high mark and the next chunk's low one) in one transaction of
// its own, in their order, on conn, in one round trip, and returns the server's WAL flush
// position read right after the commit in the same round trip: once the stream has passed it
// without showing the marks, they are not coming. The transaction runs with synchronous_commit =
// on: the walsender only sends WAL that is flushed, so on a server running with
// synchronous_commit off a mark would take up to wal_writer_delay (and more) to come back
// through the stream. With a synchronous standby, on also makes the marks wait for it like the
// application's commits, so a mark rarely becomes visible before commits that preceded it (the
// merge's visibility guard catches the rest). An error does not say whether the marks
// committed; the stream decides, and a repeated mark is ignored.
func (w *Writer) Write(ctx context.Context, conn *pgx.Conn, marks ...Mark) (flushed uint64, err error) {
	if len(marks) == 0 {
		return 0, errors.New("write marks: none given")
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = on")
	if w.cfg.Transport == Table {
		// The table is still as it was checked at the start, and stays so until the commit
		// (pgtrust.Guard): no trigger added since runs with this role's rights.
		name := w.cfg.Table.Sanitize()
		b.Queue(pgtrust.LockSQL(name))
		b.Queue(pgtrust.Guard("signal table", name))
		for _, m := range marks {
			b.Queue(w.sql, w.cfg.Slot, w.cfg.Run, m.ID, string(rune(m.Kind)))
		}
	} else {
		for _, m := range marks {
			b.Queue(w.sql, Prefix, w.cfg.MessageContent(m))
		}
	}
	b.Queue("COMMIT")
	var lsn int64
	b.Queue(`SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::int8`).QueryRow(func(row pgx.Row) error { return row.Scan(&lsn) })
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		// Leave no transaction open on the connection for the next statement.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		if w.cfg.Transport == Table {
			// The guard failed, or something else did: a table no longer trusted is the cause to
			// report (a permanent one).
			if terr := checkTrusted(context.WithoutCancel(ctx), conn, w.cfg.Table.Sanitize()); terr != nil {
				return 0, fmt.Errorf("write %s: %w", describe(marks), terr)
			}
		}
		return 0, fmt.Errorf("write %s: %w", describe(marks), err)
	}
	return uint64(lsn), nil
}

// describe names marks for an error: "H mark 4", "H mark 4 and L mark 5".
func describe(marks []Mark) string {
	var parts []string
	for _, m := range marks {
		parts = append(parts, fmt.Sprintf("%v mark %d", m.Kind, m.ID))
	}
	return strings.Join(parts, " and ")
}

// MessageContent is the content of mark m written as a logical message (with Prefix).
func (c Config) MessageContent(m Mark) string {
	b, _ := json.Marshal(messageContent{Slot: c.Slot, Run: c.Run, Chunk: m.ID, Kind: string(rune(m.Kind))})
	return string(b)
}

// DecodeMessage recognizes a mark in a transactional logical message. It reports false for
// messages of other prefixes, slots or runs, and for contents that are not marks.
func (c Config) DecodeMessage(prefix string, content []byte) (Mark, bool) {
	if prefix != Prefix {
		return Mark{}, false
	}
	var mc messageContent
	if err := json.Unmarshal(content, &mc); err != nil || mc.Slot != c.Slot || mc.Run != c.Run || len(mc.Kind) != 1 {
		return Mark{}, false
	}
	switch k := Kind(mc.Kind[0]); k {
	case Low, High, Fence:
		return Mark{ID: mc.Chunk, Kind: k}, true
	}
	return Mark{}, false
}

// IsTable reports whether schema.table is the signal table.
func (c Config) IsTable(schema, table string) bool {
	t := c.Table
	if len(t) == 0 {
		t = DefaultTable
	}
	return len(t) == 2 && t[0] == schema && t[1] == table
}

// Decode recognizes a mark in a row of the signal table, given its column names and text values
// (nil for NULL or an unsent value). It reports false for rows of other slots or other runs, and
// for rows that are not marks.
func (c Config) Decode(cols []string, vals [][]byte) (Mark, bool) {
	var slot, run, chunk, kind []byte
	for i, name := range cols {
		if i >= len(vals) {
			break
		}
		switch name {
		case "slot":
			slot = vals[i]
		case "run":
			run = vals[i]
		case "chunk":
			chunk = vals[i]
		case "kind":
			kind = vals[i]
		}
	}
	if string(slot) != c.Slot || string(run) != c.Run || len(kind) != 1 {
		return Mark{}, false
	}
	id, err := strconv.ParseInt(string(chunk), 10, 64)
	if err != nil {
		return Mark{}, false
	}
	switch k := Kind(kind[0]); k {
	case Low, High, Fence:
		return Mark{ID: id, Kind: k}, true
	}
	return Mark{}, false
}
