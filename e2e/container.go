package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/rs/zerolog"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/tidemark/tidemark/internal/pgserver"
)

// ContainerImage is the image StartContainer runs unless its image argument names another.
const ContainerImage = "postgres:15"

// DebianImage is the image the container-debian server kind builds here (Engine.PostgresImage).
const DebianImage = "tidemark-test/postgres:15"

// DockerAvailable reports whether a Docker engine answers.
func DockerAvailable(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return false
	}
	defer p.Close()
	return p.Health(ctx) == nil
}

// StartContainer starts PostgreSQL with wal_level=logical in a Docker engine through
// testcontainers-go, with opts.Settings and opts.Log: image (zero: ContainerImage), which takes the official postgres
// image's POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB and runs `postgres -c ...`. The engine
// is the one testcontainers-go finds (DOCKER_HOST first). On an engine without a bridge network
// (one StartEngine started) the container runs on the host's network, listening on 127.0.0.1 on a
// free port, and the engine's default network is not touched. Restart is not supported for it.
func StartContainer(ctx context.Context, opts Options, image string) (*Server, error) {
	return startContainerThen(ctx, opts, image, nil)
}

// startContainerThen is StartContainer with then run after the container's removal when the
// server stops.
func startContainerThen(ctx context.Context, opts Options, image string, then func(context.Context) error) (*Server, error) {
	if image == "" {
		image = ContainerImage
	}
	bridge, err := engineHasBridge(ctx)
	if err != nil {
		return nil, fmt.Errorf("start postgres container: %w", err)
	}
	if bridge {
		return startContainer(ctx, opts, image, 5432, false, then)
	}
	// A port found free can be taken before the server binds it: try a few.
	for attempt := 0; ; attempt++ {
		port, err := pgserver.FreePort()
		if err != nil {
			return nil, err
		}
		s, err := startContainer(ctx, opts, image, port, true, then)
		if err == nil || attempt == 2 || ctx.Err() != nil {
			return s, err
		}
	}
}

func startContainer(ctx context.Context, opts Options, image string, port int, hostNetwork bool, then func(context.Context) error) (*Server, error) {
	password := randomHex(16)
	args := []string{"postgres"}
	for k, v := range pgserver.DefaultSettings() {
		if k == "listen_addresses" || k == "unix_socket_permissions" {
			continue
		}
		args = append(args, "-c", k+"="+v)
	}
	network := "bridge"
	if hostNetwork {
		network = "host"
		args = append(args, "-c", "listen_addresses=127.0.0.1", "-c", "port="+strconv.Itoa(port))
	}
	for k, v := range opts.Settings {
		args = append(args, "-c", k+"="+v)
	}
	tcp := strconv.Itoa(port) + "/tcp"
	req := testcontainers.ContainerRequest{
		Image:        image,
		Env:          map[string]string{"POSTGRES_USER": "postgres", "POSTGRES_PASSWORD": password, "POSTGRES_DB": "postgres"},
		Cmd:          args,
		ExposedPorts: []string{tcp},
		WaitingFor:   wait.ForListeningPort(tcp).WithStartupTimeout(2 * time.Minute),
	}
	if hostNetwork {
		req.HostConfigModifier = func(hc *container.HostConfig) { hc.NetworkMode = "host" }
		// The container's port is this host's: testcontainers-go must look for it here, not at a
		// gateway it guesses when it finds itself in a container (/.dockerenv).
		if _, ok := os.LookupEnv("TESTCONTAINERS_HOST_OVERRIDE"); !ok {
			if err := os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1"); err != nil {
				return nil, err
			}
		}
	}
	// The provider's default network is the one the container joins: with the host's network, no
	// network is made for it.
	p, err := testcontainers.NewDockerProvider(testcontainers.WithDefaultBridgeNetwork(network))
	if err != nil {
		return nil, fmt.Errorf("start postgres container: %w", err)
	}
	c, err := p.RunContainer(ctx, req)
	if err != nil {
		if c != nil {
			_ = testcontainers.TerminateContainer(c)
		}
		_ = p.Close()
		return nil, fmt.Errorf("start postgres container (%s): %w", image, err)
	}
	terminate := func() error {
		err := testcontainers.TerminateContainer(c)
		_ = p.Close()
		return err
	}
	stop := func(ctx context.Context) error {
		err := terminate()
		if then != nil {
			err = errors.Join(err, then(ctx))
		}
		return err
	}
	host, err := c.Host(ctx)
	if err == nil {
		mp, perr := c.MappedPort(ctx, tcp)
		if err = perr; err == nil {
			s := pgserver.New(pgserver.Spec{Kind: Container, Host: host, Port: int(mp.Num()), User: "postgres", Password: password,
				AdminDB: "postgres", Log: opts.Log, Stop: stop})
			opts.Log.Info().Str("image", image).Str("network", network).Int("port", s.Port()).Msg("postgres container started")
			return s, nil
		}
	}
	_ = terminate()
	return nil, fmt.Errorf("find postgres container's address: %w", err)
}

