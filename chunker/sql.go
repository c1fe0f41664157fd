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

// ops returns the operator of each key column that pick chooses.
func ops(keyOps []Ops, pick func(Ops) string) []string {
	out := make([]string, len(keyOps))
	for i, o := range keyOps {
		out[i] = pick(o)
	}
	return out
}

// KeyAfter is the condition that the key (the columns cols, quoted here, with their operators
// keyOps) comes after the parameters $from..: for a keyset's exclusive lower bound.
func KeyAfter(cols []string, keyOps []Ops, from int) string {
	return compare(cols, keyOps, from, func(o Ops) string { return o.Greater }, func(o Ops) string { return o.GreaterEq }, false)
}

// KeyUpTo is the condition that the key comes before or at the parameters $from..: for a
// keyset's inclusive upper bound.
func KeyUpTo(cols []string, keyOps []Ops, from int) string {
	return compare(cols, keyOps, from, func(o Ops) string { return o.Less }, func(o Ops) string { return o.LessEq }, true)
}

// compare is the key compared with the parameters $from.. by the strict operator strict (< or
// >, per column) and, when inclusive, equal to them too (orEqual: <= or >=). Row-value
// comparison orders exactly as ORDER BY does for an all-ascending key and can use the key's
// index; it takes one operator name for every column, so when the key's columns have their
// operators in different schemas (a citext column beside an integer one) it is written out
// column by column: the first column's bound lets the index be used, and the rest is the
// lexicographic comparison.
func compare(cols []string, keyOps []Ops, from int, strict, orEqual func(Ops) string, inclusive bool) string {
	op := strict
	if inclusive {
		op = orEqual
	}
	quoted := make([]string, len(cols))
	params := make([]string, len(cols))
	for i, c := range cols {
		quoted[i], params[i] = quote(c), fmt.Sprintf("$%d", from+i)
	}
	names := ops(keyOps, op)
	if len(cols) == 1 {
		return quoted[0] + " " + names[0] + " " + params[0]
	}
	if allSame(names) {
		return "(" + strings.Join(quoted, ", ") + ") " + names[0] + " (" + strings.Join(params, ", ") + ")"
	}
	stricts, eqs := ops(keyOps, strict), ops(keyOps, func(o Ops) string { return o.Eq })
	// (k1 s $1) OR (k1 = $1 AND k2 s $2) OR ... OR (k1 = $1 AND ... AND kn op $n): the last
	// column's operator inclusive when asked.
	var alts []string
	for i := range cols {
		var conj []string
		for j := range i {
			conj = append(conj, quoted[j]+" "+eqs[j]+" "+params[j])
		}
		last := stricts[i]
		if i == len(cols)-1 {
			last = names[i]
		}
		conj = append(conj, quoted[i]+" "+last+" "+params[i])
		alts = append(alts, "("+strings.Join(conj, " AND ")+")")
	}
	return "(" + quoted[0] + " " + orEqual(keyOps[0]) + " " + params[0] + " AND (" + strings.Join(alts, " OR ") + "))"
}

func allSame(names []string) bool {
	for _, n := range names[1:] {
		if n != names[0] {
			return false
		}
	}
	return true
}

// orderBy sorts by the key columns, each with the default btree operator class of its type:
// the class whose operators Ops are.
func orderBy(t *Table, dir string) string {
	cols := make([]string, len(t.Key))
	for i, k := range t.Key {
		cols[i] = quote(t.Columns[k].Name) + dir
	}
	return strings.Join(cols, ", ")
}

// ChunkSQL is the keyset query of one chunk: the rows after the exclusive lower bound (the first
// len(key) parameters, when after) and up to the inclusive upper bound (the next len(key)
// parameters, when upper), in key order, at most limit of them. The comparisons use the key
// columns' own operators (Ops), with their collations, so they order exactly as ORDER BY does,
// and can use the key's index.
func ChunkSQL(t *Table, after, upper bool, limit int) string {
	var where []string
	n := 1
	if after {
		where = append(where, KeyAfter(t.KeyNames(), t.KeyOps, n))
		n += len(t.Key)
	}
	if upper {
		where = append(where, KeyUpTo(t.KeyNames(), t.KeyOps, n))
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
// A single-column key is matched with = ANY of an array of the column's type, as IN would be
// (one index scan); a composite one with one conjunction of equalities per key, as IN would be
// too, each with the columns' own = (Ops).
func KeysSQL(t *Table, n int) string {
	var where string
	if len(t.Key) == 1 {
		ps := make([]string, n)
		for i := range ps {
			ps[i] = fmt.Sprintf("$%d", 1+i)
		}
		where = keyTuple(t) + " " + t.KeyOps[0].Eq + " ANY (ARRAY[" + strings.Join(ps, ", ") + "]::" + t.KeyOps[0].Type + "[])"
	} else {
		eqs := ops(t.KeyOps, func(o Ops) string { return o.Eq })
		alts := make([]string, n)
		for i := range alts {
			conj := make([]string, len(t.Key))
			for j, k := range t.Key {
				conj[j] = fmt.Sprintf("%s %s $%d", quote(t.Columns[k].Name), eqs[j], 1+i*len(t.Key)+j)
			}
			alts[i] = "(" + strings.Join(conj, " AND ") + ")"
		}
		where = "(" + strings.Join(alts, " OR ") + ")"
	}
	return "SELECT " + selectList(t) + " FROM " + t.Ident() + " WHERE " + where + " ORDER BY " + orderBy(t, "")
}

func quote(name string) string { return pgx.Identifier{name}.Sanitize() }
