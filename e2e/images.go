package e2e

import (
	"bufio"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Images the tests build from parts made on this machine, for engines that reach no registry.

// BusyboxImage makes image tag from the machine's statically linked busybox (Debian:
// apt-get install busybox-static): /bin/busybox, a link for each of its applets (sh among them),
// an empty /tmp, PATH set. A shell is all an Airbyte connector's runtime needs.
func (e *Engine) BusyboxImage(ctx context.Context, tag string) error {
	busybox, err := staticBusybox()
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("list busybox's applets: %w", err)
	}
	root, err := os.MkdirTemp("", "tidemark-busybox-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	for _, d := range []string{"bin", "tmp", "etc"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky); err != nil {
		return err
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755); err != nil {
		return err
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			return err
		}
	}
	passwd := "root:x:0:0:root:/root:/bin/sh\nairbyte:x:1000:1000:airbyte:/tmp:/bin/sh\n"
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		return err
	}
	return e.importDir(ctx, root, tag, "ENV PATH=/usr/local/bin:/usr/bin:/bin")
}

// staticBusybox finds a statically linked busybox: one that needs no dynamic loader runs on an
// image that has nothing else.
func staticBusybox() (string, error) {
	var tried []string
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		static := !slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
		f.Close()
		if static {
			return p, nil
		}
		tried = append(tried, p+" (dynamically linked)")
	}
	return "", fmt.Errorf("no statically linked busybox (tried /bin/busybox, /usr/bin/busybox: %v); install one, for example: apt-get install busybox-static", tried)
}

// importDir imports the directory root as image tag, with the Dockerfile instructions changes.
func (e *Engine) importDir(ctx context.Context, root, tag string, changes ...string) error {
	tar := exec.CommandContext(ctx, "tar", "-C", root, "--numeric-owner", "-c", ".")
	stdout, err := tar.StdoutPipe()
	if err != nil {
		return err
	}
	var tarErr strings.Builder
	tar.Stderr = &tarErr
	if err := tar.Start(); err != nil {
		return fmt.Errorf("tar %s: %w", root, err)
	}
	args := []string{"import"}
	for _, c := range changes {
		args = append(args, "--change", c)
	}
	_, ierr := e.DockerIn(ctx, stdout, append(args, "-", tag)...)
	if ierr != nil {
		_, _ = io.Copy(io.Discard, stdout)
	}
	if err := tar.Wait(); err != nil {
		return fmt.Errorf("tar %s: %w: %s", root, err, tarErr.String())
	}
	return ierr
}

// PostgresImage builds image tag: PostgreSQL 15 from Debian's packages on a Debian base made with
// debootstrap from this machine's apt source (root and debootstrap needed: apt-get install
// debootstrap), with an entrypoint that takes the official postgres image's POSTGRES_USER,
// POSTGRES_PASSWORD and POSTGRES_DB, makes the cluster on first start (scram-sha-256 for TCP, from
// any address) and runs its arguments (`postgres -c ...`). The build runs on the host's network.
func (e *Engine) PostgresImage(ctx context.Context, tag string) error {
	if os.Geteuid() != 0 {
		return errors.New("build a PostgreSQL image: debootstrap needs root")
	}
	debootstrap, err := exec.LookPath("debootstrap")
	if err != nil {
		return errors.New("build a PostgreSQL image: debootstrap is not installed (apt-get install debootstrap)")
	}
	suite, mirror, err := aptSource()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "tidemark-pgimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	root := filepath.Join(dir, "rootfs")
	out, err := exec.CommandContext(ctx, debootstrap, "--variant=minbase", suite, root, mirror).CombinedOutput()
	if err != nil {
		return fmt.Errorf("debootstrap %s %s: %w: %s", suite, mirror, err, lastLines(out, 15))
	}
	base := tag + "-base"
	if err := e.importDir(ctx, root, base, "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"); err != nil {
		return err
	}
	_ = os.RemoveAll(root)
	e.log.Info().Dur("took", time.Since(start)).Str("image", base).Msg("Debian base made")
	ctxDir := filepath.Join(dir, "context")
	if err := os.Mkdir(ctxDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(fmt.Sprintf(postgresDockerfile, base)), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(ctxDir, "entrypoint.sh"), []byte(postgresEntrypoint), 0o755); err != nil {
		return err
	}
	if _, err := e.Docker(ctx, "build", "--network", "host", "-t", tag, ctxDir); err != nil {
		return err
	}
	e.log.Info().Dur("took", time.Since(start)).Str("image", tag).Msg("PostgreSQL image built")
	return nil
}

