package chunker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
// not yet see. It takes two round trips (the bound, then the chunk), besides COMMIT.
func (r *Reader) First(ctx context.Context, t *Table, limit int) (*Chunk, error) {
	if limit < 1 {
		return nil, fmt.Errorf("chunk limit %d: must be positive", limit)
	}
	c := &Chunk{Table: t}
	bound := statement{sql: MaxKeySQL(t), each: func(rr *pgconn.ResultReader) error {
		for rr.NextRow() {
			for _, v := range rr.Values() {
				c.Upper = append(c.Upper, string(v))
			}
		}
		_, err := rr.Close()
		return err
	}}
	err := r.inTx(ctx, t, c, []statement{bound}, func(ctx context.Context) error {
		if c.Upper == nil {
			return nil // empty
		}
		args, err := boundArgs(t, nil, c.Upper)
		if err != nil {
			return err
		}
		rd := r.rows(c, limit)
		if err := r.batch(ctx, rd.open(ChunkSQL(t, false, true, limit), args, nil)...); err != nil {
			return err
		}
		return rd.rest(ctx)
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
// ErrSchemaChanged and the caller discovers the table again. Its statements up to the first
// fetch of rows go in one round trip (inTx); a chunk whose rows need more fetches (the table's
// first chunk, or rows wider than the last chunk's) takes one more each, and COMMIT one.
func (r *Reader) Next(ctx context.Context, t *Table, after, upper []string, limit int) (*Chunk, error) {
	if limit < 1 {
		return nil, fmt.Errorf("chunk limit %d: must be positive", limit)
	}
	args, err := boundArgs(t, after, upper)
	if err != nil {
		return nil, err
	}
	c := &Chunk{Table: t, After: after}
	rd := r.rows(c, limit)
	err = r.inTx(ctx, t, c, rd.open(ChunkSQL(t, after != nil, upper != nil, limit), args, nil), rd.rest)
	if err != nil {
		return nil, fmt.Errorf("read chunk of %s after %v: %w", t, after, err)
	}
	c.Done = len(c.Rows) < limit && !c.Capped
	return c, nil
}

// splitPages is about how many of a table's pages Split samples, and splitSample the most keys
// it reads from them.
const (
	splitPages  = 64
	splitSample = 100000
)

// Split returns at most n-1 keys (text values, in key order) that cut the rows of t after the
// exclusive bound after (nil: from the start) up to the inclusive bound upper into n ranges of
// about as many rows, and an estimate of the rows in that span. It reads a sample of about
// splitPages of the table's pages (TABLESAMPLE SYSTEM, the same pages each time), so its cost
// does not grow with the table, in a transaction like a chunk's (inTx: under the table's ACCESS
// SHARE lock and the chunk timeouts). The points are rows of the sample: a range can hold more
// or fewer rows than another, never a key twice. Fewer points when the sample holds few keys;
// none for a partitioned table, whose root has no pages of its own to sample.
func (r *Reader) Split(ctx context.Context, t *Table, after, upper []string, n int) ([][]string, float64, error) {
	if n < 2 || t.Kind != 'r' {
		return nil, 0, nil
	}
	args, err := boundArgs(t, after, upper)
	if err != nil {
		return nil, 0, err
	}
	var pct float64
	size := statement{sql: fmt.Sprintf("SELECT LEAST(100, 100.0 * %d / GREATEST(1, pg_relation_size(%d) / current_setting('block_size')::int))::float8", splitPages, t.OID),
		each: func(rr *pgconn.ResultReader) error {
			for rr.NextRow() {
				if pct, err = strconv.ParseFloat(string(rr.Values()[0]), 64); err != nil {
					return err
				}
			}
			_, err := rr.Close()
			return err
		}}
	var keys [][]string
	err = r.inTx(ctx, t, &Chunk{Table: t}, []statement{size}, func(ctx context.Context) error {
		if pct <= 0 {
			return nil
		}
		from := fmt.Sprintf("%s TABLESAMPLE pg_catalog.system (%g) REPEATABLE (0)", t.From(), pct)
		sample := statement{sql: KeysetSQL(keyList(t), from, t.KeyNames(), t.KeyOps, after != nil, upper != nil, splitSample), args: args,
			each: func(rr *pgconn.ResultReader) error {
				for rr.NextRow() {
					k := make([]string, 0, len(t.Key))
					for _, v := range rr.Values() {
						k = append(k, string(v))
					}
					keys = append(keys, k)
				}
				_, err := rr.Close()
				return err
			}}
		return r.batch(ctx, sample)
	})
	if err != nil {
		return nil, 0, fmt.Errorf("sample the keys of %s: %w", t, err)
	}
	if pct <= 0 {
		return nil, 0, nil
	}
	est := float64(len(keys)) * 100 / pct
	parts := min(n, len(keys)/2)
	var points [][]string
	for i := 1; i < parts; i++ {
		p := keys[len(keys)*i/parts]
		if upper != nil && slices.Equal(p, upper) {
			break
		}
		points = append(points, p)
	}
	return points, est, nil
}

// keyList is the select list of t's key columns (as MaxKeySQL reads them).
func keyList(t *Table) string {
	cols := make([]string, len(t.Key))
	for i, k := range t.Key {
		cols[i] = quote(t.Columns[k].Name)
	}
	return strings.Join(cols, ", ")
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
	explain := statement{sql: "EXPLAIN " + ChunkSQL(t, after != nil, upper != nil, limit), args: args, each: func(rr *pgconn.ResultReader) error {
		for rr.NextRow() {
			plan = append(plan, string(rr.Values()[0]))
		}
		_, err := rr.Close()
		return err
	}}
	err = r.inTx(ctx, t, &Chunk{Table: t}, []statement{explain}, nil)
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
	rd := r.rows(c, len(keys))
	err := r.inTx(ctx, t, c, rd.open(KeysSQL(t, len(keys)), args, KeysParams(t, len(keys))), rd.rest)
	if err != nil {
		return nil, fmt.Errorf("read %d keys of %s: %w", len(keys), t, err)
	}
	return c, nil
}

// statement is one statement of a round trip (batch): its SQL, bound text parameters (and their
// types, nil: each inferred), and what reads its result (nil: it is discarded).
type statement struct {
	sql  string
	args [][]byte
	oids []uint32
	each func(*pgconn.ResultReader) error
}

// batch sends the statements in one round trip, in order, and hands each result to its reader.
// The server runs them in order and skips those after a failed one.
func (r *Reader) batch(ctx context.Context, stmts ...statement) error {
	b := &pgconn.Batch{}
	for _, s := range stmts {
		b.ExecParams(s.sql, s.args, s.oids, nil, nil)
	}
	mrr := r.conn.PgConn().ExecBatch(ctx, b)
	for i := 0; mrr.NextResult(); i++ {
		rr := mrr.ResultReader()
		if i >= len(stmts) || stmts[i].each == nil {
			// Read to its end: the next result's messages come after this one's rows.
			if _, err := rr.Close(); err != nil {
				_ = mrr.Close()
				return err
			}
			continue
		}
		if err := stmts[i].each(rr); err != nil {
			_ = mrr.Close()
			return err
		}
	}
	return mrr.Close()
}

// inTx runs a chunk's short REPEATABLE READ READ ONLY transaction with the statement and lock
// timeouts, once it holds t's ACCESS SHARE lock: in one round trip, BEGIN, the settings, the
// LOCK, the snapshot with the column check (into c.Snapshot), then stmts (the chunk's cursor and
// its first fetch); then fn, if not nil, for what needs their results; then COMMIT.
//
// The lock comes first, before anything takes the transaction's snapshot (LOCK takes none): a
// table-rewriting ALTER (ALTER COLUMN ... TYPE, a volatile default, SET ACCESS METHOD) that
// commits while the chunk waits for its lock writes a new copy of the table whose rows carry the
// ALTER's transaction id, and a snapshot taken before it commits sees none of them (rewrites are
// not MVCC-safe): the chunk would read an empty table and end the backfill. Taken after the lock,
// the snapshot sees the rewrite, and the column check that follows sends the chunk back to
// discovery. Sent in one round trip, the statements still run one after the other, in order, and
// none runs after one that failed.
//
// enable_sort is off in it: a chunk must come from the key's index in key order. Without
// statistics (a table just loaded, not analyzed yet) the planner guesses that a key range holds
// 0.5% of the table, fewer rows than a chunk, and prefers to read the whole rest of the range and
// sort it, for every chunk. The setting only makes a sort the last resort: a key whose index
// order differs from the ORDER BY (an index with another collation) is still sorted.
func (r *Reader) inTx(ctx context.Context, t *Table, c *Chunk, stmts []statement, fn func(context.Context) error) (err error) {
	var snapRow [][]byte
	head := []statement{
		{sql: "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"},
		// SET, not SELECT set_config(): a SELECT would take the transaction's snapshot before
		// the LOCK (TestRewriteWhileFirstChunkWaits).
		{sql: fmt.Sprintf("SET LOCAL statement_timeout = %d", r.cfg.StatementTimeout.Milliseconds())},
		{sql: fmt.Sprintf("SET LOCAL lock_timeout = %d", r.cfg.LockTimeout.Milliseconds())},
		{sql: "SET LOCAL enable_sort = off"},
		{sql: "LOCK TABLE " + t.Ident() + " IN ACCESS SHARE MODE"},
		{sql: snapshotSQL(t), each: func(rr *pgconn.ResultReader) error {
			for rr.NextRow() {
				snapRow = nil
				for _, v := range rr.Values() {
					snapRow = append(snapRow, bytes.Clone(v))
				}
			}
			_, err := rr.Close()
			return err
		}},
	}
	defer func() {
		// The transaction is open once BEGIN ran, whatever failed after it: end it either way.
		end := "COMMIT"
		if err != nil {
			end = "ROLLBACK"
		}
		if _, cerr := r.conn.PgConn().Exec(context.WithoutCancel(ctx), end).ReadAll(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	err = r.batch(ctx, append(head, stmts...)...)
	if err != nil && pgerr.UndefinedTable(err) && snapRow == nil { // the LOCK: renamed or dropped
		return fmt.Errorf("%w: %s: %w", ErrSchemaChanged, t, err)
	}
	if snapRow != nil {
		// The snapshot's check first: a statement after it that failed because the table changed
		// is better told by what changed.
		snap, serr := checkSnapshot(t, snapRow)
		if serr != nil {
			return serr
		}
		c.Snapshot = snap
	}
	if err != nil {
		return err
	}
	if fn != nil {
		return fn(ctx)
	}
	return nil
}

// snapshotSQL captures the transaction's snapshot (it is taken by this first query) and reads
// the table's columns (names, types and type modifiers: a modifier changed without a rewrite
// changes some outputs' forms) and name, which checkSnapshot compares.
func snapshotSQL(t *Table) string {
	return fmt.Sprintf(`SELECT pg_current_snapshot()::text, (SELECT string_agg(attname || ':' || atttypid || ':' || atttypmod, ',' ORDER BY attnum)
		FROM pg_attribute WHERE attrelid = %d AND attnum > 0 AND NOT attisdropped AND attgenerated = ''),
		(SELECT n.nspname = %s AND c.relname = %s FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %d)`,
		t.OID, sqlfix.Literal(t.Schema), sqlfix.Literal(t.Name), t.OID)
}

// checkSnapshot reads snapshotSQL's row: the snapshot, once the table is still t, under its
// name, with its columns.
func checkSnapshot(t *Table, row [][]byte) (Snapshot, error) {
	if len(row) != 3 {
		return Snapshot{}, errors.New("snapshot query returned no row")
	}
	if row[1] == nil {
		return Snapshot{}, fmt.Errorf("%w: %s no longer exists", ErrSchemaChanged, t)
	}
	if string(row[2]) != "t" {
		return Snapshot{}, fmt.Errorf("%w: %s was renamed or moved to another schema", ErrSchemaChanged, t)
	}
	var want []string
	for _, c := range t.Columns {
		want = append(want, fmt.Sprintf("%s:%d:%d", c.Name, c.TypeOID, c.TypeMod))
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

// rowReader reads a chunk query's rows into c, at most limit of them and up to Config.MaxBytes
// of values: the query is a cursor fetched in pieces sized from the table's last mean row size,
// so that a chunk of wide rows stops at the byte bound instead of holding limit of them
// (Capped). The connection's buffer is reused, so values are copied, into slabs shared by many
// rows rather than an allocation per row.
type rowReader struct {
	r     *Reader
	c     *Chunk
	limit int
	slab  []byte
	cells [][]byte
	asked int  // rows the last fetch asked for
	more  bool // the last fetch returned all it asked for: the cursor may hold more
}

func (r *Reader) rows(c *Chunk, limit int) *rowReader { return &rowReader{r: r, c: c, limit: limit} }

// open returns the statements that declare the cursor of query sql and fetch its first piece.
func (rd *rowReader) open(sql string, args [][]byte, oids []uint32) []statement {
	return []statement{
		{sql: "DECLARE tidemark_chunk NO SCROLL CURSOR FOR " + sql, args: args, oids: oids},
		rd.fetch(),
	}
}

// fetch returns the statement of the next piece of the cursor, sized from the table's last mean
// row size (one row when it is not known yet, a first look at the table's rows).
func (rd *rowReader) fetch() statement {
	c, cfg := rd.c, rd.r.cfg
	n := rd.limit - len(c.Rows)
	if mean := rd.r.rowBytes[c.Table.OID]; mean > 0 {
		n = min(n, max(1, (cfg.MaxBytes-c.Bytes)/mean))
	} else {
		n = 1
	}
	rd.asked = n
	return statement{sql: fmt.Sprintf("FETCH FORWARD %d FROM tidemark_chunk", n), each: rd.take}
}

// take keeps the rows of one fetch.
func (rd *rowReader) take(rr *pgconn.ResultReader) error {
	c := rd.c
	got := 0
	for rr.NextRow() {
		got++
		vals := rr.Values()
		size := 0
		for _, v := range vals {
			size += len(v)
		}
		if cap(rd.slab)-len(rd.slab) < size {
			rd.slab = make([]byte, 0, max(256<<10, size))
		}
		if len(rd.cells) < len(vals) {
			rd.cells = make([][]byte, 256*len(vals))
		}
		row := Row(rd.cells[:len(vals):len(vals)])
		rd.cells = rd.cells[len(vals):]
		for i, v := range vals {
			if v == nil {
				row[i] = nil
				continue
			}
			start := len(rd.slab)
			rd.slab = append(rd.slab, v...)
			row[i] = rd.slab[start:len(rd.slab):len(rd.slab)]
		}
		c.Rows = append(c.Rows, row)
		c.Bytes += size
	}
	if _, err := rr.Close(); err != nil {
		return err
	}
	if len(c.Rows) > 0 {
		rd.r.rowBytes[c.Table.OID] = max(1, c.Bytes/len(c.Rows))
	}
	rd.more = got == rd.asked
	return nil
}

// rest fetches the cursor's rows after the first piece, up to the limit or the byte bound, and
// sets c.Last.
func (rd *rowReader) rest(ctx context.Context) error {
	c := rd.c
	for rd.more && len(c.Rows) < rd.limit {
		if c.Bytes >= rd.r.cfg.MaxBytes && len(c.Rows) > 0 {
			c.Capped = true
			break
		}
		if err := rd.r.batch(ctx, rd.fetch()); err != nil {
			return err
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
