// Package pgtrust decides whether Tidemark may use a database object that it did not just create
// itself: an object whose author could otherwise run code of their choosing with Tidemark's role.
//
// Every statement Tidemark sends runs with its role's rights (REPLICATION, SELECT on the
// captured tables, write on the target's, often a superuser's). A trigger, a rule or a row
// security policy on a table it writes, or the CHECK constraint of a domain a column it fills
// has, is code that runs inside those statements with those rights, and its author chooses it.
// So:
//
//   - Tidemark's own tables (the PostgreSQL target's checkpoint table and audit ledger, the
//     signal table) are created "if not exists", so anyone could have created them first. Own
//     accepts one only if it is an ordinary table owned by the role Tidemark runs as (not
//     another role, not even a superuser) with no trigger, rule, row security policy, forced row
//     security or inheritance: nothing Tidemark did not create.
//   - The user's objects that Tidemark writes or uses (a target table created beforehand, the
//     domains of its columns): Code accepts their code only when its authors could not gain
//     anything by it, because they already have this role's rights: this role itself, or a
//     superuser. That is the table's owner and the owners of its trigger functions, and a
//     domain's owner and the owners of the functions its constraints call. A table of the
//     user's without triggers, rules or policies is accepted whoever owns it.
//
// Both report every problem at once, with the statements that fix each.
package pgtrust

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/sqlfix"
)

// ErrUntrusted reports an object refused because someone other than this role could run code
// with this role's rights through it.
var ErrUntrusted = errors.New("refused: another role could run code with this role's rights through it")

// Refused is the error of an object refused (it wraps ErrUntrusted): what it is, its problems,
// and the statements that fix them.
type Refused struct {
	What     string   // "the checkpoint table "public"."tidemark_checkpoint""
	Problems []string // what is wrong, one each
	Fixes    []string // the statements that fix them, one each
	After    string   // what else the operator may do, after the fixes
}

func (r *Refused) Error() string {
	msg := fmt.Sprintf("%v: %s is refused: %s; after checking what relies on it, a superuser (or its owner) should run:\n  %s",
		ErrUntrusted, r.What, strings.Join(r.Problems, "; "), strings.Join(r.Fixes, "\n  "))
	if r.After != "" {
		msg += "\n" + r.After
	}
	return msg
}

func (r *Refused) Unwrap() error { return ErrUntrusted }

func refused(what string, problems, fixes []string, after string) error {
	if len(problems) == 0 {
		return nil
	}
	return &Refused{What: what, Problems: problems, Fixes: fixes, After: after}
}

// depsSQL lists the functions the code of table $1 (an OID) calls, directly or as the function
// of an operator it uses: its constraints, column defaults and generated columns, indexes
// (expressions, predicates), triggers, policies and rules. For each: the function, its owner,
// whether that owner is trusted (this role or a superuser), and whether it is pg_catalog's.
const depsSQL = `SELECT DISTINCT p.oid::pg_catalog.regprocedure::text, pr.rolname::text, (pr.rolname = current_user OR pr.rolsuper), n.nspname = 'pg_catalog'
	FROM pg_depend d
	JOIN pg_proc p ON (d.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.refobjid = p.oid)
		OR (d.refclassid = 'pg_catalog.pg_operator'::pg_catalog.regclass AND p.oid = (SELECT o.oprcode FROM pg_operator o WHERE o.oid = d.refobjid))
	JOIN pg_roles pr ON pr.oid = p.proowner
	JOIN pg_namespace n ON n.oid = p.pronamespace
	WHERE (d.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass AND d.objid IN (SELECT oid FROM pg_constraint WHERE conrelid = $1))
		OR (d.classid = 'pg_catalog.pg_attrdef'::pg_catalog.regclass AND d.objid IN (SELECT oid FROM pg_attrdef WHERE adrelid = $1))
		OR (d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objid IN (SELECT indexrelid FROM pg_index WHERE indrelid = $1))
		OR (d.classid = 'pg_catalog.pg_trigger'::pg_catalog.regclass AND d.objid IN (SELECT oid FROM pg_trigger WHERE tgrelid = $1))
		OR (d.classid = 'pg_catalog.pg_policy'::pg_catalog.regclass AND d.objid IN (SELECT oid FROM pg_policy WHERE polrelid = $1))
		OR (d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND d.objid IN (SELECT oid FROM pg_rewrite WHERE ev_class = $1))
	ORDER BY 1`

