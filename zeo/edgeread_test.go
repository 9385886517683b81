package zeo

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"math/rand"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// TestEdgeReadSplits sends one stream of requests — the handshake's answer
// and register with the first ones, loads of every object, and requests
// bigger than the read buffer (one assembled in a growing buffer, two of
// the size whose buffer is kept for the next) — in pieces of every size,
// from whole to one byte, and checks every reply in order: the request
// loop that waits for the poller after a short read (edgeread.go) must
// neither lose a byte that arrived while it answered nor hang on one that
// is already there. Over TCP (edgeread.go's loop) and over a Unix socket
// (the buffered loop).
func TestEdgeReadSplits(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) { testEdgeReadSplits(t, network) })
	}
}

func testEdgeReadSplits(t *testing.T, network string) {
	fs := openFixture(t)
	ctx := context.Background()
	cfg := Config{Storages: []StorageConfig{{Name: "1", Storage: fs}}}
	addr := ""
	if network == "unix" {
		addr = startServerUnix(t, cfg)
	} else {
		addr = startServer(t, cfg)
	}
	oids := fs.Index().Oids()

	type want struct {
		id  int64
		oid zodb.Oid // a load's; else a request answered with an error
	}
	for _, split := range []int{0, 1, 7, 4096, 65536 + 3, -1} {
		c := dialRawNoRegister(t, addr, wire.Pickle) // its buffer holds the handshake's answer
		var wants []want
		id := int64(1)
		call := func(name string, args func(e *wire.Encoder), n int) {
			idv := wire.Value{Kind: wire.Int, Int: id}
			c.enc.BeginRequest(&idv, false, name)
			c.enc.BeginTuple(n)
			args(&c.enc)
			c.enc.EndTuple(n)
			c.enc.EndMessage()
			id++
		}
		call("register", func(e *wire.Encoder) { e.Str("1"); e.Bool(true) }, 2)
		wants = append(wants, want{id: 1, oid: zodb.Oid(1 << 62)}) // register's None
		loads := func() {
			for _, oid := range oids {
				call("loadBefore", func(e *wire.Encoder) { e.Oid8(uint64(oid)); e.Oid8(uint64(zodb.TidMax)) }, 2)
				wants = append(wants, want{id: id - 1, oid: oid})
			}
		}
		loads()
		for _, size := range []int{3<<20 + 5, 100 << 10, 90 << 10} {
			big := make([]byte, size)
			call("loadBefore", func(e *wire.Encoder) { e.Bytes(big); e.Oid8(uint64(zodb.TidMax)) }, 2)
			wants = append(wants, want{id: id - 1})
			loads()
		}
		stream := c.enc.Buf
		c.enc.Buf = nil

		rnd := rand.New(rand.NewSource(int64(split)))
		go func() {
			for sent := 0; len(stream) > 0; {
				n := len(stream)
				switch {
				case split < 4096 && sent >= 16<<10: // small pieces up to the big requests
					n = min(n, 4096)
				case split > 0:
					n = min(n, split)
				case split < 0: // random pieces
					n = min(n, 1+rnd.Intn(70000))
				}
				if _, err := c.nc.Write(stream[:n]); err != nil {
					return
				}
				stream, sent = stream[n:], sent+n
				if split != 0 && rnd.Intn(64) == 0 {
					time.Sleep(50 * time.Microsecond) // let the server drain the socket
				}
			}
		}()
		c.nc.SetReadDeadline(time.Now().Add(60 * time.Second))
		for i, w := range wants {
			f, err := wire.ReadFrame(c.br, nil, 1<<30)
			if err != nil {
				t.Fatalf("split %d: reply %d of %d: %v", split, i, len(wants), err)
			}
			msg, err := c.dec.DecodeMessage(f)
			if err != nil {
				t.Fatalf("split %d: reply %d: %v", split, i, err)
			}
			if msg.ID.Kind != wire.Int || msg.ID.Int != w.id {
				t.Fatalf("split %d: reply %d is to %v, want %d", split, i, msg.ID, w.id)
			}
			switch {
			case w.oid == 1<<62:
				if msg.Flags.Int != 0 {
					t.Fatalf("split %d: register: %v", split, msg.Args)
				}
			case w.id > 1 && w.oid == 0 && msg.Flags.Int == 2:
				// the big request, answered with an error
			default:
				data, serial, _, err := fs.LoadBefore(ctx, w.oid, zodb.TidMax, nil)
				r := msg.Args
				if err != nil { // an object deleted: an error reply
					if msg.Flags.Int != 2 {
						t.Fatalf("split %d: reply %d (oid %s): %v, want the error %v", split, i, w.oid, r, err)
					}
					continue
				}
				if msg.Flags.Int != 0 || r.Kind != wire.Tuple || len(r.Items) != 3 ||
					string(r.Items[0].B) != string(data) || binary.BigEndian.Uint64(r.Items[1].B) != uint64(serial) {
					t.Fatalf("split %d: reply %d (oid %s): %v %v (%v)", split, i, w.oid, msg.Flags, r, err)
				}
			}
		}
	}
}

