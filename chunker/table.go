package chunker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Column is one column a chunk reads.
type Column struct {
	Name    string // column name
	TypeOID uint32 // data type OID (a domain's own OID)
	BaseOID uint32 // the base type of a domain; TypeOID otherwise
	TypeMod int32  // type modifier, -1 when none
}

// Table is a table as discovered for the backfill: the columns a chunk reads (those pgoutput
// sends: not generated, within the publication's column list) and the key that identifies a row
// in both the chunk and the change stream.
type Table struct {
	Schema          string   // namespace
	Name            string   // table name
	OID             uint32   // pg_class OID
	Columns         []Column // columns in attribute order
	Key             []int    // indexes into Columns of the key columns, in key order
	KeyOps          []Ops    // the comparison operators of each key column, in key order
	KeySource       string   // "primary key", "replica identity index" or "key override"
	ReplicaIdentity byte     // relreplident: 'd', 'f', 'i' or 'n'
	PubColumns      []string // the publication's column list; nil when it publishes every column
	Partitions      []uint32 // OIDs of the partitions under a partitioned table, in OID order
	Kind            byte     // relkind: 'r' a table, 'p' a partitioned table (0: unknown, read as 'p')
}

// Ident returns the quoted, schema-qualified name.
func (t *Table) Ident() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// From is what a chunk reads the table's rows from: ONLY the table itself when it is a table
// (an inheritance parent's children are tables of their own, whose changes the stream carries
// under their own names), the whole tree of a partitioned table (whose partitions' changes the
// publication carries under the table's name).
func (t *Table) From() string {
	if t.Kind == 'r' {
		return "ONLY " + t.Ident()
	}
	return t.Ident()
}

// String returns schema.name, unquoted, for messages.
func (t *Table) String() string { return t.Schema + "." + t.Name }

// KeyNames returns the names of the key columns, in key order.
func (t *Table) KeyNames() []string {
	names := make([]string, len(t.Key))
	for i, k := range t.Key {
		names[i] = t.Columns[k].Name
	}
	return names
}

// ColumnNames returns the names of the columns, in order.
func (t *Table) ColumnNames() []string {
	names := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		names[i] = c.Name
	}
	return names
}

// Errors callers branch on.
var (
	ErrNoTable       = errors.New("table not found")
	ErrNoKey         = errors.New("table has no usable key")
	ErrNotPublished  = errors.New("table is not in the publication")
	ErrSchemaChanged = errors.New("table definition changed")
	// ErrUnlogged: the table (or a partition of it) is UNLOGGED: its writes are in no WAL record.
	ErrUnlogged  = errors.New("the table's writes are not logged")
	ErrRowFilter = errors.New("the publication filters the table's rows")
	// ErrNotViaRoot: a partitioned table belongs to the publication, which publishes its
	// changes under its partitions' names (publish_via_partition_root off).
	ErrNotViaRoot = errors.New("the publication publishes the partitioned table through its partitions")
)

// Discover reads the definition of schema.name and chooses its key: the columns of its replica
// identity (the primary key under REPLICA IDENTITY DEFAULT or FULL, the chosen index under USING
// INDEX), because those are the columns the change stream carries for updates and deletes; or
// the override columns, which must be NOT NULL, unique and carried by the replica identity. A
// table without such a key is refused with what to do. The table must be in publication, unless
// publication is empty (a table read without its changes).
func Discover(ctx context.Context, conn *pgx.Conn, schema, name string, override []string, publication string) (*Table, error) {
	t := &Table{Schema: schema, Name: name}
	kind, err := t.lookUp(ctx, conn)
	if err != nil {
		return nil, err
	}
	return t.discover(ctx, conn, kind, override, publication, func(error) error {
		return fmt.Errorf("%w: %s was dropped (or dropped and created again) while its definition was read; start again (a table captured before: take it out of the capture, or, if it was created again, re-backfill it)", ErrNoTable, t)
	})
}

// DiscoverOID is Discover of the table with OID oid, under whatever name it has now: a captured
// table followed after a rename, with no second look-up by a name a rename may have moved
// meanwhile. A table with that OID no longer there is ErrGone.
func DiscoverOID(ctx context.Context, conn *pgx.Conn, oid uint32, override []string, publication string) (*Table, error) {
	t := &Table{OID: oid}
	kind, err := t.lookUp(ctx, conn)
	if err != nil {
		return nil, err
	}
	return t.discover(ctx, conn, kind, override, publication, func(gone error) error { return gone })
}