type dep struct {
	fn, owner        string
	trusted, catalog bool
}

func deps(ctx context.Context, q Rows, oid uint32) ([]dep, error) {
	rows, err := q.Query(ctx, depsSQL, oid)
	if err != nil {
		return nil, err
	}
	var out []dep
	var d dep
	_, err = pgx.ForEachRow(rows, []any{&d.fn, &d.owner, &d.trusted, &d.catalog}, func() error {
		out = append(out, d)
		return nil
	})
	return out, err
}

// untrustedGrantee is the condition that a.grantee, holding a privilege on table c, is neither
// its owner, nor this role, nor a superuser (PUBLIC, grantee 0, is everyone).
const untrustedGrantee = `a.grantee <> c.relowner AND (a.grantee = 0 OR NOT EXISTS (SELECT FROM pg_catalog.pg_roles g
		WHERE g.oid = a.grantee AND (g.rolname = current_user OR g.rolsuper)))`

// triggerGrantsSQL lists the roles that hold the TRIGGER privilege on table c and are neither
// its owner, nor this role, nor a superuser: each could add a trigger at any time.
const triggerGrantsSQL = `array(SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::text END
		FROM pg_catalog.aclexplode(c.relacl) a WHERE a.privilege_type = 'TRIGGER' AND ` + untrustedGrantee + ` ORDER BY 1)`

// ownSQL reads what Own checks of table $1 (a quoted, qualified name).
const ownSQL = `SELECT c.oid, c.relkind::text, r.rolname::text, current_user::text, c.relrowsecurity, c.relforcerowsecurity,
		array(SELECT t.tgname::text FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal ORDER BY 1),
		array(SELECT w.rulename::text FROM pg_rewrite w WHERE w.ev_class = c.oid ORDER BY 1),
		array(SELECT p.polname::text FROM pg_policy p WHERE p.polrelid = c.oid ORDER BY 1),
		array(SELECT i.inhparent::pg_catalog.regclass::text FROM pg_inherits i WHERE i.inhrelid = c.oid ORDER BY 1),
		array(SELECT i.inhrelid::pg_catalog.regclass::text FROM pg_inherits i WHERE i.inhparent = c.oid ORDER BY 1),
		array(SELECT x.indexrelid::pg_catalog.regclass::text FROM pg_index x WHERE x.indrelid = c.oid AND NOT x.indisprimary ORDER BY 1),
		array(SELECT a.attname::text || ' ' || pg_catalog.format_type(a.atttypid, NULL) FROM pg_attribute a JOIN pg_type ty ON ty.oid = a.atttypid
			WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
			AND (ty.typnamespace <> 'pg_catalog'::pg_catalog.regnamespace OR ty.typtype = 'd') ORDER BY 1),
		` + triggerGrantsSQL + `
	FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = to_regclass($1)`

