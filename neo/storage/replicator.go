package storage

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// This file is the destination side of NEO's replication: a cell of this
// node that the master assigns OUT_OF_DATE catches up from a readable cell
// of another storage node (NEO/py's or ours), then the node tells the
// master NotifyReplicationDone(partition, tid) and the master makes the
// cell UP_TO_DATE. The semantics are NEO/py's (neo/storage/replicator.py,
// handlers/storage.py, transactions.py; read for facts only):
//
//  1. The cell's partition becomes writable here at once: stores of
//     transactions for it are kept without a write lock nor a conflict
//     check (txn.go, lockLockless; another, readable, cell checks them),
//     so that every transaction that begins from now on reaches this node
//     in full through the commit path.
//  2. AskUnfinishedTransactions(partitions) to the master answers the last
//     committed tid T and the transactions in progress, which may or may
//     not reach this node in full.
//  3. The partition is replicated from a source node up to T: its
//     transactions (AskFetchTransactions with the tids this node has, the
//     source answering AddTransaction for each missing one, then the tids
//     to delete), then its object records the same way (AskFetchObjects,
//     AddObject), in chunks of fetchCount (the records written in batches
//     of up to storeBytes over chunks). Progress is recorded in the
//     cell (ReplicationSink.SetReplicatedTid), so that a node restarted
//     mid-way resumes: durably at the end of each pass only (a power loss
//     mid-way loses progress, never data the progress covers; an fsync
//     per batch would hold the writer for each).
//  4. When the transactions in progress at step 2 have all finished
//     (NotifyTransactionFinished(ttid, max_tid) from the master), the
//     partition is replicated again up to the last max_tid: what they
//     committed that this node missed is fetched.
//  5. From then on stores for the partition take write locks as usual;
//     once no transaction in progress holds a lockless store of it, the
//     node sends NotifyReplicationDone(partition, tid), the data being
//     durable.
//
// Partitions are replicated one at a time. A DISCARDED cell's data is
// deleted in the background (ReplicationSink.DropPartition) once no
// transaction in progress holds records of it, unless the partition is
// assigned to this node again meanwhile.

// fetchCount is NEO/py's FETCH_COUNT: the items asked per chunk.
const fetchCount = 1000

// flushBytes bounds the data of the records held in memory before they
// are written to the backend, within a chunk.
const flushBytes = 16 << 20

// storeBytes is the data of the records that the replicator gathers, over
// consecutive chunks, before it writes them as one batch and records the
// progress (the last chunk's): the pages that records enter at random
// (the obj table's primary key is by oid) are then written once per batch
// instead of once per chunk of fetchCount records, the most the sink
// writes after the data itself. A chunk that deletes records, and the
// last one, are written at once.
const storeBytes = 8 << 20

// replWriteMode is how the transaction manager treats a store for a
// partition this node cannot read.
type replWriteMode int

const (
	replNone     replWriteMode = iota // no cell here: the store is dropped (answered without lock)
	replLockless                      // being replicated: kept, without lock
	replLocked                        // replicated, not yet readable: locked as usual
)

// replicator replicates this node's OUT_OF_DATE cells. It exists on a
// node that takes writes; its loop runs while the node is operational.
type replicator struct {
	n    *Node
	sink ReplicationSink // nil: the backend cannot receive replicated data

	// modes is what writeMode answers, published (under mu) whenever
	// parts changes, so that stores read it without taking mu.
	modes atomic.Pointer[map[uint32]replWriteMode]

	mu      sync.Mutex
	parts   map[uint32]*replPart     // this node's OUT_OF_DATE cells
	ttids   map[zodb.Tid]struct{}    // transactions in progress waited for (step 4)
	asking  bool                     // AskUnfinishedTransactions in flight
	early   map[zodb.Tid]zodb.Tid    // NotifyTransactionFinished seen while asking: ttid -> max tid
	sources map[uint32]proto.Address // sources named by Replicate
	drops   map[uint32]struct{}      // discarded partitions whose data is to delete
	checks  []checkOrder             // CheckPartition orders (checker.go)
	wake    chan struct{}            // capacity 1
	cancel  context.CancelFunc       // the loop's, nil when it does not run
	done    chan struct{}            // closed when the loop returned

	// Backup mode (replbackup.go); nil maps outside it.
	bnext  map[uint32]zodb.Tid    // this node's readable partitions: every transaction before it is here
	orders map[uint32]backupOrder // Replicate orders naming a source, for readable partitions
	bdirty bool                   // bnext moved without a replication: the backup tid is to record
	bsaved zodb.Tid               // the backup tid last recorded

	// The loop's own (one goroutine).
	src         *link.Conn    // the link to the source, read by srcPeer's goroutine, or
	rsrc        *peer         // the source's own link to this node (revask.go)
	srcPeer     *peer         // the source at the other end of src (revask.go)
	srcAddr     proto.Address // the source's address
	srcUpstream string        // the upstream cluster's name when the source is one of its nodes
	// dialed holds the links dialed to sources, src's among them, until
	// the loop idles or fails: in backup mode the sources alternate
	// between partitions, and a NEO/py node may be asking its own
	// requests over a link this node dialed (revask.go).
	dialed map[srcKey]srcLink
}

