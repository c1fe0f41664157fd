package chunker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/sqlfix"
)

// Config configures a Reader.
type Config struct {
	// StatementTimeout bounds each chunk's statements. Zero: 30s.
	StatementTimeout time.Duration
	// LockTimeout bounds the wait for the table's ACCESS SHARE lock, so that a chunk queued behind
	// an ALTER TABLE gives up instead of making the application's queries queue behind both.
	// Zero: 2s.
	LockTimeout time.Duration
	// MaxBytes bounds the bytes of values a chunk holds: a chunk ends early (not Done) once its
	// rows reach it, whatever its row limit. One row larger than it is still read whole. Zero:
	// 32 MiB.
	MaxBytes int
}

// Validate reports every problem of c at once.
func (c *Config) Validate() error {
	if c.StatementTimeout < 0 || c.LockTimeout < 0 || c.MaxBytes < 0 {
		return errors.New("chunk timeouts and byte bound must not be negative")
	}
	return nil
}

func (c *Config) ensureDefaults() {
	if c.StatementTimeout == 0 {
		c.StatementTimeout = 30 * time.Second
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = 2 * time.Second
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 32 << 20
	}
}

// Row is one row of a chunk: a text value per column of the Table, nil for NULL.
type Row [][]byte

// Snapshot is the MVCC snapshot a chunk was read in (pg_current_snapshot()): transactions with
// ids below Xmin are visible, from Xmax on invisible, and those in Xip were running.
type Snapshot struct {
	Xmin uint64
	Xmax uint64
	Xip  []uint64
}

// Chunk is one keyset page of a table, read in one short REPEATABLE READ transaction.
type Chunk struct {
	Table    *Table   // the table as the chunk read it
	After    []string // exclusive lower bound (key text values); nil from the start
	Rows     []Row    // the rows, in key order
	Last     []string // key of the last row; nil when there are no rows
	Done     bool     // fewer rows than the limit: nothing remains up to the upper bound
	Snapshot Snapshot // the chunk's snapshot
	Bytes    int      // total size of the values
	Capped   bool     // the chunk ended at Config.MaxBytes, before its row limit
	Upper    []string // First: the backfill's upper bound, read in the chunk's snapshot; nil: the table is empty
}

// Reader reads chunks on a query connection it does not own.
type Reader struct {
	conn     *pgx.Conn
	cfg      Config
	rowBytes map[uint32]int // the last chunk's mean row size, by table OID: the next fetch's size
}

// NewReader returns a Reader on conn.
func NewReader(conn *pgx.Conn, cfg Config) (*Reader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.ensureDefaults()
	return &Reader{conn: conn, cfg: cfg, rowBytes: map[uint32]int{}}, nil
}

// First reads the first chunk of t's backfill: in one transaction, under one snapshot, the
// table's last key in key order (Chunk.Upper: the backfill's upper bound from then on; nil when
// the table is empty) and the chunk up to it. The backfill never reads past that bound, so rows
// inserted later, which the stream carries, cannot stretch it (I15). Reading the bound with the
// chunk puts it under the chunk's snapshot, which the visibility guard checks (I11): a bound read
// apart could miss a row whose commit the stream showed before the window and the snapshot did
// not yet see.
func (r *Reader) First(ctx context.Context, t *Table, limit int) (*Chunk, error) {
	if limit < 1 {
		return nil, fmt.Errorf("chunk limit %d: must be positive", limit)
	}
	c := &Chunk{Table: t}
	err := r.inTx(ctx, t, func(ctx context.Context) error {
		snap, err := r.snapshot(ctx, t)
		if err != nil {
			return err
		}
		c.Snapshot = snap
		rr := r.conn.PgConn().ExecParams(ctx, MaxKeySQL(t), nil, nil, nil, nil)
		for rr.NextRow() {
			for _, v := range rr.Values() {
				c.Upper = append(c.Upper, string(v))
			}
		}
		if _, err := rr.Close(); err != nil {
			return err
		}
		if c.Upper == nil {
			return nil // empty
		}
		args, err := boundArgs(t, nil, c.Upper)
		if err != nil {
			return err
		}
		return r.readRows(ctx, ChunkSQL(t, false, true, limit), args, nil, c, limit)
	})
	if err != nil {
		return nil, fmt.Errorf("read the first chunk of %s: %w", t, err)
	}
	c.Done = len(c.Rows) < limit && !c.Capped
	return c, nil
}

// Next reads the chunk of t after the exclusive bound after (nil: from the start) up to the
// inclusive bound upper (nil: no bound), with at most limit rows. The transaction also captures
// its snapshot and checks that the table still has the columns t describes; if not, it returns
// ErrSchemaChanged and the caller discovers the table again.
func (r *Reader) Next(ctx context.Context, t *Table, after, upper []string, limit int) (*Chunk, error) {
	if limit < 1 {
		return nil, fmt.Errorf("chunk limit %d: must be positive", limit)
	}
	args, err := boundArgs(t, after, upper)
	if err != nil {
		return nil, err
	}
	c := &Chunk{Table: t, After: after}
	err = r.inTx(ctx, t, func(ctx context.Context) error {
		snap, err := r.snapshot(ctx, t)
		if err != nil {
			return err
		}
		c.Snapshot = snap
		return r.readRows(ctx, ChunkSQL(t, after != nil, upper != nil, limit), args, nil, c, limit)
	})
	if err != nil {
		return nil, fmt.Errorf("read chunk of %s after %v: %w", t, after, err)
	}
	c.Done = len(c.Rows) < limit && !c.Capped
	return c, nil
}