// Querier runs a query: a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Rows runs a query: a connection or a transaction.
type Rows interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Own checks a table of Tidemark's own, what names it for messages ("the checkpoint table"),
// name its quoted, qualified name: an ordinary table this role owns, carrying nothing Tidemark
// did not create (no trigger, rule, policy, row security, inheritance, index but its primary
// key, column of a type outside pg_catalog, function outside pg_catalog in a constraint or a
// default), on which no other role may add a trigger. A missing table is not an error (the
// caller creates it). Call it before the table is read or written; each transaction that
// writes it then runs Guard first, which holds it as it is until the commit.
func Own(ctx context.Context, q Querier, what, name string) error {
	var oid uint32
	var kind, owner, self string
	var rls, forced bool
	var triggers, rules, policies, parents, children, indexes, columns, grantees []string
	err := q.QueryRow(ctx, ownSQL, name).Scan(&oid, &kind, &owner, &self, &rls, &forced, &triggers, &rules, &policies, &parents, &children, &indexes, &columns, &grantees)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the owner, triggers and rules of %s %s: %w", what, name, err)
	}
	if kind != "r" {
		return refused(what+" "+name, []string{fmt.Sprintf("it is not an ordinary table (relkind %q): someone else created it", kind)},
			[]string{fmt.Sprintf("-- rename or drop %s, after checking what it is", name)}, "")
	}
	var problems, fixes []string
	if owner != self {
		problems = append(problems, fmt.Sprintf("it is owned by role %s, not by this role (%s): its owner could add a trigger that runs with this role's rights", ident(owner), ident(self)))
		fixes = append(fixes, fmt.Sprintf("ALTER TABLE %s OWNER TO %s;", name, ident(self)))
	}
	if len(grantees) > 0 {
		problems = append(problems, fmt.Sprintf("roles other than its owner may add triggers to it (%s)", strings.Join(grantees, ", ")))
		fixes = append(fixes, fmt.Sprintf("REVOKE TRIGGER ON %s FROM %s;", name, strings.Join(grantees, ", ")))
	}
	for _, t := range triggers {
		fixes = append(fixes, fmt.Sprintf("DROP TRIGGER %s ON %s;", ident(t), name))
	}
	if len(triggers) > 0 {
		problems = append(problems, fmt.Sprintf("it has triggers (%s), which would run with this role's rights on every write", strings.Join(triggers, ", ")))
	}
	for _, r := range rules {
		fixes = append(fixes, fmt.Sprintf("DROP RULE %s ON %s;", ident(r), name))
	}
	if len(rules) > 0 {
		problems = append(problems, fmt.Sprintf("it has rules (%s), which would rewrite its reads and writes", strings.Join(rules, ", ")))
	}
	for _, p := range policies {
		fixes = append(fixes, fmt.Sprintf("DROP POLICY %s ON %s;", ident(p), name))
	}
	if len(policies) > 0 {
		problems = append(problems, fmt.Sprintf("it has row security policies (%s), whose expressions would run with this role's rights", strings.Join(policies, ", ")))
	}
	if rls || forced {
		problems = append(problems, "it has row level security enabled")
		fixes = append(fixes, fmt.Sprintf("ALTER TABLE %s NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY;", name))
	}
	for _, p := range parents {
		fixes = append(fixes, fmt.Sprintf("ALTER TABLE %s NO INHERIT %s;", name, p))
	}
	if len(parents) > 0 {
		problems = append(problems, fmt.Sprintf("it inherits from %s", strings.Join(parents, ", ")))
	}
	for _, c := range children {
		fixes = append(fixes, fmt.Sprintf("ALTER TABLE %s NO INHERIT %s;", c, name))
	}
	if len(children) > 0 {
		problems = append(problems, fmt.Sprintf("tables inherit from it (%s), whose rows its reads would include", strings.Join(children, ", ")))
	}
	if len(indexes) > 0 {
		problems = append(problems, fmt.Sprintf("it has indexes Tidemark did not create (%s), whose expressions run on every write", strings.Join(indexes, ", ")))
		for _, i := range indexes {
			fixes = append(fixes, fmt.Sprintf("DROP INDEX %s;", i))
		}
	}
	if len(columns) > 0 {
		problems = append(problems, fmt.Sprintf("it has columns of types Tidemark did not give it (%s), whose input or constraints run on every write", strings.Join(columns, ", ")))
	}
	ds, err := deps(ctx, q, oid)
	if err != nil {
		return fmt.Errorf("read the code of %s %s: %w", what, name, err)
	}
	var fns []string
	for _, d := range ds {
		if !d.catalog {
			fns = append(fns, d.fn+" of "+ident(d.owner))
		}
	}
	if len(fns) > 0 {
		problems = append(problems, fmt.Sprintf("its constraints, defaults or indexes call functions Tidemark did not (%s)", strings.Join(fns, ", ")))
	}
	after := "or drop the table and let Tidemark create it again (it holds only Tidemark's own rows)"
	if len(columns)+len(fns) > 0 {
		after = "drop the table and let Tidemark create it again (it holds only Tidemark's own rows)"
	}
	return refused(what+" "+name, problems, fixes, after)
}

