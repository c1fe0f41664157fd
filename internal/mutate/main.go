// Command mutate measures how many plausible bugs the package tests catch. It plants, one at a
// time, each mutant of its catalog (catalog.go: an exact snippet of a file, its replacement, and
// the bug that makes) in a copy of the repository, runs the tests of the mutant's package there,
// and reports whether they failed (killed), passed (survived), or did not build (invalid, not
// counted). A mutant whose snippet no longer occurs exactly once in its file is stale: refused,
// not guessed at, so the catalog says when the code moved under it.
//
// Run it from anywhere in the module:
//
//	go run ./internal/mutate -list                 # the catalog, and whether each snippet still applies
//	go run ./internal/mutate                       # every mutant (about ten minutes on two cores)
//	go run ./internal/mutate -only '^merge/truncate' -out /tmp/mutants.md
//
// Flags: -only REGEX selects mutants by ID; -list prints the catalog and checks its snippets
// without running anything; -compile only builds each mutant's package (go build: a cheap check
// that no mutant is invalid, run after editing the catalog); -out FILE also writes the report as Markdown; -rev REV measures a
// commit (git archive) instead of the working tree; -tags passes build tags to go test (CI's run
// uses tidemark_faults); -logs DIR keeps each go test output; -keep keeps the copy; -nobaseline
// skips the unmutated run of each package first.
//
// The working tree is never written: it is copied once per run (without .git) into a temporary
// directory, where each mutant is applied, tested with go test -count=1 -timeout 5m -v ./PKG/ and
// restored before the next. CI is unset for the tests, so those that need PostgreSQL start their
// own server as they do on a developer's machine (e2e.Main); if none can be had they skip, which
// the tool reports as no-server rather than as a survivor. Before a package's first mutant its
// tests run unmutated (the baseline): a package whose baseline fails has its mutants reported as
// baseline-failed, since a failure would not be the mutant's doing.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

// Results of a mutant. Only killed and survived are valid: they make the score.
const (
	killed         = "killed"
	survived       = "survived"
	invalid        = "invalid"         // the mutant does not build
	stale          = "stale"           // its snippet does not occur exactly once
	builds         = "builds"          // -compile: the mutant builds (no test was run)
	noServer       = "no-server"       // the tests skipped for want of PostgreSQL
	baselineFailed = "baseline-failed" // the package's tests fail without the mutant
)

const (
	testTimeout = "5m"             // go test -timeout
	hardTimeout = 7 * time.Minute  // then the whole go test process group is killed
	waitDelay   = 10 * time.Second // for go test's pipes after it is killed
)

// noServerNote is what e2e.Main prints when it finds no PostgreSQL outside CI.
const noServerNote = "e2e: skipping the tests that need PostgreSQL"

type options struct {
	only       *regexp.Regexp
	list       bool
	out        string
	rev        string
	tags       string
	logs       string
	keep       bool
	noBaseline bool
	compile    bool
}

type result struct {
	m       Mutant
	status  string
	seconds float64
	detail  string
}

