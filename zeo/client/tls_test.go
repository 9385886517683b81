package client_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zeo"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zodb"
)

// testPKI is a CA and the certificates it issued, as PEM files.
type testPKI struct {
	dir                   string
	ca                    string // the CA's certificate
	serverCert, serverKey string // issued to localhost and 127.0.0.1
	clientCert, clientKey string
}

// newPKI makes a CA named name and a server and a client certificate
// signed by it, in a temporary directory.
func newPKI(t *testing.T, name string) *testPKI {
	t.Helper()
	dir := t.TempDir()
	p := &testPKI{dir: dir}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p.ca = writePEM(t, dir, "ca.pem", "CERTIFICATE", caDER)
	issue := func(file string, serial int64, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: file},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			DNSNames:     dns,
			IPAddresses:  ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return writePEM(t, dir, file+".pem", "CERTIFICATE", der), writePEM(t, dir, file+"_key.pem", "EC PRIVATE KEY", kb)
	}
	p.serverCert, p.serverKey = issue("server", 2, x509.ExtKeyUsageServerAuth, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	p.clientCert, p.clientKey = issue("client", 3, x509.ExtKeyUsageClientAuth, nil, nil)
	return p
}

func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startTLSServer serves the 1.fs fixture over TLS, clients authenticated
// by p's CA, as `zodbd serve` does with an <ssl> section. sni, when not
// nil, receives the server name each client sends.
func startTLSServer(t *testing.T, p *testPKI, sni ...chan<- string) string {
	t.Helper()
	conf, err := (&zeo.SSLConfig{Certificate: p.serverCert, Key: p.serverKey, Authenticate: p.ca}).TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	if len(sni) > 0 {
		conf.GetConfigForClient = func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
			sni[0] <- hi.ServerName
			return nil, nil
		}
	}
	srv, err := zeo.NewServer(zeo.Config{
		Storages: []zeo.StorageConfig{{Name: "1", Storage: openFixtureFS(t), ReadOnly: true}},
		TLS:      conf,
		Logf:     func(string, ...interface{}) {},
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return ln.Addr().String()
}

func openURL(t *testing.T, rawURL string, timeout time.Duration) (zodb.Storage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s, err := zodb.Open(ctx, rawURL, &zodb.OpenOptions{CacheSize: -1})
	if err == nil {
		t.Cleanup(func() { s.Close() })
	}
	return s, err
}

// TestTLS loads over zeos:// from a server that requires client
// certificates, and checks that each thing TLS must refuse is refused.
func TestTLS(t *testing.T) {
	p := newPKI(t, "zodbd test CA")
	other := newPKI(t, "another CA")
	addr := startTLSServer(t, p)
	_, port, _ := net.SplitHostPort(addr)
	q := func(kv ...string) string {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v.Encode()
	}
	fs := openFixtureFS(t)
	ctx := context.Background()
	head, err := fs.LastTid(ctx)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, url string
	}{
		{"by IP", "zeos://" + addr + "?" + q("ca", p.ca, "cert", p.clientCert, "key", p.clientKey)},
		{"by name", "zeos://localhost:" + port + "?" + q("ca", p.ca, "cert", p.clientCert, "key", p.clientKey)},
		{"server_hostname", "zeos://" + addr + "?" + q("ca", p.ca, "cert", p.clientCert, "key", p.clientKey, "server_hostname", "localhost")},
		{"check_hostname=0", "zeos://" + addr + "?" + q("ca", p.ca, "cert", p.clientCert, "key", p.clientKey, "server_hostname", "elsewhere", "check_hostname", "0")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := openURL(t, tc.url, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(s.URL(), "zeos://") {
				t.Errorf("URL() = %q, want zeos://...", s.URL())
			}
			for oid := zodb.Oid(0); oid < 4; oid++ {
				want, wserial, werr := fs.Load(ctx, zodb.Xid{Oid: oid, At: head})
				got, serial, err := s.Load(ctx, zodb.Xid{Oid: oid, At: head})
				if errClass(err) != errClass(werr) || serial != wserial || string(got) != string(want) {
					t.Errorf("oid %v: got %x %v %v, want %x %v %v", oid, got, serial, err, want, wserial, werr)
				}
			}
		})
	}

	for _, tc := range []struct {
		name, url, want string
	}{
		{"no client certificate", "zeos://" + addr + "?" + q("ca", p.ca), ""},
		{"client certificate of another CA", "zeos://" + addr + "?" + q("ca", p.ca, "cert", other.clientCert, "key", other.clientKey), ""},
		{"server of another CA", "zeos://" + addr + "?" + q("ca", other.ca, "cert", p.clientCert, "key", p.clientKey), "certificate"},
		{"wrong server name", "zeos://" + addr + "?" + q("ca", p.ca, "cert", p.clientCert, "key", p.clientKey, "server_hostname", "elsewhere"), "elsewhere"},
		{"chain still checked without the name", "zeos://" + addr + "?" + q("ca", other.ca, "cert", p.clientCert, "key", p.clientKey, "check_hostname", "0"), "certificate"},
		{"plain client on a TLS server", "zeo://" + addr, ""},
		{"TLS parameter on zeo://", "zeo://" + addr + "?" + q("ca", p.ca), "use zeos://"},
		{"unknown parameter", "zeos://" + addr + "?" + q("cafile", p.ca), "unknown parameter"},
		{"bad check_hostname", "zeos://" + addr + "?" + q("check_hostname", "maybe"), "boolean"},
		{"key without certificate", "zeos://" + addr + "?" + q("key", p.clientKey), "without a certificate"},
		{"unix socket", "zeos:///tmp/zeo.sock", "host:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A plain client and a TLS server wait for each other to
			// speak first: a short timeout ends that case.
			s, err := openURL(t, tc.url, 2*time.Second)
			if err == nil {
				// The server may refuse the client's certificate after
				// the client's side of the handshake is done: the first
				// call then fails.
				_, _, err = s.Load(ctx, zodb.Xid{Oid: 0, At: head})
			}
			if err == nil {
				t.Fatal("no error")
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// TestTLSOptionsDial uses Options.TLS directly, as a program would.
func TestTLSOptionsDial(t *testing.T) {
	p := newPKI(t, "zodbd test CA")
	addr := startTLSServer(t, p)
	conf, err := (&client.TLSOptions{CA: p.ca, Cert: p.clientCert, Key: p.clientKey}).Config()
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, addr, &client.Options{TLS: conf})
	if _, err := c.LastTid(context.Background()); err != nil {
		t.Fatal(err)
	}
	if conf.ServerName != "" {
		t.Errorf("Dial changed the caller's tls.Config: ServerName %q", conf.ServerName)
	}
}

// TestTLSServerName: without server_hostname the URL's host is sent (SNI),
// also when it is not checked (check_hostname=0), as ZEO's client does.
func TestTLSServerName(t *testing.T) {
	p := newPKI(t, "zodbd test CA")
	sni := make(chan string, 4)
	addr := startTLSServer(t, p, sni)
	_, port, _ := net.SplitHostPort(addr)
	for _, check := range []string{"1", "0"} {
		q := url.Values{"ca": {p.ca}, "cert": {p.clientCert}, "key": {p.clientKey}, "check_hostname": {check}}
		if _, err := openURL(t, "zeos://localhost:"+port+"?"+q.Encode(), 10*time.Second); err != nil {
			t.Fatalf("check_hostname=%s: %v", check, err)
		}
		if got := <-sni; got != "localhost" {
			t.Errorf("check_hostname=%s: server name sent %q, want localhost", check, got)
		}
	}
}

// TestTLSCADirectory: a CA directory is every regular file in it, on the
// client (ca=) and on the server (authenticate): a subdirectory (as
// /etc/ssl/certs/java on Debian) is skipped, and glob characters in the
// path are nothing special.
func TestTLSCADirectory(t *testing.T) {
	p := newPKI(t, "zodbd test CA")
	pem, err := os.ReadFile(p.ca)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"certs", "certs[1]*"} {
		dir := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(filepath.Join(dir, "java"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "ca.pem"), pem, 0o600); err != nil {
			t.Fatal(err)
		}
		conf, err := (&client.TLSOptions{CA: dir}).Config()
		if err != nil || conf.RootCAs == nil {
			t.Errorf("client, CA directory %s: %v", name, err)
		}
		sconf, err := (&zeo.SSLConfig{Certificate: p.serverCert, Key: p.serverKey, Authenticate: dir}).TLSConfig()
		if err != nil || sconf.ClientCAs == nil {
			t.Errorf("server, authenticate directory %s: %v", name, err)
		}
	}
	empty := t.TempDir()
	if _, err := (&client.TLSOptions{CA: empty}).Config(); err == nil {
		t.Errorf("client, CA directory without certificates: no error")
	}
}
