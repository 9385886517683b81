package storage

import (
	"cmp"
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zodbd/zodbd/internal/spool"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// This file is the node's transaction manager: NEO's write path on a
// storage node, with NEO/py's semantics (neo/storage/transactions.py and
// handlers/client.py, read for facts only).
//
// A transaction is known by its ttid from its first store (or check, or
// metadata) on. Each store or check takes the oid's write lock for the
// ttid after checking that the client's serial is the oid's last committed
// one; a lock held by another transaction delays the request (it waits in
// a queue ordered by ttid, retried whenever a lock is released), except
// when the holder is younger (greater ttid) and has not voted: then the
// holder's client is told (NotifyDeadlock) to give the lock back and take
// it again (AskRelockObject), so that two clients storing the same oids
// in different orders never wait for each other. A serial older than the
// last committed one is a conflict: the answer carries the committed
// serial, the client resolves it and stores again.
//
// The vote hands the transaction's records to the Writer; the master's
// AskLockInformation makes them durable under the final tid (Writer.Lock)
// and from then on, until NotifyUnlockInformation makes them visible
// (Writer.Unlock), reads of the oids the transaction changes are delayed,
// so that a client that already saw the commit end never reads the
// previous revision here.
//
// The data of the stores waits for the vote in the transaction's spool
// (internal/spool): in memory up to txnSpoolMem, and while all
// transactions together hold less than txnMemory; the rest in an
// unlinked temporary file of $TMPDIR. So a transaction of any size costs
// the node bounded memory, as NEO/py's node, which writes the stores to
// its database as they come.
//
// Concurrency: one mutex (mu) guards the manager's state; it is never held
// across a Writer call that writes, nor across a network write (answers
// for other connections are queued under mu and written after). The read
// path takes mu only while some transaction is locked (nlocked != 0,
// one atomic load otherwise). Writer calls for one ttid, and its spool,
// are serialized by the transaction's own mutex (wmu), taken after mu
// when both are.

// txnManager is a node's transaction manager (nil on a read-only node).
type txnManager struct {
	n      *Node
	w      Writer
	txnMem *spool.Budget // the memory of every transaction's spool (txnMemory)

	// nlocked counts the transactions between Lock and Unlock: while it
	// is 0 reads are served without taking mu.
	nlocked atomic.Int32

	mu         sync.Mutex
	txns       map[zodb.Tid]*txn
	storeLocks map[zodb.Oid]zodb.Tid // write locks: oid -> ttid
	loadLocks  map[zodb.Oid]zodb.Tid // oids of locked transactions -> ttid
	events     eventQueue            // delayed stores, checks, relocks, by ttid
	reads      []delayedRead         // delayed reads, in arrival order
	running    bool                  // runEvents is running
	rerun      bool                  // a lock was released while it ran
	out        []outPacket           // to write once mu is released
	// released is closed (and replaced) when a transaction is released or
	// everything is reset: waitUnlockedBefore waits on it.
	released chan struct{}
}

// txn is a transaction in progress on this node.
type txn struct {
	ttid  zodb.Tid
	owner *peer        // the client connection that registered it
	nid   proto.NodeID // its client's node id
	tid   zodb.Tid     // final tid, once locked
	voted int          // 0: not voted; 1: voted without metadata; 2: with
	// voteErr is why the Writer refused the vote: the transaction
	// holds nothing here and cannot be locked.
	voteErr error

	serials  map[zodb.Oid]zodb.Tid     // oid -> serial the store/check is based on
	stores   map[zodb.Oid]*VotedObject // oid -> record (Data dropped after the vote)
	deadlock map[zodb.Oid]struct{}     // oids NotifyDeadlock was sent for
	// lockless: oids stored or checked without a write lock because
	// their partition is being replicated here (replicator.go).
	lockless map[zodb.Oid]struct{}
	bytes    int                // data held, counted in its owner's held
	spooled  bool               // its spool has a file (maxConnSpoolFiles)
	pack     *proto.PackRequest // a pack order carried by the transaction

	wmu sync.Mutex // serializes the Writer calls for this ttid; guards:
	// data holds the stores' data (their VotedObject.Ref) until the
	// vote has handed it to the Writer, or the transaction is dropped
	// (dataDone). dataErr: the data of a store could not be kept (a
	// full $TMPDIR); the vote fails with it.
	data     spool.Spool
	dataDone bool
	dataErr  error
}

// txnSpoolMem is the data a transaction keeps in memory before its spool
// writes the rest to its file (0: spool.DefaultMem), and txnMemory what
// the transactions of a node keep in memory together. Variables, for the
// tests.
var (
	txnSpoolMem       = 0
	txnMemory   int64 = 256 << 20
)

// maxConnSpoolFiles bounds the transactions of one connection whose spool
// has a file (an open descriptor each).
const maxConnSpoolFiles = 64

// keepUnderMu is the most data a store copies into its transaction's
// spool with the manager's mu held (a copy in memory, or a short write):
// bigger, it releases mu meanwhile.
const keepUnderMu = 64 << 10

// keep adds b, a store's data (empty, never nil, when b is), to t's
// spool (wmu not held): false when t was dropped.
func (t *txn) keep(b []byte) (spool.Ref, bool) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.dataDone {
		return spool.Nil, false
	}
	if b == nil {
		b = []byte{}
	}
	r, err := t.data.Add(b)
	if err != nil && t.dataErr == nil {
		t.dataErr = err
	}
	return r, true
}

