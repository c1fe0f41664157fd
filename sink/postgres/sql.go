package postgres

import (
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/internal/sqlfix"
)

// The SQL the sink runs, built by pure functions (no connection), golden-tested
// (testdata/sql.golden). Table names given as table are already quoted (pgx.Identifier's
// Sanitize); column names are given as they are and quoted here. Values are bound parameters,
// except a default printed as a literal (AddColumnSQL).

// Quote quotes an identifier (sqlfix.Ident: the statements the sink prints are pasted by people).
func Quote(name string) string { return sqlfix.Ident(name) }

// QuoteAll quotes each identifier.
func QuoteAll(names []string) []string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = Quote(n)
	}
	return q
}

// The sink's own tables on the target.
var (
	// CheckpointTable is the checkpoint table: one row per capture (id), written in the same
	// transaction as the changes it covers.
	CheckpointTable = pgx.Identifier{"public", "tidemark_checkpoint"}.Sanitize()
	// LedgerTable is the audit ledger (--audit): the commit LSN of every source transaction
	// applied, so that applying one twice fails on its primary key.
	LedgerTable = pgx.Identifier{"public", "tidemark_applied"}.Sanitize()
)

// CheckpointTableSQL creates the checkpoint table.
func CheckpointTableSQL(table string) string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
    id            text PRIMARY KEY,
    position      jsonb NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    target_schema text NOT NULL DEFAULT ''
)`, table)
}

// CheckpointColumnsSQL adds what later versions record to a checkpoint table an earlier one made.
func CheckpointColumnsSQL(table string) string {
	return fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS target_schema text NOT NULL DEFAULT ''`, table)
}

