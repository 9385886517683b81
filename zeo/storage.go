package zeo

import (
	"context"
	"sync"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// storage is the server-side state of one served storage: the connections
// registered on it (to send them invalidations) and the recent
// invalidations. Its mutex is taken on register, disconnect and commit,
// never on a load.
type storage struct {
	srv          *Server
	name         string
	st           zodb.Storage
	capabilities               // st's optional interfaces (contract.go)
	blobs        *blob.Storage // nil if the storage has no blob directory; else wraps st
	readOnly     bool
	resolver     zodb.Resolver // conflicts resolved at vote; nil: left to the clients

	mu    sync.Mutex
	conns map[*conn]struct{}
	invq  invQueue    // the last invalidation-queue-size commits (invalidations.go)
	rt    recentTider // reads the oids of the queue's seeded entries; nil if none
	// lastTid is the tid of the last commit seen by onCommit (or the
	// storage's last tid at start).
	lastTid zodb.Tid
	// pending counts the transactions waiting at vote; updated by the
	// voting goroutines for server_status only.
	stats storageStats
}

// storageStats are the counters of server_status that are not
// per-connection.
type storageStats struct {
	commits, aborts, conflicts int64
	active                     int64 // transactions begun and not ended
	resolved                   int64 // conflicts resolved in the server
	loads, stores              int64 // of connections that closed
	waiting                    int64
	lockSince                  int64 // unix nanos when the lock was last taken by a voter, 0 if free
	lockHolder                 *ztxn // that voter's transaction
	// byClass counts conflicts by the class of the object, byOid by the
	// object (stats.go).
	byClass map[string]int64
	byOid   map[zodb.Oid]int64
}

func newStorage(s *Server, sc StorageConfig) (*storage, error) {
	inner, blobs, err := initBlobs(sc)
	if err != nil {
		return nil, err
	}
	st := &storage{
		srv:      s,
		name:     sc.Name,
		st:       inner,
		blobs:    blobs,
		readOnly: sc.ReadOnly || s.cfg.ReadOnly,
		resolver: s.cfg.Resolve,
		conns:    make(map[*conn]struct{}),
	}
	if st.resolver != nil && sc.Resolve != nil {
		st.resolver = sc.Resolve
	}
	st.resolve(inner)
	if blobs != nil {
		// Commits and packs go through the blob wrapper.
		if st.ws != nil {
			st.ws = blobs
		}
		if st.packer != nil {
			st.packer = blobs
		}
		if blobs.Logf == nil {
			blobs.Logf = func(format string, args ...any) {
				s.ss.log(eventlog.Info, "storage %s: "+format, append([]any{sc.Name}, args...)...)
			}
		}
	}
	if st.ws == nil {
		st.readOnly = true
	}
	last, err := inner.LastTid(context.Background())
	if err != nil {
		return nil, err
	}
	st.lastTid = last
	st.seedInvalidations()
	return st, nil
}

// register adds c to the storage's connections and returns the last tid
// committed. A commit that committed has broadcast but the storage has
// not published yet did not reach c: its invalidation is queued on c now
// (before the reply to register, which the client tolerates), so that c
// misses no invalidation after the last tid published, and its loads wait
// for that commit's state as those of other connections do. The tid
// returned is that commit's: a client that got its invalidation on its
// connection before (it reconnects) refuses a server behind its cache.
// The storage's LastTid must not block (fs1's is an atomic load): it is
// called under st.mu, which committed takes inside the storage's commit.
func (st *storage) register(ctx context.Context, c *conn) (zodb.Tid, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	last, err := st.st.LastTid(ctx)
	if err != nil {
		return 0, err
	}
	st.conns[c] = struct{}{}
	st.queuedAfterLocked(last, func(inv *invalidation) {
		c.out.Send(st.invalidationFrame(inv.tid, inv.oids), uint64(inv.tid))
	})
	return max(last, st.lastTid), nil
}

// oidSet collects oids, each once, in the order they were first added.
type oidSet struct {
	seen map[zodb.Oid]struct{}
	oids []zodb.Oid
}

func (s *oidSet) add(oids ...zodb.Oid) {
	if s.seen == nil {
		s.seen = make(map[zodb.Oid]struct{})
	}
	for _, oid := range oids {
		if _, dup := s.seen[oid]; !dup {
			s.seen[oid] = struct{}{}
			s.oids = append(s.oids, oid)
		}
	}
}

func (st *storage) unregister(c *conn) {
	st.mu.Lock()
	if _, ok := st.conns[c]; ok {
		delete(st.conns, c)
		// Keep the counts of closed connections in the totals.
		st.stats.loads += c.loads.Load()
		st.stats.stores += c.stores.Load()
	}
	st.mu.Unlock()
}

// committed is the onCommit callback of a transaction committed by conn
// from: it queues invalidateTransaction(tid, oids) on every other
// connection of the storage and records the invalidation. The storage calls
// it in commit order, before the transaction becomes visible to loads, so
// a client always gets the invalidation before any reply that shows the
// new state.
func (st *storage) committed(from *conn, tid zodb.Tid, oids []zodb.Oid) {
	// All connections of a server use the same marshalling: encode once.
	frame := st.invalidationFrame(tid, oids)
	st.mu.Lock()
	defer st.mu.Unlock()
	for c := range st.conns {
		if c != from {
			c.out.Send(frame, uint64(tid))
		}
	}
	if from != nil {
		from.out.ReleaseHeld()
	}
	st.invq.push(invalidation{tid: tid, oids: append([]zodb.Oid(nil), oids...)})
	st.lastTid = tid
	st.stats.commits++
}

// invalidationFrame encodes the message invalidateTransaction(tid, oids).
func (st *storage) invalidationFrame(tid zodb.Tid, oids []zodb.Oid) []byte {
	e := wire.Encoder{M: st.srv.cfg.Marshal, Buf: make([]byte, 0, 64+12*len(oids))}
	e.BeginCall("invalidateTransaction")
	e.BeginTuple(2)
	e.Oid8(uint64(tid))
	e.BeginList(len(oids))
	for _, oid := range oids {
		e.Oid8(uint64(oid))
	}
	e.EndList(len(oids))
	e.EndTuple(2)
	e.EndMessage()
	return e.Buf
}

// afterPack tells every client of the storage its new size, as the
// reference does after a pack.
func (st *storage) afterPack() {
	length, size := st.storageSize()
	e := wire.Encoder{M: st.srv.cfg.Marshal}
	e.BeginCall("info")
	e.BeginTuple(1)
	e.BeginDict(2)
	e.Str("length")
	e.Int(int64(length))
	e.Str("size")
	e.Int(size)
	e.EndDict(2)
	e.EndTuple(1)
	e.EndMessage()
	st.mu.Lock()
	defer st.mu.Unlock()
	for c := range st.conns {
		c.out.Send(e.Buf, 0)
	}
}