// boundArgs are the parameters of a chunk query: the bounds' text values that are present.
func boundArgs(t *Table, after, upper []string) ([][]byte, error) {
	var args [][]byte
	for _, k := range [][]string{after, upper} {
		if k == nil {
			continue
		}
		if len(k) != len(t.Key) {
			return nil, fmt.Errorf("chunk bound %q of %s: the key has %d columns", k, t, len(t.Key))
		}
		for _, v := range k {
			args = append(args, []byte(v))
		}
	}
	return args, nil
}

// Explain returns the plan of the chunk query Next would run, in the transaction Next would run
// it in (for tests and diagnostics).
func (r *Reader) Explain(ctx context.Context, t *Table, after, upper []string, limit int) (string, error) {
	args, err := boundArgs(t, after, upper)
	if err != nil {
		return "", err
	}
	var plan []string
	err = r.inTx(ctx, t, func(ctx context.Context) error {
		res := r.conn.PgConn().ExecParams(ctx, "EXPLAIN "+ChunkSQL(t, after != nil, upper != nil, limit), args, nil, nil, nil).Read()
		if res.Err != nil {
			return res.Err
		}
		for _, row := range res.Rows {
			plan = append(plan, string(row[0]))
		}
		return nil
	})
	return strings.Join(plan, "\n"), err
}

// Keys reads the rows of t with the given keys (text values), in key order: a key-list chunk.
func (r *Reader) Keys(ctx context.Context, t *Table, keys [][]string) (*Chunk, error) {
	var args [][]byte
	for _, k := range keys {
		if len(k) != len(t.Key) {
			return nil, fmt.Errorf("key %q of %s: the key has %d columns", k, t, len(t.Key))
		}
		for _, v := range k {
			args = append(args, []byte(v))
		}
	}
	c := &Chunk{Table: t, Done: true}
	err := r.inTx(ctx, t, func(ctx context.Context) error {
		snap, err := r.snapshot(ctx, t)
		if err != nil {
			return err
		}
		c.Snapshot = snap
		return r.readRows(ctx, KeysSQL(t, len(keys)), args, KeysParams(t, len(keys)), c, len(keys))
	})
	if err != nil {
		return nil, fmt.Errorf("read %d keys of %s: %w", len(keys), t, err)
	}
	return c, nil
}

