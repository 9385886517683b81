package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/internal/netconn"
	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// peer is an accepted connection (a client or a storage).
type peer struct {
	n    *Node
	nc   net.Conn
	w    *netconn.Writer
	name string
	sem  chan struct{}
	wg   sync.WaitGroup
	// replHeld bounds what its replication requests hold (replserve.go).
	replHeld heldBytes
	closed   bool       // CloseClient received
	stats    *peerStats // nil unless Node.EnableStats (stats.go)
	typ      proto.NodeType
	nid      proto.NodeID
	// held, delayed, events and txns are guarded by the transaction
	// manager's mu: the bytes of data its transactions hold until their
	// vote, its reads waiting for write locks, its stores, checks and
	// relocks waiting for them, and its transactions in progress.
	held, delayed, events, txns int
	// identified is set, under the node's peersMu, once the peer's
	// identification is accepted: typ, nid and addr are set before.
	identified bool

	// A storage peer's link also carries this node's replication
	// requests when the peer refused a link of ours (revask.go).
	addr proto.Address // the address it announced
	rev  atomic.Pointer[revCall]
	gone chan struct{} // closed when the link is
}

// request is one decoded request, handed to a serving goroutine.
type request struct {
	msgID             uint32
	code              uint16
	oid               zodb.Oid
	tid, at, before   zodb.Tid
	min, max          zodb.Tid
	first, last, len_ int
	partition         uint32
	// zeroBound: AskObject's at or before is tid 0 itself (not nil): no
	// revision can be at or before it.
	zeroBound bool
}

// acceptLoop serves the peers that connect until ctx is done or the
// listener is closed; other errors of Accept are logged and accepting goes
// on (netconn.Accept).
func (n *Node) acceptLoop(ctx context.Context, wg *sync.WaitGroup) {
	for {
		nc, err := netconn.Accept(n.ln, func(err error, delay time.Duration) bool {
			if ctx.Err() != nil {
				return false
			}
			n.log.Printf("neo storage: accept: %v; retrying in %v", err, delay)
			return true
		})
		if err != nil {
			return
		}
		wg.Add(1) // Run waits for the peers too: it closes the backend next
		go func() {
			defer wg.Done()
			n.servePeer(ctx, nc)
		}()
	}
}

func (n *Node) servePeer(ctx context.Context, nc net.Conn) {
	defer nc.Close()
	name := nc.RemoteAddr().String()
	nc, rd, err := link.Handshake(ctx, nc, &link.Options{TLS: n.cfg.TLS, HandshakeTimeout: n.cfg.IdentifyTimeout, BusyPoll: n.cfg.BusyPoll}, true)
	if err != nil {
		n.log.Printf("neo storage: %s: %v (closing)", name, err)
		return
	}
	p := &peer{n: n, nc: nc, w: n.newWriter(nc, name), name: name, sem: make(chan struct{}, n.cfg.MaxInflight), stats: n.newPeerStats(), gone: make(chan struct{})}
	defer close(p.gone)
	defer p.w.Close()
	n.peersMu.Lock()
	n.peers[p] = struct{}{}
	n.peersMu.Unlock()
	defer func() {
		n.peersMu.Lock()
		delete(n.peers, p)
		n.retire(p)
		n.peersMu.Unlock()
	}()
	charge := netconn.FrameCharge{M: n.frameMem}
	rd.Resize = charge.Resize
	defer rd.Release()
	nc.SetReadDeadline(time.Now().Add(n.cfg.IdentifyTimeout))
	pk, err := rd.ReadPacket()
	id, code, args := pk.ID, pk.Code, pk.Args
	if err != nil {
		n.log.Printf("neo storage: %s: identification: %v (closing)", name, err)
		return
	}
	if code != proto.CodeRequestIdentification {
		n.log.Printf("neo storage: %s: %s before identification (closing)", name, proto.CodeName(code))
		p.errorAndClose(id, proto.ProtocolError, "identification required")
		return
	}
	if !p.identify(ctx, id, args) {
		return
	}
	nc.SetReadDeadline(time.Time{})
	defer func() {
		// The requests still being served end before the connection
		// is forgotten, but a peer that does not read must not keep
		// them waiting for room to write their answers (nor keep its
		// socket): what is queued gets a second to go out, then the
		// socket closes, which fails the writes waiting on it.
		nc.SetWriteDeadline(time.Now().Add(time.Second))
		p.w.Close()
		nc.Close()
		p.wg.Wait()
	}()
	if n.tm != nil {
		defer n.tm.dropPeer(p) // before the wait: it drops the delayed reads
	}
	for {
		pk, err := rd.ReadPacket()
		id, code, args := pk.ID, pk.Code, pk.Args
		if err != nil {
			if _, ok := errors.AsType[*proto.FrameError](err); ok {
				n.log.Printf("neo storage: %s: %v (closing)", p.name, err)
			} else if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				n.log.Printf("neo storage: %s: %v", p.name, err)
			}
			return
		}
		// Replies are held while more whole requests are buffered, so
		// that a pipelining client gets them in one write; they go out
		// as soon as the reader has no whole request left to handle
		// (with part of the next one buffered too: held while it waits
		// for the rest, they went out only with more bytes, and a client
		// that sent a partial packet and read nothing made the node
		// queue without bound, the corked writer never waiting).
		if p.typ == proto.Storage && p.takeReverse(id, code, args) {
			// A packet for this node's own request (revask.go); what
			// the requests before it queued goes out as below.
			if !rd.PacketBuffered() {
				p.w.Uncork()
			}
			continue
		}
		p.w.Cork()
		err = p.timedDispatch(id, code, args)
		if !rd.PacketBuffered() {
			p.w.Uncork()
		}
		if err != nil {
			n.log.Printf("neo storage: %s: %s: %v (closing)", p.name, proto.CodeName(code), err)
			return
		}
		if p.closed {
			return
		}
	}
}

