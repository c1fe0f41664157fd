package e2e_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

func str(s string) *string { return &s }

// TestOracleWholeRows: a record is the whole row, but for the columns it lists as unchanged. A
// snapshot or insert that silently lacks a column leaves the replay without it, even when an
// earlier record of the key had the column (the replay used to keep the old value: a chunk
// that lacked a column after ADD COLUMN went unseen).
func TestOracleWholeRows(t *testing.T) {
	t.Parallel()
	o := e2e.NewOracle("ver")
	o.Apply(e2e.Record{Table: "s.t", Op: "insert", Key: "1", Values: map[string]*string{"id": str("1"), "ver": str("1"), "x": str(`"a"`), "big": str(`"B"`)}, LSN: 10})
	// An update leaving big unchanged keeps it; x is in the update.
	o.Apply(e2e.Record{Table: "s.t", Op: "update", Key: "1", Values: map[string]*string{"id": str("1"), "ver": str("2"), "x": str(`"b"`)}, Unchanged: []string{"big"}, LSN: 20})
	require.Equal(t, `"B"`, *o.Rows("s.t")["1"]["big"], "an unchanged column keeps its value")
	// A backfilled row without x: x is gone from the row, not kept from before.
	o.Apply(e2e.Record{Table: "s.t", Op: "snapshot", Key: "1", Values: map[string]*string{"id": str("1"), "ver": str("3"), "big": str(`"B"`)}, LSN: 30})
	source := map[string]map[string]*string{"1": {"id": str("1"), "ver": str("3"), "x": str(`"b"`), "big": str(`"B"`)}}
	require.Contains(t, e2e.Diff(o.Rows("s.t"), source), `key "1" column x: no value in the output`)
	// An update that lacks a column without listing it as unchanged loses it too.
	o.Apply(e2e.Record{Table: "s.t", Op: "update", Key: "1", Values: map[string]*string{"id": str("1"), "ver": str("4"), "x": str(`"b"`)}, LSN: 40})
	require.NotContains(t, o.Rows("s.t")["1"], "big")
}

// TestOracleUnchangedParsed: the JSON lines' "unchanged" list reaches the record (it was dropped,
// and the replay kept every column a record lacked), and "original" keeps a NaN apart from NULL.
func TestOracleUnchangedParsed(t *testing.T) {
	t.Parallel()
	lines := `{"op":"insert","table":"s.t","key":{"id":1},"after":{"id":1,"ver":1,"big":"B","n":null},"original":{"n":"NaN"},"lsn":"0/10","seq":0,"xid":5}
{"op":"update","table":"s.t","key":{"id":1},"after":{"id":1,"ver":2,"n":1.50},"unchanged":["big"],"lsn":"0/20","seq":0,"xid":6}
`
	recs, err := e2e.ParseJSONL(strings.NewReader(lines), map[string][]string{"s.t": {"id"}})
	require.NoError(t, err)
	require.Len(t, recs, 2)
	require.Equal(t, e2e.Lossy+"NaN", *recs[0].Values["n"], "NaN is not NULL")
	require.Equal(t, []string{"big"}, recs[1].Unchanged)
	require.Equal(t, "6", recs[1].Txn)
	o := e2e.NewOracle("ver")
	for _, r := range recs {
		o.Apply(r)
	}
	source := map[string]map[string]*string{"1": {"id": str("1"), "ver": str("2"), "big": str(`"B"`), "n": str("1.50")}}
	require.Empty(t, e2e.Diff(o.Rows("s.t"), source))
	source["1"]["n"] = str("1.5")
	require.NotEmpty(t, e2e.Diff(o.Rows("s.t"), source), "the scale is part of the value")

	// Damaged lines are reported and skipped when asked.
	var damaged []int
	var n int
	require.NoError(t, e2e.ReadJSONL(strings.NewReader(lines+"{\"op\":\"ins\x00\x00\n"+lines), map[string][]string{"s.t": {"id"}},
		func(e2e.Record) { n++ }, func(line int, _ error) { damaged = append(damaged, line) }))
	require.Equal(t, []int{3}, damaged)
	require.Equal(t, 4, n)
}

