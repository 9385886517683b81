package zeo

import (
	"strings"
	"testing"

	"github.com/zodbd/zodbd/zeo/wire"
)

// A connection keeps at most maxIterators iterators open: one more gets a
// ValueError (the connection goes on), and iterator_gc makes room again.
func TestIteratorLimit(t *testing.T) {
	stor := openWritable(t)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}})
	c := dialRawRW(t, addr, wire.Pickle)
	start := func(e *wire.Encoder) { e.None(); e.None() }
	var first int64
	for i := 0; i < maxIterators; i++ {
		r := c.call(t, int64(10+i), "iterator_start", start, 2)
		if i == 0 {
			first = r.Int
		}
	}
	idv := wire.Value{Kind: wire.Int, Int: 5000}
	c.enc.BeginRequest(&idv, false, "iterator_start")
	c.enc.BeginTuple(2)
	start(&c.enc)
	c.enc.EndTuple(2)
	c.enc.EndMessage()
	c.flush(t)
	msg := c.read(t)
	if msg.Flags.Int == 0 || !strings.Contains(msg.Args.String(), "too many iterators") {
		t.Fatalf("iterator %d: %v %v, want a ValueError", maxIterators+1, msg.Flags, msg.Args)
	}
	c.oneway("iterator_gc", 1, func(e *wire.Encoder) {
		e.BeginList(1)
		e.Int(first)
		e.EndList(1)
	})
	c.call(t, 5001, "iterator_start", start, 2)
}