func main() {
	var o options
	only := flag.String("only", "", "run only the mutants whose ID matches this regular expression")
	flag.BoolVar(&o.list, "list", false, "list the catalog and check each snippet; run nothing")
	flag.StringVar(&o.out, "out", "", "also write the report as Markdown to this file")
	flag.StringVar(&o.rev, "rev", "", "measure this commit (git archive) instead of the working tree")
	flag.StringVar(&o.tags, "tags", "", "build tags for go test (e.g. tidemark_faults)")
	flag.StringVar(&o.logs, "logs", "", "write each go test output to this directory")
	flag.BoolVar(&o.keep, "keep", false, "keep the repository copy (its path is printed)")
	flag.BoolVar(&o.noBaseline, "nobaseline", false, "skip the unmutated run of each package")
	flag.BoolVar(&o.compile, "compile", false, "only build each mutant's package (go build); run no test")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mutate: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			fmt.Fprintf(os.Stderr, "mutate: -only: %v\n", err)
			os.Exit(2)
		}
		o.only = re
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "mutate: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	if err := checkCatalog(catalog); err != nil {
		return fmt.Errorf("catalog: %w", err)
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	var selected []Mutant
	for _, m := range catalog {
		if o.only == nil || o.only.MatchString(m.ID) {
			selected = append(selected, m)
		}
	}
	if len(selected) == 0 {
		return errors.New("no mutant matches -only")
	}
	if o.list {
		return list(root, o.rev, selected)
	}
	source := describeSource(root, o.rev)

	tmp, err := os.MkdirTemp("", "tidemark-mutate-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintf(os.Stderr, "mutate: the copy is kept in %s\n", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	start := time.Now()
	if o.rev != "" {
		err = exportRev(ctx, root, o.rev, tmp)
	} else {
		err = copyTree(root, tmp)
	}
	if err != nil {
		return fmt.Errorf("copy the repository: %w", err)
	}
	fmt.Fprintf(os.Stderr, "mutate: %s copied to %s in %.1fs; %d mutant(s)\n", source, tmp, time.Since(start).Seconds(), len(selected))
	if o.logs != "" {
		if err := os.MkdirAll(o.logs, 0o755); err != nil {
			return err
		}
	}

	baseline := map[string]string{} // package: "" when it passed, else the result to give its mutants
	var results []result
	for i, m := range selected {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if _, done := baseline[m.Pkg]; !done && !o.noBaseline && !o.compile {
			fmt.Fprintf(os.Stderr, "mutate: baseline of ./%s/ ... ", m.Pkg)
			status, secs, detail, err := testPackage(ctx, tmp, m.Pkg, o, "baseline_"+m.Pkg)
			if err != nil {
				return err
			}
			shown := status
			if status == survived {
				shown = "passed"
			}
			fmt.Fprintf(os.Stderr, "%s (%.1fs) %s\n", shown, secs, detail)
			switch status {
			case survived: // passed
				baseline[m.Pkg] = ""
			case noServer:
				baseline[m.Pkg] = noServer
			default:
				baseline[m.Pkg] = baselineFailed
			}
		}
		r := result{m: m}
		if b := baseline[m.Pkg]; b != "" {
			r.status, r.detail = b, "the unmutated tests did not pass"
		} else {
			r, err = runMutant(ctx, tmp, m, o)
			if err != nil {
				return err
			}
		}
		fmt.Fprintf(os.Stderr, "mutate: [%d/%d] %s: %s (%.1fs) %s\n", i+1, len(selected), m.ID, r.status, r.seconds, r.detail)
		results = append(results, r)
	}

	text := report(results, source, false)
	fmt.Print(text)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(report(results, source, true)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// checkCatalog checks that every mutant is well formed and has an ID of its own.
func checkCatalog(c []Mutant) error {
	seen := map[string]bool{}
	var errs []error
	for _, m := range c {
		switch {
		case seen[m.ID]:
			errs = append(errs, fmt.Errorf("%s: ID given twice", m.ID))
		case m.ID == "" || m.Pkg == "" || m.File == "" || m.From == "" || m.Desc == "":
			errs = append(errs, fmt.Errorf("%q: empty ID, Pkg, File, From or Desc", m.ID))
		case !strings.HasPrefix(m.ID, m.Pkg+"/"):
			errs = append(errs, fmt.Errorf("%s: the ID does not start with its package %s/", m.ID, m.Pkg))
		case m.From == m.To:
			errs = append(errs, fmt.Errorf("%s: the replacement is the original", m.ID))
		case filepath.IsAbs(m.File) || filepath.Clean(m.File) != m.File || strings.HasPrefix(m.File, ".."):
			errs = append(errs, fmt.Errorf("%s: file %q is not a clean path inside the module", m.ID, m.File))
		case filepath.IsAbs(m.Pkg) || filepath.Clean(m.Pkg) != m.Pkg || strings.HasPrefix(m.Pkg, ".."):
			errs = append(errs, fmt.Errorf("%s: package %q is not a clean path inside the module", m.ID, m.Pkg))
		}
		seen[m.ID] = true
	}
	return errors.Join(errs...)
}

// moduleRoot finds the directory of the go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			if !bytes.Contains(b, []byte("module github.com/tidemark/tidemark\n")) {
				return "", fmt.Errorf("%s/go.mod is not the tidemark module's", dir)
			}
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: run it inside the repository")
		}
		dir = parent
	}
}

