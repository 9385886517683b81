// Package certpool reads the certificate authorities of a TLS
// configuration from PEM files, as OpenSSL's CAfile and CApath do.
package certpool

import (
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
)

// Load returns the PEM certificates of path: a file, or every regular file
// of a directory (subdirectories, as /etc/ssl/certs/java, are skipped).
// It is an error if none is found.
func Load(path string) (*x509.CertPool, error) {
	files := []string{path}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		files = files[:0]
		for _, e := range entries {
			p := filepath.Join(path, e.Name())
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				files = append(files, p)
			}
		}
	}
	pool := x509.NewCertPool()
	n := 0
	for _, f := range files {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if pool.AppendCertsFromPEM(pem) {
			n++
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("%s: no PEM certificate found", path)
	}
	return pool, nil
}
