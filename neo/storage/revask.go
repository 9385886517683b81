package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
)

// One link per pair of storage nodes, used both ways. NEO/py keeps one
// connection per pair of nodes and sends its requests over whichever
// exists: a NEO/py node that has a link to this one (to replicate from
// it) refuses the identification of a second link from this node with
// "already connected" (unless this node's id is the greater), and a
// NEO/py node this node dialed to replicate from asks its own fetches and
// checks over that link. In a backup cluster, where a node keeps its link
// to the cell it replicates from open, both happen. So:
//
//   - the link the replicator dials to a source is read by a goroutine of
//     its own (serveLink), which hands the source's Add* packets and the
//     answer to the replicator's request in flight, and serves the
//     source's replication and check requests as on an accepted link
//     (dispatchRepl);
//   - when a source refuses the dial so, the replicator asks over the
//     source's own link to this node (reverseAsk), whose reader hands it
//     the Add* packets and the answer (takeReverse).

// revCall is the replication request in flight on a link, waiting for
// what the source sends for it.
type revCall struct {
	id     uint32    // on a peer's link: the request's msg_id
	ans    proto.Msg // on a peer's link: decoded here (else by the link's Ask)
	add    func(*link.Request) error
	addErr error
	done   chan error   // capacity 1: the outcome, once the answer came
	heard  atomic.Int64 // unix nanos of the last packet taken for it (replIdle)
}

// replIdle bounds how long a replication request waits with nothing from
// its source (no Add* packet, no answer): a source that hangs (its kernel
// still answering TCP keepalives) would hold the replication for ever;
// its link is closed then, and the replication starts again, from
// whichever source the partition table names by then (NEO/py's
// connections close after a Ping left unanswered, likewise).
var replIdle = 60 * time.Second

// waitEnd is how revCall.wait ended.
type waitEnd int

const (
	answered  waitEnd = iota // the outcome came (err)
	linkGone                 // the link closed first
	idleGone                 // nothing came for replIdle: the link was closed
	cancelled                // stop was closed first
)

// wait waits for c's outcome until the link goes (gone), stop is closed,
// or nothing came from the source for replIdle: then it calls closeLink
// and waits for gone.
func (c *revCall) wait(stop, gone <-chan struct{}, closeLink func()) (waitEnd, error) {
	c.heard.Store(time.Now().UnixNano())
	t := time.NewTimer(replIdle)
	defer t.Stop()
	idled := false
	for {
		select {
		case err := <-c.done:
			return answered, err
		case <-gone:
			// A source that answered and then closed the link made both
			// ready, and select picks either: the answer, when it came,
			// wins.
			select {
			case err := <-c.done:
				return answered, err
			default:
			}
			if idled {
				return idleGone, nil
			}
			return linkGone, nil
		case <-stop:
			return cancelled, nil
		case <-t.C:
			if quiet := time.Since(time.Unix(0, c.heard.Load())); quiet < replIdle {
				t.Reset(replIdle - quiet)
				continue
			}
			idled = true
			closeLink()
		}
	}
}

// take hands an AddTransaction or AddObject packet of the source to the
// request's add; the first error is kept as the request's outcome.
func (c *revCall) take(q *link.Request) {
	c.heard.Store(time.Now().UnixNano())
	switch {
	case c.addErr != nil:
	case c.add == nil:
		c.addErr = fmt.Errorf("%s for a request that has none", q.Name())
	default:
		c.addErr = c.add(q)
	}
}

// revIDs numbers the requests this node sends on its peers' links (the
// ids of a link's two directions are independent in NEO).
var revIDs atomic.Uint32

// storagePeerAt returns the identified storage peer whose link comes
// from the node announced at addr, or nil.
func (n *Node) storagePeerAt(addr proto.Address) *peer {
	n.peersMu.Lock()
	defer n.peersMu.Unlock()
	for p := range n.peers {
		if p.identified && p.typ == proto.Storage && p.nid != proto.NoNode && p.addr == addr {
			return p
		}
	}
	return nil
}

// claim marks p identified, under the peers' lock (storagePeerAt reads
// the type, id and address of identified peers only). A second link of a
// storage node is accepted (zodbd's checker opens links of its own beside
// the replication's; NEO/py refuses one with "uuid conflict: retry
// later").
func (n *Node) claim(p *peer) {
	n.peersMu.Lock()
	p.identified = true
	n.peersMu.Unlock()
}

