// Package preflight checks, all at once, everything a capture needs on the source: settings,
// privileges, slot, publication, tables and the watermark transport, each problem with the SQL or setting
// that fixes it (and its managed-cloud variants). tidemark doctor prints the findings; the
// Airbyte connector's check reports them.
package preflight

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/pgtrust"
	"github.com/tidemark/tidemark/internal/sqlfix"
	"github.com/tidemark/tidemark/watermark"
)

// Finding is one check: passed, a problem (with its fix), or a warning.
type Finding struct {
	OK, Warn bool
	What     string   // what was found
	Fix      []string // the SQL or setting that fixes a problem, one line each
}

// Options says what a capture will use.
type Options struct {
	Slot        string           // replication slot
	Publication string           // publication
	Tables      []pgx.Identifier // captured tables, {schema, table}
	// Keys are the key overrides, by "schema.table".
	Keys       map[string][]string
	CreateSlot bool // the capture creates the slot when it is missing
	// CreatePublication: the capture creates the publication when it is missing, and adds the
	// captured tables to it, when the role may.
	CreatePublication bool
	// Watermarks is the watermark transport the capture will use (Auto: resolved by the
	// server's version, as the engine does).
	Watermarks watermark.Transport
	// SignalTable is the signal table of the Table transport. Zero: watermark.DefaultTable.
	SignalTable pgx.Identifier
}

// Check checks everything a capture needs on the source, all at once, and returns the findings
// in order. It never stops at the first problem, except when it cannot connect.
func Check(ctx context.Context, cfg *pgx.ConnConfig, opts Options) []Finding {
	d := &doctor{slot: opts.Slot, pub: opts.Publication, tables: opts.Tables, keys: opts.Keys, createSlot: opts.CreateSlot, createPub: opts.CreatePublication,
		watermarks: opts.Watermarks, signal: opts.SignalTable}
	if len(d.signal) == 0 {
		d.signal = watermark.DefaultTable
	}
	d.run(ctx, cfg)
	return d.findings
}

// Problems returns the findings that are problems.
func Problems(fs []Finding) []Finding {
	var out []Finding
	for _, f := range fs {
		if !f.OK && !f.Warn {
			out = append(out, f)
		}
	}
	return out
}

// Print writes the findings for people, and returns how many are problems.
func Print(w io.Writer, fs []Finding) int {
	problems := 0
	for _, f := range fs {
		mark := "ok  "
		switch {
		case f.Warn:
			mark = "warn"
		case !f.OK:
			mark = "FAIL"
			problems++
		}
		fmt.Fprintf(w, "[%s] %s\n", mark, f.What)
		for _, l := range f.Fix {
			fmt.Fprintf(w, "       %s\n", l)
		}
	}
	if problems == 0 {
		fmt.Fprintln(w, "All is well: Tidemark can capture from this database.")
	} else {
		fmt.Fprintf(w, "%d problem(s): apply the fixes above, then run tidemark doctor again.\n", problems)
	}
	return problems
}

type doctor struct {
	slot, pub  string
	tables     []pgx.Identifier
	createSlot bool
	createPub  bool
	watermarks watermark.Transport
	signal     pgx.Identifier
	findings   []Finding
	user       string
	keys       map[string][]string // key overrides, by "schema.table"
}

func (d *doctor) ok(format string, args ...any) {
	d.findings = append(d.findings, Finding{OK: true, What: fmt.Sprintf(format, args...)})
}

func (d *doctor) problem(what string, fix ...string) {
	d.findings = append(d.findings, Finding{What: what, Fix: fix})
}

func (d *doctor) warn(what string, fix ...string) {
	d.findings = append(d.findings, Finding{Warn: true, What: what, Fix: fix})
}

