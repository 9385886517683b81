// Package cache is a client-side cache of object revisions for storage
// drivers that talk to a server (zeo://, later neo://).
//
// The cache follows the read model of package zodb: a Load names a database
// state, Load(oid, at), and the cache keeps, per oid, revisions with the
// range of states in which each is current: [serial, next). A revision
// whose next is not known yet is "open": it is current up to the newest
// state the driver has seen (Head) and stays so until an invalidation for
// the oid closes it. Load(oid, at) is a hit when at lies in a cached range;
// the API user never deals with next (ZEO's end_tid, NEO's next_serial):
// the server's answer carries it and Insert records it.
//
// Coherence rests on one rule that the driver keeps: Insert and Invalidate
// are called in the order the protocol delivers answers and invalidations
// on the connection (for ZEO: on the goroutine that reads the connection,
// frame by frame). ZEO and NEO servers send the invalidation of transaction
// T before any answer that exposes a state at or after T, so an answer that
// says "current" never outlives the invalidation that ends it.
//
// Concurrency: the cache is split in shards by a hash of the oid, each with
// its own lock and byte budget; a Load takes one shard's read lock and
// touches nothing shared by all Loads (the head is read, never written, on
// the load path). Eviction is CLOCK (second chance) per shard: a hit only
// sets the revision's reference bit, when not set already.
package cache

import (
	"sync"
	"sync/atomic"

	"github.com/zodbd/zodbd/zodb"
)

// nShards is the number of shards (a power of two).
const nShards = 64

// revOverhead approximates the memory a cached revision costs beyond its
// data (the rev struct, its slot in the object's list, the ring and the map).
const revOverhead = 96

// Cache caches object revisions. Its methods may be called from any number
// of goroutines at once, with the ordering rule of the package
// documentation for Insert and Invalidate.
type Cache struct {
	shards [nShards]shard
	head   atomic.Uint64 // newest state whose invalidations are all applied
	off    bool          // size <= 0: nothing is stored, only the head is kept
}

type shard struct {
	mu    sync.RWMutex
	objs  map[zodb.Oid]*rev // newest cached revision of each oid
	ring  []*rev            // CLOCK ring: every live revision (and some dead ones)
	hand  int
	bytes int64
	max   int64
	nrev  int      // live revisions
	_     [64]byte // keep shards on different cache lines
}

// rev is one cached revision. The revisions of an oid form a list, newest
// first, whose ranges do not overlap: r.older.next <= r.serial.
type rev struct {
	oid    zodb.Oid
	serial zodb.Tid
	next   zodb.Tid // 0: open (current as of the head)
	data   []byte   // immutable
	older  *rev
	ref    atomic.Bool
	dead   bool
}

// New returns a cache that holds up to about maxBytes of revisions
// (data plus a small overhead per revision). maxBytes <= 0 makes a cache
// that stores nothing (every Load misses) but still keeps the head, so a
// driver can use one code path with the cache on or off.
func New(maxBytes int64) *Cache {
	c := &Cache{off: maxBytes <= 0}
	per := maxBytes / nShards
	for i := range c.shards {
		c.shards[i].objs = make(map[zodb.Oid]*rev)
		c.shards[i].max = per
	}
	return c
}

// Enabled reports whether the cache stores anything.
func (c *Cache) Enabled() bool { return !c.off }

func (c *Cache) shard(oid zodb.Oid) *shard {
	h := uint64(oid) * 0x9e3779b97f4a7c15
	return &c.shards[h>>(64-6)]
}

// Head returns the newest state the cache is coherent with: every
// invalidation up to it has been applied.
func (c *Cache) Head() zodb.Tid { return zodb.Tid(c.head.Load()) }

// SetHead raises the head to tid (it never goes back). A driver calls it
// when the server tells it its last tid (at connect, on a sync), in
// protocol order: every invalidation up to tid must have been applied.
func (c *Cache) SetHead(tid zodb.Tid) {
	for {
		h := c.head.Load()
		if uint64(tid) <= h || c.head.CompareAndSwap(h, uint64(tid)) {
			return
		}
	}
}

// Load appends to dst the data of the revision of oid current in state at,
// if the cache has it, and returns it with its serial. at == zodb.TidMax
// means the head. A state after the head (other than TidMax) misses for
// revisions that are still open: the cache does not know that state yet.
func (c *Cache) Load(oid zodb.Oid, at zodb.Tid, dst []byte) (data []byte, serial zodb.Tid, ok bool) {
	if c.off {
		return dst, 0, false
	}
	s := c.shard(oid)
	s.mu.RLock()
	hit := c.find(s, oid, at)
	s.mu.RUnlock()
	if hit == nil {
		return dst, 0, false
	}
	if !hit.ref.Load() {
		hit.ref.Store(true)
	}
	return append(dst, hit.data...), hit.serial, true
}

// Has reports whether Load(oid, at, ...) would hit, without copying the
// data or marking the revision used.
func (c *Cache) Has(oid zodb.Oid, at zodb.Tid) bool {
	if c.off {
		return false
	}
	s := c.shard(oid)
	s.mu.RLock()
	hit := c.find(s, oid, at)
	s.mu.RUnlock()
	return hit != nil
}

