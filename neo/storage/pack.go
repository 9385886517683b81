package storage

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// This file is the node's side of NEO's pack orders, with NEO/py's flow
// (neo/storage/app.py maybePack, handlers/__init__.py notifyPackSigned;
// read for facts only):
//
//   - a client's pack is a transaction whose AskStoreTransaction carries a
//     pack request (the tid to pack at, the oids of a partial pack); the
//     order's id is the transaction's final tid, known at lock, where the
//     master says whether it approves the order at once;
//   - the master signs orders (NotifyPackSigned: approved, rejected), after
//     the unlock of an approved one, and when the node becomes ready;
//   - the node packs the approved orders one at a time, in id order, on
//     its own goroutine (Writer.Pack, or PackOrder when the backend keeps
//     NEO's pack state), then reports NotifyPackCompleted(id); an order it
//     does not know (its transaction's metadata is on another node) is
//     asked of the master (AskPackOrders);
//   - the master's AskPackOrders lists the orders this node knows.
//
// The orders are kept in memory: after a restart the node knows only the
// id of the last order completed (Recovery's PackID), which the master
// gets with AskLastIDs; an order approved but not yet packed when the node
// stopped is asked of the master again when it is signed.

// PackOrderer is implemented by a Writer that keeps NEO's pack state
// (sqlitebackend: pt.pack): PackOrder is Pack for the order packID.
type PackOrderer interface {
	PackOrder(ctx context.Context, packID, tid zodb.Tid, oids []zodb.Oid) error
}

// PackOrderStore is implemented by a backend that keeps the pack orders
// of its transactions (sqlitebackend: its pack table), so that a node
// that restarts answers the master's AskPackOrders with those not packed
// yet, as NEO/py's node does (a restarted master learns them from the
// nodes).
type PackOrderStore interface {
	PackOrders(ctx context.Context, min zodb.Tid) ([]proto.PackOrder, error)
}

// PackVoter is implemented by a Writer that stores the pack order a
// transaction carries with the transaction, as NEO/py does
// (sqlitebackend: its pack table): VotePack is Vote with the order
// (AskStoreTransaction's; pack.Oids belongs to the packet, to be copied
// if kept), LockPack is Lock with AskLockInformation's approval.
type PackVoter interface {
	VotePack(ctx context.Context, t *VotedTxn, pack *proto.PackRequest) error
	LockPack(ctx context.Context, ttid, tid zodb.Tid, approve bool) error
}

// votePack is w.Vote of t, with its pack order where w keeps them.
func votePack(ctx context.Context, w Writer, t *VotedTxn, pack *proto.PackRequest) error {
	if pv, ok := w.(PackVoter); ok && pack != nil {
		return pv.VotePack(ctx, t, pack)
	}
	return w.Vote(ctx, t)
}

// lockPack is w.Lock, with the approval of the transaction's pack order
// where w keeps them.
func lockPack(ctx context.Context, w Writer, ttid, tid zodb.Tid, approve bool) error {
	if pv, ok := w.(PackVoter); ok {
		return pv.LockPack(ctx, ttid, tid, approve)
	}
	return w.Lock(ctx, ttid, tid)
}

// packState is the node's pack orders, for one master session.
type packState struct {
	n *Node

	mu        sync.Mutex
	m         *link.Conn // the master's link; nil between sessions
	ctx       context.Context
	orders    map[zodb.Tid]*proto.PackOrder
	completed zodb.Tid // the last order packed (or skipped, rejected)
	last      zodb.Tid // the greatest approved id signed
	// signedMax is the greatest id approved by NotifyPackSigned in this
	// session, 0 if none (NEO/py's last_pack_id; PTStore).
	signedMax zodb.Tid
	running   bool // a pack or an AskPackOrders is in progress
}

// start begins a master session's pack state.
func (ps *packState) start(ctx context.Context, m *link.Conn, completed zodb.Tid) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	// Never below what this process packed already: the orders it keeps
	// across sessions would be packed again when signed again.
	completed = max(completed, ps.completed)
	ps.m, ps.ctx, ps.completed, ps.last, ps.signedMax = m, ctx, completed, max(ps.last, completed), 0
	if ps.orders == nil {
		ps.orders = map[zodb.Tid]*proto.PackOrder{}
	}
}

// stop ends the session: a pack in progress is cancelled with its ctx.
func (ps *packState) stop() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.m = nil
}

// locked records the order a transaction carries, when it is locked as
// tid; approved: the master approved it at once.
func (ps *packState) locked(tid zodb.Tid, req *proto.PackRequest, approved bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	o := &proto.PackOrder{PackID: tid, Partial: req.OidsSet, Oids: req.Oids, OidsSet: req.OidsSet, PackTid: req.PackTid}
	if approved {
		o.Approved, o.ApprovedSet = true, true
	}
	ps.orders[tid] = o
}