// replPart is the state of one partition being replicated.
type replPart struct {
	ask      bool     // AskUnfinishedTransactions not sent yet
	upTo     zodb.Tid // replicate up to this tid (when pending)
	pending  bool     // a replication up to upTo is due
	waiting  bool     // transactions in progress: replicate again after
	repl     bool     // replicated (step 5): stores take locks
	notified bool     // NotifyReplicationDone sent
	tid      zodb.Tid // replicated up to
}

func newReplicator(n *Node) *replicator {
	r := &replicator{n: n, wake: make(chan struct{}, 1)}
	r.sink, _ = n.be.(ReplicationSink)
	r.resetLocked()
	return r
}

func (r *replicator) resetLocked() {
	r.parts = map[uint32]*replPart{}
	r.publishLocked()
	r.ttids = map[zodb.Tid]struct{}{}
	r.early = map[zodb.Tid]zodb.Tid{}
	r.sources = map[uint32]proto.Address{}
	r.drops = map[uint32]struct{}{}
	r.checks = nil
	r.bnext, r.orders, r.bdirty = nil, nil, false
}

func (r *replicator) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// writeMode tells the transaction manager how to treat a store for
// partition p, which this node cannot read (any goroutine; nil r: none).
func (r *replicator) writeMode(p uint32) replWriteMode {
	if r == nil {
		return replNone
	}
	if m := r.modes.Load(); m != nil {
		return (*m)[p]
	}
	return replNone
}

// publishLocked publishes the write modes of parts (mu held).
func (r *replicator) publishLocked() {
	m := make(map[uint32]replWriteMode, len(r.parts))
	for p, x := range r.parts {
		m[p] = replLockless
		if x.repl {
			m[p] = replLocked
		}
	}
	r.modes.Store(&m)
}

// errNoSink: an OUT_OF_DATE cell for a backend that cannot take it.
func (r *replicator) errNoSink(p uint32) error {
	return fatalf("the master assigns partition %d to this node to replicate (OUT_OF_DATE), but its backend (%T) cannot receive replicated data: a FileStorage node holds a whole database and must be UP_TO_DATE on every partition (a cluster of 1 partition whose data it already has)", p, r.n.be)
}

// start begins replicating this node's OUT_OF_DATE cells of the current
// partition table, on master link m, until stop (StartOperation; the
// master session's hook).
func (r *replicator) start(ctx context.Context, m *link.Conn) error {
	r.stop()
	pt := r.n.pt.Load()
	me := r.n.NID()
	r.mu.Lock()
	r.resetLocked()
	for p, row := range pt.rows {
		for _, c := range row {
			if c.NID == me && c.State == proto.OutOfDate {
				if r.sink == nil {
					r.mu.Unlock()
					return r.errNoSink(uint32(p))
				}
				r.parts[uint32(p)] = &replPart{ask: true}
			}
		}
	}
	r.publishLocked()
	if bt, ok := r.n.backupTid(); ok {
		r.enterBackupLocked(bt)
	}
	ctx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	done := make(chan struct{})
	r.done = done
	r.mu.Unlock()
	go func() {
		defer close(done)
		r.loop(ctx, m)
	}()
	r.poke()
	return nil
}

