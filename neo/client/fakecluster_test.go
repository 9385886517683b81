package client_test

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"sync"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// A scripted cluster for the tests of bad input, invalidations and the
// cache: a fake master that gives the client a node id, the node list and
// a partition table, and fake storages that serve objects from memory.

const (
	fakeMasterNID = proto.NodeID(-268435455)
	fakeClientNID = proto.NodeID(-536870911)
	fakeIdTime    = 1795332491.25
)

type fakeRev struct {
	serial zodb.Tid
	data   []byte // nil: no data (deletion)
}

// memStore is the data of a fake storage, shared by its connections.
type memStore struct {
	mu       sync.Mutex
	objs     map[zodb.Oid][]fakeRev // oldest first
	compress bool                   // send data zlib-compressed
	// hook, when set, may answer a request itself (return true).
	hook func(pc *peerConn, req packet) bool
}

func newMemStore() *memStore { return &memStore{objs: map[zodb.Oid][]fakeRev{}} }

func (ms *memStore) add(oid zodb.Oid, serial zodb.Tid, data []byte) {
	ms.mu.Lock()
	ms.objs[oid] = append(ms.objs[oid], fakeRev{serial, data})
	ms.mu.Unlock()
}

// answerObject computes the answer to AskObject.
func (ms *memStore) answerObject(req *proto.AskObject) (proto.Msg, *proto.Error) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	revs := ms.objs[req.Oid]
	if len(revs) == 0 {
		return nil, &proto.Error{ErrCode: proto.OidDoesNotExist, Message: req.Oid.String()}
	}
	i := -1
	for j, r := range revs {
		if req.At != proto.InvalidTid && r.serial == req.At ||
			req.At == proto.InvalidTid && req.Before != proto.InvalidTid && r.serial < req.Before ||
			req.At == proto.InvalidTid && req.Before == proto.InvalidTid {
			i = j
		}
	}
	if i < 0 {
		return nil, &proto.Error{ErrCode: proto.OidNotFound, Message: req.Oid.String()}
	}
	r := revs[i]
	ans := &proto.AnswerObject{Oid: req.Oid, Serial: r.serial, NextSerial: proto.InvalidTid, DataSerial: proto.InvalidTid, Data: []byte{}}
	if i+1 < len(revs) {
		ans.NextSerial = revs[i+1].serial
	}
	if r.data != nil {
		ans.Data = r.data
		if ms.compress {
			var b bytes.Buffer
			w := zlib.NewWriter(&b)
			w.Write(r.data)
			w.Close()
			ans.Data, ans.Compression = b.Bytes(), 1
		}
		ans.Checksum = sha1.Sum(ans.Data)
	}
	return ans, nil
}

// storageHandler serves a fake storage's connection.
func storageHandler(nid proto.NodeID, ms *memStore) func(pc *peerConn) {
	return func(pc *peerConn) {
		for {
			req, err := pc.readPacket()
			if err != nil {
				return
			}
			if ms.hook != nil && ms.hook(pc, req) {
				continue
			}
			switch req.Code {
			case proto.CodeRequestIdentification:
				var m proto.RequestIdentification
				if err := m.DecodeArgs(req.Args); err != nil {
					pc.answer(req, proto.CodeError, errorArgs(proto.ProtocolError, err.Error()))
					return
				}
				pc.answerMsg(req, &proto.AcceptIdentification{NodeType: proto.Storage, MyNID: nid, YourNID: m.NID})
			case proto.CodeAskObject:
				var m proto.AskObject
				if err := m.DecodeArgs(req.Args); err != nil {
					pc.answer(req, proto.CodeError, errorArgs(proto.ProtocolError, err.Error()))
					return
				}
				ans, perr := ms.answerObject(&m)
				if perr != nil {
					pc.answerMsg(req, perr)
				} else {
					pc.answerMsg(req, ans)
				}
			case proto.CodePing:
				pc.answerMsg(req, &proto.Pong{})
			default:
				pc.answer(req, proto.CodeError, errorArgs(proto.ProtocolError, "fake storage: "+proto.CodeName(req.Code)))
			}
		}
	}
}

