package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/pgconf"
)

// The workload lives in its own schema (one per run: SchemaPrefix and the run's id). Every row
// has a version (ver) drawn from one sequence: per key it only grows in commit order, across
// deletes and key changes too, which is what the oracle checks (I2, I3). Every transaction also
// writes a row of txlog with the time it ran: the audit of the PostgreSQL target, and the live
// changes whose delivery latency the report gives. A trigger records in deaths the version each
// delete (or key change) removed, and each truncate: what the oracle compares a key that comes
// back after its delete with, whatever the output showed of it before.

// SchemaPrefix starts the name of a run's scratch schema, slot and publication: a run touches
// nothing else of the database.
const SchemaPrefix = "tidemark_chaos"

// tables are the captured tables, with their key columns.
var tables = []struct {
	name string
	key  []string
}{
	{"accounts", []string{"id"}},
	{"items", []string{"tenant", "sku"}},
	{"notes", []string{"code"}},
	{"txlog", []string{"id"}},
}

// keysIn returns the key columns by schema.table.
func keysIn(schema string) map[string][]string {
	out := map[string][]string{}
	for _, t := range tables {
		out[schema+"."+t.name] = t.key
	}
	return out
}

// tenants are the text keys of items, compared under an ICU collation when the server has one:
// case, accents and scripts that order differently under ICU than under C.
var tenants = []string{"apple", "Apple", "Äpfel", "zoë", "Zoe", "zoe", "ß", "ss", "日本", "Ω", "émile", "Emile"}