// stop ends the loop and waits for it (the operation stopped).
func (r *replicator) stop() {
	if r == nil {
		return
	}
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.cancel, r.done = nil, nil
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// cellsChanged follows NotifyPartitionChanges (after the table is
// installed; the master session's hook).
func (r *replicator) cellsChanged(changes []proto.CellChange) error {
	me := r.n.NID()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range changes {
		if c.NID != me {
			continue
		}
		switch c.State {
		case proto.OutOfDate:
			if r.sink == nil {
				return r.errNoSink(c.Offset)
			}
			if r.parts[c.Offset] == nil {
				r.parts[c.Offset] = &replPart{ask: true}
			}
			delete(r.drops, c.Offset)
			r.backupCellLocked(c.Offset, false, 0)
		case proto.Discarded, proto.Corrupted:
			delete(r.parts, c.Offset)
			delete(r.sources, c.Offset)
			if c.State == proto.Discarded && r.sink != nil {
				r.drops[c.Offset] = struct{}{}
			}
			r.backupCellLocked(c.Offset, false, 0)
		default: // UP_TO_DATE, FEEDING
			if x := r.parts[c.Offset]; x != nil {
				r.backupCellLocked(c.Offset, true, x.tid)
			}
			delete(r.parts, c.Offset)
			delete(r.sources, c.Offset)
		}
	}
	r.publishLocked()
	r.poke()
	return nil
}

// transactionFinished handles NotifyTransactionFinished(ttid, maxTid).
func (r *replicator) transactionFinished(ttid, maxTid zodb.Tid) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.ttids[ttid]; !ok {
		if r.asking {
			// It may be in the answer being received.
			r.early[ttid] = maxTid
		}
		return
	}
	delete(r.ttids, ttid)
	for _, x := range r.parts {
		if x.waiting && maxTid != proto.InvalidTid && maxTid > x.upTo {
			x.upTo = maxTid
		}
	}
	if len(r.ttids) == 0 {
		for _, x := range r.parts {
			if x.waiting {
				x.waiting = false
				x.pending = true
			}
		}
	}
	r.poke()
}

// replicate handles the master's Replicate: the partitions to replicate
// from a given node (a nil address: no preference).
func (r *replicator) replicate(m *proto.Replicate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bnext != nil {
		r.backupOrderLocked(m) // replbackup.go
		r.poke()
		return
	}
	for _, s := range m.SourceDict {
		if s.Addr.Host == "" {
			delete(r.sources, s.Partition)
		} else {
			r.sources[s.Partition] = s.Addr
		}
	}
	r.poke()
}

// loop is the replicator's goroutine.
func (r *replicator) loop(ctx context.Context, m *link.Conn) {
	defer r.closeSource()
	retry := time.Duration(0)
	for {
		if retry > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
		}
		retry = 0
		err := r.step(ctx, m)
		if ctx.Err() != nil {
			return
		}
		var fe *fatalError
		if errors.As(err, &fe) {
			r.n.log.Printf("neo storage: replication: %v (closing the master link)", err)
			m.Close()
			return
		}
		if err != nil {
			r.n.log.Printf("neo storage: replication: %v", err)
			r.closeSource()
			retry = time.Second
			continue
		}
		r.mu.Lock()
		busy := false
		for _, x := range r.parts {
			if x.ask || x.pending || x.repl && !x.notified {
				busy = true
			}
		}
		busy = busy || len(r.drops) > 0 || len(r.checks) > 0 || len(r.orders) > 0 || r.bdirty
		r.mu.Unlock()
		if busy {
			// Something to do: a drain (lockless stores) is polled.
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		if r.hasSource() {
			r.closeSource()
		}
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
	}
}