// discover reads the rest of the definition of the table lookUp found, by its OID. Every read is
// by the OID: a table dropped (or dropped and created again) meanwhile reads as one without
// columns or a key, so a failure is checked against the OID, and a table no longer there is
// named by dropped (given NameOf's ErrGone).
func (t *Table) discover(ctx context.Context, conn *pgx.Conn, kind byte, override []string, publication string, dropped func(gone error) error) (*Table, error) {
	nt, err := t.define(ctx, conn, kind, override, publication)
	if err != nil && !errors.Is(err, ErrNoTable) {
		if _, _, gerr := NameOf(ctx, conn, t.OID); errors.Is(gerr, ErrGone) {
			return nil, dropped(gerr)
		}
	}
	return nt, err
}

// define reads the definition of the table lookUp found, by its OID, and chooses its key.
func (t *Table) define(ctx context.Context, conn *pgx.Conn, kind byte, override []string, publication string) (*Table, error) {
	t.Kind = kind
	published, err := t.readPublication(ctx, conn, publication)
	if err != nil {
		return nil, err
	}
	if kind == 'p' {
		if t.Partitions, err = Partitions(ctx, conn, t.OID); err != nil {
			return nil, err
		}
	}
	notNull, deterministic, err := t.readColumns(ctx, conn)
	if err != nil {
		return nil, err
	}
	if err := t.chooseKey(ctx, conn, override, notNull, deterministic); err != nil {
		return nil, err
	}
	if err := t.readOps(ctx, conn); err != nil {
		return nil, err
	}
	// Not being published is reported after the key's problems, which adding the table to the
	// publication would not fix.
	if !published && publication != "" && kind == 'p' {
		var member bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication p WHERE p.pubname = $1 AND NOT p.pubviaroot
				AND (p.puballtables OR EXISTS (SELECT FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = $2::oid)))`,
			publication, t.OID).Scan(&member); err != nil {
			return nil, fmt.Errorf("check publication %q for %s: %w", publication, t, err)
		}
		if member {
			return nil, fmt.Errorf("%w: publication %q holds the partitioned table %s but publishes its changes under its partitions' names, which the capture does not follow; publish them under the table's: ALTER PUBLICATION %s SET (publish_via_partition_root = true);",
				ErrNotViaRoot, publication, t, pgx.Identifier{publication}.Sanitize())
		}
	}
	if !published && publication != "" {
		return nil, fmt.Errorf("%w: %s is not in publication %q, so its changes would not be streamed; add it with: ALTER PUBLICATION %s ADD TABLE ONLY %s;",
			ErrNotPublished, t, publication, pgx.Identifier{publication}.Sanitize(), t.Ident())
	}
	return t, nil
}

// DiscoverKeyed reads schema.name with key as its key, whatever its replica identity: a table
// Tidemark writes rather than captures (a sync's PostgreSQL target, which tidemark verify reads),
// whose key is the source's. The key columns must exist; uniqueness is the writer's concern (the
// PostgreSQL sink requires a unique index on them).
func DiscoverKeyed(ctx context.Context, conn *pgx.Conn, schema, name string, key []string) (*Table, error) {
	t := &Table{Schema: schema, Name: name}
	kind, err := t.lookUp(ctx, conn)
	if err != nil {
		return nil, err
	}
	t.Kind = kind
	if _, _, err := t.readColumns(ctx, conn); err != nil {
		return nil, err
	}
	for _, k := range key {
		i := slices.IndexFunc(t.Columns, func(c Column) bool { return c.Name == k })
		if i < 0 {
			return nil, fmt.Errorf("%w: %s has no key column %q", ErrNoKey, t, k)
		}
		t.Key = append(t.Key, i)
	}
	t.KeySource = "given"
	if err := t.readOps(ctx, conn); err != nil {
		return nil, err
	}
	return t, nil
}

// lookUp finds the table's OID (by its name; by the OID when t has one, and its name then) and
// replica identity, and returns its relkind: a table ('r') or a partitioned table
// ('p'); anything else is refused.
func (t *Table) lookUp(ctx context.Context, conn *pgx.Conn) (byte, error) {
	var kind, persistence byte
	var err error
	if t.OID != 0 {
		err = conn.QueryRow(ctx, `SELECT n.nspname, c.relname, c.relreplident, c.relkind, c.relpersistence FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.oid = $1`, t.OID).Scan(&t.Schema, &t.Name, &t.ReplicaIdentity, &kind, &persistence)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, fmt.Errorf("%w: the table with OID %d", ErrGone, t.OID)
		}
	} else {
		err = conn.QueryRow(ctx, `SELECT c.oid, c.relreplident, c.relkind, c.relpersistence FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = $2`, t.Schema, t.Name).Scan(&t.OID, &t.ReplicaIdentity, &kind, &persistence)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, fmt.Errorf("%w: %s does not exist (check the schema and table name and this role's privileges)", ErrNoTable, t)
		}
	}
	if err != nil {
		if t.Name == "" {
			return 0, fmt.Errorf("look up table OID %d: %w", t.OID, err)
		}
		return 0, fmt.Errorf("look up table %s: %w", t, err)
	}
	if kind != 'r' && kind != 'p' {
		return 0, fmt.Errorf("%w: %s is not a table (relkind %q)", ErrNoTable, t, kind)
	}
	if persistence != 'p' {
		return 0, fmt.Errorf("%w: %s is UNLOGGED (or temporary): its writes are in no WAL record, so the stream cannot carry them; make it LOGGED (ALTER TABLE %s SET LOGGED;), and, if it was captured before, re-backfill it",
			ErrUnlogged, t, t.Ident())
	}
	return kind, nil
}

// readPublication reads whether the publication publishes the table, and its column list
// (PubColumns) and row filter (PostgreSQL 15+); a row filter is refused.
func (t *Table) readPublication(ctx context.Context, conn *pgx.Conn, publication string) (bool, error) {
	var published bool
	var pubCols []string
	var rowFilter *string
	version, err := serverVersion(ctx, conn)
	if err != nil {
		return false, err
	}
	// The view names tables; the row is the OID's that lookUp found, joined in the same
	// statement (one snapshot): a rename between the two statements must not read as the
	// table having left the publication (TestDiscoverWhileRenamed).
	byOID := ` JOIN pg_namespace n ON n.nspname = pt.schemaname JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
		WHERE pt.pubname = $1 AND c.oid = $2::oid`
	pubQuery := `SELECT true, NULL::text[], NULL::text FROM pg_publication_tables pt` + byOID
	if version >= 150000 {
		// pg_publication_tables.attnames lists every column when the publication has no column
		// list: taken as one, it would hide a column added after discovery from every later
		// chunk (while the stream carries it). Only a column list (prattrs, on the table or an
		// ancestor it is published through; pg_partition_ancestors lists nothing for a table
		// that is not a partition) limits the columns.
		pubQuery = `SELECT true,
				CASE WHEN EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
					WHERE p.pubname = $1 AND pr.prattrs IS NOT NULL
					  AND (pr.prrelid = $2::oid OR pr.prrelid IN (SELECT relid FROM pg_partition_ancestors($2::oid::regclass))))
				THEN pt.attnames END,
				pt.rowfilter
			FROM pg_publication_tables pt` + byOID
	}
	err = conn.QueryRow(ctx, pubQuery, publication, t.OID).Scan(&published, &pubCols, &rowFilter)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("check publication %q for %s: %w", publication, t, err)
	}
	t.PubColumns = pubCols
	if rowFilter != nil {
		// The stream would carry only the rows the filter passes (and turn updates across it
		// into inserts and deletes) while the backfill read every row: refused rather than
		// mixing two views of the table.
		return false, fmt.Errorf("%w: publication %q publishes only the rows of %s WHERE %s; Tidemark captures whole tables: publish the table without a row filter (ALTER PUBLICATION %s SET TABLE ... without WHERE), or use a publication of its own",
			ErrRowFilter, publication, t, *rowFilter, pgx.Identifier{publication}.Sanitize())
	}
	return published, nil
}

// readColumns reads the table's published, non-generated columns (pgoutput sends no generated
// column) into Columns, with which are NOT NULL and which have a deterministic collation.
func (t *Table) readColumns(ctx context.Context, conn *pgx.Conn) (notNull, deterministic map[string]bool, err error) {
	rows, err := conn.Query(ctx, `
		SELECT a.attname, a.atttypid, CASE WHEN ty.typtype = 'd' THEN ty.typbasetype ELSE a.atttypid END, a.atttypmod,
		       a.attnotnull, coalesce(co.collisdeterministic, true)
		FROM pg_attribute a
		JOIN pg_type ty ON ty.oid = a.atttypid
		LEFT JOIN pg_collation co ON co.oid = a.attcollation
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
		ORDER BY a.attnum`, t.OID)
	if err != nil {
		return nil, nil, fmt.Errorf("read columns of %s: %w", t, err)
	}
	defer rows.Close()
	notNull, deterministic = map[string]bool{}, map[string]bool{}
	for rows.Next() {
		var c Column
		var nn, det bool
		if err := rows.Scan(&c.Name, &c.TypeOID, &c.BaseOID, &c.TypeMod, &nn, &det); err != nil {
			return nil, nil, fmt.Errorf("read columns of %s: %w", t, err)
		}
		if !t.published(c.Name) {
			continue
		}
		notNull[c.Name], deterministic[c.Name] = nn, det
		t.Columns = append(t.Columns, c)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read columns of %s: %w", t, err)
	}
	return notNull, deterministic, nil
}

// chooseKey sets the table's key (Key, KeySource): its replica identity's columns (primary key
// or replica identity index), or the override, which must identify rows and be carried by the
// stream. A table whose updates and deletes would not say which row they change is refused.
func (t *Table) chooseKey(ctx context.Context, conn *pgx.Conn, override []string, notNull, deterministic map[string]bool) error {
	var identity []string
	// A deferrable key (its uniqueness checked at commit) lets one statement move keys onto each
	// other's (UPDATE t SET id = id + 1): the stream then has the inserts and deletes of the
	// moves in whatever order the rows were updated, which no key-by-key replay can apply
	// without losing rows. Refused.
	var deferrable bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = $1 AND indisprimary AND NOT indimmediate)`, t.OID).Scan(&deferrable); err != nil {
		return fmt.Errorf("read key of %s: %w", t, err)
	}
	var err error
	switch t.ReplicaIdentity {
	case 'd', 'f':
		if deferrable && len(override) == 0 {
			return fmt.Errorf("%w: the primary key of %s is DEFERRABLE: one statement can move rows onto each other's keys (UPDATE ... SET id = id + 1), and the stream then carries those moves in an order no replay by key can apply without losing rows; make it NOT DEFERRABLE (ALTER TABLE %s ALTER CONSTRAINT <name> NOT DEFERRABLE, or drop and add the primary key), or give a key override with a unique index that is not deferrable",
				ErrNoKey, t, t.Ident())
		}
		identity, err = indexColumns(ctx, conn, t.OID, "i.indisprimary")
		t.KeySource = "primary key"
	case 'i':
		identity, err = indexColumns(ctx, conn, t.OID, "i.indisreplident")
		t.KeySource = "replica identity index"
	}
	if err != nil {
		return fmt.Errorf("read key of %s: %w", t, err)
	}

	keyCols := identity
	if len(override) > 0 {
		if err := checkOverride(ctx, conn, t, override, identity, notNull); err != nil {
			return err
		}
		keyCols, t.KeySource = override, "key override"
	}
	switch {
	case t.ReplicaIdentity == 'n':
		return fmt.Errorf("%w: %s has REPLICA IDENTITY NOTHING, so updates and deletes carry no key; run ALTER TABLE %s REPLICA IDENTITY DEFAULT; (with a primary key) or REPLICA IDENTITY FULL",
			ErrNoKey, t, t.Ident())
	case len(identity) == 0 && t.ReplicaIdentity == 'i':
		// Its index dropped (PostgreSQL then logs no key, as for NOTHING), or the identity
		// changed between this read and the one before.
		return fmt.Errorf("%w: the REPLICA IDENTITY USING INDEX of %s names no index (dropped, or the identity changed while it was read), so updates and deletes carry no key; run ALTER TABLE %s REPLICA IDENTITY DEFAULT; (with a primary key), or USING INDEX with an existing unique index",
			ErrNoKey, t, t.Ident())
	case len(keyCols) == 0 && t.ReplicaIdentity == 'f':
		return fmt.Errorf("%w: %s has no primary key; give a key override (--key %s=col1,col2: NOT NULL columns with a unique index), add a primary key, or leave the table out", ErrNoKey, t, t)
	case len(keyCols) == 0:
		return fmt.Errorf("%w: %s has no primary key, so updates and deletes carry no key (and fail while the table is in a publication that publishes them); add a primary key, or give a key override (--key %s=col1,col2: NOT NULL columns with a unique index, made its replica identity), or leave the table out",
			ErrNoKey, t, t)
	}
	for _, k := range keyCols {
		i := slices.IndexFunc(t.Columns, func(c Column) bool { return c.Name == k })
		if i < 0 {
			return fmt.Errorf("%w: key column %q of %s is not among its published columns (a publication column list must include the key)", ErrNoKey, k, t)
		}
		if !deterministic[k] {
			return fmt.Errorf("%w: key column %q of %s uses a nondeterministic collation, under which different strings are equal; Tidemark cannot match such keys exactly", ErrNoKey, k, t)
		}
		t.Key = append(t.Key, i)
	}
	return nil
}