// setup creates the schema and its tables with rows initial rows in accounts. With ddl, it also
// makes what the schema faults need: the schema a table is moved to, and on each table a second
// unique index (on ver, which is unique: every insert and update draws a new one) for a replica
// identity on another index than the key.
func setup(ctx context.Context, conn *pgx.Conn, s, moved string, rows int, ddl, versions bool) (collation string, err error) {
	collation = "C"
	var icu bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'und-x-icu')`).Scan(&icu); err == nil && icu {
		collation = "und-x-icu"
	}
	stmts := []string{
		`DROP SCHEMA IF EXISTS ` + s + ` CASCADE`,
		`CREATE SCHEMA ` + s,
		`CREATE SEQUENCE ` + s + `.ver`,
		`CREATE TABLE ` + s + `.accounts (id bigint PRIMARY KEY, ver bigint NOT NULL, v text, big text, amount numeric(24,6))`,
		`ALTER TABLE ` + s + `.accounts ALTER COLUMN big SET STORAGE EXTERNAL`,
		fmt.Sprintf(`CREATE TABLE %s.items (tenant text COLLATE %q, sku int, ver bigint NOT NULL, v text, PRIMARY KEY (tenant, sku))`, s, collation),
		`ALTER TABLE ` + s + `.items ALTER COLUMN v SET STORAGE EXTERNAL`,
		`CREATE TABLE ` + s + `.notes (code text PRIMARY KEY, ver bigint NOT NULL, body text, score float8)`,
		`ALTER TABLE ` + s + `.notes ALTER COLUMN body SET STORAGE EXTERNAL`,
		`CREATE TABLE ` + s + `.txlog (id bigserial PRIMARY KEY, xid xid8 NOT NULL DEFAULT pg_current_xact_id(), at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		// Not captured: the versions deletes, key changes and truncates removed.
		`CREATE TABLE ` + s + `.deaths (id bigserial PRIMARY KEY, tbl text NOT NULL, key text NOT NULL, ver bigint NOT NULL, xid xid8 NOT NULL DEFAULT pg_current_xact_id())`,
		fmt.Sprintf(`INSERT INTO %[1]s.accounts SELECT g, nextval('%[1]s.ver'), md5(g::text), CASE WHEN g %% 50 = 0 THEN repeat(md5(g::text), 300) END, g * 1.5 FROM generate_series(1, %[2]d) g`, s, rows),
		fmt.Sprintf(`INSERT INTO %[1]s.items SELECT t, g, nextval('%[1]s.ver'), CASE WHEN g %% 40 = 0 THEN repeat(md5(t || g), 200) ELSE 'i' END FROM unnest($1::text[]) t, generate_series(1, 200) g`, s),
		fmt.Sprintf(`INSERT INTO %[1]s.notes SELECT 'n-' || g, nextval('%[1]s.ver'), CASE WHEN g %% 30 = 0 THEN repeat(md5(g::text), 150) ELSE 'note ' || g END, g / 7.0 FROM generate_series(1, 1000) g`, s),
	}
	// The deaths: per table, the key as text (parts joined by KeySep) and the version removed.
	for _, d := range []struct{ table, key, changed string }{
		{"accounts", "OLD.id::text", "OLD.id <> NEW.id"},
		{"items", "OLD.tenant || chr(31) || OLD.sku::text", "OLD.tenant <> NEW.tenant OR OLD.sku <> NEW.sku"},
		{"notes", "OLD.code", "OLD.code <> NEW.code"},
	} {
		stmts = append(stmts,
			fmt.Sprintf(`CREATE FUNCTION %[1]s.%[2]s_death() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN
				INSERT INTO %[1]s.deaths (tbl, key, ver) VALUES ('%[2]s', %[3]s, OLD.ver); RETURN NULL; END $f$`, s, d.table, d.key),
			fmt.Sprintf(`CREATE TRIGGER death_delete AFTER DELETE ON %s.%s FOR EACH ROW EXECUTE FUNCTION %[1]s.%[2]s_death()`, s, d.table),
			fmt.Sprintf(`CREATE TRIGGER death_move AFTER UPDATE ON %s.%s FOR EACH ROW WHEN (%s) EXECUTE FUNCTION %[1]s.%[2]s_death()`, s, d.table, d.changed),
			// A truncate removes every version drawn before it (it waits for the writers in
			// progress, and those after it draw later).
			fmt.Sprintf(`CREATE FUNCTION %[1]s.%[2]s_truncated() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN
				INSERT INTO %[1]s.deaths (tbl, key, ver) SELECT '%[2]s', '', last_value FROM %[1]s.ver; RETURN NULL; END $f$`, s, d.table),
			fmt.Sprintf(`CREATE TRIGGER death_truncate AFTER TRUNCATE ON %s.%s FOR EACH STATEMENT EXECUTE FUNCTION %[1]s.%[2]s_truncated()`, s, d.table))
	}
	if versions {
		// Not captured: every version each transaction wrote, by key (the PostgreSQL mode's check
		// of the target's history against the transactions applied with it).
		stmts = append(stmts, `CREATE TABLE `+s+`.versions (tbl text NOT NULL, key text NOT NULL, ver bigint NOT NULL, xid xid8 NOT NULL DEFAULT pg_current_xact_id())`)
		for _, d := range []struct{ table, key string }{
			{"accounts", "NEW.id::text"},
			{"items", "NEW.tenant || chr(31) || NEW.sku::text"},
			{"notes", "NEW.code"},
		} {
			stmts = append(stmts,
				fmt.Sprintf(`CREATE FUNCTION %[1]s.%[2]s_version() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN
				INSERT INTO %[1]s.versions (tbl, key, ver) VALUES ('%[2]s', %[3]s, NEW.ver); RETURN NULL; END $f$`, s, d.table, d.key),
				fmt.Sprintf(`CREATE TRIGGER version_write AFTER INSERT OR UPDATE ON %s.%s FOR EACH ROW EXECUTE FUNCTION %[1]s.%[2]s_version()`, s, d.table))
		}
	}
	if ddl {
		stmts = append(stmts, `DROP SCHEMA IF EXISTS `+moved+` CASCADE`, `CREATE SCHEMA `+moved)
		for _, t := range ddlTables {
			stmts = append(stmts, fmt.Sprintf(`CREATE UNIQUE INDEX %[2]s_ver_key ON %[1]s.%[2]s (ver)`, s, t))
		}
	}
	for _, st := range stmts {
		var args []any
		if strings.Contains(st, "$1") {
			args = []any{tenants}
		}
		if _, err := conn.Exec(ctx, st, args...); err != nil {
			return "", fmt.Errorf("set up the workload (%.60s...): %w", st, err)
		}
	}
	return collation, nil
}

