package storage_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
)

// capturedConn is one connection of a recorded run, with the capture time
// of each packet (to interleave the connections as they happened).
type capturedConn struct {
	name    string
	Packets []struct {
		Dir    string  `json:"dir"`
		T      float64 `json:"t"`
		Kind   string  `json:"kind"`
		MsgID  uint32  `json:"msg_id"`
		Code   uint16  `json:"code"`
		Name   string  `json:"name"`
		Offset int     `json:"offset"`
		Size   int     `json:"size"`
	} `json:"packets"`
	c2s, s2c []byte
}

func loadCaptured(t *testing.T, run, name string) *capturedConn {
	t.Helper()
	dir, _, _ := strings.Cut(run, "-") // p1-write: decoded/p1; repl: decoded/repl
	dir = filepath.Join(neoTestdata, "decoded", dir)
	base := filepath.Join(dir, run+"-"+name)
	js, err := os.ReadFile(base + ".json")
	if err != nil {
		t.Fatalf("capture: %v", err)
	}
	c := &capturedConn{name: name}
	if err := json.Unmarshal(js, c); err != nil {
		t.Fatal(err)
	}
	if c.c2s, err = os.ReadFile(base + ".c2s.bin"); err != nil {
		t.Fatal(err)
	}
	if c.s2c, err = os.ReadFile(base + ".s2c.bin"); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *capturedConn) raw(i int) []byte {
	p := c.Packets[i]
	if p.Dir == "s2c" {
		return c.s2c[p.Offset : p.Offset+p.Size]
	}
	return c.c2s[p.Offset : p.Offset+p.Size]
}

// replayLink is the test's side of one replayed connection: the packets
// the node sent that the replay has not yet compared, by message id.
type replayLink struct {
	l       *neotest.Link
	pending []proto.Packet
}

// expect returns the node's packet with message id id and code code,
// reading until it comes (packets of other ids are kept for later).
func (r *replayLink) expect(t testing.TB, id uint32, code uint16) proto.Packet {
	t.Helper()
	return r.expectFunc(t, func(p proto.Packet) bool { return p.ID == id && p.Code == code }, proto.CodeName(code))
}

// expectCode is expect of a packet of that code, whatever its id (a
// notification).
func (r *replayLink) expectCode(t testing.TB, code uint16) proto.Packet {
	t.Helper()
	return r.expectFunc(t, func(p proto.Packet) bool { return p.Code == code }, proto.CodeName(code))
}

func (r *replayLink) expectFunc(t testing.TB, match func(proto.Packet) bool, what string) proto.Packet {
	t.Helper()
	for i, p := range r.pending {
		if match(p) {
			r.pending = slices.Delete(r.pending, i, i+1)
			return p
		}
	}
	for {
		r.l.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
		p, err := r.l.Recv()
		if err != nil {
			t.Fatalf("waiting for %s: %v (pending %d)", what, err, len(r.pending))
		}
		if match(p) {
			return p
		}
		r.pending = append(r.pending, p)
	}
}

// TestReplayWrite plays, against our node on a read-write backend, the
// master and the clients of NEO/py's write runs, interleaved in the order
// of the capture: the node identifies, is verified, then the clients
// commit (stores, readCurrent, conflicts none, an undo), the master locks
// and unlocks each transaction, a second client reads, and the clients
// read everything back. Every packet the node sends must equal NEO/py's
// storage's, byte for byte, but the identification.
func TestReplayWrite(t *testing.T) {
	for _, run := range []struct {
		run     string
		conns   []string // the master's first, then the clients'
		commits int
		np      int
		skipNeo bool
	}{
		{run: "p1-write", conns: []string{"c00-storage-master", "c10-client-storage", "c12-client-storage"}, commits: 6, np: 1},
		{run: "p2-write", conns: []string{"c00-storage-master", "c10-client-storage", "c12-client-storage"}, commits: 6, np: 2},
	} {
		t.Run(run.run, func(t *testing.T) {
			be := newMemWriter()
			be.np = run.np
			replayWriteRun(t, run.run, run.conns, be)
			if err := be.check(); err != nil {
				t.Errorf("Writer contract: %v", err)
			}
			unlocked := 0
			for _, c := range be.log() {
				if strings.HasPrefix(c, "Unlock ") {
					unlocked++
				}
			}
			if unlocked != run.commits {
				t.Errorf("%d transactions unlocked, want %d:\n%s", unlocked, run.commits, strings.Join(be.log(), "\n"))
			}
		})
	}
}

