package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

// helpRequest is -h (or --help) given to a command: its whole usage is printed, exit 0.
type helpRequest struct{ fs *flag.FlagSet }

func (h helpRequest) Error() string { return "help requested" }

// usageHint is what follows a usage error: the command's synopsis and where the rest is.
func usageHint(w io.Writer, name string) {
	if syn, ok := synopses.Load(name); ok {
		fmt.Fprintf(w, "Usage: tidemark %s\n", syn)
	}
	fmt.Fprintf(w, "Run `tidemark %s -h` for every flag; docs/cli.md for more.\n", name)
}

// flagError rewrites the flag package's error in the project's words, with the flag meant when
// a name was mistyped.
func flagError(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		name = strings.TrimLeft(name, "-")
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if m := closest(name, names); m != "" {
			return fmt.Sprintf("unknown flag --%s; did you mean --%s?", name, m)
		}
		return fmt.Sprintf("unknown flag --%s", name)
	}
	if rest, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		return "flag " + strings.TrimLeft(rest, "-") + " needs a value"
	}
	return msg
}

// closest is the candidate nearest to s (at most two edits away, or s's prefix), or "".
func closest(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		d := editDistance(s, c)
		if strings.HasPrefix(c, s) && len(s) >= 3 {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// version is this build's version: the module's, or the commit it was built from.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := info.Main.Version
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+modified"
			}
		}
	}
	if (v == "" || v == "(devel)") && rev != "" {
		v = "commit " + rev[:min(12, len(rev))] + modified
	}
	if v == "" {
		v = "(devel)"
	}
	return v + ", " + info.GoVersion
}

// isHelp reports whether err is a command's -h.
func isHelp(err error) (helpRequest, bool) {
	var h helpRequest
	return h, errors.As(err, &h)
}