// Guard is a statement that fails, naming what, unless table name (quoted, qualified) is still
// as Own accepted it, for a transaction that writes the table: run it first, after
// LockSQL(name). The lock (ROW EXCLUSIVE, which the writes would take anyway) keeps anyone from
// dropping the table or adding a trigger until the commit; the check catches what changed since
// Own ran (the table dropped and made again by the schema's owner, a trigger added between two
// transactions). It reads only flags and small catalogs. On its failure, Own says what changed.
func Guard(what, name string) string {
	lit := sqlfix.Literal(name)
	return `SELECT (CASE WHEN coalesce((SELECT c.relkind = 'r' AND r.rolname = current_user AND NOT c.relrowsecurity AND NOT c.relforcerowsecurity
			AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal)
			AND NOT EXISTS (SELECT FROM pg_catalog.pg_rewrite w WHERE w.ev_class = c.oid)
			AND NOT EXISTS (SELECT FROM pg_catalog.pg_policy p WHERE p.polrelid = c.oid)
			AND NOT EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.oid OR i.inhparent = c.oid)
			AND NOT EXISTS (SELECT FROM pg_catalog.aclexplode(c.relacl) a WHERE a.privilege_type = 'TRIGGER' AND ` + untrustedGrantee + `)
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_roles r ON r.oid = c.relowner WHERE c.oid = pg_catalog.to_regclass(` + lit + `)), false)
		THEN '0' ELSE ` + sqlfix.Literal(what+" "+name+" changed while Tidemark ran: another role may be trying to run code with its rights") + ` END)::pg_catalog.int4`
}

// GuardTable is Guard for a table of the user's that Table accepted (its OID then oid): a
// statement that fails, naming what, unless name is still that table (not dropped and made again
// by the schema's owner, who may drop any table in it), and it, its partitions and the
// partitioned tables it is a partition of are still owned by this role or a superuser, with no
// TRIGGER granted to anyone else, and it has no inheritance parent or child. Run it first in
// each transaction that writes the table, after LockSQL(name), which holds it so until the
// commit. What a trusted owner adds (a trigger, a rule) is theirs to add.
func GuardTable(what, name string, oid uint32) string {
	return fmt.Sprintf(`SELECT (CASE WHEN coalesce((SELECT t.oid = %d AND NOT EXISTS (
			SELECT FROM (SELECT t.oid AS relid UNION SELECT pt.relid FROM pg_catalog.pg_partition_tree(t.oid) pt
				UNION SELECT pa.relid FROM pg_catalog.pg_partition_ancestors(t.oid) pa) p
			JOIN pg_catalog.pg_class c ON c.oid = p.relid JOIN pg_catalog.pg_roles r ON r.oid = c.relowner
			WHERE NOT (r.rolname = current_user OR r.rolsuper)
				OR (c.relkind = 'r' AND EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhparent = c.oid))
				OR EXISTS (SELECT FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class pc ON pc.oid = i.inhparent WHERE i.inhrelid = c.oid AND pc.relkind = 'r')
				OR EXISTS (SELECT FROM pg_catalog.aclexplode(c.relacl) a WHERE a.privilege_type = 'TRIGGER' AND %s))
		FROM pg_catalog.pg_class t WHERE t.oid = pg_catalog.to_regclass(%s)), false)
		THEN '0' ELSE %s END)::pg_catalog.int4`, oid, untrustedGrantee, sqlfix.Literal(name),
		sqlfix.Literal(what+" "+name+" changed while Tidemark ran (dropped and made again, given to another owner, or TRIGGER granted): another role may be trying to run code with its rights"))
}

// LockSQL locks table name (quoted, qualified) as its writes would, for Guard.
func LockSQL(name string) string { return "LOCK TABLE " + name + " IN ROW EXCLUSIVE MODE" }

