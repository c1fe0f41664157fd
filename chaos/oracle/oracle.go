package oracle

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/sink/jsonl/line"
)

// Record is one output record as the oracle sees it, whichever product produced it.
type Record struct {
	Table string // schema.table
	// Op is insert, update, delete, snapshot (a backfilled row), truncate or refresh; upsert is a
	// whole row whose origin the output does not say (an Airbyte record).
	Op     string
	Key    string             // the key's values joined by KeySep
	Values map[string]*string // value by column, nil for NULL; the columns of Unchanged are absent
	// Unchanged are the columns the record leaves as they were (unchanged TOASTed values): the
	// only ones a replay keeps from the key's row before. Every other column the record lacks is
	// gone from the row: a record is the whole row but for these.
	Unchanged []string
	LSN       uint64 // the record's position: commit LSN (or high watermark's); 0 when it has none
	Seq       int    // order within LSN
	// Txn names the source transaction of a delete or truncate for the resolver of CheckDeaths
	// (a transaction id, or whatever the caller's resolver reads); "" when unknown.
	Txn string
	// Reset says that the output starts over here, in a history whose positions begin anew (a
	// restore of the source, every table refreshed): see Oracle.Resets.
	Reset bool
}

// KeySep joins the text values of a composite key in Record.Key.
const KeySep = "\x1f"

// Lossy marks a value whose JSON form does not carry it (numeric NaN, the infinities: null in
// JSON): the value Lossy+text stands for a value with PostgreSQL text text, and Lossy alone
// for one whose output kept no text (an Airbyte record's nulled field). SourceRowsJSON gives
// such values as Lossy+text, so that NaN is not NULL and each is compared by its text.
const Lossy = "\x00lossy:"

// Ordering is what the oracle checks of the records' positions along the output.
type Ordering int

const (
	// Unordered checks no positions.
	Unordered Ordering = iota
	// ByLSNSeq: every record's (LSN, Seq) is above the one before (I13).
	ByLSNSeq
	// ByLSN: the LSNs never go back (an output whose records of one transaction, or one chunk,
	// share an LSN and carry no sequence).
	ByLSN
)

// Oracle replays records onto tables and checks, as they come, that per key the versions in
// VersionColumn never go back and that a deleted key never comes back with an older version
// (docs/invariants.md, I2 and I3), that positions increase along the output (I13, with Order),
// and, for an output that a consumer takes exactly once (ExactlyOnce), that no change is
// delivered twice. Rows and FillMissing give the replay to compare with the source (I1);
// CheckDeaths checks each key that came back after a delete or a truncate against the version
// the source deleted. It is safe for concurrent use.
type Oracle struct {
	VersionColumn string // a column whose value only grows per key (across deletes too); "" checks no versions
	Order         Ordering
	// ExactlyOnce: the output is what a consumer keeps up to its checkpoints (the JSON lines up to
	// their checkpoint, the Airbyte records a state committed): a record repeating the version
	// its key has is allowed only as a backfilled row (a chunk reads a row the stream emitted
	// already, and emits it at its high watermark: a later position); the same change again is
	// a violation. Otherwise duplicates are counted only (at-least-once delivery repeats a
	// stretch after a restart).
	ExactlyOnce bool
	// Resets is how many times the positions may start over, at a refresh or Reset record (each
	// restore of the source starts a new history).
	Resets int

	mu         sync.Mutex
	tables     map[string]map[string]map[string]*string
	maxVer     map[string]int64  // by table + key
	verAt      map[string]uint64 // by table + key: the LSN of the record that set maxVer
	deleted    map[string]bool
	violations []string
	duplicates int
	records    int
	// Positions.
	lastLSN uint64
	lastSeq int
	epoch   int // positions started over so many times
	// Deaths: a delete (gone) or truncate (truncated) whose key came back, checked by CheckDeaths.
	gone      map[string]death // by table + key: the delete the key's next record follows
	truncated map[string]death // by table: its last truncate
	truncGen  map[string]int   // by table + key: the truncate of its table its last record followed
	deaths    []deathCheck
	// Columns: the record (its index) that first carried each column of a table, and the record
	// that last wrote each row whole.
	colSince map[string]map[string]int
	rowAt    map[string]int
}

// death is a delete or truncate seen in the output.
type death struct {
	txn   string
	lsn   uint64
	epoch int
	gen   int // truncates: the how-manieth of its table
}

