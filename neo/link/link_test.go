package link

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

func listen(t testing.TB) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// serve accepts NEO connections on ln and runs handle for each request.
func serve(t testing.TB, ln net.Listener, opt *Options, handle func(c *Conn, r *Request)) {
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				c, err := AcceptOptions(nc, opt)
				if err != nil {
					return
				}
				defer c.Close()
				for {
					r, err := c.Recv()
					if err != nil {
						return
					}
					handle(c, r)
				}
			}()
		}
	}()
}

// objectServer answers AskObject with the oid and before-1 as serial.
func objectServer(async bool) func(c *Conn, r *Request) {
	return func(c *Conn, r *Request) {
		var q proto.AskObject
		if err := r.Decode(&q); err != nil {
			panic(err)
		}
		id := r.ID
		r.Release()
		reply := func() {
			if q.Oid == 666 {
				c.ReplyError(id, proto.OidDoesNotExist, fmt.Sprintf("%016x", uint64(q.Oid)))
				return
			}
			data := []byte(fmt.Sprintf("data of %d", q.Oid))
			c.Reply(id, &proto.AnswerObject{Oid: q.Oid, Serial: q.Before - 1, NextSerial: proto.InvalidTid, Data: data, DataSerial: proto.InvalidTid})
		}
		if async {
			go func() {
				time.Sleep(time.Duration(mrand.IntN(2000)) * time.Microsecond)
				reply()
			}()
		} else {
			reply()
		}
	}
}

