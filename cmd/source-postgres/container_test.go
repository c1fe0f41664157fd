package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The image: the Dockerfile, the platform's invocation and metadata.yaml. The Dockerfile is
// checked as text against what the platform needs, and the binary is run the way the platform
// runs the image's entrypoint; image_test.go builds the image and runs it in a Docker engine
// where one can be started.

// stage is one stage of the Dockerfile.
type stage struct {
	name, from string
	instr      []string // instructions after FROM, continuation lines joined
}

// dockerfile parses the Dockerfile: its global ARG defaults and its stages in order.
func dockerfile(t *testing.T) (args map[string]string, stages []stage) {
	b, err := os.ReadFile("../../Dockerfile")
	require.NoError(t, err)
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	args = map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		switch {
		case f[0] == "FROM":
			st := stage{from: f[1]}
			if len(f) == 4 && strings.EqualFold(f[2], "AS") {
				st.name = f[3]
			}
			stages = append(stages, st)
		case len(stages) == 0 && f[0] == "ARG":
			k, v, _ := strings.Cut(f[1], "=")
			args[k] = v
		case len(stages) > 0:
			stages[len(stages)-1].instr = append(stages[len(stages)-1].instr, line)
		}
	}
	require.NotEmpty(t, stages)
	return args, stages
}

// target returns what an image built for the named stage ("" for the default, the last one) is
// made of: the base image it starts from (a build argument resolved to its default) and the
// instructions of the stage and of the stages it derives from, in order.
func target(t *testing.T, name string) (base string, instr []string) {
	args, stages := dockerfile(t)
	i := len(stages) - 1
	if name != "" {
		i = slices.IndexFunc(stages, func(s stage) bool { return s.name == name })
		require.GreaterOrEqual(t, i, 0, "no stage %q in the Dockerfile", name)
	}
	for {
		st := stages[i]
		instr = append(slices.Clone(st.instr), instr...)
		j := slices.IndexFunc(stages[:i], func(s stage) bool { return s.name == st.from })
		if j < 0 {
			base = os.Expand(st.from, func(k string) string { return args[k] })
			return base, instr
		}
		i = j
	}
}

func TestDockerfileEntrypointEnvAndLabels(t *testing.T) {
	// The image users build (the default target) and the one the image test builds from binaries
	// made outside (prebuilt) are the same runtime with the same binaries in the same place.
	for _, tgt := range []struct{ name, binary string }{{"", "/out/source-postgres"}, {"prebuilt", "bin/source-postgres"}} {
		from, instr := target(t, tgt.name)
		var entrypoint []string
		env := map[string]string{}
		labels := map[string]string{}
		user := ""
		var copied []string
		for _, in := range instr {
			verb, rest, _ := strings.Cut(in, " ")
			switch verb {
			case "ENTRYPOINT":
				require.NoError(t, json.Unmarshal([]byte(rest), &entrypoint), "ENTRYPOINT in exec form")
			case "ENV":
				k, v, _ := strings.Cut(rest, "=")
				env[k] = strings.Trim(v, `"`)
			case "LABEL":
				for _, m := range regexp.MustCompile(`([\w.]+)="([^"]*)"`).FindAllStringSubmatch(rest, -1) {
					labels[m[1]] = m[2]
				}
			case "USER":
				user = rest
			case "COPY":
				copied = append(copied, rest)
			case "RUN":
				// Nothing is installed into the runtime: any base with a shell must do.
				t.Errorf("target %q runs a command in the runtime: %s", tgt.name, rest)
			}
		}
		require.NotEmpty(t, entrypoint)
		require.Equal(t, strings.Join(entrypoint, " "), env["AIRBYTE_ENTRYPOINT"], "AIRBYTE_ENTRYPOINT is the space-joined ENTRYPOINT")
		require.Equal(t, "tidemark/source-postgres", labels["io.airbyte.name"])
		require.NotEmpty(t, labels["io.airbyte.version"])
		require.Equal(t, "1000:1000", user, "runs as uid/gid 1000")
		require.True(t, strings.HasPrefix(from, "alpine:") || strings.HasPrefix(from, "debian:"), "the final image %s has /bin/sh", from)
		found := false
		for _, c := range copied {
			if strings.Contains(c, tgt.binary) && strings.HasSuffix(c, filepath.Dir(entrypoint[0])+"/") {
				found = true
			}
		}
		require.True(t, found, "target %q: the entrypoint %s is the copied connector", tgt.name, entrypoint[0])
		// The metadata names the same image.
		md := metadata(t)
		require.Equal(t, labels["io.airbyte.name"], md["dockerRepository"])
	}
	b, _ := os.ReadFile("../../Dockerfile")
	require.Contains(t, string(b), "CGO_ENABLED=0 go build", "a static binary")
	require.Contains(t, string(b), "-tags timetzdata", "time zones without the base's tzdata")
	require.Contains(t, string(b), "./cmd/source-postgres")
}

