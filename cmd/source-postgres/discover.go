package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/internal/pgjson"
)

// The CDC metadata columns, named as Airbyte's source-postgres names them.
const (
	colLSN       = "_ab_cdc_lsn"
	colUpdatedAt = "_ab_cdc_updated_at"
	colDeletedAt = "_ab_cdc_deleted_at"
)

// relation is a table or view of the configured schemas.
type relation struct {
	schema, name string
	kind         byte // relkind: r, p, v, m, f
	viaRoot      bool // a partitioned table published through its root
}

// relations lists the tables and views of the configured schemas this role may read, without
// the signal table, and without partitions: a partitioned table is one stream (its root), whose
// reads cover every partition, as Airbyte's connector lists it; its partitions beside it would
// give the same rows twice.
func (s *source) relations(ctx context.Context, conn *pgx.Conn) ([]relation, error) {
	pub := ""
	if s.cfg.cdc() {
		pub = s.cfg.ReplicationMethod.Publication
	}
	rows, err := conn.Query(ctx, `
		SELECT n.nspname, c.relname, c.relkind,
		       coalesce((SELECT p.pubviaroot FROM pg_publication p WHERE p.pubname = $2), false)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = ANY($1) AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT c.relispartition
		  AND has_table_privilege(c.oid, 'SELECT')
		ORDER BY 1, 2`, s.cfg.Schemas, pub)
	if err != nil {
		return nil, fmt.Errorf("list the tables of schemas %v: %w", s.cfg.Schemas, err)
	}
	sig, _ := s.cfg.signalTable()
	var out []relation
	for rows.Next() {
		var r relation
		if err := rows.Scan(&r.schema, &r.name, &r.kind, &r.viaRoot); err != nil {
			return nil, err
		}
		if r.schema == sig[0] && r.name == sig[1] {
			continue
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// discover describes every readable table and view of the configured schemas as a stream.
// With CDC, a table whose changes can be captured (in the publication, with a usable key)
// supports incremental syncs; every other relation (views and materialized views among them) full
// refresh only, with its primary key when it has one. With Standard, every relation supports
// incremental syncs by a cursor the user chooses; with Xmin, every relation that has rows of its
// own (tables, partitioned tables, materialized views), by the source-defined xmin.
func (s *source) discover(ctx context.Context) (*catalog, error) {
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	types := pgjson.NewProfileRegistry(conn, s.cfg.profile())
	rels, err := s.relations(ctx, conn)
	if err != nil {
		return nil, err
	}
	c := &catalog{Streams: []stream{}}
	for _, r := range rels {
		st, err := s.describe(ctx, conn, types, r)
		if err != nil {
			return nil, err
		}
		c.Streams = append(c.Streams, *st)
	}
	return c, nil
}

func (s *source) describe(ctx context.Context, conn *pgx.Conn, types *pgjson.Registry, r relation) (*stream, error) {
	schema, err := types.TableSchema(ctx, r.schema, r.name)
	if err != nil {
		return nil, err
	}
	ns := r.schema
	st := &stream{Name: r.name, Namespace: &ns, JSONSchema: schema, SupportedSyncModes: []string{"full_refresh"}}
	props := schema["properties"].(map[string]any)
	clash := ""
	for _, c := range []string{colLSN, colUpdatedAt, colDeletedAt} {
		if _, ok := props[c]; ok && clash == "" {
			clash = c
		}
	}
	switch {
	case s.cfg.cdc() && clash != "":
		// The table's own column keeps its name and schema; the stream is full refresh only, whose
		// records carry no metadata columns (Airbyte's connector would overwrite the column's
		// value with its metadata).
		s.log.Warn().Str("table", streamKey(r.schema, r.name)).Str("column", clash).
			Msg("the table has a column named as a CDC metadata column: its stream is offered as full refresh only; rename the column to sync it incrementally")
	case s.cfg.cdc():
		// Every stream of a CDC connection carries the metadata columns, as Airbyte's does.
		props[colLSN] = map[string]any{"type": []string{"null", "number"}}
		// Plain strings, as Airbyte's connector types them (its Java version, and its Kotlin one
		// since 2025): a destination keeps a string column for them either way.
		props[colUpdatedAt] = map[string]any{"type": []string{"null", "string"}}
		props[colDeletedAt] = map[string]any{"type": []string{"null", "string"}}
	}
	var key []string
	if r.kind == 'r' || r.kind == 'p' {
		if s.cfg.cdc() && r.kind == 'p' && !r.viaRoot {
			s.log.Warn().Str("table", streamKey(r.schema, r.name)).Str("publication", s.cfg.ReplicationMethod.Publication).
				Msg("a partitioned table is captured through its root only when the publication publishes via the root: its stream is offered as full refresh only; ALTER PUBLICATION ... SET (publish_via_partition_root = true) to sync it incrementally")
		}
		// A capturable table: in the publication, with a key the change stream carries.
		if s.cfg.cdc() && clash == "" && (r.kind == 'r' || r.viaRoot) {
			t, err := chunker.Discover(ctx, conn, r.schema, r.name, nil, s.cfg.ReplicationMethod.Publication)
			switch {
			case err == nil:
				key = t.KeyNames()
				st.SupportedSyncModes = []string{"full_refresh", "incremental"}
				st.SourceDefinedCursor = true
				st.DefaultCursorField = []string{colLSN}
			case !errors.Is(err, chunker.ErrNoKey) && !errors.Is(err, chunker.ErrNotPublished) && !errors.Is(err, chunker.ErrNoTable):
				return nil, err
			}
		}
		if key == nil {
			if key, err = primaryKey(ctx, conn, r); err != nil {
				return nil, err
			}
		}
		// Tables with a key are read in key order, chunk by chunk, and resume mid-table.
		st.IsResumable = len(key) > 0
		if st.IsResumable && s.cfg.cdc() {
			st.SourceDefinedCursor = true
		}
	}
	switch s.cfg.ReplicationMethod.Method {
	case "Standard":
		// Incremental by a cursor column the user chooses, in any relation (methods.go).
		st.SupportedSyncModes = []string{"full_refresh", "incremental"}
	case "Xmin":
		// Incremental by the rows' xmin, which relations with storage have.
		if r.kind == 'r' || r.kind == 'p' || r.kind == 'm' {
			st.SupportedSyncModes = []string{"full_refresh", "incremental"}
			st.SourceDefinedCursor = true
		}
	}
	for _, k := range key {
		st.SourceDefinedPrimaryKey = append(st.SourceDefinedPrimaryKey, []string{k})
	}
	return st, nil
}

// primaryKey returns the columns of r's primary key, in key order (nil without one).
func primaryKey(ctx context.Context, conn *pgx.Conn, r relation) ([]string, error) {
	rows, err := conn.Query(ctx, `
		SELECT a.attname FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = to_regclass($1) AND i.indisprimary ORDER BY k.ord`, pgx.Identifier{r.schema, r.name}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("read the primary key of %s.%s: %w", r.schema, r.name, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// columnOps reads the comparison operators of column name of the relation with OID rel
// (chunker.Ops): its type's own, schema-qualified, since search_path is pinned to pg_catalog.
func columnOps(ctx context.Context, conn *pgx.Conn, rel uint32, name string) (chunker.Ops, error) {
	var typ uint32
	if err := conn.QueryRow(ctx, `SELECT atttypid FROM pg_attribute WHERE attrelid = $1 AND attname = $2 AND attnum > 0 AND NOT attisdropped`, rel, name).Scan(&typ); err != nil {
		return chunker.Ops{}, fmt.Errorf("read the type of column %q: %w", name, err)
	}
	return chunker.ReadOps(ctx, conn, typ)
}
