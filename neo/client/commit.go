package client

import (
	"bytes"
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/zodbd/zodbd/internal/zlibx"
	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// This file holds the write side of the client: NEO's two-phase commit, as
// NEO/py's client does it.
//
//	Begin     AskBeginTransaction(tid|nil) to the master: the ttid
//	Store     AskStoreObject to every cell of the oid's partition, sent at
//	          once (pipelined, answered in any order): nil = stored and
//	          write-locked, ZERO_TID = stored without lock (a cell being
//	          replicated), another tid = a conflict (the current serial;
//	          nothing stored)
//	Delete    the same with no data (empty data, zero checksum)
//	CheckCurrentSerial   AskCheckCurrentSerial, same answers
//	Undo      at Vote: AskTransactionInformation and AskObjectUndoSerial,
//	          then a store per object (a backpointer, or merged data)
//	Vote      waits for every answer; conflicts are resolved (Resolver) and
//	          stored again based on the serial the storage reported, until
//	          none is left; then AskStoreTransaction to the cells of
//	          partition(ttid) and AskVoteTransaction to the other storages
//	          written to; FailedVote to the master when a storage failed
//	Finish    AskFinishTransaction to the master (which locks the
//	          transaction on the storages and answers with the tid), the
//	          answer handled in order with the master's invalidations
//	          (link.Conn.AskQueued) so that the cache and the watchers get
//	          this commit in tid order among the others; a master lost
//	          meanwhile: AskFinalTID to the storages
//	Abort     AbortTransaction to the storages written to and to the master
//
// With replicas, as with NEO/py's client, a storage whose connection fails
// (or cannot be made) during the transaction is left out of it: the
// requests it did not answer count as answered, nothing more is sent to it,
// and the vote goes on if every store was locked by a storage that did not
// fail; the master is then told (FailedVote), which disconnects the
// storage at Finish if the cluster stays operational without it, else the
// vote fails. A store answered ZERO_TID (a cell being replicated there,
// stored without lock) does not count as locked. An Error answer fails the
// transaction.
//
// A storage may tell a transaction that holds a write lock that an older
// one waits for it (NotifyDeadlock): the client then asks it to take the
// lock again (AskRelockObject), which lets the older transaction go first
// and may answer a conflict to resolve like a store's.
//
// Unlike ZEO, nothing is locked before Vote's AskStoreTransaction, and a
// conflict left to the caller (VoteResolving) holds no lock: another
// transaction may commit the object meanwhile, and the caller's new store
// then conflicts again.
//
// A store keeps its data until every storage answered it (to resolve a
// conflict), and then while the transaction holds less than keptData of
// such written data; past that, written stores let theirs go, and a store
// waits, before it is sent, while more than flightData waits for answers,
// so that a transaction of any size costs bounded memory (NEO/py's client
// keeps its cache's size of them the same way). A relock's conflict gives
// the data back (the storage sends it), for the resolution.

var (
	_ zodb.ResolvingTxn = (*txn)(nil)
	_ zodb.Packer       = (*Client)(nil)
)

// oidBatch is how many oids NewOids asks the master for at a time (NEO/py's
// client asks 100).
const oidBatch = 100

// commitState is the Client's bookkeeping of its transactions.
type commitState struct {
	mu        sync.Mutex
	active    int               // transactions begun, not yet finished or aborted
	exclusive bool              // a transaction with an explicit tid is in progress
	wake      chan struct{}     // closed (and replaced) when active or exclusive drop
	txns      map[zodb.Tid]*txn // by ttid
	oids      []zodb.Oid        // new oids from the master not handed out yet
	restored  map[zodb.Oid]zodb.Tid
}

// NewOids implements zodb.WriteStorage with AskNewOIDs, 100 at a time. An
// oid stored by a transaction of this client is never handed out after
// (the master raises its counter to the largest oid stored).
func (c *Client) NewOids(ctx context.Context, n int) ([]zodb.Oid, error) {
	if c.opt.ReadOnly || c.opt.NoCommit {
		return nil, c.opErr("newOids", n, zodb.ErrReadOnly)
	}
	if n < 1 {
		n = 1
	}
	cs := &c.commit
	out := make([]zodb.Oid, 0, n)
	for {
		cs.mu.Lock()
		k := min(n-len(out), len(cs.oids))
		out = append(out, cs.oids[:k]...)
		cs.oids = cs.oids[k:]
		cs.mu.Unlock()
		if len(out) == n {
			return out, nil
		}
		var ans proto.AnswerNewOIDs
		err := c.askMaster(ctx, &proto.AskNewOIDs{NumOIDs: uint32(max(n-len(out), oidBatch))}, &ans)
		if err != nil {
			return nil, c.opErr("newOids", n, masterErr(err))
		}
		if len(ans.Oids) == 0 {
			return nil, c.opErr("newOids", n, errors.New("the master gave no oids"))
		}
		cs.mu.Lock()
		cs.oids = append(cs.oids, ans.Oids...)
		cs.mu.Unlock()
	}
}

// failed is closed when the client becomes unusable (the one place of this
// file that knows how the client keeps that).
func (c *Client) failed() <-chan struct{} { return c.dead }

// masterErr maps the master's refusals to zodb errors.
func masterErr(err error) error {
	var pe *proto.Error
	if errors.As(err, &pe) && pe.ErrCode == proto.ReadOnlyAccess {
		return fmt.Errorf("%w (%s)", zodb.ErrReadOnly, pe.Message)
	}
	return err
}

// Begin implements zodb.WriteStorage with AskBeginTransaction. A client
// may have any number of transactions in progress at once, except that a
// transaction with an explicit tid (TxnMeta.Tid: restore, copy) waits until
// the others of this client finished, and the others wait for it, as NEO's
// master refuses a tid given while another transaction is in progress.
// That wait ends with ctx, and with the client's failure (Close, the
// master lost): the transaction waited for may never end.
func (c *Client) Begin(ctx context.Context, meta zodb.TxnMeta) (zodb.Txn, error) {
	if c.opt.ReadOnly || c.opt.NoCommit {
		return nil, c.opErr("begin", nil, zodb.ErrReadOnly)
	}
	if err := c.failure(); err != nil {
		return nil, c.opErr("begin", nil, err)
	}
	exclusive := meta.Tid != 0
	if err := c.commit.enter(ctx, exclusive, c.failed(), c.failure); err != nil {
		return nil, c.opErr("begin", nil, err)
	}
	req := &proto.AskBeginTransaction{Tid: proto.InvalidTid}
	if exclusive {
		req.Tid = meta.Tid
	}
	var ans proto.AnswerBeginTransaction
	if err := c.askMaster(ctx, req, &ans); err != nil {
		c.commit.leave(exclusive)
		return nil, c.opErr("begin", nil, masterErr(err))
	}
	if exclusive && ans.TTid != meta.Tid {
		c.commit.leave(exclusive)
		return nil, c.opErr("begin", nil, fmt.Errorf("asked tid %s, the master gave %s", meta.Tid, ans.TTid))
	}
	t := &txn{
		c:         c,
		meta:      meta,
		ttid:      ans.TTid,
		exclusive: exclusive,
		stores:    make(map[zodb.Oid]*store),
		conns:     make(map[proto.NodeID]*link.Conn),
		finished:  make(chan zodb.Tid, 1),
		kept:      keptData,
		flight:    flightData,
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	c.commit.mu.Lock()
	if c.commit.txns == nil {
		c.commit.txns = make(map[zodb.Tid]*txn)
	}
	c.commit.txns[t.ttid] = t
	c.commit.mu.Unlock()
	return t, nil
}

// enter waits until a transaction may begin (see Begin) and counts it; it
// fails when ctx is done or failed is closed (with failure's error) first.
func (cs *commitState) enter(ctx context.Context, exclusive bool, failed <-chan struct{}, failure func() error) error {
	for {
		cs.mu.Lock()
		if !cs.exclusive && (!exclusive || cs.active == 0) {
			cs.active++
			cs.exclusive = exclusive
			cs.mu.Unlock()
			return nil
		}
		if cs.wake == nil {
			cs.wake = make(chan struct{})
		}
		wake := cs.wake
		cs.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-failed:
			return failure()
		}
	}
}

// leave ends a transaction counted by enter.
func (cs *commitState) leave(exclusive bool) {
	cs.mu.Lock()
	cs.active--
	if exclusive {
		cs.exclusive = false
	}
	if cs.wake != nil {
		close(cs.wake)
		cs.wake = nil
	}
	cs.mu.Unlock()
}

// txn states
const (
	txnOpen = iota
	txnVoted
	txnDone
)

// store is the last store (or check) of one oid in a transaction.
type store struct {
	oid        zodb.Oid
	serial     zodb.Tid       // what the store is based on
	data       []byte         // nil: a deletion (or undo of a creation), or a check
	dataSerial zodb.Tid       // undo/restore backpointer, or proto.InvalidTid
	check      bool           // AskCheckCurrentSerial
	deferred   bool           // serial newer than the client knows: sent at Vote
	reported   bool           // serial reported by a storage (a conflict): never deferred
	dropped    bool           // a conflict left to the caller: not written, to store again
	gen        int            // counts the sends; answers of older sends are ignored
	pending    int            // answers of this send still expected
	conflict   zodb.Tid       // 0, or the serial a storage reported
	lockedBy   []proto.NodeID // the storages that answered this send: stored and locked
	shed       bool           // written, and its data let go (see keptData)
	flying     int            // bytes of data counted in txn.flying
}

// keptData is the data of the stores of a transaction that it holds once
// written, flightData what it sends before waiting for answers.
// Variables, for the tests.
var (
	keptData   = 64 << 20
	flightData = 64 << 20
)

// txn is one transaction of the client.
type txn struct {
	c         *Client
	meta      zodb.TxnMeta
	ttid      zodb.Tid
	exclusive bool
	state     int
	ctx       context.Context // of the storage requests; cancelled when the txn ends
	cancel    context.CancelFunc

	mu       sync.Mutex
	stores   map[zodb.Oid]*store
	order    []zodb.Oid                  // oids in the order first recorded
	conns    map[proto.NodeID]*link.Conn // nil: the storage failed
	failed   map[proto.NodeID]bool       // storages left out of the transaction (see above)
	inflight int                         // requests in flight
	idle     chan struct{}               // closed when inflight drops to 0
	err      error                       // first failure of a request: Vote fails with it
	undos    []zodb.Tid
	undone   []zodb.Oid // oids whose data the client produced: undo, resolution
	deleted  map[zodb.Oid]bool
	held     int                // bytes of data of the stores (not shed)
	flying   int                // bytes of data of the stores waiting for answers
	answer   chan struct{}      // closed when a store's answers are all in
	voting   bool               // AskStoreTransaction sent: NotifyDeadlock is ignored
	pack     *proto.PackRequest // a pack order carried by the transaction (Pack)
	// kept and flight are keptData and flightData when the transaction
	// began: read by the goroutines of its answers, which may outlive
	// the test that set them.
	kept, flight int

	finished chan zodb.Tid // the finish answer, applied by the master loop
}

func (t *txn) opErr(op string, err error) error { return t.c.opErr(op, nil, err) }

func (t *txn) record(st *store) error {
	if t.state != txnOpen {
		return t.opErr("store", zodb.ErrTxnState)
	}
	t.mu.Lock()
	if t.err != nil {
		err := t.err
		t.mu.Unlock()
		return err
	}
	old := t.stores[st.oid]
	switch {
	case st.check && old != nil:
		// A check of an oid the transaction stores (or checked): the
		// store checks that serial already (ZODB's Connection never
		// checks what it stores). Sent too, NEO/py's storage node
		// fails on it (a KeyError, or an assertion).
		t.mu.Unlock()
		return nil
	case old != nil && old.check:
		// A store after the check of its oid was sent: NEO/py's
		// client refuses it (an assertion), its storage node fails on
		// it, and the check cannot be taken back.
		t.mu.Unlock()
		return t.opErr("store", fmt.Errorf("%s stored after CheckCurrentSerial of it in the same transaction: %w", st.oid, zodb.ErrTxnState))
	}
	if old != nil && old.pending > 0 {
		// Stored again while the first store is in flight: the
		// storage must get them in order, one answered before the
		// other (the second replaces the first).
		t.mu.Unlock()
		if err := t.wait(t.ctx); err != nil {
			return t.opErr("store", err)
		}
		t.mu.Lock()
	}
	if old == nil {
		t.order = append(t.order, st.oid)
	} else {
		st.gen = old.gen
		if !old.shed {
			t.held -= len(old.data)
		}
	}
	t.stores[st.oid] = st
	t.held += len(st.data)
	if st.data == nil && !st.check && st.dataSerial == proto.InvalidTid {
		if t.deleted == nil {
			t.deleted = make(map[zodb.Oid]bool)
		}
		t.deleted[st.oid] = true
	} else if t.deleted != nil {
		delete(t.deleted, st.oid)
	}
	// A serial newer than any this client knows cannot be current; the
	// storage would take it for a bug. It is checked at Vote. A serial a
	// storage reported (the conflict being resolved) is committed there,
	// whether or not its invalidation reached this client yet.
	st.deferred = !st.reported && st.serial > t.c.cache.Head() && st.dataSerial == proto.InvalidTid
	t.mu.Unlock()
	if st.deferred {
		return nil
	}
	if err := t.waitFlying(t.ctx); err != nil {
		return t.opErr("store", err)
	}
	return t.send(st)
}

// waitFlying waits while the stores waiting for answers hold more than
// flightData (t.flight) (and some request is in flight).
func (t *txn) waitFlying(ctx context.Context) error {
	for {
		t.mu.Lock()
		if t.flying <= t.flight || t.inflight == 0 {
			t.mu.Unlock()
			return nil
		}
		if t.answer == nil {
			t.answer = make(chan struct{})
		}
		answer := t.answer
		t.mu.Unlock()
		select {
		case <-answer:
		case <-ctx.Done():
			return ctx.Err()
		case <-t.c.failed():
			return t.c.failure()
		}
	}
}

// Store implements zodb.Txn: AskStoreObject, sent at once.
func (t *txn) Store(oid zodb.Oid, serial zodb.Tid, data []byte) error {
	if data == nil {
		data = []byte{}
	}
	return t.record(&store{oid: oid, serial: serial, data: data, dataSerial: proto.InvalidTid})
}

// Delete implements zodb.Txn: AskStoreObject without data.
func (t *txn) Delete(oid zodb.Oid, serial zodb.Tid) error {
	return t.record(&store{oid: oid, serial: serial, dataSerial: proto.InvalidTid})
}

// CheckCurrentSerial implements zodb.Txn: AskCheckCurrentSerial.
func (t *txn) CheckCurrentSerial(oid zodb.Oid, serial zodb.Tid) error {
	return t.record(&store{oid: oid, serial: serial, check: true, dataSerial: proto.InvalidTid})
}

// Restore implements zodb.Txn for a transaction with TxnMeta.Tid (copy):
// NEO's storages check every store against the current serial, so the
// store is based on the oid's last revision (the last one this client
// restored, else the current one loaded; for a second restore of oid in
// the transaction after an undo, that undo's data serial); prevTid is
// sent as the backpointer (data_serial), with data.
func (t *txn) Restore(oid zodb.Oid, data []byte, prevTid zodb.Tid) error {
	if t.meta.Tid == 0 {
		return fmt.Errorf("neo client: restore needs TxnMeta.Tid: %w", zodb.ErrTxnState)
	}
	if t.state != txnOpen {
		return t.opErr("restore", zodb.ErrTxnState)
	}
	c := t.c
	c.commit.mu.Lock()
	serial, ok := c.commit.restored[oid]
	c.commit.mu.Unlock()
	if !ok {
		ctx, cancel := context.WithTimeout(t.ctx, c.timeout)
		_, s, _, err := c.LoadBefore(ctx, oid, t.meta.Tid, nil)
		cancel()
		var nde *zodb.NoDataError
		var noe *zodb.NoObjectError
		switch {
		case err == nil:
			serial = s
		case errors.As(err, &nde):
			serial = nde.DeletedAt
		case errors.As(err, &noe):
		default:
			return t.opErr("restore", err)
		}
	}
	t.mu.Lock()
	if old := t.stores[oid]; old != nil && old.dataSerial != proto.InvalidTid {
		// Restored twice in this transaction (an undo of its change
		// and of its creation, as ZODB/py's undo writes), the first
		// time as an undo: the storages base the second store on the
		// first one's data serial (NEO/py's rule).
		serial = old.dataSerial
	}
	t.mu.Unlock()
	st := &store{oid: oid, serial: serial, data: data, dataSerial: proto.InvalidTid}
	if prevTid != 0 {
		st.dataSerial = prevTid
	} else if data == nil {
		st.dataSerial = proto.InvalidTid // a record without data
	}
	return t.record(st)
}

// Undo implements zodb.Txn; the undo is prepared at Vote.
func (t *txn) Undo(tid zodb.Tid) error {
	if t.state != txnOpen {
		return t.opErr("undo", zodb.ErrTxnState)
	}
	t.undos = append(t.undos, tid)
	return nil
}

// partitionNodes returns the running storages with a cell of partition p,
// in any state (writes go to every assigned cell).
func (c *Client) partitionNodes(p int) []*node {
	ns, _ := c.writeNodes(p)
	return ns
}

// writeNodes returns the running storages with a cell of partition p, in
// any state, and the ids of the other storages with a cell of p (down, or
// not yet known as running here).
func (c *Client) writeNodes(p int) (running []*node, others []proto.NodeID) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if p >= len(c.rows) {
		return nil, nil
	}
	for _, cell := range c.rows[p] {
		if n := c.nodes[cell.NID]; n != nil && n.state == proto.NodeRunning {
			running = append(running, n)
		} else {
			others = append(others, cell.NID)
		}
	}
	return running, others
}