// LedgerTableSQL creates the audit ledger.
func LedgerTableSQL(table string) string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
    commit_lsn pg_lsn PRIMARY KEY,
    xid        bigint NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`, table)
}

// ReadCheckpointSQL reads a capture's checkpoint row ($1: its id): its position and the target
// schema it was written for.
func ReadCheckpointSQL(table string) string {
	return `SELECT position, target_schema FROM ` + table + ` WHERE id = $1`
}

// InsertCheckpointSQL writes a capture's first checkpoint row ($1 id, $2 position, $3 target
// schema); a row another writer inserted first stays (no row affected).
func InsertCheckpointSQL(table string) string {
	return `INSERT INTO ` + table + ` (id, position, updated_at, target_schema) VALUES ($1, $2, now(), $3)
			ON CONFLICT (id) DO NOTHING`
}

// MoveCheckpointSQL moves a capture's checkpoint row ($1 id) to $2, only from the position $3
// this writer last read or wrote (the fence): no row is affected when another writer moved it.
func MoveCheckpointSQL(table string) string {
	return `UPDATE ` + table + ` SET position = $2, updated_at = now() WHERE id = $1 AND position = $3::jsonb`
}

// ForceCheckpointSQL writes a capture's checkpoint row ($1 id, $2 position, $3 target schema)
// whatever it holds: no fence. Only the sinks broken on purpose use it (internal/faults).
func ForceCheckpointSQL(table string) string {
	return `INSERT INTO ` + table + ` (id, position, updated_at, target_schema) VALUES ($1, $2, now(), $3)
			ON CONFLICT (id) DO UPDATE SET position = excluded.position, updated_at = now()`
}

// LedgerInsertSQL records a source transaction ($1 commit LSN, $2 xid) in the audit ledger.
func LedgerInsertSQL(table string) string {
	return `INSERT INTO ` + table + ` (commit_lsn, xid) VALUES ($1, $2)`
}

// LockSQL takes the session advisory lock of key $1 ('tidemark ' || $1, hashed), and reads the
// server process that holds it when it is taken.
const LockSQL = `WITH k AS (SELECT hashtextextended('tidemark ' || $1, 0) AS k)
		SELECT pg_try_advisory_lock(k.k), (SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
			AND l.classid = ((k.k >> 32) & 4294967295)::bigint::oid AND l.objid = (k.k & 4294967295)::bigint::oid AND l.objsubid = 1 LIMIT 1)
		FROM k`

// SynchronousCommitSQL makes the open transaction's commit durable before it returns, whatever
// the target's synchronous_commit says.
const SynchronousCommitSQL = "SET LOCAL synchronous_commit = on"

// The catalog queries of the target and the source.
const (
	// KeyIndexSQL: whether table $1 has a unique index on exactly the columns $2 (sorted), with
	// no expression and no predicate.
	KeyIndexSQL = `SELECT EXISTS (SELECT 1 FROM pg_index i
		WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL
		AND i.indnkeyatts = cardinality($2::text[])
		AND (SELECT array_agg(a.attname::text ORDER BY a.attname::text) FROM pg_attribute a
			WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey[0:i.indnkeyatts - 1])) = $2::text[])`
	// TargetColumnsSQL: the stored columns of table $1: name, type with and without modifiers,
	// identity, type OID.
	TargetColumnsSQL = `SELECT attname, format_type(atttypid, atttypmod), format_type(atttypid, NULL), attidentity::text, atttypid
		FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped AND attgenerated = ''`
	// ForeignKeysSQL: the foreign keys from or to table $1, and the table each is on.
	ForeignKeysSQL = `SELECT conname::text, conrelid::regclass::text FROM pg_constraint
		WHERE contype = 'f' AND (conrelid = to_regclass($1) OR confrelid = to_regclass($1)) ORDER BY conname`
	// FormatTypeSQL: the SQL name of type $1 with modifiers $2 (NULL: without).
	FormatTypeSQL = `SELECT format_type($1, $2)`
	// DomainDefinitionSQL: the definition of domain $1.$2 as CREATE DOMAIN takes it after AS
	// (base type with its modifiers, a collation other than the base type's, NOT NULL; not its
	// CHECK constraints, which are code: see Sink.ensureType), its owner, and whether the owner
	// is the current role or a superuser. The same statement reads the source's and the
	// target's, which are then compared as text.
	DomainDefinitionSQL = `SELECT concat_ws(' ', format_type(t.typbasetype, t.typtypmod),
			CASE WHEN t.typcollation <> 0 AND t.typcollation <> b.typcollation THEN 'COLLATE ' || quote_ident(cn.nspname) || '.' || quote_ident(co.collname) END,
			CASE WHEN t.typnotnull THEN 'NOT NULL' END),
		r.rolname::text, (r.rolname = current_user OR r.rolsuper)
		FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace JOIN pg_roles r ON r.oid = t.typowner JOIN pg_type b ON b.oid = t.typbasetype
		LEFT JOIN pg_collation co ON co.oid = t.typcollation LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace
		WHERE n.nspname = $1 AND t.typname = $2 AND t.typtype = 'd'`
	// CompositeAttributesSQL: the attributes of composite type $1.$2 (each as CREATE TYPE ...
	// AS (...) and ADD ATTRIBUTE take it, as CompositeDefinitionSQL writes them) and their types.
	CompositeAttributesSQL = `SELECT coalesce(array_agg(quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod)
				|| CASE WHEN a.attcollation <> 0 AND a.attcollation <> at.typcollation THEN ' COLLATE ' || quote_ident(cn.nspname) || '.' || quote_ident(co.collname) ELSE '' END
				ORDER BY a.attnum), '{}'), coalesce(array_agg(a.atttypid ORDER BY a.attnum), '{}')
		FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
		JOIN pg_attribute a ON a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
		JOIN pg_type at ON at.oid = a.atttypid
		LEFT JOIN pg_collation co ON co.oid = a.attcollation LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace
		WHERE n.nspname = $1 AND t.typname = $2 AND t.typtype = 'c'`
	// DomainChecksSQL: the CHECK constraints of domain $1.$2, as their definitions' text.
	DomainChecksSQL = `SELECT coalesce(string_agg(pg_get_constraintdef(c.oid), ' ' ORDER BY c.conname), '')
		FROM pg_constraint c JOIN pg_type t ON t.oid = c.contypid JOIN pg_namespace n ON n.oid = t.typnamespace
		WHERE n.nspname = $1 AND t.typname = $2 AND c.contype = 'c'`
	// CompositeDefinitionSQL: the attributes of composite type $1.$2 as CREATE TYPE ... AS (...)
	// takes them (CompositeAttributesSQL's, joined), its owner, and whether the owner is the
	// current role or a superuser; compared as DomainDefinitionSQL's. No row for another type.
	CompositeDefinitionSQL = `SELECT array_to_string(d.attrs, ', '), r.rolname::text, (r.rolname = current_user OR r.rolsuper)
		FROM (` + CompositeAttributesSQL + `) d(attrs, types), pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace JOIN pg_roles r ON r.oid = t.typowner
		WHERE n.nspname = $1 AND t.typname = $2 AND t.typtype = 'c' AND (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c'`
	// EnumLabelsByOIDSQL: the schema, name and labels (in order) of enum $1, or of the enum
	// array $1's elements; no row for another type.
	EnumLabelsByOIDSQL = `SELECT n.nspname::text, t.typname::text,
			array(SELECT e.enumlabel::text FROM pg_enum e WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder)
		FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
		WHERE t.oid = (SELECT CASE WHEN a.typcategory = 'A' AND a.typelem <> 0 THEN a.typelem ELSE a.oid END FROM pg_type a WHERE a.oid = $1)
			AND t.typtype = 'e'`
	// EnumLabelsByNameSQL: the labels (in order) of enum $1.$2.
	EnumLabelsByNameSQL = `SELECT array(SELECT e.enumlabel::text FROM pg_enum e WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder)
		FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = $1 AND t.typname = $2 AND t.typtype = 'e'`
	// BaseTypeSQL: the SQL name of type $1 without modifiers.
	BaseTypeSQL = `SELECT format_type($1, NULL)`
	// SourceColumnDefaultSQL: whether column $2 of table $1 has a default, and the value rows
	// stored before it was added have (atthasmissing, the value as a one-element array's text,
	// and the delimiter of the type's arrays). The array's text comes from the element type's own
	// output function (anyarray has no cast but the built-in one); converting the element on the
	// server instead (to its type, then to text) would run casts, which the type's owner can
	// define with a function of their own (pgjson.ArrayElement reads it here).
	SourceColumnDefaultSQL = `SELECT d.adbin IS NOT NULL, a.atthasmissing, a.attmissingval::text, t.typdelim::text
		FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		JOIN pg_type t ON t.oid = a.atttypid
		WHERE a.attrelid = to_regclass($1) AND a.attname = $2`
	// TargetBaseTypeSQL: the type without modifiers of column $2 of table $1, and its OID.
	TargetBaseTypeSQL = `SELECT format_type(atttypid, NULL), atttypid FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2`
)