// workload writes random transactions on several connections until ctx ends, reconnecting after
// a fault. It writes to the tables under their current names and sets the newest column the
// harness added to each (schema), as an application that follows its own migrations would.
//
// The connections' transactions overlap: one of them keeps each of its transactions open for up
// to two seconds between two statements, across the watermarks of chunks read meanwhile. A
// statement that writes a key first takes a transaction-level advisory lock on it, and draws its
// version after it: the versions of a key grow in commit order whatever the interleaving (an
// upsert's version is drawn before it meets the conflicting row it waits for).
type workload struct {
	dsn    string
	seed   uint64
	rows   int
	schema *schemaState
	// bigValue is the size of the values written now and then above the chunk byte bound (0:
	// none).
	bigValue int
	commits  atomic.Int64 // transactions committed
	next     atomic.Int64 // the next new id of accounts
	nextSKU  atomic.Int64 // the next new sku of items
	nextCode atomic.Int64 // the next new code of notes
	// gate is held (read) by each transaction; pause takes it to stop the workload between
	// transactions (while the source is restored).
	gate sync.RWMutex
	pace *pacer // Config.Rate; nil: no bound
}

// connections is how many connections the workload writes on; the last keeps its transactions
// open for long.
const connections = 3

// pacer spaces the workload's transactions (Config.Rate): each connection takes the next start
// time, one interval after the last one given out, and waits for it; a nil pacer never waits.
// After a pause (the gate, a fault) the schedule starts again from now rather than catching up.
type pacer struct {
	mu    sync.Mutex
	every time.Duration
	next  time.Time
}

func newPacer(rate int) *pacer {
	if rate <= 0 {
		return nil
	}
	return &pacer{every: time.Second / time.Duration(rate)}
}

func (p *pacer) wait(ctx context.Context) {
	if p == nil {
		return
	}
	p.mu.Lock()
	now := time.Now()
	if p.next.Before(now) {
		p.next = now
	}
	at := p.next
	p.next = p.next.Add(p.every)
	p.mu.Unlock()
	sleep(ctx, time.Until(at))
}

// pause stops the workload once its transactions in progress have ended; resume lets it go on.
func (w *workload) pause()  { w.gate.Lock() }
func (w *workload) resume() { w.gate.Unlock() }

func (w *workload) run(ctx context.Context) {
	w.next.Store(int64(w.rows) + 1)
	w.nextSKU.Store(1000)
	w.nextCode.Store(1)
	var wg sync.WaitGroup
	for i := range connections {
		rng := rand.New(rand.NewPCG(w.seed, uint64(10+i)))
		wg.Go(func() { w.connection(ctx, rng, i == connections-1) })
	}
	wg.Wait()
}

// connection writes transactions on one connection; long ones stay open for up to 2 s.
func (w *workload) connection(ctx context.Context, rng *rand.Rand, long bool) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for ctx.Err() == nil {
		if conn == nil || conn.IsClosed() {
			c, err := pgconf.Open(ctx, w.dsn, "tidemark-chaos")
			if err != nil {
				sleep(ctx, 200*time.Millisecond)
				continue
			}
			conn = c
		}
		w.pace.wait(ctx)
		w.gate.RLock()
		stmts := w.transaction(rng)
		if long {
			// Open across the watermarks of the chunks read meanwhile.
			at := rng.IntN(len(stmts) + 1)
			pause := fmt.Sprintf(`SELECT pg_sleep(%.3f)`, 0.2+rng.Float64()*1.8)
			stmts = append(stmts[:at], append([]string{pause}, stmts[at:]...)...)
		}
		stmts = append(stmts, `INSERT INTO `+w.schema.schema+`.txlog DEFAULT VALUES`)
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := conn.Exec(tctx, "BEGIN; "+strings.Join(stmts, "; ")+"; COMMIT")
		cancel()
		w.gate.RUnlock()
		if err != nil {
			if !conn.IsClosed() {
				_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
			}
			continue
		}
		w.commits.Add(1)
		if !long {
			sleep(ctx, time.Duration(rng.IntN(3))*time.Millisecond)
		}
	}
}