func TestPipelinedAsks(t *testing.T) {
	ln := listen(t)
	serve(t, ln, nil, objectServer(true))
	c, err := Dial(context.Background(), "tcp", ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for i := 0; i < 1000; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var a proto.AnswerObject
			oid := zodb.Oid(i + 1000)
			err := c.Ask(context.Background(), &proto.AskObject{Oid: oid, At: proto.InvalidTid, Before: zodb.Tid(i + 100)}, &a)
			if err != nil {
				errs <- err
				return
			}
			if a.Oid != oid || a.Serial != zodb.Tid(i+99) || string(a.Data) != fmt.Sprintf("data of %d", oid) {
				errs <- fmt.Errorf("ask %d: mismatched answer %+v", i, a)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := c.nextID.Load(); n != 1000 {
		t.Errorf("next id %d", n)
	}
}

func TestErrorAnswer(t *testing.T) {
	ln := listen(t)
	serve(t, ln, nil, objectServer(false))
	c, err := Dial(context.Background(), "tcp", ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var a proto.AnswerObject
	err = c.Ask(context.Background(), &proto.AskObject{Oid: 666, At: proto.InvalidTid, Before: 5}, &a)
	var pe *proto.Error
	if !errors.As(err, &pe) || pe.ErrCode != proto.OidDoesNotExist || pe.Message != "000000000000029a" {
		t.Fatalf("got %v", err)
	}
	// the connection is still usable
	if err := c.Ask(context.Background(), &proto.AskObject{Oid: 1, Before: 5, At: proto.InvalidTid}, &a); err != nil || a.Oid != 1 {
		t.Fatal(err, a)
	}
}

func TestNotifications(t *testing.T) {
	ln := listen(t)
	got := make(chan *Request, 10)
	serve(t, ln, nil, func(c *Conn, r *Request) {
		got <- r
		if r.Code == proto.CodePing {
			c.Reply(r.ID, &proto.Pong{})
			// the peer originates its own ids from 0
			c.Send(&proto.NotifyClusterInformation{State: proto.Running})
			c.SendID(42, &proto.AddObject{Oid: 1, DataSerial: proto.InvalidTid, Data: []byte("x")})
		}
	})
	c, err := Dial(context.Background(), "tcp", ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Send(&proto.NotifyReady{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Ask(context.Background(), &proto.Ping{}, &proto.Pong{}); err != nil {
		t.Fatal(err)
	}
	r1, r2 := <-got, <-got
	if r1.Code != proto.CodeNotifyReady || r1.ID != 0 || r2.Code != proto.CodePing || r2.ID != 1 {
		t.Fatalf("server got %v/%d %v/%d", r1.Name(), r1.ID, r2.Name(), r2.ID)
	}
	r, err := c.Recv()
	if err != nil || r.Code != proto.CodeNotifyClusterInformation || r.ID != 0 {
		t.Fatal(r, err)
	}
	var nci proto.NotifyClusterInformation
	if err := r.Decode(&nci); err != nil || nci.State != proto.Running {
		t.Fatal(err)
	}
	r.Release()
	r, err = c.Recv()
	if err != nil || r.Code != proto.CodeAddObject || r.ID != 42 {
		t.Fatal(r, err)
	}
	var ao proto.AddObject
	if err := r.Decode(&ao); err != nil || string(ao.Data) != "x" {
		t.Fatal(err)
	}
	r.Release()
}

// rawServer accepts one TCP connection and runs f on it.
func rawServer(t *testing.T, f func(nc net.Conn)) string {
	ln := listen(t)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		f(nc)
	}()
	return ln.Addr().String()
}

func TestHandshakeMismatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		send []byte
		want string
	}{
		{"version", []byte{0x92, 0xa3, 'N', 'E', 'O', 4}, "version mismatch: peer speaks version 4"},
		{"garbage", []byte("SSH-2.0-OpenSSH\r\n"), "not a NEO peer"},
		{"silence", nil, "no handshake within"},
		{"closed", []byte{0x92}, "handshake with"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := rawServer(t, func(nc net.Conn) {
				if tc.send != nil {
					nc.Write(tc.send)
					if tc.name == "closed" {
						return
					}
				}
				time.Sleep(2 * time.Second)
			})
			start := time.Now()
			_, err := DialOptions(context.Background(), "tcp", addr, &Options{HandshakeTimeout: 300 * time.Millisecond})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			// The peer closes after 2 s: the handshake's 300 ms bound
			// must have ended it before (with the error above).
			if time.Since(start) > 1900*time.Millisecond {
				t.Errorf("took %v", time.Since(start))
			}
		})
	}
	// the accepting side too, and our handshake is sent before the peer's arrives
	ln := listen(t)
	errc := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		_, err = AcceptOptions(nc, &Options{HandshakeTimeout: 2 * time.Second})
		errc <- err
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	buf := make([]byte, 6)
	nc.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := nc.Read(buf); err != nil || !bytes.Equal(buf, proto.Handshake[:]) {
		t.Fatalf("acceptor handshake % x %v", buf, err)
	}
	nc.Write([]byte("GET / HTTP/1.0\r\n"))
	if err := <-errc; err == nil || !strings.Contains(err.Error(), "not a NEO peer") {
		t.Fatalf("got %v", err)
	}
	// and the acceptor closed the connection
	if _, err := nc.Read(buf); err == nil {
		t.Fatal("connection still open")
	}
}

func TestPeerClosesMidAsk(t *testing.T) {
	ln := listen(t)
	serve(t, ln, nil, func(c *Conn, r *Request) {
		c.Close() // no answer
	})
	c, err := Dial(context.Background(), "tcp", ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Ask(context.Background(), &proto.Ping{}, &proto.Pong{})
			if err == nil || !strings.Contains(err.Error(), "closed the connection") {
				t.Errorf("got %v", err)
			}
		}()
	}
	wg.Wait()
	if _, err := c.Recv(); err == nil {
		t.Fatal("Recv after close")
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("not done")
	}
	if err := c.Send(&proto.Ping{}); err == nil {
		t.Fatal("Send after close")
	}
	if err := c.Ask(context.Background(), &proto.Ping{}, &proto.Pong{}); err == nil {
		t.Fatal("Ask after close")
	}
}

func TestCloseFailsPending(t *testing.T) {
	ln := listen(t)
	serve(t, ln, nil, func(c *Conn, r *Request) {}) // never answers
	c, err := Dial(context.Background(), "tcp", ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error)
	go func() { errc <- c.Ask(context.Background(), &proto.Ping{}, &proto.Pong{}) }()
	time.Sleep(50 * time.Millisecond)
	c.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v", err)
	}
	if _, err := c.Recv(); !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v", err)
	}
}