// reverseAsk sends req on p's link and hands the AddTransaction and
// AddObject packets that come before its answer to add (in the peer's
// reader goroutine, in order; nil: a request that has none, such as a
// check), then decodes the answer into ans. One call at a time per peer
// (the replicator's goroutine).
func (p *peer) reverseAsk(ctx context.Context, req, ans proto.Msg, add func(*link.Request) error) error {
	c := &revCall{id: revIDs.Add(1), ans: ans, add: add, done: make(chan error, 1)}
	if !p.rev.CompareAndSwap(nil, c) {
		return errors.New("a replication request is already in flight on this link")
	}
	defer p.rev.Store(nil)
	if err := p.w.Write(proto.AppendPacket(nil, c.id, req)); err != nil {
		return err
	}
	end, err := c.wait(ctx.Done(), p.gone, func() { p.nc.Close() })
	switch end {
	case answered:
		return err
	case linkGone:
		return fmt.Errorf("%s: link closed", p.name)
	case idleGone:
		return fmt.Errorf("%s: nothing received for %v: link closed", p.name, replIdle)
	default:
		// The answer, if it comes, finds no call: the link goes, as the
		// two nodes are no longer in step. Its reader may be handing
		// add a packet: the caller may free what add writes to (the
		// replication's pipe) only once the reader is done.
		p.nc.Close()
		<-p.gone
		return ctx.Err()
	}
}

// takeReverse handles, in the peer's reader goroutine, a packet that
// belongs to the replication request in flight on the link, if any: its
// Add* packets and its answer. It returns false for any other packet.
func (p *peer) takeReverse(id uint32, code uint16, args []byte) bool {
	c := p.rev.Load()
	if c == nil {
		return false
	}
	switch {
	case code == proto.CodeAddTransaction || code == proto.CodeAddObject:
		c.take(&link.Request{ID: id, Code: code, Args: args})
		return true
	case code&proto.AnswerBit != 0 && id == c.id:
		// The answer's byte fields must outlive the reader's buffer.
		err := proto.DecodeMsg(code, bytes.Clone(args), c.ans)
		if err == nil {
			err = c.addErr
		}
		p.rev.Store(nil)
		c.done <- err
		return true
	}
	return false
}

// dialOrReverse dials the storage node at addr (dialStorage); when the
// node refuses because it has a link to this one ("already connected":
// NEO/py's nodes), it returns that node's peer instead, whose own link
// this node then asks over (reverseAsk).
func (r *replicator) dialOrReverse(ctx context.Context, addr proto.Address, upstream string) (*link.Conn, *peer, error) {
	c, err := r.dialStorage(ctx, addr, upstream)
	var pe *proto.Error
	if err != nil && upstream == "" && errors.As(err, &pe) && strings.Contains(pe.Message, "already connected") {
		if p := r.n.storagePeerAt(addr); p != nil {
			return nil, p, nil
		}
	}
	return c, nil, err
}

// linkPeer returns the peer that stands for the source at the other end
// of link c, which this node dialed and identified on, with the goroutine
// that reads c (serveLink) started.
func (n *Node) linkPeer(c *link.Conn, addr proto.Address) *peer {
	p := &peer{n: n, w: c.Writer(), name: addr.String() + " (dialed)", sem: make(chan struct{}, n.cfg.MaxInflight),
		typ: proto.Storage, addr: addr, gone: make(chan struct{})}
	go n.serveLink(c, p)
	return p
}

// serveLink reads link c, dialed to the source that p stands for, until
// it closes: Add* packets and the queued copy of the answer go to the
// replication request in flight (exchange), the source's replication and
// check requests are served, pings answered.
func (n *Node) serveLink(c *link.Conn, p *peer) {
	defer close(p.gone)
	defer p.wg.Wait()
	for {
		q, err := c.Recv()
		if err != nil {
			return
		}
		x := p.rev.Load()
		switch q.Code {
		case proto.CodeAddTransaction, proto.CodeAddObject:
			if x != nil {
				x.take(q)
			}
		case proto.CodeAskFetchTransactions, proto.CodeAskFetchObjects, proto.CodeAskCheckTIDRange, proto.CodeAskCheckSerialRange:
			if err := p.dispatchRepl(q.ID, q.Code, q.Args); err != nil {
				n.log.Printf("neo storage: %s: %s: %v (closing)", p.name, q.Name(), err)
				c.Close()
			}
		case proto.CodePing:
			c.Reply(q.ID, &proto.Pong{})
		default:
			if q.IsAnswer() {
				// The copy of the answer to the request in flight
				// (AskQueued): every Add* for it came before.
				if x != nil {
					p.rev.Store(nil)
					x.done <- x.addErr
				}
			} else {
				n.log.Printf("neo storage: %s: %s ignored", p.name, q.Name())
			}
		}
		q.Release()
	}
}
