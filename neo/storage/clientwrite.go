package storage

import (
	"context"
	"errors"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
)

// isWriteCode tells whether a client's packet is one of those
// dispatchWrite handles on a node that takes commits.
func isWriteCode(code uint16) bool {
	switch code {
	case proto.CodeAskStoreObject, proto.CodeAskCheckCurrentSerial, proto.CodeAskRelockObject,
		proto.CodeAskStoreTransaction, proto.CodeAskVoteTransaction, proto.CodeAbortTransaction,
		proto.CodeAskFinalTID, proto.CodeAskObjectUndoSerial:
		return true
	}
	return false
}

// dispatchWrite handles, on a node whose backend is a Writer, the client
// requests of the write path (txn.go; isWriteCode), in the connection's
// reader goroutine and so in the order the client sent them. A malformed
// request, or one past the connection's bounds, is answered with
// PROTOCOL_ERROR and the error returned closes the connection.
func (p *peer) dispatchWrite(id uint32, code uint16, args []byte) error {
	err := p.dispatchWrite1(p.n.tm, id, code, args)
	if le, ok := errors.AsType[*limitError](err); ok {
		p.errorAndClose(id, proto.ProtocolError, le.what)
	} else if ie, ok := errors.AsType[*inputError](err); ok {
		p.errorAndClose(id, proto.ProtocolError, ie.Error())
	}
	return err
}

func (p *peer) dispatchWrite1(tm *txnManager, id uint32, code uint16, args []byte) error {
	decode := func(m proto.Msg) error {
		if err := m.DecodeArgs(args); err != nil {
			return badInput("bad arguments: %v", err)
		}
		return nil
	}
	switch code {
	case proto.CodeAskStoreObject:
		var m proto.AskStoreObject
		if err := decode(&m); err != nil {
			return err
		}
		return tm.storeObject(p, id, &m)

	case proto.CodeAskCheckCurrentSerial:
		var m proto.AskCheckCurrentSerial
		if err := decode(&m); err != nil {
			return err
		}
		return tm.checkCurrentSerial(p, id, &m)

	case proto.CodeAskRelockObject:
		var m proto.AskRelockObject
		if err := decode(&m); err != nil {
			return err
		}
		return tm.relockObject(p, id, &m)

	case proto.CodeAskStoreTransaction:
		var m proto.AskStoreTransaction
		if err := decode(&m); err != nil {
			return err
		}
		if len(m.Oids) >= 1<<21 {
			return badInput("AskStoreTransaction: too many oids (%d)", len(m.Oids))
		}
		meta := &TxnMeta{User: copyBytes(m.User), Description: copyBytes(m.Description), Extension: copyBytes(m.Extension), Oids: m.Oids}
		return tm.vote(p, id, m.TTid, meta, m.Pack)

	case proto.CodeAskVoteTransaction:
		var m proto.AskVoteTransaction
		if err := decode(&m); err != nil {
			return err
		}
		return tm.vote(p, id, m.TTid, nil, nil)

	case proto.CodeAbortTransaction:
		var m proto.AbortTransaction
		if err := decode(&m); err != nil {
			return err
		}
		tm.abort(m.TTid)
		return nil

	case proto.CodeAskFinalTID:
		var m proto.AskFinalTID
		if err := decode(&m); err != nil {
			return err
		}
		tid, ok := tm.finalTID(m.TTid)
		if !ok {
			var err error
			tid, err = p.n.be.FinalTID(context.Background(), m.TTid)
			if errors.Is(err, ErrNonReadableCell) {
				// As NEO/py: the client asks another node (it took
				// nil for "not committed", and failed a tpc_finish
				// that may have committed).
				p.w.Write(appendError(nil, id, proto.NonReadableCell, ""))
				return nil
			}
			if err != nil {
				p.w.Write(appendError(nil, id, proto.NotReady, err.Error()))
				return nil
			}
		}
		p.w.Write(proto.AppendPacket(nil, id, &proto.AnswerFinalTID{Tid: nilTid(tid)}))
		return nil

	case proto.CodeAskObjectUndoSerial:
		var m proto.AskObjectUndoSerial
		if err := decode(&m); err != nil {
			return err
		}
		answer := func() {
			if !tm.waitUnlockedBefore(m.LTid, time.Minute) {
				p.w.Write(appendError(nil, id, proto.NotReady, "transactions before the undo's snapshot stay locked"))
				return
			}
			p.w.Write(p.undoSerial(tm, id, &m))
		}
		if tm.nlocked.Load() == 0 {
			answer()
			return nil
		}
		// It may wait for an unlock: on its own goroutine, as a read
		// (bounded by the connection's requests in flight), so that the
		// connection's other requests are not held behind it.
		p.sem <- struct{}{}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			answer()
			<-p.sem
		}()
		return nil
	}
	panic("dispatchWrite: not a write: " + proto.CodeName(code))
}

// undoSerial answers AskObjectUndoSerial: for each oid that the undone
// transaction changed, the serials the undo is based on.
func (p *peer) undoSerial(tm *txnManager, id uint32, m *proto.AskObjectUndoSerial) []byte {
	pt := p.n.pt.Load()
	np := uint64(pt.np())
	var a proto.AnswerObjectUndoSerial
	for _, oid := range m.Oids {
		if np == 0 || !pt.readable[uint64(oid)%np] {
			return appendError(nil, id, proto.NonReadableCell, "")
		}
		cur, undo, isCur, ok, err := tm.w.UndoSerial(context.Background(), oid, m.LTid, m.UndoneTid, tm.undoOverride(m.TTid, oid))
		if err != nil {
			req := request{msgID: id, code: proto.CodeAskObjectUndoSerial, oid: oid}
			return p.appendErr(nil, &req, err)
		}
		if !ok {
			continue
		}
		if cur == 0 {
			return appendError(nil, id, proto.OidNotFound, oid.String())
		}
		a.ObjectTidDict = append(a.ObjectTidDict, proto.UndoSerial{Oid: oid, CurrentSerial: cur, UndoSerial: nilTid(undo), IsCurrent: isCur})
	}
	return proto.AppendPacket(nil, id, &a)
}

// copyBytes copies b (never nil), out of the reader's buffer.
func copyBytes(b []byte) []byte { return append([]byte{}, b...) }
