package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark/tidemark/e2e"
	"github.com/tidemark/tidemark/internal/sqlfix"
)

// randomPassword is 32 characters with a space, a quote, a double quote and a backslash among
// them, no character twice in a row.
func randomPassword() string {
	const letters = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
	b := []byte{' ', '\'', '"', '\\'}
	for len(b) < 32 {
		b = append(b, letters[rand.IntN(len(letters))])
	}
	for {
		rand.Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
		ok := b[0] != ' ' && b[len(b)-1] != ' '
		for i := 1; i < len(b); i++ {
			ok = ok && b[i] != b[i-1]
		}
		if ok {
			return string(b)
		}
	}
}

// leaks returns the pieces of 6 characters of secret that text holds.
func leaks(secret, text string) []string {
	var out []string
	for i := 0; i+6 <= len(secret); i++ {
		if strings.Contains(text, secret[i:i+6]) {
			out = append(out, secret[i:i+6])
		}
	}
	return out
}

// TestNoSecretInOutput: the product binaries, as a user runs them, with a connection string
// holding a random 32-character password with spaces, quotes and backslashes in it, given by
// flag and by $TIDEMARK_SOURCE, in every failure a first hour meets (a connection string that
// does not parse, a server that is not there, a database that does not exist, a table, slot or
// checkpoint that does not exist, a usage error, -h): no piece of 6 characters of the password is
// in what any of them prints. The connector likewise, its password in its config.
func TestNoSecretInOutput(t *testing.T) {
	t.Parallel() // a long test: beside the others, after the serial ones (docs/testing.md)
	e2e.NeedsLocal(t, server, "it makes a role with a password on the server the tests started")
	db := e2e.NewTestDB(t, server)
	db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	pw := randomPassword()
	role := "pw_" + db.Name
	db.Exec(`CREATE ROLE ` + role + ` LOGIN SUPERUSER PASSWORD ` + sqlfix.Literal(pw))
	t.Cleanup(func() { db.Exec(`DROP ROLE ` + role) })
	cfg, err := pgx.ParseConfig(db.DSN)
	require.NoError(t, err)
	host, port := cfg.Host, int(cfg.Port)
	kvQuoted := func(p int, dbname string) string {
		return fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s sslmode=disable", host, p, role,
			"'"+strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw)+"'", dbname)
	}
	kvEscaped := func(p int, dbname string) string {
		return fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s sslmode=disable", host, p, role,
			strings.NewReplacer(`\`, `\\`, `'`, `\'`, ` `, `\ `).Replace(pw), dbname)
	}
	asURL := func(p int, dbname string) string {
		return fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", role, url.PathEscape(pw), host, p, dbname)
	}
	// A check that the role and its password work at all: the cases below fail for their own
	// reasons, not for a wrong password.
	c, err := pgx.Connect(context.Background(), kvQuoted(port, db.Name))
	require.NoError(t, err, "the test's role and password")
	c.Close(context.Background())

	dir := t.TempDir()
	bin, conn := filepath.Join(dir, "tidemark"), filepath.Join(dir, "source-postgres")
	for b, pkg := range map[string]string{bin: ".", conn: "../source-postgres"} {
		require.NoError(t, e2e.GoBuild(b, pkg, ""))
	}
	free := closedPort(t)
	dsns := map[string]string{
		"no such database": kvQuoted(port, "nope_"+db.Name),
		"no server":        kvEscaped(free, db.Name),
		"does not parse":   kvEscaped(port, db.Name) + " dbname='unterminated",
		"URL, bad sslmode": asURL(port, db.Name) + "&sslmode=bogus",
		"URL, no server":   asURL(free, db.Name),
		"valid":            kvQuoted(port, db.Name),
		"valid URL":        asURL(port, db.Name),
	}
	run := func(t *testing.T, name string, env []string, args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Dir = dir
		out, _ := cmd.CombinedOutput()
		return string(out)
	}
	check := func(t *testing.T, what, out string) {
		t.Helper()
		require.Empty(t, leaks(pw, out), "%s printed pieces of the password:\n%s", what, out)
	}
	for _, c := range commands {
		for kind, dsn := range dsns {
			var args []string
			switch c.name {
			case "demo", "bench":
				args = []string{c.name, "--rows", "nope"} // a usage error, with the password in the environment
			case "sync":
				args = []string{c.name, "--tables", "public.nope", "--to", filepath.Join(dir, "out.jsonl"), "--stop-when-caught-up", "--quiet"}
			case "doctor", "schema":
				args = []string{c.name, "--tables", "public.nope"}
			case "verify":
				args = []string{c.name, "--tables", "public.nope"} // --to from $TIDEMARK_TARGET
			case "status":
				args = []string{c.name, "--slot", "nope_slot"}
			case "cleanup":
				args = []string{c.name, "--slot", "nope_slot", "--yes"}
			case "rebackfill":
				args = []string{c.name, "--slot", "nope_slot", "--tables", "public.nope"} // no sync answers
			case "stream":
				args = []string{c.name, "--slot", "nope_slot"}
			case "chaos":
				args = []string{c.name, "--mode", "jsonl", "--duration", "1s", "--rows", "10"}
			case "consume":
				args = []string{c.name, "--from", fmt.Sprintf("kafka://127.0.0.1:%d/shop", free), "--group", "g"} // --to from $TIDEMARK_TARGET
			default:
				t.Fatalf("no case for command %q: add one", c.name)
			}
			t.Run(c.name+"/"+kind, func(t *testing.T) {
				env := []string{"TIDEMARK_SOURCE=" + dsn, "TIDEMARK_TARGET=" + dsn, "PGPASSWORD=" + pw}
				if c.name != "chaos" {
					check(t, "tidemark "+c.name+" with $TIDEMARK_SOURCE", run(t, bin, env, args...))
				}
				help := run(t, bin, env, c.name, "-h")
				check(t, "tidemark "+c.name+" -h", help)
				// Not even scrubbed: the connection strings are not printed as defaults at all.
				require.NotContains(t, help, db.Name, "tidemark %s -h prints $TIDEMARK_SOURCE or $TIDEMARK_TARGET", c.name)
				if strings.Contains(help, "-source DSN") {
					require.Contains(t, help, "$TIDEMARK_SOURCE (set)")
				}
				withFlag := append(append([]string{}, args...), "--source", dsn)
				if c.name == "status" {
					withFlag = append(withFlag, "--target", dsn)
				}
				check(t, "tidemark "+c.name+" --source", run(t, bin, nil, withFlag...))
			})
		}
	}
	check(t, "tidemark -h", run(t, bin, []string{"TIDEMARK_SOURCE=" + dsns["valid"]}, "-h"))
	check(t, "tidemark nope", run(t, bin, []string{"TIDEMARK_SOURCE=" + dsns["valid"]}, "nope", "--source", dsns["valid"]))

	// Kafka: the SASL password in the URL and in $TIDEMARK_KAFKA_PASSWORD, with a usage error,
	// no broker, and a broker that refuses the password.
	kf, err := kfake.NewCluster(kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "admin", "not-the-password"))
	require.NoError(t, err)
	defer kf.Close()
	for kind, to := range map[string]string{
		"usage error":      fmt.Sprintf("kafka://app:%s@127.0.0.1:%d/shop?sasl=plain", url.PathEscape(pw), free),
		"no broker":        fmt.Sprintf("kafka://app:%s@127.0.0.1:%d/shop?sasl=scram-sha-512", url.PathEscape(pw), free),
		"password refused": fmt.Sprintf("kafka://admin:%s@%s/shop?sasl=scram-sha-512", url.PathEscape(pw), kf.ListenAddrs()[0]),
		"password in env":  fmt.Sprintf("kafka://admin@%s/shop?sasl=scram-sha-512", kf.ListenAddrs()[0]),
	} {
		t.Run("kafka/"+kind, func(t *testing.T) {
			args := []string{"sync", "--source", dsns["valid"], "--tables", "public.t", "--to", to, "--stop-when-caught-up", "--quiet",
				"--slot", "pw_slot_" + db.Name, "--publication", "pw_pub_" + db.Name}
			out := run(t, bin, []string{"TIDEMARK_KAFKA_PASSWORD=" + pw}, args...)
			require.NotEmpty(t, out)
			check(t, "tidemark sync --to "+kind, out)
			out = run(t, bin, []string{"TIDEMARK_KAFKA_PASSWORD=" + pw}, "consume", "--from", to, "--to", dsns["valid"], "--group", "g")
			require.NotEmpty(t, out)
			check(t, "tidemark consume --from "+kind, out)
		})
	}

	// NATS: the password in the URL and in $TIDEMARK_NATS_PASSWORD, the token in
	// $TIDEMARK_NATS_TOKEN, with a usage error, no server, and a server that refuses them.
	nc, err := e2e.StartNATSCluster(t.TempDir(), 1, func(o *natsserver.Options) {
		o.Users = []*natsserver.User{{Username: "admin", Password: "not-the-password"}}
	})
	require.NoError(t, err)
	defer nc.Shutdown()
	natsAddr := nc.Addrs()[0]
	for kind, c := range map[string]struct{ to, env string }{
		"usage error":      {fmt.Sprintf("nats://app:%s@127.0.0.1:%d/shop?tls=maybe", url.PathEscape(pw), free), ""},
		"no server":        {fmt.Sprintf("nats://app:%s@127.0.0.1:%d/shop", url.PathEscape(pw), free), ""},
		"password refused": {fmt.Sprintf("nats://admin:%s@%s/shop", url.PathEscape(pw), natsAddr), ""},
		"password in env":  {fmt.Sprintf("nats://admin@%s/shop", natsAddr), "TIDEMARK_NATS_PASSWORD=" + pw},
		"token in env":     {fmt.Sprintf("nats://%s/shop", natsAddr), "TIDEMARK_NATS_TOKEN=" + pw},
	} {
		t.Run("nats/"+kind, func(t *testing.T) {
			args := []string{"sync", "--source", dsns["valid"], "--tables", "public.t", "--to", c.to, "--stop-when-caught-up", "--quiet",
				"--slot", "pw_slot_" + db.Name, "--publication", "pw_pub_" + db.Name}
			var env []string
			if c.env != "" {
				env = append(env, c.env)
			}
			out := run(t, bin, env, args...)
			require.NotEmpty(t, out)
			check(t, "tidemark sync --to nats "+kind, out)
		})
	}

	// The connector: its password in the config, in the same failures.
	for kind, edit := range map[string]func(m map[string]any){
		"no such database": func(m map[string]any) { m["database"] = "nope_" + db.Name },
		"no server":        func(m map[string]any) { m["port"] = free },
		"bad params":       func(m map[string]any) { m["jdbc_url_params"] = "password=" + pw + "&connectTimeout=x" },
		"wrong user":       func(m map[string]any) { m["username"] = "nope_user" },
		"no slot":          func(m map[string]any) {},
	} {
		t.Run("connector/"+kind, func(t *testing.T) {
			m := map[string]any{"host": host, "port": port, "database": db.Name, "username": role, "password": pw,
				"schemas": []string{"public"}, "ssl_mode": map[string]any{"mode": "disable"},
				"replication_method": map[string]any{"method": "CDC", "replication_slot": "nope_slot", "publication": "nope_pub"}}
			edit(m)
			b, _ := json.Marshal(m)
			config := filepath.Join(t.TempDir(), "config.json")
			require.NoError(t, os.WriteFile(config, b, 0o600))
			catalog := filepath.Join(t.TempDir(), "catalog.json")
			require.NoError(t, os.WriteFile(catalog, []byte(`{"streams":[{"stream":{"name":"t","namespace":"public","json_schema":{},"supported_sync_modes":["incremental"]},"sync_mode":"incremental","destination_sync_mode":"append"}]}`), 0o600))
			for _, args := range [][]string{{"check", "--config", config}, {"discover", "--config", config}, {"read", "--config", config, "--catalog", catalog}} {
				check(t, "source-postgres "+args[0], run(t, conn, []string{"LOG_LEVEL=debug"}, args...))
			}
		})
	}
}

// closedPort is a local TCP port nothing listens on.
func closedPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return p
}

// TestRunSecrets: every secret a run can be given reaches the scrubber: the passwords of the
// connection strings in the environment and the arguments, PGPASSWORD, and PGSSLPASSWORD (the
// client key's password, which a TLS error could quote).
func TestRunSecrets(t *testing.T) {
	t.Setenv("TIDEMARK_SOURCE", "host=a password=src-secret-1")
	t.Setenv("TIDEMARK_TARGET", "postgres://u:tgt-secret-2@b/db")
	t.Setenv("PGPASSWORD", "env-secret-3")
	t.Setenv("PGSSLPASSWORD", "key-secret-4")
	got := runSecrets([]string{"sync", "--source=host=c password=arg-secret-5", "--to", "postgres://u:arg-secret-6@d/db?sslpassword=arg-secret-7"})
	for _, want := range []string{"src-secret-1", "tgt-secret-2", "env-secret-3", "key-secret-4", "arg-secret-5", "arg-secret-6", "arg-secret-7"} {
		require.Contains(t, got, want)
	}
}
