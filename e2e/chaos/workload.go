package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
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

// setup creates the schema and its tables with rows initial rows in accounts.
func setup(ctx context.Context, conn *pgx.Conn, rows int) (collation string, err error) {
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

// workload writes random transactions until ctx ends, reconnecting after a fault.
type workload struct {
	dsn     string
	rng     *rand.Rand
	rows    int
	commits atomic.Int64 // transactions committed
}

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
		stmts := w.transaction(&next)
		stmts = append(stmts, `INSERT INTO `+Schema+`.txlog DEFAULT VALUES`)
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := conn.Exec(tctx, "BEGIN; "+strings.Join(stmts, "; ")+"; COMMIT")
		cancel()
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
// one, over the three tables.
func (w *workload) transaction(next *int64) []string {
	r := w.rng
	s := Schema
	ver := `nextval('` + s + `.ver')`
	var out []string
	for range 1 + r.IntN(4) {
		id := 1 + r.Int64N(*next)
		switch n := r.IntN(100); {
		case n < 20:
			big := "NULL"
			if r.IntN(10) == 0 {
				big = fmt.Sprintf("repeat(md5('%d'), %d)", id, 200+r.IntN(2000)) // TOASTed
			}
			out = append(out, fmt.Sprintf(`INSERT INTO %s.accounts VALUES (%d, %s, 'new', %s) ON CONFLICT (id) DO UPDATE SET ver = excluded.ver, v = 'upserted'`, s, *next, ver, big))
			*next++
		case n < 45:
			// Leaves big alone: an unchanged TOASTed value in the stream.
			out = append(out, fmt.Sprintf(`UPDATE %s.accounts SET v = v || 'u', ver = %s WHERE id = %d`, s, ver, id))
		case n < 50:
			out = append(out, fmt.Sprintf(`UPDATE %s.accounts SET big = repeat(md5(v), %d), ver = %s WHERE id = %d`, s, 100+r.IntN(1000), ver, id))
		case n < 58:
			out = append(out, fmt.Sprintf(`DELETE FROM %s.accounts WHERE id = %d`, s, id))
		case n < 63:
			to := *next
			*next++
			out = append(out, fmt.Sprintf(`UPDATE %s.accounts SET id = %d, ver = %s WHERE id = %d`, s, to, ver, id))
		case n < 64:
			// A large transaction: hundreds of rows in one statement.
			out = append(out, fmt.Sprintf(`UPDATE %s.accounts SET v = 'bulk', ver = %s WHERE id BETWEEN %d AND %d`, s, ver, id, id+200+int64(r.IntN(1500))))
		case n < 80:
			t := tenants[r.IntN(len(tenants))]
			sku := 1 + r.IntN(300)
			switch r.IntN(3) {
			case 0:
				out = append(out, fmt.Sprintf(`INSERT INTO %s.items VALUES ('%s', %d, %s, 'i') ON CONFLICT (tenant, sku) DO UPDATE SET ver = excluded.ver, v = 'again'`, s, t, sku, ver))
			case 1:
				out = append(out, fmt.Sprintf(`UPDATE %s.items SET v = v || 'u', ver = %s WHERE tenant = '%s' AND sku = %d`, s, ver, t, sku))
			default:
				out = append(out, fmt.Sprintf(`DELETE FROM %s.items WHERE tenant = '%s' AND sku = %d`, s, t, sku))
			}
		default:
			code := fmt.Sprintf("n-%d", 1+r.IntN(1200))
			if r.IntN(4) == 0 {
				out = append(out, fmt.Sprintf(`DELETE FROM %s.notes WHERE code = '%s'`, s, code))
			} else {
				out = append(out, fmt.Sprintf(`INSERT INTO %s.notes VALUES ('%s', %s, 'b') ON CONFLICT (code) DO UPDATE SET ver = excluded.ver, body = %s.notes.body || 'x'`, s, code, ver, s))
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
