package pgjson

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestArrayNestingBounded: PostgreSQL prints no array of more than 6 dimensions; text nested
// deeper (a hostile server's) is refused, not recursed into without bound: a million opening
// braces would otherwise exhaust the stack and crash the process.
func TestArrayNestingBounded(t *testing.T) {
	_, _, err := parseArray([]byte("{{{{{{1}}}}}}"), ',')
	require.NoError(t, err, "six dimensions, as PostgreSQL allows")
	_, _, err = parseArray([]byte("{{{{{{{1}}}}}}}"), ',')
	require.ErrorIs(t, err, errSyntax)
	_, _, err = parseArray([]byte(strings.Repeat("{", 1_000_000)), ',')
	require.ErrorIs(t, err, errSyntax)
}

// FuzzParsersAnyInput: the text parsers return an error, never panic, whatever they are given.
func FuzzParsersAnyInput(f *testing.F) {
	for _, s := range []string{"{a,b}", "[1:2]={1,2}", "{{1},{2}}", `{"a\"b",NULL}`, `("a,b",,c)`, `"k"=>"v", "n"=>NULL`, "{", "(", `"`, "[1={"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _, _ = parseArray(data, ',')
		_, _, _ = parseArray(data, ';')
		_, _ = parseComposite(data)
		_, _, _ = parseHstore(data)
	})
}