// deathCheck is a key's record after its delete (or its table's truncate), checked at the end.
type deathCheck struct {
	table, key string // key "" for a truncate
	d          death
	rec        string // the record after it
	ver        int64
}

// NewOracle returns an Oracle checking versions in versionColumn.
func NewOracle(versionColumn string) *Oracle {
	return &Oracle{VersionColumn: versionColumn, tables: map[string]map[string]map[string]*string{},
		maxVer: map[string]int64{}, verAt: map[string]uint64{}, deleted: map[string]bool{}, gone: map[string]death{},
		truncated: map[string]death{}, truncGen: map[string]int{}, colSince: map[string]map[string]int{}, rowAt: map[string]int{}}
}

func (o *Oracle) violate(format string, args ...any) {
	if len(o.violations) < 10000 {
		o.violations = append(o.violations, fmt.Sprintf(format, args...))
	}
}

// at names a record's position.
func (r *Record) at() string {
	return fmt.Sprintf("%s at %X/%X:%d", r.Op, uint32(r.LSN>>32), uint32(r.LSN), r.Seq)
}

// Apply replays one record.
func (o *Oracle) Apply(r Record) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.records++
	o.position(&r)
	rows := o.tables[r.Table]
	if rows == nil {
		rows = map[string]map[string]*string{}
		o.tables[r.Table] = rows
	}
	id := r.Table + KeySep + r.Key
	switch r.Op {
	case "truncate", "refresh":
		clear(rows)
		if r.Op == "truncate" {
			prev := o.truncated[r.Table]
			o.truncated[r.Table] = death{txn: r.Txn, lsn: r.LSN, epoch: o.epoch, gen: prev.gen + 1}
		}
		return
	case "delete":
		delete(rows, r.Key)
		o.deleted[id] = true
		o.gone[id] = death{txn: r.Txn, lsn: r.LSN, epoch: o.epoch}
		return
	}
	if o.VersionColumn != "" {
		o.version(&r, id)
	}
	o.deleted[id] = false
	// A record is the whole row, but for the columns it lists as unchanged.
	old := rows[r.Key]
	row := make(map[string]*string, len(r.Values)+len(r.Unchanged))
	for _, c := range r.Unchanged {
		if v, ok := old[c]; ok {
			row[c] = v
		}
	}
	maps.Copy(row, r.Values)
	rows[r.Key] = row
	o.rowAt[id] = o.records
	cols := o.colSince[r.Table]
	if cols == nil {
		cols = map[string]int{}
		o.colSince[r.Table] = cols
	}
	for c := range r.Values {
		if _, ok := cols[c]; !ok {
			cols[c] = o.records
		}
	}
	for _, c := range r.Unchanged {
		if _, ok := cols[c]; !ok {
			cols[c] = o.records
		}
	}
}

// position checks that r's position comes after the one before.
func (o *Oracle) position(r *Record) {
	if o.Order == Unordered || r.LSN == 0 {
		if r.Reset && o.Resets > 0 {
			// The output starts over here (its records have no position of their own).
			o.Resets--
			o.epoch++
			o.lastLSN, o.lastSeq = 0, 0
		}
		return
	}
	back := r.LSN < o.lastLSN || o.Order == ByLSNSeq && r.LSN == o.lastLSN && r.Seq <= o.lastSeq
	if back {
		if (r.Reset || r.Op == "refresh") && o.Resets > 0 && r.LSN < o.lastLSN {
			// A restore: the output starts over in the new history.
			o.Resets--
			o.epoch++
		} else {
			o.violate("I13: %s key %q: the output's position went back (%s, after %X/%X:%d)", r.Table, r.Key, r.at(), uint32(o.lastLSN>>32), uint32(o.lastLSN), o.lastSeq)
		}
	}
	o.lastLSN, o.lastSeq = r.LSN, r.Seq
}

