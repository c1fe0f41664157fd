package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Engine is a Docker engine for the tests: one that answers already, or one StartEngine started.
type Engine struct {
	// Host is the engine's address as DOCKER_HOST takes it (unix:///path/to/docker.sock).
	Host string
	// Started says that StartEngine started the engine (Stop stops it and removes its files).
	Started bool

	dir    string // a started engine's directory: data, exec, socket, log, owner
	pid    int
	exited chan error
	log    zerolog.Logger
}

// ErrNoEngine is the cause of StartEngine's error when no engine answers and none can be started
// here; tests skip with that error outside CI.
var ErrNoEngine = errors.New("no Docker engine")

// defaultSocket is where a system's Docker engine listens.
const defaultSocket = "/var/run/docker.sock"

// StartEngine finds a Docker engine: the one $DOCKER_HOST names (it must answer), else the
// system's at /var/run/docker.sock when it answers, else one started here: when this process is
// root and dockerd is installed (Debian: apt-get install docker.io), a private dockerd with its
// data, exec root, pid file and socket in a new directory under /tmp, no bridge and no iptables
// rules (containers use the host's network: `--network host`), so it touches nothing of another
// engine on the machine. A started engine gets SIGTERM if this process dies, and Stop stops it.
func StartEngine(ctx context.Context, log zerolog.Logger) (*Engine, error) {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		if err := ping(ctx, h); err != nil {
			return nil, fmt.Errorf("the Docker engine DOCKER_HOST=%s names does not answer: %w", h, err)
		}
		return &Engine{Host: h, log: log}, nil
	}
	if ping(ctx, "unix://"+defaultSocket) == nil {
		return &Engine{Host: "unix://" + defaultSocket, log: log}, nil
	}
	dockerd, err := exec.LookPath("dockerd")
	if err != nil {
		return nil, fmt.Errorf("%w: DOCKER_HOST is not set, nothing answers on %s, and dockerd is not installed (Debian: apt-get install docker.io)", ErrNoEngine, defaultSocket)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: DOCKER_HOST is not set, nothing answers on %s, and dockerd (%s) can only be started here as root", ErrNoEngine, defaultSocket, dockerd)
	}
	reapStaleEngines("/tmp", log)
	dir, err := os.MkdirTemp("/tmp", "tidemark-docker-")
	if err != nil {
		return nil, fmt.Errorf("make the Docker engine's directory: %w", err)
	}
	e := &Engine{Host: "unix://" + filepath.Join(dir, "docker.sock"), Started: true, dir: dir, log: log}
	if err := e.start(ctx, dockerd); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return e, nil
}

func (e *Engine) start(ctx context.Context, dockerd string) error {
	if err := os.WriteFile(filepath.Join(e.dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("write the Docker engine's owner: %w", err)
	}
	// An empty configuration file: the system's /etc/docker/daemon.json is for its own engine.
	conf := filepath.Join(e.dir, "daemon.json")
	if err := os.WriteFile(conf, []byte("{}\n"), 0o644); err != nil {
		return fmt.Errorf("write the Docker engine's configuration: %w", err)
	}
	logPath := filepath.Join(e.dir, "dockerd.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("open the Docker engine's log: %w", err)
	}
	cmd := exec.Command(dockerd,
		"--config-file", conf,
		"--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
		"--data-root", filepath.Join(e.dir, "data"),
		"--exec-root", filepath.Join(e.dir, "exec"),
		"--pidfile", filepath.Join(e.dir, "dockerd.pid"),
		"--host", e.Host,
	)
	cmd.Dir = e.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// As for a local PostgreSQL (see localCluster.start): the engine gets SIGTERM, on which it
	// stops its containers and its containerd, when the thread that started it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	started := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer logFile.Close()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start dockerd: %w", err)
	}
	e.exited, e.pid = exited, cmd.Process.Pid
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case err := <-exited:
			e.exited = nil
			return fmt.Errorf("dockerd exited during start-up (%v): %s", err, tailFile(logPath, 15))
		default:
		}
		err := ping(ctx, e.Host)
		if err == nil {
			e.log.Info().Str("dir", e.dir).Msg("Docker engine started")
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			_ = e.Stop(context.Background())
			return fmt.Errorf("dockerd did not answer: %w: %s", err, tailFile(logPath, 15))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops an engine StartEngine started (its containers with it) and removes its files; an
// engine that was running already is left alone.
func (e *Engine) Stop(ctx context.Context) error {
	if !e.Started || e.exited == nil {
		return nil
	}
	defer func() { e.exited = nil }()
	var err error
	if kerr := syscall.Kill(e.pid, syscall.SIGTERM); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
		err = fmt.Errorf("signal dockerd: %w", kerr)
	}
	timer := time.NewTimer(60 * time.Second)
	defer timer.Stop()
	select {
	case <-e.exited:
	case <-timer.C:
		err = errors.New("dockerd did not stop within 60 s; killed")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		_ = syscall.Kill(-e.pid, syscall.SIGKILL)
		<-e.exited
	}
	if rerr := removeEngineDir(e.dir); rerr != nil && err == nil {
		err = fmt.Errorf("remove the Docker engine's files: %w", rerr)
	}
	return err
}