// TestEdgeConn: the request loop of edgeread.go reads the raw sockets of
// TCP connections, and no other (a TLS connection's bytes are records; a
// Unix socket gains nothing from it).
func TestEdgeConn(t *testing.T) {
	pair := func(network, addr string) (net.Conn, net.Conn) {
		ln, err := net.Listen(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := net.Dial(network, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); s.Close() })
		return c, s
	}
	dir := t.TempDir()
	_, tcp := pair("tcp", "127.0.0.1:0")
	_, unix := pair("unix", filepath.Join(dir, "s"))
	_, packet := pair("unixpacket", filepath.Join(dir, "p"))
	for _, tc := range []struct {
		name string
		nc   net.Conn
		want bool
	}{
		{"tcp", tcp, true},
		{"unix", unix, false},
		{"unixpacket", packet, false},
		{"tls", tls.Server(tcp, &tls.Config{}), false},
	} {
		if _, ok := edgeConn(tc.nc); ok != tc.want {
			t.Errorf("%s: edgeConn ok %v, want %v", tc.name, ok, tc.want)
		}
	}
}

// TestEdgeReadEOFBehindOneway: a client's last request is one-way
// (tpc_begin, or a heartbeat) and its end of the stream (FIN) arrives with it while the
// server is still answering the request before (a load, held up here).
// The poller reported both arrivals while the server was busy, in one
// readiness that the server's next wait took; the read after it got the
// request and the end of the stream together. The loop then waited for
// the poller, as after a call, and no edge came for an end of stream
// already read: the connection stayed open, with its goroutine, after
// the client had gone (seen in CI as a goroutine left by zeo/client's
// TestCloseLeavesNothing, whose clients close in mid-transaction).
func TestEdgeReadEOFBehindOneway(t *testing.T) {
	for _, last := range []string{"tpc_begin", "heartbeat"} {
		t.Run(last, func(t *testing.T) { testEdgeReadEOFBehindOneway(t, last) })
	}
	t.Run("call", testEdgeReadEOFBehindCall)
}

// testEdgeReadEOFBehindCall: the same with a call as the last request and
// a client that closes (the loop waits without a read after a call): its
// reply draws a reset from the client's side, which ends the connection.
func testEdgeReadEOFBehindCall(t *testing.T) {
	st := &gatedLoads{FileStorage: openFixtureCopy(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
	srv, addr := startServerOn(t, Config{Storages: []StorageConfig{{Name: "1", Storage: st}}}, nil)
	c := dialRaw(t, addr, wire.Pickle)
	c.sendLoad(st.Index().Oids()[0], zodb.TidMax)
	c.flush(t)
	<-st.entered
	c.send(t, 2, "lastTransaction", func(e *wire.Encoder) {}, 0)
	c.nc.Close()
	time.Sleep(50 * time.Millisecond) // both arrive while the load is held
	close(st.release)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if srv.Stats().Connections[""] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection of a client that closed is still open after 10 s")
		}
	}
}

func testEdgeReadEOFBehindOneway(t *testing.T, last string) {
	st := &gatedLoads{FileStorage: openFixtureCopy(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: st}}})
	c := dialRawNoRegister(t, addr, wire.Pickle)
	c.call(t, 1, "register", func(e *wire.Encoder) { e.Str("1"); e.Bool(false) }, 2)
	c.sendLoad(st.Index().Oids()[0], zodb.TidMax)
	c.flush(t)
	<-st.entered // the server answers the load
	if last == "tpc_begin" {
		c.tpcBegin(1)
	} else { // what ZEO's client sends as its heartbeat: (-1, 0, ".reply", None)
		id := wire.Value{Kind: wire.Int, Int: -1}
		c.enc.BeginRequest(&id, false, ".reply")
		c.enc.None()
		c.enc.EndMessage()
	}
	c.flush(t)
	if err := c.nc.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // both arrive while the load is held
	close(st.release)
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if msg := c.read(t); msg.Flags.Int != 0 {
		t.Fatalf("load: %v", msg.Args)
	}
	// The server sees the end of the stream and closes the connection.
	if _, err := c.br.ReadByte(); err != io.EOF {
		t.Fatalf("after the reply: %v, want the server's end of the stream (io.EOF)", err)
	}
}

// gatedLoads is a FileStorage whose LoadBefore, the loads of the ZEO
// server, says on entered that it started and waits for release.
type gatedLoads struct {
	*fs1.FileStorage
	entered chan struct{}
	release chan struct{}
}

func (s *gatedLoads) LoadBefore(ctx context.Context, oid zodb.Oid, before zodb.Tid, dst []byte) ([]byte, zodb.Tid, zodb.Tid, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.release
	return s.FileStorage.LoadBefore(ctx, oid, before, dst)
}
