package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/internal/certpool"
)

// TLSOptions are the client side of ZEO's TLS, the keys of the <ssl>
// section of ZEO's <clientstorage> (in parentheses).
type TLSOptions struct {
	// CA is a PEM file, or a directory of PEM files, of the certificate
	// authorities the server's certificate must chain to (authenticate);
	// empty means the system's.
	CA string
	// Cert and Key are the PEM files of the client's certificate and its
	// private key (certificate, key), for servers that authenticate
	// clients, as ZEO's and zodbd's do. Key empty means that Cert holds
	// the key too.
	Cert, Key string
	// ServerName is the name the server's certificate must be issued to
	// (server-hostname); empty means the host of the address dialled.
	ServerName string
	// NoCheckHostname verifies the server's certificate chain but not the
	// name it is issued to (check-hostname false). Go only matches
	// names against a certificate's subjectAltName, never its Common Name.
	NoCheckHostname bool
}

// Config builds the tls.Config that Options.TLS takes.
func (o *TLSOptions) Config() (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.ServerName}
	if o.CA != "" {
		pool, err := certpool.Load(o.CA)
		if err != nil {
			return nil, fmt.Errorf("zeo client: tls: CA: %w", err)
		}
		conf.RootCAs = pool
	}
	if o.Cert != "" {
		key := o.Key
		if key == "" {
			key = o.Cert
		}
		cert, err := tls.LoadX509KeyPair(o.Cert, key)
		if err != nil {
			return nil, fmt.Errorf("zeo client: tls: %w", err)
		}
		conf.Certificates = []tls.Certificate{cert}
	} else if o.Key != "" {
		return nil, errors.New("zeo client: tls: a key without a certificate")
	}
	if o.NoCheckHostname {
		// Verify the chain as crypto/tls would, without the name.
		roots := conf.RootCAs
		conf.InsecureSkipVerify = true
		conf.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("zeo client: tls: the server sent no certificate")
			}
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		}
	}
	return conf, nil
}
