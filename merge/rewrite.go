package merge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/chunker"
)

// ErrValuesRewritten: a column's definition changed while the table was rewritten (ALTER TABLE
// ... ALTER COLUMN ... TYPE, with or without USING): every stored value may have changed without
// a row event, and the output keeps them as they were.
var ErrValuesRewritten = errors.New("a column's values may have been rewritten without row events")

// ErrUnlogged: a captured table, or a partition of one, is UNLOGGED: its writes are in no WAL
// record, so the stream cannot carry them (chunker's, which discovery reports too).
var ErrUnlogged = chunker.ErrUnlogged

// Shape is what tells a table's values rewritten under a changed column from maintenance: its
// columns' catalog rows (pg_attribute), each with the transaction that last wrote it, and the
// storage files of the table (or of its leaf partitions). PostgreSQL records no USING clause,
// and a type change may keep the type (ALTER COLUMN v TYPE text USING upper(v)); but every ALTER
// COLUMN ... TYPE writes the column's row, and every one that rewrites the values gives the
// table new files. A column row written again and new files, between two looks, is such a
// change, or something as rare (a column renamed and the table rewritten by VACUUM FULL between
// two looks); a new file alone is maintenance (VACUUM FULL, CLUSTER, SET TABLESPACE, pg_repack,
// a TRUNCATE, which is streamed), and a column row alone changed no stored value (a varchar
// made longer, a rename, SET STATISTICS).
type Shape struct {
	Columns []ColumnType `json:"columns,omitempty"`
	Files   []uint32     `json:"files,omitempty"` // relfilenodes of the table or its leaf partitions, in OID order
	// Truncated is the transaction of the last TRUNCATE of the table the stream carried: files
	// whose catalog rows it last wrote are explained (storageCheck), whenever they were looked at.
	Truncated uint32 `json:"truncated,omitempty"`
	// Labels are the labels of the enums the table's columns use (directly, in arrays, under
	// domains), by pg_enum row: a value is stored as its label's row, so a label renamed
	// (ALTER TYPE ... RENAME VALUE) changes the text of every stored value with no row event.
	Labels []EnumLabel `json:"labels,omitempty"`
	// Unlogged: a capture that re-backfills rewrites (Config.RebackfillRewrites) saw the table
	// UNLOGGED, and has not re-backfilled it since: once it is LOGGED again, the writes made
	// meanwhile are in no WAL record, and a later run re-backfills it.
	Unlogged bool `json:"unlogged,omitempty"`
}

// EnumLabel is a pg_enum row as a Shape records it.
type EnumLabel struct {
	OID   uint32 `json:"oid"`
	Type  string `json:"type"` // the enum, schema-qualified and quoted as needed
	Label string `json:"label"`
}

