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
// skip or repeat rows. Type is the column's type as a cast names it, schema-qualified when it is
// not in pg_catalog.
type Ops struct {
	Less, LessEq, Eq, GreaterEq, Greater string
	Type                                 string
}

// CatalogOps are the operators of a type whose class lives in pg_catalog (for tests and tables
// built by hand; Discover reads each key column's).
func CatalogOps(typ string) Ops {
	return Ops{Less: "OPERATOR(pg_catalog.<)", LessEq: "OPERATOR(pg_catalog.<=)", Eq: "OPERATOR(pg_catalog.=)",
		GreaterEq: "OPERATOR(pg_catalog.>=)", Greater: "OPERATOR(pg_catalog.>)", Type: typ}
}

// ErrNoOrdering reports a key column whose type has no default btree operator class: it has no
// order a keyset can follow.
var ErrNoOrdering = errors.New("the key column's type has no default btree operator class")

// opsSQL finds the default btree operator class of type $1 as PostgreSQL's GetDefaultOpClass
// does: a domain stands for its base type; a class of the type itself first, then one of the
// polymorphic type it belongs to (an enum's anyenum, an array's anyarray, a range's anyrange, a
// multirange's anymultirange, a composite's record), then one of a type it casts to without a
// function (varchar to text), a preferred type first. It returns the class's operators of
// strategies 1 to 5 (<, <=, =, >=, >) for that type, each as OPERATOR(schema.name), and the
// type's name for a cast.
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
	)
	SELECT s.strategy, 'OPERATOR(' || pg_catalog.quote_ident(n.nspname) || '.' || o.oprname || ')'
	FROM best
	CROSS JOIN pg_catalog.generate_series(1, 5) AS s(strategy)
	JOIN pg_amop a ON a.amopfamily = best.opcfamily AND a.amoplefttype = best.opcintype AND a.amoprighttype = best.opcintype
		AND a.amopstrategy = s.strategy AND a.amopmethod = (SELECT oid FROM pg_am WHERE amname = 'btree')
	JOIN pg_operator o ON o.oid = a.amopopr
	JOIN pg_namespace n ON n.oid = o.oprnamespace
	UNION ALL
	SELECT 0, pg_catalog.format_type($1::oid, NULL)
	ORDER BY 1`

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
	byStrategy := map[int]string{}
	var strategy int
	var text string
	if _, err := pgx.ForEachRow(rows, []any{&strategy, &text}, func() error {
		byStrategy[strategy] = text
		return nil
	}); err != nil {
		return Ops{}, fmt.Errorf("read the comparison operators of type %d: %w", typeOID, err)
	}
	ops := Ops{Less: byStrategy[1], LessEq: byStrategy[2], Eq: byStrategy[3], GreaterEq: byStrategy[4], Greater: byStrategy[5], Type: byStrategy[0]}
	if ops.Less == "" || ops.LessEq == "" || ops.Eq == "" || ops.GreaterEq == "" || ops.Greater == "" {
		return Ops{}, fmt.Errorf("%w (type %s): rows cannot be read in key order; choose another key (a key override) or leave the table out", ErrNoOrdering, ops.Type)
	}
	return ops, nil
}