// TestOracleExactlyOnce: for an output taken exactly once, a change delivered twice is a
// violation, and positions must increase; a backfilled row repeating the key's version at a
// later position is a counted duplicate only.
func TestOracleExactlyOnce(t *testing.T) {
	t.Parallel()
	rec := func(op string, ver string, lsn uint64, seq int) e2e.Record {
		return e2e.Record{Table: "s.t", Op: op, Key: "1", Values: map[string]*string{"id": str("1"), "ver": str(ver)}, LSN: lsn, Seq: seq}
	}
	o := e2e.NewOracle("ver")
	o.ExactlyOnce, o.Order = true, e2e.ByLSNSeq
	o.Apply(rec("update", "5", 100, 0))
	o.Apply(rec("snapshot", "5", 200, 0)) // a chunk read the row the stream emitted
	require.Empty(t, o.Violations())
	require.Equal(t, 1, o.Duplicates())
	o.Apply(rec("update", "5", 100, 0)) // the same change again, and a position behind
	v := strings.Join(o.Violations(), "\n")
	require.Contains(t, v, "exactly once: s.t key \"1\": version 5 delivered again")
	require.Contains(t, v, "I13: s.t key \"1\": the output's position went back")

	// At-least-once: counted, not a violation.
	o = e2e.NewOracle("ver")
	o.Apply(rec("update", "5", 100, 0))
	o.Apply(rec("update", "5", 100, 0))
	require.Empty(t, o.Violations())
	require.Equal(t, 1, o.Duplicates())

	// Airbyte records (upsert): the same version at the same LSN is the change again; at a later
	// LSN it is a backfilled row.
	o = e2e.NewOracle("ver")
	o.ExactlyOnce, o.Order = true, e2e.ByLSN
	o.Apply(rec("upsert", "5", 100, 0))
	o.Apply(rec("upsert", "5", 150, 0))
	require.Empty(t, o.Violations())
	o.Apply(rec("upsert", "5", 150, 0))
	require.Contains(t, strings.Join(o.Violations(), "\n"), "delivered again")

	// Positions start over only at a refresh, as many times as allowed.
	o = e2e.NewOracle("ver")
	o.Order, o.Resets = e2e.ByLSNSeq, 1
	o.Apply(rec("update", "5", 100, 0))
	o.Apply(e2e.Record{Table: "s.t", Op: "refresh", LSN: 50})
	o.Apply(rec("snapshot", "6", 60, 0))
	require.Empty(t, o.Violations())
	o.Apply(e2e.Record{Table: "s.t", Op: "refresh", LSN: 40})
	require.Contains(t, strings.Join(o.Violations(), "\n"), "I13")
}

// TestOracleResurrection: a key that comes back after its delete with a version the source had
// deleted is a resurrection, also when the output never showed the key's versions before the
// delete (the oracle knew only the versions it had seen).
func TestOracleResurrection(t *testing.T) {
	t.Parallel()
	deleted := map[string]int64{"s.t|1|7": 9, "s.t||8": 20}
	resolve := func(table, key, txn string) (int64, bool) {
		v, ok := deleted[table+"|"+key+"|"+txn]
		return v, ok
	}
	o := e2e.NewOracle("ver")
	o.Apply(e2e.Record{Table: "s.t", Op: "delete", Key: "1", LSN: 10, Txn: "7"})
	o.Apply(e2e.Record{Table: "s.t", Op: "snapshot", Key: "1", Values: map[string]*string{"id": str("1"), "ver": str("5")}, LSN: 20})
	require.Empty(t, o.Violations(), "the oracle alone has no version to compare with")
	o.CheckDeaths(resolve)
	require.Contains(t, strings.Join(o.Violations(), "\n"), `I3: s.t key "1" came back after its delete (transaction 7 at 0/A), which removed version 9, with version 5`)

	// A newer version after the delete is the key inserted again.
	o = e2e.NewOracle("ver")
	o.Apply(e2e.Record{Table: "s.t", Op: "delete", Key: "1", LSN: 10, Txn: "7"})
	o.Apply(e2e.Record{Table: "s.t", Op: "insert", Key: "1", Values: map[string]*string{"id": str("1"), "ver": str("10")}, LSN: 20})
	o.CheckDeaths(resolve)
	require.Empty(t, o.Violations())

	// A truncate: any row of the table with a version from before it.
	o = e2e.NewOracle("ver")
	o.Apply(e2e.Record{Table: "s.t", Op: "snapshot", Key: "2", Values: map[string]*string{"id": str("2"), "ver": str("3")}, LSN: 5})
	o.Apply(e2e.Record{Table: "s.t", Op: "truncate", LSN: 10, Txn: "8"})
	o.Apply(e2e.Record{Table: "s.t", Op: "insert", Key: "3", Values: map[string]*string{"id": str("3"), "ver": str("21")}, LSN: 20})
	o.Apply(e2e.Record{Table: "s.t", Op: "snapshot", Key: "4", Values: map[string]*string{"id": str("4"), "ver": str("19")}, LSN: 30})
	o.CheckDeaths(resolve)
	v := o.Violations()
	require.Len(t, v, 1)
	require.Contains(t, v[0], `key "" came back after the truncate of its table`)
	require.Contains(t, v[0], "with version 19")
}

// TestOracleFillMissing: a column a row lacks counts as the source's default only when the
// row's last record came before any record of the table carried the column.
func TestOracleFillMissing(t *testing.T) {
	t.Parallel()
	o := e2e.NewOracle("ver")
	o.Apply(e2e.Record{Table: "s.t", Op: "snapshot", Key: "1", Values: map[string]*string{"id": str("1"), "ver": str("1")}, LSN: 10})
	o.Apply(e2e.Record{Table: "s.t", Op: "insert", Key: "2", Values: map[string]*string{"id": str("2"), "ver": str("2"), "x1": str(`"a"`)}, LSN: 20})
	o.Apply(e2e.Record{Table: "s.t", Op: "snapshot", Key: "3", Values: map[string]*string{"id": str("3"), "ver": str("3")}, LSN: 30})
	rows := o.Rows("s.t")
	null := "null"
	v := o.FillMissing("s.t", rows, []string{"x1"}, &null)
	require.Equal(t, "null", *rows["1"]["x1"], "written before the column existed")
	require.NotContains(t, rows["3"], "x1")
	require.Len(t, v, 1)
	require.Contains(t, v[0], `key "3": its last record lacks column x1`)
}
