package storage_test

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
)

// expectClosed reads until the node closes the connection.
func expectClosed(t *testing.T, nc net.Conn, what string) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf [4096]byte
	for {
		_, err := nc.Read(buf[:])
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: connection not closed", what)
		} else if !errors.Is(err, io.EOF) {
			var oe *net.OpError
			if !errors.As(err, &oe) {
				t.Errorf("%s: %v", what, err)
			}
		}
		return
	}
}

func TestBadInput(t *testing.T) {
	be := testFS1(t)
	c := startCluster(t, be)
	addr := c.node.Addr().String()
	good := c.client(t) // stays connected through all of it

	raw := func(b ...[]byte) net.Conn {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range b {
			nc.Write(x)
		}
		return nc
	}
	hs := proto.Handshake[:]
	pkt := func(id uint32, m proto.Msg) []byte { return proto.AppendPacket(nil, id, m) }
	identify := func(typ proto.NodeType, nid proto.NodeID, cluster string, idTime float64) []byte {
		return pkt(0, &proto.RequestIdentification{NodeType: typ, NID: nid, ClusterName: cluster, IdTime: idTime})
	}
	ident := identify(proto.Storage, proto.NoNode, cluster, proto.NoIdTime)
	askObject0 := &proto.AskObject{Oid: 0, At: proto.InvalidTid, Before: proto.InvalidTid}
	cases := []struct {
		name string
		send [][]byte
	}{
		{"garbage", [][]byte{[]byte("GET / HTTP/1.0\r\n\r\n")}},
		{"version mismatch", [][]byte{{0x92, 0xa3, 'N', 'E', 'O', 4}}},
		{"silence after handshake", [][]byte{hs}},
		{"request before identification", [][]byte{hs, pkt(0, askObject0)}},
		{"wrong cluster", [][]byte{hs, identify(proto.Storage, proto.NoNode, "other", proto.NoIdTime)}},
		{"identification args", [][]byte{hs, proto.AppendRawPacket(nil, 0, proto.CodeRequestIdentification, []byte{0x91, 0x01})}},
		{"unknown client", [][]byte{hs, identify(proto.Client, -0x20000000+77, cluster, 1)}},
		{"master type", [][]byte{hs, identify(proto.Master, proto.NoNode, cluster, proto.NoIdTime)}},
		{"malformed msgpack", [][]byte{hs, ident, {0xc1, 0xc1, 0xc1}}},
		{"not an array", [][]byte{hs, ident, {0x05}}},
		{"unknown code", [][]byte{hs, ident, proto.AppendRawPacket(nil, 1, 0x7777, []byte{0x90})}},
		{"wrong arg count", [][]byte{hs, ident, proto.AppendRawPacket(nil, 1, proto.CodeAskObject, []byte{0x91, 0x01})}},
		{"wrong arg type", [][]byte{hs, ident, proto.AppendRawPacket(nil, 1, proto.CodeAskObject, []byte{0x93, 0x01, 0xc0, 0xc0})}},
		{"args not an array", [][]byte{hs, ident, proto.AppendRawPacket(nil, 1, proto.CodeAskTIDs, []byte{0x01})}},
		{"unexpected answer", [][]byte{hs, ident, pkt(1, &proto.Pong{})}},
	}
	for _, tc := range cases {
		nc := raw(tc.send...)
		expectClosed(t, nc, tc.name)
		nc.Close()
		// The node is still in the cluster and serves.
		p, err := good.Ask(askObject0)
		if err == nil {
			err = p.Decode(&proto.AnswerObject{})
		}
		if err != nil {
			t.Fatalf("after %s: %v", tc.name, err)
		}
	}
	if !c.node.Operational() {
		t.Error("node no longer operational")
	}
	// A new client is still accepted.
	l := c.client(t)
	p, err := l.Ask(&proto.Ping{})
	if err == nil {
		err = p.Decode(&proto.Pong{})
	}
	if err != nil {
		t.Errorf("ping: %v", err)
	}
}
