package certpool

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func selfSigned(t *testing.T) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestLoad: a file; a directory's regular files, its subdirectories and
// non-PEM files skipped, glob characters in its name nothing special; and
// the errors: nothing found, a missing path.
func TestLoad(t *testing.T) {
	ca := selfSigned(t)
	dir := filepath.Join(t.TempDir(), "certs[1]*")
	for _, d := range []string{dir, filepath.Join(dir, "java")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(dir, "ca.pem")
	os.WriteFile(file, ca, 0o644)
	os.WriteFile(filepath.Join(dir, "README"), []byte("not a certificate"), 0o644)
	for _, p := range []string{file, dir} {
		if pool, err := Load(p); err != nil || pool == nil {
			t.Errorf("Load(%s): %v", p, err)
		}
	}
	for _, p := range []string{t.TempDir(), filepath.Join(dir, "README"), filepath.Join(dir, "missing.pem")} {
		if _, err := Load(p); err == nil {
			t.Errorf("Load(%s): no error", p)
		}
	}
}
