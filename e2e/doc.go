// Package e2e implements the real-PostgreSQL machinery of Tidemark's tests and holds the
// end-to-end scenarios as its tests. It imports `testing`, testcontainers-go and a Docker client,
// so nothing the products link imports it: the server launcher is internal/pgserver (which this
// package re-exports as Server, Start, Options and so on, for the tests) and the oracle with the
// JSON lines reader is chaos/oracle (re-exported as Record, Oracle, Diff and so on).
//
// # Servers
//
// A Server is a PostgreSQL with wal_level = logical. StartFromEnv, which the test suite uses
// through Main, picks one:
//
//  1. an external server when $TIDEMARK_TEST_DSN names one (its role must be able to create
//     databases and replication slots; nothing is started or stopped);
//  2. otherwise the kind $TIDEMARK_TEST_SERVER names, when set: "local", "container" (the image
//     $TIDEMARK_TEST_PG_IMAGE, postgres:15 by default) or "container-debian" (an image built here
//     first, PostgreSQL 15 from Debian's packages on a debootstrapped Debian, for an engine that
//     reaches no registry), the containers in StartEngine's engine;
//  3. otherwise a throwaway local cluster (Start, internal/pgserver's) made with initdb from the
//     installed server binaries and run on a free loopback port, as the `postgres` OS user when
//     the process is root (PostgreSQL refuses to run as root), with scram-sha-256 password
//     authentication on TCP;
//  4. otherwise a testcontainers-go container (StartContainer) when a Docker engine answers.
//
// In CI (CI=true), or when $TIDEMARK_TEST_SERVER names a kind, a suite with no server fails;
// elsewhere its tests are skipped with the reason.
//
// A local cluster's postmaster dies with the process that started it, and the next Start removes
// directories that dead processes left behind (internal/pgserver).
//
// # Isolation
//
// One server per test package (from TestMain). Each test gets a database of its own (NewTestDB,
// named from a hash of the test's name) with its own slot and publication names; the database is
// dropped with its slots when the test ends, passed or failed. Replication slots and publications
// are per database, so tests cannot see each other's changes.
//
// So most of this package's tests call t.Parallel and run two at a time (the package waits more
// than it computes), after the others. A test stays serial when it changes what every database of
// the server sees (ALTER SYSTEM: synchronous_standby_names, TimeZone), ends other sessions,
// sets the process's environment (t.Setenv), measures the whole test process (its heap), waits
// for the server's own periodic records (a slot's restart_lsn advancing), or races a watch of a
// few hundred milliseconds that a loaded neighbour could make it miss. A test that holds a
// transaction open delays every slot created on the server meanwhile: keep that short, or the
// test serial.
//
// # Docker
//
// StartEngine finds a Docker engine: $DOCKER_HOST's, the system's, or, as root with Debian's
// docker.io installed, a private dockerd it starts with everything under a new directory in /tmp,
// no bridge network and no iptables rules, so that containers run on the host's network and
// nothing is reachable but this machine. StartContainer runs PostgreSQL there through
// testcontainers-go: on an engine without a bridge, on the host's network on a free loopback port
// (the engine's networks untouched); the reaper (Ryuk) is off for an engine started here, which
// stops with its containers when the server stops. The engine also builds images from parts made
// on this machine (BusyboxImage, PostgresImage), which the connector's image test uses:
//
//	TIDEMARK_TEST_SERVER=container-debian go test -count=1 ./e2e
//
// runs this package's scenarios against such a container.
package e2e