func replayWriteRun(t *testing.T, run string, names []string, be storage.Backend) {
	replayRunUntil(t, run, names, be, 0)
}

// replayRunUntil is replayWriteRun of the packets captured up to time
// until (0: all of them, then the node must stop as the master tells it);
// with a cutoff the node is left running (the test's end stops it).
func replayRunUntil(t *testing.T, run string, names []string, be storage.Backend, until float64) {
	conns := make([]*capturedConn, len(names))
	for i, name := range names {
		conns[i] = loadCaptured(t, run, name)
	}
	ln, n, done := startReplayNode(t, be)

	// The schedule: every packet of every connection, by capture time.
	type step struct {
		c, i int
		t    float64
	}
	var steps []step
	for c, cc := range conns {
		for i, p := range cc.Packets {
			steps = append(steps, step{c, i, p.T})
		}
	}
	slices.SortStableFunc(steps, func(a, b step) int {
		switch {
		case a.t < b.t:
			return -1
		case a.t > b.t:
			return 1
		}
		return 0
	})
	links := make([]*replayLink, len(conns))
	pingID := uint32(1 << 30)
	for _, s := range steps {
		if until != 0 && s.t > until {
			break
		}
		cc, rp := conns[s.c], conns[s.c].Packets[s.i]
		master := s.c == 0
		if links[s.c] == nil {
			// The connection opens at its first packet.
			var l *neotest.Link
			var err error
			if master {
				nc, err := ln.Accept()
				if err != nil {
					t.Fatal(err)
				}
				defer nc.Close()
				if l, err = neotest.NewLink(nc); err != nil {
					t.Fatal(err)
				}
			} else if l, err = neotest.Dial(n.Addr().String(), nil); err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			links[s.c] = &replayLink{l: l}
		}
		if rp.Kind == "handshake" {
			continue
		}
		rl := links[s.c]
		fromNode := rp.Dir == "c2s" && master || rp.Dir == "s2c" && !master
		if !fromNode {
			if err := rl.l.Write(cc.raw(s.i)); err != nil {
				t.Fatalf("%s packet %d (%s): %v", cc.name, s.i, rp.Name, err)
			}
			if master && rp.Name == "NotifyUnlockInformation" {
				// The node handles the master's packets in order: its
				// Pong says that the notification (an unlock, say) is
				// done before the clients' next requests, as the
				// capture's timing implies.
				pingID++
				if err := rl.l.Write(proto.AppendPacket(nil, pingID, &proto.Ping{})); err != nil {
					t.Fatal(err)
				}
				rl.expect(t, pingID, proto.CodePong)
			}
			continue
		}
		got := rl.expect(t, rp.MsgID, rp.Code)
		want, err := proto.ParsePacket(cc.raw(s.i))
		if err != nil {
			t.Fatal(err)
		}
		if rp.Name == "RequestIdentification" {
			g, w := decodeArgs(t, got).(*proto.RequestIdentification), decodeArgs(t, want).(*proto.RequestIdentification)
			if g.NodeType != w.NodeType || g.NID != w.NID || g.ClusterName != w.ClusterName || g.IdTime != w.IdTime {
				t.Errorf("RequestIdentification: got %+v, want %+v", g, w)
			}
			continue
		}
		if !bytes.Equal(got.Args, want.Args) {
			t.Errorf("%s packet %d: got %s %s, want %s", cc.name, s.i, proto.CodeName(got.Code), short(decodeArgs(t, got)), short(decodeArgs(t, want)))
		}
	}
	for i, rl := range links {
		if rl != nil && len(rl.pending) > 0 {
			t.Errorf("%s: %d packets from the node not in the capture, first %s", names[i], len(rl.pending), proto.CodeName(rl.pending[0].Code))
		}
	}
	if until != 0 {
		return
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
