package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// inlineTLS is what ssl_mode gives inline: a CA certificate to verify the server with
// (verify-ca, verify-full), and a client certificate and key. It is kept in memory and applied
// to each connection's TLS configuration after its connection string is parsed: nothing is
// written to disk, where a killed run would leave the key (libpq, and pgx's parser, read these
// from files only).
//
// The checks stay pgx's, which emulate libpq's: verify-full checks the certificate chain and
// the host name (tls.Config.ServerName and RootCAs); verify-ca the chain only, in the
// VerifyPeerCertificate function pgx installs, which reads the RootCAs of the very
// configuration it was made for, so setting them here is what it checks against (a CA other
// than the server's, or another host name under verify-full, is refused: TestSSLModes).
type inlineTLS struct {
	roots *x509.CertPool
	certs []tls.Certificate
}

// inlineTLS reads ssl_mode's inline certificates; nil when there are none.
func (c *config) inlineTLS() (*inlineTLS, error) {
	s := c.SSLMode
	out := &inlineTLS{}
	if s.CACertificate != "" && (s.Mode == "verify-ca" || s.Mode == "verify-full") {
		out.roots = x509.NewCertPool()
		if !out.roots.AppendCertsFromPEM([]byte(s.CACertificate)) {
			return nil, configErrorf("ssl_mode.ca_certificate holds no PEM certificate")
		}
	}
	if s.ClientCertificate != "" && s.Mode != "disable" {
		key, err := clientKey(s.ClientKey, s.ClientKeyPassword)
		if err != nil {
			return nil, err
		}
		cert, err := tls.X509KeyPair([]byte(s.ClientCertificate), key)
		if err != nil {
			return nil, configErrorf("ssl_mode.client_certificate and client_key do not make a key pair: %v", err)
		}
		out.certs = []tls.Certificate{cert}
	}
	if out.roots == nil && out.certs == nil {
		return nil, nil
	}
	return out, nil
}

// clientKey returns the client key in PEM, decrypted with password when it is encrypted (the
// legacy PEM encryption libpq and pgx read).
func clientKey(keyPEM, password string) ([]byte, error) {
	block, _ := pem.Decode([]byte(keyPEM))
	if block == nil {
		return nil, configErrorf("ssl_mode.client_key holds no PEM key")
	}
	//lint:ignore SA1019 the legacy PEM encryption is what libpq's sslpassword decrypts; no other is offered
	if !x509.IsEncryptedPEMBlock(block) {
		return pem.EncodeToMemory(block), nil
	}
	if password == "" {
		return nil, configErrorf("ssl_mode.client_key is encrypted: give client_key_password")
	}
	//lint:ignore SA1019 as above
	der, err := x509.DecryptPEMBlock(block, []byte(password))
	if err != nil {
		if errors.Is(err, x509.IncorrectPasswordError) {
			return nil, configErrorf("ssl_mode.client_key_password does not decrypt client_key")
		}
		return nil, configErrorf("ssl_mode.client_key cannot be decrypted: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: der}), nil
}

// apply sets the inline certificates on every TLS configuration of c (its fallbacks' too).
func (t *inlineTLS) apply(c *pgconn.Config) {
	if t == nil {
		return
	}
	set := func(tc *tls.Config) {
		if tc == nil {
			return
		}
		if t.roots != nil {
			tc.RootCAs = t.roots
		}
		if t.certs != nil {
			tc.Certificates = t.certs
		}
	}
	set(c.TLSConfig)
	for _, f := range c.Fallbacks {
		set(f.TLSConfig)
	}
}
