package fs1backend

import (
	"crypto/sha1"
	"sync/atomic"

	"github.com/zodbd/zodbd/zodb"
)

// sumCache remembers the sha1 of data records the FileStorage backend
// served, so that a record loaded again is not hashed again (NEO/py's
// storage keeps the checksum in its database; a FileStorage has none). It
// is direct-mapped by record position: a slot holds the last record that
// hashed to it. An entry also names the revision (oid, serial) whose data
// it hashed: an online pack moves records, and a position of the packed
// file may hold another record than the same position of the file before
// (a revision's data never changes, wherever it is). Lookups and hits
// write nothing shared; a miss publishes a new entry with one atomic store.
type sumCache struct {
	slots [sumCacheSlots]atomic.Pointer[sumEntry]
}

// sumCacheSlots is the number of slots (a power of two): 64 Ki slots,
// 512 KiB of pointers plus 32 bytes per entry filled.
const sumCacheSlots = 1 << 16

type sumEntry struct {
	pos    int64
	oid    zodb.Oid
	serial zodb.Tid
	sum    [20]byte
}

// sum returns the sha1 of data, the data of revision (oid, serial) read
// from the record at pos.
func (c *sumCache) sum(pos int64, oid zodb.Oid, serial zodb.Tid, data []byte) [20]byte {
	slot := &c.slots[uint64(pos)*0x9E3779B97F4A7C15>>48] // Fibonacci hashing: 16 bits
	if e := slot.Load(); e != nil && e.pos == pos && e.oid == oid && e.serial == serial {
		return e.sum
	}
	e := &sumEntry{pos: pos, oid: oid, serial: serial, sum: sha1.Sum(data)}
	slot.Store(e)
	return e.sum
}
