package chunker

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Ops are the comparison operators of a key column: those of the default btree operator class
// of its type (a domain's base type), the class ORDER BY sorts the column with and a primary
// key's index is built with. Each is written OPERATOR(schema.name), so that it is the class's
// operator whatever search_path says: every connection pins search_path to pg_catalog
// (internal/pgconf), and a bare > on a citext column (citext lives in public) would resolve to
// text's, which orders differently and uses no index of the column, so a keyset chunk would
// skip or repeat rows.
//
// OPERATOR(public.>) still chooses among the operators named > in public by their argument
// types, and prefers one whose types match the column's exactly: a role with CREATE on public
// could add one for a domain over citext, and it would run instead of citext's. So when the
// operators are not in pg_catalog (where no such role can create), the column is cast to the
// class's own type (Cast, a relabelling that keeps the index usable) and the values are of that
// type: the exact match is then the class's operator.
type Ops struct {
	Less, LessEq, Eq, GreaterEq, Greater string
	// Cast is appended to the column to compare it (::public.citext), empty when the operators
	// are in pg_catalog.
	Cast string
	// Param is the OID of the type a value compared with the column is sent as, when it is given
	// one (a key-list chunk's array of keys): the column's base type, with no modifier (a
	// char(5) key is not cut to one character) and not its domain (whose CHECK would run on
	// the source for every key read).
	Param uint32
	// Array: the column's base type is an array, whose keys are compared whole, not element by
	// element (no = ANY of an array of them).
	Array bool
}

// CatalogOps are the operators of a type whose class lives in pg_catalog, param its OID (for
// tests and tables built by hand; Discover reads each key column's).
func CatalogOps(param uint32) Ops {
	return Ops{Less: "OPERATOR(pg_catalog.<)", LessEq: "OPERATOR(pg_catalog.<=)", Eq: "OPERATOR(pg_catalog.=)",
		GreaterEq: "OPERATOR(pg_catalog.>=)", Greater: "OPERATOR(pg_catalog.>)", Param: param}
}

// ErrNoOrdering reports a key column whose type has no default btree operator class: it has no
// order a keyset can follow.
var ErrNoOrdering = errors.New("the key column's type has no default btree operator class")