// dropData lets go of t's spool (wmu held).
func (t *txn) dropData() {
	t.dataDone = true
	t.data.Close()
}

// event is a delayed client request of the write path.
type event struct {
	ttid   zodb.Tid
	p      *peer
	msgID  uint32
	code   uint16 // CodeAskStoreObject, CodeAskCheckCurrentSerial or CodeAskRelockObject
	oid    zodb.Oid
	serial zodb.Tid
	obj    *VotedObject // the store's record
	since  time.Time
}

// delayedRead is a read of an oid that a locked transaction changes.
type delayedRead struct {
	p   *peer
	req *request
}

type outPacket struct {
	p *peer
	b []byte
}

func newTxnManager(n *Node, w Writer) *txnManager {
	tm := &txnManager{n: n, w: w, txnMem: spool.NewBudget(txnMemory)}
	tm.resetLocked()
	return tm
}

// reset forgets every transaction in progress (the master session ended:
// NEO/py makes a new TransactionManager; what the database holds is sorted
// out by the next verification). Delayed reads are dropped: their
// connections are being closed.
func (tm *txnManager) reset() {
	tm.mu.Lock()
	for _, r := range tm.reads {
		r.p.wg.Done()
		tm.n.reqPool.Put(r.req)
	}
	old := tm.txns
	tm.resetLocked()
	tm.mu.Unlock()
	for _, t := range old {
		t.wmu.Lock()
		t.dropData()
		t.wmu.Unlock()
	}
}

func (tm *txnManager) resetLocked() {
	for _, t := range tm.txns {
		if t.owner != nil {
			t.owner.txns--
		}
	}
	tm.txns = map[zodb.Tid]*txn{}
	tm.storeLocks = map[zodb.Oid]zodb.Tid{}
	tm.loadLocks = map[zodb.Oid]zodb.Tid{}
	tm.events.removeFunc(func(ev *event) bool {
		ev.p.events--
		return true
	})
	tm.reads = nil
	tm.out = nil
	tm.nlocked.Store(0)
	if tm.released != nil {
		close(tm.released)
	}
	tm.released = make(chan struct{})
}

// unlockAndFlush releases mu and sends the packets queued under it. They
// are for any connection, not only the caller's (a lock released by the
// master's NotifyUnlockInformation answers the stores of other clients
// that waited for it), so they are sent without waiting for room: a
// client that does not read its answers must not stall the goroutine
// that released the lock (the master session, another client's reader);
// past its MaxQueued it is disconnected (newWriter's Overflow).
func (tm *txnManager) unlockAndFlush() {
	out := tm.out
	tm.out = nil
	tm.mu.Unlock()
	for _, o := range out {
		o.p.w.Send(o.b, 0)
	}
}

// send queues packet m for p (mu held).
func (tm *txnManager) send(p *peer, id uint32, m proto.Msg) {
	if p == nil {
		return
	}
	tm.out = append(tm.out, outPacket{p, proto.AppendPacket(nil, id, m)})
}

func (tm *txnManager) sendError(p *peer, id uint32, code proto.ErrorCode, msg string) {
	tm.out = append(tm.out, outPacket{p, appendError(nil, id, code, msg)})
}

// maxConnTxns bounds the transactions in progress that one connection
// begins here (NEO/py's client has one per thread that commits): each
// holds a spool, a file once the node's memory budget is spent. One more
// closes the connection. A variable, for the tests.
var maxConnTxns = 1024

// register returns the transaction ttid, created for p if new (mu held);
// a *limitError when p has maxConnTxns in progress. A transaction that
// another connection of p's client began becomes p's: the client
// connected again and goes on with it here, so that the end of the
// earlier connection (dropPeer) does not drop it.
func (tm *txnManager) register(p *peer, ttid zodb.Tid) (*txn, error) {
	t := tm.txns[ttid]
	if t != nil && (t.owner == p || t.nid != p.nid) {
		return t, nil
	}
	if p.txns >= maxConnTxns {
		return nil, &limitError{fmt.Sprintf("over %d transactions in progress", maxConnTxns)}
	}
	p.txns++
	if t != nil {
		if o := t.owner; o != nil {
			o.txns--
			o.held -= t.bytes
		}
		t.owner = p
		p.held += t.bytes
		return t, nil
	}
	t = &txn{ttid: ttid, owner: p, nid: p.nid,
		serials: map[zodb.Oid]zodb.Tid{}, stores: map[zodb.Oid]*VotedObject{},
		data: spool.Spool{Mem: txnSpoolMem, Budget: tm.txnMem}}
	tm.txns[ttid] = t
	return t, nil
}

// ---- client requests ----

// limitError closes a connection past one of its bounds (data held,
// requests waiting).
type limitError struct{ what string }

func (e *limitError) Error() string { return e.what }