// writeNodes is Client.writeNodes for a write of the transaction: a
// storage with a cell that this client cannot write to counts as failed
// (FailedVote at vote), as with NEO/py's client. The master may involve
// it (it may be running as far as the master knows: this client's node
// list lags), and a storage locked for a transaction whose writes it did
// not get would miss them.
func (t *txn) writeNodes(p int) []*node {
	running, others := t.c.writeNodes(p)
	if len(others) > 0 {
		t.mu.Lock()
		for _, nid := range others {
			t.nodeFailedLocked(nid)
		}
		t.mu.Unlock()
	}
	return running
}

// conn returns the connection to storage n for this transaction: the one
// it used so far, or a new one. A storage that failed in this transaction
// gives errStorageFailed; one that cannot be reached is marked failed.
func (t *txn) conn(n *node) (*link.Conn, error) {
	t.mu.Lock()
	conn, ok := t.conns[n.nid]
	t.mu.Unlock()
	if ok {
		if conn == nil {
			return nil, errStorageFailed
		}
		return conn, nil
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.c.timeout)
	defer cancel()
	conn, err := t.c.storageConn(ctx, n)
	if err != nil {
		if t.ctx.Err() == nil {
			t.nodeFailed(n.nid)
		}
		return nil, err
	}
	t.mu.Lock()
	if old := t.conns[n.nid]; old != nil {
		conn = old
	} else {
		t.conns[n.nid] = conn
	}
	t.mu.Unlock()
	return conn, nil
}

