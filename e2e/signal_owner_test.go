package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgtrust"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/watermark"
)

// TestSignalTableTrust: every mark is written by the capture's role, so a trigger or a rule on
// the signal table would run with that role's rights (and could forge marks). A signal table
// owned by another role than the capture's or a superuser (who could add one at any time), or
// carrying triggers or rules, is refused with the owner, the triggers and the SQL that fixes it;
// once fixed, the capture runs.
func TestSignalTableTrust(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 20, 1)
	role := "tm_" + db.Name[2:]
	app := "app_" + db.Name[2:]
	db.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN REPLICATION PASSWORD 'pw'`, role))
	db.Exec(fmt.Sprintf(`CREATE ROLE %s NOLOGIN`, app))
	t.Cleanup(func() {
		for _, r := range []string{role, app} {
			db.Exec(fmt.Sprintf(`DROP OWNED BY %s`, r))
			db.Exec(fmt.Sprintf(`DROP ROLE %s`, r))
		}
	})
	db.Exec(fmt.Sprintf(`GRANT SELECT ON t TO %s`, role))
	db.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, db.Slot)
	// The application's role created the table first (PostgreSQL before 15 lets every role
	// create in public) and granted the capture what it needs.
	db.Exec(fmt.Sprintf(watermark.CreateTable, `"public"."tidemark_signal"`))
	db.Exec(fmt.Sprintf(`ALTER TABLE tidemark_signal OWNER TO %s`, app))
	db.Exec(fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE ON tidemark_signal TO %s`, role))
	db.Exec(`ALTER PUBLICATION ` + db.Publication + ` ADD TABLE tidemark_signal`)

	asRole := engineConfig(db, "public.t")
	asRole.Watermarks = watermark.Table
	asRole.Source.DSN = server.UserDSN(db.Name, role, "pw")
	asSuper := engineConfig(db, "public.t")
	asSuper.Watermarks = watermark.Table
	for name, c := range map[string]merge.Config{"capture role": asRole, "superuser": asSuper} {
		err := runEngine(t, c, newMemSink(), nil)
		require.ErrorIs(t, err, watermark.ErrSetup, name)
		require.ErrorContains(t, err, fmt.Sprintf(`owned by role "%s"`, app), name)
		require.ErrorContains(t, err, `ALTER TABLE "public"."tidemark_signal" OWNER TO "`, name)
	}

	// Owned by the capture's role, but with a trigger and a rule someone added.
	db.Exec(fmt.Sprintf(`ALTER TABLE tidemark_signal OWNER TO %s`, role))
	db.Exec(`CREATE FUNCTION sneaky() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`)
	db.Exec(`CREATE TRIGGER sneaky BEFORE INSERT OR UPDATE ON tidemark_signal FOR EACH ROW EXECUTE FUNCTION sneaky()`)
	db.Exec(`CREATE TABLE copies (slot text)`)
	db.Exec(`CREATE RULE copy_marks AS ON UPDATE TO tidemark_signal DO ALSO INSERT INTO copies VALUES (NEW.slot)`)
	err := runEngine(t, asRole, newMemSink(), nil)
	require.ErrorIs(t, err, watermark.ErrSetup)
	require.ErrorContains(t, err, "triggers (sneaky)")
	require.ErrorContains(t, err, `DROP TRIGGER "sneaky" ON "public"."tidemark_signal";`)
	require.ErrorContains(t, err, `DROP RULE "copy_marks" ON "public"."tidemark_signal";`)
	require.NotContains(t, err.Error(), "pw")

	db.Exec(`DROP TRIGGER sneaky ON tidemark_signal`)
	db.Exec(`DROP RULE copy_marks ON tidemark_signal`)
	sink := newMemSink()
	require.NoError(t, runEngine(t, asRole, sink, nil), "owned by the capture's role, no trigger, no rule")
	verify(t, db, sink, "public.t", "id")
}

// TestSignalTableChangedWhileRunning: the signal table is checked when the capture starts, and
// again, under a lock that keeps it as it is until the commit, in every transaction that
// writes a mark (pgtrust.Guard): a trigger added while the capture runs (by its owner, a role
// it granted TRIGGER, or whoever dropped and made the table again) never runs; the capture
// stops at once with what changed and the fix.
func TestSignalTableChangedWhileRunning(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	versionedTable(t, db, 30, 1)
	db.Exec(`CREATE TABLE fired (at timestamptz)`)
	db.Exec(`CREATE FUNCTION record() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO public.fired VALUES (now()); RETURN NEW; END $$`)
	cfg := engineConfig(db, "public.t")
	cfg.Watermarks = watermark.Table
	cfg.Hooks.AfterHigh = onChunk(t, db, 1, `CREATE TRIGGER record BEFORE INSERT OR UPDATE ON public.tidemark_signal FOR EACH ROW EXECUTE FUNCTION record()`)
	start := time.Now()
	err := runEngine(t, cfg, newMemSink(), nil)
	require.ErrorIs(t, err, pgtrust.ErrUntrusted)
	require.ErrorContains(t, err, "triggers (record)")
	require.ErrorContains(t, err, `DROP TRIGGER "record" ON "public"."tidemark_signal";`)
	require.Less(t, time.Since(start), 20*time.Second, "stopped at once, not retried as a failed chunk")
	var n int
	require.NoError(t, db.Conn.QueryRow(context.Background(), `SELECT count(*) FROM fired`).Scan(&n))
	require.Zero(t, n, "the trigger added while the capture ran never ran")
}
