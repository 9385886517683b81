package zeo

import (
	"encoding/binary"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// TestConnectionsLeaveNothing opens and ends connections in every way a
// long-running server meets them (closed before the handshake, after it,
// after register, in the middle of a frame, in a transaction before and
// after its vote, with replies unread, after a commit, after a malformed
// frame) many times over, and then checks that the server holds nothing
// for them: no goroutine, no connection in its tables or registered on
// the storage, no frame or queued-reply charge, no transaction memory,
// and the commit lock free (a new commit goes through).
func TestConnectionsLeaveNothing(t *testing.T) {
	for _, m := range []wire.Marshal{wire.Pickle, wire.Msgpack} {
		stor := openWritable(t)
		srv, addr := startServerOn(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, Marshal: m}, nil)
		c := dialRawRW(t, addr, m)
		var id int64 = 10
		serial := commitRaw(t, c, &id, 1, 0, []byte("first"))
		c.nc.Close()
		settle := func() int {
			deadline := time.Now().Add(10 * time.Second)
			for {
				srv.mu.Lock()
				n := len(srv.conns)
				srv.mu.Unlock()
				if n == 0 || time.Now().After(deadline) {
					runtime.GC()
					return runtime.NumGoroutine()
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		base := settle()

		kinds := map[string]func(){
			"before handshake": func() {
				nc, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				nc.Close()
			},
			"after handshake": func() { dialRawNoRegister(t, addr, m).nc.Close() },
			"after register":  func() { dialRaw(t, addr, m).nc.Close() },
			"mid-frame": func() {
				c := dialRaw(t, addr, m)
				var hdr [4]byte
				binary.BigEndian.PutUint32(hdr[:], 4<<20)
				c.nc.Write(hdr[:])
				c.nc.Write(make([]byte, 2<<20))
				c.nc.Close()
			},
			"in a transaction": func() {
				c := dialRawRW(t, addr, m)
				c.enc.BeginCall("tpc_begin")
				c.enc.BeginTuple(6)
				c.enc.Int(5)
				c.enc.Bytes(nil)
				c.enc.Bytes(nil)
				c.enc.BeginDict(0)
				c.enc.EndDict(0)
				c.enc.None()
				c.enc.Str(" ")
				c.enc.EndTuple(6)
				c.enc.EndMessage()
				c.enc.BeginCall("storea")
				c.enc.BeginTuple(4)
				c.enc.Oid8(2)
				c.enc.Oid8(0)
				c.enc.Bytes(make([]byte, 100<<10))
				c.enc.Int(5)
				c.enc.EndTuple(4)
				c.enc.EndMessage()
				c.flush(t)
				c.nc.Close()
			},
			"voted": func() {
				c := dialRawRW(t, addr, m)
				c.enc.BeginCall("tpc_begin")
				c.enc.BeginTuple(6)
				c.enc.Int(6)
				c.enc.Bytes(nil)
				c.enc.Bytes(nil)
				c.enc.BeginDict(0)
				c.enc.EndDict(0)
				c.enc.None()
				c.enc.Str(" ")
				c.enc.EndTuple(6)
				c.enc.EndMessage()
				c.enc.BeginCall("storea")
				c.enc.BeginTuple(4)
				c.enc.Oid8(1)
				c.enc.Oid8(uint64(serial))
				c.enc.Bytes([]byte("voted, never finished"))
				c.enc.Int(6)
				c.enc.EndTuple(4)
				c.enc.EndMessage()
				c.call(t, 20, "vote", func(e *wire.Encoder) { e.Int(6) }, 1) // holds the commit lock
				c.nc.Close()
			},
			"replies unread": func() {
				c := dialRaw(t, addr, m)
				for range 2000 {
					c.sendLoad(1, zodb.TidMax)
				}
				c.flush(t)
				c.nc.Close()
			},
			"after a commit": func() {
				c := dialRawRW(t, addr, m)
				id := int64(30)
				serial = commitRaw(t, c, &id, 1, serial, []byte("again"))
				c.nc.Close()
			},
			"malformed frame": func() {
				c := dialRaw(t, addr, m)
				c.enc.RawFrame([]byte("\xff\xfe not a message"))
				c.flush(t)
				c.nc.Close()
			},
		}
		for range 20 {
			for _, f := range kinds {
				f()
			}
		}
		n := settle()
		for deadline := time.Now().Add(10 * time.Second); n > base && time.Now().Before(deadline); n = runtime.NumGoroutine() {
			time.Sleep(10 * time.Millisecond) // a goroutine on its way out
		}
		if n > base {
			buf := make([]byte, 1<<20)
			t.Errorf("%v: %d goroutines after the connections ended, %d before:\n%s", m, n, base, buf[:runtime.Stack(buf, true)])
		}
		srv.mu.Lock()
		nconns := len(srv.conns)
		srv.mu.Unlock()
		st := srv.storages["1"]
		st.mu.Lock()
		registered := len(st.conns)
		st.mu.Unlock()
		if nconns != 0 || registered != 0 {
			t.Errorf("%v: %d connections in the server's table, %d registered on the storage", m, nconns, registered)
		}
		if h, q, tm := srv.frameMem.Held(), srv.budget.Charged(), srv.txnMem.Used(); h != 0 || q != 0 || tm != 0 {
			t.Errorf("%v: still charged: frames %d, queued replies %d, transaction memory %d", m, h, q, tm)
		}
		// The commit lock is free: a commit goes through.
		c = dialRawRW(t, addr, m)
		id = 40
		commitRaw(t, c, &id, 1, serial, []byte("last"))
		c.nc.Close()
	}
}
