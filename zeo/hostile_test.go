package zeo

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// Hostile requests against a running server (tests/test_hostile.py has
// them at full size against zodbd serve, with the process's RSS).

func pickleStr(s string) []byte {
	return append(binary.LittleEndian.AppendUint32([]byte{'X'}, uint32(len(s))), s...)
}

// pickleCall is (msgid, False, name, args): msgid and args are pickle
// fragments that push one value each.
func pickleCall(msgid []byte, name string, args []byte) []byte {
	b := append([]byte{0x80, 3, '('}, msgid...)
	b = append(append(b, 0x89), pickleStr(name)...)
	return append(append(b, args...), 't', '.')
}

var hostileRegisterArgs = append(pickleStr("1"), 0x89, 0x86)

// hostileFrames are the attacks, small: each must be answered with an
// error or end its connection, and leave the server serving.
func hostileFrames() map[string][]byte {
	dag := []byte{'(', 'K', 1, 'q', 0}
	for i := 1; i <= 40; i++ {
		dag = append(dag, 'h', byte(i-1), 'h', byte(i-1), 0x86, 'q', byte(i))
	}
	noneChunk := append(append([]byte{'('}, bytes.Repeat([]byte{'N'}, 1000)...), 'e')
	refChunk := append(append([]byte{'('}, bytes.Repeat([]byte{'h', 0}, 1000)...), 'e')
	return map[string][]byte{
		"nested msgid":   pickleCall(append([]byte{'K', 1}, bytes.Repeat([]byte{0x85}, 100000)...), "register", hostileRegisterArgs),
		"memo dag msgid": pickleCall(append(dag, 't'), "register", hostileRegisterArgs),
		"list of None": pickleCall([]byte{'K', 1}, "register",
			append(append([]byte{']'}, bytes.Repeat(noneChunk, 1000)...), 0x85)),
		"list of refs": pickleCall([]byte{'K', 1}, "register",
			append(append(append(pickleStr("x"), 'q', 0, ']'), bytes.Repeat(refChunk, 500)...), 0x86)),
	}
}

// TestHostileFrames sends each attack before and after register, then a
// load on the same connection when it is still open, and on a new one.
func TestHostileFrames(t *testing.T) {
	fs := openFixture(t)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: fs}}})
	for name, frame := range hostileFrames() {
		for _, registered := range []bool{false, true} {
			var c *rawClient
			if registered {
				c = dialRaw(t, addr, wire.Pickle)
			} else {
				c = dialRawNoRegister(t, addr, wire.Pickle)
			}
			c.enc.RawFrame(frame)
			c.flush(t)
			c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			f, err := wire.ReadFrame(c.br, nil, 1<<20)
			switch {
			case err == io.EOF:
				// closed
			case err != nil:
				t.Errorf("%s: %v, want a reply or the connection closed", name, err)
			default:
				// An error reply to msgid 1, and the connection goes on.
				msg, err := wire.NewDecoder(wire.Pickle).DecodeMessage(f)
				if err != nil || msg.ID.Kind != wire.Int || msg.ID.Int != 1 || msg.Flags.Int != 2 {
					t.Errorf("%s: reply %v %v", name, msg, err)
				}
				if registered {
					c.sendLoad(0, zodb.TidMax)
					c.flush(t)
					if m := c.read(t); m.Flags.Int != 0 {
						t.Errorf("%s: load after the error: %v", name, m.Args)
					}
				}
			}
			c.nc.Close()
			d := dialRaw(t, addr, wire.Pickle)
			d.sendLoad(0, zodb.TidMax)
			d.flush(t)
			if m := d.read(t); m.Flags.Int != 0 {
				t.Fatalf("%s: a new connection's load: %v", name, m.Args)
			}
			d.nc.Close()
		}
	}
}

// TestOverLimitAnswered: a call over the decoder's limits whose msgid
// came first gets a ValueError reply; a bad msgid closes the connection.
func TestOverLimitAnswered(t *testing.T) {
	fs := openFixture(t)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: fs}}})
	c := dialRaw(t, addr, wire.Pickle)
	c.enc.RawFrame(hostileFrames()["list of None"])
	c.flush(t)
	m := c.read(t)
	if m.ID.Int != 1 || m.Flags.Int != 2 || m.Args.Len() != 2 || string(m.Args.Items[0].B) != "builtins.ValueError" {
		t.Fatalf("reply %v %v %v, want a ValueError", m.ID, m.Flags, m.Args)
	}
	c.sendLoad(0, zodb.TidMax)
	c.flush(t)
	if m := c.read(t); m.Flags.Int != 0 {
		t.Errorf("load after the error: %v", m.Args)
	}
	c.enc.RawFrame(hostileFrames()["memo dag msgid"])
	c.flush(t)
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if f, err := wire.ReadFrame(c.br, nil, 1<<20); err != io.EOF {
		t.Errorf("memo dag msgid: %q %v, want the connection closed", f, err)
	}
}
