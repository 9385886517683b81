package storage

import (
	"context"
	"fmt"
	"time"

	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// This file is the checking side of NEO's replica check (`neoctl check`):
// the master sends CheckPartition(partition, source, min_tid, max_tid) to
// one node holding the partition, which compares, range by range, the
// checksums of its own cell with those of the other readable cells
// (AskCheckTIDRange over the transactions, then AskCheckSerialRange over
// the object records) and reports the cells that differ to the master
// (NotifyPartitionCorrupted; the master marks them CORRUPTED). With a
// source, the cells that differ from the source's are corrupted; without,
// a difference marks them all (NEO/py's neo/storage/checker.py, read for
// facts only). In a backup cluster the source may be a node of the
// upstream cluster, reached anonymously. Checks run in the replicator's
// goroutine, one partition at a time, when no replication is due.

// checkCount is NEO/py's CHECK_COUNT: the items per checked range.
const checkCount = 40000

// checkOrder is one CheckPartition.
type checkOrder struct {
	p        uint32
	upstream string        // backup clusters only (refused)
	source   proto.Address // Host "": none
	min, max zodb.Tid
}

// check queues a CheckPartition order (the master session's hook).
func (r *replicator) check(m *proto.CheckPartition) {
	r.mu.Lock()
	r.checks = append(r.checks, checkOrder{p: m.Partition, upstream: m.UpstreamName, source: m.Source, min: m.MinTid, max: m.MaxTid})
	r.mu.Unlock()
	r.poke()
}

// checkPeer is one node taking part in a check; c is nil for this node.
type checkPeer struct {
	nid      proto.NodeID
	addr     proto.Address
	upstream string     // a node of this upstream cluster (backup mode): the source
	c        *link.Conn // the link dialed to it, or
	rp       *peer      // its own link to this node, when it refused ours (revask.go)
	ans      any        // its last answer
}

// ask sends a check request to x and waits for the answer.
func (x *checkPeer) ask(ctx context.Context, req, ans proto.Msg) error {
	if x.rp != nil {
		return x.rp.reverseAsk(ctx, req, ans, nil)
	}
	return x.c.Ask(ctx, req, ans)
}

// runCheck runs one check order to its end.
func (r *replicator) runCheck(ctx context.Context, m *link.Conn, o checkOrder) error {
	me := r.n.NID()
	pt := r.n.pt.Load()
	fail := func(why string) error {
		r.n.log.Printf("neo storage: failed to start checking partition %d (%s)", o.p, why)
		return nil
	}
	if int(o.p) >= pt.np() {
		return fail("no such partition")
	}
	if r.sink == nil {
		return fail(fmt.Sprintf("the backend (%T) cannot compute checksums", r.n.be))
	}
	mine := false
	var peers []*checkPeer
	r.n.nodesMu.Lock()
	for _, c := range pt.rows[o.p] {
		switch {
		case c.NID == me:
			mine = c.State != proto.OutOfDate
		case c.State.Readable():
			if e, ok := r.n.nodes[c.NID]; ok && e.state == proto.NodeRunning && e.addr.Host != "" {
				peers = append(peers, &checkPeer{nid: c.NID, addr: e.addr})
			}
		}
	}
	r.n.nodesMu.Unlock()
	if !mine {
		return fail("discarded or out-of-date")
	}
	var source *checkPeer
	if o.upstream != "" {
		// Backup mode: the cells of this cluster against the
		// upstream's node, which is the reference.
		if o.source.Host == "" {
			return fail("no upstream source")
		}
		source = &checkPeer{nid: proto.NoNode, addr: o.source, upstream: o.upstream}
		peers = append(peers, source)
	} else if o.source.Host != "" {
		if o.source == r.n.addr {
			source = &checkPeer{nid: me}
		}
		for _, x := range peers {
			if x.addr == o.source {
				source = x
			}
		}
		if source == nil {
			return fail("unavailable source")
		}
	}
	if len(peers) == 0 {
		return fail("no replica")
	}
	self := &checkPeer{nid: me, addr: r.n.addr}
	if source != nil && source.nid == me {
		source = self
	}
	defer func() {
		for _, x := range peers {
			if x.c != nil {
				x.c.Close()
			}
		}
	}()
	for _, x := range peers {
		c, rp, err := r.dialOrReverse(ctx, x.addr, x.upstream)
		if err != nil {
			return fmt.Errorf("check of partition %d: %w", o.p, err)
		}
		x.c, x.rp = c, rp
		if c != nil {
			r.n.linkPeer(c, x.addr) // its requests on that link are served
		}
	}
	all := append([]*checkPeer{self}, peers...)
	r.n.log.Printf("neo storage: checking partition %d from %s to %s with %d other node(s)", o.p, o.min, o.max, len(peers))
	// What is locked up to max is made visible first (NEO/py waits too).
	r.n.tm.waitUnlockedBefore(o.max+1, 10*time.Second)

	nextTid, nextOid, serials := o.min, zodb.Oid(0), false
	for {
		for _, x := range all {
			var err error
			if x == self {
				x.ans, err = r.localCheck(ctx, o.p, nextTid, o.max, nextOid, serials)
			} else if serials {
				var a proto.AnswerCheckSerialRange
				err = x.ask(ctx, &proto.AskCheckSerialRange{Partition: o.p, Length: checkCount, MinTid: nextTid, MaxTid: o.max, MinOid: nextOid}, &a)
				x.ans = a
			} else {
				var a proto.AnswerCheckTIDRange
				err = x.ask(ctx, &proto.AskCheckTIDRange{Partition: o.p, Length: checkCount, MinTid: nextTid, MaxTid: o.max}, &a)
				x.ans = a
			}
			if err != nil {
				return fmt.Errorf("check of partition %d: node %d: %w", o.p, x.nid, err)
			}
		}
		differ := false
		for _, x := range all[1:] {
			differ = differ || x.ans != all[0].ans
		}
		if differ {
			var ref any
			if source != nil {
				ref = source.ans
			}
			var bad []proto.NodeID
			keep := all[:0]
			for _, x := range all {
				if x.ans != ref {
					bad = append(bad, x.nid)
				} else {
					keep = append(keep, x)
				}
			}
			r.n.log.Printf("neo storage: partition %d differs on nodes %v", o.p, bad)
			if err := m.Send(&proto.NotifyPartitionCorrupted{Partition: o.p, CellList: bad}); err != nil {
				return err
			}
			all = keep
			if len(all) <= 1 {
				r.n.log.Printf("neo storage: check of partition %d aborted", o.p)
				return nil
			}
		}
		switch a := all[0].ans.(type) {
		case proto.AnswerCheckTIDRange:
			if a.Count < checkCount {
				nextTid, nextOid, serials = o.min, 0, true
			} else {
				nextTid = a.MaxTid + 1
			}
		case proto.AnswerCheckSerialRange:
			if a.Count < checkCount {
				r.n.log.Printf("neo storage: partition %d checked from %s to %s", o.p, o.min, o.max)
				return nil
			}
			nextTid, nextOid = a.MaxTid, a.MaxOid+1
		}
	}
}

// localCheck computes this node's answer to a check of partition p, the
// one it would give a peer (checkTIDs, checkSerials).
func (r *replicator) localCheck(ctx context.Context, p uint32, minTid, maxTid zodb.Tid, minOid zodb.Oid, serials bool) (any, error) {
	np := r.np()
	if !serials {
		return checkTIDs(ctx, r.sink, p, np, minTid, maxTid, checkCount)
	}
	return checkSerials(ctx, r.sink, p, np, minTid, maxTid, minOid, checkCount)
}