// CreateSchemaSQL creates a target schema when missing.
func CreateSchemaSQL(schema string) string {
	return "CREATE SCHEMA IF NOT EXISTS " + Quote(schema)
}

// CreateTableSQL creates a target table with the columns names of types (SQL names, as
// format_type gives them) and the primary key key.
func CreateTableSQL(table string, names, types, key []string) string {
	defs := make([]string, len(names))
	for i, n := range names {
		defs[i] = Quote(n) + " " + types[i]
	}
	return fmt.Sprintf("CREATE TABLE %s (%s, PRIMARY KEY (%s))", table, strings.Join(defs, ", "), strings.Join(QuoteAll(key), ", "))
}

// CreateStageSQL creates the session's staging table of a target table: its columns, no rows.
func CreateStageSQL(stage, table string) string {
	return fmt.Sprintf("CREATE TEMP TABLE IF NOT EXISTS %s AS SELECT * FROM %s WITH NO DATA", stage, table)
}

// TruncateSQL empties a table.
func TruncateSQL(table string) string { return "TRUNCATE " + table }

// CopySQL copies rows of the columns names into table, in COPY's text format.
func CopySQL(table string, names []string) string {
	return "COPY " + table + " (" + strings.Join(QuoteAll(names), ", ") + ") FROM STDIN"
}

// DeleteSQL deletes from table the rows whose key (the columns key) the staging table holds,
// each key column compared with its type's own equality, both sides cast as ops says
// (chunker.Ops: OPERATOR(schema.=), the one its index is built with, whatever search_path says,
// and no other role's operator of the exact types).
func DeleteSQL(table, stage string, key []string, ops []chunker.Ops) string {
	conds := make([]string, len(key))
	for i, q := range QuoteAll(key) {
		conds[i] = "t." + q + ops[i].Cast + " " + ops[i].Eq + " s." + q + ops[i].Cast
	}
	return "DELETE FROM " + table + " t USING " + stage + " s WHERE " + strings.Join(conds, " AND ")
}