// postgresDockerfile builds on the base %s. Installing the package neither creates a cluster nor
// starts a server (the build runs on the host's network).
const postgresDockerfile = `FROM %s
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d \
 && mkdir -p /etc/postgresql-common/createcluster.d \
 && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/tidemark.conf \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY entrypoint.sh /usr/local/bin/entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data LANG=C.UTF-8
USER postgres
EXPOSE 5432
ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
CMD ["postgres"]
`

// postgresEntrypoint makes the cluster on the first start, as the official image's entrypoint
// does for the environment the harness sets, then runs its arguments.
const postgresEntrypoint = `#!/bin/sh
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	pw="$(mktemp)"
	printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}" > "$pw"
	initdb -D "$PGDATA" -U "${POSTGRES_USER:-postgres}" --pwfile="$pw" \
		--auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 -N >/dev/null
	rm -f "$pw"
	printf 'host all all all scram-sha-256\nhost replication all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
	printf "listen_addresses = '*'\n" >> "$PGDATA/postgresql.conf"
	db="${POSTGRES_DB:-${POSTGRES_USER:-postgres}}"
	if [ "$db" != postgres ]; then
		echo "CREATE DATABASE \"$db\"" | postgres --single -D "$PGDATA" postgres >/dev/null
	fi
fi
exec "$@"
`

// aptSource finds this machine's Debian suite (its codename) and the mirror its apt sources take
// it from, in /etc/apt/sources.list and /etc/apt/sources.list.d (one-line and deb822 forms).
func aptSource() (suite, mirror string, err error) {
	osRelease, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return "", "", fmt.Errorf("read /etc/os-release: %w", err)
	}
	for _, line := range strings.Split(string(osRelease), "\n") {
		if v, ok := strings.CutPrefix(line, "VERSION_CODENAME="); ok {
			suite = strings.Trim(v, `"`)
		}
	}
	if suite == "" {
		return "", "", errors.New("no VERSION_CODENAME in /etc/os-release: not a Debian system?")
	}
	files := []string{"/etc/apt/sources.list"}
	for _, pat := range []string{"/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources"} {
		m, _ := filepath.Glob(pat)
		files = append(files, m...)
	}
	for _, f := range files {
		if u := sourceFor(f, suite); u != "" {
			return suite, u, nil
		}
	}
	return "", "", fmt.Errorf("no apt source for suite %s with component main in %v", suite, files)
}

// sourceFor returns the URI of the first deb entry of file for suite with component main.
func sourceFor(file, suite string) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	deb822 := strings.HasSuffix(file, ".sources")
	var types, uris, suites, comps []string
	match := func() string {
		if slices.Contains(types, "deb") && slices.Contains(suites, suite) && slices.Contains(comps, "main") && len(uris) > 0 {
			return uris[0]
		}
		return ""
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			continue
		}
		if !deb822 {
			// deb [options] uri suite component...
			fields := strings.Fields(line)
			if len(fields) > 0 && fields[0] == "deb" {
				fields = fields[1:]
				if len(fields) > 0 && strings.HasPrefix(fields[0], "[") {
					for len(fields) > 0 && !strings.HasSuffix(fields[0], "]") {
						fields = fields[1:]
					}
					fields = fields[min(1, len(fields)):]
				}
				if len(fields) >= 3 {
					types, uris, suites, comps = []string{"deb"}, fields[:1], fields[1:2], fields[2:]
					if u := match(); u != "" {
						return u
					}
				}
			}
			continue
		}
		if line == "" {
			if u := match(); u != "" {
				return u
			}
			types, uris, suites, comps = nil, nil, nil, nil
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "types":
			types = strings.Fields(v)
		case "uris":
			uris = strings.Fields(v)
		case "suites":
			suites = strings.Fields(v)
		case "components":
			comps = strings.Fields(v)
		}
	}
	return match()
}