// tableSQL reads, for table $1, its partitions and the partitioned tables it is a partition of
// (whose owners can add constraints and defaults that apply to it), each relation's place
// ("table", "partition", "parent"), OID, name, owner and whether the owner is trusted, the roles
// that may add triggers to it, its enabled triggers, rules and policies, its inheritance
// children, and (for the table itself) its inheritance parents.
const tableSQL = `SELECT pt.place, c.oid, c.oid::pg_catalog.regclass::text, r.rolname::text, (r.rolname = current_user OR r.rolsuper), current_user::text,
		` + triggerGrantsSQL + `,
		array(SELECT t.tgname::text FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal AND t.tgenabled <> 'D' ORDER BY 1),
		array(SELECT w.rulename::text FROM pg_rewrite w WHERE w.ev_class = c.oid ORDER BY 1),
		array(SELECT p.polname::text FROM pg_policy p WHERE p.polrelid = c.oid ORDER BY 1),
		array(SELECT i.inhrelid::pg_catalog.regclass::text FROM pg_inherits i WHERE i.inhparent = c.oid AND c.relkind = 'r' ORDER BY 1),
		array(SELECT i.inhparent::pg_catalog.regclass::text FROM pg_inherits i JOIN pg_class pc ON pc.oid = i.inhparent
			WHERE i.inhrelid = c.oid AND pc.relkind = 'r' ORDER BY 1)
	FROM (SELECT 'table' AS place, pg_catalog.to_regclass($1)::oid AS relid, 0 AS level
		UNION SELECT 'partition', t.relid::oid, t.level FROM pg_catalog.pg_partition_tree(pg_catalog.to_regclass($1)) t WHERE t.level > 0
		UNION SELECT 'parent', a.relid::oid, -1 FROM pg_catalog.pg_partition_ancestors(pg_catalog.to_regclass($1)) a
			WHERE a.relid <> pg_catalog.to_regclass($1)) pt
	JOIN pg_class c ON c.oid = pt.relid JOIN pg_roles r ON r.oid = c.relowner
	ORDER BY pt.level = 0 DESC, pt.level, 3`

