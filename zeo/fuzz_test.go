package zeo

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// FuzzHandle sends one arbitrary frame after a valid handshake and
// register, and checks that the server survives it: it answers or closes
// that connection, and a new connection is still served.
func FuzzHandle(f *testing.F) {
	seeds := []func(e *wire.Encoder){
		func(e *wire.Encoder) { // loadBefore with a short oid
			id := wire.Value{Kind: wire.Int, Int: 5}
			e.BeginRequest(&id, false, "loadBefore")
			e.BeginTuple(2)
			e.Bytes([]byte("x"))
			e.Oid8(uint64(zodb.TidMax))
			e.EndTuple(2)
			e.EndMessage()
		},
		func(e *wire.Encoder) { // history with a negative size
			id := wire.Value{Kind: wire.Int, Int: 6}
			e.BeginRequest(&id, false, "history")
			e.BeginTuple(2)
			e.Oid8(0)
			e.Int(-5)
			e.EndTuple(2)
			e.EndMessage()
		},
		func(e *wire.Encoder) { // iterator_record_start on nothing
			id := wire.Value{Kind: wire.Int, Int: 7}
			e.BeginRequest(&id, false, "iterator_record_start")
			e.BeginTuple(2)
			e.Int(1)
			e.Oid8(1)
			e.EndTuple(2)
			e.EndMessage()
		},
		func(e *wire.Encoder) { // undoInfo with a spec
			id := wire.Value{Kind: wire.Int, Int: 8}
			e.BeginRequest(&id, false, "undoInfo")
			e.BeginTuple(3)
			e.Int(0)
			e.Int(-20)
			e.BeginDict(1)
			e.Str("user_name")
			e.Bytes([]byte("alice"))
			e.EndDict(1)
			e.EndTuple(3)
			e.EndMessage()
		},
	}
	for _, s := range seeds {
		e := wire.Encoder{M: wire.Pickle}
		s(&e)
		f.Add(e.Buf[4:])
	}
	// The attacks of hostileFrames, small.
	f.Add(pickleCall(append([]byte{'K', 1}, bytes.Repeat([]byte{0x85}, 100)...), "register", hostileRegisterArgs))
	f.Add(hostileFrames()["memo dag msgid"])
	f.Add(pickleCall([]byte{'K', 1}, "register", append(append([]byte{']', '('}, bytes.Repeat([]byte{'N'}, 100)...), 'e', 0x85)))
	f.Add(pickleCall([]byte{'K', 1}, "register", append(append(append(pickleStr("x"), 'q', 0, ']', '('), bytes.Repeat([]byte{'h', 0}, 100)...), 'e', 0x86)))
	fs := openFixture(f)
	// The server recovers from a panic in a connection (and logs it): make
	// that a fuzz failure.
	var panics atomic.Int64
	var lastPanic atomic.Value
	logf := func(format string, args ...interface{}) {
		if strings.Contains(fmt.Sprintf(format, args...), "internal error") {
			panics.Add(1)
			lastPanic.Store(fmt.Sprintf(format, args...))
		}
	}
	srv, err := NewServer(Config{Storages: []StorageConfig{{Name: "1", Storage: fs}}, Logf: logf})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		for round := 0; round < 2; round++ {
			cli, srvSide := net.Pipe()
			c := newConn(srv, srvSide)
			done := make(chan struct{})
			go func() { c.serve(); close(done) }()
			br := bufio.NewReader(cli)
			cli.SetDeadline(time.Now().Add(5 * time.Second))
			proto, err := wire.ReadFrame(br, nil, 100)
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			e := wire.Encoder{M: wire.Pickle}
			e.RawFrame(proto)
			id := wire.Value{Kind: wire.Int, Int: 1}
			e.BeginRequest(&id, false, "register")
			e.BeginTuple(2)
			e.Str("1")
			e.Bool(true)
			e.EndTuple(2)
			e.EndMessage()
			if round == 0 {
				e.RawFrame(frame)
			} else {
				// The server still answers a plain load afterwards.
				c := rawClient{enc: e}
				c.sendLoad(0, zodb.TidMax)
				e = c.enc
			}
			go func() { cli.Write(e.Buf) }()
			// Read until the connection closes or the load is answered.
			n := 0
			for {
				f, err := wire.ReadFrame(br, nil, 1<<30)
				if err != nil {
					break
				}
				n++
				if round == 1 && n == 2 {
					if len(f) == 0 {
						t.Fatal("empty reply")
					}
					break
				}
				if round == 0 && n >= 2 {
					break
				}
			}
			if round == 1 && n < 2 {
				t.Fatal("server did not answer a load after the fuzz input")
			}
			cli.Close()
			<-done
			if panics.Load() != 0 {
				t.Fatalf("server panicked: %v", lastPanic.Load())
			}
		}
	})
}