// step does one thing that is due, if any.
func (r *replicator) step(ctx context.Context, m *link.Conn) error {
	// The records of the partitions a request is for: a cell discarded
	// and given back meanwhile has a new record, which the answer, about
	// the old one, must not update.
	r.mu.Lock()
	var asked map[uint32]*replPart
	for p, x := range r.parts {
		if x.ask {
			if asked == nil {
				asked = map[uint32]*replPart{}
			}
			asked[p] = x
		}
	}
	r.mu.Unlock()
	if len(asked) > 0 {
		ask := slices.Sorted(maps.Keys(asked))
		var a proto.AnswerUnfinishedTransactions
		r.mu.Lock()
		r.asking = true
		r.mu.Unlock()
		err := m.Ask(ctx, &proto.AskUnfinishedTransactions{Offsets: ask}, &a)
		if err == nil && a.MaxTid != proto.InvalidTid {
			// The answer can overtake the handling of the master's
			// unlocks sent before it: a transaction up to MaxTid
			// locked here is made visible first, so that the
			// replication neither fetches it nor collides with it
			// (if it is still locked, the question is asked again).
			if !r.n.tm.waitUnlockedBefore(a.MaxTid+1, 30*time.Second) {
				err = fmt.Errorf("transactions up to %s still locked here after 30 s", a.MaxTid)
			}
		}
		r.mu.Lock()
		r.asking = false
		early := r.early
		r.early = map[zodb.Tid]zodb.Tid{}
		if err != nil {
			r.mu.Unlock()
			return fmt.Errorf("AskUnfinishedTransactions: %w", err)
		}
		for _, t := range a.TTids {
			if mt, ok := early[t]; ok {
				if mt != proto.InvalidTid && mt > a.MaxTid {
					a.MaxTid = mt
				}
				continue
			}
			r.ttids[t] = struct{}{}
		}
		for _, p := range ask {
			if x := r.parts[p]; x == asked[p] && x.ask {
				x.ask = false
				x.upTo = a.MaxTid
				x.pending = true
				x.waiting = len(r.ttids) > 0
			}
		}
		r.mu.Unlock()
		return nil
	}

	// A partition to replicate: the one furthest behind.
	r.mu.Lock()
	var (
		best  uint32
		bestX *replPart // nil: none pending
		upTo  zodb.Tid
	)
	for p, x := range r.parts {
		if !x.pending {
			continue
		}
		// The furthest behind first, then the lowest (as NEO/py).
		if bestX == nil || r.sink.ReplicatedTid(p) < r.sink.ReplicatedTid(best) ||
			r.sink.ReplicatedTid(p) == r.sink.ReplicatedTid(best) && p < best {
			best, bestX, upTo = p, x, x.upTo
		}
	}
	r.mu.Unlock()
	if bestX != nil {
		tid, err := r.replicatePartition(ctx, best, upTo)
		if err != nil {
			return fmt.Errorf("partition %d: %w", best, err)
		}
		// The switch to locked writes and the locks of the stores kept
		// without one happen at once, under the transaction manager's
		// lock (lock order: tm.mu, then r.mu), so that no store checks
		// an oid against its last committed serial while a transaction
		// that stored it without a lock is still in progress.
		r.n.tm.mu.Lock()
		r.mu.Lock()
		// (Not when the cell was discarded and given back meanwhile: its
		// new record starts over, from what this pass wrote.)
		if x := r.parts[best]; x == bestX {
			x.tid = tid
			if x.upTo == upTo {
				x.pending = false
			}
			if !x.pending && !x.waiting {
				x.repl = true
				r.publishLocked()
				r.n.tm.lockLocklessLocked(best)
			}
		}
		r.mu.Unlock()
		r.n.tm.mu.Unlock()
		return nil
	}

	// A check, when no replication is due (it uses links of its own).
	r.mu.Lock()
	var (
		ck    checkOrder
		check bool
	)
	if len(r.checks) > 0 {
		due := false
		for _, x := range r.parts {
			due = due || x.ask || x.pending
		}
		if !due {
			ck, check = r.checks[0], true
			r.checks = r.checks[1:]
		}
	}
	r.mu.Unlock()
	if check {
		r.closeSource()
		if err := r.runCheck(ctx, m, ck); err != nil {
			r.n.log.Printf("neo storage: %v", err)
		}
	}

	// Backup mode: a Replicate order, or the backup tid to record.
	if err := r.backupStep(ctx, m); err != nil {
		return err
	}

	// Replicated partitions whose lockless stores are gone.
	r.mu.Lock()
	var ready []uint32
	for p, x := range r.parts {
		if x.repl && !x.notified {
			ready = append(ready, p)
		}
	}
	r.mu.Unlock()
	sort.Slice(ready, func(i, j int) bool { return ready[i] < ready[j] })
	for _, p := range ready {
		if r.n.tm.hasLockless(p) {
			continue
		}
		r.mu.Lock()
		x := r.parts[p]
		if x == nil || x.notified {
			r.mu.Unlock()
			continue
		}
		x.notified = true
		tid := x.tid
		r.mu.Unlock()
		r.n.log.Printf("neo storage: partition %d replicated up to %s", p, tid)
		if err := m.Send(&proto.NotifyReplicationDone{Offset: p, Tid: tid}); err != nil {
			return err
		}
	}

	// Discarded partitions.
	r.mu.Lock()
	var drop []uint32
	for p := range r.drops {
		drop = append(drop, p)
	}
	r.mu.Unlock()
	for _, p := range drop {
		if r.assigned(p) {
			r.mu.Lock()
			delete(r.drops, p)
			r.mu.Unlock()
			continue
		}
		if r.n.tm.hasRecords(p) {
			continue // a transaction in progress writes some: later
		}
		more, err := r.sink.DropPartition(ctx, p, fetchCount)
		if err != nil {
			return err
		}
		if !more {
			r.mu.Lock()
			delete(r.drops, p)
			r.mu.Unlock()
			r.n.log.Printf("neo storage: data of discarded partition %d deleted", p)
		}
	}
	return nil
}