// Command returns a docker CLI command for the engine (the classic builder: `docker build` runs
// on any engine and CLI version, BuildKit or not).
func (e *Engine) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = append(os.Environ(), "DOCKER_HOST="+e.Host, "DOCKER_BUILDKIT=0")
	return cmd
}

// Docker runs the docker CLI with args and returns its standard output; the error has the end of
// its output.
func (e *Engine) Docker(ctx context.Context, args ...string) ([]byte, error) {
	return e.DockerIn(ctx, nil, args...)
}

// DockerIn is Docker with stdin as the command's standard input.
func (e *Engine) DockerIn(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	cmd := e.Command(ctx, args...)
	cmd.Stdin = stdin
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		all := out.String() + errOut.String()
		return nil, fmt.Errorf("docker %s: %w: %s", strings.Join(args[:min(len(args), 2)], " "), err, lastLines([]byte(all), 20))
	}
	return []byte(out.String()), nil
}

// HasBridge reports whether the engine has its default bridge network; without it (an engine
// started here) containers run on the host's network.
func (e *Engine) HasBridge(ctx context.Context) (bool, error) {
	out, err := e.Docker(ctx, "network", "ls", "--format", "{{.Name}}")
	if err != nil {
		return false, err
	}
	for _, n := range strings.Fields(string(out)) {
		if n == "bridge" {
			return true, nil
		}
	}
	return false, nil
}

// ping asks the engine at host (unix:// or tcp://) whether it answers.
func ping(ctx context.Context, host string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var dial func(ctx context.Context, _, _ string) (net.Conn, error)
	switch {
	case strings.HasPrefix(host, "unix://"):
		path := strings.TrimPrefix(host, "unix://")
		dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	case strings.HasPrefix(host, "tcp://"):
		addr := strings.TrimPrefix(host, "tcp://")
		dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}
	default:
		return fmt.Errorf("unsupported Docker host %q (unix:// or tcp://)", host)
	}
	c := &http.Client{Transport: &http.Transport{DialContext: dial}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/_ping", nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("ping: %s", resp.Status)
	}
	return nil
}

// reapStaleEngines removes the directories of engines whose owner process is gone (their engines
// got SIGTERM then and stopped).
func reapStaleEngines(parent string, log zerolog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(parent, "tidemark-docker-*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) == nil || pid == os.Getpid() {
			continue
		}
		// Its dockerd may still be shutting down: only a directory whose pid file is gone or
		// names a dead process is removed.
		if b, err := os.ReadFile(filepath.Join(dir, "dockerd.pid")); err == nil {
			if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && p > 0 && syscall.Kill(p, 0) == nil {
				continue
			}
		}
		if removeEngineDir(dir) == nil {
			log.Debug().Str("dir", dir).Msg("removed a stale Docker engine directory")
		}
	}
}

// removeEngineDir removes a stopped engine's directory, unmounting first what the engine left
// mounted in it (dockerd leaves its network namespace file, exec/netns/default, mounted).
func removeEngineDir(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err == nil {
		var points []string
		for _, line := range strings.Split(string(b), "\n") {
			// id parent major:minor root mount-point ...
			f := strings.Fields(line)
			if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
				points = append(points, f[4])
			}
		}
		// Deepest first.
		slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
		for _, p := range points {
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
		}
	}
	return os.RemoveAll(dir)
}

// tailFile returns the last n lines of the file at path (a log), or "" when it cannot be read.
func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	return lastLines(b, n)
}

// lastLines returns the last n lines of b.
func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
