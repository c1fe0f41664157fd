package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/tidemark/tidemark/e2e"
)

// TLS (every ssl_mode, client certificates) and the SSH tunnel (key and password), against a
// server with SSL on and an SSH server in the test.

type certs struct {
	caPEM, otherCAPEM         string
	serverCert, serverKey     string // files
	caFile                    string
	clientCert, clientKey     string // PEM
	clientKeyEncrypted, keyPW string
}

func pemOf(typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

// makeCerts makes a CA, a server certificate for "localhost" only (so verify-full to
// 127.0.0.1 fails and to localhost succeeds) and a client certificate, in dir.
func makeCerts(t *testing.T, dir, clientCN string) *certs {
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		require.NoError(t, err)
		cert, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		return cert, key, pemOf("CERTIFICATE", der)
	}
	ca, caKey, caPEM := newCA("tidemark test CA")
	_, _, otherPEM := newCA("another CA")
	leaf := func(cn string, dns []string, usage x509.ExtKeyUsage) (string, string, *ecdsa.PrivateKey) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		require.NoError(t, err)
		kder, err := x509.MarshalECPrivateKey(key)
		require.NoError(t, err)
		return pemOf("CERTIFICATE", der), pemOf("EC PRIVATE KEY", kder), key
	}
	c := &certs{caPEM: caPEM, otherCAPEM: otherPEM}
	sc, sk, _ := leaf("localhost", []string{"localhost"}, x509.ExtKeyUsageServerAuth)
	c.clientCert, c.clientKey, _ = leaf(clientCN, nil, x509.ExtKeyUsageClientAuth)
	// The client key encrypted with a password, as libpq's sslpassword reads it.
	block, _ := pem.Decode([]byte(c.clientKey))
	c.keyPW = "client-key-pw-" + strconv.Itoa(int(time.Now().UnixNano()%1000))
	//lint:ignore SA1019 an encrypted legacy (RFC 1423) PEM key is what libpq and pgx read with sslpassword, and what this test must give them
	enc, err := x509.EncryptPEMBlock(rand.Reader, block.Type, block.Bytes, []byte(c.keyPW), x509.PEMCipherAES256)
	require.NoError(t, err)
	c.clientKeyEncrypted = string(pem.EncodeToMemory(enc))
	c.serverCert, c.serverKey, c.caFile = filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"), filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(c.serverCert, []byte(sc), 0o644))
	require.NoError(t, os.WriteFile(c.serverKey, []byte(sk), 0o600))
	require.NoError(t, os.WriteFile(c.caFile, []byte(caPEM), 0o644))
	return c
}

