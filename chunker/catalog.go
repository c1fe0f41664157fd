package chunker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The catalog facts a capture keeps watching while it runs: a table's current name (it is
// followed by OID through renames), how it belongs to the publication, and its partitions. None
// of them changes with a row event, so the stream says nothing when they change: the engine
// reads them again at its own pace and stops when one moved in a way that loses changes.

// ErrGone reports a captured table that no longer exists (dropped).
var ErrGone = errors.New("table no longer exists")

// NameOf returns the current schema and name of the table with OID oid, or ErrGone.
func NameOf(ctx context.Context, conn *pgx.Conn, oid uint32) (schema, name string, err error) {
	err = conn.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1`, oid).
		Scan(&schema, &name)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", fmt.Errorf("%w: the table with OID %d", ErrGone, oid)
	}
	if err != nil {
		return "", "", fmt.Errorf("look up table OID %d: %w", oid, err)
	}
	return schema, name, nil
}

// Membership describes how the table with OID oid belongs to publication pub, as a token that
// changes whenever the membership is replaced: "" when the publication does not publish the table
// under its own name (not a member; a partitioned table published through its leaves because
// publish_via_partition_root is off), otherwise the catalog rows that make it a member
// (pg_publication_rel and, on PostgreSQL 15, pg_publication_namespace rows, whose OIDs are new
// when a table or schema is dropped from a publication and added again; a row filter's text),
// FOR ALL TABLES, and publish_via_partition_root. Changes of the table between its leaving a
// publication and its coming back are not in any slot, so a token that changed means lost
// changes.
func Membership(ctx context.Context, conn *pgx.Conn, oid uint32, pub string) (string, error) {
	version, err := serverVersion(ctx, conn)
	if err != nil {
		return "", err
	}
	// The table and its ancestors (pg_partition_ancestors lists nothing for a plain table).
	const tree = `(SELECT $2::oid UNION SELECT relid FROM pg_partition_ancestors($2::oid))`
	rels := `(SELECT string_agg('rel:' || pr.oid, ',' ORDER BY pr.oid) FROM pg_publication_rel pr WHERE pr.prpubid = p.oid AND pr.prrelid IN ` + tree + `)`
	nss := `NULL::text`
	if version >= 150000 {
		rels = `(SELECT string_agg('rel:' || pr.oid || coalesce(':filter:' || md5(pg_get_expr(pr.prqual, pr.prrelid)), ''), ',' ORDER BY pr.oid)
			FROM pg_publication_rel pr WHERE pr.prpubid = p.oid AND pr.prrelid IN ` + tree + `)`
		nss = `(SELECT string_agg('schema:' || pn.oid, ',' ORDER BY pn.oid) FROM pg_publication_namespace pn
			WHERE pn.pnpubid = p.oid AND pn.pnnspid IN (SELECT relnamespace FROM pg_class WHERE oid IN ` + tree + `))`
	}
	var all, viaRoot, listed bool
	var kind byte
	var relRows, nsRows *string
	err = conn.QueryRow(ctx, `SELECT p.puballtables, p.pubviaroot, c.relkind,
			EXISTS (SELECT 1 FROM pg_publication_tables pt WHERE pt.pubname = p.pubname AND pt.schemaname = n.nspname AND pt.tablename = c.relname),
			`+rels+`, `+nss+`
		FROM pg_publication p, pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE p.pubname = $1 AND c.oid = $2`, pub, oid).Scan(&all, &viaRoot, &kind, &listed, &relRows, &nsRows)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil // no such publication, or no such table
	}
	if err != nil {
		return "", fmt.Errorf("read the membership of table OID %d in publication %q: %w", oid, pub, err)
	}
	if !listed {
		return "", nil
	}
	var parts []string
	if all {
		parts = append(parts, "all")
	}
	for _, p := range []*string{relRows, nsRows} {
		if p != nil {
			parts = append(parts, *p)
		}
	}
	if kind == 'p' && viaRoot {
		parts = append(parts, "via_root")
	}
	return strings.Join(parts, ","), nil
}

// MembershipKept reports whether a table whose membership token (Membership) was before and is
// now was published all along, as far as two looks can tell: both name one same catalog row
// that makes it a member (its pg_publication_rel row, the pg_publication_namespace row of its
// schema, or FOR ALL TABLES), which was there at both looks and so in between (a row removed
// never comes back under its OID); publish_via_partition_root is the same; and neither has a row
// filter (a path without one added since publishes rows the output never had; one added filters
// rows out). Such a change of the publication's layout (the table's schema added, the table
// dropped from the list while its schema stays, and back) loses nothing. Two steps between two
// looks (the schema added and the list entry dropped) share no row, and cannot be told from a
// table that left and came back.
//
// A partition (partition true) is never kept: it may be a member through an ancestor's row or
// schema, which a DETACH PARTITION takes away without changing any row, and an ATTACH gives back.
// Neither is a table's move out of its published schema and back within one look seen (as it was
// not before any change of the layout: the token comes back the same).
func MembershipKept(before, now string, partition bool) bool {
	if partition || before == "" || now == "" || strings.Contains(before, ":filter:") || strings.Contains(now, ":filter:") {
		return false
	}
	b, n := strings.Split(before, ","), strings.Split(now, ",")
	if slices.Contains(b, "via_root") != slices.Contains(n, "via_root") {
		return false
	}
	return slices.ContainsFunc(b, func(e string) bool { return e != "via_root" && slices.Contains(n, e) })
}

// IsPartition reports whether the table with OID oid is a partition (attached to a partitioned
// table).
func IsPartition(ctx context.Context, conn *pgx.Conn, oid uint32) (bool, error) {
	var part bool
	err := conn.QueryRow(ctx, `SELECT relispartition FROM pg_class WHERE oid = $1`, oid).Scan(&part)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("read whether table OID %d is a partition: %w", oid, err)
	}
	return part, nil
}

// Partitions returns the OIDs of every partition under the table with OID oid (leaves and
// intermediate partitioned tables), in OID order; none for a table that is not partitioned.
func Partitions(ctx context.Context, conn *pgx.Conn, oid uint32) ([]uint32, error) {
	rows, err := conn.Query(ctx, `SELECT relid::oid FROM pg_partition_tree($1::oid) WHERE relid::oid <> $1::oid ORDER BY 1`, oid)
	if err != nil {
		return nil, fmt.Errorf("read the partitions of table OID %d: %w", oid, err)
	}
	parts, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		return nil, fmt.Errorf("read the partitions of table OID %d: %w", oid, err)
	}
	return parts, nil
}

// Invisible returns the transactions that may be committed but not yet visible to a snapshot
// taken now (their low 32 bits, as the stream's xids), with that snapshot: those that hold their
// own transaction id's lock, are invisible to the snapshot, and are not known to be still
// running. A transaction that waits for a synchronous standby after its commit record was flushed
// is committed in the commit log, but PostgreSQL reports it in progress until it leaves the
// process array (pg_xact_status too); pg_locks shows every role every transaction id lock, and
// pg_stat_activity shows which backends wait for a standby, for the roles this one may see.
func Invisible(ctx context.Context, conn *pgx.Conn) ([]uint32, Snapshot, error) {
	var snapText string
	var held []string
	// A prepared transaction holds its lock without a backend: it has not committed (COMMIT
	// PREPARED will be streamed). A backend this role may see that is not waiting for a
	// synchronous standby (idle in transaction, running a statement) has not committed either.
	// The rest may have: a backend waiting for a standby, or one this role may not see.
	err := conn.QueryRow(ctx, `SELECT pg_current_snapshot()::text,
		coalesce((SELECT array_agg(DISTINCT l.transactionid::text) FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted AND l.pid IS NOT NULL
			AND (a.state IS NULL OR a.wait_event IS NOT DISTINCT FROM 'SyncRep')), '{}')`).
		Scan(&snapText, &held)
	if err != nil {
		return nil, Snapshot{}, fmt.Errorf("read the running transactions: %w", err)
	}
	snap, err := ParseSnapshot(snapText)
	if err != nil {
		return nil, Snapshot{}, err
	}
	var out []uint32
	for _, h := range held {
		x, err := strconv.ParseUint(h, 10, 32)
		if err != nil {
			return nil, Snapshot{}, fmt.Errorf("transaction id %q: %w", h, err)
		}
		full := fullXID(uint32(x), snap.Xmax)
		if full < snap.Xmin || full < snap.Xmax && !slices.Contains(snap.Xip, full) {
			continue // visible to the snapshot: ended already
		}
		out = append(out, uint32(x))
	}
	return out, snap, nil
}

// CurrentSnapshot returns a snapshot taken now (pg_current_snapshot()).
func CurrentSnapshot(ctx context.Context, conn *pgx.Conn) (Snapshot, error) {
	var s string
	if err := conn.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&s); err != nil {
		return Snapshot{}, fmt.Errorf("read a snapshot: %w", err)
	}
	return ParseSnapshot(s)
}

// SynchronousStandbys reports whether the server waits for synchronous standbys
// (synchronous_standby_names is set): then a commit can stay invisible for as long as the
// standby does not answer.
func SynchronousStandbys(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var names string
	if err := conn.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names')`).Scan(&names); err != nil {
		return false, fmt.Errorf("read synchronous_standby_names: %w", err)
	}
	return strings.TrimSpace(names) != "", nil
}

