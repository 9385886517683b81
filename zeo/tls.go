package zeo

import (
	"crypto/tls"
	"fmt"

	"github.com/zodbd/zodbd/internal/certpool"
)

// TLSConfig builds the server's TLS configuration from an <ssl> section the
// way ZEO's server context is built: the server presents Certificate/Key,
// and clients must present a certificate signed by a CA of Authenticate (a
// PEM file, or a directory of PEM files). Authenticate "DYNAMIC" (ZEO's
// hook for CAs loaded later by Python code) requires a client certificate
// but cannot verify it against anything: zodbd refuses it.
func (c *SSLConfig) TLSConfig() (*tls.Config, error) {
	key := c.Key
	if key == "" {
		key = c.Certificate // ZEO accepts a certificate file holding the key too
	}
	cert, err := tls.LoadX509KeyPair(c.Certificate, key)
	if err != nil {
		return nil, fmt.Errorf("zeo: ssl: %w", err)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
	switch c.Authenticate {
	case "":
		return nil, fmt.Errorf("zeo: ssl: authenticate (the CA of client certificates) is required")
	case "DYNAMIC":
		return nil, fmt.Errorf("zeo: ssl: authenticate DYNAMIC needs Python code to load CAs; give a CA file or directory")
	}
	pool, err := certpool.Load(c.Authenticate)
	if err != nil {
		return nil, fmt.Errorf("zeo: ssl: authenticate: %w", err)
	}
	cfg.ClientCAs = pool
	return cfg, nil
}