// storeObject handles AskStoreObject. m.Data aliases the reader's buffer:
// it is copied into the transaction's spool.
func (tm *txnManager) storeObject(p *peer, id uint32, m *proto.AskStoreObject) error {
	if m.Compression > 1 {
		return badInput("AskStoreObject: invalid compression %d", m.Compression)
	}
	o := &VotedObject{Oid: m.Oid, Compression: m.Compression, Checksum: m.Checksum, DataSerial: optTid(m.DataSerial), Ref: spool.Nil}
	hasData := len(m.Data) > 0 || m.Checksum != ([20]byte{})
	if hasData {
		if sha1.Sum(m.Data) != m.Checksum {
			return badInput("AskStoreObject: invalid checksum")
		}
	} else if o.DataSerial == 0 {
		o.NoData = true
	}
	tm.mu.Lock()
	t, err := tm.register(p, m.TTid)
	if err != nil {
		tm.unlockAndFlush()
		return err
	}
	if t.voted > 0 {
		tm.unlockAndFlush()
		return badInput("AskStoreObject: transaction %s already voted", m.TTid)
	}
	if t.nid != p.nid {
		// Another client's transaction: no client stores there, and
		// its data would be counted in nobody's MaxTxnBytes.
		tm.unlockAndFlush()
		return badInput("AskStoreObject: transaction %s belongs to another client", m.TTid)
	}
	if t.owner == p && hasData {
		// The data is counted from receipt (a delayed store holds it too).
		if max := tm.n.cfg.MaxTxnBytes; max > 0 && p.held+len(m.Data) > max {
			tm.unlockAndFlush()
			return &limitError{fmt.Sprintf("transactions of this connection hold over %d bytes", max)}
		}
		p.held += len(m.Data)
		t.bytes += len(m.Data)
	}
	kept := true
	if hasData && len(m.Data) <= keepUnderMu {
		// t has not voted: its wmu is free, or held for a moment by
		// another store (keep).
		o.Ref, kept = t.keep(m.Data)
	} else if hasData {
		// Out of mu: the spool may write much to its file. The stores
		// of one connection come one at a time, the vote after them.
		tm.mu.Unlock()
		o.Ref, kept = t.keep(m.Data)
		tm.mu.Lock()
		kept = kept && tm.txns[m.TTid] == t
	}
	defer tm.unlockAndFlush()
	if kept && o.Ref.InFile() && !t.spooled {
		// Its spool opened a file (the memory of the node's
		// transactions is spent): a descriptor until the transaction
		// ends, so a connection's are bounded (maxConnTxns alone let
		// one client hold a thousand).
		t.spooled = true
		n := 0
		for _, u := range tm.txns {
			if u.owner == p && u.spooled {
				n++
			}
		}
		if n > maxConnSpoolFiles {
			return &limitError{fmt.Sprintf("over %d transactions of this connection spool their data to files", maxConnSpoolFiles)}
		}
	}
	ev := &event{ttid: m.TTid, p: p, msgID: id, code: proto.CodeAskStoreObject, oid: m.Oid, serial: m.Serial, obj: o}
	if !kept {
		// Dropped meanwhile (aborted, or the master session ended).
		tm.answerLock(ev, zeroTid)
		return nil
	}
	if !tm.tryEvent(ev) {
		return tm.queue(ev)
	}
	return nil
}

// checkCurrentSerial handles AskCheckCurrentSerial (readCurrent).
func (tm *txnManager) checkCurrentSerial(p *peer, id uint32, m *proto.AskCheckCurrentSerial) error {
	tm.mu.Lock()
	defer tm.unlockAndFlush()
	if _, err := tm.register(p, m.TTid); err != nil {
		return err
	}
	ev := &event{ttid: m.TTid, p: p, msgID: id, code: proto.CodeAskCheckCurrentSerial, oid: m.Oid, serial: m.Serial}
	if !tm.tryEvent(ev) {
		return tm.queue(ev)
	}
	return nil
}

// relockObject handles AskRelockObject: the client gives the write lock
// of oid back (it was told of a deadlock) and takes it again, waiting
// behind the older transactions.
func (tm *txnManager) relockObject(p *peer, id uint32, m *proto.AskRelockObject) error {
	tm.mu.Lock()
	defer tm.unlockAndFlush()
	t := tm.txns[m.TTid]
	if t == nil {
		tm.n.log.Printf("neo storage: %s: forget relock of %s by %s", p.name, m.Oid, m.TTid)
		tm.send(p, id, &proto.AnswerRelockObject{})
		return nil
	}
	if _, ok := t.serials[m.Oid]; !ok {
		tm.send(p, id, &proto.AnswerRelockObject{})
		return nil
	}
	if _, told := t.deadlock[m.Oid]; !told {
		// A lock given back unasked would let another transaction store
		// over this one's change (NEO/py refuses it too).
		return badInput("relock of %s by %s: no deadlock notified", m.Oid, m.TTid)
	}
	delete(t.deadlock, m.Oid)
	if t.voted > 0 {
		// Voted since: no deadlock any more (an older transaction waits
		// for a voted one), and its vote holds for what it stored, so it
		// keeps the lock (the clients do not relock once they voted).
		tm.send(p, id, &proto.AnswerRelockObject{})
		return nil
	}
	if tm.storeLocks[m.Oid] == m.TTid {
		delete(tm.storeLocks, m.Oid)
		// The younger transaction that caused the deadlock takes it now.
		tm.runEvents()
	}
	ev := &event{ttid: m.TTid, p: p, msgID: id, code: proto.CodeAskRelockObject, oid: m.Oid}
	if !tm.tryEvent(ev) {
		return tm.queue(ev)
	}
	return nil
}

