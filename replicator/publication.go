package replicator

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/sqlfix"
)

// PublicationComment is the comment on a publication that Open created for slot
// (Config.CreatePublication). A publication carrying it was made by Tidemark for that slot; any
// other was made by someone else, and is theirs to drop.
func PublicationComment(slot string) string { return "created by tidemark for slot " + slot }

// checkPublication checks that the publication exists and publishes every kind of change;
// it creates a missing one when Config.CreatePublication allows, with PublicationComment.
func (s *Stream) checkPublication(ctx context.Context, conn *pgx.Conn, db string) error {
	name := s.cfg.Publication
	var ins, upd, del, trunc bool
	err := conn.QueryRow(ctx, `SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1`, name).
		Scan(&ins, &upd, &del, &trunc)
	if errors.Is(err, pgx.ErrNoRows) {
		tables := "<schema>.<table>, ..."
		if len(s.cfg.PublicationTables) > 0 {
			var names []string
			for _, t := range s.cfg.PublicationTables {
				names = append(names, "ONLY "+t.Sanitize())
			}
			tables = strings.Join(names, ", ")
		}
		// Via the root: a partitioned table's changes then stream under its own name (otherwise
		// under its partitions', which the capture does not follow); no effect on other tables.
		// ONLY: an inheritance parent's children are tables of their own, which a publication
		// of the parent would take in too (and a child without a key would then refuse the
		// application's updates and deletes); a partitioned table's partitions are published
		// through it all the same.
		create := fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish_via_partition_root = true)", quoteIdent(name), tables)
		if !s.cfg.CreatePublication {
			return fmt.Errorf("%w: publication %q does not exist in database %q; create it with: %s;", ErrPublicationMissing, name, db, create)
		}
		if len(s.cfg.PublicationTables) == 0 {
			create = "CREATE PUBLICATION " + quoteIdent(name)
		}
		// The comment, in the same transaction, is how `tidemark cleanup` tells a publication
		// created for this slot (which it may drop) from one a DBA or another capture created.
		comment := "COMMENT ON PUBLICATION " + quoteIdent(name) + " IS " + sqlfix.Literal(PublicationComment(s.cfg.Slot))
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, create); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, comment)
			return err
		}); err != nil {
			return fmt.Errorf("create publication %q: %w", name, err)
		}
		s.pubCreated = true
		s.log.Info().Str("publication", name).Int("tables", len(s.cfg.PublicationTables)).Msg("publication created")
		return nil
	}
	if err != nil {
		return fmt.Errorf("read publication %q: %w", name, err)
	}
	// A TRUNCATE left out would leave the output with every row the table had: refused like a
	// missing delete.
	var missing []string
	for i, ok := range []bool{ins, upd, del, trunc} {
		if !ok {
			missing = append(missing, []string{"insert", "update", "delete", "truncate"}[i])
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: publication %q does not publish %s, so those changes would be lost; fix it with: "+
			"ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate');",
			ErrPublication, name, strings.Join(missing, ", "), quoteIdent(name))
	}
	return nil
}

// ErrCannotAdd reports a table this role may not add to the publication (it does not own the
// publication or the table): discovery then refuses the table with the statement a DBA should run.
var ErrCannotAdd = errors.New("the table cannot be added to the publication")

// AddToPublication adds table to publication pub unless the publication already publishes it
// (as a member, or FOR ALL TABLES). It reports whether it added it. Which tables may be added,
// and when, is the caller's decision: a table that was captured and left the publication must
// not come back silently (its changes while out are not in the slot).
func AddToPublication(ctx context.Context, conn *pgx.Conn, pub string, table pgx.Identifier) (bool, error) {
	var in, all bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3),
		coalesce((SELECT puballtables FROM pg_publication WHERE pubname = $1), false)`, pub, table[0], table[1]).Scan(&in, &all)
	if err != nil {
		return false, fmt.Errorf("check publication %q: %w", pub, err)
	}
	if in || all {
		return false, nil
	}
	if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+quoteIdent(pub)+" ADD TABLE ONLY "+table.Sanitize()); err != nil {
		return false, fmt.Errorf("%w: add %s to publication %q: %w", ErrCannotAdd, table.Sanitize(), pub, err)
	}
	return true, nil
}

// OtherSlots lists the logical pgoutput slots of conn's database but slot: each may be another
// capture streaming a publication, so what it may use is never dropped from under it.
func OtherSlots(ctx context.Context, conn *pgx.Conn, slot string) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT slot_name::text FROM pg_catalog.pg_replication_slots
		WHERE slot_type = 'logical' AND plugin = 'pgoutput' AND database = pg_catalog.current_database() AND slot_name <> $1 ORDER BY 1`, slot)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
