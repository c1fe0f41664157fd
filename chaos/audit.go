package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/chaos/oracle"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/sqlfix"
)

// What the oracle reads beside the output: the versions the source's deletes removed (its
// deaths table, written by triggers), the PostgreSQL target's history of its rows (written by
// triggers the harness attaches to the target's tables), and the target's audit ledger.

// deaths are the versions the source's deletes, key changes and truncates removed, by table, key
// (text values joined by KeySep; "" for a truncate) and transaction (the low 32 bits of its id).
type deaths map[string]int64

func deathKey(table, key string, xid uint32) string {
	return table + "\x00" + key + "\x00" + strconv.FormatUint(uint64(xid), 10)
}

// readDeaths reads the source's deaths. Of a key deleted more than once by one transaction
// (deleted, inserted again, deleted), the oldest version: whichever of its deletes a record
// follows, the key comes back newer than that.
func (r *run) readDeaths(ctx context.Context) (deaths, error) {
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT tbl, key, ver, xid::text::bigint % 4294967296 FROM `+r.sch+`.deaths`)
	if err != nil {
		return nil, fmt.Errorf("read the deaths: %w", err)
	}
	out := deaths{}
	for rows.Next() {
		var tbl, key string
		var ver, xid int64
		if err := rows.Scan(&tbl, &key, &ver, &xid); err != nil {
			return nil, err
		}
		k := deathKey(r.sch+"."+tbl, key, uint32(xid))
		if old, ok := out[k]; !ok || ver < old {
			out[k] = ver
		}
	}
	return out, rows.Err()
}

// removed returns the version the transaction xid removed of key (in the oracle's form: the
// values' JSON joined by KeySep; "" for a truncate) of table.
func (d deaths) removed(table, key string, xid uint32) (int64, bool) {
	v, ok := d[deathKey(table, keyText(key), xid)]
	return v, ok
}

// keyText turns a key in the oracle's form (each value's JSON) into the deaths' (each value's
// text).
func keyText(key string) string {
	if key == "" {
		return ""
	}
	parts := strings.Split(key, oracle.KeySep)
	for i, p := range parts {
		var s string
		if json.Unmarshal([]byte(p), &s) == nil {
			parts[i] = s
		}
	}
	return strings.Join(parts, oracle.KeySep)
}

// airbyteForm gives source rows the form an Airbyte record has: a value without a JSON form
// (NaN) is nulled, and marked so, without its text.
func airbyteForm(rows map[string]map[string]*string) {
	lossy := oracle.Lossy
	for _, row := range rows {
		for c, v := range row {
			if v != nil && strings.HasPrefix(*v, oracle.Lossy) {
				row[c] = &lossy
			}
		}
	}
}

// targetHistory is the PostgreSQL target's history of its rows: triggers on the target's tables
// write each row change (its key, version and the target transaction's time) to a table of the
// harness, so that the oracle checks I2 and I3 on what the target went through, not only on
// where it ended. The triggers are attached by an event trigger as the sink creates the tables
// (which needs a superuser); otherwise they are attached once the tables are seen, and the
// history starts there.
type targetHistory struct {
	schema  string // the harness's schema on the target
	data    string // the run's schema on the target
	watched bool   // the event trigger attaches the triggers
	log     zerolog.Logger
}

// historyTables are the tables whose history is kept, with the text of their key (as the
// source's deaths have it) in a row r.
var historyTables = map[string]string{
	"accounts": "r.id::text",
	"items":    "r.tenant || chr(31) || r.sku::text",
	"notes":    "r.code",
}

func newTargetHistory(ctx context.Context, target, data string, log zerolog.Logger) (*targetHistory, error) {
	h := &targetHistory{schema: data + "_history", data: data, log: log}
	conn, err := pgconf.Open(ctx, target, "tidemark-chaos")
	if err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	stmts := []string{
		`DROP SCHEMA IF EXISTS ` + h.schema + ` CASCADE`,
		`CREATE SCHEMA ` + h.schema,
		`CREATE TABLE ` + h.schema + `.rows (id bigserial PRIMARY KEY, tbl text NOT NULL, op text NOT NULL, key text, ver bigint, at timestamptz NOT NULL DEFAULT now())`,
	}
	for t, key := range historyTables {
		// The columns are read by name when the trigger runs (the table is made by the sink).
		row := func(r string) string {
			return fmt.Sprintf(`INSERT INTO %s.rows (tbl, op, key, ver) VALUES (%s, TG_OP, %s, %s.ver)`, h.schema, sqlfix.Literal(t), strings.ReplaceAll(key, "r.", r+"."), r)
		}
		stmts = append(stmts, fmt.Sprintf(`CREATE FUNCTION %s.%s_row() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN
			IF TG_OP = 'DELETE' THEN %s; ELSE %s; END IF; RETURN NULL; END $f$`, h.schema, t, row("OLD"), row("NEW")))
	}
	stmts = append(stmts, fmt.Sprintf(`CREATE FUNCTION %[1]s.truncated() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN
		INSERT INTO %[1]s.rows (tbl, op) VALUES (TG_ARGV[0], 'TRUNCATE'); RETURN NULL; END $f$`, h.schema),
		fmt.Sprintf(`CREATE FUNCTION %[1]s.attach(name text) RETURNS void LANGUAGE plpgsql AS $f$ BEGIN
		EXECUTE format('CREATE TRIGGER tidemark_chaos_history AFTER INSERT OR UPDATE OR DELETE ON %%I.%%I FOR EACH ROW EXECUTE FUNCTION %[1]s.%%I()', '%[2]s', name, name || '_row');
		EXECUTE format('CREATE TRIGGER tidemark_chaos_history_truncate AFTER TRUNCATE ON %%I.%%I FOR EACH STATEMENT EXECUTE FUNCTION %[1]s.truncated(%%L)', '%[2]s', name, name);
		END $f$`, h.schema, data),
		fmt.Sprintf(`CREATE FUNCTION %[1]s.created() RETURNS event_trigger LANGUAGE plpgsql AS $f$
			DECLARE c record; n text; BEGIN
			FOR c IN SELECT * FROM pg_event_trigger_ddl_commands() WHERE command_tag = 'CREATE TABLE' AND schema_name = '%[2]s' LOOP
				SELECT relname INTO n FROM pg_class WHERE oid = c.objid;
				IF n IN ('accounts', 'items', 'notes') THEN PERFORM %[1]s.attach(n); END IF;
			END LOOP; END $f$`, h.schema, data))
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("target: the history of its rows (%.60s...): %w", s, err)
		}
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE EVENT TRIGGER %[1]s ON ddl_command_end WHEN TAG IN ('CREATE TABLE') EXECUTE FUNCTION %[1]s.created()`, h.schema)); err != nil {
		log.Warn().Err(err).Msg("target: no event trigger (not a superuser?): the history of the target's rows starts when its tables are seen")
	} else {
		h.watched = true
	}
	return h, nil
}

