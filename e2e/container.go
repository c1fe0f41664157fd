package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/rs/zerolog"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"
)

// ContainerImage is the image StartContainer runs.
const ContainerImage = "postgres:15"

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
// testcontainers-go. Restart is not supported for it.
func StartContainer(ctx context.Context, opts Options) (*Server, error) {
	password := randomHex(16)
	args := []string{"postgres"}
	for k, v := range defaultSettings {
		if k == "listen_addresses" || k == "unix_socket_permissions" {
			continue
		}
		args = append(args, "-c", k+"="+v)
	}
	for k, v := range opts.Settings {
		args = append(args, "-c", k+"="+v)
	}
	c, err := tcpostgres.Run(ctx, ContainerImage,
		tcpostgres.WithDatabase("postgres"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword(password),
		testcontainers.WithCmd(args...),
		testcontainers.WithWaitStrategy(wait.ForListeningPort("5432/tcp").WithStartupTimeout(2*time.Minute)),
	)
	if err != nil {
		if c != nil {
			_ = testcontainers.TerminateContainer(c)
		}
		return nil, fmt.Errorf("start postgres container: %w", err)
	}
	host, err := c.Host(ctx)
	if err == nil {
		p, perr := c.MappedPort(ctx, "5432/tcp")
		if err = perr; err == nil {
			s := &Server{kind: Container, host: host, port: int(p.Num()), user: "postgres", password: password, adminDB: "postgres", log: opts.Log}
			s.stop = func(context.Context) error { return testcontainers.TerminateContainer(c) }
			return s, nil
		}
	}
	_ = testcontainers.TerminateContainer(c)
	return nil, fmt.Errorf("find postgres container's address: %w", err)
}

// EnvDSN names the environment variable that points the harness at an external server.
const EnvDSN = "TIDEMARK_TEST_DSN"

// StartFromEnv finds a server the way the test suite does: the external server named by
// $TIDEMARK_TEST_DSN; else a local cluster from the installed binaries; else a container when a
// Docker engine answers. The error says what was tried.
func StartFromEnv(ctx context.Context, log zerolog.Logger) (*Server, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return Connect(ctx, dsn, log)
	}
	s, localErr := Start(ctx, Options{Log: log})
	if localErr == nil {
		return s, nil
	}
	if DockerAvailable(ctx) {
		s, err := StartContainer(ctx, Options{Log: log})
		if err == nil {
			return s, nil
		}
		return nil, errors.Join(localErr, err)
	}
	return nil, fmt.Errorf("no PostgreSQL for the tests: set %s to a server with wal_level=logical, "+
		"or install the server binaries, or run a Docker engine: %w", EnvDSN, localErr)
}

// InCI reports whether the CI environment variable says this is a CI run, where the suite must
// fail rather than skip when it has no PostgreSQL.
func InCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}