// errStorageFailed is the error of a request to a storage that failed
// earlier in the transaction.
var errStorageFailed = errors.New("storage left out of the transaction after a failure")

// nodeFailed leaves storage nid out of the transaction.
func (t *txn) nodeFailed(nid proto.NodeID) {
	t.mu.Lock()
	t.nodeFailedLocked(nid)
	t.mu.Unlock()
}

func (t *txn) nodeFailedLocked(nid proto.NodeID) {
	if t.failed == nil {
		t.failed = make(map[proto.NodeID]bool)
	}
	if !t.failed[nid] {
		t.failed[nid] = true
		t.conns[nid] = nil
	}
}

// isNodeFailure tells whether err, a request's, leaves its storage out of
// the transaction: a lost connection or a malformed answer, not an Error
// answer.
func isNodeFailure(err error) bool {
	var pe *proto.Error
	return !errors.As(err, &pe)
}

// fail records the first error of a request.
func (t *txn) fail(err error) {
	t.mu.Lock()
	if t.err == nil {
		t.err = err
	}
	t.mu.Unlock()
}

// send sends st to every cell of its partition; the answers are handled
// on goroutines of their own.
func (t *txn) send(st *store) error {
	c := t.c
	p := c.partition(uint64(st.oid))
	nodes := t.writeNodes(p)
	if len(nodes) == 0 {
		err := t.opErr("store", fmt.Errorf("partition %d: no storage to write to", p))
		t.fail(err)
		return err
	}
	var req proto.Msg
	if st.check {
		req = &proto.AskCheckCurrentSerial{TTid: t.ttid, Oid: st.oid, Serial: st.serial}
	} else {
		r := &proto.AskStoreObject{Oid: st.oid, Serial: st.serial, DataSerial: st.dataSerial, TTid: t.ttid, Data: st.data}
		if r.Data == nil {
			r.Data = []byte{}
		}
		if st.data != nil {
			// Empty data too (a store of b"", not a deletion:
			// the storages take no data with a zero checksum for
			// one), as NEO/py's client.
			r.Checksum = sha1.Sum(st.data)
		}
		req = r
	}
	type dest struct {
		nid  proto.NodeID
		conn *link.Conn
	}
	var dests []dest
	var errs []error
	for _, n := range nodes {
		conn, err := t.conn(n)
		if err != nil {
			errs = append(errs, fmt.Errorf("storage %v: %w", n.nid, err))
			continue
		}
		dests = append(dests, dest{n.nid, conn})
	}
	if len(dests) == 0 {
		err := t.opErr("store", fmt.Errorf("partition %d: no storage available for write: %w", p, errors.Join(errs...)))
		t.fail(err)
		return err
	}
	t.mu.Lock()
	st.gen++
	st.pending = len(dests)
	if st.flying == 0 {
		st.flying = len(st.data)
		t.flying += st.flying
	}
	st.conflict = 0
	st.lockedBy = st.lockedBy[:0]
	gen := st.gen
	t.inflight += len(dests)
	t.mu.Unlock()
	for _, d := range dests {
		conn, nid := d.conn, d.nid
		// Sent now, in the order of the calls (an Abort after them
		// reaches the storage after them); answered on a goroutine.
		if st.check {
			ans := new(proto.AnswerCheckCurrentSerial)
			conn.AskAsync(t.ctx, req, ans, func(err error) {
				t.answered(st, gen, nid, ans.Conflict, err)
				t.requestDone()
			})
		} else {
			ans := new(proto.AnswerStoreObject)
			conn.AskAsync(t.ctx, req, ans, func(err error) {
				t.answered(st, gen, nid, ans.Conflict, err)
				t.requestDone()
			})
		}
	}
	return nil
}

