package neotest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// The master's side of commits, as NEO/py's master does it
// (neo/master/transactions.py, handlers/client.py):
//
//	AskBeginTransaction(nil)  a ttid greater than every tid given so far
//	AskBeginTransaction(tid)  that tid, when no other transaction is in
//	                          progress and it is after the last commit
//	                          (else PROTOCOL_ERROR and the client is
//	                          disconnected, as NEO/py does)
//	AskNewOIDs(n)             n oids after the largest known
//	AskFinishTransaction      the tid (tid % np == ttid % np; the ttid
//	                          itself for a tid given at begin), queued in
//	                          tid order; AskLockInformation to the storage;
//	                          once locked and first in the queue: the
//	                          answer to the client, InvalidateObjects to the
//	                          other clients, NotifyUnlockInformation to the
//	                          storage
//	AbortTransaction          forgets the transaction and tells the storage
//	FailedVote                ACK when no node failed (one storage: no
//	                          node can be dropped), else
//	                          INCOMPLETE_TRANSACTION
//	AskFinalTID               nil for an unknown ttid after the last tid,
//	                          the tid once a pending one commits, MAX_TID
//	                          ("ask the storages") for one that finished
//
// A transaction may carry a pack order (AskFinishTransaction's pack,
// [oids|nil, pack_tid], pack_tid at most the last commit): the master
// records it, approved (NEO/py's automatic approval), with the
// transaction's tid as its id, tells the storage at the lock
// (AskLockInformation's pack) and signs it after the unlock
// (NotifyPackSigned). The storage may ask for it (AskPackOrders: the
// first approved order from an id on) and reports it done
// (NotifyPackCompleted), which answers the clients waiting for it
// (WaitForPack).
// A client that leaves aborts its transactions not yet finishing.

// mtxn is a transaction the master knows.
type mtxn struct {
	ttid      zodb.Tid
	tid       zodb.Tid // 0 until AskFinishTransaction
	client    *link.Conn
	explicit  bool               // tid given at begin
	readiness uint64             // the master's readiness at begin: later ready storages are not involved
	rows      [][]proto.CellInfo // the partition table at begin
	finishID  uint32
	oids      []zodb.Oid
	involved  map[proto.NodeID]*link.Conn // the storages locking it (from AskFinishTransaction)
	locking   map[proto.NodeID]bool       // those not yet answered
	lockErr   error                       // why a storage's lock failed
	failed    map[proto.NodeID]bool       // storages a client could not write to (FailedVote)
	notify    map[proto.NodeID]bool       // storages waiting for its end (AskUnfinishedTransactions)
	waiters   []finalWaiter
	pack      *proto.PackOrder
}

// packOrder is a pack order and the WaitForPack requests waiting for it.
type packOrder struct {
	order   proto.PackOrder
	waiters []finalWaiter
}

// finalWaiter is an AskFinalTID waiting for a transaction being finished.
type finalWaiter struct {
	c  *link.Conn
	id uint32
}

// lastUsedLocked returns the greatest tid given out or committed (m.mu
// held).
func (m *Master) lastUsedLocked() zodb.Tid {
	last := max(m.lastTid, m.tidMax)
	return last
}

// nextTidLocked returns a tid after every tid given so far; with np > 0,
// congruent to ttid modulo np (m.mu held).
func (m *Master) nextTidLocked(ttid zodb.Tid, np int) zodb.Tid {
	tid := zodb.NextTid(m.lastUsedLocked(), time.Now())
	if np > 1 {
		n := uint64(np)
		tid += zodb.Tid((uint64(ttid)%n + n - uint64(tid)%n) % n)
	}
	m.tidMax = max(m.tidMax, tid)
	return tid
}