// queue delays ev behind the events of older transactions (mu held).
// A connection's delayed stores and checks are bounded by a count far
// above what a client sends (MaxInflight bounds the delayed reads): a
// client pipelines every store of its transaction (NEO/py's and zodbd's
// clients), which all wait when another transaction locks their oids,
// but a peer that sent checks without end would hold the node's memory.
func (tm *txnManager) queue(ev *event) error {
	if ev.p.events >= maxEventsPerConn {
		return fmt.Errorf("more than %d stores and checks waiting for locks", maxEventsPerConn)
	}
	ev.since = time.Now()
	ev.p.events++
	tm.events.add(ev)
	return nil
}

// maxEventsPerConn bounds the stores, checks and relocks of one
// connection waiting for locks (about 100 bytes each, data aside).
const maxEventsPerConn = 1 << 20

// tryQueued is tryEvent for a queued event: true when it is done (and
// leaves the queue).
func (tm *txnManager) tryQueued(ev *event) bool {
	if !tm.tryEvent(ev) {
		return false
	}
	ev.p.events--
	return true
}

// runEvents retries the delayed events in ttid order (mu held). It is not
// reentrant: a lock released while it runs makes it start over, so that
// the events of one connection keep their order.
func (tm *txnManager) runEvents() {
	if tm.running {
		tm.rerun = true
		return
	}
	tm.running = true
	defer func() { tm.running = false }()
	for {
		tm.rerun = false
		tm.events.retry(tm.tryQueued, func() bool { return tm.rerun })
		if !tm.rerun {
			return
		}
	}
}

// slowRequest is how long a delayed store waits before it is logged.
const slowRequest = 2 * time.Second

// tryEvent serves ev unless it must wait for a write lock; false: it
// waits (mu held).
func (tm *txnManager) tryEvent(ev *event) bool {
	t := tm.txns[ev.ttid]
	if ev.code == proto.CodeAskRelockObject {
		return tm.tryRelock(ev, t)
	}
	if t == nil {
		// Aborted while the request waited.
		tm.answerLock(ev, zeroTid)
		return true
	}
	res, conflict := tm.lockObject(t, ev.serial, ev.oid)
	switch res {
	case lockDelay:
		return false
	case lockConflict:
		tm.answerLock(ev, conflict)
		tm.dropEventData(t, ev)
		return true
	case lockNonReadable:
		tm.answerLock(ev, zeroTid)
		tm.dropEventData(t, ev)
		return true
	case lockError:
		tm.sendError(ev.p, ev.msgID, proto.NotReady, "database error on "+ev.oid.String())
		tm.dropEventData(t, ev)
		return true
	case lockLockless:
		if t.lockless == nil {
			t.lockless = map[zodb.Oid]struct{}{}
		}
		t.lockless[ev.oid] = struct{}{}
	}
	if ev.code == proto.CodeAskCheckCurrentSerial {
		t.serials[ev.oid] = ev.serial
	} else {
		if _, ok := t.serials[ev.oid]; ok {
			tm.unstore(t, ev.oid)
		}
		t.serials[ev.oid] = ev.serial
		t.stores[ev.oid] = ev.obj
	}
	if !ev.since.IsZero() {
		if d := time.Since(ev.since); d > slowRequest {
			tm.n.log.Printf("neo storage: %s: %s of %s by %s delayed %.1fs", ev.p.name, proto.CodeName(ev.code), ev.oid, ev.ttid, d.Seconds())
		}
	}
	if res == lockLockless {
		tm.answerLock(ev, zeroTid)
	} else {
		tm.answerLock(ev, proto.InvalidTid)
	}
	return true
}

// dropEventData uncounts the data of a store that is not kept.
func (tm *txnManager) dropEventData(t *txn, ev *event) {
	if ev.obj != nil && t != nil && t.owner == ev.p {
		t.bytes -= ev.obj.Ref.Len()
		ev.p.held -= ev.obj.Ref.Len()
	}
}

// answerLock answers a store or check: InvalidTid (nil): stored and
// locked; ZeroTid: accepted without lock; else the conflicting serial.
func (tm *txnManager) answerLock(ev *event, conflict zodb.Tid) {
	if ev.code == proto.CodeAskCheckCurrentSerial {
		tm.send(ev.p, ev.msgID, &proto.AnswerCheckCurrentSerial{Conflict: conflict})
	} else {
		tm.send(ev.p, ev.msgID, &proto.AnswerStoreObject{Conflict: conflict})
	}
}

// tryRelock takes the write lock again for a relock (mu held): on a
// conflict, the answer gives the client back the data it had stored, for
// it to resolve.
func (tm *txnManager) tryRelock(ev *event, t *txn) bool {
	if t == nil {
		tm.send(ev.p, ev.msgID, &proto.AnswerRelockObject{})
		return true
	}
	serial, ok := t.serials[ev.oid]
	if !ok {
		tm.send(ev.p, ev.msgID, &proto.AnswerRelockObject{})
		return true
	}
	res, conflict := tm.lockObject(t, serial, ev.oid)
	switch res {
	case lockDelay:
		return false
	case lockError:
		tm.sendError(ev.p, ev.msgID, proto.NotReady, "database error on "+ev.oid.String())
		return true
	case lockConflict:
		c := &proto.RelockConflict{Serial: serial, ConflictTid: conflict}
		if o := tm.unstore(t, ev.oid); o != nil && !o.NoData {
			c.HasData, c.Compression, c.Checksum = true, o.Compression, o.Checksum
			if o.DataSerial != 0 {
				tm.undoData(o, c)
			} else if c.Data, c.HasData = tm.storedData(t, o); !c.HasData {
				tm.sendError(ev.p, ev.msgID, proto.NotReady, "data of "+ev.oid.String()+" lost")
				return true
			}
		}
		tm.send(ev.p, ev.msgID, &proto.AnswerRelockObject{Conflict: c})
		return true
	}
	tm.send(ev.p, ev.msgID, &proto.AnswerRelockObject{})
	return true
}

