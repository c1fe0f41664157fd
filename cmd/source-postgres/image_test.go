package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/tidemark/tidemark/e2e"
)

// TestImage builds the connector's image and runs it as the Airbyte platform does, in a Docker
// engine: the one DOCKER_HOST names or the system's, else one started here (root and Debian's
// docker.io; see e2e.StartEngine). No registry is needed: the runtime's base is a busybox image
// made from the machine's busybox-static, and the binaries are built here and copied in by the
// Dockerfile's `prebuilt` target. It skips, saying why, only where no engine answers and none can
// be started, and never in CI (CI=true), where it fails instead.
//
// The runs: `sh -c 'eval "$AIRBYTE_ENTRYPOINT ..."'` as uid/gid 1000, a read-only root
// filesystem, config, catalog and state mounted read-only as files, the host's network (the test
// server listens on 127.0.0.1). spec and check once with no writable directory at all; check,
// discover and the reads with a tmpfs TMPDIR. The first read is killed (docker kill) mid-read, the
// second resumes from the last state it sent, and a deduplicating destination fed both equals the
// source.
func TestImage(t *testing.T) {
	t.Parallel()   // a long test: beside the others, after the serial ones (docs/testing.md)
	e := newEnv(t) // skips without a PostgreSQL server (outside CI)
	ctx := context.Background()
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	start := time.Now()
	eng, err := e2e.StartEngine(ctx, log)
	if err != nil {
		if e2e.InCI() {
			t.Fatalf("CI=true and no Docker engine for the image test: %v", err)
		}
		t.Skipf("SKIPPED: the image is not built or run here, no Docker engine can be started: %v", err)
	}
	t.Cleanup(func() {
		if err := eng.Stop(context.Background()); err != nil {
			t.Errorf("stop the Docker engine: %v", err)
		}
	})
	t.Logf("Docker engine %s (started here: %v) in %s", eng.Host, eng.Started, time.Since(start).Round(time.Millisecond))

	img := buildImage(t, eng)
	t.Logf("image %s built in %s (from the engine's start)", img, time.Since(start).Round(time.Millisecond))

	// What the image says about itself.
	out, err := eng.Docker(ctx, "image", "inspect", "--format", "{{json .Config}}", img)
	require.NoError(t, err)
	var cfg struct {
		User       string
		Env        []string
		Entrypoint []string
		Labels     map[string]string
	}
	require.NoError(t, json.Unmarshal(out, &cfg))
	require.Equal(t, "1000:1000", cfg.User)
	require.Equal(t, []string{"/usr/local/bin/source-postgres"}, cfg.Entrypoint)
	require.Contains(t, cfg.Env, "AIRBYTE_ENTRYPOINT=/usr/local/bin/source-postgres")
	require.Equal(t, "tidemark/source-postgres", cfg.Labels["io.airbyte.name"])
	require.Equal(t, version, cfg.Labels["io.airbyte.version"])

	// The source: Airbyte's guide's role (SELECT and REPLICATION, read-only transactions, a slot
	// and publication made by the DBA).
	e.db.Exec(`CREATE TABLE orders (id int PRIMARY KEY, v text, n numeric)`)
	e.db.Exec(`INSERT INTO orders SELECT g, 'v' || g, g * 1.5 FROM generate_series(1, 20000) g`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE orders`)
	e.readOnlyRole("orders")
	e.cfg["backfill_chunk_size"] = 500

	ir := &imageRunner{t: t, e: e, eng: eng, image: img}

	// With no writable directory at all: a read-only root, no tmpfs, no /dev/shm, no TMPDIR.
	out, err = eng.Docker(ctx, append([]string{"run"}, ir.args(runOpts{writable: false, config: true},
		`for d in / /tmp /dev /dev/shm /source; do touch "$d/.w" 2>/dev/null && echo "$d writable"; done; mktemp -d 2>/dev/null && echo "mktemp works"; id -u; id -g`, true)...)...)
	require.NoError(t, err)
	require.Equal(t, "1000\n1000\n", string(out), "nothing is writable and the user is 1000:1000")
	r := ir.run(runOpts{writable: false}, "spec")
	require.Equal(t, 0, r.code, r.stderr)
	require.Len(t, r.ofType("SPEC"), 1)
	r = ir.run(runOpts{writable: false, config: true}, "check --config /source/connectorConfig.json")
	require.Equal(t, "SUCCEEDED", checkResult(t, r), r.stdout)

	// The image's own entrypoint and user, as `docker run IMAGE spec` uses them.
	plain := e.startCmd(eng.Command(ctx, "run", "--rm", "--network", "host", "--read-only", img, "spec"))
	r = plain.wait()
	require.Equal(t, 0, r.code, r.stderr)
	require.Len(t, r.ofType("SPEC"), 1)

	// With a writable TMPDIR (tmpfs), as the platform gives one.
	r = ir.run(runOpts{writable: true, config: true}, "check --config /source/connectorConfig.json")
	require.Equal(t, "SUCCEEDED", checkResult(t, r), r.stdout)
	r = ir.run(runOpts{writable: true, config: true}, "discover --config /source/connectorConfig.json")
	require.Equal(t, 0, r.code, r.stderr)
	require.Len(t, r.ofType("CATALOG"), 1)
	catalog := e.catalog("public.orders")
	d := newDestination(map[string][]string{"public.orders": {"id"}})

	// The first read streams on after its backfill (continuous) and is killed mid-read, after a
	// STATE that covers records; changes are made meanwhile.
	e.cfg["continuous"] = true
	first := ir.start(runOpts{writable: true, config: true, catalog: catalog}, "read --config /source/connectorConfig.json --catalog /source/catalog.json", false)
	e2e.WaitFor(t, 2*time.Minute, "a STATE after 2000 records", func() bool {
		n := 0
		for _, m := range first.snapshot() {
			switch m.Type {
			case "RECORD":
				n++
			case "STATE":
				if n >= 2000 {
					return true
				}
			}
		}
		return false
	})
	e.db.Exec(`UPDATE orders SET v = 'changed' WHERE id % 97 = 0`)
	e.db.Exec(`DELETE FROM orders WHERE id % 89 = 0`)
	e.db.Exec(`INSERT INTO orders SELECT g, 'new' || g, g FROM generate_series(20001, 20100) g`)
	_, err = eng.Docker(ctx, "kill", first.name)
	require.NoError(t, err)
	r1 := first.wait()
	require.Equal(t, 137, r1.code, "the read was killed mid-read (SIGKILL):\n%s", tail(r1.stderr))
	d.apply(t, r1.records())
	state := r1.lastState(t)
	t.Logf("first read killed after %d records and %d states", len(r1.records()), len(r1.states()))

	// More changes, then the second read from the last state, to its end.
	e.db.Exec(`UPDATE orders SET n = -1 WHERE id % 101 = 0`)
	e.db.Exec(`DELETE FROM orders WHERE id BETWEEN 19990 AND 20010`)
	e.cfg["continuous"] = false
	r2 := ir.run(runOpts{writable: true, config: true, catalog: catalog, state: state}, "read --config /source/connectorConfig.json --catalog /source/catalog.json --state /source/inputState.json")
	require.Equal(t, 0, r2.code, "second read:\n%s", tail(r2.stderr))
	d.apply(t, r2.records())
	t.Logf("second read: %d records", len(r2.records()))
	d.equalsSource(t, e, "public.orders")
	t.Logf("image test done in %s", time.Since(start).Round(time.Millisecond))
}

// buildImage builds the connector's image in eng from binaries built here, on a busybox base,
// and returns its name.
func buildImage(t *testing.T, eng *e2e.Engine) string {
	t.Helper()
	ctx := context.Background()
	suffix := randomSuffix()
	base := "tidemark-test/busybox:" + suffix
	img := "tidemark-test/source-postgres:" + suffix
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "bin"), 0o755))
	// Static, with the time zone database, as the Dockerfile's build stage builds them; its
	// CGO_ENABLED=0 -trimpath would compile every package again (about 150 CPU seconds from a
	// cold cache, a quarter of the package's time on a 2-core machine), where the pure-Go
	// resolver and user lookup (netgo, osusergo) make the same static binary from what the
	// test builds compiled already.
	for _, b := range []struct{ out, pkg, ldflags string }{
		{"source-postgres", ".", "-s -w -X main.version=" + version},
		{"tidemark", "../tidemark", "-s -w"},
	} {
		build := exec.Command("go", "build", "-tags", "timetzdata,netgo,osusergo",
			"-ldflags", b.ldflags, "-o", filepath.Join(dir, "bin", b.out), b.pkg)
		out, err := build.CombinedOutput()
		require.NoError(t, err, "build %s: %s", b.pkg, out)
	}
	require.NoError(t, eng.BusyboxImage(ctx, base))
	_, err := eng.Docker(ctx, "build", "--network", "host", "--target", "prebuilt",
		"--build-arg", "BASE="+base, "--build-arg", "VERSION="+version,
		"-f", "../../Dockerfile", "-t", img, dir)
	require.NoError(t, err)
	if !eng.Started {
		// An engine that outlives the test keeps nothing of it.
		t.Cleanup(func() { _, _ = eng.Docker(context.Background(), "image", "rm", img, base) })
	}
	return img
}

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// imageRunner runs the image as the platform runs a connector.
type imageRunner struct {
	t     *testing.T
	e     *env
	eng   *e2e.Engine
	image string
}

// runOpts says what a run gets: a writable TMPDIR (a tmpfs) or nothing writable; the config (the
// env's current one), a catalog and a state, mounted read-only as files under /source.
type runOpts struct {
	writable bool
	config   bool
	catalog  string // a file of the env
	state    []byte
}

// imageProc is a running container.
type imageProc struct {
	*proc
	name string
}

// start starts the image with script under `sh -c`: with connector, script is the connector's
// arguments, run as the platform runs them (eval "$AIRBYTE_ENTRYPOINT ..."); otherwise script is
// a shell script of its own.
func (ir *imageRunner) start(o runOpts, script string, shell bool) *imageProc {
	ir.t.Helper()
	name := "tidemark-test-" + randomSuffix()
	args := append([]string{"run", "--name", name}, ir.args(o, script, shell)...)
	ir.t.Cleanup(func() { _, _ = ir.eng.Docker(context.Background(), "rm", "-f", name) })
	return &imageProc{proc: ir.e.startCmd(ir.eng.Command(context.Background(), args...)), name: name}
}

// args are the arguments of `docker run` after "run" for a run of script (see start).
func (ir *imageRunner) args(o runOpts, script string, shell bool) []string {
	args := []string{"--rm", "--network", "host", "--user", "1000:1000", "--read-only", "-e", "LOG_LEVEL=info"}
	if o.writable {
		args = append(args, "--tmpfs", "/tmp:rw,size=64m,uid=1000,gid=1000,mode=0700", "-e", "TMPDIR=/tmp")
	} else {
		args = append(args, "--ipc", "none")
	}
	mount := func(src, dst string) {
		args = append(args, "--mount", "type=bind,source="+src+",target="+dst+",readonly")
	}
	if o.config {
		mount(ir.e.config(), "/source/connectorConfig.json")
	}
	if o.catalog != "" {
		mount(o.catalog, "/source/catalog.json")
	}
	if o.state != nil {
		mount(ir.e.file("state.json", o.state), "/source/inputState.json")
	}
	if !shell {
		script = `eval "$AIRBYTE_ENTRYPOINT ` + script + `"`
	}
	return append(args, "--entrypoint", "sh", ir.image, "-c", script)
}

// run runs the connector with args in the image and waits for it.
func (ir *imageRunner) run(o runOpts, args string) *result {
	ir.t.Helper()
	return ir.start(o, args, false).wait()
}

// checkResult is the status of a check's one CONNECTION_STATUS (exit code 0).
func checkResult(t *testing.T, r *result) string {
	t.Helper()
	require.Equal(t, 0, r.code, r.stderr)
	st := r.ofType("CONNECTION_STATUS")
	require.Len(t, st, 1, r.stdout)
	if s := st[0].str("connectionStatus", "status"); s != "SUCCEEDED" {
		return s + ": " + st[0].str("connectionStatus", "message")
	}
	return "SUCCEEDED"
}