// describeSource says what is measured: a commit, or the working tree at HEAD with its changes.
// It only reads the repository (no index refresh).
func describeSource(root, rev string) string {
	git := func(args ...string) string {
		out, err := exec.Command("git", append([]string{"--no-optional-locks", "-C", root}, args...)...).Output()
		if err != nil {
			return ""
		}
		return strings.TrimRight(string(out), "\n") // porcelain lines start with a space
	}
	if rev != "" {
		return fmt.Sprintf("commit %s (%s)", rev, git("rev-parse", "--short", rev+"^{commit}"))
	}
	head := git("rev-parse", "--short", "HEAD")
	var changed []string
	untracked := 0
	for line := range strings.SplitSeq(git("status", "--porcelain"), "\n") {
		switch {
		case strings.HasPrefix(line, "??"):
			untracked++
		case len(line) > 3:
			changed = append(changed, line[3:])
		}
	}
	s := "working tree at " + head
	if len(changed) > 0 {
		s += " with uncommitted changes to " + strings.Join(changed, ", ")
	}
	if untracked > 0 {
		s += fmt.Sprintf(" (and %d untracked path(s))", untracked)
	}
	return s
}

// readSource reads a file of the source being measured, for -list.
func readSource(root, rev, file string) ([]byte, error) {
	if rev == "" {
		return os.ReadFile(filepath.Join(root, file))
	}
	return exec.Command("git", "--no-optional-locks", "-C", root, "show", rev+":"+file).Output()
}

// list prints the selected mutants and whether each snippet occurs exactly once.
func list(root, rev string, ms []Mutant) error {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPACKAGE\tFILE\tSNIPPET\tBUG")
	counts := map[string]int{}
	staleN := 0
	for _, m := range ms {
		state := "ok"
		b, err := readSource(root, rev, m.File)
		switch n := bytes.Count(b, []byte(m.From)); {
		case err != nil:
			state, staleN = "stale: unreadable", staleN+1
		case n != 1:
			state, staleN = fmt.Sprintf("stale: %d found", n), staleN+1
		}
		counts[m.Pkg]++
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.ID, m.Pkg, m.File, state, m.Desc)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Printf("\n%d mutant(s), %d stale:", len(ms), staleN)
	for _, p := range sortedKeys(counts) {
		fmt.Printf(" %s %d;", p, counts[p])
	}
	fmt.Println()
	return nil
}

func sortedKeys(m map[string]int) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// copyTree copies the working tree at src into dst, without .git: directories, regular files
// (with their modes) and symbolic links. A file that disappears while it is copied is skipped.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if rel == ".git" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil // a worktree's .git file
		}
		target := filepath.Join(dst, rel)
		switch t := d.Type(); {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case t&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case t.IsRegular():
			err := copyFile(p, target)
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		return nil // sockets, pipes, devices
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// exportRev extracts commit rev of the repository at root into dst (git archive: it reads the
// object store only).
func exportRev(ctx context.Context, root, rev, dst string) error {
	cmd := exec.CommandContext(ctx, "git", "--no-optional-locks", "-C", root, "archive", "--format=tar", rev)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	terr := untar(pipe, dst)
	_, _ = io.Copy(io.Discard, pipe)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w: %s", rev, err, strings.TrimSpace(stderr.String()))
	}
	return terr
}

func untar(r io.Reader, dst string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("archive entry %q outside the tree", h.Name)
		}
		target := filepath.Join(dst, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fs.FileMode(h.Mode).Perm())
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		}
	}
}

// runMutant applies m in the copy at dir, runs its package's tests, and restores the file.
func runMutant(ctx context.Context, dir string, m Mutant, o options) (result, error) {
	r := result{m: m}
	path := filepath.Join(dir, m.File)
	orig, err := os.ReadFile(path)
	if err != nil {
		r.status, r.detail = stale, fmt.Sprintf("cannot read %s", m.File)
		return r, nil
	}
	if n := bytes.Count(orig, []byte(m.From)); n != 1 {
		r.status, r.detail = stale, fmt.Sprintf("snippet found %d times in %s", n, m.File)
		return r, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return r, err
	}
	mutated := bytes.Replace(orig, []byte(m.From), []byte(m.To), 1)
	if err := os.WriteFile(path, mutated, fi.Mode().Perm()); err != nil {
		return r, err
	}
	test := testPackage
	if o.compile {
		test = buildPackage
	}
	status, secs, detail, terr := test(ctx, dir, m.Pkg, o, m.ID)
	// Restore before anything else, and make sure it took.
	if err := os.WriteFile(path, orig, fi.Mode().Perm()); err != nil {
		return r, fmt.Errorf("restore %s: %w", m.File, err)
	}
	if back, err := os.ReadFile(path); err != nil || !bytes.Equal(back, orig) {
		return r, fmt.Errorf("restore %s: the file is not as it was", m.File)
	}
	if terr != nil {
		return r, terr
	}
	r.status, r.seconds, r.detail = status, secs, detail
	return r, nil
}