// Table checks a table of the user's that Tidemark writes (a target table it did not create),
// and each of its partitions. Everything on a table can run code with the writer's rights on
// every write: triggers, rules, policies, CHECK constraints, defaults, generated columns,
// indexes on expressions; and its owner, or a role it granted TRIGGER, can add some at any time.
// So its owner and those roles, and the owners of the functions that code calls (who could
// replace their body), must already have this role's rights: this role itself, or a superuser.
// A table owned by another role is refused, with the fix: give it to this role, or run
// Tidemark as its owner.
func Table(ctx context.Context, q Querier, what, name string) error {
	rows, err := q.Query(ctx, tableSQL, name)
	if err != nil {
		return fmt.Errorf("read the owner and triggers of %s %s: %w", what, name, err)
	}
	type rel struct {
		place                               string
		oid                                 uint32
		name, owner, self                   string
		trusted                             bool
		grantees, triggers, rules, policies []string
		children, parents                   []string
	}
	var rels []rel
	var r rel
	if _, err := pgx.ForEachRow(rows, []any{&r.place, &r.oid, &r.name, &r.owner, &r.trusted, &r.self, &r.grantees, &r.triggers, &r.rules, &r.policies, &r.children, &r.parents}, func() error {
		rels = append(rels, r)
		return nil
	}); err != nil {
		return fmt.Errorf("read the owner and triggers of %s %s: %w", what, name, err)
	}
	var problems, fixes []string
	for _, r := range rels {
		of := ""
		switch r.place {
		case "partition":
			of = " (its partition " + r.name + ")"
		case "parent":
			of = " (the partitioned table " + r.name + " it is a partition of, whose constraints and defaults apply to it)"
		}
		if !r.trusted {
			var code []string
			if len(r.triggers) > 0 {
				code = append(code, "triggers "+strings.Join(r.triggers, ", "))
			}
			if len(r.rules) > 0 {
				code = append(code, "rules "+strings.Join(r.rules, ", "))
			}
			if len(r.policies) > 0 {
				code = append(code, "policies "+strings.Join(r.policies, ", "))
			}
			has := ""
			if len(code) > 0 {
				has = "; it carries " + strings.Join(code, "; ")
			}
			problems = append(problems, fmt.Sprintf("%s is owned by role %s, which is neither this role (%s) nor a superuser: its owner can add code (a trigger, a constraint, a default) that runs with this role's rights on every write%s",
				"it"+of, ident(r.owner), ident(r.self), has))
			fixes = append(fixes, fmt.Sprintf("ALTER TABLE %s OWNER TO %s;  -- or run Tidemark as role %s", r.name, ident(r.self), ident(r.owner)))
		}
		if len(r.children) > 0 {
			problems = append(problems, fmt.Sprintf("tables inherit from %s (%s): the sink's deletes and truncations of it reach them, and run their triggers; Tidemark writes no table with inheritance children", r.name, strings.Join(r.children, ", ")))
			for _, c := range r.children {
				fixes = append(fixes, fmt.Sprintf("ALTER TABLE %s NO INHERIT %s;  -- or write to another table", c, r.name))
			}
		}
		if len(r.parents) > 0 {
			problems = append(problems, fmt.Sprintf("%s inherits from %s: their owners can add constraints and defaults that run on its rows; Tidemark writes no inheritance child", r.name, strings.Join(r.parents, ", ")))
			for _, p := range r.parents {
				fixes = append(fixes, fmt.Sprintf("ALTER TABLE %s NO INHERIT %s;  -- or write to another table", r.name, p))
			}
		}
		if len(r.grantees) > 0 {
			problems = append(problems, fmt.Sprintf("roles other than its owner may add triggers to %s (%s)", r.name, strings.Join(r.grantees, ", ")))
			fixes = append(fixes, fmt.Sprintf("REVOKE TRIGGER ON %s FROM %s;", r.name, strings.Join(r.grantees, ", ")))
		}
		ds, err := deps(ctx, q, r.oid)
		if err != nil {
			return fmt.Errorf("read the code of %s %s: %w", what, r.name, err)
		}
		var fns []string
		for _, d := range ds {
			if !d.trusted {
				fns = append(fns, d.fn+" of "+ident(d.owner))
			}
		}
		if len(fns) > 0 {
			problems = append(problems, fmt.Sprintf("the triggers, constraints, defaults or indexes of %s call functions whose owners are neither this role nor a superuser, and could replace their body (%s)", r.name, strings.Join(fns, ", ")))
			fixes = append(fixes, "ALTER FUNCTION <function> OWNER TO <this role or a superuser>;  -- for each of them, or drop what calls it")
		}
	}
	return refused(what+" "+name, problems, fixes, "")
}

// domainSQL reads, for type $1 and every type under it (a domain's base type, an array's
// element type, a composite's attribute types, a range's subtype, a multirange's range, to any
// depth), each domain, its owner and
// whether the owner is trusted, and the functions its constraints and default call whose
// owners are not trusted.
const domainSQL = `WITH RECURSIVE ty(oid, depth) AS (
		SELECT $1::oid, 0
		UNION
		SELECT x.next, ty.depth + 1 FROM ty CROSS JOIN LATERAL (
			SELECT t.typbasetype FROM pg_type t WHERE t.oid = ty.oid AND t.typtype = 'd'
			UNION ALL SELECT t.typelem FROM pg_type t WHERE t.oid = ty.oid AND t.typcategory = 'A' AND t.typelem <> 0
			UNION ALL SELECT a.atttypid FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid
				WHERE t.oid = ty.oid AND t.typtype = 'c' AND a.attnum > 0 AND NOT a.attisdropped
			UNION ALL SELECT g.rngsubtype FROM pg_range g WHERE g.rngtypid = ty.oid
			UNION ALL SELECT g.rngtypid FROM pg_range g WHERE g.rngmultitypid = ty.oid
		) x(next)
		WHERE ty.depth < 16
	)
	SELECT DISTINCT t.oid::pg_catalog.regtype::text, t.typtype::text, r.rolname::text, (r.rolname = current_user OR r.rolsuper),
		array(SELECT DISTINCT p.oid::pg_catalog.regprocedure::text || ' of ' || pr.rolname::text
			FROM pg_depend dep
			JOIN pg_proc p ON (dep.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND p.oid = dep.refobjid)
				OR (dep.refclassid = 'pg_catalog.pg_operator'::pg_catalog.regclass AND p.oid = (SELECT o.oprcode FROM pg_operator o WHERE o.oid = dep.refobjid))
			JOIN pg_roles pr ON pr.oid = p.proowner
			WHERE ((dep.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass AND dep.objid IN (SELECT k.oid FROM pg_constraint k WHERE k.contypid = t.oid))
				OR (dep.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND dep.objid = t.oid))
			AND NOT (pr.rolname = current_user OR pr.rolsuper))
	FROM ty JOIN pg_type t ON t.oid = ty.oid JOIN pg_roles r ON r.oid = t.typowner
	WHERE t.typtype IN ('d', 'c', 'r')
	ORDER BY 1`