// assigned tells whether this node has a cell of partition p.
func (r *replicator) assigned(p uint32) bool {
	pt := r.n.pt.Load()
	if int(p) >= pt.np() {
		return false
	}
	for _, c := range pt.rows[p] {
		if c.NID == r.n.NID() {
			return true
		}
	}
	return false
}

// replicatePartition replicates partition p from a source up to upTo and
// records it durably; it returns the tid replicated up to.
func (r *replicator) replicatePartition(ctx context.Context, p uint32, upTo zodb.Tid) (zodb.Tid, error) {
	next := r.sink.ReplicatedTid(p)
	if next != 0 {
		next++
	}
	if upTo == proto.InvalidTid {
		upTo = 0 // nothing committed in the cluster
	}
	if next > upTo {
		// Nothing new; the progress found may have been recorded
		// mid-way, not durably: it is before the master is told.
		if err := r.sink.SetReplicatedTid(ctx, p, next-1, true); err != nil {
			return 0, err
		}
		return upTo, nil
	}
	if err := r.source(ctx, p); err != nil {
		return 0, err
	}
	r.n.log.Printf("neo storage: replicating partition %d from %s (%s..%s)", p, r.srcAddr, next, upTo)
	err := r.fetch(ctx, p, next, upTo, func(ctx context.Context) error { return r.sink.SetReplicatedTid(ctx, p, upTo, true) })
	if err != nil {
		return 0, err
	}
	return upTo, nil
}

// fetch replicates partition p from next to upTo from the current source:
// its transactions, then its object records, which a pipe writes while
// the next chunks are fetched; then, when last is not nil, last's write
// after them.
func (r *replicator) fetch(ctx context.Context, p uint32, next, upTo zodb.Tid, last func(context.Context) error) error {
	pipe := newReplPipe(ctx, r.sink)
	err := r.fetchTransactions(ctx, pipe, p, next, upTo)
	if err == nil {
		err = r.fetchObjects(ctx, pipe, p, next, upTo)
	}
	if err == nil && last != nil {
		err = pipe.do(last)
	}
	if werr := pipe.wait(); err == nil {
		err = werr
	}
	return err
}

// source makes the replicator's source a node to replicate p from: the
// one the master named (Replicate), else a running storage with a
// readable cell of p, chosen at random. The current link is kept when it
// fits.
func (r *replicator) source(ctx context.Context, p uint32) error {
	r.mu.Lock()
	addr, named := r.sources[p]
	r.mu.Unlock()
	me := r.n.NID()
	if !named {
		pt := r.n.pt.Load()
		var cands []proto.Address
		r.n.nodesMu.Lock()
		for _, c := range pt.rows[p] {
			if c.NID == me || !c.State.Readable() {
				continue
			}
			if e, ok := r.n.nodes[c.NID]; ok && e.typ == proto.Storage && e.state == proto.NodeRunning && e.addr.Host != "" {
				cands = append(cands, e.addr)
			}
		}
		r.n.nodesMu.Unlock()
		if len(cands) == 0 {
			return fmt.Errorf("no running storage has a readable cell")
		}
		addr = cands[0]
		for _, a := range cands {
			if r.hasSource() && a == r.srcAddr {
				addr = a
				break
			}
		}
		if !r.hasSource() || addr != r.srcAddr {
			addr = cands[rand.IntN(len(cands))]
		}
	}
	return r.connect(ctx, addr, "")
}

