package e2e_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
)

// textSink keeps the text of one column of every insert, in order.
type textSink struct {
	mu   sync.Mutex
	col  string
	vals []string
}

func (s *textSink) Emit(_ context.Context, evs []merge.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range evs {
		if ev.Op == merge.Insert {
			v, _ := ev.Value(s.col)
			s.vals = append(s.vals, v)
		}
	}
	return nil
}

func (s *textSink) Checkpoint(context.Context, *merge.Position) error { return nil }

// TestCompositeTypeChanged: a composite type gains and loses attributes while its column is
// captured. The stream prints each value with the type's attributes of its time; every value
// becomes a JSON object, never a null for the whole value or a failed sync: with the type as
// loaded when it fits, else with the type read again (its current fields, null for one the
// value did not have yet, a dropped one's value left out).
func TestCompositeTypeChanged(t *testing.T) {
	t.Parallel()
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TYPE pair AS (a int, b text)`)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY, p pair)`)
	db.Exec(`CREATE PUBLICATION ` + db.Publication + ` FOR TABLE t`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pc, err := pgconf.Parse(db.DSN, "test")
	require.NoError(t, err)
	conn, err := pgx.ConnectConfig(ctx, pc)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var oid uint32
	require.NoError(t, conn.QueryRow(ctx, `SELECT 'public.pair'::regtype::oid`).Scan(&oid))
	// A registry that loaded the type before it changed, as a capture running all along has.
	stale := pgjson.NewRegistry(conn)
	staleType, err := stale.Type(ctx, oid)
	require.NoError(t, err)

	cfg := engineConfig(db, "public.t")
	sink := &textSink{col: "p"}
	require.NoError(t, runEngine(t, cfg, sink, nil)) // the slot; nothing to backfill
	db.Exec(`INSERT INTO t VALUES (1, ROW(1, 'one'))`)
	db.Exec(`ALTER TYPE pair ADD ATTRIBUTE c int`)
	db.Exec(`INSERT INTO t VALUES (2, ROW(2, 'two', 22))`)
	db.Exec(`ALTER TYPE pair DROP ATTRIBUTE b`)
	db.Exec(`INSERT INTO t VALUES (3, ROW(3, 33))`)
	cfg.Source.CreateSlot = false
	require.NoError(t, runEngine(t, cfg, sink, nil))
	require.Equal(t, []string{"(1,one)", "(2,two,22)", "(3,33)"}, sink.vals, "the stream prints each value as of its time")

	fresh := pgjson.NewRegistry(conn)
	freshType, err := fresh.Type(ctx, oid)
	require.NoError(t, err)
	for _, r := range []struct {
		name  string
		types *pgjson.Registry
		typ   *pgjson.Type
		want  []string
	}{
		// The first value fits the type as it was loaded, and keeps its attribute b; the
		// second does not, and the type is read again.
		{"loaded before the changes", stale, staleType, []string{`{"a":1,"b":"one"}`, `{"a":2,"c":22}`, `{"a":3,"c":33}`}},
		// A dropped attribute's name is gone from the catalog: an earlier value takes the
		// current fields.
		{"loaded after them", fresh, freshType, []string{`{"a":1,"c":null}`, `{"a":2,"c":22}`, `{"a":3,"c":33}`}},
	} {
		for i, v := range sink.vals {
			out, _, err := r.types.Append(ctx, r.typ, nil, []byte(v))
			require.NoError(t, err, "%s: value %q", r.name, v)
			require.JSONEq(t, r.want[i], string(out), "%s: value %q", r.name, v)
		}
	}
}