// engineHasBridge reports whether the engine testcontainers-go finds has the default bridge
// network.
func engineHasBridge(ctx context.Context) (bool, error) {
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return false, err
	}
	defer p.Close()
	_, err = p.Client().NetworkInspect(ctx, "bridge", client.NetworkInspectOptions{})
	if err == nil {
		return true, nil
	}
	list, lerr := p.Client().NetworkList(ctx, client.NetworkListOptions{})
	if lerr != nil {
		return false, fmt.Errorf("list the Docker engine's networks: %w", lerr)
	}
	for _, n := range list.Items {
		if n.Name == "bridge" {
			return true, nil
		}
	}
	return false, nil
}

// EnvDSN names the environment variable that points the harness at an external server.
const EnvDSN = "TIDEMARK_TEST_DSN"

// EnvServer names the environment variable that chooses the kind of server when EnvDSN is unset:
// "local" (the installed binaries only), "container" (a container only: the image
// $TIDEMARK_TEST_PG_IMAGE, else ContainerImage, pulled by the engine if it lacks it),
// "container-debian" (a container of DebianImage, built here first from Debian's packages, for
// engines that reach no registry). Unset: a local cluster, else a container when an engine answers.
// For the container kinds the engine is StartEngine's: one that answers, or one started here.
const EnvServer = "TIDEMARK_TEST_SERVER"

// EnvImage names the environment variable with the image of the container server kind.
const EnvImage = "TIDEMARK_TEST_PG_IMAGE"

// StartFromEnv finds a server the way the test suite does: the external server named by
// $TIDEMARK_TEST_DSN; else the kind $TIDEMARK_TEST_SERVER names; else a local cluster from the
// installed binaries, else a container when a Docker engine answers. The error says what was
// tried.
func StartFromEnv(ctx context.Context, log zerolog.Logger) (*Server, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return Connect(ctx, dsn, log)
	}
	opts := Options{Log: log, Settings: sharedSettings()}
	switch kind := os.Getenv(EnvServer); kind {
	case "":
	case "local":
		return Start(ctx, opts)
	case "container", "container-debian":
		return startContainerFromEnv(ctx, kind, log)
	default:
		return nil, fmt.Errorf("%s=%q: use local, container or container-debian", EnvServer, kind)
	}
	s, localErr := Start(ctx, opts)
	if localErr == nil {
		return s, nil
	}
	if DockerAvailable(ctx) {
		s, err := StartContainer(ctx, opts, os.Getenv(EnvImage))
		if err == nil {
			return s, nil
		}
		return nil, errors.Join(localErr, err)
	}
	return nil, fmt.Errorf("no PostgreSQL for the tests: set %s to a server with wal_level=logical, "+
		"or install the server binaries, or run a Docker engine: %w", EnvDSN, localErr)
}

// sharedSettings are the settings of a package's shared test server beyond the defaults: no
// checkpoint during a test run, neither by WAL volume nor by time. A checkpoint that ended just
// after a test created its slot once removed the WAL segment the slot had reserved, and the
// test's second run from an earlier position failed with "requested WAL segment ... has already
// been removed" (PostgreSQL 15.18; a server-side race in the slots' minimum LSN, with many slots
// made side by side: docs/testing.md). Tests of checkpoints and WAL removal start servers of
// their own with the settings they need.
func sharedSettings() map[string]string {
	return map[string]string{"max_wal_size": "16GB", "checkpoint_timeout": "1d"}
}

// startContainerFromEnv starts a container server in StartEngine's engine. testcontainers-go
// reads DOCKER_HOST and TESTCONTAINERS_RYUK_DISABLED once per process, so they are set before it
// is first used: the engine's address, and no reaper for an engine started here (its image comes
// from a registry, and the engine, with its containers, stops with the server).
func startContainerFromEnv(ctx context.Context, kind string, log zerolog.Logger) (*Server, error) {
	eng, err := StartEngine(ctx, log)
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w", EnvServer, kind, err)
	}
	fail := func(err error) (*Server, error) {
		_ = eng.Stop(context.Background())
		return nil, fmt.Errorf("%s=%s: %w", EnvServer, kind, err)
	}
	if err := os.Setenv("DOCKER_HOST", eng.Host); err != nil {
		return fail(err)
	}
	if eng.Started && os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		if err := os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true"); err != nil {
			return fail(err)
		}
	}
	image := os.Getenv(EnvImage)
	if kind == "container-debian" {
		image = DebianImage
		if err := eng.PostgresImage(ctx, image); err != nil {
			return fail(err)
		}
	}
	s, err := startContainerThen(ctx, Options{Log: log, Settings: sharedSettings()}, image, eng.Stop)
	if err != nil {
		return fail(err)
	}
	return s, nil
}

// EnvLong, set to 1, runs the long tests too: the chaos harness's whole matrix (every break in
// every mode, a fixed seed beside the random one). The default run keeps every package within
// its budget (README: under 300 s each on a quiet machine).
const EnvLong = "TIDEMARK_TEST_LONG"

// Long reports whether the long tests run (EnvLong).
func Long() bool { return os.Getenv(EnvLong) == "1" }

// InCI reports whether the CI environment variable says this is a CI run, where the suite must
// fail rather than skip when it has no PostgreSQL.
func InCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