// attachSeen attaches the triggers to the target's tables that exist and lack them (without the
// event trigger).
func (h *targetHistory) attachSeen(ctx context.Context, target string) {
	if h.watched {
		return
	}
	conn, err := pgconf.Open(ctx, target, "tidemark-chaos")
	if err != nil {
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, _ = conn.Exec(ctx, fmt.Sprintf(`SELECT %s.attach(c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname IN ('accounts', 'items', 'notes')
		AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = 'tidemark_chaos_history')`, h.schema), h.data)
}

func (h *targetHistory) drop(ctx context.Context, conn *pgx.Conn) {
	_, _ = conn.Exec(ctx, `DROP EVENT TRIGGER IF EXISTS `+h.schema)
	_, _ = conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+h.schema+` CASCADE`)
}

// histChange is one row change of the target's history.
type histChange struct {
	tbl, op, key string
	ver          int64
	at           int64 // the target transaction's time (now()), in microseconds
}

// ledgerEntry is one source transaction the target applied, at the target transaction's time.
type ledgerEntry struct {
	at  int64
	xid uint32
	lsn string // its commit LSN
}

// written is a version a source transaction wrote of a key of a table.
type written struct {
	tbl, key string
	ver      int64
}

// check replays the target's history in an oracle (I2, I3: per key, the versions the target
// took never go back, and a key the target deleted comes back only newer than the version the
// source deleted in the transactions applied with that delete), checks each row the target took
// against the source transactions applied up to it (staleAgainstApplied), and returns the
// violations and the number of changes.
func (h *targetHistory) check(ctx context.Context, r *run) ([]string, int, error) {
	conn, err := pgconf.Open(ctx, r.target, "tidemark-chaos")
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	const micros = `(extract(epoch FROM %s) * 1000000)::bigint`
	var changes []histChange
	rows, err := conn.Query(ctx, `SELECT tbl, op, coalesce(key, ''), coalesce(ver, 0), `+fmt.Sprintf(micros, "at")+` FROM `+h.schema+`.rows ORDER BY id`)
	if err != nil {
		return nil, 0, fmt.Errorf("read the target's history: %w", err)
	}
	for rows.Next() {
		var c histChange
		if err := rows.Scan(&c.tbl, &c.op, &c.key, &c.ver, &c.at); err != nil {
			return nil, 0, err
		}
		changes = append(changes, c)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	var ledger []ledgerEntry
	lrows, err := conn.Query(ctx, `SELECT `+fmt.Sprintf(micros, "applied_at")+`, xid, commit_lsn::text FROM public.tidemark_applied`)
	if err != nil {
		return nil, 0, fmt.Errorf("read the audit ledger: %w", err)
	}
	for lrows.Next() {
		var at, xid int64
		var lsn string
		if err := lrows.Scan(&at, &xid, &lsn); err != nil {
			return nil, 0, err
		}
		ledger = append(ledger, ledgerEntry{at, uint32(xid), lsn})
	}
	if err := lrows.Err(); err != nil {
		return nil, 0, err
	}
	d, err := r.readDeaths(ctx)
	if err != nil {
		return nil, 0, err
	}
	w, err := r.readVersions(ctx)
	if err != nil {
		return nil, 0, err
	}
	out := historyViolations(r.sch, changes, ledger, d)
	r.mu.Lock()
	var drops []pubDrop
	for _, d := range r.pubDrops {
		drops = append(drops, *d)
	}
	r.mu.Unlock()
	out = append(out, staleAgainstApplied(changes, ledger, w, unreceived(drops))...)
	return out, len(changes), nil
}

// historyViolations replays the target's history in an oracle: I2 and I3 on what the target's
// rows went through.
func historyViolations(schema string, changes []histChange, ledger []ledgerEntry, d deaths) []string {
	o := oracle.NewOracle("ver")
	for _, c := range changes {
		rec := oracle.Record{Table: schema + "." + c.tbl, Key: c.key}
		switch c.op {
		case "TRUNCATE":
			rec.Op = "refresh" // a truncate on the source, or a re-backfill
		case "DELETE":
			rec.Op, rec.Txn = "delete", strconv.FormatInt(c.at, 10)
		default:
			v := strconv.FormatInt(c.ver, 10)
			rec.Op, rec.Values = "upsert", map[string]*string{"ver": &v}
		}
		o.Apply(rec)
	}
	// The source transactions each target transaction applied, by its time.
	applied := map[string][]uint32{}
	for _, l := range ledger {
		at := strconv.FormatInt(l.at, 10)
		applied[at] = append(applied[at], l.xid)
	}
	o.CheckDeaths(func(table, key, at string) (int64, bool) {
		var min int64
		found := false
		for _, xid := range applied[at] {
			if v, ok := d[deathKey(table, key, xid)]; ok && (!found || v < min) {
				min, found = v, true
			}
		}
		return min, found
	})
	var out []string
	for _, v := range o.Violations() {
		out = append(out, "target history: "+v)
	}
	return out
}

// staleAgainstApplied checks each row the target took against the source transactions applied
// up to it: its version is at least the newest one of its key that a source transaction applied
// in the same target transaction or before wrote (a backfilled row is read after every
// transaction before its low watermark was applied, so it is as new). A stale row the target
// wrote in place of a newer change folded into the same target transaction (a key's changes
// between two checkpoints are applied as one) is found here, where the history alone shows no
// version going back. ledger gives the target transaction's time of each applied source
// transaction; versions the versions each wrote.
//
// unseen says which versions are left out: those the engine could not receive (unreceived).
func staleAgainstApplied(changes []histChange, ledger []ledgerEntry, versions map[uint32][]written, unseen func(tbl string, commit pglogrepl.LSN) bool) []string {
	ledger = slices.Clone(ledger)
	slices.SortStableFunc(ledger, func(a, b ledgerEntry) int { return cmp.Compare(a.at, b.at) })
	newest := map[string]int64{}   // by table and key: the newest version applied
	by := map[string]ledgerEntry{} // the transaction that wrote it
	next := 0
	var out []string
	n := 0
	for i := 0; i < len(changes); {
		// One target transaction: its changes share its time. A key written more than once in
		// it (pieces of a large source transaction) is judged by its last row, the one the
		// transaction committed.
		at := changes[i].at
		end := i
		last := map[string]histChange{}
		var order []string
		for ; end < len(changes) && changes[end].at == at; end++ {
			c := changes[end]
			id := c.tbl + "\x00" + c.key
			if _, ok := last[id]; !ok {
				order = append(order, id)
			}
			last[id] = c
		}
		i = end
		for ; next < len(ledger) && ledger[next].at <= at; next++ {
			commit, _ := pglogrepl.ParseLSN(ledger[next].lsn)
			for _, w := range versions[ledger[next].xid] {
				if unseen != nil && unseen(w.tbl, commit) {
					continue
				}
				id := w.tbl + "\x00" + w.key
				if w.ver > newest[id] {
					newest[id], by[id] = w.ver, ledger[next]
				}
			}
		}
		for _, id := range order {
			c := last[id]
			if c.op != "INSERT" && c.op != "UPDATE" {
				continue
			}
			if v, ok := newest[id]; ok && c.ver < v {
				n++
				if len(out) < 10 {
					b := by[id]
					out = append(out, fmt.Sprintf("target history: I2: %s key %q took version %d, older than version %d that source transaction %d, applied with it or before, wrote (target times: the row %d, the transaction %d, committed at %s)",
						c.tbl, c.key, c.ver, v, b.xid, c.at, b.at, b.lsn))
				}
			}
		}
	}
	if n > len(out) {
		out = append(out, fmt.Sprintf("target history: I2: ... and %d more rows older than what was applied", n-len(out)))
	}
	return out
}

// pubDrop is a publication fault's span of WAL (its commit LSNs from lo to hi) in which a
// table's (its short name) changes may be in no slot.
type pubDrop struct {
	table  string
	lo, hi pglogrepl.LSN
}

// unreceived returns which versions staleAgainstApplied leaves out: those of a table that a
// source transaction committed while the table was out of the publication (a pubDrop's span).
// The engine never received them, so a chunk read meanwhile cannot have been told of them; the
// capture stops within its watch interval, the re-backfill the error asks for rewrites the table,
// and the final comparison with the source covers it. Every other version still judges every
// row, whenever the target applied it.
func unreceived(drops []pubDrop) func(tbl string, commit pglogrepl.LSN) bool {
	return func(tbl string, commit pglogrepl.LSN) bool {
		for _, d := range drops {
			if d.table == tbl && commit >= d.lo && commit <= d.hi {
				return true
			}
		}
		return false
	}
}

// readVersions reads the versions each source transaction wrote (PostgreSQL mode), by the low
// 32 bits of its id.
func (r *run) readVersions(ctx context.Context) (map[uint32][]written, error) {
	conn, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT tbl, key, ver, xid::text::bigint % 4294967296 FROM `+r.sch+`.versions`)
	if err != nil {
		return nil, fmt.Errorf("read the versions: %w", err)
	}
	out := map[uint32][]written{}
	for rows.Next() {
		var w written
		var xid int64
		if err := rows.Scan(&w.tbl, &w.key, &w.ver, &xid); err != nil {
			return nil, err
		}
		out[uint32(xid)] = append(out[uint32(xid)], w)
	}
	return out, rows.Err()
}

// auditLedger compares the source's transaction log (txlog, one row per workload transaction)
// with the target's audit ledger: every source transaction after from (its txlog id) was applied
// once; the ones missing are named.
func (r *run) auditLedger(ctx context.Context, from int64) ([]string, error) {
	src, err := pgconf.Open(ctx, r.dsn, "tidemark-chaos")
	if err != nil {
		return nil, err
	}
	defer src.Close(context.WithoutCancel(ctx))
	logged := map[uint32]int64{} // xid → txlog id
	rows, err := src.Query(ctx, `SELECT id, xid::text::bigint % 4294967296 FROM `+r.sch+`.txlog WHERE id > $1`, from)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id, xid int64
		if err := rows.Scan(&id, &xid); err != nil {
			return nil, err
		}
		logged[uint32(xid)] = id
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	tgt, err := pgconf.Open(ctx, r.target, "tidemark-chaos")
	if err != nil {
		return nil, err
	}
	defer tgt.Close(context.WithoutCancel(ctx))
	applied := map[uint32]int{}
	lrows, err := tgt.Query(ctx, `SELECT xid FROM public.tidemark_applied`)
	if err != nil {
		return nil, err
	}
	for lrows.Next() {
		var xid int64
		if err := lrows.Scan(&xid); err != nil {
			return nil, err
		}
		applied[uint32(xid)]++
	}
	if err := lrows.Err(); err != nil {
		return nil, err
	}
	var missing, twice []string
	ids := slices.Sorted(func(yield func(uint32) bool) {
		for x := range logged {
			if !yield(x) {
				return
			}
		}
	})
	for _, xid := range ids {
		switch n := applied[xid]; {
		case n == 0:
			missing = append(missing, fmt.Sprintf("xid %d (txlog id %d)", xid, logged[xid]))
		case n > 1:
			twice = append(twice, fmt.Sprintf("xid %d (txlog id %d) %d times", xid, logged[xid], n))
		}
	}
	var out []string
	if len(missing) > 0 {
		out = append(out, fmt.Sprintf("audit: %d of %d source transactions (txlog id > %d) were not applied on the target: %s", len(missing), len(logged), from, strings.Join(missing[:min(len(missing), 5)], ", ")))
	}
	if len(twice) > 0 {
		out = append(out, fmt.Sprintf("exactly once: %d source transactions were applied more than once on the target: %s", len(twice), strings.Join(twice[:min(len(twice), 5)], ", ")))
	}
	return out, nil
}