// fullXID extends a 32-bit transaction id to 64 bits with the epoch of ref, a full id within 2^31
// of it (running transactions are far closer than that to a snapshot's xmax).
func fullXID(x uint32, ref uint64) uint64 {
	full := ref&^0xFFFFFFFF | uint64(x)
	switch {
	case full > ref+1<<31:
		full -= 1 << 32
	case full+1<<31 < ref:
		full += 1 << 32
	}
	return full
}

func serverVersion(ctx context.Context, conn *pgx.Conn) (int, error) {
	var v int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read server version: %w", err)
	}
	return v, nil
}

// LeafStorage is where a partition's rows are stored, as the catalog says: its file, and whether
// it holds any. A TRUNCATE gives a partition a new, empty file.
type LeafStorage struct {
	OID      uint32 `json:"oid"`
	Filenode uint32 `json:"filenode"`
	Rows     bool   `json:"rows"` // its file is not empty
}

// Storage returns the storage of the leaf partitions among oids (a partitioned table has none of
// its own), in OID order. pg_relation_size needs no privilege on the partition.
func Storage(ctx context.Context, conn *pgx.Conn, oids []uint32) ([]LeafStorage, error) {
	if len(oids) == 0 {
		return nil, nil
	}
	rows, err := conn.Query(ctx, `SELECT c.oid, c.relfilenode, pg_relation_size(c.oid) > 0 FROM pg_class c
		WHERE c.oid = ANY($1) AND c.relkind = 'r' ORDER BY c.oid`, oids)
	if err != nil {
		return nil, fmt.Errorf("read the storage of partitions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LeafStorage, error) {
		var l LeafStorage
		err := r.Scan(&l.OID, &l.Filenode, &l.Rows)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the storage of partitions: %w", err)
	}
	return out, nil
}

// Truncated returns the partitions of before that were emptied into a new file in now: a
// TRUNCATE (or a DELETE of every row and a VACUUM FULL). Under publish_via_partition_root a
// TRUNCATE of a partition is not streamed at all. A partition rewritten with its rows (VACUUM
// FULL, CLUSTER) is not reported; one truncated and filled again before it is looked at is
// missed.
func Truncated(before, now []LeafStorage) []uint32 {
	was := map[uint32]LeafStorage{}
	for _, l := range before {
		was[l.OID] = l
	}
	var out []uint32
	for _, l := range now {
		if b, ok := was[l.OID]; ok && b.Rows && !l.Rows && b.Filenode != l.Filenode {
			out = append(out, l.OID)
		}
	}
	return out
}