// lock is the statement that takes the advisory locks of keys of table (their text), in order.
func lock(table string, keys ...string) string {
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf(`pg_advisory_xact_lock(hashtextextended(%s, 0))`, quote(table+":"+k)))
	}
	return `SELECT ` + strings.Join(parts, ", ")
}

// quote quotes s as an SQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// amount draws a value of accounts.amount: a numeric whose scale and digits the output must
// keep, now and then NaN or NULL.
func amount(r *rand.Rand) string {
	switch r.IntN(12) {
	case 0:
		return `'NaN'`
	case 1:
		return `NULL`
	case 2:
		return `123456789012345678.123456`
	case 3:
		return `-0.000001`
	default:
		return fmt.Sprintf(`%d.%02d0000`, r.IntN(100000), r.IntN(100))
	}
}

// score draws a value of notes.score: floats whose text the output must keep (NaN, infinities,
// -0, the shortest digits of an inexact value).
func score(r *rand.Rand) string {
	switch r.IntN(10) {
	case 0:
		return `'NaN'`
	case 1:
		return `'Infinity'`
	case 2:
		return `'-Infinity'`
	case 3:
		return `'-0'`
	case 4:
		return `0.1::float8 + 0.2::float8`
	case 5:
		return `NULL`
	case 6:
		return `1e-310`
	default:
		return fmt.Sprintf(`%d.%d`, r.IntN(1000), r.IntN(1000))
	}
}

