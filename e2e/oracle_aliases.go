package e2e

import (
	"context"
	"io"

	"github.com/tidemark/tidemark/chaos/oracle"
	"github.com/tidemark/tidemark/internal/pgjson"
)

// The oracle and the JSON lines reader live in chaos/oracle, which links no test code (the chaos
// harness, in the product, uses them); these names let the tests keep writing e2e.Record,
// e2e.Diff and so on.

type (
	// Record is oracle.Record.
	Record = oracle.Record
	// Oracle is oracle.Oracle.
	Oracle = oracle.Oracle
)

// KeySep is oracle.KeySep.
const KeySep = oracle.KeySep

// NewOracle is oracle.NewOracle.
func NewOracle(versionColumn string) *Oracle { return oracle.NewOracle(versionColumn) }

// SourceRows is oracle.SourceRows.
func SourceRows(ctx context.Context, dsn, schema, table string, key []string) (map[string]map[string]*string, error) {
	return oracle.SourceRows(ctx, dsn, schema, table, key)
}

// SourceRowsJSON is oracle.SourceRowsJSON.
func SourceRowsJSON(ctx context.Context, dsn, schema, table string, key []string, profile ...pgjson.Profile) (map[string]map[string]*string, error) {
	return oracle.SourceRowsJSON(ctx, dsn, schema, table, key, profile...)
}

// Diff is oracle.Diff.
func Diff(replay, source map[string]map[string]*string) string { return oracle.Diff(replay, source) }

// ParseJSONL is oracle.ParseJSONL.
func ParseJSONL(r io.Reader, keys map[string][]string) ([]Record, error) {
	return oracle.ParseJSONL(r, keys)
}

// Lossy is oracle.Lossy.
const Lossy = oracle.Lossy

// Ordering is oracle.Ordering.
type Ordering = oracle.Ordering

// The orderings of oracle.Ordering.
const (
	Unordered = oracle.Unordered
	ByLSNSeq  = oracle.ByLSNSeq
	ByLSN     = oracle.ByLSN
)

// ReadJSONL is oracle.ReadJSONL.
func ReadJSONL(r io.Reader, keys map[string][]string, apply func(Record), damaged func(line int, err error)) error {
	return oracle.ReadJSONL(r, keys, apply, damaged)
}
