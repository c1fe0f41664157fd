package e2e

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSourceFor: the Debian mirror for debootstrap is found in both forms of apt sources, for the
// machine's suite and component main only.
func TestSourceFor(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name, text, want string
	}{
		{"a.list", "# comment\ndeb-src http://src.example/debian bookworm main\ndeb [arch=amd64 signed-by=/k.gpg] http://other.example/apt nodistro main\ndeb [ arch=amd64 ] http://mirror.example/debian bookworm contrib main\n", "http://mirror.example/debian"},
		{"b.list", "deb http://mirror.example/debian bookworm-security main\ndeb http://mirror.example/debian bookworm contrib\n", ""},
		{"c.sources", "Types: deb\nURIs: https://deb.nodesource.example/node_20.x\nSuites: nodistro\nComponents: main\n\nTypes: deb deb-src\n# a comment inside\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/k.gpg\n", "http://deb.example/debian"},
		{"d.sources", "Types: deb-src\nURIs: http://deb.example/debian\nSuites: bookworm\nComponents: main\n", ""},
	}
	for _, c := range cases {
		if got := sourceFor(write(c.name, c.text), "bookworm"); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}