// storedData reads back the data o stored in t's spool (mu held; t
// has not voted, so that wmu is not held for long): false when it is
// lost (t dropped, a failed spool).
func (tm *txnManager) storedData(t *txn, o *VotedObject) ([]byte, bool) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.dataDone || t.voted > 0 {
		return nil, false
	}
	b, err := t.data.Get(o.Ref, nil)
	if err != nil {
		tm.n.log.Printf("neo storage: data of %s stored by %s: %v", o.Oid, t.ttid, err)
		return nil, false
	}
	return b, true
}

// undoData fills c with the data an undo record reuses (mu held; a read).
func (tm *txnManager) undoData(o *VotedObject, c *proto.RelockConflict) {
	var r Object
	if err := tm.n.be.Object(context.Background(), o.Oid, o.DataSerial, 0, &r); err != nil || r.NoData {
		c.HasData = false
		return
	}
	c.Compression, c.Checksum, c.Data = r.Compression, r.Checksum, r.Data
}

type lockResult int

const (
	lockTaken       lockResult = iota // the write lock is held by the transaction
	lockDelay                         // wait for another transaction
	lockConflict                      // the serial is not the last committed one
	lockNonReadable                   // this node does not hold the oid's partition
	lockError                         // the database failed (logged)
	// lockLockless: the oid's partition is being replicated here: the
	// record is kept (the node must receive the transaction in full) but
	// no lock is taken nor conflict checked (a readable cell elsewhere
	// does it), as NEO/py's TransactionManager.lockObject.
	lockLockless
)

// lockObject takes oid's write lock for t after checking that serial is
// oid's current serial (mu held); NEO/py's TransactionManager.lockObject.
func (tm *txnManager) lockObject(t *txn, serial zodb.Tid, oid zodb.Oid) (lockResult, zodb.Tid) {
	var prev zodb.Tid
	if holder, ok := tm.storeLocks[oid]; ok {
		other := tm.txns[holder]
		if other != nil && other != t {
			if holder < t.ttid || other.voted > 0 {
				// We are younger, or the holder voted (no deadlock is
				// possible): wait for its end.
				return lockDelay, 0
			}
			// We are older: the younger holder may wait for a lock we
			// hold. Tell its client to give this one back (once).
			if other.deadlock == nil {
				other.deadlock = map[zodb.Oid]struct{}{}
			}
			if _, sent := other.deadlock[oid]; !sent {
				other.deadlock[oid] = struct{}{}
				tm.n.log.Printf("neo storage: deadlock on %s: %s waits for %s", oid, t.ttid, holder)
				tm.send(other.owner, 0, &proto.NotifyDeadlock{TTid: holder, Oid: oid})
			}
			return lockDelay, 0
		}
		if other == t {
			// A second store of oid by t: it must be based on what the
			// first stored (an undo: its data serial).
			if o := t.stores[oid]; o != nil {
				prev = o.DataSerial
			}
			if prev == 0 {
				return lockTaken, 0
			}
		}
	}
	if prev == 0 {
		pt := tm.n.pt.Load()
		if np := uint64(pt.np()); np == 0 || !pt.readable[uint64(oid)%np] {
			switch tm.n.repl.writeMode(uint32(uint64(oid) % max(np, 1))) {
			case replLockless:
				return lockLockless, 0
			case replNone:
				return lockNonReadable, 0
			}
			// replLocked: replicated, not yet readable: locks as usual.
		}
		var err error
		prev, err = tm.w.LastSerial(context.Background(), oid)
		if err != nil {
			// The client gets an error, not a lock: its commit fails.
			tm.n.log.Printf("neo storage: last serial of %s: %v", oid, err)
			return lockError, 0
		}
	}
	if prev != 0 && prev != serial {
		return lockConflict, prev
	}
	tm.storeLocks[oid] = t.ttid
	return lockTaken, 0
}

// unstore removes oid from t's stores and checks, returning the record
// it stored (nil: a check) (mu held).
func (tm *txnManager) unstore(t *txn, oid zodb.Oid) *VotedObject {
	o := t.stores[oid]
	delete(t.stores, oid)
	delete(t.serials, oid)
	if o != nil && t.owner != nil {
		t.bytes -= o.Ref.Len()
		t.owner.held -= o.Ref.Len()
	}
	return o
}