// sslServer starts a local server with SSL on, requesting client certificates.
func sslServer(t *testing.T, clientCN string) (*e2e.Server, *certs) {
	e2e.NeedsLocal(t, server, "needs a local server to start with SSL on")
	dir, err := os.MkdirTemp("", "tidemark-ssl-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	c := makeCerts(t, dir, clientCN)
	if os.Geteuid() == 0 {
		// The server runs as the postgres user, which must own its key.
		u, err := user.Lookup("postgres")
		require.NoError(t, err)
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, f := range []string{c.serverCert, c.serverKey, c.caFile} {
			require.NoError(t, os.Chown(f, uid, gid))
		}
	}
	srv, err := e2e.Start(t.Context(), e2e.Options{Settings: map[string]string{
		"ssl": "on", "ssl_cert_file": c.serverCert, "ssl_key_file": c.serverKey, "ssl_ca_file": c.caFile,
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop(t.Context()) })
	return srv, c
}

// sslSeen runs a read whose heartbeat query records the connection's TLS state, and returns
// it: whether TLS was on, and the client certificate's subject.
func (e *env) sslSeen(t *testing.T) (bool, string) {
	e.db.Exec(`CREATE TABLE IF NOT EXISTS seen (ssl bool, client_dn text)`)
	e.db.Exec(`TRUNCATE seen`)
	e.cdc()["heartbeat_action_query"] = `INSERT INTO public.seen SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()`
	cat := e.catalog("public.t")
	e.read(cat, nil)
	var ssl bool
	var dn *string
	require.NoError(t, e.db.Conn.QueryRow(t.Context(), `SELECT ssl, client_dn FROM seen LIMIT 1`).Scan(&ssl, &dn))
	if dn == nil {
		return ssl, ""
	}
	return ssl, *dn
}

func TestSSLModes(t *testing.T) {
	srv, c := sslServer(t, "tidemark-client")
	e := newEnvOn(t, srv)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	e.db.Exec(`INSERT INTO t VALUES (1)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	e.secrets = append(e.secrets, c.keyPW)
	good := clone(e.cfg)
	set := func(host string, ssl map[string]any) {
		e.cfg = clone(good)
		e.cfg["host"], e.cfg["ssl_mode"] = host, ssl
	}

	// disable and allow (which tries without TLS first) connect without TLS to this server, which
	// accepts both.
	for _, mode := range []string{"disable", "allow"} {
		set("127.0.0.1", map[string]any{"mode": mode})
		on, _ := e.sslSeen(t)
		require.False(t, on, mode)
	}
	for _, mode := range []string{"prefer", "require"} {
		set("127.0.0.1", map[string]any{"mode": mode})
		on, _ := e.sslSeen(t)
		require.True(t, on, mode)
	}
	set("127.0.0.1", map[string]any{"mode": "verify-ca", "ca_certificate": c.caPEM})
	on, _ := e.sslSeen(t)
	require.True(t, on, "verify-ca")
	set("localhost", map[string]any{"mode": "verify-full", "ca_certificate": c.caPEM})
	on, _ = e.sslSeen(t)
	require.True(t, on, "verify-full with the certificate's name")

	// Client certificates, plain and with an encrypted key.
	set("localhost", map[string]any{"mode": "verify-full", "ca_certificate": c.caPEM, "client_certificate": c.clientCert, "client_key": c.clientKey})
	_, dn := e.sslSeen(t)
	require.Contains(t, dn, "tidemark-client")
	set("127.0.0.1", map[string]any{"mode": "verify-ca", "ca_certificate": c.caPEM, "client_certificate": c.clientCert,
		"client_key": c.clientKeyEncrypted, "client_key_password": c.keyPW})
	_, dn = e.sslSeen(t)
	require.Contains(t, dn, "tidemark-client")

	// What must fail, fails in check with a message that points at ssl_mode.
	for name, ssl := range map[string]struct {
		host string
		mode map[string]any
	}{
		"verify-full, wrong name": {"127.0.0.1", map[string]any{"mode": "verify-full", "ca_certificate": c.caPEM}},
		"verify-ca, other CA":     {"127.0.0.1", map[string]any{"mode": "verify-ca", "ca_certificate": c.otherCAPEM}},
	} {
		set(ssl.host, ssl.mode)
		status, msg := e.checkStatus()
		require.Equal(t, "FAILED", status, name)
		require.Contains(t, msg, "ssl_mode", name)
	}
}

// newEnvOn is newEnv on another server.
func newEnvOn(t *testing.T, srv *e2e.Server) *env {
	saved := server
	server = srv
	defer func() { server = saved }()
	return newEnv(t)
}

// sshServer is an SSH server that accepts one user by key or password and forwards
// direct-tcpip channels, as a bastion does.
type sshServer struct {
	addr     string
	hostKey  ssh.PublicKey
	channels int
	mu       sync.Mutex
}

func startSSHServer(t *testing.T, userName, password string, authorized ssh.PublicKey) *sshServer {
	_, hostPriv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	hostSigner, err := ssh.NewSignerFromKey(hostPriv)
	require.NoError(t, err)
	cfg := &ssh.ServerConfig{
		PasswordCallback: func(c ssh.ConnMetadata, pw []byte) (*ssh.Permissions, error) {
			if c.User() == userName && string(pw) == password {
				return nil, nil
			}
			return nil, fmt.Errorf("denied")
		},
		PublicKeyCallback: func(c ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
			if c.User() == userName && authorized != nil && string(k.Marshal()) == string(authorized.Marshal()) {
				return nil, nil
			}
			return nil, fmt.Errorf("denied")
		},
	}
	cfg.AddHostKey(hostSigner)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &sshServer{addr: ln.Addr().String(), hostKey: hostSigner.PublicKey()}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.serve(c, cfg)
			}()
		}
	})
	return s
}

func (s *sshServer) serve(c net.Conn, cfg *ssh.ServerConfig) {
	defer c.Close()
	conn, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	defer conn.Close()
	go ssh.DiscardRequests(reqs)
	var wg sync.WaitGroup
	defer wg.Wait()
	for nc := range chans {
		if nc.ChannelType() != "direct-tcpip" {
			_ = nc.Reject(ssh.UnknownChannelType, "only direct-tcpip")
			continue
		}
		var req struct {
			Host       string
			Port       uint32
			OriginHost string
			OriginPort uint32
		}
		if err := ssh.Unmarshal(nc.ExtraData(), &req); err != nil {
			_ = nc.Reject(ssh.ConnectionFailed, "bad request")
			continue
		}
		target, err := net.Dial("tcp", net.JoinHostPort(req.Host, strconv.Itoa(int(req.Port))))
		if err != nil {
			_ = nc.Reject(ssh.ConnectionFailed, err.Error())
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			target.Close()
			continue
		}
		s.mu.Lock()
		s.channels++
		s.mu.Unlock()
		go ssh.DiscardRequests(creqs)
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(ch, target)
			_ = ch.CloseWrite()
		}()
		go func() {
			defer wg.Done()
			_, _ = io.Copy(target, ch)
			_ = target.(*net.TCPConn).CloseWrite()
		}()
		go func() {
			<-time.After(5 * time.Minute)
			ch.Close()
			target.Close()
		}()
	}
}

func (s *sshServer) opened() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.channels
}

func TestSSHTunnel(t *testing.T) {
	e := ordersEnv(t, 100)
	_, clientPriv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	block, err := ssh.MarshalPrivateKey(clientPriv, "")
	require.NoError(t, err)
	keyPEM := string(pem.EncodeToMemory(block))
	signer, err := ssh.NewSignerFromKey(clientPriv)
	require.NoError(t, err)
	const tunnelPassword = "tunnel-password-77"
	bastion := startSSHServer(t, "jump", tunnelPassword, signer.PublicKey())
	host, port, _ := net.SplitHostPort(bastion.addr)
	p, _ := strconv.Atoi(port)
	e.secrets = append(e.secrets, tunnelPassword, keyPEM[40:100])
	// The database's address as the bastion sees it; from here the host is unreachable by name.
	e.cfg["host"] = "localhost"
	good := clone(e.cfg)

	e.cfg["tunnel_method"] = map[string]any{"tunnel_method": "SSH_KEY_AUTH", "tunnel_host": host, "tunnel_port": p, "tunnel_user": "jump", "ssh_key": keyPEM,
		"tunnel_known_host": string(ssh.MarshalAuthorizedKey(bastion.hostKey))}
	status, msg := e.checkStatus()
	require.Equal(t, "SUCCEEDED", status, msg)
	cat := e.catalog()
	before := bastion.opened()
	r := e.read(cat, nil)
	require.Len(t, r.records(), 100)
	require.Greater(t, bastion.opened(), before+1, "the read's connections, the replication one included, went through the tunnel")

	e.cfg = clone(good)
	e.cfg["tunnel_method"] = map[string]any{"tunnel_method": "SSH_PASSWORD_AUTH", "tunnel_host": host, "tunnel_port": p, "tunnel_user": "jump", "tunnel_user_password": tunnelPassword,
		"tunnel_known_host": knownhosts.Line([]string{knownhosts.Normalize(bastion.addr)}, bastion.hostKey)}
	e.db.Exec(`INSERT INTO orders VALUES (1000, 'x', 1)`)
	r = e.read(cat, r.lastState(t))
	require.Len(t, r.records(), 1)

	// A wrong password or host key fails the check with what to fix.
	e.cfg["tunnel_method"].(map[string]any)["tunnel_user_password"] = "wrong-tunnel-password"
	e.secrets = append(e.secrets, "wrong-tunnel-password")
	status, msg = e.checkStatus()
	require.Equal(t, "FAILED", status)
	require.Contains(t, msg, "refused user")
	_, otherHost, _ := ed25519.GenerateKey(rand.Reader)
	otherSigner, _ := ssh.NewSignerFromKey(otherHost)
	e.cfg["tunnel_method"].(map[string]any)["tunnel_user_password"] = tunnelPassword
	e.cfg["tunnel_method"].(map[string]any)["tunnel_known_host"] = string(ssh.MarshalAuthorizedKey(otherSigner.PublicKey()))
	status, msg = e.checkStatus()
	require.Equal(t, "FAILED", status)
	require.Contains(t, msg, "host key")
}

// TestSSHHostKeys: the bastion's host key is checked against tunnel_known_host. A key it does not
// list is refused with a config_error that gives the key's fingerprint and the exact line to
// paste, unless tunnel_accept_unknown_host_key asks to trust it; a key listed @revoked is
// refused always; a key other than the pinned one is refused even then.
func TestSSHHostKeys(t *testing.T) {
	e := ordersEnv(t, 10)
	cat := e.catalog()
	const tunnelPassword = "tunnel-password-88"
	bastion := startSSHServer(t, "jump", tunnelPassword, nil)
	host, port, _ := net.SplitHostPort(bastion.addr)
	p, _ := strconv.Atoi(port)
	e.secrets = append(e.secrets, tunnelPassword)
	e.cfg["host"] = "localhost"
	line := knownhosts.Line([]string{knownhosts.Normalize(bastion.addr)}, bastion.hostKey)
	bare := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(bastion.hostKey)))
	fingerprint := ssh.FingerprintSHA256(bastion.hostKey)
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	otherSigner, _ := ssh.NewSignerFromKey(otherPriv)
	other := knownhosts.Line([]string{knownhosts.Normalize(bastion.addr)}, otherSigner.PublicKey())
	tunnel := func(extra map[string]any) {
		m := map[string]any{"tunnel_method": "SSH_PASSWORD_AUTH", "tunnel_host": host, "tunnel_port": p, "tunnel_user": "jump", "tunnel_user_password": tunnelPassword}
		for k, v := range extra {
			m[k] = v
		}
		e.cfg["tunnel_method"] = m
	}

	// Unknown: refused, with what to paste.
	tunnel(nil)
	status, msg := e.checkStatus()
	require.Equal(t, "FAILED", status)
	require.Contains(t, msg, fingerprint)
	require.Contains(t, msg, line, "the known_hosts line to paste")
	require.Contains(t, msg, "tunnel_known_host")
	require.Contains(t, msg, "tunnel_accept_unknown_host_key")
	r := e.run("read", "--config", e.config(), "--catalog", cat)
	require.NotEqual(t, 0, r.code)
	errs := r.traces("ERROR")
	require.Len(t, errs, 1, r.stdout)
	require.Equal(t, "config_error", errs[0].str("trace", "error", "failure_type"), "the user must act: not retried")
	require.Empty(t, r.records())

	// Trusted on first use when asked; pinned by the line (or the bare key).
	tunnel(map[string]any{"tunnel_accept_unknown_host_key": true})
	status, msg = e.checkStatus()
	require.Equal(t, "SUCCEEDED", status, msg)
	for _, known := range []string{line, bare, "# the bastion\n\n" + line + "\n"} {
		tunnel(map[string]any{"tunnel_known_host": known})
		status, msg = e.checkStatus()
		require.Equal(t, "SUCCEEDED", status, "%q: %s", known, msg)
	}

	// Revoked: refused, whatever else the config says.
	for _, known := range []string{"@revoked " + line, line + "\n@revoked * " + bare, "@revoked " + bare} {
		tunnel(map[string]any{"tunnel_known_host": known, "tunnel_accept_unknown_host_key": true})
		status, msg = e.checkStatus()
		require.Equal(t, "FAILED", status, known)
		require.Contains(t, msg, "revoked", known)
		require.Contains(t, msg, fingerprint)
	}
	// Another key pinned: the server's key changed, which is never trusted on first use.
	tunnel(map[string]any{"tunnel_known_host": other, "tunnel_accept_unknown_host_key": true})
	status, msg = e.checkStatus()
	require.Equal(t, "FAILED", status)
	require.Contains(t, msg, fingerprint)
	require.Contains(t, msg, ssh.FingerprintSHA256(otherSigner.PublicKey()))
	// Markers it does not support are refused rather than misread as host keys.
	tunnel(map[string]any{"tunnel_known_host": "@cert-authority * " + bare})
	status, msg = e.checkStatus()
	require.Equal(t, "FAILED", status)
	require.Contains(t, msg, "@cert-authority")
}

// TestInlineKeysNotOnDisk: certificates and a client key given inline in the config stay in the
// connector's memory: a read killed with SIGKILL (which runs no cleanup) leaves no copy of the
// key under TMPDIR.
func TestInlineKeysNotOnDisk(t *testing.T) {
	srv, c := sslServer(t, "tidemark-client")
	e := newEnvOn(t, srv)
	e.db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	e.db.Exec(`INSERT INTO t SELECT generate_series(1, 10)`)
	e.db.Exec(`CREATE PUBLICATION ` + e.db.Publication + ` FOR TABLE t`)
	e.cfg["host"] = "localhost"
	e.cfg["ssl_mode"] = map[string]any{"mode": "verify-full", "ca_certificate": c.caPEM, "client_certificate": c.clientCert, "client_key": c.clientKey}
	tmp := t.TempDir()
	cmd := exec.Command(binPath, "read", "--config", e.config(), "--catalog", e.catalog("public.t"))
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	p := e.startCmd(cmd)
	require.Eventually(t, func() bool { return len(p.snapshot()) > 0 }, 30*time.Second, 20*time.Millisecond, "the read started")
	p.signal(syscall.SIGKILL)
	p.wait()
	var left []string
	require.NoError(t, filepath.Walk(tmp, func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			b, _ := os.ReadFile(path)
			if bytes.Contains(b, []byte("PRIVATE KEY")) {
				left = append(left, path)
			}
		}
		return nil
	}))
	require.Empty(t, left, "the client key was written to disk and left there")
}
