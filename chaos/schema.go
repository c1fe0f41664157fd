package chaos

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// ddlTables are the tables the schema faults change. txlog is left alone: it is the audit of the
// PostgreSQL target (one row per source transaction, each applied once), which a re-backfill of
// it would fill without applying the transactions.
var ddlTables = []string{"accounts", "items", "notes"}

// schemaState is what the schema faults changed of the workload's tables, which the workload
// follows: the current name of a renamed table, the columns the harness added.
type schemaState struct {
	schema string // the run's schema
	moved  string // the schema the rename fault moves a table to (ALTER TABLE ... SET SCHEMA)

	mu    sync.Mutex
	names map[string]string   // table → its current qualified, quoted name
	added map[string][]string // table → columns the harness added that exist now, oldest first
	ever  map[string]bool     // "table.column" of every column the harness added
	n     int                 // columns added so far: they are named x1, x2, ...
}

func newSchemaState(schema string) *schemaState {
	s := &schemaState{schema: schema, moved: schema + "_moved", names: map[string]string{}, added: map[string][]string{}, ever: map[string]bool{}}
	for _, t := range tables {
		s.names[t.name] = pgx.Identifier{schema, t.name}.Sanitize()
	}
	return s
}

// schemaView is a copy of the state, for the statements of one transaction.
type schemaView struct {
	names  map[string]string
	newest map[string]string // table → the newest added column, if any
}

func (s *schemaState) view() schemaView {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := schemaView{names: maps.Clone(s.names), newest: map[string]string{}}
	for t, cols := range s.added {
		if len(cols) > 0 {
			v.newest[t] = cols[len(cols)-1]
		}
	}
	return v
}

// col is ", x" for an INSERT's column list when table has an added column, else "".
func (v schemaView) col(table string) string {
	if c := v.newest[table]; c != "" {
		return ", " + c
	}
	return ""
}

// val is ", value" for an INSERT's values when table has an added column, else "".
func (v schemaView) val(table, value string) string {
	if v.newest[table] != "" {
		return ", " + value
	}
	return ""
}

// set is ", x = value" for an UPDATE when table has an added column, else "".
func (v schemaView) set(table, value string) string {
	if c := v.newest[table]; c != "" {
		return ", " + c + " = " + value
	}
	return ""
}

func (s *schemaState) name(table string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names[table]
}

func (s *schemaState) rename(table, to string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names[table] = to
}

// newColumn names a new column; columnAdded records it once it exists.
func (s *schemaState) newColumn() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return fmt.Sprintf("x%d", s.n)
}

func (s *schemaState) columnAdded(table, col string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.added[table] = append(s.added[table], col)
	s.ever[table+"."+col] = true
}

// takeOldest removes table's oldest added column from the state (the workload stops writing it)
// and returns it; "" when it has none.
func (s *schemaState) takeOldest(table string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	cols := s.added[table]
	if len(cols) == 0 {
		return ""
	}
	s.added[table] = slices.Clone(cols[1:])
	return cols[0]
}

// everAdded returns every column the harness added to table, dropped since or not.
func (s *schemaState) everAdded(table string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.ever {
		if t, col, _ := strings.Cut(k, "."); t == table {
			out = append(out, col)
		}
	}
	slices.Sort(out)
	return out
}

// wasAdded reports whether the harness added column col to table (schema.table).
func (s *schemaState) wasAdded(table, col string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ever[strings.TrimPrefix(table, s.schema+".")+"."+col]
}

// addedIn returns the columns the harness added to table (schema.table) that the source's rows
// have.
func (s *schemaState) addedIn(table string, source map[string]map[string]*string) []string {
	var cols []string
	for _, row := range source {
		for c := range row {
			if s.wasAdded(table, c) {
				cols = append(cols, c)
			}
		}
		break
	}
	slices.Sort(cols)
	return cols
}

// fillAdded gives each row of a target table (schema.table) that has no value at all for a
// column the harness added and the source has (the target lacks the column: no change since it
// was added reached the target) the value such a row has in the source, NULL: the columns are
// added nullable and without a default. A replay of records is filled by Oracle.FillMissing
// instead, which also knows when a row lacks a column wrongly.
func (s *schemaState) fillAdded(table string, replay, source map[string]map[string]*string) {
	cols := s.addedIn(table, source)
	for _, row := range replay {
		for _, c := range cols {
			if _, ok := row[c]; !ok {
				null := "null"
				row[c] = &null
			}
		}
	}
}