// UpsertSQL inserts the staging table's rows (the columns names) into table, and on a key (the
// columns key) the table has, sets the other columns named; the columns not named keep their
// values (an unchanged TOASTed value). overriding inserts the given values into a key column
// GENERATED ALWAYS AS IDENTITY.
func UpsertSQL(table, stage string, names, key []string, overriding bool) string {
	quoted := QuoteAll(names)
	var sets []string
	for i, n := range names {
		if !slices.Contains(key, n) {
			sets = append(sets, quoted[i]+" = EXCLUDED."+quoted[i])
		}
	}
	action := "DO NOTHING"
	if len(sets) > 0 {
		action = "DO UPDATE SET " + strings.Join(sets, ", ")
	}
	over := ""
	if overriding {
		over = " OVERRIDING SYSTEM VALUE"
	}
	return fmt.Sprintf("INSERT INTO %s (%s)%s SELECT %s FROM %s ON CONFLICT (%s) %s", table, strings.Join(quoted, ", "), over,
		strings.Join(quoted, ", "), stage, strings.Join(QuoteAll(key), ", "), action)
}

// AlterTypeSQL changes the type of a column (to the same type with other modifiers).
func AlterTypeSQL(table, column, typ string) string {
	return fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE %s", table, Quote(column), typ)
}

// ReplaceTypeSQL gives a column of an empty table another type, whatever the two are (its
// values, none, need no conversion).
func ReplaceTypeSQL(table, column, typ string) string {
	return AlterTypeSQL(table, column, typ) + " USING NULL"
}

// AddColumnSQL adds a column of type typ; def, when not nil, is the text of the value the
// table's existing rows get (a literal cast to typ).
func AddColumnSQL(table, column, typ string, def *string) string {
	d := ""
	if def != nil {
		d = " DEFAULT " + sqlfix.Literal(*def) + "::" + typ
	}
	return fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s%s", table, Quote(column), typ, d)
}

// The statements the sink prints for an operator to run when it stops (the message around each
// says where it ends).

// AddPrimaryKeyFix gives table a primary key on the columns key.
func AddPrimaryKeyFix(table string, key []string) string {
	return fmt.Sprintf("ALTER TABLE %s ADD PRIMARY KEY (%s)", table, strings.Join(QuoteAll(key), ", "))
}

// GeneratedByDefaultFix lets an update set a column GENERATED ALWAYS AS IDENTITY.
func GeneratedByDefaultFix(table, column string) string {
	return fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s SET GENERATED BY DEFAULT;", table, Quote(column))
}

// DropConstraintFix drops constraint name of table (given as regclass prints it).
func DropConstraintFix(table, name string) string {
	return fmt.Sprintf("ALTER TABLE %s DROP CONSTRAINT %s;", table, Quote(name))
}

// RenameColumnFix renames column from to to.
func RenameColumnFix(table, from, to string) string {
	return fmt.Sprintf("ALTER TABLE %s RENAME COLUMN %s TO %s;", table, Quote(from), Quote(to))
}

// AddColumnFix adds a column of type typ.
func AddColumnFix(table, column, typ string) string {
	return fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s;", table, Quote(column), typ)
}

// ConvertTypeFix converts a column to type typ by a USING expression the operator completes.
func ConvertTypeFix(table, column, typ string) string {
	return fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE %s USING ...;", table, Quote(column), typ)
}

// StageTable is the quoted name of the session's staging table number n (temporary: each
// session has its own, in its pg_temp schema, named so that no table of another schema can be
// taken for it).
func StageTable(n int) string { return "pg_temp." + Quote(fmt.Sprintf("tidemark_stage_%d", n)) }

// The savepoint a direct copy of backfilled rows is undone to when a key is already there.
const (
	SavepointSQL         = "SAVEPOINT tidemark_direct"
	ReleaseSavepointSQL  = "RELEASE SAVEPOINT tidemark_direct"
	RollbackSavepointSQL = "ROLLBACK TO SAVEPOINT tidemark_direct"
)