// answered records a storage's answer to a store or check.
//
// A storage that failed (see the top of the file) is left out: its answer
// counts as given, without lock.
func (t *txn) answered(st *store, gen int, nid proto.NodeID, conflict zodb.Tid, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		if t.ctx.Err() != nil {
			return
		}
		if !isNodeFailure(err) {
			if t.err == nil {
				t.err = t.opErr("store", fmt.Errorf("%s: storage %v: %w", st.oid, nid, err))
			}
			return
		}
		t.nodeFailedLocked(nid)
	}
	if st.gen != gen || t.stores[st.oid] != st {
		return // stored again since
	}
	st.pending--
	defer t.shedLocked(st)
	switch {
	case err != nil:
	case conflict == proto.InvalidTid:
		st.lockedBy = append(st.lockedBy, nid)
	case conflict != 0 && conflict < st.serial:
		// The storage's last revision is older than the one the store
		// is based on, which the client read from a readable cell: it
		// is behind (a replica not up to date). Resolving against it
		// would merge with an old revision (a lost update): the
		// transaction fails instead, as NEO/py's client does when a
		// storage neither stores nor reports a newer conflict.
		if t.err == nil {
			t.err = t.opErr("store", fmt.Errorf("%s: storage %v reports the serial %s, older than %s the store is based on (not up to date)", st.oid, nid, conflict, st.serial))
		}
	case conflict != 0 && conflict > st.conflict:
		st.conflict = conflict
	}
}

// shedLocked, once every storage answered st, uncounts its data from
// the flight and lets go of it if it was written without conflict while
// the transaction holds more than keptData (t.kept) (t.mu held).
func (t *txn) shedLocked(st *store) {
	if st.pending > 0 {
		return
	}
	if st.flying > 0 {
		t.flying -= st.flying
		st.flying = 0
		if t.answer != nil {
			close(t.answer)
			t.answer = nil
		}
	}
	if st.conflict != 0 || st.shed || len(st.data) == 0 || t.held <= t.kept {
		return
	}
	t.held -= len(st.data)
	st.data, st.shed = nil, true
}

// requestDone counts the end of a request in flight.
func (t *txn) requestDone() {
	t.mu.Lock()
	if t.inflight--; t.inflight == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
	t.mu.Unlock()
}

// wait waits for the requests in flight.
func (t *txn) wait(ctx context.Context) error {
	t.mu.Lock()
	if t.inflight == 0 {
		t.mu.Unlock()
		return nil
	}
	if t.idle == nil {
		t.idle = make(chan struct{})
	}
	done := t.idle
	t.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.c.failed():
		return t.c.failure()
	}
}

// Vote implements zodb.Txn: VoteResolving with Options.Resolve, and any
// conflict left is an error.
func (t *txn) Vote(ctx context.Context) ([]zodb.Oid, error) {
	undone, err := t.vote(ctx, t.c.opt.Resolve, false)
	return undone, err
}

// VoteResolving implements zodb.ResolvingTxn (see the top of this file for
// what NEO does not lock).
func (t *txn) VoteResolving(ctx context.Context, resolve zodb.Resolver) ([]zodb.Oid, error) {
	return t.vote(ctx, resolve, true)
}

