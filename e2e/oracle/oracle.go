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
)

// Record is one output record as the oracle sees it, whichever product produced it.
type Record struct {
	Table  string             // schema.table
	Op     string             // insert, update, delete, snapshot or truncate
	Key    string             // the key's text values joined by KeySep
	Values map[string]*string // text value by column, nil for NULL; unchanged TOASTed columns are absent
	LSN    uint64             // the record's position: commit LSN (or high watermark's)
	Seq    int                // order within LSN
}

// KeySep joins the text values of a composite key in Record.Key.
const KeySep = "\x1f"

// Oracle replays records onto tables and checks, as they come, that per key the versions in
// VersionColumn never go back and that a deleted key never comes back with an older version
// (docs/invariants.md, I2 and I3). Compare checks the replay against the source (I1). It is safe for concurrent use.
type Oracle struct {
	VersionColumn string // a column whose value only grows per key (across deletes too); "" checks no versions

	mu         sync.Mutex
	tables     map[string]map[string]map[string]*string
	maxVer     map[string]int64 // by table + key
	deleted    map[string]bool
	violations []string
	duplicates int
	records    int
}

// NewOracle returns an Oracle checking versions in versionColumn.
func NewOracle(versionColumn string) *Oracle {
	return &Oracle{VersionColumn: versionColumn, tables: map[string]map[string]map[string]*string{},
		maxVer: map[string]int64{}, deleted: map[string]bool{}}
}

// Apply replays one record.
func (o *Oracle) Apply(r Record) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.records++
	rows := o.tables[r.Table]
	if rows == nil {
		rows = map[string]map[string]*string{}
		o.tables[r.Table] = rows
	}
	id := r.Table + KeySep + r.Key
	switch r.Op {
	case "truncate", "refresh":
		clear(rows)
		return
	case "delete":
		delete(rows, r.Key)
		o.deleted[id] = true
		return
	}
	if o.VersionColumn != "" {
		if v, ok := r.Values[o.VersionColumn]; ok && v != nil {
			ver, err := strconv.ParseInt(*v, 10, 64)
			if err != nil {
				o.violations = append(o.violations, fmt.Sprintf("%s %s: version %q is not an integer", r.Table, r.Key, *v))
			} else if last, seen := o.maxVer[id]; seen {
				switch {
				case ver < last:
					o.violations = append(o.violations, fmt.Sprintf("I2: %s key %q went back from version %d to %d (%s at %X/%d)", r.Table, r.Key, last, ver, r.Op, r.LSN, r.Seq))
				case o.deleted[id] && ver <= last:
					o.violations = append(o.violations, fmt.Sprintf("I3: %s key %q came back after its delete with version %d (%s at %X/%d)", r.Table, r.Key, ver, r.Op, r.LSN, r.Seq))
				case ver == last && !o.deleted[id]:
					o.duplicates++
				}
			}
			if last, seen := o.maxVer[id]; !seen || ver > last {
				o.maxVer[id] = ver
			}
		}
	}
	o.deleted[id] = false
	row := rows[r.Key]
	if row == nil || r.Op == "insert" || r.Op == "snapshot" {
		old := row
		row = map[string]*string{}
		// An insert or snapshot row is whole, but unchanged TOASTed columns keep their value.
		for k, v := range old {
			if _, ok := r.Values[k]; !ok {
				row[k] = v
			}
		}
		rows[r.Key] = row
	}
	maps.Copy(row, r.Values)
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

// SourceRows reads table (schema.table) from the source in the pinned text forms, by key.
func SourceRows(ctx context.Context, dsn, schema, table string, key []string) (map[string]map[string]*string, error) {
	return sourceRows(ctx, dsn, schema, table, key, false, pgjson.Exact)
}

// SourceRowsJSON reads table from the source with each value in its JSON form (as Tidemark's
// JSON outputs write it, NULL as null; in the profile given, Exact by default), by key: the
// values' JSON joined by KeySep.
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
	conn, err := pgx.ConnectConfig(ctx, cfg)
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
					b, _, err := t.Append(nil, v)
					if err != nil {
						return nil, fmt.Errorf("column %s: %w", names[i], err)
					}
					s = string(b)
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
