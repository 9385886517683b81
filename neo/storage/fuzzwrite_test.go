package storage_test

import (
	"crypto/sha1"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// FuzzNodeWriteInput is FuzzNodeInput on a node that takes commits, from
// an identified client: whatever the bytes, the node answers or closes
// that connection within 5 s and another client still commits and reads.
func FuzzNodeWriteInput(f *testing.F) {
	c := startWriteCluster(f, newMemWriter(), nil)
	good := c.client(-536870911)
	fuzzNID := proto.NodeID(-536870910)
	c.notifyNodes(proto.NodeInfo{Type: proto.Client, NID: fuzzNID, State: proto.NodeRunning, IdTime: 1.5})
	c.sync()
	ident := proto.AppendPacket(nil, 0, &proto.RequestIdentification{
		NodeType: proto.Client, NID: fuzzNID, ClusterName: cluster, IdTime: 1.5})
	data := []byte("data")
	sum := sha1.Sum(data)
	seeds := []proto.Msg{
		&proto.AskStoreObject{Oid: 1, Serial: 0, Checksum: sum, Data: data, DataSerial: proto.InvalidTid, TTid: 100},
		&proto.AskStoreObject{Oid: 1, Serial: 5, Compression: 1, Checksum: sum, Data: data, DataSerial: proto.InvalidTid, TTid: 100},
		&proto.AskStoreObject{Oid: 2, DataSerial: 7, TTid: 100},
		&proto.AskCheckCurrentSerial{TTid: 100, Oid: 3, Serial: 1},
		&proto.AskRelockObject{TTid: 100, Oid: 1},
		&proto.AskObjectUndoSerial{TTid: 100, LTid: 200, UndoneTid: 1, Oids: []zodb.Oid{1, 2, 1 << 62}},
		&proto.AskStoreTransaction{TTid: 100, User: []byte("u"), Oids: []zodb.Oid{1, 2, 3}, Pack: &proto.PackRequest{PackTid: 1}},
		&proto.AskVoteTransaction{TTid: 100},
		&proto.AskFinalTID{TTid: 100},
		&proto.AbortTransaction{TTid: 100},
		&proto.AskObject{Oid: 1, At: proto.InvalidTid, Before: proto.InvalidTid},
	}
	var all []byte
	for i, m := range seeds {
		p := proto.AppendPacket(nil, uint32(i+1), m)
		f.Add(p)
		all = append(all, p...)
	}
	f.Add(all)
	f.Add(proto.AppendRawPacket(nil, 1, proto.CodeAskStoreObject, []byte{0x97, 0xc0, 0xc0, 0x05, 0xc0, 0xc0, 0xc0, 0xc0}))
	ttid := zodb.Tid(1000)

	f.Fuzz(func(t *testing.T, in []byte) {
		sendFuzzed(t, c.n.Addr().String(), ident, in)
		if t.Failed() {
			return
		}
		// The fuzzed client's transactions are gone with its connection
		// (unless it voted: the master would abort them): a commit of
		// fresh oids goes through.
		good.t = t
		c.t = t
		ttid += 10
		oid := zodb.Oid(1<<40) + zodb.Oid(ttid)
		c.commit(good, ttid, ttid+1, oid, 0, "ok")
		id := good.send(&proto.AskObject{Oid: oid, At: proto.InvalidTid, Before: proto.InvalidTid})
		if o := good.answer(id, proto.CodeAnswerObject).(*proto.AnswerObject); string(o.Data) != "ok" {
			t.Fatalf("read back %q", o.Data)
		}
	})
}