var (
	failRE    = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)
	compileRE = regexp.MustCompile(`(?m)^\S+\.go:\d+(:\d+)?: .*$`)
	skipRE    = regexp.MustCompile(`(?m)^\s*--- SKIP: `)
)

// buildPackage builds ./pkg/ in dir: builds, or invalid when it does not compile.
func buildPackage(ctx context.Context, dir, pkg string, o options, _ string) (status string, secs float64, detail string, err error) {
	args := []string{"build"}
	if o.tags != "" {
		args = append(args, "-tags", o.tags)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./"+pkg+"/")...)
	cmd.Dir, cmd.Env = dir, testEnv()
	start := time.Now()
	out, runErr := cmd.CombinedOutput()
	secs = time.Since(start).Seconds()
	var exitErr *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return "", secs, "", fmt.Errorf("interrupted: %w", context.Cause(ctx))
	case runErr == nil:
		return builds, secs, "", nil
	case !errors.As(runErr, &exitErr):
		return "", secs, "", fmt.Errorf("go build ./%s/: %w", pkg, runErr)
	}
	detail = "does not build"
	if m := compileRE.Find(out); m != nil {
		detail = shorten(string(m), 100)
	}
	return invalid, secs, detail, nil
}

// testPackage runs go test on ./pkg/ in dir and classifies the outcome: survived when the tests
// pass, killed when they fail, invalid when the package or its tests do not build, no-server
// when they passed only by skipping for want of PostgreSQL. An error is the tool's own (the run
// was interrupted, go could not be started).
func testPackage(ctx context.Context, dir, pkg string, o options, logName string) (status string, secs float64, detail string, err error) {
	tctx, cancel := context.WithTimeout(ctx, hardTimeout)
	defer cancel()
	args := []string{"test", "-count=1", "-timeout", testTimeout, "-v"}
	if o.tags != "" {
		args = append(args, "-tags", o.tags)
	}
	args = append(args, "./"+pkg+"/")
	cmd := exec.CommandContext(tctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = testEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = waitDelay
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	runErr := cmd.Run()
	secs = time.Since(start).Seconds()
	if ctx.Err() != nil {
		return "", secs, "", fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	if o.logs != "" {
		name := strings.ReplaceAll(logName, "/", "_") + ".log"
		if err := os.WriteFile(filepath.Join(o.logs, name), out.Bytes(), 0o644); err != nil {
			return "", secs, "", err
		}
	}
	text := out.String()
	var exitErr *exec.ExitError
	switch {
	case runErr != nil && !errors.As(runErr, &exitErr) && tctx.Err() == nil:
		return "", secs, "", fmt.Errorf("go test ./%s/: %w", pkg, runErr)
	case runErr == nil && strings.Contains(text, noServerNote):
		return noServer, secs, "the tests skipped: no PostgreSQL", nil
	case runErr == nil:
		if n := len(skipRE.FindAllString(text, -1)); n > 0 {
			return survived, secs, fmt.Sprintf("%d test(s) skipped", n), nil
		}
		return survived, secs, "", nil
	case strings.Contains(text, "[build failed]") || strings.Contains(text, "[setup failed]"):
		detail = "does not build"
		if m := compileRE.FindString(text); m != "" {
			detail = shorten(m, 100)
		}
		return invalid, secs, detail, nil
	}
	return killed, secs, killedBy(text, tctx.Err() != nil), nil
}

// testEnv is the environment without CI (so that tests needing PostgreSQL start their own, as
// outside CI) and without a go.work above the copy.
func testEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k == "CI" || k == "GOWORK" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GOWORK=off")
}

// killedBy names what failed: the top-level tests, a timeout or a panic.
func killedBy(text string, hardTimedOut bool) string {
	var names []string
	for _, m := range failRE.FindAllStringSubmatch(text, -1) {
		name, _, _ := strings.Cut(m[1], "/")
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	switch {
	case hardTimedOut:
		return "killed after " + hardTimeout.String()
	case strings.Contains(text, "panic: test timed out"):
		return "timeout"
	case len(names) > 3:
		return strings.Join(names[:3], ", ") + fmt.Sprintf(" and %d more", len(names)-3)
	case len(names) > 0:
		return strings.Join(names, ", ")
	case strings.Contains(text, "panic:"):
		return "panic"
	}
	return "the test binary failed"
}

func shorten(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n-3] + "..."
	}
	return s
}