// errBadOffsets is the decoding error of AskTIDs and AskObjectHistory
// whose first offset is not below the last (NEO/py's "invalid offsets").
var errBadOffsets = errors.New("invalid offsets")

func (p *peer) errorAndClose(id uint32, code proto.ErrorCode, msg string) {
	b := appendError(nil, id, code, msg)
	p.w.Write(b)
}

// identify checks a RequestIdentification (neo-protocol.md §6.4) and
// answers it; false when the link is to be closed.
func (p *peer) identify(ctx context.Context, id uint32, args []byte) bool {
	n := p.n
	var m proto.RequestIdentification
	if err := m.DecodeArgs(args); err != nil {
		n.log.Printf("neo storage: %s: RequestIdentification: %v (closing)", p.name, err)
		p.errorAndClose(id, proto.ProtocolError, "malformed identification")
		return false
	}
	typ, nid, cluster := m.NodeType, m.NID, m.ClusterName
	p.typ, p.nid, p.addr = typ, nid, m.Addr
	ts, hasTS := m.IdTime, m.IdTime != proto.NoIdTime
	p.name = fmt.Sprintf("%s (%s)", p.name, nidString(typ, nid))
	if string(cluster) != n.cfg.Cluster {
		n.log.Printf("neo storage: %s: wrong cluster name %s (closing)", p.name, eventlog.PyReprCut(cluster, 64))
		p.errorAndClose(id, proto.ProtocolError, "invalid cluster name")
		return false
	}
	if typ != proto.Client && typ != proto.Storage {
		n.log.Printf("neo storage: %s: node type %d rejected (closing)", p.name, typ)
		p.errorAndClose(id, proto.ProtocolError, "reject non-client-or-storage node")
		return false
	}
	if !n.operational.Load() {
		p.errorAndClose(id, proto.NotReady, "Not ready")
		return false
	}
	if nid == proto.NoNode {
		if typ != proto.Storage {
			p.errorAndClose(id, proto.ProtocolError, "client without node id")
			return false
		}
	} else if !n.waitKnown(ctx, nid, typ, ts, hasTS) {
		n.log.Printf("neo storage: %s: unknown by master (closing)", p.name)
		p.errorAndClose(id, proto.NotReady, "unknown node")
		return false
	}
	if !n.operational.Load() {
		p.errorAndClose(id, proto.NotReady, "Not ready")
		return false
	}
	if typ == proto.Storage && nid != proto.NoNode && nid == n.NID() {
		n.log.Printf("neo storage: %s: our own node id (closing)", p.name)
		p.errorAndClose(id, proto.ProtocolError, "uuid conflict or loopback connection")
		return false
	}
	n.claim(p)
	acc := proto.AcceptIdentification{NodeType: proto.Storage, YourNID: nid}
	if nid != proto.NoNode {
		acc.MyNID = n.NID()
	}
	p.w.Write(proto.AppendPacket(nil, id, &acc))
	return true
}

func nidString(typ proto.NodeType, nid proto.NodeID) string {
	if nid == proto.NoNode {
		return "anonymous"
	}
	prefix := map[proto.NodeType]string{proto.Master: "M", proto.Storage: "S", proto.Client: "C", proto.Admin: "A"}[typ]
	if prefix == "" {
		prefix = "?"
	}
	return prefix + strconv.Itoa(int(nid)&0xffffff)
}

