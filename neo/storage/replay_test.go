package storage_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
)

// packet returns packet i: its bytes, parsed, and its arguments decoded.
func (c *capturedConn) packet(t *testing.T, i int) ([]byte, proto.Packet, proto.Msg) {
	t.Helper()
	raw := c.raw(i)
	pkt, err := proto.ParsePacket(raw)
	if err != nil {
		t.Fatalf("packet %d: %v", i, err)
	}
	return raw, pkt, decodeArgs(t, pkt)
}

// decodeArgs decodes the arguments of p into a message of its type.
func decodeArgs(t testing.TB, p proto.Packet) proto.Msg {
	t.Helper()
	m, ok := proto.NewMsg(p.Code)
	if !ok {
		t.Fatalf("packet %d: unknown code %#x", p.ID, p.Code)
	}
	if err := m.DecodeArgs(p.Args); err != nil {
		t.Fatalf("packet %d: %v", p.ID, err)
	}
	return m
}

// TestReplayP1Read plays NEO/py's master of run p1-read to our node on
// the database that run left (storage.sqlite), and the reads of NEO/py's
// client, and compares our node's packets with NEO/py's storage's, byte
// for byte but where noted.
func TestReplayP1Read(t *testing.T) {
	mrec := loadCaptured(t, "p1-read", "c00-storage-master")
	crec := loadCaptured(t, "p1-read", "c09-client-storage")
	be, err := sqlitebackend.Open(context.Background(), testSQLite(t))
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	ln, n, done := startReplayNode(t, be)

	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ml, err := neotest.NewLink(nc)
	if err != nil {
		t.Fatal(err)
	}
	clientDone := false
	for i, rp := range mrec.Packets {
		if rp.Kind == "handshake" {
			continue
		}
		raw, wantPkt, want := mrec.packet(t, i)
		if rp.Dir == "s2c" {
			if err := ml.Write(raw); err != nil {
				t.Fatalf("packet %d: %v", i, err)
			}
			if rp.Name == "NotifyNodeInformation" && !clientDone && containsClientRunning(want) {
				// The master announced the client: replay its reads.
				time.Sleep(20 * time.Millisecond)
				replayClient(t, n, crec)
				clientDone = true
			}
			continue
		}
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		p, err := ml.Recv()
		if err != nil {
			t.Fatalf("packet %d (%s): %v", i, rp.Name, err)
		}
		if p.ID != rp.MsgID || p.Code != rp.Code {
			t.Fatalf("packet %d: got %d %s, want %d %s", i, p.ID, proto.CodeName(p.Code), rp.MsgID, rp.Name)
		}
		got := decodeArgs(t, p)
		switch rp.Name {
		case "RequestIdentification":
			// Same but the port, devpath (host, device): compare the rest.
			g, w := got.(*proto.RequestIdentification), want.(*proto.RequestIdentification)
			if g.NodeType != w.NodeType || g.NID != w.NID || g.ClusterName != w.ClusterName ||
				g.IdTime != w.IdTime || g.Addr.Host != w.Addr.Host {
				t.Errorf("RequestIdentification: got %+v, want %+v", g, w)
			}
			if len(g.Extra) != 2 {
				t.Errorf("RequestIdentification extra: %v", g.Extra)
			}
		case "AnswerLockedTransactions":
			// NEO/py's DB still held T5 locked; ours is the DB after the
			// replay (ValidateTransaction below is then a no-op).
			if g := got.(*proto.AnswerLockedTransactions); len(g.TidDict) != 0 {
				t.Errorf("AnswerLockedTransactions: %+v", g)
			}
		default:
			if !bytes.Equal(p.Args, wantPkt.Args) {
				t.Errorf("%s: got %+v, want %+v (% x, want % x)", rp.Name, got, want, p.Args, wantPkt.Args)
			}
		}
	}
	if !clientDone {
		t.Error("client reads not replayed")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("node did not stop when told it is DOWN")
	}
}

// containsClientRunning tells whether m is a NotifyNodeInformation that
// announces a running client.
func containsClientRunning(m proto.Msg) bool {
	ni, ok := m.(*proto.NotifyNodeInformation)
	if !ok {
		return false
	}
	for _, n := range ni.Nodes {
		if n.Type == proto.Client && n.State == proto.NodeRunning {
			return true
		}
	}
	return false
}

// replayClient sends NEO/py's client's whole stream at once (pipelined)
// and compares every answer with NEO/py's storage's, by message id, byte
// for byte.
func replayClient(t *testing.T, n *storage.Node, rec *capturedConn) {
	t.Helper()
	cl, err := neotest.Dial(n.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.Write(rec.c2s[len(proto.Handshake):]); err != nil {
		t.Fatal(err)
	}
	want := map[uint32]int{}
	for i, rp := range rec.Packets {
		if rp.Kind != "handshake" && rp.Dir == "s2c" {
			want[rp.MsgID] = i
		}
	}
	cl.Conn().SetReadDeadline(time.Now().Add(10 * time.Second))
	for range len(want) {
		p, err := cl.Recv()
		if err != nil {
			t.Fatalf("client replay: %v", err)
		}
		i, ok := want[p.ID]
		if !ok {
			t.Fatalf("client replay: unexpected answer %d %s", p.ID, proto.CodeName(p.Code))
		}
		delete(want, p.ID)
		rp := rec.Packets[i]
		_, wp, w := rec.packet(t, i)
		if p.Code != rp.Code || !bytes.Equal(p.Args, wp.Args) {
			t.Errorf("client msg %d: got %s %v, want %s %v", p.ID, proto.CodeName(p.Code), short(decodeArgs(t, p)), rp.Name, short(w))
		}
	}
	t.Logf("client replay: every answer equal")
}

func short(v any) string {
	s := fmt.Sprintf("%+v", v)
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// startReplayNode runs a node on be whose master is the listener it
// returns (the test plays the master's side of a recorded session on the
// connection the node opens), until the test ends; done receives Run's
// result.
func startReplayNode(t *testing.T, be storage.Backend) (net.Listener, *storage.Node, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	n, err := storage.New(storage.Config{Cluster: cluster, Masters: []string{ln.Addr().String()}, Bind: "127.0.0.1:0",
		Backend: be, Logger: neotest.Logger(), IdentifyTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(cancel)
	return ln, n, done
}
