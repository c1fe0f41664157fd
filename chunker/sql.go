package chunker

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The chunk queries are pure functions of the table, so their text is golden-tested
// (testdata/sql.golden). Identifiers are quoted; values are bound parameters ($n) sent in text
// form with no type, so the server parses each with the input function of the column it is
// compared with, exactly undoing the text output the key was read in.

// selectList is the quoted column list of a chunk.
func selectList(t *Table) string {
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = quote(c.Name)
	}
	return strings.Join(cols, ", ")
}

// keyTuple is the key as a row value: ("k1", "k2"), or "k" for a single column.
func keyTuple(t *Table) string {
	if len(t.Key) == 1 {
		return quote(t.Columns[t.Key[0]].Name)
	}
	cols := make([]string, len(t.Key))
	for i, k := range t.Key {
		cols[i] = quote(t.Columns[k].Name)
	}
	return "(" + strings.Join(cols, ", ") + ")"
}

// params is a row value of bound parameters $from.. for the key.
func params(t *Table, from int) string {
	if len(t.Key) == 1 {
		return fmt.Sprintf("$%d", from)
	}
	ps := make([]string, len(t.Key))
	for i := range t.Key {
		ps[i] = fmt.Sprintf("$%d", from+i)
	}
	return "(" + strings.Join(ps, ", ") + ")"
}

func orderBy(t *Table, dir string) string {
	cols := make([]string, len(t.Key))
	for i, k := range t.Key {
		cols[i] = quote(t.Columns[k].Name) + dir
	}
	return strings.Join(cols, ", ")
}

// ChunkSQL is the keyset query of one chunk: the rows after the exclusive lower bound (the first
// len(key) parameters, when after) and up to the inclusive upper bound (the next len(key)
// parameters, when upper), in key order, at most limit of them. Row-value comparison orders
// exactly as ORDER BY does for an all-ascending key, with the key columns' collations, and can
// use the key's index.
func ChunkSQL(t *Table, after, upper bool, limit int) string {
	var where []string
	n := 1
	if after {
		where = append(where, keyTuple(t)+" > "+params(t, n))
		n += len(t.Key)
	}
	if upper {
		where = append(where, keyTuple(t)+" <= "+params(t, n))
	}
	q := "SELECT " + selectList(t) + " FROM " + t.Ident()
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	return q + " ORDER BY " + orderBy(t, "") + fmt.Sprintf(" LIMIT %d", limit)
}

// MaxKeySQL is the query of the table's last key in key order.
func MaxKeySQL(t *Table) string {
	cols := make([]string, len(t.Key))
	for i, k := range t.Key {
		cols[i] = quote(t.Columns[k].Name)
	}
	return "SELECT " + strings.Join(cols, ", ") + " FROM " + t.Ident() + " ORDER BY " + orderBy(t, " DESC") + " LIMIT 1"
}

// KeysSQL is the query of the rows with n given keys (a key-list chunk): n×len(key) parameters.
func KeysSQL(t *Table, n int) string {
	rows := make([]string, n)
	for i := range rows {
		rows[i] = params(t, 1+i*len(t.Key))
	}
	return "SELECT " + selectList(t) + " FROM " + t.Ident() + " WHERE " + keyTuple(t) + " IN (" + strings.Join(rows, ", ") + ") ORDER BY " + orderBy(t, "")
}

func quote(name string) string { return pgx.Identifier{name}.Sanitize() }
