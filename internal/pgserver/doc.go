// Package pgserver starts and stops throwaway PostgreSQL servers with wal_level = logical, for
// the demo, the benchmarks, the chaos harness and the tests (which reach it through the e2e
// package). It links no test code: the `tidemark` binary uses it.
//
// # Servers
//
// Start makes a local cluster with initdb from the installed server binaries (FindBinDir:
// `pg_config --bindir`, the newest /usr/lib/postgresql/*/bin, the PATH) and runs it on a free
// loopback port, as the `postgres` OS user when the process is root (PostgreSQL refuses to run as
// root), with scram-sha-256 password authentication on TCP and fsync off. Connect uses an
// external server that a connection string names (its role must be able to create databases and
// replication slots; nothing is started or stopped). New wraps a server another launcher started:
// the e2e package's Docker containers, which stay on the test side so that the product links
// neither testcontainers-go nor a Docker client.
//
// A local cluster's postmaster is started with a parent-death signal from a goroutine that holds
// its OS thread until the postmaster exits, so a process that crashes or is killed takes its
// server with it; Stop removes the cluster's files, and the next Start removes directories that
// dead processes left behind. Restart stops a local cluster (cleanly or as a crash would) and
// starts it again on the same port.
//
// A Server creates and drops databases (DropDatabase ends their sessions and drops their
// replication slots first) and gives connection strings for them (DSN, UserDSN).
package pgserver