func (t *txn) vote(ctx context.Context, resolve zodb.Resolver, keep bool) (undone []zodb.Oid, err error) {
	if t.state != txnOpen {
		return nil, t.opErr("vote", zodb.ErrTxnState)
	}
	c := t.c
	keepOpen := false
	defer func() {
		if err != nil && !keepOpen {
			t.Abort()
		}
	}()
	if len(t.undos) > 0 {
		undos := t.undos
		t.undos = nil
		for _, tid := range undos {
			if err := t.undo(ctx, tid, resolve); err != nil {
				return nil, t.opErr("vote", err)
			}
		}
	}
	for round := 0; ; round++ {
		// Stores recorded since the last round (the caller's, after a
		// VoteResolving that left conflicts) may wait for their serial.
		if err := t.sendDeferred(ctx); err != nil {
			return nil, t.opErr("vote", err)
		}
		if err := t.wait(ctx); err != nil {
			return nil, t.opErr("vote", err)
		}
		t.mu.Lock()
		err := t.err
		var conflicts []*store
		for _, oid := range t.order {
			if st := t.stores[oid]; st.conflict != 0 {
				conflicts = append(conflicts, st)
			}
		}
		if err == nil && len(conflicts) == 0 {
			if t.inflight > 0 {
				// A NotifyDeadlock came after the wait: its relock
				// may answer a conflict (the storage then dropped the
				// store), which must be resolved and stored again
				// before the vote.
				t.mu.Unlock()
				continue
			}
			// No request in flight and no conflict: every store
			// must be written now (NEO/py's client refuses to vote
			// otherwise: the storage would commit the transaction
			// without it).
			if oid, ok := t.unwritten(); ok {
				t.mu.Unlock()
				return nil, t.opErr("vote", fmt.Errorf("%s: its store was not written (a conflict not stored again, or a bug)", oid))
			}
			// From now on NotifyDeadlock is ignored (set under t.mu,
			// with the check of inflight: notifyDeadlock counts its
			// relock under it too).
			t.voting = true
			t.mu.Unlock()
			break
		}
		t.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if round > 100 {
			return nil, t.opErr("vote", fmt.Errorf("conflicts still after %d rounds of resolution", round))
		}
		// Every store and delete conflict left is listed (zodb.Txn.Vote's
		// contract); once the resolver refused one (ErrNotResolvable),
		// the vote fails: the others are listed without being tried.
		var left zodb.ConflictErrors
		refused := false
		for _, st := range conflicts {
			ce := &zodb.ConflictError{Oid: st.oid, Committed: st.conflict, Serial: st.serial, Read: st.check}
			if st.check {
				return nil, c.opErr("vote", nil, ce)
			}
			if !refused {
				merged, err := t.resolve(ctx, st, resolve)
				if err == nil {
					t.mu.Lock()
					if !slices.Contains(t.undone, st.oid) {
						t.undone = append(t.undone, st.oid)
					}
					t.mu.Unlock()
					nst := &store{oid: st.oid, serial: st.conflict, data: merged, dataSerial: proto.InvalidTid, reported: true}
					if err := t.record(nst); err != nil {
						return nil, err
					}
					continue
				}
				refused = errors.Is(err, zodb.ErrNotResolvable)
			}
			if keep {
				ce.Data = st.data
			}
			left = append(left, ce)
		}
		if refused {
			return nil, c.opErr("vote", nil, left)
		}
		if len(left) > 0 {
			// The conflicting stores were not written: those the
			// caller stores again are sent anew.
			t.mu.Lock()
			for _, ce := range left {
				if st := t.stores[ce.Oid]; st != nil {
					st.conflict = 0
					st.gen++
					st.dropped = true
				}
			}
			resolved := slices.Clone(t.undone)
			t.mu.Unlock()
			keepOpen = keep
			return resolved, c.opErr("vote", nil, left)
		}
	}

	// Every store is written: the vote proper.
	t.mu.Lock()
	var oids []zodb.Oid
	for _, oid := range t.order {
		if st := t.stores[oid]; !st.check {
			oids = append(oids, oid)
		}
	}
	t.mu.Unlock()
	p := c.partition(uint64(t.ttid))
	meta := t.meta
	ext := meta.Extension
	if ext == nil {
		ext = []byte{}
	}
	storeTxn := &proto.AskStoreTransaction{TTid: t.ttid, User: nonNil(meta.User), Description: nonNil(meta.Description), Extension: ext, Oids: oids, Pack: t.pack}
	trans := map[proto.NodeID]bool{}
	var errs, lost []error
	var emu sync.Mutex
	var wg sync.WaitGroup
	ask := func(conn *link.Conn, nid proto.NodeID, req, ans proto.Msg) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := conn.Ask(ctx, req, ans); err != nil {
				err = fmt.Errorf("storage %v: %s: %w", nid, proto.CodeName(req.Code()), err)
				emu.Lock()
				if isNodeFailure(err) && ctx.Err() == nil {
					t.nodeFailed(nid)
					lost = append(lost, err)
				} else {
					errs = append(errs, err)
				}
				emu.Unlock()
			}
		}()
	}
	for _, n := range t.writeNodes(p) {
		conn, err := t.conn(n)
		if err != nil {
			lost = append(lost, fmt.Errorf("storage %v: %w", n.nid, err))
			continue
		}
		trans[n.nid] = true
		ask(conn, n.nid, storeTxn, new(proto.AnswerStoreTransaction))
	}
	t.mu.Lock()
	others := map[proto.NodeID]*link.Conn{}
	for nid, conn := range t.conns {
		if !trans[nid] && conn != nil {
			others[nid] = conn
		}
	}
	t.mu.Unlock()
	for nid, conn := range others {
		ask(conn, nid, &proto.AskVoteTransaction{TTid: t.ttid}, new(proto.AnswerVoteTransaction))
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, t.opErr("vote", errors.Join(errs...))
	}
	t.mu.Lock()
	metaOK := slices.ContainsFunc(slices.Collect(maps.Keys(trans)), func(nid proto.NodeID) bool { return !t.failed[nid] })
	oid, unlocked := t.unlocked()
	var failed []proto.NodeID
	for nid := range t.failed {
		failed = append(failed, nid)
	}
	t.mu.Unlock()
	if !metaOK {
		return nil, t.opErr("vote", fmt.Errorf("partition %d: no storage took the transaction's metadata: %w", p, errors.Join(lost...)))
	}
	if unlocked {
		return nil, t.opErr("vote", fmt.Errorf("%s: not locked by any storage that did not fail: %w", oid, errors.Join(lost...)))
	}
	if len(failed) > 0 {
		// Can the transaction commit without them? The master
		// disconnects them at Finish if so.
		slices.Sort(failed)
		// The answer is an Error packet: ACK, or INCOMPLETE_TRANSACTION.
		err := c.askMaster(ctx, &proto.FailedVote{TTid: t.ttid, NodeList: failed}, new(proto.AnswerLastTransaction))
		if pe, ok := errors.AsType[*proto.Error](err); err != nil && (!ok || pe.ErrCode != proto.Ack) {
			return nil, t.opErr("vote", fmt.Errorf("storages %v failed (%w); the master: %w", failed, errors.Join(lost...), err))
		}
	}
	t.state = txnVoted
	t.mu.Lock()
	undone = slices.Clone(t.undone)
	t.mu.Unlock()
	return undone, nil
}

