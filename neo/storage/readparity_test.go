package storage_test

import (
	"fmt"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
)

// TestFinalTIDNonReadable: AskFinalTID of a transaction in a partition
// this node cannot read is answered NON_READABLE_CELL, as NEO/py's node
// does: the client then asks another node. (A nil answer, "not
// committed", made a client that lost the master in tpc_finish report a
// transaction that may have committed as failed.)
func TestFinalTIDNonReadable(t *testing.T) {
	c := startWriteCluster(t, newReplSQLite(t, 2), nil)
	cl := c.client(-536870911)
	c.commit(cl, 0x101, 0x201, 1, 0, "committed") // partition 1
	c.send(&proto.NotifyPartitionChanges{PTid: 2, Changes: []proto.CellChange{{Offset: 1, NID: nodeNID, State: proto.OutOfDate}}})
	c.sync()
	p := cl.expect(t, cl.send(&proto.AskFinalTID{TTid: 0x101}), proto.CodeError)
	if e := decodeArgs(t, p).(*proto.Error); e.ErrCode != proto.NonReadableCell {
		t.Fatalf("AskFinalTID in a partition not readable: %+v, want NON_READABLE_CELL", e)
	}
}

// TestBadReadsAsNEOPy: requests NEO/py's node answers in its own way: an
// AskObject whose at is given reads at it whatever before says (NEO/py's
// getObject); AskObjectHistory and AskTIDs whose first offset is not
// below the last are a protocol error ("invalid offsets"), which closes
// the connection (zodbd answered NOT_READY and an empty list).
func TestBadReadsAsNEOPy(t *testing.T) {
	c := startWriteCluster(t, newReplSQLite(t, 1), nil)
	nid := proto.NodeID(-536870911)
	c.commit(c.client(nid), 0x101, 0x201, 1, 0, "committed")
	for _, tc := range []struct {
		m    proto.Msg
		want string
	}{
		{&proto.AskObject{Oid: 1, At: 0x201, Before: 0}, "AnswerObject 0000000000000201"},
		{&proto.AskObjectHistory{Oid: 1, First: 1, Last: 1}, fmt.Sprintf("Error %d", proto.ProtocolError)},
		{&proto.AskTIDs{First: 1, Last: 1, Partition: 0}, fmt.Sprintf("Error %d", proto.ProtocolError)},
	} {
		nid++ // a connection each: a protocol error closes it
		cl := c.client(nid)
		id := cl.send(tc.m)
		p := cl.expectFunc(t, func(p proto.Packet) bool { return p.ID == id }, "answer")
		got := fmt.Sprintf("%T", decodeArgs(t, p))
		switch m := decodeArgs(t, p).(type) {
		case *proto.Error:
			got = fmt.Sprintf("Error %d", m.ErrCode)
		case *proto.AnswerObject:
			got = fmt.Sprintf("AnswerObject %s", m.Serial)
		}
		if got != tc.want {
			t.Errorf("%T%+v: %s, want %s (NEO/py's)", tc.m, tc.m, got, tc.want)
		}
	}
}