func TestAskCancel(t *testing.T) {
	ln := listen(t)
	serve(t, ln, nil, func(c *Conn, r *Request) {
		id := r.ID
		slow := r.Code == proto.CodeAskLastTransaction
		r.Release()
		go func() {
			if slow {
				time.Sleep(200 * time.Millisecond)
			}
			c.Reply(id, &proto.AnswerLastTransaction{Tid: zodb.Tid(id)})
		}()
	})
	var logged bytes.Buffer
	var mu sync.Mutex
	c, err := DialOptions(context.Background(), "tcp", ln.Addr().String(), &Options{Logf: func(f string, a ...any) {
		mu.Lock()
		fmt.Fprintf(&logged, f, a...)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var a proto.AnswerLastTransaction
	if err := c.Ask(ctx, &proto.AskLastTransaction{}, &a); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	time.Sleep(300 * time.Millisecond) // the late answer arrives and is dropped
	if err := c.Ask(context.Background(), &proto.AskFinalTID{}, &proto.AnswerFinalTID{}); err == nil {
		t.Fatal("wrong answer type accepted")
	}
	if err := c.Ask(context.Background(), &proto.AskLastTransaction{}, &a); err == nil {
		// slow again, but waited for
		if a.Tid != 2 {
			t.Fatalf("tid %d", a.Tid)
		}
	} else {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logged.String(), "unexpected msg_id 0") {
		t.Errorf("log: %q", logged.String())
	}
}

func TestMalformedPacket(t *testing.T) {
	ln := listen(t)
	srvErr := make(chan error, 2)
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				c, err := AcceptOptions(nc, nil)
				if err != nil {
					srvErr <- err
					return
				}
				defer c.Close()
				for {
					r, err := c.Recv()
					if err != nil {
						srvErr <- err
						return
					}
					c.Reply(r.ID, &proto.Pong{})
					r.Release()
				}
			}()
		}
	}()
	good, err := Dial(context.Background(), "tcp", ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	bad, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	msg := proto.AppendHandshake(nil)
	msg = proto.AppendPacket(msg, 0, &proto.Ping{})
	msg = append(msg, 0x93, 0x01, 0x7f, 0x90) // unknown code 0x7f
	bad.Write(msg)
	select {
	case err := <-srvErr:
		if !strings.Contains(err.Error(), "offset 10") || !strings.Contains(err.Error(), "unknown packet code") {
			t.Errorf("got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no error")
	}
	// the bad connection is closed, the good one works
	bad.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 100)
	n := 0
	for {
		k, err := bad.Read(buf[n:])
		n += k
		if err != nil {
			break
		}
	}
	if n != 6 && n != 6+6 { // handshake (+ Pong if the Ping was served before the close)
		t.Errorf("bad conn read %d bytes", n)
	}
	if err := good.Ask(context.Background(), &proto.Ping{}, &proto.Pong{}); err != nil {
		t.Fatal(err)
	}
}

// ---- TLS ----

type pki struct {
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPool *x509.CertPool
}

func newPKI(t testing.TB) *pki {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &pki{ca, key, pool}
}

// files writes the CA and a new certificate and key as PEM files in dir
// (what NEO/py's --ca, --cert, --key name) and returns their paths.
func (p *pki) files(t testing.TB, dir, name string, serial int64) (ca, cert, key string) {
	c := p.cert(t, name, serial)
	kder, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(file, typ string, der []byte) string {
		path := filepath.Join(dir, file)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	return write("ca.pem", "CERTIFICATE", p.ca.Raw), write(name+".pem", "CERTIFICATE", c.Certificate[0]),
		write(name+".key", "PRIVATE KEY", kder)
}

func (p *pki) cert(t testing.TB, name string, serial int64) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestTLS(t *testing.T) {
	p := newPKI(t)
	srvConf := NewTLSConfig(p.caPool, p.cert(t, "storage", 2), true)
	cliConf := NewTLSConfig(p.caPool, p.cert(t, "client", 3), false)
	ln := listen(t)
	serve(t, ln, &Options{TLS: srvConf, HandshakeTimeout: time.Second}, objectServer(true))
	c, err := Dial(context.Background(), "tcp", ln.Addr().String(), cliConf)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tc, ok := c.nc.(*tls.Conn); !ok || tc.ConnectionState().Version != tls.VersionTLS12 {
		t.Fatal("not TLS 1.2")
	}
	var wg sync.WaitGroup
	for i := 1; i <= 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var a proto.AnswerObject
			if err := c.Ask(context.Background(), &proto.AskObject{Oid: zodb.Oid(i), Before: 9, At: proto.InvalidTid}, &a); err != nil || a.Oid != zodb.Oid(i) {
				t.Error(err, a.Oid)
			}
		}()
	}
	wg.Wait()

	// a clear peer is rejected by a TLS server
	if _, err := DialOptions(context.Background(), "tcp", ln.Addr().String(), &Options{HandshakeTimeout: time.Second}); err == nil {
		t.Fatal("clear client accepted by a TLS server")
	}
	// a client with a certificate of another CA is rejected
	other := newPKI(t)
	badConf := NewTLSConfig(p.caPool, other.cert(t, "intruder", 4), false)
	if c, err := DialOptions(context.Background(), "tcp", ln.Addr().String(), &Options{TLS: badConf, HandshakeTimeout: time.Second}); err == nil {
		// TLS 1.2: the client may finish before the server rejects; the
		// connection must then fail.
		if err := c.Ask(context.Background(), &proto.Ping{}, &proto.Pong{}); err == nil {
			t.Fatal("foreign certificate accepted")
		}
	}
	// a TLS client talking to a clear server fails
	ln2 := listen(t)
	serve(t, ln2, &Options{HandshakeTimeout: time.Second}, objectServer(false))
	if _, err := DialOptions(context.Background(), "tcp", ln2.Addr().String(), &Options{TLS: cliConf, HandshakeTimeout: time.Second}); err == nil {
		t.Fatal("TLS client accepted by a clear server")
	}
}