// Domain checks the type of a column Tidemark fills (typeOID), and the types under it (an
// array's elements, a composite's fields): a domain's constraints and default run with this
// role's rights on every value written, and its owner can add constraints at any time, so each
// domain's owner, and the owners of the functions its constraints and default call, must be
// this role or a superuser; so must each composite type's owner, who can add a field of such a
// domain at any time. Other types pass (their input functions are C, which only a superuser can
// create; an enum's owner can add labels, which run nothing).
func Domain(ctx context.Context, q Rows, what string, typeOID uint32) error {
	rows, err := q.Query(ctx, domainSQL, typeOID)
	if err != nil {
		return fmt.Errorf("read the constraints of the type of %s: %w", what, err)
	}
	var problems, fixes []string
	var name, kind, owner string
	var trusted bool
	var fns []string
	if _, err := pgx.ForEachRow(rows, []any{&name, &kind, &owner, &trusted, &fns}, func() error {
		if kind == "r" {
			// A range type's owner cannot change its functions; its subtype_diff (run by GiST
			// index inserts) may be another role's, who can replace the body.
			if len(fns) > 0 {
				problems = append(problems, fmt.Sprintf("its range type %s calls functions (%s) whose owners are neither this role nor a superuser, and could replace their body", name, strings.Join(fns, ", ")))
				fixes = append(fixes, "ALTER FUNCTION <function> OWNER TO <this role or a superuser>;  -- for each of them")
			}
			return nil
		}
		if kind == "c" {
			if !trusted {
				problems = append(problems, fmt.Sprintf("its composite type %s is owned by role %s, which is neither this role nor a superuser: its owner can add a field of a domain at any time, whose constraints would run with this role's rights on every value written", name, ident(owner)))
				fixes = append(fixes, fmt.Sprintf("ALTER TYPE %s OWNER TO CURRENT_USER;  -- run as the role Tidemark uses, or a superuser (ALTER TABLE for a table's row type)", name))
			}
			return nil
		}
		if !trusted {
			problems = append(problems, fmt.Sprintf("its domain %s is owned by role %s, which is neither this role nor a superuser: its constraints run with this role's rights on every value written, and its owner can add some at any time", name, ident(owner)))
			fixes = append(fixes, fmt.Sprintf("ALTER DOMAIN %s OWNER TO CURRENT_USER;  -- run as the role Tidemark uses, or a superuser", name))
		}
		if len(fns) > 0 {
			problems = append(problems, fmt.Sprintf("the constraints or default of its domain %s call functions (%s) whose owners are neither this role nor a superuser, and could replace their body", name, strings.Join(fns, ", ")))
			fixes = append(fixes, "ALTER FUNCTION <function> OWNER TO <this role or a superuser>;  -- for each of them")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("read the constraints of the type of %s: %w", what, err)
	}
	return refused(what, problems, fixes, "")
}

func ident(s string) string { return sqlfix.Ident(s) }

// viewSQL reads, for view $1 and every view it reads from (to any depth), each view's name, its
// owner and whether the owner is trusted, and the functions its query calls (directly, as an
// operator's, a cast's, or an aggregate's) whose owners are not trusted.
const viewSQL = `WITH RECURSIVE v(oid, depth) AS (
		SELECT pg_catalog.to_regclass($1)::pg_catalog.oid, 0
		UNION
		SELECT d.refobjid, v.depth + 1
		FROM v JOIN pg_rewrite w ON w.ev_class = v.oid
		JOIN pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND d.objid = w.oid
			AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.refobjid <> v.oid
		JOIN pg_class c ON c.oid = d.refobjid AND c.relkind = 'v'
		WHERE v.depth < 32
	)
	SELECT c.oid::pg_catalog.regclass::text, r.rolname::text, (r.rolname = current_user OR r.rolsuper),
		array(SELECT DISTINCT p.oid::pg_catalog.regprocedure::text || ' of ' || pr.rolname::text
			FROM pg_rewrite w
			JOIN pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND d.objid = w.oid
			JOIN pg_proc p ON (d.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND (p.oid = d.refobjid
					OR p.oid IN (SELECT x FROM pg_aggregate a, LATERAL (VALUES (a.aggtransfn::pg_catalog.oid), (a.aggfinalfn::pg_catalog.oid),
						(a.aggcombinefn::pg_catalog.oid), (a.aggmtransfn::pg_catalog.oid), (a.aggmfinalfn::pg_catalog.oid)) f(x) WHERE a.aggfnoid = d.refobjid)))
				OR (d.refclassid = 'pg_catalog.pg_operator'::pg_catalog.regclass AND p.oid = (SELECT o.oprcode FROM pg_operator o WHERE o.oid = d.refobjid))
				OR (d.refclassid = 'pg_catalog.pg_cast'::pg_catalog.regclass AND p.oid = (SELECT k.castfunc FROM pg_cast k WHERE k.oid = d.refobjid))
			JOIN pg_roles pr ON pr.oid = p.proowner
			WHERE w.ev_class = c.oid AND NOT (pr.rolname = current_user OR pr.rolsuper))
	FROM v JOIN pg_class c ON c.oid = v.oid JOIN pg_roles r ON r.oid = c.relowner
	WHERE c.relkind = 'v'
	ORDER BY 1`

// View checks a view Tidemark reads (name, quoted and qualified), and every view it reads from:
// the functions a view's query calls run as whoever reads it, not as its owner. So each view's
// owner (who can replace its query at any time) and the owners of the functions the views call
// (who can replace their body) must be this role or a superuser. Tables and materialized views
// need no check: reading them runs no code (row security is pinned off).
func View(ctx context.Context, q Rows, what, name string) error {
	rows, err := q.Query(ctx, viewSQL, name)
	if err != nil {
		return fmt.Errorf("read the definition of %s %s: %w", what, name, err)
	}
	var problems, fixes []string
	var view, owner string
	var trusted bool
	var fns []string
	if _, err := pgx.ForEachRow(rows, []any{&view, &owner, &trusted, &fns}, func() error {
		if !trusted {
			problems = append(problems, fmt.Sprintf("view %s is owned by role %s, which is neither this role nor a superuser: its owner can change its query at any time, and the functions a view calls run with the rights of whoever reads it", view, ident(owner)))
			fixes = append(fixes, fmt.Sprintf("ALTER VIEW %s OWNER TO CURRENT_USER;  -- run as the role Tidemark uses, or a superuser; or read it as role %s", view, ident(owner)))
		}
		if len(fns) > 0 {
			problems = append(problems, fmt.Sprintf("view %s calls functions (%s) whose owners are neither this role nor a superuser, and could replace their body; they would run with this role's rights", view, strings.Join(fns, ", ")))
			fixes = append(fixes, "ALTER FUNCTION <function> OWNER TO <this role or a superuser>;  -- for each of them, or leave the view out of the streams")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("read the definition of %s %s: %w", what, name, err)
	}
	return refused(what+" "+name, problems, fixes, "")
}
