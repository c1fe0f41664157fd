package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// tunnel is an SSH connection to a jump server through which every connection to the database
// is dialled (a direct-tcpip channel per connection). The database's host name is resolved by
// the jump server, and TLS (verify-full included) runs end to end through the channel.
type tunnel struct {
	wg     sync.WaitGroup // the copying goroutines of the connections
	mu     sync.Mutex
	cfg    *ssh.ClientConfig
	addr   string
	client *ssh.Client
	log    zerolog.Logger
}

// openTunnel connects to the jump server described by t; it fails early, with a message that
// says what to fix, when the server cannot be reached or refuses the credentials.
func openTunnel(ctx context.Context, t *tunnelMethod, log zerolog.Logger) (*tunnel, error) {
	var auth ssh.AuthMethod
	switch t.Method {
	case "SSH_KEY_AUTH":
		signer, err := ssh.ParsePrivateKey([]byte(t.SSHKey))
		if err != nil {
			var missing *ssh.PassphraseMissingError
			if errors.As(err, &missing) {
				return nil, configErrorf("tunnel_method ssh_key is protected by a passphrase; give a key without one")
			}
			return nil, configErrorf("tunnel_method ssh_key is not a private key in PEM or OpenSSH format (RSA, ECDSA or Ed25519)")
		}
		auth = ssh.PublicKeys(signer)
	case "SSH_PASSWORD_AUTH":
		auth = ssh.Password(t.Password)
	}
	keys, err := parseKnownHosts(t.KnownHost)
	if err != nil {
		return nil, err
	}
	keys.acceptUnknown = t.AcceptUnknownHostKey
	hostKey := keys.callback(log)
	tun := &tunnel{
		cfg: &ssh.ClientConfig{
			User:            t.User,
			Auth:            []ssh.AuthMethod{auth},
			HostKeyCallback: hostKey,
			Timeout:         30 * time.Second,
		},
		addr: net.JoinHostPort(t.Host, strconv.Itoa(t.portNumber)),
		log:  log,
	}
	if _, err := tun.connect(ctx); err != nil {
		return nil, err
	}
	return tun, nil
}

// hostKeys is what tunnel_known_host says about host keys, with tunnel_accept_unknown_host_key.
type hostKeys struct {
	pinned        []ssh.PublicKey // accepted; when there are any, no other key is
	revoked       []ssh.PublicKey // refused always (@revoked)
	acceptUnknown bool            // accept any key when none is pinned (trust on first use)
}

// parseKnownHosts reads tunnel_known_host: known_hosts lines ("host ssh-ed25519 AAAA..."),
// optionally marked @revoked, or bare public keys ("ssh-ed25519 AAAA..."), one per line; blank
// lines and # comments are skipped. The host patterns of a line are not matched: the config
// names one jump server, and every key listed is about it.
func parseKnownHosts(known string) (*hostKeys, error) {
	var k hostKeys
	for i, line := range strings.Split(known, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		marker := ""
		if strings.HasPrefix(line, "@") {
			marker, line, _ = strings.Cut(line, " ")
			line = strings.TrimSpace(line)
		}
		key, err := parseHostKeyLine(line)
		if err != nil {
			return nil, configErrorf("tunnel_known_host line %d is not a known_hosts line or a public key (for example \"ssh-ed25519 AAAA...\")", i+1)
		}
		switch marker {
		case "":
			k.pinned = append(k.pinned, key)
		case "@revoked":
			k.revoked = append(k.revoked, key)
		default:
			return nil, configErrorf("tunnel_known_host line %d: %s lines are not supported; give the jump server's host key itself", i+1, marker)
		}
	}
	return &k, nil
}

// parseHostKeyLine parses a known_hosts entry without its marker, or a bare public key.
func parseHostKeyLine(line string) (ssh.PublicKey, error) {
	if _, _, key, _, _, err := ssh.ParseKnownHosts([]byte(line)); err == nil {
		return key, nil
	}
	key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
	return key, err
}

// hostKeyError is a jump server presenting a host key the config does not accept: the key is
// revoked, another key is pinned (it changed, or this is not the server), or no key is pinned
// and trust on first use is off. The user must act, so it is a config_error.
type hostKeyError struct {
	host    string          // host:port, as dialled
	key     ssh.PublicKey   // the key presented
	revoked bool            // listed @revoked
	pinned  []ssh.PublicKey // the keys tunnel_known_host accepts; empty: the key is unknown
}

func (e *hostKeyError) Error() string {
	fp := ssh.FingerprintSHA256(e.key)
	switch {
	case e.revoked:
		return fmt.Sprintf("the SSH server %s presented host key %s, which tunnel_known_host lists as @revoked: it is refused; find out why the jump server uses it", e.host, fp)
	case len(e.pinned) > 0:
		var want []string
		for _, k := range e.pinned {
			want = append(want, ssh.FingerprintSHA256(k))
		}
		return fmt.Sprintf("the SSH server %s presented host key %s, not the one in tunnel_known_host (%s): the jump server's key changed, or another server answers; "+
			"if its administrator confirms the new key, put this line in tunnel_known_host:\n  %s", e.host, fp, strings.Join(want, ", "), e.line())
	}
	return fmt.Sprintf("the SSH server %s presented host key %s, and tunnel_known_host does not list it: check the fingerprint with the jump server's administrator "+
		"(ssh-keygen -lf on its host key), then put this line in tunnel_known_host:\n  %s\n"+
		"(or set tunnel_accept_unknown_host_key to trust whatever key it presents, which lets anyone on the path pose as it)", e.host, fp, e.line())
}

