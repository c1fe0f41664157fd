package postgres

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/replicator"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// TestSQLGolden: every statement the sink builds, for a table and columns whose names need
// quoting (a space, a capital, a double quote), a composite key, columns left out of an upsert,
// an identity key, and a default with a quote in it.
func TestSQLGolden(t *testing.T) {
	table := pgx.Identifier{"Sales", "order items"}.Sanitize()
	stage := StageTable(3)
	names := []string{"tenant", "id", `we"ird`, "Note"}
	types := []string{"uuid", "bigint", "numeric(12,2)", "character varying(20)"}
	key := []string{"tenant", "id"}
	val := "it's"
	var b strings.Builder
	add := func(name, sql string) { fmt.Fprintf(&b, "-- %s\n%s\n\n", name, sql) }
	add("checkpoint table", CheckpointTableSQL(CheckpointTable))
	add("checkpoint table, columns added since", CheckpointColumnsSQL(CheckpointTable))
	add("audit ledger", LedgerTableSQL(LedgerTable))
	add("read the checkpoint", ReadCheckpointSQL(CheckpointTable))
	add("first checkpoint", InsertCheckpointSQL(CheckpointTable))
	add("move the checkpoint (the fence)", MoveCheckpointSQL(CheckpointTable))
	add("write the checkpoint without the fence (broken on purpose)", ForceCheckpointSQL(CheckpointTable))
	add("record a transaction in the ledger", LedgerInsertSQL(LedgerTable))
	add("advisory lock", LockSQL)
	add("durable commit", SynchronousCommitSQL)
	add("key index", KeyIndexSQL)
	add("target columns", TargetColumnsSQL)
	add("foreign keys", ForeignKeysSQL)
	add("type name", FormatTypeSQL)
	add("base type name", BaseTypeSQL)
	add("source column default", SourceColumnDefaultSQL)
	add("target column base type", TargetBaseTypeSQL)
	add("create schema", CreateSchemaSQL("Sales"))
	add("create table", CreateTableSQL(table, names, types, key))
	add("create staging table", CreateStageSQL(stage, table))
	add("truncate", TruncateSQL(table))
	add("copy", CopySQL(stage, names))
	add("delete", DeleteSQL(table, stage, key, []chunker.Ops{{Eq: "OPERATOR(public.=)", Cast: "::public.citext"}, {Eq: "OPERATOR(pg_catalog.=)"}}))
	add("upsert", UpsertSQL(table, stage, names, key, false))
	add("upsert, a column left unchanged", UpsertSQL(table, stage, []string{"tenant", "id", "Note"}, key, false))
	add("upsert, key columns only", UpsertSQL(table, stage, key, key, false))
	add("upsert, identity key", UpsertSQL(table, stage, names, key, true))
	add("savepoint", SavepointSQL)
	add("release savepoint", ReleaseSavepointSQL)
	add("rollback to savepoint", RollbackSavepointSQL)
	add("alter type", AlterTypeSQL(table, `we"ird`, "numeric(14,4)"))
	add("replace type", ReplaceTypeSQL(table, `we"ird`, "integer"))
	add("add column", AddColumnSQL(table, "Note", "character varying(20)", nil))
	add("add column with the existing rows' value", AddColumnSQL(table, "Note", "character varying(20)", &val))
	add("fix: primary key", AddPrimaryKeyFix(table, key))
	add("fix: identity by default", GeneratedByDefaultFix(table, "Note"))
	add("fix: drop foreign key", DropConstraintFix(`"Sales"."other"`, "other_Fk"))
	add("fix: rename", RenameColumnFix(table, "old name", "Note"))
	add("fix: add column", AddColumnFix(table, "Note", "text"))
	add("fix: convert type", ConvertTypeFix(table, `we"ird`, "integer"))

	path := filepath.Join("testdata", "sql.golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./sink/postgres -run TestSQLGolden -update")
	require.Equal(t, string(want), b.String())
}

func TestUnqualified(t *testing.T) {
	for in, want := range map[string]string{
		"public.citext": "citext", `"my schema"."my.type"`: `"my.type"`, "integer": "integer",
		"numeric(12,2)": "numeric(12,2)", `"a.b"`: `"a.b"`, "ext.mood[]": "mood[]",
	} {
		if got := unqualified(in); got != want {
			t.Errorf("unqualified(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestAppendCopyRow: a row in COPY's text format, written out by hand: columns apart by a tab,
// NULL (and a value the stream did not carry) as \N, and a backslash, newline, carriage return
// and tab in a value escaped, so that none of them reads as a delimiter, an end of row or an
// escape (a value "\N" stays text, not NULL; "\." stays text, not the end of data).
func TestAppendCopyRow(t *testing.T) {
	var buf bytes.Buffer
	appendCopyRow(&buf, []replicator.Value{
		{Kind: replicator.Text, Data: []byte(`a\b`)},
		{Kind: replicator.Null},
		{Kind: replicator.Text, Data: []byte(`\N`)},
		{Kind: replicator.Text, Data: []byte("t\tn\nr\r")},
		{Kind: replicator.Text, Data: []byte(`\.`)},
		{Kind: replicator.Text, Data: []byte{}},
	})
	require.Equal(t, "a\\\\b\t\\N\t\\\\N\tt\\tn\\nr\\r\t\\\\.\t\n", buf.String())
}

// TestCopyTextFillsReads: copyText gives the rows' COPY text whole and in order whatever the
// size of the reads, and fills each read with as many rows as fit (pgx sends one message, in
// one write, per read), holding one row's text at most.
func TestCopyTextFillsReads(t *testing.T) {
	var rows [][]replicator.Value
	var want bytes.Buffer
	for i := range 100 {
		row := []replicator.Value{{Kind: replicator.Text, Data: fmt.Appendf(nil, "%d", i)}, {Kind: replicator.Text, Data: []byte("a\tb\\c")}, {Kind: replicator.Null}}
		rows = append(rows, row)
		appendCopyRow(&want, row)
	}
	for _, size := range []int{1, 7, 64 << 10} {
		var buf bytes.Buffer
		c := &copyText{rows: rows, buf: &buf}
		var got bytes.Buffer
		p := make([]byte, size)
		reads := 0
		for {
			n, err := c.Read(p)
			got.Write(p[:n])
			if err != nil {
				break
			}
			reads++
			require.LessOrEqual(t, buf.Cap(), 64, "one row's text at most")
		}
		require.Equal(t, want.String(), got.String(), "reads of %d bytes", size)
		if size == 64<<10 {
			require.Equal(t, 1, reads, "one read takes every row that fits")
		}
	}
}