func (d *doctor) run(ctx context.Context, cfg *pgx.ConnConfig) {
	cfg = cfg.Copy()
	pgconf.Pin(&cfg.Config, "tidemark-preflight")
	d.user = cfg.User
	who := pgconf.Describe(&cfg.Config)
	conn, err := pgconf.Dial(ctx, cfg)
	if err != nil {
		d.problem(fmt.Sprintf("cannot connect to %s: %v", who, err), connectFix(err, cfg.User)...)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	d.ok("connected to %s", who)

	var version int
	var walLevel, keep, senderTimeout string
	var maxSlots, usedSlots, maxSenders, usedSenders int
	err = conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('wal_level'),
		current_setting('max_slot_wal_keep_size'), current_setting('wal_sender_timeout'),
		current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_replication_slots),
		current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_stat_replication)`).
		Scan(&version, &walLevel, &keep, &senderTimeout, &maxSlots, &usedSlots, &maxSenders, &usedSenders)
	if err != nil {
		d.problem(fmt.Sprintf("cannot read the server's settings: %v", err))
		return
	}
	if version < 130000 {
		d.problem(fmt.Sprintf("PostgreSQL %d is too old: Tidemark needs 13 or later", version/10000))
	} else {
		d.ok("PostgreSQL %d.%d", version/10000, version%10000)
	}
	if walLevel != "logical" {
		d.problem(fmt.Sprintf("wal_level is %s; logical replication needs logical", walLevel),
			"ALTER SYSTEM SET wal_level = logical;  -- then restart PostgreSQL",
			"Amazon RDS / Aurora: set rds.logical_replication = 1 in the DB parameter group, then reboot",
			"Google Cloud SQL: set the database flag cloudsql.logical_decoding = on",
			"Azure Database for PostgreSQL: set the server parameter wal_level = LOGICAL, then restart")
	} else {
		d.ok("wal_level = logical")
	}
	d.checkSlot(ctx, conn, maxSlots, usedSlots)
	d.checkIdleSlots(ctx, conn)
	if usedSenders >= maxSenders {
		d.problem(fmt.Sprintf("all %d WAL senders are in use (max_wal_senders)", maxSenders),
			fmt.Sprintf("ALTER SYSTEM SET max_wal_senders = %d;  -- then restart PostgreSQL", maxSenders+5))
	} else {
		d.ok("WAL senders: %d of %d in use", usedSenders, maxSenders)
	}
	d.checkRole(ctx, conn)
	d.checkReplicationConnection(ctx, cfg)
	d.checkPublication(ctx, conn)
	d.checkTables(ctx, conn)
	d.checkWatermarks(ctx, conn, version)
	if keep == "-1" {
		d.warn("max_slot_wal_keep_size is unlimited: a slot nobody reads keeps WAL until the disk fills",
			"ALTER SYSTEM SET max_slot_wal_keep_size = '50GB';  -- a bound that fits your disk; then SELECT pg_reload_conf();")
	} else {
		d.ok("max_slot_wal_keep_size = %s", keep)
	}
	if senderTimeout == "0" {
		d.warn("wal_sender_timeout is 0: dead replication connections are never noticed by the server",
			"ALTER SYSTEM SET wal_sender_timeout = '60s'; SELECT pg_reload_conf();")
	}
}

func connectFix(err error, user string) []string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		if strings.Contains(err.Error(), "server refused TLS connection") {
			return []string{"the server offers no TLS: enable it on the server (ssl = on), or, on a network you trust, say sslmode=disable in the connection string"}
		}
		return []string{"check the host, port, and that the server accepts TCP connections (listen_addresses, firewall)"}
	}
	switch pgErr.Code {
	case pgerrcode.InvalidPassword:
		return []string{"check the user name and password"}
	case pgerrcode.InvalidAuthorizationSpecification:
		return []string{fmt.Sprintf("allow the user in pg_hba.conf, for example: host all %s 0.0.0.0/0 scram-sha-256", user)}
	case pgerrcode.InvalidCatalogName:
		return []string{"check the database name"}
	}
	return nil
}

func (d *doctor) checkSlot(ctx context.Context, conn *pgx.Conn, maxSlots, usedSlots int) {
	var plugin, db, walStatus string
	var active bool
	var retained int64
	err := conn.QueryRow(ctx, `SELECT coalesce(plugin, ''), coalesce(database, ''), active, coalesce(wal_status, ''),
		coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint FROM pg_replication_slots WHERE slot_name = $1`, d.slot).
		Scan(&plugin, &db, &active, &walStatus, &retained)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		switch {
		case !d.createSlot:
			d.problem(fmt.Sprintf("replication slot %q does not exist", d.slot),
				sqlfix.CreateSlot(d.slot))
		case usedSlots >= maxSlots:
			d.problem(fmt.Sprintf("replication slot %q does not exist and all %d slots are taken (max_replication_slots)", d.slot, maxSlots),
				fmt.Sprintf("ALTER SYSTEM SET max_replication_slots = %d;  -- then restart PostgreSQL", maxSlots+5),
				"or drop a slot nobody uses: SELECT pg_catalog.pg_drop_replication_slot('<name>');")
		default:
			d.ok("replication slot %q does not exist yet; Tidemark creates it (%d of %d slots in use)", d.slot, usedSlots, maxSlots)
		}
	case err != nil:
		d.problem(fmt.Sprintf("cannot read replication slots: %v", err))
	case plugin != "pgoutput":
		d.problem(fmt.Sprintf("replication slot %q uses the plugin %q, not pgoutput", d.slot, plugin), "use another slot name (--slot)")
	case walStatus == "lost":
		d.problem(fmt.Sprintf("replication slot %q is invalidated (wal_status = lost): changes were missed", d.slot),
			sqlfix.DropSlot(d.slot)+"  -- then start over with a full backfill")
	default:
		state := "not in use"
		if active {
			state = "in use by a running consumer"
		}
		d.ok("replication slot %q exists (pgoutput, %s), retains %s of WAL", d.slot, state, Bytes(retained))
		if retained > 1<<30 {
			d.warn(fmt.Sprintf("replication slot %q retains %s of WAL: its consumer is behind or stopped", d.slot, Bytes(retained)),
				"start the capture, or drop the slot if it is abandoned: "+sqlfix.DropSlot(d.slot))
		}
	}
}

// IdleSlot is a pgoutput slot of the database that nobody streams from.
type IdleSlot struct {
	Name     string
	Retained int64 // bytes of WAL it retains
}

// IdleSlots lists the pgoutput slots of conn's database, but except, that nobody streams from,
// with the WAL each retains, most first: a capture stopped for good, or a run killed before its
// first checkpoint (which cannot drop the slot it created), keeps WAL until the disk fills.
func IdleSlots(ctx context.Context, conn *pgx.Conn, except string) ([]IdleSlot, error) {
	rows, err := conn.Query(ctx, `SELECT slot_name::text, coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint
		FROM pg_replication_slots WHERE slot_type = 'logical' AND plugin = 'pgoutput' AND database = current_database()
		AND NOT active AND slot_name <> $1 ORDER BY 2 DESC, 1`, except)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (IdleSlot, error) {
		var i IdleSlot
		return i, r.Scan(&i.Name, &i.Retained)
	})
}

// IdleSlotFix is what to do about an idle slot: drop it, once nothing is to resume from it.
func IdleSlotFix(slot string) string {
	return fmt.Sprintf("if nothing resumes from it: tidemark cleanup --slot %s  (or %s)", shellWord(slot), sqlfix.DropSlot(slot))
}

func (d *doctor) checkIdleSlots(ctx context.Context, conn *pgx.Conn) {
	slots, err := IdleSlots(ctx, conn, d.slot)
	if err != nil {
		d.problem(fmt.Sprintf("cannot read replication slots: %v", err))
		return
	}
	for _, sl := range slots {
		d.warn(fmt.Sprintf("replication slot %q is not in use and retains %s of WAL: a capture stopped, or a run killed before its first checkpoint", sl.Name, Bytes(sl.Retained)),
			IdleSlotFix(sl.Name))
	}
}

// shellWord quotes s for a POSIX shell when it needs it.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func (d *doctor) checkRole(ctx context.Context, conn *pgx.Conn) {
	var super, repl, rds bool
	err := conn.QueryRow(ctx, `SELECT rolsuper, rolreplication,
		EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = 'rds_replication' AND pg_has_role(current_user, r.oid, 'member'))
		FROM pg_roles WHERE rolname = current_user`).Scan(&super, &repl, &rds)
	if err != nil {
		d.problem(fmt.Sprintf("cannot read the role's attributes: %v", err))
		return
	}
	switch {
	case super:
		d.ok("role %q is a superuser (a role with REPLICATION and SELECT is enough)", d.user)
	case repl || rds:
		d.ok("role %q may replicate", d.user)
	default:
		d.problem(fmt.Sprintf("role %q lacks the REPLICATION attribute", d.user),
			sqlfix.Replication(d.user),
			"Amazon RDS / Aurora: GRANT rds_replication TO "+sqlfix.Ident(d.user)+";",
			"Google Cloud SQL: "+sqlfix.Replication(d.user))
	}
}

func (d *doctor) checkReplicationConnection(ctx context.Context, cfg *pgx.ConnConfig) {
	rcfg := cfg.Config.Copy()
	rcfg.RuntimeParams["replication"] = "database"
	conn, err := pgconf.DialReplication(ctx, rcfg)
	if err != nil {
		fix := []string{fmt.Sprintf("allow replication connections in pg_hba.conf: host replication %s <client address> scram-sha-256, then SELECT pg_reload_conf();", d.user)}
		if pgerr.Privilege(err) {
			fix = []string{"grant the REPLICATION attribute (above)"}
		}
		d.problem(fmt.Sprintf("a replication connection is refused: %v", err), fix...)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	d.ok("replication connections are allowed")
}

func (d *doctor) checkPublication(ctx context.Context, conn *pgx.Conn) {
	var ins, upd, del, trunc, all bool
	err := conn.QueryRow(ctx, `SELECT pubinsert, pubupdate, pubdelete, pubtruncate, puballtables FROM pg_publication WHERE pubname = $1`, d.pub).Scan(&ins, &upd, &del, &trunc, &all)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		var canCreate bool
		_ = conn.QueryRow(ctx, `SELECT has_database_privilege(current_database(), 'CREATE')`).Scan(&canCreate)
		create := "CREATE PUBLICATION " + sqlfix.Ident(d.pub) + " FOR TABLE <schema>.<table>, ...;"
		// Only tables the capture can take: a table without a usable replica identity in a
		// publication of updates and deletes makes the application's own UPDATE and DELETE on it
		// fail. The others are reported with their fix below (checkTables).
		var usable []pgx.Identifier
		for _, t := range d.tables {
			if _, err := chunker.Discover(ctx, conn, t[0], t[1], d.keys[t[0]+"."+t[1]], ""); err == nil {
				usable = append(usable, t)
			}
		}
		if len(usable) > 0 {
			create = sqlfix.CreatePublication(d.pub, usable...)
			if len(usable) < len(d.tables) {
				create += "  -- the tables that can be captured as they are; fix the others (below) before adding them"
			}
		} else if len(d.tables) > 0 {
			create = "-- fix the tables (below) first: a publication holding a table without a usable key breaks the application's updates and deletes of it"
		}
		switch {
		case !d.createPub:
			d.problem(fmt.Sprintf("publication %q does not exist", d.pub), create)
		case canCreate && d.ownsAll(ctx, conn):
			d.ok("publication %q does not exist yet; Tidemark creates it", d.pub)
		default:
			d.problem(fmt.Sprintf("publication %q does not exist, and this role may not create it (it needs CREATE on the database and to own the tables)", d.pub), create)
		}
	case err != nil:
		d.problem(fmt.Sprintf("cannot read publication %q: %v", d.pub, err))
	case !ins || !upd || !del || !trunc:
		d.problem(fmt.Sprintf("publication %q does not publish every insert, update, delete and truncate", d.pub),
			sqlfix.PublishAll(d.pub))
	default:
		d.ok("publication %q exists", d.pub)
	}
}

func (d *doctor) ownsAll(ctx context.Context, conn *pgx.Conn) bool {
	for _, t := range d.tables {
		var owns bool
		if err := conn.QueryRow(ctx, `SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = to_regclass($1)`, t.Sanitize()).Scan(&owns); err != nil || !owns {
			return false
		}
	}
	return true
}

func (d *doctor) checkTables(ctx context.Context, conn *pgx.Conn) {
	for _, t := range d.tables {
		name := t[0] + "." + t[1]
		var can bool
		err := conn.QueryRow(ctx, `SELECT has_table_privilege(to_regclass($1), 'SELECT')`, t.Sanitize()).Scan(&can)
		if err != nil || !can {
			if err == nil {
				err = errors.New("no SELECT privilege")
			}
			d.problem(fmt.Sprintf("table %s cannot be read: %v", name, err),
				sqlfix.GrantSelect(t, d.user)+"  -- if the table exists")
			continue
		}
		_, err = chunker.Discover(ctx, conn, t[0], t[1], d.keys[t[0]+"."+t[1]], d.pub)
		switch {
		case errors.Is(err, chunker.ErrNotPublished):
			var pubExists bool
			_ = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, d.pub).Scan(&pubExists)
			if !pubExists {
				d.ok("table %s can be read", name)
				continue
			}
			if !d.createPub {
				d.problem(fmt.Sprintf("table %s is not in publication %q", name, d.pub),
					sqlfix.AddTable(d.pub, t))
			} else if d.ownsAll(ctx, conn) {
				d.ok("table %s is not in publication %q yet; Tidemark adds it", name, d.pub)
			} else {
				d.problem(fmt.Sprintf("table %s is not in publication %q, and this role may not add it", name, d.pub),
					sqlfix.AddTable(d.pub, t))
			}
		case err != nil:
			d.problem(fmt.Sprintf("table %s: %v", name, err))
		default:
			d.ok("table %s can be read, has a key, and is published", name)
		}
	}
}

// checkWatermarks checks the watermark transport the capture will use.
func (d *doctor) checkWatermarks(ctx context.Context, conn *pgx.Conn, version int) {
	t, err := d.watermarks.Resolve(version)
	if err != nil {
		d.problem(err.Error(), "use the signal table transport (--watermarks table; in the connector, set signal_table)")
		return
	}
	if t == watermark.Table {
		d.checkSignalTable(ctx, conn)
		return
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT has_function_privilege('pg_catalog.pg_logical_emit_message(boolean, text, text)', 'EXECUTE')`).Scan(&ok); err != nil {
		d.problem(fmt.Sprintf("cannot check the privilege to write logical messages: %v", err))
		return
	}
	if !ok {
		d.problem("watermarks are logical messages, and this role may not call pg_logical_emit_message",
			sqlfix.GrantEmit(d.user))
		return
	}
	d.ok("watermarks are logical messages (no signal table, no write privilege needed)")
}