// find returns the revision of oid current in state at, or nil (s.mu
// held).
func (c *Cache) find(s *shard, oid zodb.Oid, at zodb.Tid) *rev {
	head := zodb.Tid(c.head.Load())
	for r := s.objs[oid]; r != nil; r = r.older {
		if r.serial > at {
			continue
		}
		// The first revision at or before at is the only candidate:
		// older ones end at or before r.serial.
		if r.next != 0 {
			if at < r.next {
				return r
			}
		} else if at <= head || at == zodb.TidMax {
			return r
		}
		return nil
	}
	return nil
}

// Insert records that data is the revision of oid written by serial and
// current until next (0: still current as far as the answer knows). The
// cache keeps data: the caller must not modify it afterwards. Answers that
// contradict what the cache holds (possible only if the ordering rule is
// broken) are resolved by dropping, never by guessing.
func (c *Cache) Insert(oid zodb.Oid, serial, next zodb.Tid, data []byte) {
	if c.off {
		return
	}
	s := c.shard(oid)
	size := int64(len(data)) + revOverhead
	if size > s.max {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Find the insertion point: *p is where the new revision goes, newer
	// the revision before it (nil at the head of the list).
	var newer *rev
	head := s.objs[oid]
	p := &head
	for *p != nil && (*p).serial > serial {
		newer = *p
		p = &(*p).older
	}
	if r := *p; r != nil && r.serial == serial {
		if r.next == 0 && next != 0 {
			r.next = next
		}
		return
	}
	if newer != nil {
		// A newer revision is cached: the new one must end at or
		// before it.
		if next == 0 || next > newer.serial {
			return
		}
	}
	r := &rev{oid: oid, serial: serial, next: next, data: data, older: *p}
	*p = r
	s.objs[oid] = head
	// Older revisions must end at or before serial.
	for q := &r.older; *q != nil; {
		if old := *q; old.next == 0 || old.next > serial {
			s.drop(q)
			continue
		}
		q = &(*q).older
	}
	s.bytes += size
	s.nrev++
	s.ring = append(s.ring, r)
	s.evict()
}

// Invalidate applies the commit of transaction tid, which changed oids: the
// open revision of each oid ends at tid. Then the head becomes tid.
func (c *Cache) Invalidate(tid zodb.Tid, oids []zodb.Oid) {
	if !c.off {
		for _, oid := range oids {
			s := c.shard(oid)
			s.mu.Lock()
			if r := s.objs[oid]; r != nil && r.next == 0 && r.serial < tid {
				r.next = tid
			}
			s.mu.Unlock()
		}
	}
	// Published after the ranges are closed: a Load that sees the new
	// head sees them closed.
	c.SetHead(tid)
}

// Clear drops every cached revision (the head is kept).
func (c *Cache) Clear() {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		for _, r := range s.ring {
			r.dead = true
		}
		s.objs = make(map[zodb.Oid]*rev)
		s.ring, s.hand, s.bytes, s.nrev = nil, 0, 0, 0
		s.mu.Unlock()
	}
}

// Stats is a snapshot of the cache's size.
type Stats struct {
	Objects   int   // oids with at least one cached revision
	Revisions int   // cached revisions
	Bytes     int64 // accounted bytes (data plus overhead)
	MaxBytes  int64
}

// Stats counts what the cache holds (it locks every shard in turn).
func (c *Cache) Stats() Stats {
	var st Stats
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		st.Objects += len(s.objs)
		st.Revisions += s.nrev
		st.Bytes += s.bytes
		st.MaxBytes += s.max
		s.mu.RUnlock()
	}
	return st
}

// drop removes the revision *p points to from its list (s.mu held). Its
// ring slot is reclaimed when the clock hand reaches it.
func (s *shard) drop(p **rev) {
	r := *p
	r.dead = true
	s.bytes -= int64(len(r.data)) + revOverhead
	s.nrev--
	*p = r.older
	r.older = nil
}

// unlink removes r from the list of its oid (s.mu held).
func (s *shard) unlink(r *rev) {
	head := s.objs[r.oid]
	p := &head
	for *p != nil && *p != r {
		p = &(*p).older
	}
	if *p == nil {
		return
	}
	s.drop(p)
	if head == nil {
		delete(s.objs, r.oid)
	} else {
		s.objs[r.oid] = head
	}
}

// evict runs the clock until the shard fits its budget (s.mu held).
func (s *shard) evict() {
	for s.bytes > s.max && len(s.ring) > 0 {
		if s.hand >= len(s.ring) {
			s.hand = 0
		}
		r := s.ring[s.hand]
		if !r.dead && r.ref.Load() {
			r.ref.Store(false)
			s.hand++
			continue
		}
		if !r.dead {
			s.unlink(r)
		}
		last := len(s.ring) - 1
		s.ring[s.hand] = s.ring[last]
		s.ring[last] = nil
		s.ring = s.ring[:last]
	}
	// Reclaim the slots of dead revisions when they dominate the ring.
	if len(s.ring) > 64 && len(s.ring) > 2*s.nrev {
		live := s.ring[:0]
		for _, r := range s.ring {
			if !r.dead {
				live = append(live, r)
			}
		}
		clear(s.ring[len(live):])
		s.ring = live
		s.hand = 0
	}
}
