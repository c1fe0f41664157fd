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

// Querier runs a query: a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ownSQL reads what Own checks of table $1 (a quoted, qualified name).
const ownSQL = `SELECT c.relkind::text, r.rolname::text, current_user::text, c.relrowsecurity, c.relforcerowsecurity,
		array(SELECT t.tgname::text FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal ORDER BY 1),
		array(SELECT w.rulename::text FROM pg_rewrite w WHERE w.ev_class = c.oid ORDER BY 1),
		array(SELECT p.polname::text FROM pg_policy p WHERE p.polrelid = c.oid ORDER BY 1),
		array(SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = c.oid ORDER BY 1),
		array(SELECT i.inhrelid::regclass::text FROM pg_inherits i WHERE i.inhparent = c.oid ORDER BY 1)
	FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = to_regclass($1)`

// Own checks a table of Tidemark's own, what names it for messages ("the checkpoint table"),
// name its quoted, qualified name: an ordinary table this role owns, carrying nothing Tidemark
// did not create. A missing table is not an error (the caller creates it). Call it before the
// table is read or written.
func Own(ctx context.Context, q Querier, what, name string) error {
	var kind, owner, self string
	var rls, forced bool
	var triggers, rules, policies, parents, children []string
	err := q.QueryRow(ctx, ownSQL, name).Scan(&kind, &owner, &self, &rls, &forced, &triggers, &rules, &policies, &parents, &children)
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
	return refused(what+" "+name, problems, fixes, "or drop the table and let Tidemark create it again (it holds only Tidemark's own rows)")
}

// tableCodeSQL reads, for table $1, its owner and whether it is trusted (this role or a
// superuser), its triggers with the owners of their functions and whether each is trusted, its
// rules and its policies.
const tableCodeSQL = `SELECT r.rolname::text, (r.rolname = current_user OR r.rolsuper), current_user::text,
		array(SELECT t.tgname::text || ' (function ' || t.tgfoid::regprocedure::text || ' of ' || fr.rolname::text || ')'
			FROM pg_trigger t JOIN pg_proc f ON f.oid = t.tgfoid JOIN pg_roles fr ON fr.oid = f.proowner
			WHERE t.tgrelid = c.oid AND NOT t.tgisinternal AND t.tgenabled <> 'D' ORDER BY 1),
		array(SELECT t.tgname::text FROM pg_trigger t JOIN pg_proc f ON f.oid = t.tgfoid JOIN pg_roles fr ON fr.oid = f.proowner
			WHERE t.tgrelid = c.oid AND NOT t.tgisinternal AND t.tgenabled <> 'D' AND NOT (fr.rolname = current_user OR fr.rolsuper) ORDER BY 1),
		array(SELECT w.rulename::text FROM pg_rewrite w WHERE w.ev_class = c.oid ORDER BY 1),
		array(SELECT p.polname::text FROM pg_policy p WHERE p.polrelid = c.oid ORDER BY 1)
	FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = to_regclass($1)`

// Table checks a table of the user's that Tidemark writes (a target table it did not create):
// its triggers, rules and policies run with this role's rights, so their authors must already
// have them: the table's owner, and each trigger function's owner (who could replace its body),
// must be this role or a superuser. A table without any is accepted whoever owns it.
func Table(ctx context.Context, q Querier, what, name string) error {
	var owner, self string
	var trusted bool
	var triggers, untrustedFns, rules, policies []string
	err := q.QueryRow(ctx, tableCodeSQL, name).Scan(&owner, &trusted, &self, &triggers, &untrustedFns, &rules, &policies)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the triggers and rules of %s %s: %w", what, name, err)
	}
	code := len(triggers)+len(rules)+len(policies) > 0
	var problems, fixes []string
	if code && !trusted {
		var which []string
		if len(triggers) > 0 {
			which = append(which, "triggers "+strings.Join(triggers, ", "))
		}
		if len(rules) > 0 {
			which = append(which, "rules "+strings.Join(rules, ", "))
		}
		if len(policies) > 0 {
			which = append(which, "policies "+strings.Join(policies, ", "))
		}
		problems = append(problems, fmt.Sprintf("it is owned by role %s, which is neither this role (%s) nor a superuser, and carries code that would run with this role's rights on every write (%s)",
			ident(owner), ident(self), strings.Join(which, "; ")))
		fixes = append(fixes, fmt.Sprintf("ALTER TABLE %s OWNER TO %s;  -- or drop that code, or run Tidemark as role %s", name, ident(self), ident(owner)))
	}
	if len(untrustedFns) > 0 {
		problems = append(problems, fmt.Sprintf("its triggers %s call functions owned by a role that is neither this role nor a superuser, who could replace their body", strings.Join(untrustedFns, ", ")))
		for _, t := range untrustedFns {
			fixes = append(fixes, fmt.Sprintf("ALTER TABLE %s DISABLE TRIGGER %s;  -- or give its function to this role or a superuser (ALTER FUNCTION ... OWNER TO ...)", name, ident(t)))
		}
	}
	return refused(what+" "+name, problems, fixes, "")
}

