package zeo

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"math/rand"
	"net"
	"path/filepath"
	"testing"
	"time"

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