// waitKnown waits until the master has announced node nid with id
// timestamp ts (NEO/py's NodeManager.getByUUID(nid, id_timestamp)): a
// notification older than ts (or none yet) delays the identification; a
// newer one means that this identity is stale.
func (n *Node) waitKnown(ctx context.Context, nid proto.NodeID, typ proto.NodeType, ts float64, hasTS bool) bool {
	timer := time.NewTimer(n.cfg.IdentifyTimeout)
	defer timer.Stop()
	for {
		n.nodesMu.Lock()
		e, ok := n.nodes[nid]
		ch := n.nodesChanged
		n.nodesMu.Unlock()
		if ok {
			if e.typ != typ {
				return false
			}
			switch {
			case !hasTS || e.idTime == ts:
				return true
			case e.idTime > ts:
				return false
			}
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// dispatch decodes one request and serves it on its own goroutine.
func (p *peer) dispatch(id uint32, code uint16, args []byte) error {
	n := p.n
	if p.typ == proto.Client && isWriteCode(code) && n.backup.Load() != nil {
		// Backup mode: clients read only.
		if code != proto.CodeAbortTransaction {
			p.w.Write(appendError(nil, id, proto.ReadOnlyAccess, "read-only access because the cluster is backing up"))
		}
		return nil
	}
	if n.tm != nil && p.typ == proto.Client && isWriteCode(code) {
		// (A storage peer gets the read-only answers: NEO/py's storages
		// take no writes from each other.)
		return p.dispatchWrite(id, code, args)
	}
	req := n.reqPool.Get().(*request)
	*req = request{msgID: id, code: code}
	var err error
	switch code {
	case proto.CodeAskObject:
		var m proto.AskObject
		err = m.DecodeArgs(args)
		req.oid, req.at, req.before = m.Oid, optTid(m.At), optTid(m.Before)
		// The bound used is at when given (NEO/py's getObject), else
		// before.
		req.zeroBound = m.At == 0 || m.At == proto.InvalidTid && m.Before == 0
		if bt, ok := n.backupTid(); ok && p.typ == proto.Client {
			req.boundRead(bt)
		}
	case proto.CodeAskTIDs:
		var m proto.AskTIDs
		if err = m.DecodeArgs(args); err == nil && m.First >= m.Last {
			err = errBadOffsets
		}
		req.first, req.last, req.partition = clampInt(m.First), clampInt(m.Last), m.Partition
	case proto.CodeAskTIDsFrom:
		var m proto.AskTIDsFrom
		err = m.DecodeArgs(args)
		req.min, req.max, req.len_, req.partition = m.MinTid, m.MaxTid, clampInt(uint64(m.Length)), m.Partition
		if bt, ok := n.backupTid(); ok && p.typ == proto.Client {
			req.max = min(req.max, bt)
		}
	case proto.CodeAskOIDsFrom:
		var m proto.AskOIDsFrom
		err = m.DecodeArgs(args)
		req.partition, req.len_, req.oid, req.tid = m.Partition, clampInt(uint64(m.Length)), m.MinOid, m.Tid
	case proto.CodeAskTransactionInformation:
		var m proto.AskTransactionInformation
		err = m.DecodeArgs(args)
		req.tid = m.Tid
	case proto.CodeAskObjectHistory:
		var m proto.AskObjectHistory
		if err = m.DecodeArgs(args); err == nil && m.First >= m.Last {
			err = errBadOffsets
		}
		req.oid, req.first, req.last = m.Oid, clampInt(m.First), clampInt(m.Last)
	case proto.CodeAskFinalTID:
		var m proto.AskFinalTID
		err = m.DecodeArgs(args)
		req.tid = m.TTid
	case proto.CodePing:
		var m proto.Ping
		err = m.DecodeArgs(args)
	case proto.CodeCloseClient:
		n.reqPool.Put(req)
		p.closed = true
		return nil
	case proto.CodeAbortTransaction, proto.CodeNotifyPackCompleted:
		// Nothing to abort: this node never accepted a store.
		n.reqPool.Put(req)
		return nil
	case proto.CodeAskStoreObject, proto.CodeAskStoreTransaction, proto.CodeAskVoteTransaction,
		proto.CodeAskCheckCurrentSerial, proto.CodeAskRelockObject, proto.CodeAskObjectUndoSerial:
		n.reqPool.Put(req)
		p.w.Write(appendError(nil, id, proto.ReadOnlyAccess, "read-only storage node"))
		return nil
	case proto.CodeAskFetchTransactions, proto.CodeAskFetchObjects,
		proto.CodeAskCheckTIDRange, proto.CodeAskCheckSerialRange:
		n.reqPool.Put(req)
		return p.dispatchRepl(id, code, args) // replserve.go
	default:
		n.reqPool.Put(req)
		if code&proto.AnswerBit != 0 {
			return badInput("unexpected answer %s", proto.CodeName(code))
		}
		if !proto.KnownCode(code) {
			return badInput("unknown packet code 0x%04x", code)
		}
		p.errorAndClose(id, proto.ProtocolError, "unexpected "+proto.CodeName(code))
		return badInput("unexpected %s", proto.CodeName(code))
	}
	if err != nil {
		n.reqPool.Put(req)
		if err == errBadOffsets {
			p.errorAndClose(id, proto.ProtocolError, "invalid offsets") // as NEO/py
		}
		return badInput("bad arguments: %v", err)
	}
	if n.tm != nil && n.tm.nlocked.Load() != 0 { // else lock-free
		if delayed, err := n.tm.delayRead(p, req); delayed || err != nil {
			if err != nil {
				n.reqPool.Put(req)
				p.errorAndClose(id, proto.ProtocolError, err.Error())
			}
			return err // else served when the transaction that locks it ends
		}
	}
	if req.code == proto.CodeAskObject {
		// Loads are answered inline: a pread from the page cache costs
		// less than a goroutine hop, and the reply joins the others of
		// this batch of pipelined requests (see servePeer).
		p.serve(req)
		return nil
	}
	p.sem <- struct{}{}
	p.wg.Add(1)
	h, t0 := p.stats.spawn(code)
	go func() {
		p.serve(req)
		served(h, t0)
		<-p.sem
		p.wg.Done()
	}()
	return nil
}

// optTid maps NEO's nil tid (proto.InvalidTid) to 0, "not given".
func optTid(t zodb.Tid) zodb.Tid {
	if t == proto.InvalidTid {
		return 0
	}
	return t
}

// nilTid maps a backend's 0, "none", to NEO's nil tid (proto.InvalidTid).
func nilTid(t zodb.Tid) zodb.Tid {
	if t == 0 {
		return proto.InvalidTid
	}
	return t
}

// clampInt converts a count or index from the wire to an int.
func clampInt(v uint64) int {
	return int(min(v, math.MaxInt32))
}

// serve answers one request and puts req back in its pool.
func (p *peer) serve(req *request) {
	n := p.n
	defer n.reqPool.Put(req)
	bp := n.bufPool.Get().(*[]byte)
	b := (*bp)[:0]
	ctx := context.Background()
	ans := req.code | proto.AnswerBit
	pt := n.pt.Load()
	readable := func(x uint64) bool {
		np := uint64(pt.np())
		return np > 0 && pt.readable[x%np]
	}
	switch req.code {
	case proto.CodeAskObject:
		if !readable(uint64(req.oid)) {
			b = appendError(b, req.msgID, proto.NonReadableCell, "")
			break
		}
		o := n.objPool.Get().(*Object)
		err := n.be.Object(ctx, req.oid, req.at, req.before, o)
		if err == nil && req.zeroBound {
			// The oid exists (its newest revision was read), but not at or
			// before tid 0: ZODB's loadBefore(oid, z64) is None.
			err = ErrOidNotFound
		}
		if err != nil {
			b = p.appendErr(b, req, err)
		} else {
			a := proto.AnswerObject{
				Oid:         o.Oid,
				Serial:      o.Serial,
				NextSerial:  nilTid(o.NextSerial),
				Compression: o.Compression,
				Checksum:    o.Checksum,
				Data:        o.Data,
				DataSerial:  nilTid(o.DataSerial),
			}
			b = a.AppendArgsHead(appendHeader(b, req.msgID, ans))
			// The data goes out without an extra copy into b.
			var tail [11]byte
			p.w.Write(b, o.Data, a.AppendArgsTail(tail[:0]))
			b = b[:0]
		}
		if cap(o.Data) > 1<<20 {
			o.Data = make([]byte, 0, objBufSize)
		}
		n.objPool.Put(o)

	case proto.CodeAskTIDs:
		var parts []uint32
		if req.partition == proto.InvalidPartition {
			parts = pt.rlist
		} else if int(req.partition) >= pt.np() || !pt.readable[req.partition] {
			b = appendError(b, req.msgID, proto.NonReadableCell, "")
			break
		} else {
			parts = []uint32{req.partition}
		}
		var tids []zodb.Tid
		var err error
		if len(parts) > 0 && req.first < req.last {
			tids, err = n.be.TIDs(ctx, req.first, req.last, parts)
		}
		if err != nil {
			b = p.appendErr(b, req, err)
			break
		}
		if bt, ok := n.backupTid(); ok && p.typ == proto.Client {
			// Backup mode: the slice of the list, then those up to
			// the backup tid (NEO/py's order).
			tids = slices.DeleteFunc(tids, func(t zodb.Tid) bool { return t > bt })
		}
		b = (&proto.AnswerTIDs{Tids: tids}).AppendArgs(appendHeader(b, req.msgID, ans))

	case proto.CodeAskTIDsFrom:
		var parts []uint32
		if int(req.partition) >= pt.np() || !pt.readable[req.partition] {
			b = appendError(b, req.msgID, proto.NonReadableCell, "")
			break
		}
		parts = []uint32{req.partition}
		tids, err := n.be.TIDsFrom(ctx, req.min, req.max, req.len_, parts)
		if err != nil {
			b = p.appendErr(b, req, err)
			break
		}
		b = (&proto.AnswerTIDsFrom{Tids: tids}).AppendArgs(appendHeader(b, req.msgID, ans))

	case proto.CodeAskOIDsFrom:
		if int(req.partition) >= pt.np() || !pt.readable[req.partition] {
			b = appendError(b, req.msgID, proto.NonReadableCell, "")
			break
		}
		oids, next, more, err := n.be.OIDsFrom(ctx, req.partition, req.len_, req.oid, req.tid)
		if err != nil {
			b = p.appendErr(b, req, err)
			break
		}
		a := proto.AnswerOIDsFrom{NextOid: proto.InvalidOid, Oids: oids}
		if more {
			a.NextOid = next
		}
		b = a.AppendArgs(appendHeader(b, req.msgID, ans))

	case proto.CodeAskTransactionInformation:
		if !readable(uint64(req.tid)) {
			b = appendError(b, req.msgID, proto.NonReadableCell, "")
			break
		}
		if bt, ok := n.backupTid(); ok && p.typ == proto.Client && req.tid > bt {
			b = p.appendErr(b, req, ErrTidNotFound) // not fully fetched yet
			break
		}
		t, err := n.be.TransactionInformation(ctx, req.tid)
		if err != nil {
			b = p.appendErr(b, req, err)
			break
		}
		a := proto.AnswerTransactionInformation{Tid: t.Tid, User: t.User, Description: t.Description,
			Extension: t.Extension, Packed: t.Packed, Oids: t.Oids}
		b = a.AppendArgs(appendHeader(b, req.msgID, ans))

	case proto.CodeAskObjectHistory:
		if !readable(uint64(req.oid)) {
			b = appendError(b, req.msgID, proto.NonReadableCell, "")
			break
		}
		h, err := n.be.ObjectHistory(ctx, req.oid, req.first, req.last)
		if err != nil {
			b = p.appendErr(b, req, err)
			break
		}
		a := proto.AnswerObjectHistory{Oid: req.oid, History: h}
		b = a.AppendArgs(appendHeader(b, req.msgID, ans))

	case proto.CodeAskFinalTID:
		final, err := n.be.FinalTID(ctx, req.tid)
		if err != nil { // NON_READABLE_CELL too: the client asks another node
			b = p.appendErr(b, req, err)
			break
		}
		a := proto.AnswerFinalTID{Tid: proto.InvalidTid}
		if final != 0 {
			a.Tid = final
		}
		b = a.AppendArgs(appendHeader(b, req.msgID, ans))

	case proto.CodePing:
		b = (&proto.Pong{}).AppendArgs(appendHeader(b, req.msgID, ans))
	}
	if len(b) > 0 {
		p.w.Write(b)
	}
	if cap(b) > 1<<20 {
		b = make([]byte, 0, 512)
	}
	*bp = b
	n.bufPool.Put(bp)
}

// appendErr answers a backend error with NEO's error code.
func (p *peer) appendErr(b []byte, req *request, err error) []byte {
	var noObj *zodb.NoObjectError
	switch {
	case errors.As(err, &noObj):
		return appendError(b, req.msgID, proto.OidDoesNotExist, zodb.Oid(req.oid).String())
	case errors.Is(err, ErrOidNotFound):
		return appendError(b, req.msgID, proto.OidNotFound, zodb.Oid(req.oid).String())
	case errors.Is(err, ErrTidNotFound):
		return appendError(b, req.msgID, proto.TidNotFound, req.tid.String())
	case errors.Is(err, ErrNonReadableCell):
		return appendError(b, req.msgID, proto.NonReadableCell, "")
	}
	p.n.log.Printf("neo storage: %s: %s: %v", p.name, proto.CodeName(req.code), err)
	return appendError(b, req.msgID, proto.NotReady, err.Error())
}
