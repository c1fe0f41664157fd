package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// calledNames returns the builtins a statement calls by name, unqualified, which a function or
// operator planted in a schema searched before pg_catalog could take the place of: functions
// ("f name": an identifier before "(", not after "."), operators ("o symbol": the operator
// characters between operands; LIKE and ILIKE are ~~ and ~~*). String literals, quoted
// identifiers and comments are left out first. What it returns that is not a builtin (a table
// name before a column list, a type's modifiers) the caller drops against the catalog.
func calledNames(sql string) map[string]bool {
	out := map[string]bool{}
	clean := stripSQL(sql)
	for _, m := range funcCall.FindAllStringSubmatch(clean, -1) {
		if m[1] == "." || m[1] == "::" {
			continue
		}
		out["f "+strings.ToLower(m[2])] = true
	}
	for _, m := range likeOp.FindAllStringSubmatch(clean, -1) {
		op := "~~"
		if strings.EqualFold(m[2], "ilike") {
			op = "~~*"
		}
		if m[1] != "" {
			op = "!" + op
		}
		out["o "+op] = true
	}
	for _, loc := range opToken.FindAllStringIndex(clean, -1) {
		op := clean[loc[0]:loc[1]]
		before := strings.TrimRight(clean[:loc[0]], " \t\n")
		if op == "*" {
			// SELECT *, count(*), t.*, (*): not multiplication.
			if before == "" || strings.HasSuffix(before, "(") || strings.HasSuffix(before, ",") || strings.HasSuffix(before, ".") ||
				strings.HasSuffix(strings.ToUpper(before), "SELECT") || strings.HasSuffix(strings.ToUpper(before), "RETURNING") {
				continue
			}
		}
		if op == "=>" {
			continue // named argument
		}
		out["o "+op] = true
	}
	return out
}

var (
	funcCall = regexp.MustCompile(`(\.|::|^|[^\w$.])([A-Za-z_][A-Za-z0-9_$]*)\s*\(`)
	likeOp   = regexp.MustCompile(`(?i)\b(NOT\s+)?(I?LIKE)\b`)
	opToken  = regexp.MustCompile("[+\\-*/<>=~!@#%^&|`?]+")
)

// stripSQL replaces string literals (standard, E”, dollar-quoted), quoted identifiers and
// comments with a space or a placeholder identifier.
func stripSQL(sql string) string {
	var b strings.Builder
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				return b.String()
			}
			i += j
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			j := strings.Index(sql[i+2:], "*/")
			if j < 0 {
				return b.String()
			}
			i += j + 4
			b.WriteByte(' ')
		case c == '\'':
			escapes := i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e')
			j := i + 1
			for j < len(sql) {
				if escapes && sql[j] == '\\' {
					j += 2
					continue
				}
				if sql[j] == '\'' {
					if j+1 < len(sql) && sql[j+1] == '\'' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			b.WriteString(" '' ")
			i = j + 1
		case c == '"':
			j := i + 1
			for j < len(sql) {
				if sql[j] == '"' {
					if j+1 < len(sql) && sql[j+1] == '"' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			b.WriteString("_q_")
			i = j + 1
		case c == '$' && (i == 0 || !isIdent(sql[i-1])):
			if m := dollarTag.FindString(sql[i:]); m != "" {
				end := strings.Index(sql[i+len(m):], m)
				if end < 0 {
					return b.String()
				}
				b.WriteString(" '' ")
				i += len(m) + end + len(m)
				continue
			}
			b.WriteByte(c)
			i++
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

var dollarTag = regexp.MustCompile(`^\$[A-Za-z_]*\$`)

func isIdent(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func TestCalledNames(t *testing.T) {
	got := calledNames(`SELECT count(*), t.*, pg_catalog.unnest(x), "weird("(1), a || b, 'lit(' || c, x::numeric(12,2), hashtextextended('tidemark ' || $1, 0)
		FROM t WHERE k > $1 AND v LIKE 'a%' AND w NOT ILIKE $2 AND n * 2 >= 1 -- f(1)
		AND $tag$ g(1) $tag$ <> E'\'h(' /* i(1) */`)
	want := []string{"f count", "f hashtextextended", "o ||", "o >", "o ~~", "o !~~*", "o *", "o >=", "o <>"}
	for _, w := range want {
		require.True(t, got[w], "%s in %v", w, got)
	}
	for _, no := range []string{"f unnest", "f weird", "f lit", "f numeric", "f f", "f g", "f h", "f i"} {
		require.False(t, got[no], "%s in %v", no, got)
	}
}