// version checks r's version against its key's (I2, I3, duplicates).
func (o *Oracle) version(r *Record, id string) {
	v, ok := r.Values[o.VersionColumn]
	if !ok || v == nil {
		return
	}
	ver, err := strconv.ParseInt(*v, 10, 64)
	if err != nil {
		o.violate("%s %s: version %q is not an integer", r.Table, r.Key, *v)
		return
	}
	if g, ok := o.gone[id]; ok {
		o.deaths = append(o.deaths, deathCheck{table: r.Table, key: r.Key, d: g, rec: r.at(), ver: ver})
		delete(o.gone, id)
	} else if t, ok := o.truncated[r.Table]; ok && o.truncGen[id] < t.gen {
		o.deaths = append(o.deaths, deathCheck{table: r.Table, d: t, rec: r.at(), ver: ver})
	}
	if t, ok := o.truncated[r.Table]; ok {
		o.truncGen[id] = t.gen
	}
	last, seen := o.maxVer[id]
	switch {
	case !seen:
	case ver < last:
		o.violate("I2: %s key %q went back from version %d to %d (%s)", r.Table, r.Key, last, ver, r.at())
	case o.deleted[id] && ver <= last:
		o.violate("I3: %s key %q came back after its delete with version %d (%s)", r.Table, r.Key, ver, r.at())
	case ver == last:
		// The version the key has, again: a backfilled row that read it (at a later position),
		// or the same change delivered twice.
		again := r.Op != "snapshot" && (r.Op != "upsert" || r.LSN == o.verAt[id])
		if again && o.ExactlyOnce {
			o.violate("exactly once: %s key %q: version %d delivered again (%s; before at %X/%X)", r.Table, r.Key, ver, r.at(), uint32(o.verAt[id]>>32), uint32(o.verAt[id]))
		}
		o.duplicates++
	}
	if !seen || ver >= last {
		o.maxVer[id] = ver
		o.verAt[id] = r.LSN // the latest position of the version
	}
}

// AllowReset lets the positions start over once more (see Resets).
func (o *Oracle) AllowReset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.Resets++
}

// CheckDeaths checks each key that came back after its delete (or after its table's truncate)
// against the version the source deleted: resolve returns, for a delete's (or truncate's)
// transaction, the newest version of the key (for a truncate, key "": of any row of the table)
// that the transaction deleted; ok false when it does not know. A key that came back with a
// version not newer than that is a resurrection (I3), whatever the output showed of its versions
// before. Only deaths of the current history (since the last Reset) are checked: a restore
// reuses the transaction ids of the history it dropped.
func (o *Oracle) CheckDeaths(resolve func(table, key, txn string) (int64, bool)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range o.deaths {
		if c.d.epoch != o.epoch || c.d.txn == "" {
			continue
		}
		dv, ok := resolve(c.table, c.key, c.d.txn)
		if !ok || c.ver > dv {
			continue
		}
		what := "its delete"
		key := c.key
		if c.key == "" {
			what = "the truncate of its table"
		}
		o.violate("I3: %s key %q came back after %s (transaction %s at %X/%X), which removed version %d, with version %d (%s)",
			c.table, key, what, c.d.txn, uint32(c.d.lsn>>32), uint32(c.d.lsn), dv, c.ver, c.rec)
	}
	o.deaths = nil
}

// Violations returns the broken invariants seen so far.
func (o *Oracle) Violations() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.violations)
}

// Duplicates counts records that repeated the version a key already had.
func (o *Oracle) Duplicates() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.duplicates
}

// Records counts the records applied.
func (o *Oracle) Records() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.records
}

// Rows returns a copy of the replayed rows of table, by key.
func (o *Oracle) Rows(table string) map[string]map[string]*string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]map[string]*string{}
	for k, row := range o.tables[table] {
		out[k] = maps.Clone(row)
	}
	return out
}

// FillMissing gives each row of rows (a copy of table's replay, from Rows) that lacks one of
// cols value, when the row's last record came before any record of the table carried the column
// (a row last written before the column existed: no record of it carries the column, and the
// source has the column's default there). A row whose last record came after one that carried
// the column lacks it wrongly (a whole row missing a column): it is left without, so that the
// comparison with the source reports it, and returned as a violation.
func (o *Oracle) FillMissing(table string, rows map[string]map[string]*string, cols []string, value *string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for key, row := range rows {
		for _, c := range cols {
			if _, ok := row[c]; ok {
				continue
			}
			since, carried := o.colSince[table][c]
			if !carried || o.rowAt[table+KeySep+key] < since {
				row[c] = value
				continue
			}
			if len(out) < 10 {
				out = append(out, fmt.Sprintf("I1: %s key %q: its last record lacks column %s, which the table's records carried before it", table, key, c))
			}
		}
	}
	slices.Sort(out)
	return out
}