// signed handles NotifyPackSigned.
func (ps *packState) signed(approved, rejected []zodb.Tid) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, id := range approved {
		if o := ps.orders[id]; o != nil {
			o.Approved, o.ApprovedSet = true, true
		}
		ps.last = max(ps.last, id)
		ps.signedMax = max(ps.signedMax, id)
	}
	for _, id := range rejected {
		if o := ps.orders[id]; o != nil {
			o.Approved, o.ApprovedSet = false, true
		}
	}
	ps.next()
}

// completedID returns the last order packed (or skipped) by this process.
func (ps *packState) completedID() zodb.Tid {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.completed
}

// truncated forgets the orders after tid, whose transactions a truncation
// deleted.
func (ps *packState) truncated(tid zodb.Tid) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for id := range ps.orders {
		if id > tid {
			delete(ps.orders, id)
		}
	}
	ps.completed, ps.last = min(ps.completed, tid), min(ps.last, tid)
}

// lastSigned returns the greatest pack id approved by NotifyPackSigned in
// this session, 0 if none.
func (ps *packState) lastSigned() zodb.Tid {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.signedMax
}

// list answers the master's AskPackOrders: the orders known in this
// process, and those the backend stored (PackOrderStore).
func (ps *packState) list(ctx context.Context, min zodb.Tid) ([]proto.PackOrder, error) {
	var stored []proto.PackOrder
	if s, ok := ps.n.be.(PackOrderStore); ok {
		var err error
		if stored, err = s.PackOrders(ctx, min); err != nil {
			return nil, err
		}
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var r []proto.PackOrder
	for _, o := range stored {
		if _, ok := ps.orders[o.PackID]; !ok && o.PackID > ps.completed {
			ps.orders[o.PackID] = &o
		}
	}
	for id, o := range ps.orders {
		if id >= min {
			r = append(r, *o)
		}
	}
	slices.SortFunc(r, func(a, b proto.PackOrder) int { return cmp.Compare(a.PackID, b.PackID) })
	return r, nil
}

// next starts the pack of the next approved order, if any (mu held).
func (ps *packState) next() {
	if ps.running || ps.m == nil || ps.completed >= ps.last {
		return
	}
	var o *proto.PackOrder
	for id, x := range ps.orders {
		if id > ps.completed && id <= ps.last && (o == nil || id < o.PackID) {
			o = x
		}
	}
	m, ctx := ps.m, ps.ctx
	ps.running = true
	if o == nil {
		// Not known here: the master has it.
		go ps.ask(ctx, m, ps.completed+1)
		return
	}
	if !o.ApprovedSet || !o.Approved {
		// Rejected (or not signed, but a greater order was approved,
		// which the master does only after signing this one): skipped.
		ps.running = false
		ps.completed = o.PackID
		ps.next()
		return
	}
	go ps.pack(ctx, m, *o)
}

// ask gets the orders from id min on from the master.
func (ps *packState) ask(ctx context.Context, m *link.Conn, min zodb.Tid) {
	var a proto.AnswerPackOrders
	err := m.Ask(ctx, &proto.AskPackOrders{MinPackID: min}, &a)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.running = false
	if err != nil {
		ps.n.log.Printf("neo storage: AskPackOrders: %v", err)
		return
	}
	found := false
	for i := range a.Orders {
		o := a.Orders[i]
		if _, ok := ps.orders[o.PackID]; !ok {
			ps.orders[o.PackID] = &o
		}
		found = found || o.PackID > ps.completed && o.PackID <= ps.last
	}
	if !found {
		ps.n.log.Printf("neo storage: the master knows no pack order from %s up to %s", min, ps.last)
		ps.completed = ps.last
		return
	}
	ps.next()
}

// pack runs one order and reports it.
func (ps *packState) pack(ctx context.Context, m *link.Conn, o proto.PackOrder) {
	var oids []zodb.Oid
	if o.OidsSet {
		oids = o.Oids
		if oids == nil {
			oids = []zodb.Oid{}
		}
	}
	w := ps.n.tm.w
	var err error
	ps.n.log.Printf("neo storage: packing at %s (order %s)", o.PackTid, o.PackID)
	if po, ok := w.(PackOrderer); ok {
		err = po.PackOrder(ctx, o.PackID, o.PackTid, oids)
	} else {
		err = w.Pack(ctx, o.PackTid, oids)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.running = false
	if err != nil {
		ps.n.log.Printf("neo storage: pack order %s: %v", o.PackID, err)
		return
	}
	ps.n.log.Printf("neo storage: pack order %s done", o.PackID)
	ps.completed = max(ps.completed, o.PackID)
	if ps.m == m {
		if err := m.Send(&proto.NotifyPackCompleted{PackID: ps.completed}); err != nil {
			ps.n.log.Printf("neo storage: NotifyPackCompleted: %v", err)
		}
	}
	ps.next()
}
