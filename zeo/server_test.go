package zeo

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// startServer serves stor on a random port of 127.0.0.1 until the test ends.
func startServer(tb testing.TB, cfg Config) string {
	tb.Helper()
	_, addr := startServerOn(tb, cfg, func(ln net.Listener) net.Listener { return ln })
	return addr
}

// startServerOn is startServer serving on wrap(a listener on 127.0.0.1);
// it also returns the server.
func startServerOn(tb testing.TB, cfg Config, wrap func(net.Listener) net.Listener) (*Server, string) {
	tb.Helper()
	if wrap == nil {
		wrap = func(ln net.Listener) net.Listener { return ln }
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return serveListener(tb, cfg, wrap, ln)
}

// startServerUnix is startServer on a Unix socket: it returns the
// socket's path (which dialRaw takes).
func startServerUnix(tb testing.TB, cfg Config) string {
	tb.Helper()
	ln, err := net.Listen("unix", filepath.Join(tb.TempDir(), "zeo.sock"))
	if err != nil {
		tb.Fatal(err)
	}
	_, addr := serveListener(tb, cfg, func(ln net.Listener) net.Listener { return ln }, ln)
	return addr
}

// serveListener serves cfg on wrap(ln) until the test ends.
func serveListener(tb testing.TB, cfg Config, wrap func(net.Listener) net.Listener, ln net.Listener) (*Server, string) {
	tb.Helper()
	if cfg.Logf == nil {
		cfg.Logf = tb.Logf
	}
	srv, err := NewServer(cfg)
	if err != nil {
		ln.Close()
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Serve(wrap(ln)); close(done) }()
	tb.Cleanup(func() { srv.Close(); <-done })
	return srv, ln.Addr().String()
}

func openFixture(tb testing.TB) *fs1.FileStorage {
	tb.Helper()
	fs, err := fs1.Open("../fs1/testdata/1.fs", &fs1.Options{Logf: tb.Logf})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { fs.Close() })
	return fs
}

// rawClient speaks the protocol with zeo/wire directly.
type rawClient struct {
	nc  net.Conn
	br  *bufio.Reader
	dec *wire.Decoder
	enc wire.Encoder
	buf []byte
}

func dialRaw(tb testing.TB, addr string, m wire.Marshal) *rawClient {
	tb.Helper()
	c := dialRawNoRegister(tb, addr, m)
	c.call(tb, 1, "register", func(e *wire.Encoder) { e.Str("1"); e.Bool(true) }, 2)
	return c
}

// dialRawNoRegister connects (to a Unix socket when addr is a path) and
// does the handshake only.
func dialRawNoRegister(tb testing.TB, addr string, m wire.Marshal) *rawClient {
	tb.Helper()
	network := "tcp"
	if strings.HasPrefix(addr, "/") {
		network = "unix"
	}
	nc, err := net.Dial(network, addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { nc.Close() })
	c := &rawClient{nc: nc, br: bufio.NewReader(nc), dec: wire.NewDecoder(m), enc: wire.Encoder{M: m}}
	proto, err := wire.ReadFrame(c.br, nil, 100)
	if err != nil || string(proto) != string([]byte{byte(m), '5'}) {
		tb.Fatalf("handshake: %q %v", proto, err)
	}
	c.enc.RawFrame(proto)
	return c
}

// send sends a request with n args written by args, without waiting for
// its reply.
func (c *rawClient) send(tb testing.TB, id int64, name string, args func(e *wire.Encoder), n int) {
	tb.Helper()
	idv := wire.Value{Kind: wire.Int, Int: id}
	c.enc.BeginRequest(&idv, false, name)
	c.enc.BeginTuple(n)
	args(&c.enc)
	c.enc.EndTuple(n)
	c.enc.EndMessage()
	c.flush(tb)
}

// call sends a request with n args written by args and returns the reply.
func (c *rawClient) call(tb testing.TB, id int64, name string, args func(e *wire.Encoder), n int) wire.Value {
	tb.Helper()
	c.send(tb, id, name, args, n)
	msg := c.read(tb)
	if msg.ID.Int != id || msg.Flags.Int != 0 {
		tb.Fatalf("%s: reply %v %v %v", name, msg.ID, msg.Flags, msg.Args)
	}
	return msg.Args
}

func (c *rawClient) flush(tb testing.TB) {
	if _, err := c.nc.Write(c.enc.Buf); err != nil {
		tb.Fatal(err)
	}
	c.enc.Buf = c.enc.Buf[:0]
}