// A node's single configuration (NodeTLSConfig) serves both ends.
func TestNodeTLSConfig(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	ca, cert, key := p.files(t, dir, "storage", 5)
	conf, err := NodeTLSConfig(ca, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	serve(t, ln, &Options{TLS: conf, HandshakeTimeout: time.Second}, objectServer(true))
	c, err := Dial(context.Background(), "tcp", ln.Addr().String(), conf)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var a proto.AnswerObject
	if err := c.Ask(context.Background(), &proto.AskObject{Oid: 7, Before: 9, At: proto.InvalidTid}, &a); err != nil || a.Oid != 7 {
		t.Fatal(err, a.Oid)
	}
	// A peer of another CA is rejected by it as a server and as a client.
	other := newPKI(t)
	badConf := NewTLSConfig(p.caPool, other.cert(t, "intruder", 6), false)
	if c, err := DialOptions(context.Background(), "tcp", ln.Addr().String(), &Options{TLS: badConf, HandshakeTimeout: time.Second}); err == nil {
		if err := c.Ask(context.Background(), &proto.AskObject{Oid: 7, Before: 9, At: proto.InvalidTid}, &proto.AnswerObject{}); err == nil {
			t.Fatal("foreign certificate accepted by the node")
		}
	}
	ln2 := listen(t)
	serve(t, ln2, &Options{TLS: NewTLSConfig(other.caPool, other.cert(t, "fake-master", 7), true), HandshakeTimeout: time.Second}, objectServer(true))
	if c, err := DialOptions(context.Background(), "tcp", ln2.Addr().String(), &Options{TLS: conf, HandshakeTimeout: time.Second}); err == nil {
		if err := c.Ask(context.Background(), &proto.AskObject{Oid: 7, Before: 9, At: proto.InvalidTid}, &proto.AnswerObject{}); err == nil {
			t.Fatal("the node accepted a server of another CA")
		}
	}
	if _, err := NodeTLSConfig(ca, cert, dir+"/missing.pem"); err == nil {
		t.Fatal("missing key accepted")
	}
}

// ---- benchmarks ----

func BenchmarkAskObject(b *testing.B) {
	ln := listen(b)
	data := make([]byte, 4096)
	serve(b, ln, nil, func(c *Conn, r *Request) {
		var q proto.AskObject
		r.Decode(&q)
		c.Reply(r.ID, &proto.AnswerObject{Oid: q.Oid, Serial: 1, NextSerial: proto.InvalidTid, Data: data, DataSerial: proto.InvalidTid})
		r.Release()
	})
	c, err := Dial(context.Background(), "tcp", ln.Addr().String(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ask := func() {
		var a proto.AnswerObject
		if err := c.Ask(context.Background(), &proto.AskObject{Oid: 1, Before: 5, At: proto.InvalidTid}, &a); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ask()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ask()
			}
		})
	})
}

