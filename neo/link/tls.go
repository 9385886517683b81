package link

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// CipherSuites are the TLS 1.2 suites of NEO/py's cipher string
// (ECDH+AESGCM:ECDH+CHACHA20:ECDH+AES, no SHA1) that Go implements.
var CipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// TLSConfig builds the TLS configuration of a NEO node as NEO/py does
// (--ca, --cert, --key): mutual TLS 1.2, both sides verifying the peer's
// certificate against the CA, without host name check. server selects the
// accepting side's configuration.
//
// Peer certificates are verified by VerifyConnection against the CA pool
// with any extended key usage (NEO/py does not require a TLS purpose), so
// the server requires a client certificate with RequireAnyClientCert and
// the client skips Go's host name based check (InsecureSkipVerify) while
// still verifying the chain.
func TLSConfig(caFile, certFile, keyFile string, server bool) (*tls.Config, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("link: CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("link: CA: no certificate in %s", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("link: certificate: %w", err)
	}
	return NewTLSConfig(pool, cert, server), nil
}

// NodeTLSConfig is TLSConfig for a node that both accepts connections and
// dials its peers with one configuration (a storage node: clients connect
// to it, it connects to the master): the server-side and client-side
// settings of TLSConfig together, which do not interfere (each side of a
// handshake reads only its own).
func NodeTLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	conf, err := TLSConfig(caFile, certFile, keyFile, true)
	if err != nil {
		return nil, err
	}
	conf.RootCAs = conf.ClientCAs
	conf.InsecureSkipVerify = true // no host name check; chain verified by VerifyConnection
	return conf, nil
}

// NewTLSConfig is TLSConfig from an already loaded CA pool and key pair.
func NewTLSConfig(ca *x509.CertPool, cert tls.Certificate, server bool) *tls.Config {
	verify := func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("link: peer sent no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
			Roots:         ca,
			Intermediates: inter,
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
		})
		if err != nil {
			return fmt.Errorf("link: peer certificate: %w", err)
		}
		return nil
	}
	conf := &tls.Config{
		Certificates:     []tls.Certificate{cert},
		MinVersion:       tls.VersionTLS12,
		MaxVersion:       tls.VersionTLS12,
		CipherSuites:     CipherSuites,
		VerifyConnection: verify,
	}
	if server {
		conf.ClientAuth = tls.RequireAnyClientCert
		conf.ClientCAs = ca
	} else {
		conf.RootCAs = ca
		conf.InsecureSkipVerify = true // no host name check; chain verified by VerifyConnection
	}
	return conf
}