// unwritten returns an oid whose last store (or check) was not sent or not
// answered, if any (t.mu held).
func (t *txn) unwritten() (zodb.Oid, bool) {
	for _, oid := range t.order {
		if st := t.stores[oid]; st.deferred || st.dropped || st.pending > 0 || st.gen == 0 {
			return oid, true
		}
	}
	return 0, false
}

// unlocked returns, when a storage failed, an oid whose last store (or
// check) no storage that did not fail locked, if any (t.mu held).
func (t *txn) unlocked() (zodb.Oid, bool) {
	if len(t.failed) == 0 {
		return 0, false
	}
	for _, oid := range t.order {
		if st := t.stores[oid]; !slices.ContainsFunc(st.lockedBy, func(nid proto.NodeID) bool { return !t.failed[nid] }) {
			return oid, true
		}
	}
	return 0, false
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// sendDeferred sends the stores whose serial was newer than the client
// knew: after a Sync, a serial still newer than the last transaction is a
// conflict with the object's current revision.
func (t *txn) sendDeferred(ctx context.Context) error {
	t.mu.Lock()
	var deferred []*store
	for _, oid := range t.order {
		if st := t.stores[oid]; st.deferred {
			deferred = append(deferred, st)
		}
	}
	t.mu.Unlock()
	if len(deferred) == 0 {
		return nil
	}
	last, err := t.c.Sync(ctx)
	if err != nil {
		return err
	}
	for _, st := range deferred {
		st.deferred = false
		if st.serial <= last {
			if err := t.send(st); err != nil {
				return err
			}
			continue
		}
		_, cur, _, err := t.c.LoadBefore(ctx, st.oid, last+1, nil)
		var nde *zodb.NoDataError
		var noe *zodb.NoObjectError
		switch {
		case err == nil:
		case errors.As(err, &nde):
			cur = nde.DeletedAt
		case errors.As(err, &noe):
			// A new object: stored as such would need serial 0.
		default:
			return err
		}
		t.mu.Lock()
		st.conflict = cur
		if cur == 0 {
			st.conflict = proto.InvalidTid - 1 // never 0: still a conflict
		}
		t.mu.Unlock()
	}
	return nil
}

// resolve merges the conflict of st with the revision committed meanwhile.
func (t *txn) resolve(ctx context.Context, st *store, resolve zodb.Resolver) ([]byte, error) {
	if resolve == nil {
		return nil, errors.New("no resolver")
	}
	if st.data == nil || st.serial == 0 || st.dataSerial != proto.InvalidTid {
		return nil, errors.New("nothing to merge")
	}
	old, _, err := t.c.LoadSerial(ctx, st.oid, st.serial)
	if err != nil {
		return nil, err
	}
	committed, _, err := t.c.LoadSerial(ctx, st.oid, st.conflict)
	if err != nil {
		return nil, err
	}
	return resolve(old, committed, st.data)
}

// undo prepares the undo of tid: AskObjectUndoSerial for the objects it
// changed, then a store for each (see NEO/py's Application.undo).
func (t *txn) undo(ctx context.Context, tid zodb.Tid, resolve zodb.Resolver) error {
	c := t.c
	ti, err := c.txnInfo(ctx, tid)
	if err != nil {
		var pe *proto.Error
		if errors.As(err, &pe) && pe.ErrCode == proto.TidNotFound {
			return &zodb.UndoError{Tid: tid, Reason: "no such transaction"}
		}
		return err
	}
	byPart := map[int][]zodb.Oid{}
	for _, oid := range ti.Oids {
		p := c.partition(uint64(oid))
		byPart[p] = append(byPart[p], oid)
	}
	snapshot := c.cache.Head() + 1
	// A storage answers AskObjectUndoSerial from what it has unlocked: a
	// load of each object first (which a storage delays while a
	// transaction that changed it is being committed) makes sure it has
	// every commit this client knows of.
	for _, oid := range ti.Oids {
		c.LoadBefore(ctx, oid, snapshot, nil)
	}
	var entries []proto.UndoSerial
	for p, oids := range byPart {
		var ans proto.AnswerObjectUndoSerial
		err := c.askRead(ctx, p, &proto.AskObjectUndoSerial{TTid: t.ttid, LTid: snapshot, UndoneTid: tid, Oids: oids}, &ans, nil, nil)
		if err != nil {
			var pe *proto.Error
			if errors.As(err, &pe) && (pe.ErrCode == proto.OidNotFound || pe.ErrCode == proto.UndoPackError) {
				return &zodb.UndoError{Tid: tid, Reason: "non-undoable transaction: " + pe.Message}
			}
			return err
		}
		entries = append(entries, ans.ObjectTidDict...)
	}
	for _, e := range entries {
		st := &store{oid: e.Oid, serial: e.CurrentSerial, dataSerial: proto.InvalidTid}
		if e.IsCurrent {
			if e.UndoSerial != proto.InvalidTid {
				data, _, err := c.LoadSerial(ctx, e.Oid, e.UndoSerial)
				var nde *zodb.NoDataError
				if err != nil && !errors.As(err, &nde) {
					return err
				}
				st.data = data
				if st.data == nil {
					st.data = []byte{}
				}
				st.dataSerial = e.UndoSerial
			}
		} else {
			// Changed since: merge the undo with the later changes.
			var cur []byte
			t.mu.Lock()
			own := t.stores[e.Oid]
			t.mu.Unlock()
			if e.CurrentSerial == t.ttid && own != nil {
				if own.shed {
					return &zodb.UndoError{Tid: tid, Oid: e.Oid, HasOid: true, Reason: fmt.Sprintf("the data this transaction stored is no longer held (a transaction of over %d MiB)", t.kept>>20)}
				}
				cur = own.data
			} else if cur, _, err = c.LoadSerial(ctx, e.Oid, e.CurrentSerial); err != nil {
				return &zodb.UndoError{Tid: tid, Oid: e.Oid, HasOid: true, Reason: "object not found while resolving the undo conflict"}
			}
			if e.UndoSerial == proto.InvalidTid {
				return &zodb.UndoError{Tid: tid, Oid: e.Oid, HasOid: true, Reason: "some data were modified by a later transaction"}
			}
			undoData, _, err := c.LoadSerial(ctx, e.Oid, e.UndoSerial)
			if err != nil {
				return &zodb.UndoError{Tid: tid, Oid: e.Oid, HasOid: true, Reason: "some data were modified by a later transaction"}
			}
			old, _, err := c.LoadSerial(ctx, e.Oid, tid)
			if err != nil || resolve == nil {
				return &zodb.UndoError{Tid: tid, Oid: e.Oid, HasOid: true, Reason: "some data were modified by a later transaction"}
			}
			merged, err := resolve(old, cur, undoData)
			if err != nil {
				return &zodb.UndoError{Tid: tid, Oid: e.Oid, HasOid: true, Reason: "some data were modified by a later transaction"}
			}
			st.data = merged
		}
		if err := t.record(st); err != nil {
			return err
		}
		t.mu.Lock()
		if !slices.Contains(t.undone, e.Oid) {
			t.undone = append(t.undone, e.Oid)
		}
		t.mu.Unlock()
	}
	return nil
}

// Finish implements zodb.Txn: AskFinishTransaction to the master, unless
// ctx is done already, or the client failed (closed, the master lost):
// then it aborts the transaction and fails (not committed). A ctx done
// while it waits for the answer, or Close, fails it with the outcome
// unknown (the error says the transaction may commit still). The
// master's answer is applied by the master loop, in order with the
// invalidations of other commits: the cache drops the revisions the
// transaction replaced and the watchers get the commit; then onCommit runs,
// on the calling goroutine, before Finish returns.
func (t *txn) Finish(ctx context.Context, onCommit func(tid zodb.Tid, oids []zodb.Oid)) (zodb.Tid, error) {
	c := t.c
	if t.state != txnVoted {
		return 0, t.opErr("finish", zodb.ErrTxnState)
	}
	if err := ctx.Err(); err != nil {
		// Not asked: the transaction is aborted, and the error says it
		// did not commit (asked, the master commits it whatever ctx
		// does).
		t.Abort()
		return 0, t.opErr("finish", fmt.Errorf("not committed (aborted): %w", err))
	}
	if err := c.failure(); err != nil {
		// Closed, or the master lost, before the finish was asked: the
		// master cannot commit the transaction without it.
		t.Abort()
		return 0, t.opErr("finish", fmt.Errorf("not committed (aborted): %w", err))
	}
	t.state = txnDone
	ended := false
	defer func() {
		if !ended {
			t.end()
		}
	}()
	oids, all, deleted, checked := t.finishLists()
	req := &proto.AskFinishTransaction{TTid: t.ttid, Oids: oids, Deleted: deleted, Checked: checked, Pack: t.pack}
	askErr := make(chan error, 1)
	go func() {
		// Not bounded by ctx: the answer must reach the master loop
		// (link.Conn.AskQueued drops an abandoned answer).
		var ans proto.AnswerTransactionFinished
		askErr <- c.master.AskQueued(context.Background(), req, &ans)
	}()
	var tid zodb.Tid
	select {
	case tid = <-t.finished:
	case err := <-askErr:
		if err == nil {
			select {
			case tid = <-t.finished:
			case <-c.failed():
				err = c.failure()
			}
		}
		if err != nil {
			var pe *proto.Error
			if errors.As(err, &pe) {
				return 0, t.opErr("finish", masterErr(err))
			}
			if c.closing.Load() {
				// Closed meanwhile: no new connection (Close closes
				// them all), the outcome is not known.
				return 0, t.opErr("finish", fmt.Errorf("%w (the transaction may commit still)", ErrClosed))
			}
			// The master is lost (whether or not the master loop
			// has noticed yet): did the transaction commit? As
			// NEO/py's client, ask the storages that locked it.
			if tid = t.finalTID(ctx); tid == 0 {
				return 0, t.opErr("finish", err)
			}
		}
	case <-ctx.Done():
		// The answer must still be applied to the cache: the
		// transaction stays known until it came.
		ended = true
		go func() {
			if <-askErr == nil {
				select {
				case <-t.finished:
				case <-c.failed():
				}
			}
			t.end()
		}()
		return 0, t.opErr("finish", fmt.Errorf("%w (the transaction may commit still)", ctx.Err()))
	}
	if t.exclusive && tid != t.meta.Tid {
		return 0, t.opErr("finish", fmt.Errorf("committed as %s, not the tid %s given at Begin", tid, t.meta.Tid))
	}
	if t.exclusive {
		c.commit.mu.Lock()
		if c.commit.restored == nil || len(c.commit.restored) > maxRestored {
			// Bounded (a copy of a big database restores every
			// object): a restore of an oid forgotten loads its
			// serial, as for the first.
			c.commit.restored = make(map[zodb.Oid]zodb.Tid)
		}
		for _, oid := range all {
			c.commit.restored[oid] = tid
		}
		c.commit.mu.Unlock()
	}
	if onCommit != nil {
		onCommit(tid, all)
	}
	return tid, nil
}

// finishLists returns AskFinishTransaction's lists: the oids stored (not
// deleted), the partitions of the deleted and checked oids, and every oid
// written (for the cache and onCommit).
func (t *txn) finishLists() (oids, all []zodb.Oid, deleted, checked []uint32) {
	c := t.c
	t.mu.Lock()
	defer t.mu.Unlock()
	dparts, cparts := map[uint32]bool{}, map[uint32]bool{}
	for _, oid := range t.order {
		st := t.stores[oid]
		p := uint32(c.partition(uint64(oid)))
		switch {
		case st.check:
			cparts[p] = true
			continue
		case t.deleted[oid]:
			dparts[p] = true
		default:
			oids = append(oids, oid)
		}
		all = append(all, oid)
	}
	for p := range dparts {
		deleted = append(deleted, p)
	}
	for p := range cparts {
		checked = append(checked, p)
	}
	slices.Sort(deleted)
	slices.Sort(checked)
	if oids == nil {
		oids = []zodb.Oid{}
	}
	return oids, all, nonNilU32(deleted), nonNilU32(checked)
}

func nonNilU32(s []uint32) []uint32 {
	if s == nil {
		return []uint32{}
	}
	return s
}

// finished applies the master's AnswerTransactionFinished, on the master
// loop: the transaction's oids are invalidated at tid, in order with the
// other commits' invalidations, then Finish is told.
func (c *Client) finished(ttid, tid zodb.Tid) {
	c.commit.mu.Lock()
	t := c.commit.txns[ttid]
	c.commit.mu.Unlock()
	if t == nil {
		return
	}
	_, all, _, _ := t.finishLists()
	c.invalidate(tid, all)
	if len(all) > 0 {
		c.commit.mu.Lock()
		// The master hands out oids above those stored: so must the pool.
		hi := slices.Max(all)
		c.commit.oids = slices.DeleteFunc(c.commit.oids, func(o zodb.Oid) bool { return o <= hi })
		c.commit.mu.Unlock()
	}
	select {
	case t.finished <- tid:
	default:
	}
}

// finalTID asks the storages of partition(ttid) whether the transaction
// committed (after the master was lost during Finish): its tid, or 0.
func (t *txn) finalTID(ctx context.Context) zodb.Tid {
	c := t.c
	ask := func(conn *link.Conn) zodb.Tid {
		var ans proto.AnswerFinalTID
		actx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()
		if err := conn.Ask(actx, &proto.AskFinalTID{TTid: t.ttid}, &ans); err == nil && ans.Tid != proto.InvalidTid {
			return ans.Tid
		}
		return 0
	}
	for _, n := range c.partitionNodes(c.partition(uint64(t.ttid))) {
		// The transaction's connection, unless the client's failure
		// (the master lost) closed it already: then one of its own,
		// which the client's failure does not close.
		t.mu.Lock()
		conn := t.conns[n.nid]
		t.mu.Unlock()
		if conn != nil {
			if tid := ask(conn); tid != 0 {
				return tid
			}
			select {
			case <-conn.Done(): // closed: on a connection of its own
			default:
				continue // answered: not locked there
			}
		}
		c.mu.RLock()
		addr := n.addr
		c.mu.RUnlock()
		dctx, cancel := context.WithTimeout(ctx, c.timeout)
		conn, err := c.dialStorage(dctx, n, addr)
		cancel()
		if err != nil {
			continue
		}
		tid := ask(conn)
		conn.Close()
		if tid != 0 {
			return tid
		}
	}
	return 0
}

// Abort implements zodb.Txn: AbortTransaction to the storages written to,
// then to the master with their node ids. After Finish, or twice, it does
// nothing.
func (t *txn) Abort() {
	if t.state == txnDone {
		return
	}
	t.state = txnDone
	t.mu.Lock()
	var nids []proto.NodeID
	var conns []*link.Conn
	for nid, conn := range t.conns {
		nids = append(nids, nid)
		if conn != nil {
			conns = append(conns, conn)
		}
	}
	t.mu.Unlock()
	for _, conn := range conns {
		conn.Send(&proto.AbortTransaction{TTid: t.ttid, NodeList: []proto.NodeID{}})
	}
	if nids == nil {
		nids = []proto.NodeID{}
	}
	if t.c.failure() == nil {
		t.c.master.Send(&proto.AbortTransaction{TTid: t.ttid, NodeList: nids})
	}
	t.end()
}

// end forgets the transaction.
func (t *txn) end() {
	t.cancel()
	c := t.c
	c.commit.mu.Lock()
	delete(c.commit.txns, t.ttid)
	c.commit.mu.Unlock()
	c.commit.leave(t.exclusive)
}

// notifyDeadlock handles a storage's NotifyDeadlock(ttid, oid) (on the
// goroutine reading its connection): unless the transaction is voting, it
// asks the storage to take the lock again (AskRelockObject); a conflict
// in the answer is resolved at Vote as a store's.
func (c *Client) notifyDeadlock(nid proto.NodeID, conn *link.Conn, args []byte) {
	var m proto.NotifyDeadlock
	if err := m.DecodeArgs(args); err != nil {
		c.logf("neo client: NotifyDeadlock: %v", err)
		return
	}
	c.commit.mu.Lock()
	t := c.commit.txns[m.TTid]
	c.commit.mu.Unlock()
	if t == nil {
		return
	}
	t.mu.Lock()
	st := t.stores[m.Oid]
	if t.voting || st == nil {
		t.mu.Unlock()
		return
	}
	gen := st.gen
	st.pending++
	t.inflight++
	t.mu.Unlock()
	go func() {
		defer t.requestDone()
		var ans proto.AnswerRelockObject
		err := conn.Ask(t.ctx, &proto.AskRelockObject{TTid: t.ttid, Oid: m.Oid}, &ans)
		conflict := proto.InvalidTid
		if err == nil && ans.Conflict != nil {
			conflict = ans.Conflict.ConflictTid
			if rc := ans.Conflict; rc.HasData {
				err = t.dataBack(st, rc)
			}
		}
		t.answered(st, gen, nid, conflict, err)
	}()
}

// dataBack takes back the data of st from a relock's conflict, if st let
// go of it: checked against its checksum (as NEO/py's client: "wrong
// checksum while getting back data") and decompressed; an error fails
// the transaction, whose data is then not known.
func (t *txn) dataBack(st *store, rc *proto.RelockConflict) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !st.shed || t.stores[st.oid] != st {
		return nil
	}
	if sha1.Sum(rc.Data) != rc.Checksum {
		return fmt.Errorf("wrong checksum while getting back the data of oid %s", st.oid)
	}
	data := bytes.Clone(nonNil(rc.Data))
	if rc.Compression != 0 {
		var err error
		if data, err = zlibx.AppendInflate(nil, rc.Data); err != nil {
			return fmt.Errorf("getting back the data of oid %s: %w", st.oid, err)
		}
	}
	st.data, st.shed = data, false
	t.held += len(st.data)
	return nil
}

