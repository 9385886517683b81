package storage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
)

// recorded is one connection of the NEO/py captures (decoded/*.json with
// its .c2s.bin and .s2c.bin streams).
type recorded struct {
	Packets []struct {
		Dir    string `json:"dir"`
		Kind   string `json:"kind"`
		MsgID  uint32 `json:"msg_id"`
		Code   uint16 `json:"code"`
		Name   string `json:"name"`
		Offset int    `json:"offset"`
		Size   int    `json:"size"`
	} `json:"packets"`
	c2s, s2c []byte
}

func loadRecorded(t *testing.T, name string) *recorded {
	t.Helper()
	dir := filepath.Join(sharedNeo, "decoded", "p1")
	if _, err := os.Stat(dir); err != nil {
		dir = filepath.Join("testdata", "p1")
	}
	js, err := os.ReadFile(filepath.Join(dir, name+".json"))
	if err != nil {
		t.Skipf("no capture: %v", err)
	}
	r := new(recorded)
	if err := json.Unmarshal(js, r); err != nil {
		t.Fatal(err)
	}
	if r.c2s, err = os.ReadFile(filepath.Join(dir, name+".c2s.bin")); err != nil {
		t.Fatal(err)
	}
	if r.s2c, err = os.ReadFile(filepath.Join(dir, name+".s2c.bin")); err != nil {
		t.Fatal(err)
	}
	return r
}

// packet returns the raw bytes of packet i and its decoded arguments.
func (r *recorded) packet(t *testing.T, i int) ([]byte, any) {
	p := r.Packets[i]
	stream := r.c2s
	if p.Dir == "s2c" {
		stream = r.s2c
	}
	raw := stream[p.Offset : p.Offset+p.Size]
	v, err := neotest.Decode(raw)
	if err != nil {
		t.Fatalf("packet %d: %v", i, err)
	}
	return raw, v.([]any)[2]
}

// TestReplayP1Read plays NEO/py's master of run p1-read to our node on
// the database that run left (storage.sqlite), and the reads of NEO/py's
// client, and compares our node's packets with NEO/py's storage's.
func TestReplayP1Read(t *testing.T) {
	mrec := loadRecorded(t, "p1-read-c00-storage-master")
	crec := loadRecorded(t, "p1-read-c09-client-storage")
	be, err := storage.OpenSQLite(context.Background(), testSQLite(t))
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	n, err := storage.New(storage.Config{Cluster: cluster, Masters: []string{ln.Addr().String()}, Bind: "127.0.0.1:0",
		Backend: be, Logger: testLogger(t), IdentifyTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()

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
		raw, want := mrec.packet(t, i)
		if rp.Dir == "s2c" {
			if err := ml.Write(raw); err != nil {
				t.Fatalf("packet %d: %v", i, err)
			}
			if rp.Name == "NotifyNodeInformation" && !clientDone && fmt.Sprint(want) != "" && containsClientRunning(want) {
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
		got, err := neotest.Decode(p.Args)
		if err != nil {
			t.Fatal(err)
		}
		switch rp.Name {
		case "RequestIdentification":
			// Same but the port, devpath (host, device): compare the rest.
			g, w := got.([]any), want.([]any)
			if !reflect.DeepEqual(g[0], w[0]) || !reflect.DeepEqual(g[1], w[1]) || !reflect.DeepEqual(g[3], w[3]) ||
				!reflect.DeepEqual(g[4], w[4]) || !reflect.DeepEqual(g[2].([]any)[0], w[2].([]any)[0]) {
				t.Errorf("RequestIdentification: got %v, want %v", g, w)
			}
			if len(g[5].(neotest.Map)) != 2 {
				t.Errorf("RequestIdentification extra: %v", g[5])
			}
		case "AnswerLockedTransactions":
			// NEO/py's DB still held T5 locked; ours is the DB after the
			// replay (ValidateTransaction below is then a no-op).
			if !reflect.DeepEqual(got, []any{neotest.Map{}}) {
				t.Errorf("AnswerLockedTransactions: %v", got)
			}
		default:
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: got %v, want %v", rp.Name, got, want)
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

func containsClientRunning(v any) bool {
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return false
	}
	nodes, _ := a[1].([]any)
	for _, x := range nodes {
		n, _ := x.([]any)
		if len(n) == 5 && n[0] == (neotest.Ext{Type: proto.ExtNodeType, Value: int64(proto.Client)}) &&
			n[3] == (neotest.Ext{Type: proto.ExtNodeState, Value: int64(proto.NodeRunning)}) {
			return true
		}
	}
	return false
}

// replayClient sends NEO/py's client's whole stream at once (pipelined)
// and compares every answer with NEO/py's storage's, by message id.
func replayClient(t *testing.T, n *storage.Node, rec *recorded) {
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
		_, w := rec.packet(t, i)
		g, err := neotest.Decode(p.Args)
		if err != nil {
			t.Fatal(err)
		}
		if p.Code != rp.Code || !reflect.DeepEqual(g, w) {
			t.Errorf("client msg %d: got %s %v, want %s %v", p.ID, proto.CodeName(p.Code), short(g), rp.Name, short(w))
		}
	}
	t.Logf("client replay: every answer equal")
}

func short(v any) string {
	s := fmt.Sprint(v)
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