// connect makes the storage node at addr the replicator's source (of
// the upstream cluster of that name when upstream is not ""), keeping the
// current link when it is to that node. A node that refuses a second
// link because it has one to this node (NEO/py's) is asked over its own
// (revask.go).
func (r *replicator) connect(ctx context.Context, addr proto.Address, upstream string) error {
	if r.hasSource() && r.srcAddr == addr && r.srcUpstream == upstream {
		var done <-chan struct{}
		if r.src != nil {
			done = r.src.Done()
		} else {
			done = r.rsrc.gone
		}
		select {
		case <-done:
		default:
			return nil
		}
	}
	key := srcKey{addr, upstream}
	r.src, r.rsrc, r.srcPeer = nil, nil, nil
	r.srcAddr, r.srcUpstream = addr, upstream
	if l, ok := r.dialed[key]; ok {
		select {
		case <-l.c.Done():
			delete(r.dialed, key)
		default:
			r.src, r.srcPeer = l.c, l.p
			return nil
		}
	}
	c, rp, err := r.dialOrReverse(ctx, addr, upstream)
	if err != nil {
		return err
	}
	if rp != nil {
		r.rsrc = rp
		return nil
	}
	l := srcLink{c, r.n.linkPeer(c, addr)}
	if r.dialed == nil {
		r.dialed = map[srcKey]srcLink{}
	}
	r.dialed[key] = l
	r.src, r.srcPeer = l.c, l.p
	return nil
}

// srcKey names a source: its address and, for a node of an upstream
// cluster, that cluster's name.
type srcKey struct {
	addr     proto.Address
	upstream string
}

// srcLink is a link dialed to a source and the peer that stands for the
// source on it.
type srcLink struct {
	c *link.Conn
	p *peer
}

// hasSource tells whether the replicator has a source link.
func (r *replicator) hasSource() bool { return r.src != nil || r.rsrc != nil }

// dialStorage connects to the storage node at addr and identifies as
// this storage node (NEO/py's replicator and checker do the same); with
// upstream, to a node of that upstream cluster, anonymously (backup
// mode).
func (r *replicator) dialStorage(ctx context.Context, addr proto.Address, upstream string) (*link.Conn, error) {
	me := r.n.NID()
	hostport := addr.String()
	ictx, cancel := context.WithTimeout(ctx, r.n.cfg.IdentifyTimeout)
	defer cancel()
	c, err := link.DialOptions(ictx, "tcp", hostport, &link.Options{TLS: r.n.cfg.TLS, HandshakeTimeout: r.n.cfg.IdentifyTimeout, Logf: r.n.log.Printf})
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", hostport, err)
	}
	r.n.nodesMu.Lock()
	idTime := proto.NoIdTime
	if e, ok := r.n.nodes[me]; ok {
		idTime = e.idTime
	}
	r.n.nodesMu.Unlock()
	req := &proto.RequestIdentification{
		NodeType:    proto.Storage,
		NID:         me,
		Addr:        r.n.addr,
		ClusterName: r.n.cfg.Cluster,
		IdTime:      idTime,
	}
	if upstream != "" {
		req.NID, req.ClusterName = proto.NoNode, upstream
	}
	var acc proto.AcceptIdentification
	if err := c.Ask(ictx, req, &acc); err != nil {
		c.Close()
		return nil, fmt.Errorf("source %s: identification: %w", hostport, err)
	}
	if acc.NodeType != proto.Storage {
		c.Close()
		return nil, fmt.Errorf("source %s is a %v, not a storage", hostport, acc.NodeType)
	}
	return c, nil
}

// closeSource closes the links dialed to sources (a peer's own link is
// left to the peer).
func (r *replicator) closeSource() {
	for key, l := range r.dialed {
		l.c.Close()
		delete(r.dialed, key)
	}
	r.src, r.rsrc, r.srcPeer = nil, nil, nil
	r.srcAddr, r.srcUpstream = proto.Address{}, ""
}