// domainSQL reads, for type $1 and the domains under it (a domain over a domain), each domain
// with CHECK constraints whose owner, or the owner of a function a constraint calls, is neither
// this role nor a superuser.
const domainSQL = `WITH RECURSIVE d(oid, depth) AS (
		SELECT $1::oid, 0
		UNION ALL
		SELECT t.typbasetype, d.depth + 1 FROM pg_type t JOIN d ON t.oid = d.oid WHERE t.typtype = 'd' AND d.depth < 32
	)
	SELECT t.oid::regtype::text, r.rolname::text,
		(r.rolname = current_user OR r.rolsuper),
		array(SELECT DISTINCT p.oid::regprocedure::text || ' of ' || pr.rolname::text
			FROM pg_constraint k JOIN pg_depend dep ON dep.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass AND dep.objid = k.oid
				AND dep.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass
			JOIN pg_proc p ON p.oid = dep.refobjid JOIN pg_roles pr ON pr.oid = p.proowner
			WHERE k.contypid = t.oid AND NOT (pr.rolname = current_user OR pr.rolsuper))
	FROM d JOIN pg_type t ON t.oid = d.oid JOIN pg_roles r ON r.oid = t.typowner
	WHERE t.typtype = 'd' AND EXISTS (SELECT 1 FROM pg_constraint k WHERE k.contypid = t.oid AND k.contype = 'c')
	ORDER BY d.depth`

// Rows runs a query: a connection or a transaction.
type Rows interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Domain checks the type of a column Tidemark fills (typeOID): a domain's CHECK constraints run
// with this role's rights on every value written, so the domain's owner, and the owners of the
// functions they call, must be this role or a superuser. Other types pass (their input
// functions are C, which only a superuser can create).
func Domain(ctx context.Context, q Rows, what string, typeOID uint32) error {
	rows, err := q.Query(ctx, domainSQL, typeOID)
	if err != nil {
		return fmt.Errorf("read the constraints of the type of %s: %w", what, err)
	}
	var problems, fixes []string
	var name, owner string
	var trusted bool
	var fns []string
	if _, err := pgx.ForEachRow(rows, []any{&name, &owner, &trusted, &fns}, func() error {
		if !trusted {
			problems = append(problems, fmt.Sprintf("its domain %s, with CHECK constraints that run with this role's rights on every value written, is owned by role %s, which is neither this role nor a superuser", name, ident(owner)))
			fixes = append(fixes, fmt.Sprintf("ALTER DOMAIN %s OWNER TO CURRENT_USER;  -- run as the role Tidemark uses, or a superuser", name))
		}
		if len(fns) > 0 {
			problems = append(problems, fmt.Sprintf("the CHECK constraints of its domain %s call functions (%s) whose owners are neither this role nor a superuser, and could replace their body", name, strings.Join(fns, ", ")))
			fixes = append(fixes, "ALTER FUNCTION <function> OWNER TO <this role or a superuser>;  -- for each of them")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("read the constraints of the type of %s: %w", what, err)
	}
	return refused(what, problems, fixes, "")
}

func ident(s string) string { return sqlfix.Ident(s) }
