package merge

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/chunker"
)

// ErrValuesRewritten: a column's type changed in a way that may have rewritten the stored values
// of every row (ALTER TABLE ... ALTER COLUMN ... TYPE ... USING, or a conversion that is not
// binary-coercible) without a row event: the output keeps the values as they were.
var ErrValuesRewritten = errors.New("a column's values may have been rewritten without row events")

// TypesOf are the column types of a discovered table.
func TypesOf(t *chunker.Table) []ColumnType {
	out := make([]ColumnType, len(t.Columns))
	for i, c := range t.Columns {
		out[i] = ColumnType{Name: c.Name, Type: c.TypeOID, Mod: c.TypeMod}
	}
	return out
}

// currentTypes reads the column types of table oid now (the columns a chunk could read).
func currentTypes(ctx context.Context, conn *pgx.Conn, oid uint32) ([]ColumnType, error) {
	rows, err := conn.Query(ctx, `SELECT attname::text, atttypid, atttypmod FROM pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum`, oid)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ColumnType, error) {
		var c ColumnType
		err := r.Scan(&c.Name, &c.Type, &c.Mod)
		return c, err
	})
}

// Rewritten compares the column types of table name before (nil: not known) and now, column by
// column (a column added or dropped is another matter), and returns ErrValuesRewritten, with the
// column, the types and the fix, for the first change that may have rewritten its values.
// PostgreSQL records no USING clause, so every change that is not known to keep each stored
// value as it was counts (see keepsValues).
func Rewritten(ctx context.Context, conn *pgx.Conn, name string, before, now []ColumnType) error {
	for _, b := range before {
		for _, n := range now {
			if n.Name != b.Name || (n.Type == b.Type && n.Mod == b.Mod) {
				continue
			}
			keeps, err := keepsValues(ctx, conn, b, n)
			if err != nil {
				return fmt.Errorf("compare the types of column %s of %s: %w", b.Name, name, err)
			}
			if !keeps {
				var from, to string
				if err := conn.QueryRow(ctx, `SELECT format_type($1, $2), format_type($3, $4)`, b.Type, b.Mod, n.Type, n.Mod).Scan(&from, &to); err != nil {
					from, to = fmt.Sprint(b.Type), fmt.Sprint(n.Type)
				}
				return fmt.Errorf("%w: column %s of %s changed type from %s to %s, which rewrites every stored value (and PostgreSQL records no USING clause) with no row event, so the output keeps the values as they were; re-backfill the table (sync --rebackfill %s), or, once the output's values are converted the same way (a PostgreSQL target: ALTER TABLE ... ALTER COLUMN %s TYPE %s USING <the source's expression>;), say so for one run: sync --types-changed %s",
					ErrValuesRewritten, b.Name, name, from, to, name, pgx.Identifier{b.Name}.Sanitize(), to, name)
			}
		}
	}
	return nil
}

// Type OIDs whose modifiers keepsValues knows.
const (
	oidBpchar      = 1042
	oidVarchar     = 1043
	oidBit         = 1560
	oidVarbit      = 1562
	oidNumeric     = 1700
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidTime        = 1083
	oidTimetz      = 1266
)

// keepsValues says whether a column's change from type before to type now keeps every stored
// value's text as it was. Only what is known to is said to: the same type with a modifier that
// cannot round or pad (any varchar or varbit length: a value that does not fit fails the ALTER;
// a numeric's scale kept or raised, which keeps each number, or no limit; a time type's precision
// raised or lifted), or a binary-coercible cast (varchar to text) to a type that does not pad
// (not char(n)).
// Anything else (int to bigint keeps the text too, but a USING clause could have been given)
// counts as a rewrite.
func keepsValues(ctx context.Context, conn *pgx.Conn, before, now ColumnType) (bool, error) {
	if before.Type == now.Type {
		switch now.Type {
		case oidVarchar, oidVarbit:
			return true, nil
		case oidNumeric:
			// A larger scale appends zeros (1.25 is 1.2500: the same number); a smaller one rounds.
			return now.Mod == -1 || (before.Mod != -1 && (now.Mod-4)&0xffff >= (before.Mod-4)&0xffff), nil
		case oidTimestamp, oidTimestamptz, oidTime, oidTimetz:
			return now.Mod == -1 || (before.Mod != -1 && now.Mod >= before.Mod), nil
		}
		return false, nil
	}
	if now.Type == oidBpchar || now.Type == oidBit {
		return false, nil // padded to the new length
	}
	var binary bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_cast WHERE castsource = $1 AND casttarget = $2 AND castmethod = 'b')`,
		before.Type, now.Type).Scan(&binary)
	return binary, err
}