func (d *doctor) checkSignalTable(ctx context.Context, conn *pgx.Conn) {
	name := d.signal.Sanitize()
	create := fmt.Sprintf(watermark.CreateTable, name) + ";"
	grant := sqlfix.GrantWrite(d.signal, d.user)
	give := sqlfix.OwnerTo(d.signal, d.user)
	addToPub := sqlfix.AddTable(d.pub, d.signal)
	var exists, canCreate bool
	err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, has_schema_privilege($2, 'CREATE')`, name, d.signal[0]).Scan(&exists, &canCreate)
	if err != nil {
		d.problem(fmt.Sprintf("cannot check the signal table %s: %v", name, err))
		return
	}
	if !exists {
		if canCreate {
			d.ok("signal table %s does not exist yet; Tidemark creates it", name)
		} else {
			d.problem(fmt.Sprintf("signal table %s does not exist, and this role may not create it", name),
				append(strings.Split(create, "\n"), give, addToPub)...)
		}
		return
	}
	var refused *pgtrust.Refused
	if err := pgtrust.Own(ctx, conn, "signal table", name); errors.As(err, &refused) {
		d.problem(fmt.Sprintf("signal table %s is refused: %s", name, strings.Join(refused.Problems, "; ")), refused.Fixes...)
		return
	} else if err != nil {
		d.problem(fmt.Sprintf("cannot check the signal table %s: %v", name, err))
		return
	}
	var writable, inPub bool
	_ = conn.QueryRow(ctx, `SELECT has_table_privilege($1, 'INSERT, UPDATE'),
		EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $2 AND schemaname = $3 AND tablename = $4)`,
		name, d.pub, d.signal[0], d.signal[1]).Scan(&writable, &inPub)
	if !writable {
		d.problem(fmt.Sprintf("signal table %s is not writable by this role", name), grant)
		return
	}
	var pubExists, owns bool
	_ = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
		coalesce((SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = to_regclass($2)), false)`, d.pub, name).Scan(&pubExists, &owns)
	switch {
	case inPub || !pubExists:
		d.ok("signal table %s is ready", name)
	case owns:
		d.ok("signal table %s is not in publication %q yet; Tidemark adds it", name, d.pub)
	default:
		d.problem(fmt.Sprintf("signal table %s is not in publication %q, and this role may not add it", name, d.pub), addToPub)
	}
}

// Bytes writes a byte count for people.
func Bytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