// asPlatformUser makes cmd run as uid/gid 1000 when the tests run as root, as the platform runs
// connectors, with a private TMPDIR it can write.
func asPlatformUser(t *testing.T, cmd *exec.Cmd, env ...string) {
	tmp, err := os.MkdirTemp("", "tidemark-tmpdir-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if os.Geteuid() == 0 {
		require.NoError(t, os.Chown(tmp, 1000, 1000))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	}
	cmd.Env = append([]string{"TMPDIR=" + tmp, "AIRBYTE_ENTRYPOINT=" + binPath, "PATH=/usr/bin:/bin", "LOG_LEVEL=info"}, env...)
	cmd.Dir = "/"
}

func TestShellEvalOfTheEntrypoint(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", `eval "$AIRBYTE_ENTRYPOINT spec"`)
	asPlatformUser(t, cmd)
	out, err := cmd.Output()
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, 1)
	validate(t, "AirbyteMessage", []byte(lines[0]))
	require.Contains(t, lines[0], `"type":"SPEC"`)
}

// TestPlatformInvocation reproduces the platform's sync pod: the inputs under a source
// directory, stdout and stderr into named pipes the orchestrator reads, the exit code written
// by the wrapper; a failing read's exit code propagates the same way.
func TestPlatformInvocation(t *testing.T) {
	e := ordersEnv(t, 500)
	cat := e.catalog()
	first := e.read(cat, nil)
	e.db.Exec(`INSERT INTO orders VALUES (1000, 'new', 1)`)

	run := func(withState bool, config map[string]any) (int, []msg, string) {
		dir, err := os.MkdirTemp("", "tidemark-pod-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		src := filepath.Join(dir, "source")
		require.NoError(t, os.Mkdir(src, 0o755))
		b, _ := json.Marshal(config)
		require.NoError(t, os.WriteFile(filepath.Join(src, "connectorConfig.json"), b, 0o644))
		c, _ := os.ReadFile(cat)
		require.NoError(t, os.WriteFile(filepath.Join(src, "catalog.json"), c, 0o644))
		args := "read --config " + src + "/connectorConfig.json --catalog " + src + "/catalog.json"
		if withState {
			require.NoError(t, os.WriteFile(filepath.Join(src, "inputState.json"), first.lastState(t), 0o644))
			args += " --state " + src + "/inputState.json"
		}
		for _, p := range []string{"stdout", "stderr"} {
			require.NoError(t, syscall.Mkfifo(filepath.Join(dir, p), 0o666))
		}
		if os.Geteuid() == 0 {
			require.NoError(t, filepath.Walk(dir, func(p string, _ os.FileInfo, _ error) error { return os.Chown(p, 1000, 1000) }))
		}
		script := fmt.Sprintf(`trap "touch %[1]s/TERMINATED" EXIT
eval "$AIRBYTE_ENTRYPOINT %[2]s" > %[1]s/stdout 2> %[1]s/stderr
code=$?
echo $code > %[1]s/exitCode.txt
exit $code`, dir, args)
		cmd := exec.Command("/bin/sh", "-c", script)
		asPlatformUser(t, cmd)
		require.NoError(t, cmd.Start())
		// The orchestrator's side: read both pipes to their end.
		stderrDone := make(chan string)
		go func() {
			f, err := os.Open(filepath.Join(dir, "stderr"))
			if err != nil {
				stderrDone <- err.Error()
				return
			}
			b, _ := io.ReadAll(f)
			f.Close()
			stderrDone <- string(b)
		}()
		f, err := os.Open(filepath.Join(dir, "stdout"))
		require.NoError(t, err)
		var msgs []msg
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			line := []byte(sc.Text())
			validate(t, "AirbyteMessage", line)
			var m map[string]any
			require.NoError(t, json.Unmarshal(line, &m))
			msgs = append(msgs, msg{raw: line, Type: m["type"].(string), m: m})
		}
		f.Close()
		stderr := <-stderrDone
		err = cmd.Wait()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		written, err := os.ReadFile(filepath.Join(dir, "exitCode.txt"))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(code), strings.TrimSpace(string(written)))
		require.FileExists(t, filepath.Join(dir, "TERMINATED"))
		return code, msgs, stderr
	}

	code, msgs, stderr := run(true, e.cfg)
	require.Equal(t, 0, code, stderr)
	records := 0
	for _, m := range msgs {
		if m.Type == "RECORD" {
			records++
		}
	}
	require.Equal(t, 1, records, "the change since the state")
	require.Equal(t, "STATE", msgs[len(msgs)-1-len(lastTraces(msgs))].Type)

	bad := clone(e.cfg)
	bad["replication_method"].(map[string]any)["publication"] = "missing_publication"
	code, msgs, _ = run(false, bad)
	require.Equal(t, 1, code, "the connector's exit code propagates")
	var failure string
	for _, m := range msgs {
		if m.Type == "TRACE" && m.m["trace"].(map[string]any)["type"] == "ERROR" {
			failure = m.m["trace"].(map[string]any)["error"].(map[string]any)["failure_type"].(string)
		}
	}
	require.Equal(t, "config_error", failure)
}