func (c *rawClient) read(tb testing.TB) wire.Message {
	for {
		f, err := wire.ReadFrame(c.br, c.buf, 1<<30)
		if err != nil {
			tb.Fatal(err)
		}
		c.buf = f[:0]
		msg, err := c.dec.DecodeMessage(f)
		if err != nil {
			tb.Fatal(err)
		}
		if string(msg.Name) == ".reply" {
			return msg
		}
	}
}

func (c *rawClient) sendLoad(oid zodb.Oid, before zodb.Tid) {
	c.enc.LoadBeforeRequest(uint64(oid), uint64(before))
}

// TestPipelinedLoads sends every loadBefore of the fixture on several
// connections at once, pipelined, and checks each reply against fs1.
func TestPipelinedLoads(t *testing.T) {
	fs := openFixture(t)
	ctx := context.Background()
	for _, m := range []wire.Marshal{wire.Pickle, wire.Msgpack} {
		addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: fs}}, Marshal: m})
		oids := fs.Index().Oids()
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := dialRaw(t, addr, m)
				for _, oid := range oids {
					c.sendLoad(oid, zodb.TidMax)
				}
				c.flush(t)
				for _, oid := range oids {
					msg := c.read(t)
					if got := binary.BigEndian.Uint64(msg.ID.Items[0].B); zodb.Oid(got) != oid {
						t.Errorf("%v: reply for %x, want %x (order)", m, got, oid)
						return
					}
					want, serial, next, err := fs.LoadBefore(ctx, oid, zodb.TidMax, nil)
					if err != nil {
						if msg.Flags.Int != 2 {
							t.Errorf("%v: %s: got %v, want error %v", m, oid, msg.Args, err)
						}
						continue
					}
					r := msg.Args
					if r.Kind != wire.Tuple || len(r.Items) != 3 || string(r.Items[0].B) != string(want) ||
						binary.BigEndian.Uint64(r.Items[1].B) != uint64(serial) || next != 0 || !r.Items[2].IsNone() {
						t.Errorf("%v: %s: got %v", m, oid, r)
					}
				}
			}()
		}
		wg.Wait()
	}
}

// BenchmarkLoadBeforeRTT is one client doing loadBefore round trips of
// the fixture's oids; BenchmarkPingPong is a bare TCP echo of frames of
// the same sizes, the floor a ZEO server's round trip cannot beat.
func BenchmarkLoadBeforeRTT(b *testing.B) {
	fs := openFixture(b)
	addr := startServer(b, Config{Storages: []StorageConfig{{Name: "1", Storage: fs}}, Logf: func(string, ...interface{}) {}})
	c := dialRaw(b, addr, wire.Pickle)
	oids := fs.Index().Oids()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.sendLoad(oids[i%len(oids)], zodb.TidMax)
		c.flush(b)
		c.read(b)
	}
}

func BenchmarkPingPong(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	// Echo server: reads a request frame, answers a frame of the size a
	// loadBefore reply of a ~100-byte object has.
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		nc.(*net.TCPConn).SetNoDelay(true)
		br := bufio.NewReader(nc)
		reply := make([]byte, 4+160)
		binary.BigEndian.PutUint32(reply, 160)
		var buf []byte
		for {
			f, err := wire.ReadFrame(br, buf, 1<<20)
			if err != nil {
				return
			}
			buf = f[:0]
			if _, err := nc.Write(reply); err != nil {
				return
			}
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	br := bufio.NewReader(nc)
	req := make([]byte, 4+70)
	binary.BigEndian.PutUint32(req, 70)
	var buf []byte
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := nc.Write(req); err != nil {
			b.Fatal(err)
		}
		f, err := wire.ReadFrame(br, buf, 1<<20)
		if err != nil {
			b.Fatal(err)
		}
		buf = f[:0]
	}
}

var _ = io.EOF

// readUntil reads messages of c until one named name (".reply" included)
// arrives, within d; it fails the test otherwise.
func (c *rawClient) readUntil(t *testing.T, name string, d time.Duration) wire.Message {
	t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(d))
	defer c.nc.SetReadDeadline(time.Time{})
	for {
		f, err := wire.ReadFrame(c.br, nil, 1<<20)
		if err != nil {
			t.Fatalf("waiting for %s: %v", name, err)
		}
		msg, err := c.dec.DecodeMessage(f)
		if err != nil {
			t.Fatal(err)
		}
		if string(msg.Name) == name {
			return msg
		}
	}
}
