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
)

// The workload lives in its own schema. Every row has a version (ver) drawn from one sequence:
// it only grows, across deletes and key changes too, which is what the oracle checks (I2, I3).
// Every transaction also writes a row of txlog with the time it ran: the audit of the
// PostgreSQL target, and the live changes whose delivery latency the report gives.

// Schema is the scratch schema a run creates, uses and drops; it touches nothing else of the
// database but its slot and publication (named after the run) and its signal table (in Schema).
const Schema = "tidemark_chaos"

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

// keys returns the key columns by schema.table.
func keys() map[string][]string {
	out := map[string][]string{}
	for _, t := range tables {
		out[Schema+"."+t.name] = t.key
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
func setup(ctx context.Context, conn *pgx.Conn, rows int, ddl bool) (collation string, err error) {
	collation = "C"
	var icu bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'und-x-icu')`).Scan(&icu); err == nil && icu {
		collation = "und-x-icu"
	}
	stmts := []string{
		`DROP SCHEMA IF EXISTS ` + Schema + ` CASCADE`,
		`CREATE SCHEMA ` + Schema,
		`CREATE SEQUENCE ` + Schema + `.ver`,
		`CREATE TABLE ` + Schema + `.accounts (id bigint PRIMARY KEY, ver bigint NOT NULL, v text, big text)`,
		`ALTER TABLE ` + Schema + `.accounts ALTER COLUMN big SET STORAGE EXTERNAL`,
		fmt.Sprintf(`CREATE TABLE %s.items (tenant text COLLATE %q, sku int, ver bigint NOT NULL, v text, PRIMARY KEY (tenant, sku))`, Schema, collation),
		`CREATE TABLE ` + Schema + `.notes (code text PRIMARY KEY, ver bigint NOT NULL, body text)`,
		`CREATE TABLE ` + Schema + `.txlog (id bigserial PRIMARY KEY, xid xid8 NOT NULL DEFAULT pg_current_xact_id(), at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		fmt.Sprintf(`INSERT INTO %[1]s.accounts SELECT g, nextval('%[1]s.ver'), md5(g::text), CASE WHEN g %% 50 = 0 THEN repeat(md5(g::text), 300) END FROM generate_series(1, %[2]d) g`, Schema, rows),
		fmt.Sprintf(`INSERT INTO %[1]s.items SELECT t, s, nextval('%[1]s.ver'), 'i' FROM unnest($1::text[]) t, generate_series(1, 200) s`, Schema),
		fmt.Sprintf(`INSERT INTO %[1]s.notes SELECT 'n-' || g, nextval('%[1]s.ver'), 'note ' || g FROM generate_series(1, 1000) g`, Schema),
	}
	if ddl {
		stmts = append(stmts, `DROP SCHEMA IF EXISTS `+MovedSchema+` CASCADE`, `CREATE SCHEMA `+MovedSchema)
		for _, t := range ddlTables {
			stmts = append(stmts, fmt.Sprintf(`CREATE UNIQUE INDEX %[2]s_ver_key ON %[1]s.%[2]s (ver)`, Schema, t))
		}
	}
	for _, s := range stmts {
		var args []any
		if strings.Contains(s, "$1") {
			args = []any{tenants}
		}
		if _, err := conn.Exec(ctx, s, args...); err != nil {
			return "", fmt.Errorf("set up the workload (%.60s...): %w", s, err)
		}
	}
	return collation, nil
}

// workload writes random transactions until ctx ends, reconnecting after a fault. It writes to
// the tables under their current names and sets the newest column the harness added to each
// (schema), as an application that follows its own migrations would.
type workload struct {
	dsn     string
	rng     *rand.Rand
	rows    int
	schema  *schemaState
	commits atomic.Int64 // transactions committed
	// gate is held (read) by each transaction; pause takes it to stop the workload between
	// transactions (while the source is restored).
	gate sync.RWMutex
}

// pause stops the workload once its transaction in progress has ended; resume lets it go on.
func (w *workload) pause()  { w.gate.Lock() }
func (w *workload) resume() { w.gate.Unlock() }

func (w *workload) run(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	next := int64(w.rows) + 1
	for ctx.Err() == nil {
		if conn == nil || conn.IsClosed() {
			c, err := pgx.Connect(ctx, w.dsn)
			if err != nil {
				sleep(ctx, 200*time.Millisecond)
				continue
			}
			conn = c
		}
		w.gate.RLock()
		stmts := w.transaction(&next)
		stmts = append(stmts, `INSERT INTO `+Schema+`.txlog DEFAULT VALUES`)
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
		sleep(ctx, time.Duration(w.rng.IntN(3))*time.Millisecond)
	}
}

// transaction draws the statements of one transaction: one to four changes, sometimes a large
// one, over the three tables. The draws do not depend on the schema faults, so a seed draws the
// same transactions with or without them.
func (w *workload) transaction(next *int64) []string {
	r := w.rng
	n := w.schema.view()
	acc, items, notes := n.names["accounts"], n.names["items"], n.names["notes"]
	ver := `nextval('` + Schema + `.ver')`
	var out []string
	for range 1 + r.IntN(4) {
		id := 1 + r.Int64N(*next)
		switch k := r.IntN(100); {
		case k < 20:
			big := "NULL"
			if r.IntN(10) == 0 {
				big = fmt.Sprintf("repeat(md5('%d'), %d)", id, 200+r.IntN(2000)) // TOASTed
			}
			out = append(out, fmt.Sprintf(`INSERT INTO %s AS t (id, ver, v, big%s) VALUES (%d, %s, 'new', %s%s) ON CONFLICT (id) DO UPDATE SET ver = excluded.ver, v = 'upserted'%s`,
				acc, n.col("accounts"), *next, ver, big, n.val("accounts", "'n'"), n.set("accounts", "'upserted'")))
			*next++
		case k < 45:
			// Leaves big alone: an unchanged TOASTed value in the stream.
			out = append(out, fmt.Sprintf(`UPDATE %s SET v = v || 'u'%s, ver = %s WHERE id = %d`, acc, n.set("accounts", "'u'"), ver, id))
		case k < 50:
			out = append(out, fmt.Sprintf(`UPDATE %s SET big = repeat(md5(v), %d), ver = %s WHERE id = %d`, acc, 100+r.IntN(1000), ver, id))
		case k < 58:
			out = append(out, fmt.Sprintf(`DELETE FROM %s WHERE id = %d`, acc, id))
		case k < 63:
			to := *next
			*next++
			out = append(out, fmt.Sprintf(`UPDATE %s SET id = %d, ver = %s WHERE id = %d`, acc, to, ver, id))
		case k < 64:
			// A large transaction: hundreds of rows in one statement.
			out = append(out, fmt.Sprintf(`UPDATE %s SET v = 'bulk'%s, ver = %s WHERE id BETWEEN %d AND %d`, acc, n.set("accounts", "'bulk'"), ver, id, id+200+int64(r.IntN(1500))))
		case k < 80:
			t := tenants[r.IntN(len(tenants))]
			sku := 1 + r.IntN(300)
			switch r.IntN(3) {
			case 0:
				out = append(out, fmt.Sprintf(`INSERT INTO %s AS t (tenant, sku, ver, v%s) VALUES ('%s', %d, %s, 'i'%s) ON CONFLICT (tenant, sku) DO UPDATE SET ver = excluded.ver, v = 'again'%s`,
					items, n.col("items"), t, sku, ver, n.val("items", "'i'"), n.set("items", "'again'")))
			case 1:
				out = append(out, fmt.Sprintf(`UPDATE %s SET v = v || 'u'%s, ver = %s WHERE tenant = '%s' AND sku = %d`, items, n.set("items", "'u'"), ver, t, sku))
			default:
				out = append(out, fmt.Sprintf(`DELETE FROM %s WHERE tenant = '%s' AND sku = %d`, items, t, sku))
			}
		default:
			code := fmt.Sprintf("n-%d", 1+r.IntN(1200))
			if r.IntN(4) == 0 {
				out = append(out, fmt.Sprintf(`DELETE FROM %s WHERE code = '%s'`, notes, code))
			} else {
				out = append(out, fmt.Sprintf(`INSERT INTO %s AS t (code, ver, body%s) VALUES ('%s', %s, 'b'%s) ON CONFLICT (code) DO UPDATE SET ver = excluded.ver, body = t.body || 'x'%s`,
					notes, n.col("notes"), code, ver, n.val("notes", "'b'"), n.set("notes", "'x'")))
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