// currentShape reads table oid's Shape now, and whether it or a partition is UNLOGGED, in one
// snapshot: a type change committed between two of its reads would show the new files beside the
// old column rows, which is what maintenance shows.
func currentShape(ctx context.Context, conn *pgx.Conn, oid uint32) (Shape, bool, error) {
	if conn.PgConn().TxStatus() != 'I' {
		return readShape(ctx, conn, oid) // inside the caller's transaction: its snapshot
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return Shape{}, false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	return readShape(ctx, tx, oid)
}

// querier runs a query: a connection, or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func readShape(ctx context.Context, conn querier, oid uint32) (Shape, bool, error) {
	var s Shape
	rows, err := conn.Query(ctx, `SELECT attname::text, attnum, atttypid, atttypmod, xmin::text::bigint FROM pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum`, oid)
	if err != nil {
		return s, false, err
	}
	s.Columns, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ColumnType, error) {
		var c ColumnType
		var xmin int64
		err := r.Scan(&c.Name, &c.Attnum, &c.Type, &c.Mod, &xmin)
		c.Xmin = uint32(xmin)
		return c, err
	})
	if err != nil {
		return s, false, err
	}
	var unlogged bool
	err = conn.QueryRow(ctx, `SELECT coalesce(array_agg(c.relfilenode ORDER BY c.oid) FILTER (WHERE c.relkind = 'r'), '{}'), coalesce(bool_or(c.relpersistence <> 'p'), false)
		FROM pg_class c WHERE c.oid = $1 OR c.oid IN (SELECT relid FROM pg_partition_tree($1::oid::regclass))`, oid).Scan(&s.Files, &unlogged)
	if err != nil {
		return s, unlogged, err
	}
	rows, err = conn.Query(ctx, `WITH RECURSIVE ty(oid) AS (
			SELECT atttypid FROM pg_catalog.pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped
			UNION
			SELECT CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.typelem END FROM pg_catalog.pg_type t JOIN ty ON t.oid = ty.oid
			WHERE t.typtype = 'd' OR t.typelem <> 0 AND t.typcategory = 'A')
		SELECT e.oid::bigint, pg_catalog.format_type(e.enumtypid, NULL), e.enumlabel::text FROM pg_catalog.pg_enum e
		WHERE e.enumtypid IN (SELECT oid FROM ty) ORDER BY e.oid`, oid)
	if err != nil {
		return s, unlogged, err
	}
	s.Labels, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (EnumLabel, error) {
		var l EnumLabel
		var o int64
		err := r.Scan(&o, &l.Type, &l.Label)
		l.OID = uint32(o)
		return l, err
	})
	return s, unlogged, err
}