// vote handles AskStoreTransaction (meta != nil) and AskVoteTransaction.
func (tm *txnManager) vote(p *peer, id uint32, ttid zodb.Tid, meta *TxnMeta, pack *proto.PackRequest) error {
	tm.mu.Lock()
	t := tm.txns[ttid]
	if t == nil {
		if meta == nil {
			tm.unlockAndFlush()
			return badInput("AskVoteTransaction: unknown ttid %s", ttid)
		}
		var err error
		if t, err = tm.register(p, ttid); err != nil {
			tm.unlockAndFlush()
			return err
		}
	}
	if t.voted > 0 || t.tid != 0 {
		tm.unlockAndFlush()
		return badInput("vote: transaction %s voted twice", ttid)
	}
	vt := &VotedTxn{TTid: ttid, Meta: meta, Objects: make([]VotedObject, 0, len(t.stores)), Spool: &t.data}
	for _, o := range t.stores {
		vt.Objects = append(vt.Objects, *o)
	}
	slices.SortFunc(vt.Objects, func(a, b VotedObject) int { return cmp.Compare(a.Oid, b.Oid) })
	t.voted = 1
	if meta != nil {
		t.voted = 2
		t.pack = pack
	}
	t.wmu.Lock()
	tm.unlockAndFlush()

	err := t.dataErr
	if t.dataDone {
		err = errors.New("transaction dropped")
	}
	if err == nil {
		err = votePack(context.Background(), tm.w, vt, pack)
	}
	// The records are in the database now: only what UndoSerial and the
	// unlock need is kept.
	t.dropData()
	t.wmu.Unlock()

	tm.mu.Lock()
	if t.owner != nil {
		t.owner.held -= t.bytes
	}
	t.bytes = 0
	if err != nil {
		// The transaction cannot be locked here (lock refuses it): the
		// master must not finish it with this node. When other nodes
		// hold every partition it writes, the answer is one NEO/py's
		// client does not expect: it drops the connection and reports
		// the node's failed vote to the master, which disconnects the
		// node, and the others commit (a replica's failure). Else the
		// client's vote fails with an error it raises: NEO's
		// UndoPackError for an undo of a packed revision, else a
		// protocol error (NEOStorageError).
		t.voteErr = err
		tm.n.log.Printf("neo storage: %s: vote of %s: %v", p.name, ttid, err)
		switch {
		case tm.heldElsewhere(vt):
			tm.sendError(p, id, proto.NotReady, "vote failed: "+err.Error())
		case errors.Is(err, ErrUndoPack):
			tm.sendError(p, id, proto.UndoPackError, "vote failed: "+err.Error())
		default:
			tm.sendError(p, id, proto.ProtocolError, "vote failed: "+err.Error())
		}
	} else if meta != nil {
		tm.send(p, id, &proto.AnswerStoreTransaction{})
	} else {
		tm.send(p, id, &proto.AnswerVoteTransaction{})
	}
	tm.unlockAndFlush()
	return nil
}

// heldElsewhere reports whether every partition vt writes (its objects',
// and its ttid's with metadata) has a readable cell on another node.
func (tm *txnManager) heldElsewhere(vt *VotedTxn) bool {
	pt := tm.n.pt.Load()
	np := uint64(pt.np())
	if np == 0 {
		return false
	}
	me := tm.n.NID()
	elsewhere := func(part uint64) bool {
		for _, c := range pt.rows[part] {
			if c.NID != me && c.State.Readable() {
				return true
			}
		}
		return false
	}
	if vt.Meta != nil && !elsewhere(uint64(vt.TTid)%np) {
		return false
	}
	for _, o := range vt.Objects {
		if !elsewhere(uint64(o.Oid) % np) {
			return false
		}
	}
	return true
}

// finalTID answers a client's AskFinalTID: the tid of a transaction
// locked here, else what the database knows.
func (tm *txnManager) finalTID(ttid zodb.Tid) (zodb.Tid, bool) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	if t := tm.txns[ttid]; t != nil {
		return t.tid, true
	}
	return 0, false
}

// undoOverride is the serial a store of oid by ttid is based on (for
// AskObjectUndoSerial): its data serial for an undo, else ttid; 0 when
// ttid stores no oid.
func (tm *txnManager) undoOverride(ttid zodb.Tid, oid zodb.Oid) zodb.Tid {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	if t := tm.txns[ttid]; t != nil {
		if o := t.stores[oid]; o != nil {
			if o.DataSerial != 0 {
				return o.DataSerial
			}
			return ttid
		}
	}
	return 0
}

// ---- the master's orders ----

// lock handles AskLockInformation: the transaction's oids are read-locked,
// then the Writer makes it durable under tid. approvePack: the master
// approves at once the pack order the transaction carries, if any.
func (tm *txnManager) lock(ctx context.Context, ttid, tid zodb.Tid, approvePack bool) error {
	tm.mu.Lock()
	t := tm.txns[ttid]
	if t == nil {
		tm.mu.Unlock()
		return badInput("AskLockInformation: unknown ttid %s", ttid)
	}
	if t.tid != 0 || t.voted == 0 || tid < ttid {
		tm.mu.Unlock()
		return badInput("AskLockInformation: transaction %s not voted, already locked, or tid %s < ttid", ttid, tid)
	}
	if t.voteErr != nil {
		// Locking what the Writer does not hold would make a commit
		// that stores nothing here look finished.
		tm.mu.Unlock()
		return fmt.Errorf("AskLockInformation: transaction %s (ttid %s) failed its vote here (%v): it cannot be locked", tid, ttid, t.voteErr)
	}
	t.tid = tid
	for oid := range t.stores {
		tm.loadLocks[oid] = ttid
	}
	tm.nlocked.Add(1)
	if t.pack != nil {
		tm.n.pack.locked(tid, t.pack, approvePack)
	}
	t.wmu.Lock()
	tm.unlockAndFlush()
	defer t.wmu.Unlock()
	if err := lockPack(ctx, tm.w, ttid, tid, approvePack); err != nil {
		return fmt.Errorf("lock of transaction %s (ttid %s): %w", tid, ttid, err)
	}
	return nil
}

