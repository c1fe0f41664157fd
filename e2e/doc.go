// Package e2e implements the real-PostgreSQL machinery of Tidemark's tests, demo and chaos
// harness, and holds the end-to-end scenarios as its tests.
//
// # Servers
//
// A Server is a PostgreSQL with wal_level = logical. StartFromEnv, which the test suite uses
// through Main, picks one:
//
//  1. an external server when $TIDEMARK_TEST_DSN names one (its role must be able to create
//     databases and replication slots; nothing is started or stopped);
//  2. otherwise a throwaway local cluster (Start) made with initdb from the installed server
//     binaries and run on a free loopback port, as the `postgres` OS user when the process is
//     root (PostgreSQL refuses to run as root), with scram-sha-256 password authentication on TCP;
//  3. otherwise a testcontainers-go postgres container when a Docker engine answers.
//
// In CI (CI=true) a suite with no server fails; elsewhere its tests are skipped with the reason.
//
// A local cluster's postmaster is started with a parent-death signal from a goroutine that holds
// its OS thread until the postmaster exits, so a test binary that crashes or is killed takes its
// server with it; Stop removes the cluster's files, and the next Start removes directories that
// dead processes left behind.
//
// # Isolation
//
// One server per test package (from TestMain). Each test gets a database of its own (NewTestDB,
// named from a hash of the test's name) with its own slot and publication names; the database is
// dropped with its slots when the test ends, passed or failed. Replication slots and publications
// are per database, so tests cannot see each other's changes.
package e2e
