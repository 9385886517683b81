package zeo

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
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
	c.send(t, 5000, "iterator_start", start, 2)
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

// TestRecordsOutliveTransactionIterator: ZEO's server iterates a
// transaction's records with an iterator of their own (iter(txn_info)),
// which goes on when the client advances the transaction iterator
// (iterator_next) before it has read every record. The records do not
// end early (they did: the record iterator read the transaction
// iterator's records, and stopped when it moved on).
func TestRecordsOutliveTransactionIterator(t *testing.T) {
	for _, how := range []string{"iterator_next", "iterator_gc"} {
		t.Run(how, func(t *testing.T) {
			stor := openWritable(t)
			addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}})
			c := dialRawRW(t, addr, wire.Pickle)
			c.tpcBegin(5)
			for oid := 1; oid <= 3; oid++ {
				c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(uint64(oid)); e.None(); e.Bytes([]byte("x")); e.Int(5) })
			}
			c.call(t, 10, "vote", func(e *wire.Encoder) { e.Int(5) }, 1)
			r := c.call(t, 11, "tpc_finish", func(e *wire.Encoder) { e.Int(5) }, 1)
			t1 := zodb.Tid(binary.BigEndian.Uint64(r.B))
			var id int64 = 20
			commitRaw(t, c, &id, 4, 0, []byte("second"))

			iid := c.call(t, 30, "iterator_start", func(e *wire.Encoder) { e.None(); e.None() }, 2).Int
			txn := c.call(t, 31, "iterator_next", func(e *wire.Encoder) { e.Int(iid) }, 1)
			if zodb.Tid(binary.BigEndian.Uint64(txn.Items[0].B)) != t1 {
				t.Fatalf("iterator_next: %v", txn)
			}
			riid := c.call(t, 32, "iterator_record_start", func(e *wire.Encoder) { e.Int(iid); e.Oid8(uint64(t1)) }, 2).Int
			rec := c.call(t, 33, "iterator_record_next", func(e *wire.Encoder) { e.Int(riid) }, 1)
			if rec.IsNone() {
				t.Fatal("no first record")
			}
			switch how {
			case "iterator_next":
				c.call(t, 34, "iterator_next", func(e *wire.Encoder) { e.Int(iid) }, 1)
			case "iterator_gc":
				c.oneway("iterator_gc", 1, func(e *wire.Encoder) { e.BeginList(1); e.Int(iid); e.EndList(1) })
			}
			n := 1
			for i := int64(0); ; i++ {
				rec = c.call(t, 40+i, "iterator_record_next", func(e *wire.Encoder) { e.Int(riid) }, 1)
				if rec.IsNone() {
					break
				}
				n++
			}
			if n != 3 {
				t.Fatalf("transaction %s has 3 records; the record iterator returned %d after %s of its transaction iterator", t1, n, how)
			}
		})
	}
}