// SourceRows reads table (schema.table) from the source in the pinned text forms, by key.
func SourceRows(ctx context.Context, dsn, schema, table string, key []string) (map[string]map[string]*string, error) {
	return sourceRows(ctx, dsn, schema, table, key, false, pgjson.Exact)
}

// SourceRowsJSON reads table from the source with each value in its JSON form (as Tidemark's
// JSON outputs write it, NULL as null; a value whose JSON form does not carry it, such as NaN, as
// Lossy and its text; in the profile given, Exact by default), by key: the values' JSON joined
// by KeySep.
func SourceRowsJSON(ctx context.Context, dsn, schema, table string, key []string, profile ...pgjson.Profile) (map[string]map[string]*string, error) {
	p := pgjson.Exact
	if len(profile) > 0 {
		p = profile[0]
	}
	return sourceRows(ctx, dsn, schema, table, key, true, p)
}

func sourceRows(ctx context.Context, dsn, schema, table string, key []string, asJSON bool, profile pgjson.Profile) (map[string]map[string]*string, error) {
	cfg, err := pgconf.Parse(dsn, "tidemark-oracle")
	if err != nil {
		return nil, err
	}
	conn, err := pgconf.Dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, "SELECT * FROM "+pgx.Identifier{schema, table}.Sanitize(), pgx.QueryResultFormats{pgx.TextFormatCode})
	if err != nil {
		return nil, err
	}
	var names []string
	var oids []uint32
	for _, f := range rows.FieldDescriptions() {
		names = append(names, f.Name)
		oids = append(oids, f.DataTypeOID)
	}
	var raw [][][]byte
	for rows.Next() {
		var vals [][]byte
		for _, v := range rows.RawValues() {
			if v != nil {
				v = bytes.Clone(v)
			}
			vals = append(vals, v)
		}
		raw = append(raw, vals)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	reg := pgjson.NewProfileRegistry(conn, profile)
	out := map[string]map[string]*string{}
	for _, vals := range raw {
		row := map[string]*string{}
		for i, v := range vals {
			switch {
			case asJSON:
				s := "null"
				if v != nil {
					t, err := reg.Type(ctx, oids[i])
					if err != nil {
						return nil, err
					}
					b, lossy, err := t.Append(nil, v)
					if err != nil {
						return nil, fmt.Errorf("column %s: %w", names[i], err)
					}
					s = string(b)
					if lossy {
						s = Lossy + string(v)
					}
				}
				row[names[i]] = &s
			case v == nil:
				row[names[i]] = nil
			default:
				s := string(v)
				row[names[i]] = &s
			}
		}
		var kv []string
		for _, k := range key {
			if row[k] == nil {
				return nil, fmt.Errorf("key column %q of %s.%s is NULL or missing", k, schema, table)
			}
			if asJSON && !strings.HasPrefix(*row[k], Lossy) {
				kv = append(kv, string(line.CanonicalNumber([]byte(*row[k])))) // as the replay's
				continue
			}
			kv = append(kv, *row[k])
		}
		out[strings.Join(kv, KeySep)] = row
	}
	return out, nil
}

// Diff compares replayed rows with source rows and describes up to ten differences; "" when
// they are equal. Columns the replay lacks entirely are reported.
func Diff(replay, source map[string]map[string]*string) string {
	var diffs []string
	str := func(v *string) string {
		if v == nil {
			return "NULL"
		}
		if len(*v) > 120 {
			return fmt.Sprintf("%q... (%d bytes)", (*v)[:100], len(*v))
		}
		return strconv.Quote(*v)
	}
	for _, k := range slices.Sorted(maps.Keys(source)) {
		got, ok := replay[k]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("key %q missing from the output", k))
			continue
		}
		for _, c := range slices.Sorted(maps.Keys(source[k])) {
			g, has := got[c]
			if !has {
				diffs = append(diffs, fmt.Sprintf("key %q column %s: no value in the output, source has %s", k, c, str(source[k][c])))
			} else if (g == nil) != (source[k][c] == nil) || g != nil && *g != *source[k][c] {
				diffs = append(diffs, fmt.Sprintf("key %q column %s: output %s, source %s", k, c, str(g), str(source[k][c])))
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(replay)) {
		if _, ok := source[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("key %q in the output but not in the source", k))
		}
	}
	if len(diffs) > 10 {
		diffs = append(diffs[:10], fmt.Sprintf("... and %d more", len(diffs)-10))
	}
	return strings.Join(diffs, "\n")
}