// unlock handles NotifyUnlockInformation: the transaction becomes
// visible, its locks are released and the requests waiting for them run.
func (tm *txnManager) unlock(ctx context.Context, ttid zodb.Tid) error {
	tm.mu.Lock()
	t := tm.txns[ttid]
	if t == nil || t.tid == 0 {
		tm.mu.Unlock()
		return badInput("NotifyUnlockInformation: transaction %s is not locked", ttid)
	}
	tm.mu.Unlock()
	t.wmu.Lock()
	err := tm.w.Unlock(ctx, ttid, t.tid)
	t.wmu.Unlock()
	if err != nil {
		return fmt.Errorf("unlock of transaction %s (ttid %s): %w", t.tid, ttid, err)
	}
	tm.mu.Lock()
	if tm.txns[ttid] == t {
		tm.release(t)
	}
	tm.unlockAndFlush()
	return nil
}

// abort drops transaction ttid unless it is locked (AbortTransaction from
// a client or the master, NotifyTransactionFinished).
func (tm *txnManager) abort(ttid zodb.Tid) {
	tm.mu.Lock()
	t := tm.txns[ttid]
	if t == nil || t.tid != 0 {
		tm.mu.Unlock()
		return
	}
	tm.release(t)
	tm.unlockAndFlush()
	tm.writerAbort(t)
}

func (tm *txnManager) writerAbort(t *txn) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.dropData()
	if err := tm.w.Abort(context.Background(), t.ttid); err != nil {
		tm.n.log.Printf("neo storage: abort of %s: %v", t.ttid, err)
	}
}

// abortFor aborts the transactions of client nid that are not locked, voted
// or not: the master says the client is gone.
func (tm *txnManager) abortFor(nid proto.NodeID) {
	tm.abortWhere(func(t *txn) bool { return t.nid == nid })
}

// abortWhere aborts the transactions that are not locked and match.
func (tm *txnManager) abortWhere(match func(t *txn) bool) {
	tm.mu.Lock()
	var dropped []*txn
	for _, t := range tm.txns {
		if t.tid == 0 && match(t) {
			tm.release(t)
			dropped = append(dropped, t)
		}
	}
	tm.unlockAndFlush()
	for _, t := range dropped {
		tm.writerAbort(t)
	}
}

// release forgets t: its locks are released and the delayed requests run
// (mu held).
func (tm *txnManager) release(t *txn) {
	for oid := range t.serials {
		if tm.storeLocks[oid] == t.ttid {
			delete(tm.storeLocks, oid)
		}
	}
	if t.tid != 0 {
		for oid := range t.stores {
			if tm.loadLocks[oid] == t.ttid {
				delete(tm.loadLocks, oid)
			}
		}
		tm.nlocked.Add(-1)
	}
	if t.owner != nil {
		t.owner.held -= t.bytes
		t.owner.txns--
	}
	t.bytes = 0
	delete(tm.txns, t.ttid)
	close(tm.released)
	tm.released = make(chan struct{})
	tm.rerun = true
	tm.runReads()
	tm.runEvents()
}

// dropPeer forgets what a closed connection left: its delayed requests
// and the transactions it began (or took over, register) that did not
// vote. Those of its client on another connection stay: a client that
// connected again may have begun one there before this connection's end
// was noticed (a request of it still being served), and dropping it would
// make its vote commit a transaction without the stores it was answered
// for. (NEO/py aborts by node id, but refuses a second connection of a
// node until it has handled the end of the first.)
func (tm *txnManager) dropPeer(p *peer) {
	tm.mu.Lock()
	tm.events.removeFunc(func(ev *event) bool { return ev.p == p })
	p.events = 0
	tm.reads = slices.DeleteFunc(tm.reads, func(r delayedRead) bool {
		if r.p == p {
			r.p.wg.Done()
			tm.n.reqPool.Put(r.req)
			return true
		}
		return false
	})
	p.delayed = 0
	tm.mu.Unlock()
	if p.typ == proto.Client {
		tm.abortWhere(func(t *txn) bool { return t.owner == p && t.voted == 0 })
	}
}

// ---- delayed reads ----

// delayRead tells whether req (a read) must wait for the unlock of a
// transaction, and then queues it; p.wg counts it until it is served.
// The caller skips it while nlocked is 0 (the read path's only cost).
// A connection with too many requests waiting (reads and stores together,
// Config.MaxInflight) gets a *limitError.
func (tm *txnManager) delayRead(p *peer, req *request) (bool, error) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	if !tm.readLocked(req) {
		return false, nil
	}
	if p.delayed >= tm.n.cfg.MaxInflight {
		return false, &limitError{fmt.Sprintf("over %d requests waiting for locked transactions", tm.n.cfg.MaxInflight)}
	}
	p.delayed++
	p.wg.Add(1)
	tm.reads = append(tm.reads, delayedRead{p, req})
	return true, nil
}

