package neotest

import (
	"context"
	"slices"
	"time"

	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// The master's side of commits, as NEO/py's master does it with one
// storage node (neo/master/transactions.py, handlers/client.py):
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
	ttid     zodb.Tid
	tid      zodb.Tid // 0 until AskFinishTransaction
	client   *link.Conn
	explicit bool // tid given at begin
	finishID uint32
	oids     []zodb.Oid
	locked   bool
	failed   error // AskLockInformation failed
	waiters  []finalWaiter
	pack     *proto.PackOrder
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
		var ttid zodb.Tid
		explicit := req.Tid != proto.InvalidTid
		if len(m.txns) > 0 && (explicit || slices.ContainsFunc(m.queue, func(t zodb.Tid) bool { return m.txns[t].explicit && m.txns[t].tid == 0 })) {
			c.ReplyError(r.ID, proto.ProtocolError, "There can't be concurrent transactions when a TID is specified for any of them.")
			c.Close()
			return true
		}
		if explicit {
			if req.Tid <= m.lastTid {
				c.ReplyError(r.ID, proto.ProtocolError, "new TID must be greater than the last committed one")
				c.Close()
				return true
			}
			ttid = req.Tid
			m.tidMax = max(m.tidMax, ttid)
			m.queue = append(m.queue, ttid)
		} else {
			ttid = m.nextTidLocked(0, 0)
		}
		if m.txns == nil {
			m.txns = make(map[zodb.Tid]*mtxn)
		}
		m.txns[ttid] = &mtxn{ttid: ttid, client: c, explicit: explicit}
		c.Reply(r.ID, &proto.AnswerBeginTransaction{TTid: ttid})
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
		t := m.txns[req.TTid]
		if t != nil && t.client == c && t.tid == 0 {
			m.dropLocked(t)
		}
		s := m.storage
		m.mu.Unlock()
		if t != nil && s != nil {
			s.Send(&proto.AbortTransaction{TTid: req.TTid, NodeList: []proto.NodeID{}})
		}
	case proto.CodeFailedVote:
		var req proto.FailedVote
		if err := r.Decode(&req); err != nil {
			c.ReplyError(r.ID, proto.ProtocolError, err.Error())
			return true
		}
		if len(req.NodeList) == 0 {
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

// dropLocked forgets t (m.mu held), answering its AskFinalTID waiters nil.
func (m *Master) dropLocked(t *mtxn) {
	delete(m.txns, t.ttid)
	m.queue = slices.DeleteFunc(m.queue, func(x zodb.Tid) bool { return x == t.ttid })
	for _, w := range t.waiters {
		w.c.Reply(w.id, &proto.AnswerFinalTID{Tid: proto.InvalidTid})
	}
}

// finish handles AskFinishTransaction: the tid, then AskLockInformation to
// the storage; the rest when the storage answers (locked).
func (m *Master) finish(c *link.Conn, id uint32, req *proto.AskFinishTransaction) {
	m.mu.Lock()
	t := m.txns[req.TTid]
	if t == nil || t.client != c || t.tid != 0 {
		m.mu.Unlock()
		c.ReplyError(id, proto.ProtocolError, "unknown transaction")
		return
	}
	s := m.storage
	if s == nil {
		m.dropLocked(t)
		m.mu.Unlock()
		c.ReplyError(id, proto.IncompleteTransaction, "no storage")
		return
	}
	if t.explicit {
		t.tid = t.ttid
	} else {
		t.tid = m.nextTidLocked(t.ttid, len(m.rows))
		m.queue = append(m.queue, t.ttid)
	}
	if p := req.Pack; p != nil {
		if p.PackTid == 0 || p.PackTid == proto.InvalidTid || p.PackTid > m.lastTid {
			m.dropLocked(t)
			m.mu.Unlock()
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
	ttid, tid, pack := t.ttid, t.tid, t.pack != nil
	// Sent under m.mu: the storage gets the locks in tid order, as from
	// NEO/py's master (a FileStorage backend appends in that order).
	s.AskAsync(context.Background(), &proto.AskLockInformation{TTid: ttid, Tid: tid, Pack: pack, PackSet: true},
		new(proto.AnswerInformationLocked), func(err error) {
			if err != nil {
				go m.locked(ttid, err) // maybe called at once, m.mu held
				return
			}
			m.locked(ttid, nil)
		})
	m.mu.Unlock()
}

// locked records the storage's answer to AskLockInformation and commits
// the transactions at the head of the queue that are locked, in order.
func (m *Master) locked(ttid zodb.Tid, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.txns[ttid]; t != nil {
		t.locked, t.failed = true, err
	}
	for len(m.queue) > 0 {
		t := m.txns[m.queue[0]]
		if t == nil || !t.locked {
			return
		}
		m.queue = m.queue[1:]
		delete(m.txns, t.ttid)
		if t.failed != nil {
			t.client.ReplyError(t.finishID, proto.IncompleteTransaction, "lock: "+t.failed.Error())
			for _, w := range t.waiters {
				w.c.Reply(w.id, &proto.AnswerFinalTID{Tid: proto.InvalidTid})
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
		if m.storage != nil {
			m.storage.Send(&proto.NotifyUnlockInformation{TTid: t.ttid})
			if t.pack != nil {
				// Approved at once: signed to the storages.
				m.storage.Send(&proto.NotifyPackSigned{Approved: []zodb.Tid{t.tid}, Rejected: []zodb.Tid{}})
			}
		}
	}
}

// clientLost aborts the transactions of client c not yet finishing.
func (m *Master) clientLost(c *link.Conn) {
	m.mu.Lock()
	delete(m.clients, c)
	var aborted []zodb.Tid
	for _, t := range m.txns {
		if t.client == c && t.tid == 0 {
			m.dropLocked(t)
			aborted = append(aborted, t.ttid)
		}
	}
	s := m.storage
	m.mu.Unlock()
	if s != nil {
		for _, ttid := range aborted {
			s.Send(&proto.AbortTransaction{TTid: ttid, NodeList: []proto.NodeID{}})
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
