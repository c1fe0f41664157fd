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
	hostKey, err := hostKeyCallback(t.KnownHost, log)
	if err != nil {
		return nil, err
	}
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

// hostKeyCallback checks the jump server's host key against known (a known_hosts line, or the
// key alone), or accepts any key and logs its fingerprint when known is empty.
func hostKeyCallback(known string, log zerolog.Logger) (ssh.HostKeyCallback, error) {
	if known == "" {
		return func(host string, _ net.Addr, key ssh.PublicKey) error {
			log.Warn().Str("tunnel_host", host).Str("fingerprint", ssh.FingerprintSHA256(key)).
				Msg("SSH host key accepted without verification; set tunnel_known_host to pin it")
			return nil
		}, nil
	}
	var want ssh.PublicKey
	rest := []byte(known)
	for len(rest) > 0 && want == nil {
		var err error
		_, _, want, _, rest, err = ssh.ParseKnownHosts(rest)
		if err != nil {
			break
		}
	}
	if want == nil {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(known))
		if err != nil {
			return nil, configErrorf("tunnel_known_host is not a known_hosts line or a public key (for example \"ssh-ed25519 AAAA...\")")
		}
		want = k
	}
	return func(host string, _ net.Addr, key ssh.PublicKey) error {
		if key.Type() != want.Type() || !bytes.Equal(key.Marshal(), want.Marshal()) {
			return fmt.Errorf("the SSH server %s presented host key %s, not the one in tunnel_known_host (%s)", host, ssh.FingerprintSHA256(key), ssh.FingerprintSHA256(want))
		}
		return nil
	}, nil
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
		if strings.Contains(err.Error(), "tunnel_known_host") {
			return nil, configErrorf("SSH tunnel host %s: %s", t.addr, lastCause(err))
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
