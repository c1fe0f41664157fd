// Package sqlfix writes the SQL Tidemark prints for a person to run: the fixes of doctor, of the
// connector's check, and of the errors that stop a capture. A DBA pastes them into a session
// Tidemark knows nothing about, often as a superuser, and the names in them come from
// configuration (a slot, a publication, a table, a role), which another person may have written.
// So every identifier and every literal in a printed statement goes through this package:
//
//   - Ident quotes each part of a name in double quotes, doubling the quotes in it (and dropping
//     NUL, which no name can hold). A quoted identifier means the same under every setting.
//   - Literal quotes a string. A plain literal 'a\b' reads differently under
//     standard_conforming_strings off (the DBA's session may have it: it is per session, and
//     was the default before PostgreSQL 9.1), where a backslash escapes the next character, so
//     'x\'; DROP ...' would end the string early. A literal with a backslash is therefore
//     written as an escape string, E'a\\b', which reads the same under both settings; one
//     without is written 'plain', quotes doubled.
//
// The statements themselves are built here too (CreateSlot, GrantSelect...), so that the test
// that runs each one with hostile names (FuzzPrintedFixes: quotes, backslashes, semicolons,
// dollar quotes, unicode, names over 63 bytes) covers what is printed. Tidemark runs its own SQL
// with bound parameters; Literal serves the few statements that cannot take one (a column's
// default copied into the target), under either setting.
package sqlfix

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// Ident quotes a possibly qualified name: Ident("public", "t") is "public"."t".
func Ident(parts ...string) string { return pgx.Identifier(parts).Sanitize() }

// Literal quotes s as a string literal that reads as s whatever standard_conforming_strings is.
func Literal(s string) string {
	s = strings.ReplaceAll(s, "\x00", "")
	if strings.Contains(s, `\`) {
		return "E'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", "''") + "'"
	}
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// CreateSlot creates logical replication slot slot with pgoutput.
func CreateSlot(slot string) string {
	return "SELECT pg_catalog.pg_create_logical_replication_slot(" + Literal(slot) + ", 'pgoutput');"
}

// DropSlot drops replication slot slot.
func DropSlot(slot string) string {
	return "SELECT pg_catalog.pg_drop_replication_slot(" + Literal(slot) + ");"
}

// CreatePublication creates publication pub of tables (each {schema, name}), publishing a
// partitioned table's changes under its own name (publish_via_partition_root; no effect on
// other tables), and each table only (ONLY: not an inheritance parent's children, which are
// tables of their own; a partitioned table's partitions are published through it all the same).
func CreatePublication(pub string, tables ...pgx.Identifier) string {
	list := make([]string, len(tables))
	for i, t := range tables {
		list[i] = "ONLY " + Ident(t...)
	}
	return "CREATE PUBLICATION " + Ident(pub) + " FOR TABLE " + strings.Join(list, ", ") + " WITH (publish_via_partition_root = true);"
}

// AddTable adds table {schema, name} to publication pub (ONLY that table, as CreatePublication).
func AddTable(pub string, table pgx.Identifier) string {
	return "ALTER PUBLICATION " + Ident(pub) + " ADD TABLE ONLY " + Ident(table...) + ";"
}

// PublishAll makes publication pub publish every kind of change.
func PublishAll(pub string) string {
	return "ALTER PUBLICATION " + Ident(pub) + " SET (publish = 'insert, update, delete, truncate');"
}

// GrantSelect lets role read table {schema, name}.
func GrantSelect(table pgx.Identifier, role string) string {
	return "GRANT SELECT ON " + Ident(table...) + " TO " + Ident(role) + ";"
}

// GrantSelectAll lets role read every table of schema.
func GrantSelectAll(schema, role string) string {
	return "GRANT SELECT ON ALL TABLES IN SCHEMA " + Ident(schema) + " TO " + Ident(role) + ";"
}

// GrantUsage lets role use schema.
func GrantUsage(schema, role string) string {
	return "GRANT USAGE ON SCHEMA " + Ident(schema) + " TO " + Ident(role) + ";"
}

// GrantWrite lets role read and write table {schema, name}.
func GrantWrite(table pgx.Identifier, role string) string {
	return "GRANT SELECT, INSERT, UPDATE ON " + Ident(table...) + " TO " + Ident(role) + ";"
}

// Replication gives role the REPLICATION attribute.
func Replication(role string) string { return "ALTER ROLE " + Ident(role) + " WITH REPLICATION;" }

// GrantEmit lets role write logical messages.
func GrantEmit(role string) string {
	return "GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) TO " + Ident(role) + ";"
}

// OwnerTo gives table {schema, name} to role.
func OwnerTo(table pgx.Identifier, role string) string {
	return "ALTER TABLE " + Ident(table...) + " OWNER TO " + Ident(role) + ";"
}

// ReplicaIdentityFull makes table {schema, name} log whole old rows.
func ReplicaIdentityFull(table pgx.Identifier) string {
	return "ALTER TABLE " + Ident(table...) + " REPLICA IDENTITY FULL;"
}

// DropTrigger drops trigger name of table {schema, name}.
func DropTrigger(name string, table pgx.Identifier) string {
	return "DROP TRIGGER " + Ident(name) + " ON " + Ident(table...) + ";"
}

// DropRule drops rule name of table {schema, name}.
func DropRule(name string, table pgx.Identifier) string {
	return "DROP RULE " + Ident(name) + " ON " + Ident(table...) + ";"
}

// DropPolicy drops row security policy name of table {schema, name}.
func DropPolicy(name string, table pgx.Identifier) string {
	return "DROP POLICY " + Ident(name) + " ON " + Ident(table...) + ";"
}

// DropPublication drops publication pub.
func DropPublication(pub string) string { return "DROP PUBLICATION " + Ident(pub) + ";" }