// inTx runs fn in a short REPEATABLE READ READ ONLY transaction with the statement and lock
// timeouts, once it holds t's ACCESS SHARE lock.
//
// The lock comes first, before anything takes the transaction's snapshot (LOCK takes none): a
// table-rewriting ALTER (ALTER COLUMN ... TYPE, a volatile default, SET ACCESS METHOD) that
// commits while the chunk waits for its lock writes a new copy of the table whose rows carry the
// ALTER's transaction id, and a snapshot taken before it commits sees none of them (rewrites are
// not MVCC-safe): the chunk would read an empty table and end the backfill. Taken after the lock,
// the snapshot sees the rewrite, and the column check that follows sends the chunk back to
// discovery.
//
// enable_sort is off in it: a chunk must come from the key's index in key order. Without
// statistics (a table just loaded, not analyzed yet) the planner guesses that a key range holds
// 0.5% of the table, fewer rows than a chunk, and prefers to read the whole rest of the range and
// sort it, for every chunk. The setting only makes a sort the last resort: a key whose index
// order differs from the ORDER BY (an index with another collation) is still sorted.
func (r *Reader) inTx(ctx context.Context, t *Table, fn func(context.Context) error) (err error) {
	begin := fmt.Sprintf("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL statement_timeout = %d; SET LOCAL lock_timeout = %d; SET LOCAL enable_sort = off",
		r.cfg.StatementTimeout.Milliseconds(), r.cfg.LockTimeout.Milliseconds())
	if _, err := r.conn.PgConn().Exec(ctx, begin).ReadAll(); err != nil {
		return err
	}
	defer func() {
		end := "COMMIT"
		if err != nil {
			end = "ROLLBACK"
		}
		if _, cerr := r.conn.PgConn().Exec(context.WithoutCancel(ctx), end).ReadAll(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if _, err := r.conn.PgConn().Exec(ctx, "LOCK TABLE "+t.Ident()+" IN ACCESS SHARE MODE").ReadAll(); err != nil {
		if pgerr.UndefinedTable(err) { // renamed or dropped
			return fmt.Errorf("%w: %s: %w", ErrSchemaChanged, t, err)
		}
		return err
	}
	return fn(ctx)
}

// snapshot captures the transaction's snapshot (it is taken by this first query) and checks the
// table's columns in the same round trip.
func (r *Reader) snapshot(ctx context.Context, t *Table) (Snapshot, error) {
	q := fmt.Sprintf(`SELECT pg_current_snapshot()::text, (SELECT string_agg(attname || ':' || atttypid, ',' ORDER BY attnum)
		FROM pg_attribute WHERE attrelid = %d AND attnum > 0 AND NOT attisdropped AND attgenerated = ''),
		(SELECT n.nspname = %s AND c.relname = %s FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %d)`,
		t.OID, sqlfix.Literal(t.Schema), sqlfix.Literal(t.Name), t.OID)
	results, err := r.conn.PgConn().Exec(ctx, q).ReadAll()
	if err != nil {
		return Snapshot{}, err
	}
	if len(results) != 1 || len(results[0].Rows) != 1 {
		return Snapshot{}, errors.New("snapshot query returned no row")
	}
	row := results[0].Rows[0]
	if row[1] == nil {
		return Snapshot{}, fmt.Errorf("%w: %s no longer exists", ErrSchemaChanged, t)
	}
	if string(row[2]) != "t" {
		return Snapshot{}, fmt.Errorf("%w: %s was renamed or moved to another schema", ErrSchemaChanged, t)
	}
	var want []string
	for _, c := range t.Columns {
		want = append(want, fmt.Sprintf("%s:%d", c.Name, c.TypeOID))
	}
	var got []string
	for _, col := range strings.Split(string(row[1]), ",") {
		if name, _, _ := strings.Cut(col, ":"); t.published(name) {
			got = append(got, col)
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		return Snapshot{}, fmt.Errorf("%w: %s now has columns %v, not %v", ErrSchemaChanged, t, got, want)
	}
	return ParseSnapshot(string(row[0]))
}

// readRows runs a chunk query of at most limit rows and keeps its rows, up to Config.MaxBytes of
// values: the query is a cursor fetched in pieces sized from the table's last mean row size, so
// that a chunk of wide rows stops at the byte bound instead of holding limit of them (Capped).
// The connection's buffer is reused, so values are copied, into slabs shared by many rows rather
// than an allocation per row.
func (r *Reader) readRows(ctx context.Context, sql string, args [][]byte, paramOIDs []uint32, c *Chunk, limit int) error {
	const slabSize = 256 << 10
	if res := r.conn.PgConn().ExecParams(ctx, "DECLARE tidemark_chunk NO SCROLL CURSOR FOR "+sql, args, paramOIDs, nil, nil).Read(); res.Err != nil {
		return res.Err
	}
	var slab []byte
	var cells [][]byte
	oid := c.Table.OID
	for len(c.Rows) < limit {
		if c.Bytes >= r.cfg.MaxBytes && len(c.Rows) > 0 {
			c.Capped = true
			break
		}
		n := limit - len(c.Rows)
		if mean := r.rowBytes[oid]; mean > 0 {
			n = min(n, max(1, (r.cfg.MaxBytes-c.Bytes)/mean))
		} else {
			n = 1 // a first look at the table's rows, before their size is known
		}
		got := 0
		rr := r.conn.PgConn().ExecParams(ctx, fmt.Sprintf("FETCH FORWARD %d FROM tidemark_chunk", n), nil, nil, nil, nil)
		for rr.NextRow() {
			got++
			vals := rr.Values()
			size := 0
			for _, v := range vals {
				size += len(v)
			}
			if cap(slab)-len(slab) < size {
				slab = make([]byte, 0, max(slabSize, size))
			}
			if len(cells) < len(vals) {
				cells = make([][]byte, 256*len(vals))
			}
			row := Row(cells[:len(vals):len(vals)])
			cells = cells[len(vals):]
			for i, v := range vals {
				if v == nil {
					row[i] = nil
					continue
				}
				start := len(slab)
				slab = append(slab, v...)
				row[i] = slab[start:len(slab):len(slab)]
			}
			c.Rows = append(c.Rows, row)
			c.Bytes += size
		}
		if _, err := rr.Close(); err != nil {
			return err
		}
		if len(c.Rows) > 0 {
			r.rowBytes[oid] = max(1, c.Bytes/len(c.Rows))
		}
		if got < n {
			break // the query has no more rows
		}
	}
	if n := len(c.Rows); n > 0 {
		last := c.Rows[n-1]
		c.Last = make([]string, len(c.Table.Key))
		for i, k := range c.Table.Key {
			c.Last[i] = string(last[k])
		}
	}
	return nil
}

// ParseSnapshot parses the text form of a pg_snapshot, "xmin:xmax:xip1,xip2,...".
func ParseSnapshot(s string) (Snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Snapshot{}, fmt.Errorf("snapshot %q: want xmin:xmax:xip", s)
	}
	var snap Snapshot
	var err error
	if snap.Xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %q: %w", s, err)
	}
	if snap.Xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %q: %w", s, err)
	}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return Snapshot{}, fmt.Errorf("snapshot %q: %w", s, err)
			}
			snap.Xip = append(snap.Xip, v)
		}
	}
	return snap, nil
}