func (pc *peerConn) answerMsg(req packet, m proto.Msg) error {
	return pc.answer(req, m.Code(), m.AppendArgs(nil))
}

func (pc *peerConn) notifyMsg(m proto.Msg) error {
	return pc.notify(m.Code(), m.AppendArgs(nil))
}

// fakeMaster is a scripted master. Its fields must be set before a client
// connects.
type fakeMaster struct {
	srv      *fakeServer
	storages []proto.NodeInfo // listening storages
	np       int
	mu       sync.Mutex
	lastTid  zodb.Tid
	conns    []*peerConn
	// hook, when set, may handle a packet itself (return true).
	hook func(pc *peerConn, req packet) bool
}

func (fm *fakeMaster) addr() string { return fm.srv.addr() }

func (fm *fakeMaster) setLastTid(t zodb.Tid) {
	fm.mu.Lock()
	fm.lastTid = t
	fm.mu.Unlock()
}

// broadcast sends m to every connected client.
func (fm *fakeMaster) broadcast(m proto.Msg) {
	fm.mu.Lock()
	conns := append([]*peerConn(nil), fm.conns...)
	fm.mu.Unlock()
	for _, pc := range conns {
		pc.notifyMsg(m)
	}
}

// startCluster starts a master and one storage per memStore (nids 1, 2, ...),
// every storage holding every partition (UP_TO_DATE).
func startCluster(t testing.TB, np int, lastTid zodb.Tid, stores ...*memStore) *fakeMaster {
	t.Helper()
	fm := &fakeMaster{np: np, lastTid: lastTid}
	for i, ms := range stores {
		nid := proto.NodeID(i + 1)
		st := startFake(t, storageHandler(nid, ms))
		fm.storages = append(fm.storages, proto.NodeInfo{Type: proto.Storage, Addr: proto.Address{Host: "127.0.0.1", Port: st.port()},
			NID: nid, State: proto.NodeRunning, IdTime: 1795332487.5})
	}
	fm.srv = startFake(t, fm.handle)
	return fm
}

func (fm *fakeMaster) handle(pc *peerConn) {
	for {
		req, err := pc.readPacket()
		if err != nil {
			return
		}
		if fm.hook != nil && fm.hook(pc, req) {
			continue
		}
		switch req.Code {
		case proto.CodeRequestIdentification:
			pc.answerMsg(req, &proto.AcceptIdentification{NodeType: proto.Master, MyNID: fakeMasterNID, YourNID: fakeClientNID})
			nodes := []proto.NodeInfo{
				{Type: proto.Client, NID: fakeClientNID, State: proto.NodeRunning, IdTime: fakeIdTime},
				{Type: proto.Master, Addr: proto.Address{Host: "127.0.0.1", Port: fm.srv.port()}, NID: fakeMasterNID, State: proto.NodeRunning, IdTime: proto.NoIdTime},
			}
			nodes = append(nodes, fm.storages...)
			pc.notifyMsg(&proto.NotifyNodeInformation{IdTime: fakeIdTime + 0.001, Nodes: nodes})
			rows := make([][]proto.CellInfo, fm.np)
			for p := range rows {
				for _, s := range fm.storages {
					rows[p] = append(rows[p], proto.CellInfo{NID: s.NID, State: proto.UpToDate})
				}
			}
			pc.notifyMsg(&proto.SendPartitionTable{PTid: 1, NumReplicas: uint32(len(fm.storages) - 1), Rows: rows})
			fm.mu.Lock()
			fm.conns = append(fm.conns, pc)
			fm.mu.Unlock()
		case proto.CodeAskLastTransaction:
			fm.mu.Lock()
			t := fm.lastTid
			fm.mu.Unlock()
			pc.answerMsg(req, &proto.AnswerLastTransaction{Tid: t})
		case proto.CodePing:
			pc.answerMsg(req, &proto.Pong{})
		default:
			if isRequestCode(req.Code) {
				pc.answer(req, proto.CodeError, errorArgs(proto.ProtocolError, "fake master: "+proto.CodeName(req.Code)))
			}
		}
	}
}