// exchange sends req to the source and collects what the source sends
// for it — Add* notifications, handed to add in order — until its answer,
// decoded into ans. Other packets from the source are answered (Ping) or
// ignored.
func (r *replicator) exchange(ctx context.Context, req, ans proto.Msg, add func(*link.Request) error) error {
	if r.rsrc != nil {
		if err := r.rsrc.reverseAsk(ctx, req, ans, add); err != nil {
			return fmt.Errorf("source %s (over its link): %s: %w", r.srcAddr, proto.CodeName(req.Code()), err)
		}
		return nil
	}
	src, sp := r.src, r.srcPeer
	x := &revCall{add: add, done: make(chan error, 1)}
	sp.rev.Store(x)
	defer sp.rev.Store(nil)
	asked := make(chan error, 1)
	go func() { asked <- src.AskQueued(ctx, req, ans) }()
	// A node that stops (ctx done) closes the link to its source, which
	// ends the wait below (the source's answer, which AskQueued no longer
	// waits for, would never come).
	defer context.AfterFunc(ctx, func() { src.Close() })()
	// (The answer wins over a link closed after it: a pass that got all
	// it asked for is not failed and started again.)
	end, addErr := x.wait(nil, sp.gone, func() { src.Close() })
	switch end {
	case idleGone:
		return fmt.Errorf("source %s: nothing received for %v: link closed", r.srcAddr, replIdle)
	case linkGone:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("source %s: %w", r.srcAddr, src.Err())
	}
	// The answer's copy came after every Add* for it (serveLink).
	if err := <-asked; err != nil {
		return fmt.Errorf("source %s: %s: %w", r.srcAddr, proto.CodeName(req.Code()), err)
	}
	return addErr
}

// np is the number of partitions of the current partition table (at
// least 1).
func (r *replicator) np() uint32 { return uint32(max(r.n.pt.Load().np(), 1)) }

// fetchTransactions replicates partition p's transaction metadata from
// next to upTo; pipe writes each chunk while the next one is fetched.
func (r *replicator) fetchTransactions(ctx context.Context, pipe *replPipe, p uint32, next, upTo zodb.Tid) error {
	first := true
	var known []zodb.Tid
	for {
		var err error
		known, err = r.sink.ReplicationTIDs(ctx, p, r.np(), next, upTo, fetchCount, known[:0])
		if err != nil {
			return err
		}
		buf := pipe.batch()
		b := &buf.b
		var a proto.AnswerFetchTransactions
		req := &proto.AskFetchTransactions{Partition: p, Length: fetchCount, MinTid: next, MaxTid: upTo, KnownTids: known, AskPackInfo: first}
		err = r.exchange(ctx, req, &a, func(q *link.Request) error {
			if q.Code != proto.CodeAddTransaction {
				return badInput("%s during AskFetchTransactions", q.Name())
			}
			var t proto.AddTransaction
			if err := q.Decode(&t); err != nil {
				return badInput("AddTransaction: %v", err)
			}
			rt := ReplTxn{TxnInfo: TxnInfo{Tid: t.Tid, Packed: t.Packed, Oids: t.Oids,
				User: buf.keep(t.User), Description: buf.keep(t.Description), Extension: buf.keep(t.Extension)}, TTid: t.TTid}
			if t.Pack != nil {
				rp := *t.Pack
				if rp.OidsSet {
					rp.Oids = append([]zodb.Oid{}, rp.Oids...)
				}
				rt.Pack = &rp
			}
			b.Txns = append(b.Txns, rt)
			return nil
		})
		if err != nil {
			return err
		}
		b.DeleteTids = a.TidsToDelete
		if err := pipe.store(buf); err != nil {
			return err
		}
		if first && a.CompletedPack != proto.InvalidTid {
			pack := a.CompletedPack
			if err := pipe.do(func(ctx context.Context) error { return r.sink.UpdateCompletedPack(ctx, p, pack) }); err != nil {
				return err
			}
		}
		first = false
		if a.NextTid == proto.InvalidTid {
			return nil
		}
		if a.NextTid <= next {
			return badInput("AnswerFetchTransactions: next tid %s does not advance from %s", a.NextTid, next)
		}
		if len(a.TidsToDelete) > 0 {
			if err := pipe.drain(); err != nil {
				return err
			}
		}
		next = a.NextTid
	}
}