// tally is one package's (or the whole run's) counts.
type tally struct{ killed, survived, other int }

func (t tally) valid() int { return t.killed + t.survived }

func (t tally) score() string {
	if t.valid() == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d (%.0f%%)", t.killed, t.valid(), 100*float64(t.killed)/float64(t.valid()))
}

// report renders the results as aligned text or as Markdown.
func report(rs []result, source string, markdown bool) string {
	var b strings.Builder
	byPkg := map[string]*tally{}
	var pkgs []string
	var total tally
	for _, r := range rs {
		t := byPkg[r.m.Pkg]
		if t == nil {
			t = &tally{}
			byPkg[r.m.Pkg] = t
			pkgs = append(pkgs, r.m.Pkg)
		}
		for _, x := range []*tally{t, &total} {
			switch r.status {
			case killed:
				x.killed++
			case survived:
				x.survived++
			default:
				x.other++
			}
		}
	}
	esc := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	if markdown {
		fmt.Fprintf(&b, "# Mutation testing\n\n%s, %s. Produced by `go run ./internal/mutate` (internal/mutate/catalog.go holds the mutants).\n\n",
			source, time.Now().UTC().Format("2006-01-02 15:04 MST"))
		b.WriteString("| mutant | package | result | seconds | detail |\n| --- | --- | --- | ---: | --- |\n")
		for _, r := range rs {
			fmt.Fprintf(&b, "| `%s` | %s | %s | %.1f | %s |\n", r.m.ID, r.m.Pkg, r.status, r.seconds, esc(r.detail))
		}
		b.WriteString("\n## Totals (killed / valid)\n\n| package | killed | survived | not counted | score |\n| --- | ---: | ---: | ---: | --- |\n")
		for _, p := range pkgs {
			t := byPkg[p]
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %s |\n", p, t.killed, t.survived, t.other, t.score())
		}
		fmt.Fprintf(&b, "| **all** | %d | %d | %d | %s |\n", total.killed, total.survived, total.other, total.score())
	} else {
		fmt.Fprintf(&b, "\nMutation testing of the %s\n\n", source)
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tPACKAGE\tRESULT\tSECONDS\tDETAIL")
		for _, r := range rs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%s\n", r.m.ID, r.m.Pkg, r.status, r.seconds, r.detail)
		}
		_ = tw.Flush()
		b.WriteString("\nTotals (killed / valid; invalid, stale and the like are not counted)\n\n")
		tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PACKAGE\tKILLED\tSURVIVED\tNOT COUNTED\tSCORE")
		for _, p := range pkgs {
			t := byPkg[p]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", p, t.killed, t.survived, t.other, t.score())
		}
		fmt.Fprintf(tw, "all\t%d\t%d\t%d\t%s\n", total.killed, total.survived, total.other, total.score())
		_ = tw.Flush()
	}
	var surv []result
	for _, r := range rs {
		if r.status == survived {
			surv = append(surv, r)
		}
	}
	if len(surv) > 0 {
		if markdown {
			b.WriteString("\n## Survivors: bugs no test of their package catches\n\n")
		} else {
			b.WriteString("\nSurvivors: bugs no test of their package catches\n\n")
		}
		for _, r := range surv {
			if markdown {
				fmt.Fprintf(&b, "- `%s` (%s): %s\n", r.m.ID, r.m.File, esc(r.m.Desc))
			} else {
				fmt.Fprintf(&b, "  %s (%s): %s\n", r.m.ID, r.m.File, r.m.Desc)
			}
		}
	}
	return b.String()
}