// readLocked tells whether req must wait (mu held): a read of an oid a
// locked transaction changes, or a list of tids up to one being committed,
// or the metadata of a transaction up to one being committed.
func (tm *txnManager) readLocked(req *request) bool {
	switch req.code {
	case proto.CodeAskObject, proto.CodeAskObjectHistory:
		_, ok := tm.loadLocks[req.oid]
		return ok
	case proto.CodeAskTIDs:
		// The newest tids (the undo log): a transaction locked here
		// with its metadata is among them once unlocked, and its
		// client may ask right after its commit (NEO/py's master
		// answers it before it tells the storage nodes to unlock):
		// ZODB's undoInfo must list it.
		return tm.lockedWithMeta(req.partition)
	case proto.CodeAskTIDsFrom:
		return tm.lockedUpTo(req.max)
	case proto.CodeAskTransactionInformation:
		// A transaction locked but not yet unlocked: its metadata
		// becomes readable at the unlock (a client that got the
		// master's answer may ask before the node had it).
		return tm.lockedUpTo(req.tid)
	case proto.CodeAskOIDsFrom:
		return tm.lockedUpTo(req.tid)
	}
	return false
}

// waitUnlockedBefore returns once no transaction with a final tid below
// tid is locked, or after timeout (then false). An undo sees the database
// as of its ltid (exclusive), and the client knows of the commits before
// it from the master, possibly before this node had their unlock:
// AskObjectUndoSerial waits for them as reads of locked oids do.
func (tm *txnManager) waitUnlockedBefore(tid zodb.Tid, timeout time.Duration) bool {
	if tid == 0 || tm.nlocked.Load() == 0 {
		return true
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		tm.mu.Lock()
		locked := tm.lockedUpTo(tid - 1)
		ch := tm.released
		tm.mu.Unlock()
		if !locked {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		}
	}
}

// lockedWithMeta tells whether a transaction whose metadata this node
// stores (its trans row, in the partition of its ttid) is locked, in
// partition p or any (InvalidPartition) (mu held).
func (tm *txnManager) lockedWithMeta(p uint32) bool {
	np := uint64(tm.n.pt.Load().np())
	for _, t := range tm.txns {
		if t.tid != 0 && t.voted == 2 && (p == proto.InvalidPartition || np == 0 || uint64(t.ttid)%np == uint64(p)) {
			return true
		}
	}
	return false
}

func (tm *txnManager) lockedUpTo(tid zodb.Tid) bool {
	for _, t := range tm.txns {
		if t.tid != 0 && t.tid <= tid {
			return true
		}
	}
	return false
}

// runReads serves the delayed reads no longer locked, each on its own
// goroutine (mu held).
func (tm *txnManager) runReads() {
	if len(tm.reads) == 0 {
		return
	}
	tm.reads = slices.DeleteFunc(tm.reads, func(r delayedRead) bool {
		if tm.readLocked(r.req) {
			return false
		}
		r.p.delayed--
		go func() {
			r.p.serve(r.req)
			r.p.wg.Done()
		}()
		return true
	})
}

// zeroTid answers a store or check accepted without a write lock (the
// oid's partition is not readable here: another node checks it).
const zeroTid = zodb.Tid(0)

// hasRecords tells whether a transaction in progress holds records of
// partition p (stores, or its metadata): the replicator deletes a
// discarded partition's rows only once none does, so that no unlock
// brings rows back after the deletion.
func (tm *txnManager) hasRecords(p uint32) bool {
	np := uint64(tm.n.pt.Load().np())
	if np == 0 {
		return false
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	for _, t := range tm.txns {
		if t.voted == 2 && uint64(t.ttid)%np == uint64(p) {
			return true
		}
		for oid := range t.stores {
			if uint64(oid)%np == uint64(p) {
				return true
			}
		}
	}
	return false
}

// lockLocklessLocked gives the write lock of every oid of partition p
// that a transaction in progress stored or checked without one (the
// partition was being replicated) to that transaction, the highest ttid
// where several did, as NEO/py's TransactionManager._notifyReplicated
// does when a partition is replicated: from then on stores of p take
// locks, and one of such an oid waits for those transactions instead of
// being checked against a serial they are about to replace. The oids stay
// in t.lockless (hasLockless), so that NotifyReplicationDone waits for
// their transactions to end (mu held).
func (tm *txnManager) lockLocklessLocked(p uint32) {
	np := uint64(tm.n.pt.Load().np())
	if np == 0 {
		return
	}
	ttids := make([]zodb.Tid, 0, len(tm.txns))
	for ttid, t := range tm.txns {
		if len(t.lockless) > 0 {
			ttids = append(ttids, ttid)
		}
	}
	slices.Sort(ttids)
	for _, ttid := range ttids {
		for oid := range tm.txns[ttid].lockless {
			if uint64(oid)%np == uint64(p) {
				tm.storeLocks[oid] = ttid
			}
		}
	}
}

// hasLockless tells whether a transaction in progress stored or checked
// an oid of partition p without a write lock (the replicator waits until
// none does before it declares p replicated, as NEO/py's
// TransactionManager._notifyReplicated).
func (tm *txnManager) hasLockless(p uint32) bool {
	np := uint64(tm.n.pt.Load().np())
	if np == 0 {
		return false
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	for _, t := range tm.txns {
		for oid := range t.lockless {
			if uint64(oid)%np == uint64(p) {
				return true
			}
		}
	}
	return false
}
