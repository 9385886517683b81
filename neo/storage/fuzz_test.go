package storage_test

import (
	"net"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// FuzzNodeInput sends, on an identified connection to a running node,
// whatever bytes the fuzzer makes, then ends the stream. Whatever they
// are, the node answers or closes that connection within 5 s,
// stays in the cluster, and another client's loads go on.
func FuzzNodeInput(f *testing.F) {
	be := testFS1(f)
	c := startCluster(f, be)
	addr := c.node.Addr().String()
	good := c.client(f)
	ident := proto.AppendPacket(nil, 0, &proto.RequestIdentification{
		NodeType: proto.Storage, NID: proto.NoNode, ClusterName: cluster, IdTime: proto.NoIdTime})
	askObject0 := &proto.AskObject{Oid: 0, At: proto.InvalidTid, Before: proto.InvalidTid}

	// Seeds: each read request the node serves, pipelined, with edge
	// values; then a few malformed ones.
	seeds := []proto.Msg{
		askObject0,
		&proto.AskObject{Oid: 1, At: 0x0123, Before: proto.InvalidTid},
		&proto.AskObject{Oid: zodb.Oid(1 << 62), At: proto.InvalidTid, Before: 1},
		&proto.AskTIDs{First: 0, Last: 1 << 40, Partition: proto.InvalidPartition},
		&proto.AskTIDsFrom{MinTid: 0, MaxTid: proto.InvalidTid, Length: 1 << 30, Partition: 0},
		&proto.AskOIDsFrom{Partition: 0, Length: 1 << 30, MinOid: 0, Tid: proto.InvalidTid},
		&proto.AskTransactionInformation{Tid: 1},
		&proto.AskObjectHistory{Oid: 0, First: 0, Last: 1 << 40},
		&proto.AskFinalTID{TTid: 1},
		&proto.Ping{},
		&proto.AskStoreTransaction{},
	}
	var all []byte
	for i, m := range seeds {
		p := proto.AppendPacket(nil, uint32(i+1), m)
		f.Add(p)
		all = append(all, p...)
	}
	f.Add(all)
	f.Add([]byte{0xc1})
	f.Add(proto.AppendRawPacket(nil, 1, proto.CodeAskObject, []byte{0x93, 0x01, 0xc0, 0xc0}))
	f.Add(proto.AppendRawPacket(nil, 1, proto.CodeAskObjectHistory, []byte{0x93, 0xc4, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00}))

	f.Fuzz(func(t *testing.T, in []byte) {
		sendFuzzed(t, addr, ident, in)
		if t.Failed() {
			return
		}
		p, err := good.Ask(askObject0)
		if err == nil {
			err = p.Decode(&proto.AnswerObject{})
		}
		if err != nil {
			t.Fatalf("another client's load: %v", err)
		}
		if !c.node.Operational() {
			t.Fatal("node no longer operational")
		}
	})
}

// sendFuzzed opens a connection to the node at addr, sends the handshake,
// the identification ident and then in, and checks that the node, which
// answers what it can, closes the connection at the end of the stream or
// at the first malformed packet.
func sendFuzzed(t *testing.T, addr string, ident, in []byte) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write(proto.Handshake[:])
	nc.Write(ident)
	nc.Write(in)
	nc.(*net.TCPConn).CloseWrite()
	expectClosed(t, nc, "after the fuzzed input")
}