// TestAskReads drives a connection whose Asks read the connection
// themselves (see reader.go) against a raw peer that controls when each
// byte comes: an Ask cancelled while nothing comes, one cancelled in the
// middle of a packet, late answers dropped, a request from the peer handed
// to Options.Handler between answers, and the stream still in step.
func TestAskReads(t *testing.T) {
	ln := listen(t)
	type step struct {
		write []byte
		pause time.Duration
		need  int // packets the peer must have received before writing
	}
	steps := make(chan step, 16)
	// The peer records what it receives; a step with need waits until
	// the peer has received that many packets, so that an answer is never
	// written before its request was sent (an answer to a msg_id nobody
	// waits for is dropped, by design).
	var (
		mu       sync.Mutex
		received []proto.Packet
	)
	arrived := make(chan struct{}, 64)
	receivedCodes := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var codes []string
		for _, p := range received {
			codes = append(codes, fmt.Sprintf("%d:%s", p.ID, proto.CodeName(p.Code)))
		}
		return codes
	}
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		nc.Write(proto.Handshake[:])
		rd := proto.NewReader(nc)
		if rd.ReadHandshake() != nil {
			return
		}
		go func() {
			for {
				p, err := rd.ReadPacket()
				if err != nil {
					return
				}
				mu.Lock()
				received = append(received, proto.Packet{ID: p.ID, Code: p.Code})
				mu.Unlock()
				arrived <- struct{}{}
			}
		}()
		n := 0
		for s := range steps {
			for ; n < s.need; n++ {
				select {
				case <-arrived:
				case <-time.After(10 * time.Second):
					// The requests did not come: closing the
					// connection fails the Ask waiting for this step
					// (no t.Errorf here: the test may be over).
					return
				}
			}
			if _, err := nc.Write(s.write); err != nil {
				return
			}
			time.Sleep(s.pause)
		}
	}()
	pings := make(chan uint32, 1)
	c, err := DialOptions(context.Background(), "tcp", ln.Addr().String(), &Options{
		Logf: t.Logf,
		Handler: func(c *Conn, r *Request) {
			if r.Code == proto.CodePing {
				pings <- r.ID
				c.Reply(r.ID, &proto.Pong{})
			}
			r.Release()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	answer := func(id uint32, tid zodb.Tid) []byte {
		return proto.AppendPacket(nil, id, &proto.AnswerLastTransaction{Tid: tid})
	}
	var a proto.AnswerLastTransaction

	// Ask 0, answered.
	steps <- step{write: answer(0, 100), need: 1}
	if err := c.Ask(context.Background(), &proto.AskLastTransaction{}, &a); err != nil || a.Tid != 100 {
		t.Fatalf("ask 0: %v %v", a.Tid, err)
	}
	// Ask 1: nothing comes.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err = c.Ask(ctx, &proto.AskLastTransaction{}, &a)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ask 1: %v, want DeadlineExceeded", err)
	}
	// Ask 2: half of ask 1's late answer comes, then nothing.
	late := answer(1, 101)
	steps <- step{write: late[:len(late)/2], pause: 300 * time.Millisecond, need: 2}
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	err = c.Ask(ctx, &proto.AskLastTransaction{}, &a)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ask 2: %v, want DeadlineExceeded", err)
	}
	// The rest of it, a Ping from the peer, ask 2's late answer, then
	// ask 3's answer.
	rest := append([]byte(nil), late[len(late)/2:]...)
	rest = proto.AppendPacket(rest, 7, &proto.Ping{})
	rest = append(rest, answer(2, 102)...)
	rest = append(rest, answer(3, 103)...)
	steps <- step{write: rest, need: 4}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ask(ctx, &proto.AskLastTransaction{}, &a); err != nil || a.Tid != 103 {
		t.Fatalf("ask 3: %v %v, want 103", a.Tid, err)
	}
	select {
	case id := <-pings:
		if id != 7 {
			t.Errorf("ping id %d", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the Ping did not reach the handler")
	}
	// The peer got asks 0-3 and the Pong.
	defer close(steps)
	want := "0:AskLastTransaction 1:AskLastTransaction 2:AskLastTransaction 3:AskLastTransaction 7:Pong"
	deadline := time.Now().Add(5 * time.Second)
	codes := receivedCodes()
	for len(codes) < 5 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		codes = receivedCodes()
	}
	if strings.Join(codes, " ") != want {
		t.Errorf("peer got %v, want %s", codes, want)
	}
}

// TestAskBuf checks that AskBuf copies the answer into the caller's buffer
// when it has room (the same backing array comes back, and the answer's
// data aliases it), grows it when not, and that pipelined AskBufs each get
// their own answer in their own buffer.
func TestAskBuf(t *testing.T) {
	ln := listen(t)
	serve(t, ln, nil, objectServer(true))
	c, err := Dial(context.Background(), "tcp", ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	ask := func(oid zodb.Oid, buf []byte) ([]byte, proto.AnswerObject, error) {
		var a proto.AnswerObject
		buf, err := c.AskBuf(ctx, &proto.AskObject{Oid: oid, At: proto.InvalidTid, Before: 10}, &a, buf)
		return buf, a, err
	}
	small := make([]byte, 0, 4)
	got, a, err := ask(7, small)
	if err != nil || string(a.Data) != "data of 7" {
		t.Fatalf("AskBuf into a small buffer: %q %v", a.Data, err)
	}
	if cap(got) < len("data of 7") {
		t.Errorf("AskBuf into a small buffer returned a buffer of capacity %d", cap(got))
	}
	big := make([]byte, 0, 4096)
	got, a, err = ask(8, big)
	if err != nil || string(a.Data) != "data of 8" {
		t.Fatalf("AskBuf: %q %v", a.Data, err)
	}
	if &got[:1][0] != &big[:1][0] {
		t.Error("AskBuf did not answer in the buffer given, which had room")
	}
	clear(got) // the answer's data aliases the buffer returned
	if !bytes.Equal(a.Data, make([]byte, len("data of 8"))) {
		t.Errorf("the answer's data does not alias the buffer returned: %q", a.Data)
	}
	if _, _, err := ask(666, big); err == nil {
		t.Error("AskBuf of a missing oid: no error")
	}
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 0, 256)
			for i := 0; i < 50; i++ {
				oid := zodb.Oid(g*100 + i)
				var a proto.AnswerObject
				var err error
				buf, err = c.AskBuf(ctx, &proto.AskObject{Oid: oid, At: proto.InvalidTid, Before: 10}, &a, buf[:0])
				if err != nil || a.Oid != oid || string(a.Data) != fmt.Sprintf("data of %d", oid) {
					t.Errorf("AskBuf %d: %q %v", oid, a.Data, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestRecvQueueBounded: the queue of Recv is reset only when it is
// empty; while the receiver stays one packet behind the reader (a master
// that streams invalidations to a client whose loop never quite catches
// up), every packet ever received kept a slot and the queue's array grew
// with the total number of packets, not with the number waiting.
func TestRecvQueueBounded(t *testing.T) {
	ln := listen(t)
	serve(t, ln, nil, func(c *Conn, r *Request) { r.Release() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := DialOptions(ctx, "tcp", ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	notif := func(id uint32) proto.Packet {
		return proto.Packet{ID: id, Code: proto.CodePing, Args: []byte{0x90}}
	}
	// One packet waiting at all times, 100000 received in all.
	c.dispatch(notif(0))
	const n = 100000
	for i := 1; i <= n; i++ {
		c.dispatch(notif(uint32(i)))
		r, err := c.Recv()
		if err != nil {
			t.Fatal(err)
		}
		r.Release()
	}
	c.qmu.Lock()
	waiting, slots := len(c.queue)-c.qhead, cap(c.queue)
	c.qmu.Unlock()
	if waiting != 1 {
		t.Fatalf("%d packets waiting; want 1", waiting)
	}
	if slots > 1024 {
		t.Errorf("Recv's queue holds %d slots for 1 packet waiting (after %d received): it grows with every packet while never empty", slots, n)
	}
}