// line is the known_hosts line that pins the key presented.
func (e *hostKeyError) line() string {
	return knownhosts.Line([]string{knownhosts.Normalize(e.host)}, e.key)
}

// callback checks the key a jump server presents against k. A revoked key is refused always;
// with keys pinned, only those are accepted; with none, the key is accepted only when trust on
// first use is on, and then logged with the line that pins it.
func (k *hostKeys) callback(log zerolog.Logger) ssh.HostKeyCallback {
	same := func(a, b ssh.PublicKey) bool { return a.Type() == b.Type() && bytes.Equal(a.Marshal(), b.Marshal()) }
	return func(host string, _ net.Addr, key ssh.PublicKey) error {
		for _, r := range k.revoked {
			if same(r, key) {
				return &hostKeyError{host: host, key: key, revoked: true}
			}
		}
		for _, p := range k.pinned {
			if same(p, key) {
				return nil
			}
		}
		if len(k.pinned) > 0 || !k.acceptUnknown {
			return &hostKeyError{host: host, key: key, pinned: k.pinned}
		}
		line := (&hostKeyError{host: host, key: key}).line()
		log.Warn().Str("tunnel_host", host).Str("fingerprint", ssh.FingerprintSHA256(key)).Str("known_host", line).
			Msg("SSH host key accepted without verification (tunnel_accept_unknown_host_key); pin it by putting known_host in tunnel_known_host")
		return nil
	}
}

// connect returns the SSH client, connecting (again, after a failure) when needed.
func (t *tunnel) connect(ctx context.Context) (*ssh.Client, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.client != nil {
		return t.client, nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return nil, &tunnelError{fmt.Errorf("connect to the SSH tunnel host %s: %w", t.addr, err)}
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(t.cfg.Timeout))
	}
	c, chans, reqs, err := ssh.NewClientConn(conn, t.addr, t.cfg)
	if err != nil {
		conn.Close()
		if isSSHAuthFailure(err) {
			return nil, configErrorf("the SSH tunnel host %s refused user %q: check tunnel_user and its key or password", t.addr, t.cfg.User)
		}
		var hk *hostKeyError
		if errors.As(err, &hk) {
			return nil, &configError{hk}
		}
		return nil, &tunnelError{fmt.Errorf("SSH handshake with %s: %w", t.addr, err)}
	}
	_ = conn.SetDeadline(time.Time{})
	t.client = ssh.NewClient(c, chans, reqs)
	client := t.client
	t.wg.Add(1)
	go func() {
		// The SSH connection's owner: when it ends, the next dial connects again.
		defer t.wg.Done()
		_ = client.Wait()
		t.mu.Lock()
		if t.client == client {
			t.client = nil
		}
		t.mu.Unlock()
	}()
	t.log.Info().Str("tunnel", t.addr).Msg("SSH tunnel open")
	return t.client, nil
}

func isSSHAuthFailure(err error) bool {
	return err != nil && strings.Contains(err.Error(), "unable to authenticate")
}

// tunnelError is a failure to reach the jump server: transient, the platform retries.
type tunnelError struct{ err error }

func (e *tunnelError) Error() string { return e.err.Error() }
func (e *tunnelError) Unwrap() error { return e.err }

// dial opens a channel to addr (the database's host and port, resolved by the jump server).
func (t *tunnel) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	c, err := t.connect(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := c.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("open a channel to %s through the SSH tunnel: %w", addr, err)
	}
	// An SSH channel has no deadlines, which the replication connection needs: the connection
	// handed out is one end of a pipe, and two goroutines copy between the other end and the
	// channel until either side closes.
	local, remote := net.Pipe()
	t.wg.Add(2)
	go func() {
		defer t.wg.Done()
		_, _ = io.Copy(remote, ch)
		remote.Close()
	}()
	go func() {
		defer t.wg.Done()
		_, _ = io.Copy(ch, remote)
		ch.Close()
	}()
	return local, nil
}

// configure makes a connection go through the tunnel.
func (t *tunnel) configure(cfg *pgconn.Config) {
	cfg.DialFunc = t.dial
	cfg.LookupFunc = func(_ context.Context, host string) ([]string, error) { return []string{host}, nil }
}

// Close ends the SSH connection, and with it every connection through it.
func (t *tunnel) Close() error {
	t.mu.Lock()
	var err error
	if t.client != nil {
		err = t.client.Close()
		t.client = nil
	}
	t.mu.Unlock()
	t.wg.Wait()
	return err
}