// clientRequest handles a client's commit request; it returns false for
// a request that is not one.
func (m *Master) clientRequest(c *link.Conn, r *link.Request) (handled bool) {
	switch r.Code {
	case proto.CodeAskBeginTransaction:
		var req proto.AskBeginTransaction
		if err := r.Decode(&req); err != nil {
			c.ReplyError(r.ID, proto.ProtocolError, err.Error())
			return true
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		id := r.ID
		if m.starting > 0 {
			// As NEO/py's master: a transaction begins once the starting
			// storages are ready, so that it is known which of them must
			// have it in full.
			m.delayed = append(m.delayed, func() { m.beginLocked(c, id, req.Tid) })
			return true
		}
		m.beginLocked(c, id, req.Tid)
	case proto.CodeAskNewOIDs:
		var req proto.AskNewOIDs
		if err := r.Decode(&req); err != nil {
			c.ReplyError(r.ID, proto.ProtocolError, err.Error())
			return true
		}
		m.mu.Lock()
		oids := make([]zodb.Oid, req.NumOIDs)
		for i := range oids {
			m.lastOid++
			oids[i] = m.lastOid
		}
		m.mu.Unlock()
		c.Reply(r.ID, &proto.AnswerNewOIDs{Oids: oids})
	case proto.CodeAskFinishTransaction:
		var req proto.AskFinishTransaction
		if err := r.Decode(&req); err != nil {
			c.ReplyError(r.ID, proto.ProtocolError, err.Error())
			return true
		}
		m.finish(c, r.ID, &req)
	case proto.CodeAbortTransaction:
		var req proto.AbortTransaction
		if err := r.Decode(&req); err != nil {
			return true
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		t := m.txns[req.TTid]
		if t == nil || t.client != c || t.tid != 0 {
			return true
		}
		m.dropLocked(t)
		// The storages the client wrote to, and those waiting for the
		// transaction's end.
		for _, s := range m.sortedStorages() {
			if (slices.Contains(req.NodeList, s.nid) || t.notify[s.nid]) && m.readyStorageLocked(s.nid, nil) != nil {
				s.conn.Send(&proto.AbortTransaction{TTid: req.TTid, NodeList: []proto.NodeID{}})
			}
		}
	case proto.CodeFailedVote:
		var req proto.FailedVote
		if err := r.Decode(&req); err != nil {
			c.ReplyError(r.ID, proto.ProtocolError, err.Error())
			return true
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.failedVoteLocked(c, &req) {
			c.ReplyError(r.ID, proto.Ack, "")
		} else {
			c.ReplyError(r.ID, proto.IncompleteTransaction, "the storage for which the vote failed can not be disconnected")
		}
	case proto.CodeWaitForPack:
		var req proto.WaitForPack
		if err := r.Decode(&req); err != nil {
			c.ReplyError(r.ID, proto.ProtocolError, err.Error())
			return true
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if p := m.packs[req.Tid]; p != nil {
			p.waiters = append(p.waiters, finalWaiter{c, r.ID})
		} else {
			c.Reply(r.ID, &proto.WaitedForPack{})
		}
	case proto.CodeAskFinalTID:
		var req proto.AskFinalTID
		if err := r.Decode(&req); err != nil {
			c.ReplyError(r.ID, proto.ProtocolError, err.Error())
			return true
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		switch t := m.txns[req.TTid]; {
		case m.lastUsedLocked() < req.TTid:
			c.Reply(r.ID, &proto.AnswerFinalTID{Tid: proto.InvalidTid})
		case t != nil:
			t.waiters = append(t.waiters, finalWaiter{c, r.ID})
		default:
			c.Reply(r.ID, &proto.AnswerFinalTID{Tid: proto.MaxTid})
		}
	default:
		return false
	}
	return true
}

// beginLocked answers AskBeginTransaction(tid) (m.mu held).
func (m *Master) beginLocked(c *link.Conn, id uint32, tid zodb.Tid) {
	if _, ok := m.clients[c]; !ok {
		return // gone while the begin waited
	}
	var ttid zodb.Tid
	explicit := tid != proto.InvalidTid
	if len(m.txns) > 0 && (explicit || slices.ContainsFunc(m.queue, func(t zodb.Tid) bool { return m.txns[t].explicit && m.txns[t].tid == 0 })) {
		c.ReplyError(id, proto.ProtocolError, "There can't be concurrent transactions when a TID is specified for any of them.")
		c.Close()
		return
	}
	if explicit {
		if tid <= m.lastTid {
			c.ReplyError(id, proto.ProtocolError, "new TID must be greater than the last committed one")
			c.Close()
			return
		}
		ttid = tid
		m.tidMax = max(m.tidMax, ttid)
		m.queue = append(m.queue, ttid)
	} else {
		ttid = m.nextTidLocked(0, 0)
	}
	if m.txns == nil {
		m.txns = make(map[zodb.Tid]*mtxn)
	}
	m.txns[ttid] = &mtxn{ttid: ttid, client: c, explicit: explicit, readiness: m.readiness, rows: m.rows}
	c.Reply(id, &proto.AnswerBeginTransaction{TTid: ttid})
}

// readyStorageLocked returns the connection of storage nid if it is ready
// and was when the transaction t began (any ready storage for t nil), else
// nil (m.mu held).
func (m *Master) readyStorageLocked(nid proto.NodeID, t *mtxn) *link.Conn {
	s := m.storages[nid]
	if s == nil || s.conn == nil || s.ready == 0 || t != nil && s.ready > t.readiness {
		return nil
	}
	return s.conn
}

// readyConnsLocked returns the connections of the ready storages, by node
// id (m.mu held).
func (m *Master) readyConnsLocked() []*link.Conn {
	var conns []*link.Conn
	for _, s := range m.sortedStorages() {
		if s.conn != nil && s.ready != 0 {
			conns = append(conns, s.conn)
		}
	}
	return conns
}

// dropLocked forgets t (m.mu held), answering its AskFinalTID waiters nil.
func (m *Master) dropLocked(t *mtxn) {
	delete(m.txns, t.ttid)
	m.queue = slices.DeleteFunc(m.queue, func(x zodb.Tid) bool { return x == t.ttid })
	for _, w := range t.waiters {
		w.c.Reply(w.id, &proto.AnswerFinalTID{Tid: proto.InvalidTid})
	}
}

// failedVoteLocked handles FailedVote (m.mu held): whether the
// transaction may still commit without the storages the client could not
// write to, which are then disconnected at AskFinishTransaction. Only the
// storages that were ready when it began count.
func (m *Master) failedVoteLocked(c *link.Conn, req *proto.FailedVote) bool {
	t := m.txns[req.TTid]
	failed := map[proto.NodeID]bool{}
	for _, nid := range req.NodeList {
		if t != nil && m.readyStorageLocked(nid, t) != nil {
			failed[nid] = true
		}
	}
	if len(failed) == 0 {
		return t != nil || len(req.NodeList) == 0
	}
	if t.client != c || t.tid != 0 || !m.operationalWithout(failed) {
		return false
	}
	// Nor with the storages other transactions may disconnect (NEO/py
	// delays the answer until those end; refused here).
	all := maps.Clone(failed)
	for _, o := range m.txns {
		maps.Copy(all, o.failed)
	}
	if !m.operationalWithout(all) {
		return false
	}
	t.failed = failed
	return true
}

// finish handles AskFinishTransaction: the tid, then AskLockInformation to
// every storage involved (see the top of the file); the rest when they
// answered (locked).
func (m *Master) finish(c *link.Conn, id uint32, req *proto.AskFinishTransaction) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.txns[req.TTid]
	if t == nil || t.client != c || t.tid != 0 {
		c.ReplyError(id, proto.ProtocolError, "unknown transaction")
		return
	}
	// The storages a client could not write to go first: their cells are
	// outdated before the lock.
	for nid := range t.failed {
		if s := m.storages[nid]; s != nil && s.conn != nil {
			conn := s.conn
			m.logf("storage %d: disconnected (a client failed to write to it)", nid)
			m.storageLostLocked(s, conn)
			conn.Close()
		}
	}
	if m.state != proto.Running {
		m.dropLocked(t)
		c.ReplyError(id, proto.IncompleteTransaction, "cluster not operational")
		return
	}
	np := len(m.rows)
	parts := map[uint32]bool{uint32(uint64(t.ttid) % uint64(np)): true}
	for _, oid := range req.Oids {
		parts[uint32(uint64(oid)%uint64(np))] = true
	}
	for _, p := range append(slices.Clone(req.Deleted), req.Checked...) {
		if int(p) < np {
			parts[p] = true
		}
	}
	// The storages with a cell of a touched partition, now and when the
	// transaction began, ready then.
	t.involved = map[proto.NodeID]*link.Conn{}
	for p := range parts {
		for _, cell := range m.rows[p] {
			if int(p) >= len(t.rows) || !slices.ContainsFunc(t.rows[p], func(x proto.CellInfo) bool { return x.NID == cell.NID }) {
				continue
			}
			if conn := m.readyStorageLocked(cell.NID, t); conn != nil {
				t.involved[cell.NID] = conn
			}
		}
	}
	if len(t.involved) == 0 {
		m.dropLocked(t)
		c.ReplyError(id, proto.IncompleteTransaction, "no storage")
		return
	}
	if t.explicit {
		t.tid = t.ttid
	} else {
		t.tid = m.nextTidLocked(t.ttid, np)
		m.queue = append(m.queue, t.ttid)
	}
	if p := req.Pack; p != nil {
		if p.PackTid == 0 || p.PackTid == proto.InvalidTid || p.PackTid > m.lastTid {
			m.dropLocked(t)
			c.ReplyError(id, proto.ProtocolError, "invalid pack time")
			c.Close()
			return
		}
		t.pack = &proto.PackOrder{PackID: t.tid, Approved: true, ApprovedSet: true, Partial: p.OidsSet,
			Oids: slices.Clone(p.Oids), OidsSet: p.OidsSet, PackTid: p.PackTid}
	}
	t.finishID = id
	t.oids = slices.Clone(req.Oids)
	for _, oid := range t.oids {
		m.lastOid = max(m.lastOid, oid)
	}
	t.locking = map[proto.NodeID]bool{}
	for nid := range t.involved {
		t.locking[nid] = true
	}
	// Sent under m.mu: the storages get the locks in tid order, as from
	// NEO/py's master (a FileStorage backend appends in that order).
	ttid := t.ttid
	lock := &proto.AskLockInformation{TTid: ttid, Tid: t.tid, Pack: t.pack != nil, PackSet: true}
	for nid, conn := range t.involved {
		conn.AskAsync(context.Background(), lock, new(proto.AnswerInformationLocked), func(err error) {
			if err != nil {
				go m.locked(ttid, nid, err) // maybe called at once, m.mu held
				return
			}
			m.locked(ttid, nid, nil)
		})
	}
}

// locked records storage nid's answer to AskLockInformation (err: its
// failure) and commits the transactions at the head of the queue that
// every storage involved locked, in order.
func (m *Master) locked(ttid zodb.Tid, nid proto.NodeID, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.txns[ttid]
	if t == nil || !t.locking[nid] {
		return
	}
	delete(t.locking, nid)
	if err != nil {
		m.logf("storage %d: lock of %s: %v", nid, ttid, err)
		conn := t.involved[nid]
		delete(t.involved, nid)
		t.lockErr = err
		// It misses the commit: its cells are outdated before the
		// commit is answered.
		if s := m.storages[nid]; s != nil && s.conn == conn {
			m.storageLostLocked(s, conn)
			conn.Close()
		}
	}
	m.commitLocked()
}

// txnStorageLost stops waiting for storage nid's locks (m.mu held).
func (m *Master) txnStorageLost(nid proto.NodeID) {
	for _, t := range m.txns {
		delete(t.notify, nid)
		if t.locking[nid] {
			delete(t.locking, nid)
			delete(t.involved, nid)
			t.lockErr = fmt.Errorf("storage %d lost", nid)
		}
	}
	m.commitLocked()
}

// commitLocked commits the transactions at the head of the queue that are
// locked, in order (m.mu held). A transaction that no storage locked
// fails.
func (m *Master) commitLocked() {
	for len(m.queue) > 0 {
		t := m.txns[m.queue[0]]
		if t == nil || t.tid == 0 || len(t.locking) > 0 {
			return
		}
		m.queue = m.queue[1:]
		delete(m.txns, t.ttid)
		if len(t.involved) == 0 {
			t.client.ReplyError(t.finishID, proto.IncompleteTransaction, "lock: "+t.lockErr.Error())
			for _, w := range t.waiters {
				w.c.Reply(w.id, &proto.AnswerFinalTID{Tid: proto.InvalidTid})
			}
			for nid := range t.notify {
				if conn := m.readyStorageLocked(nid, nil); conn != nil {
					conn.Send(&proto.AbortTransaction{TTid: t.ttid, NodeList: []proto.NodeID{}})
				}
			}
			continue
		}
		m.lastTid = max(m.lastTid, t.tid)
		if t.pack != nil {
			if m.packs == nil {
				m.packs = make(map[zodb.Tid]*packOrder)
			}
			m.packs[t.tid] = &packOrder{order: *t.pack}
		}
		t.client.Reply(t.finishID, &proto.AnswerTransactionFinished{TTid: t.ttid, Tid: t.tid})
		inval := &proto.InvalidateObjects{Tid: t.tid, Oids: t.oids}
		for cl := range m.clients {
			if cl != t.client {
				cl.Send(inval)
			}
		}
		for _, w := range t.waiters {
			w.c.Reply(w.id, &proto.AnswerFinalTID{Tid: t.tid})
		}
		unlock := &proto.NotifyUnlockInformation{TTid: t.ttid}
		for _, s := range m.sortedStorages() {
			if conn := t.involved[s.nid]; conn != nil && conn == s.conn {
				conn.Send(unlock)
			}
		}
		if t.pack != nil {
			// Approved at once: signed to the storages.
			for _, conn := range m.readyConnsLocked() {
				conn.Send(&proto.NotifyPackSigned{Approved: []zodb.Tid{t.tid}, Rejected: []zodb.Tid{}})
			}
		}
		for nid := range t.notify {
			if conn := m.readyStorageLocked(nid, nil); conn != nil {
				conn.Send(&proto.NotifyTransactionFinished{TTid: t.ttid, MaxTid: t.tid})
			}
		}
	}
}

// clientLost aborts the transactions of client c not yet finishing.
func (m *Master) clientLost(c *link.Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.clients, c)
	var aborted []zodb.Tid
	for _, t := range m.txns {
		if t.client == c && t.tid == 0 {
			m.dropLocked(t)
			aborted = append(aborted, t.ttid)
		}
	}
	for _, conn := range m.readyConnsLocked() {
		for _, ttid := range aborted {
			conn.Send(&proto.AbortTransaction{TTid: ttid, NodeList: []proto.NodeID{}})
		}
	}
}

// storagePackRequest handles the storage's pack requests and notifications
// during operation; it returns false for another packet.
func (m *Master) storagePackRequest(s *link.Conn, r *link.Request) bool {
	switch r.Code {
	case proto.CodeAskPackOrders:
		var req proto.AskPackOrders
		if err := r.Decode(&req); err != nil {
			s.ReplyError(r.ID, proto.ProtocolError, err.Error())
			return true
		}
		// The first approved order from the id on.
		m.mu.Lock()
		var first *proto.PackOrder
		for _, p := range m.packs {
			if p.order.PackID >= req.MinPackID && (first == nil || p.order.PackID < first.PackID) {
				first = &p.order
			}
		}
		ans := &proto.AnswerPackOrders{Orders: []proto.PackOrder{}}
		if first != nil {
			ans.Orders = append(ans.Orders, *first)
		}
		m.mu.Unlock()
		s.Reply(r.ID, ans)
	case proto.CodeNotifyPackCompleted:
		var req proto.NotifyPackCompleted
		if err := r.Decode(&req); err != nil {
			return true
		}
		m.mu.Lock()
		for id, p := range m.packs {
			if id <= req.PackID {
				delete(m.packs, id)
				for _, w := range p.waiters {
					w.c.Reply(w.id, &proto.WaitedForPack{})
				}
			}
		}
		m.mu.Unlock()
	default:
		return false
	}
	return true
}