// opsSQL finds the default btree operator class of type $1 as PostgreSQL's GetDefaultOpClass
// does: a domain stands for its base type; a class of the type itself first, then one of the
// polymorphic type it belongs to (an enum's anyenum, an array's anyarray, a range's anyrange, a
// multirange's anymultirange, a composite's record), then one of a type it casts to without a
// function (varchar to text), a preferred type first. It returns one row: the class's
// operators of strategies 1 to 5 (<, <=, =, >=, >) for its input type, each as
// OPERATOR(schema.name); the cast to the class's input type when they are not in pg_catalog
// (the base type's name when the class is polymorphic); the base type's OID and whether it is
// an array.
const opsSQL = `WITH RECURSIVE base(oid, depth) AS (
		SELECT $1::oid, 0
		UNION ALL
		SELECT t.typbasetype, b.depth + 1 FROM pg_type t JOIN base b ON t.oid = b.oid WHERE t.typtype = 'd' AND b.depth < 32
	), bt AS (
		SELECT t.oid, t.typtype, t.typcategory, t.typelem FROM pg_type t WHERE t.oid = (SELECT oid FROM base ORDER BY depth DESC LIMIT 1)
	), cls AS (
		SELECT c.opcfamily, c.opcintype,
			CASE WHEN c.opcintype = bt.oid THEN 0
				WHEN c.opcintype = 'pg_catalog.anyenum'::pg_catalog.regtype AND bt.typtype = 'e' THEN 1
				WHEN c.opcintype = 'pg_catalog.anyarray'::pg_catalog.regtype AND bt.typcategory = 'A' AND bt.typelem <> 0 THEN 1
				WHEN c.opcintype = 'pg_catalog.anyrange'::pg_catalog.regtype AND bt.typtype = 'r' THEN 1
				WHEN c.opcintype = 'pg_catalog.anymultirange'::pg_catalog.regtype AND bt.typtype = 'm' THEN 1
				WHEN c.opcintype = 'pg_catalog.record'::pg_catalog.regtype AND bt.typtype = 'c' THEN 1
				WHEN EXISTS (SELECT 1 FROM pg_cast k WHERE k.castsource = bt.oid AND k.casttarget = c.opcintype
					AND k.castmethod = 'b' AND k.castcontext = 'i') THEN 2
			END AS rank,
			(SELECT t.typispreferred FROM pg_type t WHERE t.oid = c.opcintype) AS preferred
		FROM pg_opclass c CROSS JOIN bt
		WHERE c.opcmethod = (SELECT oid FROM pg_am WHERE amname = 'btree') AND c.opcdefault
	), best AS (
		SELECT opcfamily, opcintype FROM cls WHERE rank IS NOT NULL ORDER BY rank, preferred DESC LIMIT 1
	), op AS (
		SELECT a.amopstrategy AS strategy, n.nspname, o.oprname
		FROM best
		JOIN pg_amop a ON a.amopfamily = best.opcfamily AND a.amoplefttype = best.opcintype AND a.amoprighttype = best.opcintype
			AND a.amopmethod = (SELECT oid FROM pg_am WHERE amname = 'btree') AND a.amopstrategy BETWEEN 1 AND 5
		JOIN pg_operator o ON o.oid = a.amopopr
		JOIN pg_namespace n ON n.oid = o.oprnamespace
	)
	SELECT
		pg_catalog.array_agg('OPERATOR(' || pg_catalog.quote_ident(op.nspname) || '.' || op.oprname || ')' ORDER BY op.strategy),
		coalesce(CASE WHEN bool_and(op.nspname = 'pg_catalog') THEN ''
			WHEN (SELECT t.typtype FROM pg_type t WHERE t.oid = (SELECT opcintype FROM best)) = 'p' THEN '::' || pg_catalog.format_type((SELECT oid FROM bt), NULL)
			ELSE '::' || pg_catalog.format_type((SELECT opcintype FROM best), NULL) END, ''),
		(SELECT oid FROM bt), coalesce((SELECT typcategory = 'A' FROM bt), false)
	FROM op`

// readOps reads the operators of the key columns' types (Table.KeyOps).
func (t *Table) readOps(ctx context.Context, conn *pgx.Conn) error {
	t.KeyOps = make([]Ops, len(t.Key))
	for i, k := range t.Key {
		c := t.Columns[k]
		ops, err := ReadOps(ctx, conn, c.TypeOID)
		if err != nil {
			return fmt.Errorf("key column %q of %s: %w", c.Name, t, err)
		}
		t.KeyOps[i] = ops
	}
	return nil
}

// Querier runs a query: a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ReadOps reads the comparison operators of a type (Ops).
func ReadOps(ctx context.Context, conn Querier, typeOID uint32) (Ops, error) {
	rows, err := conn.Query(ctx, opsSQL, typeOID)
	if err != nil {
		return Ops{}, fmt.Errorf("read the comparison operators of type %d: %w", typeOID, err)
	}
	var names []string
	var ops Ops
	if _, err := pgx.ForEachRow(rows, []any{&names, &ops.Cast, &ops.Param, &ops.Array}, func() error { return nil }); err != nil {
		return Ops{}, fmt.Errorf("read the comparison operators of type %d: %w", typeOID, err)
	}
	if len(names) != 5 {
		return Ops{}, fmt.Errorf("%w (type %d): rows cannot be read in key order; choose another key (a key override) or leave the table out", ErrNoOrdering, typeOID)
	}
	ops.Less, ops.LessEq, ops.Eq, ops.GreaterEq, ops.Greater = names[0], names[1], names[2], names[3], names[4]
	return ops, nil
}