// transaction draws the statements of one transaction: one to four changes, sometimes a large
// one, over the three tables. The draws do not depend on the schema faults, so a seed draws the
// same transactions with or without them.
func (w *workload) transaction(r *rand.Rand) []string {
	n := w.schema.view()
	acc, items, notes := n.names["accounts"], n.names["items"], n.names["notes"]
	ver := `nextval('` + w.schema.schema + `.ver')`
	var out []string
	add := func(stmts ...string) { out = append(out, stmts...) }
	toast := func(seed string, min, spread int) string {
		return fmt.Sprintf("repeat(md5(%s), %d)", quote(seed), min+r.IntN(spread))
	}
	big := func(seed string) string {
		// Now and then above the chunk byte bound: a chunk holds such a row alone.
		if w.bigValue > 0 && r.IntN(60) == 0 {
			return fmt.Sprintf("repeat(md5(%s), %d)", quote(seed), w.bigValue/32+r.IntN(w.bigValue/32))
		}
		return toast(seed, 200, 2000)
	}
	for range 1 + r.IntN(4) {
		next := w.next.Load()
		id := 1 + r.Int64N(next)
		ids := fmt.Sprint(id)
		switch k := r.IntN(100); {
		case k < 15:
			to := w.next.Add(1) - 1
			value := "NULL"
			if r.IntN(10) == 0 {
				value = big(fmt.Sprint(to)) // TOASTed
			}
			add(lock("accounts", fmt.Sprint(to)),
				fmt.Sprintf(`INSERT INTO %s AS t (id, ver, v, big, amount%s) VALUES (%d, %s, 'new', %s, %s%s) ON CONFLICT (id) DO UPDATE SET ver = %s, v = 'upserted'%s`,
					acc, n.col("accounts"), to, ver, value, amount(r), n.val("accounts", "'n'"), ver, n.set("accounts", "'upserted'")))
		case k < 35:
			// Leaves big alone: an unchanged TOASTed value in the stream.
			add(lock("accounts", ids), fmt.Sprintf(`UPDATE %s SET v = v || 'u'%s, ver = %s WHERE id = %d`, acc, n.set("accounts", "'u'"), ver, id))
		case k < 39:
			add(lock("accounts", ids), fmt.Sprintf(`UPDATE %s SET big = %s, ver = %s WHERE id = %d`, acc, big(ids), ver, id))
		case k < 42:
			// Values set to NULL, TOASTed ones too.
			col := []string{"v", "big", "amount"}[r.IntN(3)]
			add(lock("accounts", ids), fmt.Sprintf(`UPDATE %s SET %s = NULL, ver = %s WHERE id = %d`, acc, col, ver, id))
		case k < 45:
			add(lock("accounts", ids), fmt.Sprintf(`UPDATE %s SET amount = %s, ver = %s WHERE id = %d`, acc, amount(r), ver, id))
		case k < 50:
			add(lock("accounts", ids), fmt.Sprintf(`DELETE FROM %s WHERE id = %d`, acc, id))
		case k < 53:
			// A key change, to a new key.
			to := w.next.Add(1) - 1
			add(lock("accounts", ids, fmt.Sprint(to)), fmt.Sprintf(`UPDATE %s SET id = %d, ver = %s WHERE id = %d`, acc, to, ver, id))
		case k < 55:
			// A key swap, through a new key.
			other := 1 + r.Int64N(next)
			if other == id {
				continue
			}
			tmp := w.next.Add(1) - 1
			add(lock("accounts", ids, fmt.Sprint(other), fmt.Sprint(tmp)),
				fmt.Sprintf(`UPDATE %s SET id = %d, ver = %s WHERE id = %d`, acc, tmp, ver, id),
				fmt.Sprintf(`UPDATE %s SET id = %d, ver = %s WHERE id = %d`, acc, id, ver, other),
				fmt.Sprintf(`UPDATE %s SET id = %d, ver = %s WHERE id = %d`, acc, other, ver, tmp))
		case k < 57:
			// A move onto a key freed in the same transaction.
			other := 1 + r.Int64N(next)
			if other == id {
				continue
			}
			add(lock("accounts", ids, fmt.Sprint(other)),
				fmt.Sprintf(`DELETE FROM %s WHERE id = %d`, acc, other),
				fmt.Sprintf(`UPDATE %s SET id = %d, ver = %s WHERE id = %d`, acc, other, ver, id))
		case k < 59:
			// A TOASTed row deleted and inserted again, sometimes updated after without its
			// TOASTed value.
			add(lock("accounts", ids),
				fmt.Sprintf(`DELETE FROM %s WHERE id = %d`, acc, id),
				fmt.Sprintf(`INSERT INTO %s (id, ver, v, big%s) VALUES (%d, %s, 'again', %s%s)`, acc, n.col("accounts"), id, ver, big(ids), n.val("accounts", "'a'")))
			if r.IntN(2) == 0 {
				add(fmt.Sprintf(`UPDATE %s SET v = 'after', ver = %s WHERE id = %d`, acc, ver, id))
			}
		case k < 60:
			// A large transaction: hundreds of rows in one statement (each takes its row's lock
			// before it draws its version).
			add(fmt.Sprintf(`UPDATE %s SET v = 'bulk'%s, ver = %s WHERE id BETWEEN %d AND %d`, acc, n.set("accounts", "'bulk'"), ver, id, id+200+int64(r.IntN(1500))))
		case k < 80:
			t := tenants[r.IntN(len(tenants))]
			sku := 1 + r.IntN(300)
			key := fmt.Sprintf("%s\x1f%d", t, sku)
			where := fmt.Sprintf(`WHERE tenant = %s AND sku = %d`, quote(t), sku)
			switch r.IntN(8) {
			case 0, 1:
				v := "'i'"
				if r.IntN(8) == 0 {
					v = toast(key, 100, 600)
				}
				add(lock("items", key), fmt.Sprintf(`INSERT INTO %s AS t (tenant, sku, ver, v%s) VALUES (%s, %d, %s, %s%s) ON CONFLICT (tenant, sku) DO UPDATE SET ver = %s, v = 'again'%s`,
					items, n.col("items"), quote(t), sku, ver, v, n.val("items", "'i'"), ver, n.set("items", "'again'")))
			case 2:
				add(lock("items", key), fmt.Sprintf(`UPDATE %s SET v = v || 'u'%s, ver = %s %s`, items, n.set("items", "'u'"), ver, where))
			case 3:
				// Leaves a TOASTed v alone.
				add(lock("items", key), fmt.Sprintf(`UPDATE %s SET ver = %s%s %s`, items, ver, n.set("items", "'t'"), where))
			case 4:
				add(lock("items", key), fmt.Sprintf(`UPDATE %s SET v = NULL, ver = %s %s`, items, ver, where))
			case 5:
				add(lock("items", key), fmt.Sprintf(`DELETE FROM %s %s`, items, where))
			case 6:
				// A key change: to a new sku, or onto another tenant's key freed first.
				if r.IntN(2) == 0 {
					to := w.nextSKU.Add(1) - 1
					add(lock("items", key, fmt.Sprintf("%s\x1f%d", t, to)), fmt.Sprintf(`UPDATE %s SET sku = %d, ver = %s %s`, items, to, ver, where))
				} else {
					t2 := tenants[r.IntN(len(tenants))]
					if t2 == t {
						continue
					}
					add(lock("items", key, fmt.Sprintf("%s\x1f%d", t2, sku)),
						fmt.Sprintf(`DELETE FROM %s WHERE tenant = %s AND sku = %d`, items, quote(t2), sku),
						fmt.Sprintf(`UPDATE %s SET tenant = %s, ver = %s %s`, items, quote(t2), ver, where))
				}
			default:
				add(lock("items", key), fmt.Sprintf(`UPDATE %s SET v = %s, ver = %s %s`, items, toast(key, 100, 600), ver, where))
			}
		default:
			code := fmt.Sprintf("n-%d", 1+r.IntN(1200))
			where := `WHERE code = ` + quote(code)
			switch r.IntN(10) {
			case 0, 1:
				add(lock("notes", code), fmt.Sprintf(`DELETE FROM %s %s`, notes, where))
			case 2:
				// Leaves a TOASTed body alone.
				add(lock("notes", code), fmt.Sprintf(`UPDATE %s SET score = %s, ver = %s%s %s`, notes, score(r), ver, n.set("notes", "'s'"), where))
			case 3:
				add(lock("notes", code), fmt.Sprintf(`UPDATE %s SET body = NULL, ver = %s %s`, notes, ver, where))
			case 4:
				// A text key changes: to a new code, or onto one freed first, or swapped.
				other := fmt.Sprintf("n-%d", 1+r.IntN(1200))
				if other == code {
					continue
				}
				switch r.IntN(3) {
				case 0:
					to := fmt.Sprintf("m-%d", w.nextCode.Add(1)-1)
					add(lock("notes", code, to), fmt.Sprintf(`UPDATE %s SET code = %s, ver = %s %s`, notes, quote(to), ver, where))
				case 1:
					add(lock("notes", code, other),
						fmt.Sprintf(`DELETE FROM %s WHERE code = %s`, notes, quote(other)),
						fmt.Sprintf(`UPDATE %s SET code = %s, ver = %s %s`, notes, quote(other), ver, where))
				default:
					tmp := fmt.Sprintf("m-%d", w.nextCode.Add(1)-1)
					add(lock("notes", code, other, tmp),
						fmt.Sprintf(`UPDATE %s SET code = %s, ver = %s %s`, notes, quote(tmp), ver, where),
						fmt.Sprintf(`UPDATE %s SET code = %s, ver = %s WHERE code = %s`, notes, quote(code), ver, quote(other)),
						fmt.Sprintf(`UPDATE %s SET code = %s, ver = %s WHERE code = %s`, notes, quote(other), ver, quote(tmp)))
				}
			default:
				body := "'b'"
				if r.IntN(6) == 0 {
					body = toast(code, 100, 800)
				}
				add(lock("notes", code), fmt.Sprintf(`INSERT INTO %s AS t (code, ver, body, score%s) VALUES (%s, %s, %s, %s%s) ON CONFLICT (code) DO UPDATE SET ver = %s, body = t.body || 'x'%s`,
					notes, n.col("notes"), quote(code), ver, body, score(r), n.val("notes", "'b'"), ver, n.set("notes", "'x'")))
			}
		}
	}
	return out
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