// maxRestored bounds commitState.restored.
const maxRestored = 1 << 20

// Pack implements zodb.Packer as NEO/py's client does: a transaction that
// carries a pack order up to at (AskStoreTransaction's and
// AskFinishTransaction's pack argument, [nil, at]: every object), which the
// master approves at its commit and the storages then carry out; then
// WaitForPack, answered by the master once they did. NEO removes the
// revisions that are not current at at, but collects no unreachable object:
// gc is refused. Cancelling ctx stops the wait, not the pack.
func (c *Client) Pack(ctx context.Context, at zodb.Tid, gc bool) error {
	if gc {
		return c.opErr("pack", at, errors.New("NEO does not collect unreachable objects (pack without gc)"))
	}
	// A pack time after the last transaction packs up to it, as NEO/py's
	// client clamps it (the master refuses a later one).
	last, err := c.LastTid(ctx)
	if err != nil {
		return c.opErr("pack", at, err)
	}
	at = min(at, last)
	if at == 0 {
		return nil
	}
	zt, err := c.Begin(ctx, zodb.TxnMeta{Description: []byte("IStorage.pack")})
	if err != nil {
		return err
	}
	t := zt.(*txn)
	t.pack = &proto.PackRequest{PackTid: at}
	if _, err := t.Vote(ctx); err != nil {
		return err
	}
	tid, err := t.Finish(ctx, nil)
	if err != nil {
		return err
	}
	if err := c.askMaster(ctx, &proto.WaitForPack{Tid: tid}, new(proto.WaitedForPack)); err != nil {
		return c.opErr("pack", at, err)
	}
	// Revisions the cache holds may be gone from the storages: NEO/py's
	// client clears its cache too.
	c.cache.Clear()
	return nil
}
