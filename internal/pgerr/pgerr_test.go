package pgerr

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestClassification(t *testing.T) {
	wrap := func(code string) error { return fmt.Errorf("context: %w", &pgconn.PgError{Code: code}) }
	for _, tc := range []struct {
		code             string
		mustAct, transit bool
	}{
		{"28P01", true, false}, {"28000", true, false}, {"42501", true, false}, {"3D000", true, false},
		{"42P01", true, false}, {"42704", true, false},
		{"08006", false, true}, {"57P01", false, true}, {"53300", false, true}, {"40001", false, true},
		{"40P01", false, true}, {"55P03", false, true},
		{"XX000", false, false}, {"23505", false, false},
	} {
		err := wrap(tc.code)
		if UserMustAct(err) != tc.mustAct || Transient(err) != tc.transit {
			t.Errorf("%s: UserMustAct %v, Transient %v; want %v, %v", tc.code, UserMustAct(err), Transient(err), tc.mustAct, tc.transit)
		}
	}
	plain := errors.New("not from the server")
	if Code(plain) != "" || Transient(plain) || UserMustAct(plain) || AlreadyExists(plain) {
		t.Error("an error without SQLSTATE is classified")
	}
	for _, c := range []string{"42P07", "42710", "23505"} {
		if !AlreadyExists(wrap(c)) {
			t.Errorf("%s: not AlreadyExists", c)
		}
	}
	if !Canceled(wrap("57014")) || !Privilege(wrap("42501")) || !UndefinedTable(wrap("42P01")) || !UniqueViolation(wrap("23505")) {
		t.Error("a named predicate misses its code")
	}
}