// lastTraces are the TRACE messages at the end of msgs.
func lastTraces(msgs []msg) []msg {
	i := len(msgs)
	for i > 0 && msgs[i-1].Type == "TRACE" {
		i--
	}
	return msgs[i:]
}

func metadata(t *testing.T) map[string]any {
	b, err := os.ReadFile("metadata.yaml")
	require.NoError(t, err)
	var doc struct {
		MetadataSpecVersion string         `yaml:"metadataSpecVersion"`
		Data                map[string]any `yaml:"data"`
	}
	require.NoError(t, yaml.Unmarshal(b, &doc))
	require.Equal(t, "1.0", doc.MetadataSpecVersion)
	return doc.Data
}

// TestMetadataDefinition checks metadata.yaml against the required fields and enumerations of
// Airbyte's connector metadata definition (ConnectorMetadataDefinitionV0, the schema of a
// connector's metadata.yaml in Airbyte's registry).
func TestMetadataDefinition(t *testing.T) {
	md := metadata(t)
	for _, k := range []string{"name", "definitionId", "connectorType", "dockerRepository", "dockerImageTag", "license", "documentationUrl", "githubIssueLabel", "connectorSubtype", "releaseStage"} {
		require.NotEmpty(t, md[k], "data.%s is required", k)
	}
	require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`, md["definitionId"])
	require.Equal(t, "source", md["connectorType"])
	require.Equal(t, "database", md["connectorSubtype"])
	require.Contains(t, []string{"alpha", "beta", "generally_available", "custom"}, md["releaseStage"])
	require.Contains(t, []string{"community", "certified", "enterprise", "archived"}, md["supportLevel"])
	require.Equal(t, 7200, md["maxSecondsBetweenMessages"])
	hosts := md["allowedHosts"].(map[string]any)["hosts"].([]any)
	require.Equal(t, []any{"${host}", "${tunnel_method.tunnel_host}"}, hosts)
	require.Regexp(t, `^\d+\.\d+\.\d+$`, md["dockerImageTag"])
	// The image's version label, the metadata's tag and the connector's version agree.
	require.Equal(t, version, md["dockerImageTag"])
	b, _ := os.ReadFile("../../Dockerfile")
	require.Contains(t, string(b), "ARG VERSION="+version)
}

// TestNoWritableDirectory: the platform may give the connector no writable directory at all
// (a read-only root filesystem and no tmpfs). Nothing is written unless certificates are given
// inline, so check, discover and read work there; with inline certificates the failure names
// TMPDIR and what to do.
func TestNoWritableDirectory(t *testing.T) {
	e := newEnv(t)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text)`)
	e.db.Exec(`INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	// A TMPDIR that does not exist: not even root can make a directory in it.
	unwritable := filepath.Join(t.TempDir(), "missing", "tmp")
	runNoTmp := func(args ...string) *result {
		cmd := exec.Command(binPath, args...)
		cmd.Env = []string{"TMPDIR=" + unwritable, "LOG_LEVEL=info", "PATH=/usr/bin:/bin"}
		cmd.Dir = "/"
		return e.startCmd(cmd).wait()
	}
	r := runNoTmp("check", "--config", e.config())
	require.Equal(t, 0, r.code, r.stderr)
	st := r.ofType("CONNECTION_STATUS")
	require.Len(t, st, 1, r.stdout)
	require.Equal(t, "SUCCEEDED", st[0].str("connectionStatus", "status"), st[0].str("connectionStatus", "message"))

	r = runNoTmp("discover", "--config", e.config())
	require.Equal(t, 0, r.code, r.stderr)
	require.Len(t, r.ofType("CATALOG"), 1)

	cat := e.catalog("public.t")
	r = runNoTmp("read", "--config", e.config(), "--catalog", cat)
	require.Equal(t, 0, r.code, r.stderr)
	replayEqualsSource(t, e, "public.t", "id", r)

	// Inline certificates need no file (they are kept in memory): with no writable directory, a
	// malformed one is refused for its content alone.
	e.cfg["ssl_mode"] = map[string]any{"mode": "verify-ca", "ca_certificate": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}
	r = runNoTmp("check", "--config", e.config())
	require.Equal(t, 0, r.code, r.stderr)
	st = r.ofType("CONNECTION_STATUS")
	require.Len(t, st, 1, r.stdout)
	require.Equal(t, "FAILED", st[0].str("connectionStatus", "status"))
	require.Contains(t, st[0].str("connectionStatus", "message"), "ca_certificate holds no PEM certificate")
	require.NotContains(t, st[0].str("connectionStatus", "message"), "TMPDIR")
}

// alpineEndOfSupport is when each Alpine release's main repository stops getting security fixes
// (alpinelinux.org/releases: two years after its release). A base past it fails the test below;
// docs/airbyte.md says how to move to the next one.
var alpineEndOfSupport = map[string]string{
	"3.20": "2026-04-01",
	"3.21": "2026-11-01",
	"3.22": "2027-05-01",
	"3.23": "2027-11-01",
	"3.24": "2028-05-01",
}

// TestDockerfileBasesPinned: every image the Dockerfile pulls is named by tag and pinned by the
// digest of its index (a tag alone can be moved to other contents by whoever controls it), and the
// runtime's base is an Alpine release still supported today.
func TestDockerfileBasesPinned(t *testing.T) {
	args, stages := dockerfile(t)
	pinned := regexp.MustCompile(`^[a-z0-9./-]+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}$`)
	names := map[string]bool{}
	for _, st := range stages {
		if !names[st.from] {
			from := os.Expand(st.from, func(k string) string { return args[k] })
			require.Regexp(t, pinned, from, "stage %q pulls %s: name it as image:tag@sha256:digest", st.name, from)
		}
		names[st.name] = true
	}
	base, _ := target(t, "runtime")
	m := regexp.MustCompile(`^alpine:(\d+\.\d+)[.\d]*@`).FindStringSubmatch(base)
	require.NotNil(t, m, "the runtime's base %s is an alpine release", base)
	end, ok := alpineEndOfSupport[m[1]]
	require.True(t, ok, "alpine %s: add its end of support to alpineEndOfSupport", m[1])
	require.Less(t, time.Now().UTC().Format(time.DateOnly), end,
		"alpine %s is out of support since %s: move BASE to a supported release (docs/airbyte.md, updating the base)", m[1], end)
}