// fetchObjects replicates partition p's object records from next to
// upTo; pipe writes the records, gathered over chunks up to storeBytes,
// and then the progress, while the next chunks are fetched.
func (r *replicator) fetchObjects(ctx context.Context, pipe *replPipe, p uint32, next, upTo zodb.Tid) error {
	minOid := zodb.Oid(0)
	var known []RecordKey
	var buf *replBuf // records gathered and not written yet
	for {
		var err error
		known, err = r.sink.ReplicationRecords(ctx, p, r.np(), next, upTo, minOid, fetchCount, known[:0])
		if err != nil {
			return err
		}
		var dict []proto.SerialOids
		for _, k := range known {
			if n := len(dict); n > 0 && dict[n-1].Serial == k.Serial {
				dict[n-1].Oids = append(dict[n-1].Oids, k.Oid)
			} else {
				dict = append(dict, proto.SerialOids{Serial: k.Serial, Oids: []zodb.Oid{k.Oid}})
			}
		}
		if buf == nil {
			buf = pipe.batch()
		}
		np := uint64(r.np())
		var a proto.AnswerFetchObjects
		var o proto.AddObject
		req := &proto.AskFetchObjects{Partition: p, Length: fetchCount, MinTid: next, MaxTid: upTo, MinOid: minOid, ObjectDict: dict}
		err = r.exchange(ctx, req, &a, func(q *link.Request) error {
			if q.Code != proto.CodeAddObject {
				return badInput("%s during AskFetchObjects", q.Name())
			}
			o = proto.AddObject{}
			if err := q.Decode(&o); err != nil {
				return badInput("AddObject: %v", err)
			}
			if uint64(o.Oid)%np != uint64(p) {
				return badInput("AddObject: oid %s is not of partition %d", o.Oid, p)
			}
			ro := Object{Oid: o.Oid, Serial: o.Serial, Compression: o.Compression, Checksum: o.Checksum}
			if o.DataSerial != proto.InvalidTid {
				ro.DataSerial = o.DataSerial
			}
			if len(o.Data) == 0 && o.Checksum == ([20]byte{}) {
				ro.NoData = ro.DataSerial == 0
			} else {
				// Checked as a client's store is: damaged in the
				// source or on the way, the record would be kept
				// and served as the source's.
				if sha1.Sum(o.Data) != o.Checksum {
					return badInput("AddObject: oid %s serial %s: %d bytes of data do not match their checksum", o.Oid, o.Serial, len(o.Data))
				}
				ro.Data = buf.keep(o.Data)
			}
			buf.b.Objects = append(buf.b.Objects, ro)
			if buf.held > flushBytes {
				if err := pipe.store(buf); err != nil {
					return err
				}
				buf = pipe.batch()
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, d := range a.ObjectDict {
			for _, oid := range d.Oids {
				buf.b.DeleteObjs = append(buf.b.DeleteObjs, RecordKey{Serial: d.Serial, Oid: oid})
			}
		}
		deletes := len(buf.b.DeleteObjs) > 0
		if deletes || buf.held >= storeBytes || a.NextTid == proto.InvalidTid {
			if err := pipe.store(buf); err != nil {
				return err
			}
			buf = nil
		}
		if a.NextTid == proto.InvalidTid {
			return nil
		}
		if a.NextTid < next || a.NextTid == next && a.NextOid <= minOid {
			return badInput("AnswerFetchObjects: next (%s, %s) does not advance from (%s, %s)", a.NextTid, a.NextOid, next, minOid)
		}
		if a.NextTid > 0 && buf == nil {
			// Everything before next tid is here (NEO/py's
			// updateCellTID(partition, next_tid - 1)).
			done := a.NextTid - 1
			if err := pipe.do(func(ctx context.Context) error { return r.sink.SetReplicatedTid(ctx, p, done, false) }); err != nil {
				return err
			}
		}
		if deletes {
			if err := pipe.drain(); err != nil {
				return err
			}
		}
		next, minOid = a.NextTid, a.NextOid
	}
}
