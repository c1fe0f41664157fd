package chunker

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The chunk queries are pure functions of the table, so their text is golden-tested
// (testdata/sql.golden). Identifiers are quoted; values are bound parameters ($n) sent in text
// form, so the server parses each with the input function of the type it is compared as,
// exactly undoing the text output the key was read in. Keys are compared with their type's own
// operators (Ops): see ops.go for why they are schema-qualified and how a column is cast.

// selectList is the quoted column list of a chunk.
func selectList(t *Table) string {
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = quote(c.Name)
	}
	return strings.Join(cols, ", ")
}

// ops returns the operator of each key column that pick chooses.
func ops(keyOps []Ops, pick func(Ops) string) []string {
	out := make([]string, len(keyOps))
	for i, o := range keyOps {
		out[i] = pick(o)
	}
	return out
}

// operand is key column col as compared: quoted, with its Ops' cast.
func operand(col string, o Ops) string { return quote(col) + o.Cast }

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

// uniform reports whether every key column's operators have one name, so that the key can be
// compared as a row value.
func uniform(keyOps []Ops) bool {
	for _, o := range keyOps[1:] {
		if o.Greater != keyOps[0].Greater {
			return false
		}
	}
	return true
}

// compare is the key compared with the parameters $from.. by the strict operator strict (< or
// >, per column) and, when inclusive, equal to them too (orEqual: <= or >=). Row-value
// comparison orders exactly as ORDER BY does for an all-ascending key and can use the key's
// index; it takes one operator name for every column, so when the key's columns have their
// operators in different schemas (a citext column beside an integer one) it is written out
// column by column: the first column's bound lets the index be used, and the rest is the
// lexicographic comparison (KeysetSQL splits a lower bound of that kind into index ranges).
func compare(cols []string, keyOps []Ops, from int, strict, orEqual func(Ops) string, inclusive bool) string {
	op := strict
	if inclusive {
		op = orEqual
	}
	quoted := make([]string, len(cols))
	params := make([]string, len(cols))
	for i, c := range cols {
		quoted[i], params[i] = operand(c, keyOps[i]), fmt.Sprintf("$%d", from+i)
	}
	names := ops(keyOps, op)
	if len(cols) == 1 {
		return quoted[0] + " " + names[0] + " " + params[0]
	}
	if uniform(keyOps) {
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

// orderBy sorts by the key columns, each with the default btree operator class of its type:
// the class whose operators Ops are.
func orderBy(cols []string, dir string) string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = quote(c) + dir
	}
	return strings.Join(out, ", ")
}

// KeysetSQL is a keyset query of the relation from (quoted), selecting sel: the rows whose key
// (the columns cols, with their operators keyOps) comes after the first len(cols) parameters
// (when after) and up to the next len(cols) (when upper), also meeting the conditions extra,
// in key order, at most limit of them.
//
// A key compared as a row value (its columns' operators of one name, the usual case) bounds the
// index scan exactly. One that is not (a citext column beside an integer one) bounds it only by
// its first column; after a lower bound the query is then split into one index range per key
// prefix, (k1 = $1 AND k2 > $2) then (k1 > $1), each read in key order and merged, so that a
// chunk in the middle of a large group of equal first columns does not read the group's rows
// before the bound again and again.
func KeysetSQL(sel, from string, cols []string, keyOps []Ops, after, upper bool, limit int, extra ...string) string {
	var common []string
	n := 1
	if after {
		n += len(cols)
	}
	if upper {
		common = append(common, KeyUpTo(cols, keyOps, n))
	}
	common = append(common, extra...)
	order := " ORDER BY " + orderBy(cols, "") + fmt.Sprintf(" LIMIT %d", limit)
	query := func(where []string) string {
		q := "SELECT " + sel + " FROM " + from
		if len(where) > 0 {
			q += " WHERE " + strings.Join(where, " AND ")
		}
		return q + order
	}
	if !after {
		return query(common)
	}
	if len(cols) == 1 || uniform(keyOps) {
		return query(append([]string{KeyAfter(cols, keyOps, 1)}, common...))
	}
	branches := make([]string, len(cols))
	for i := range cols {
		var where []string
		for j := range len(cols) - 1 - i {
			where = append(where, fmt.Sprintf("%s %s $%d", operand(cols[j], keyOps[j]), keyOps[j].Eq, j+1))
		}
		k := len(cols) - 1 - i
		where = append(where, fmt.Sprintf("%s %s $%d", operand(cols[k], keyOps[k]), keyOps[k].Greater, k+1))
		branches[i] = "(" + query(append(where, common...)) + ")"
	}
	return "SELECT * FROM (" + strings.Join(branches, " UNION ALL ") + ") AS keyset" + order
}

// ChunkSQL is the keyset query of one chunk: the rows after the exclusive lower bound (the first
// len(key) parameters, when after) and up to the inclusive upper bound (the next len(key)
// parameters, when upper), in key order, at most limit of them (KeysetSQL).
func ChunkSQL(t *Table, after, upper bool, limit int) string {
	return KeysetSQL(selectList(t), t.From(), t.KeyNames(), t.KeyOps, after, upper, limit)
}

// MaxKeySQL is the query of the table's last key in key order.
func MaxKeySQL(t *Table) string {
	return "SELECT " + keyList(t) + " FROM " + t.From() + " ORDER BY " + orderBy(t.KeyNames(), " DESC") + " LIMIT 1"
}

// KeysSQL is the query of the rows with n given keys (a key-list chunk): n×len(key) parameters,
// of the types KeysParams gives. A single-column key (not an array) is matched with = ANY of
// an array of its values, as IN would be (one index scan in key order), the values sent as the
// column's base type (Ops.Param); a composite or array key with one conjunction of equalities
// per key, as IN would be too, each value taking the type of the column it is compared with.
func KeysSQL(t *Table, n int) string {
	var where string
	if len(t.Key) == 1 && !t.KeyOps[0].Array {
		ps := make([]string, n)
		for i := range ps {
			ps[i] = fmt.Sprintf("$%d", 1+i)
		}
		o := t.KeyOps[0]
		where = operand(t.Columns[t.Key[0]].Name, o) + " " + o.Eq + " ANY (ARRAY[" + strings.Join(ps, ", ") + "])"
	} else {
		alts := make([]string, n)
		for i := range alts {
			conj := make([]string, len(t.Key))
			for j, k := range t.Key {
				conj[j] = fmt.Sprintf("%s %s $%d", operand(t.Columns[k].Name, t.KeyOps[j]), t.KeyOps[j].Eq, 1+i*len(t.Key)+j)
			}
			alts[i] = "(" + strings.Join(conj, " AND ") + ")"
		}
		where = "(" + strings.Join(alts, " OR ") + ")"
	}
	return "SELECT " + selectList(t) + " FROM " + t.From() + " WHERE " + where + " ORDER BY " + orderBy(t.KeyNames(), "")
}

// KeysParams are the parameter types of KeysSQL(t, n): nil (each takes the type of what it is
// compared with) but for a single-column key of no array type.
func KeysParams(t *Table, n int) []uint32 {
	if len(t.Key) != 1 || t.KeyOps[0].Array {
		return nil
	}
	oids := make([]uint32, n)
	for i := range oids {
		oids[i] = t.KeyOps[0].Param
	}
	return oids
}

func quote(name string) string { return pgx.Identifier{name}.Sanitize() }