// renamedLabels returns the labels of before that now have another text, as the statements that
// rename them likewise on a PostgreSQL target.
func renamedLabels(before, now []EnumLabel) (what, fix []string) {
	for _, b := range before {
		i := slices.IndexFunc(now, func(n EnumLabel) bool { return n.OID == b.OID })
		if i < 0 || now[i].Label == b.Label {
			continue
		}
		n := now[i]
		what = append(what, fmt.Sprintf("label %s of type %s is now %s", quoteLiteral(b.Label), n.Type, quoteLiteral(n.Label)))
		fix = append(fix, fmt.Sprintf("ALTER TYPE %s RENAME VALUE %s TO %s;", n.Type, quoteLiteral(b.Label), quoteLiteral(n.Label)))
	}
	return what, fix
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// checkShape stops a capture whose table (name, oid) is UNLOGGED now, or was rewritten under a
// changed column since before (an empty Shape, from a position of an earlier version, is not
// compared). It returns the Shape now.
func checkShape(ctx context.Context, conn *pgx.Conn, name, ident string, oid uint32, before Shape) (Shape, error) {
	now, unlogged, err := currentShape(ctx, conn, oid)
	if err != nil {
		return now, fmt.Errorf("read the columns and storage of %s: %w", name, err)
	}
	if unlogged {
		return now, fmt.Errorf("%w: %s, or a partition of it, is UNLOGGED (ALTER TABLE ... SET UNLOGGED): its writes are in no WAL record, so the stream cannot carry them; make it LOGGED again (ALTER TABLE ... SET LOGGED; on %s or the partition), then re-backfill the table",
			ErrUnlogged, name, ident)
	}
	if what, fix := renamedLabels(before.Labels, now.Labels); len(what) > 0 {
		return now, fmt.Errorf("%w: %s uses an enum whose %s (ALTER TYPE ... RENAME VALUE): a value is stored as its label's pg_enum row, so every stored value of that label now reads otherwise, with no row event, and the output keeps the old text; re-backfill the table (tidemark sync --rebackfill %s; the connector: clear the stream's data), or rename it likewise in the output (a PostgreSQL target: %s) and acknowledge it for one run (tidemark sync --types-changed %s)",
			ErrValuesRewritten, name, strings.Join(what, ", "), name, strings.Join(fix, " "), name)
	}
	if len(before.Files) == 0 || slices.Equal(before.Files, now.Files) {
		return now, nil
	}
	var changed []string
	for _, b := range before.Columns {
		for _, n := range now.Columns {
			if n.Attnum != b.Attnum || n.Xmin == b.Xmin {
				continue
			}
			from, to := fmt.Sprint(b.Type), fmt.Sprint(n.Type)
			_ = conn.QueryRow(ctx, `SELECT format_type($1, $2), format_type($3, $4)`, b.Type, b.Mod, n.Type, n.Mod).Scan(&from, &to)
			changed = append(changed, fmt.Sprintf("%s (%s, now %s %s)", b.Name, from, n.Name, to))
		}
	}
	if len(changed) == 0 {
		return now, nil
	}
	return now, fmt.Errorf("%w: %s was rewritten (new storage files) after a change of column %s: ALTER COLUMN ... TYPE rewrites every stored value, with no row event, and PostgreSQL records no USING clause, so the output may keep values the source no longer has; re-backfill the table (tidemark sync --rebackfill %s; the connector: clear the stream's data), or, once the output's values are converted the same way (a PostgreSQL target: ALTER TABLE ... ALTER COLUMN ... TYPE ... USING <the source's expression>;), acknowledge it for one run (tidemark sync --types-changed %s)",
		ErrValuesRewritten, name, strings.Join(changed, ", "), name, name)
}

// ErrStorageReplaced: a table's storage files changed between two runs, and nothing the stream
// carried explains it. Maintenance does this (VACUUM FULL, CLUSTER, pg_repack, SET TABLESPACE)
// and changes no value; so does ALTER TABLE ... SET UNLOGGED then SET LOGGED, whose writes in
// between are in no WAL record; PostgreSQL keeps nothing that tells them apart afterwards.
var ErrStorageReplaced = errors.New("a table's storage was replaced between two runs")

// storageCheck is a table whose storage files changed since the position was taken, with no
// column change (which ErrValuesRewritten judges) and no TRUNCATE the position had seen that
// explains them. A TRUNCATE the stream carries on resuming explains them when its transaction
// is the last writer of the catalog rows (pg_class) of every changed file: the table's, or its
// TOAST table's (which a later ALTER TABLE ... ADD COLUMN, GRANT or REPLICA IDENTITY leaves
// alone, and every rewrite replaces too). Once the stream is past until (the WAL position when
// they were looked at) without one, the capture stops. Until then the table's progress keeps
// the files it had, so a checkpoint meanwhile keeps the question for the next run.
type storageCheck struct {
	table   string
	ident   string
	before  []uint32     // the files when the position was taken
	files   []uint32     // the files now
	writers []leafWriter // of each changed file; nil when they cannot be told (partitions changed)
	added   []string     // columns added since (one with a volatile default rewrote the table)
	until   pglogrepl.LSN
}

// leafWriter is the transactions that last wrote the catalog rows of a table (or leaf
// partition) and of its TOAST table (0: none).
type leafWriter struct{ heap, toast uint32 }

// explainedBy reports whether a TRUNCATE in transaction xid made every changed file.
func (s *storageCheck) explainedBy(xid uint32) bool {
	if xid == 0 || len(s.writers) == 0 {
		return false
	}
	for _, w := range s.writers {
		if w.heap != xid && (w.toast == 0 || w.toast != xid) {
			return false
		}
	}
	return true
}

// lastWriters returns the leafWriter of each of table oid's storage files (the table's, or its
// leaf partitions', in OID order as Shape.Files) that differs from before; nil when they differ
// in number (partitions changed, which the position's partitions judge).
func lastWriters(ctx context.Context, conn *pgx.Conn, oid uint32, before, now []uint32) ([]leafWriter, error) {
	var heap, toast []int64
	err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(c.xmin::text::bigint ORDER BY c.oid), '{}'),
			coalesce(array_agg(coalesce(t.xmin::text::bigint, 0) ORDER BY c.oid), '{}')
		FROM pg_class c LEFT JOIN pg_class t ON t.oid = c.reltoastrelid
		WHERE c.relkind = 'r' AND (c.oid = $1 OR c.oid IN (SELECT relid FROM pg_partition_tree($1::oid::regclass)))`, oid).Scan(&heap, &toast)
	if err != nil || len(before) != len(now) || len(heap) != len(now) {
		return nil, err
	}
	var out []leafWriter
	for i := range now {
		if now[i] != before[i] {
			out = append(out, leafWriter{heap: uint32(heap[i]), toast: uint32(toast[i])})
		}
	}
	return out, nil
}

// err is the stop of a storage change nothing explained.
func (s *storageCheck) err() error {
	if len(s.added) > 0 {
		return fmt.Errorf("%w: the storage files of %s changed since the position was taken (%v, now %v) and column(s) %s were added: ALTER TABLE ... ADD COLUMN with a volatile default (random(), clock_timestamp(), a sequence) rewrites the table and gives every row a value with no row event, and a SET UNLOGGED/SET LOGGED round trip leaves the same sign; re-backfill the table (tidemark sync --rebackfill %s; the connector: clear the stream's data), or, if the column's values need not reach the output (rows changed later carry them), acknowledge it for one run (tidemark sync --maintenance %s)",
			ErrStorageReplaced, s.ident, s.before, s.files, strings.Join(s.added, ", "), s.table, s.table)
	}
	return fmt.Errorf("%w: the storage files of %s changed since the position was taken (%v, now %v), and the stream carried no TRUNCATE of it that explains them. VACUUM FULL, CLUSTER, pg_repack and ALTER TABLE ... SET TABLESPACE do this and change no value; so does ALTER TABLE ... SET UNLOGGED followed by SET LOGGED, and the writes made in between are in no WAL record; PostgreSQL keeps nothing that tells them apart afterwards. If it was maintenance, acknowledge it for one run (tidemark sync --maintenance %s); otherwise re-backfill the table (tidemark sync --rebackfill %s; the connector: clear the stream's data)",
		ErrStorageReplaced, s.ident, s.before, s.files, s.table, s.table)
}

// volatileAdded returns the columns of now that before lacks and whose existing rows were given
// values by a rewrite of the table, with no row event: a default that PostgreSQL did not keep as
// the value rows of the time read (atthasmissing), which is a volatile one (random(),
// clock_timestamp(), a sequence), or an identity. A default set after the column was added
// leaves the same sign; with new storage files in the same look, that is as rare as the
// maintenance it would need.
func volatileAdded(ctx context.Context, conn *pgx.Conn, oid uint32, before, now []ColumnType) ([]string, error) {
	var added []int16
	for _, c := range now {
		if !slices.ContainsFunc(before, func(b ColumnType) bool { return b.Attnum == c.Attnum }) {
			added = append(added, c.Attnum)
		}
	}
	if len(added) == 0 || len(before) == 0 {
		return nil, nil
	}
	rows, err := conn.Query(ctx, `SELECT attname::text FROM pg_catalog.pg_attribute WHERE attrelid = $1 AND attnum = ANY($2)
		AND NOT atthasmissing AND (atthasdef OR attidentity <> '') ORDER BY attnum`, oid, added)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// errVolatileAdded is the stop (without Config.RebackfillRewrites) for columns added to a
// table with a volatile default while the capture ran.
func errVolatileAdded(name string, cols []string) error {
	return fmt.Errorf("%w: column(s) %s of %s were added with a volatile default (or as an identity): PostgreSQL rewrote the table and gave every existing row a value, with no row event, so the output's rows lack them; re-backfill the table (tidemark sync --rebackfill %s, or tidemark rebackfill --tables %s while it runs; the connector: clear the stream's data)",
		ErrValuesRewritten, strings.Join(cols, ", "), name, name, name)
}

// rewriteCause is what a rewrite's stop says happened, without the remedies: the cause an
// automatic re-backfill logs.
func rewriteCause(err error) string {
	s, _, _ := strings.Cut(err.Error(), "; re-backfill the table")
	return strings.TrimPrefix(s, ErrValuesRewritten.Error()+": ")
}