// indexColumns returns the columns of the table's index chosen by cond, in index order.
func indexColumns(ctx context.Context, conn *pgx.Conn, oid uint32, cond string) ([]string, error) {
	rows, err := conn.Query(ctx, `
		SELECT a.attname FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1 AND `+cond+` ORDER BY k.ord`, oid)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// checkOverride accepts a key override only if it identifies rows and the change stream carries
// it for every update and delete.
func checkOverride(ctx context.Context, conn *pgx.Conn, t *Table, override, identity []string, notNull map[string]bool) error {
	var problems []string
	for _, c := range override {
		if _, ok := notNull[c]; !ok {
			problems = append(problems, fmt.Sprintf("column %q does not exist or is not published", c))
		} else if !notNull[c] {
			problems = append(problems, fmt.Sprintf("column %q is nullable (declare it NOT NULL)", c))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: key override (%s) of %s: %s", ErrNoKey, strings.Join(override, ", "), t, strings.Join(problems, "; "))
	}
	// Unique: the key columns of some valid unique index, plain columns (no expression), are all
	// in the override (INCLUDE columns do not count: they take no part in the uniqueness).
	var unique bool
	err := conn.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = $1 AND i.indisunique AND i.indimmediate AND i.indpred IS NULL
		  AND i.indisvalid AND i.indexprs IS NULL
		  AND NOT EXISTS (SELECT 1 FROM unnest((i.indkey::int2[])[0:i.indnkeyatts - 1]) k(attnum) LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		                  WHERE a.attname IS NULL OR NOT a.attname = ANY($2)))`, t.OID, override).Scan(&unique)
	if err != nil {
		return fmt.Errorf("check key override of %s: %w", t, err)
	}
	if !unique {
		return fmt.Errorf("%w: key override (%s) of %s is not unique: no unique index (not deferrable) covers only these columns", ErrNoKey, strings.Join(override, ", "), t)
	}
	// Carried: REPLICA IDENTITY FULL sends whole old rows; otherwise only the identity's columns.
	if t.ReplicaIdentity != 'f' && !sameSet(override, identity) {
		// The cheapest identity that carries it: a unique index on exactly these columns
		// (NOT NULL, not partial, not deferrable), which REPLICA IDENTITY USING INDEX accepts.
		var index string
		err := conn.QueryRow(ctx, `
			SELECT coalesce((SELECT quote_ident(x.relname) FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid WHERE i.indrelid = $1 AND i.indisunique AND i.indimmediate
				AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indnkeyatts = cardinality($2::text[])
				AND NOT EXISTS (SELECT 1 FROM unnest(i.indkey) k(attnum) JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
					WHERE NOT a.attname = ANY($2))
				ORDER BY 1 LIMIT 1), '')`, t.OID, override).Scan(&index)
		if err != nil {
			return fmt.Errorf("check key override of %s: %w", t, err)
		}
		fix := fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY FULL;", t.Ident())
		if index != "" {
			fix = fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY USING INDEX %s;  (or REPLICA IDENTITY FULL, which logs whole old rows)", t.Ident(), index)
		}
		idn := "none"
		if len(identity) > 0 {
			idn = strings.Join(identity, ", ")
		}
		return fmt.Errorf("%w: key override (%s) of %s differs from its replica identity (%s), so its updates and deletes would not carry it (and, without one, fail while the table is in a publication); run %s",
			ErrNoKey, strings.Join(override, ", "), t, idn, fix)
	}
	return nil
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

func (t *Table) published(col string) bool {
	return t.PubColumns == nil || slices.Contains(t.PubColumns, col)
}
