package storage_test

import (
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
)

// TestStats asks objects (answered inline) and tids (on goroutines) and
// checks what Node.Stats counts, before and after the client leaves.
func TestStats(t *testing.T) {
	fs, err := fs1.Open("../../fs1/testdata/1.fs", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	be, err := fs1backend.New(fs)
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, be)
	if st := c.node.Stats(); !st.Operational || st.Requests != nil || st.Accepted != 0 {
		t.Fatalf("before EnableStats: %+v", st)
	}
	c.node.EnableStats()
	l := c.client(t)
	oids := fs.Index().Oids()
	const loads, tids = 9, 3
	var reqs []proto.Msg
	for i := 0; i < loads; i++ {
		reqs = append(reqs, askObject(oids[i%len(oids)], 0, 0))
	}
	for i := 0; i < tids; i++ {
		reqs = append(reqs, &proto.AskTIDs{First: 0, Last: 5, Partition: 0})
	}
	askPipelined(t, l, reqs)
	count := func(st storage.Stats, name string) uint64 {
		for _, r := range st.Requests {
			if r.Name == name {
				return r.Latency.Count()
			}
		}
		return 0
	}
	var st storage.Stats
	for i := 0; ; i++ { // a goroutine records its request after the answer is queued
		st = c.node.Stats()
		if count(st, "AskTIDs") == tids {
			break
		}
		if i == 1000 {
			t.Fatalf("%d AskTIDs counted, want %d", count(st, "AskTIDs"), tids)
		}
		time.Sleep(time.Millisecond)
	}
	if n := count(st, "AskObject"); n != loads {
		t.Errorf("%d AskObject counted, want %d", n, loads)
	}
	if st.Connections != 1 || st.Accepted != 1 || st.BytesIn == 0 || st.BytesOut == 0 {
		t.Errorf("%+v", st)
	}
	in := st.BytesIn
	l.Close()
	for i := 0; ; i++ {
		st = c.node.Stats()
		if st.Connections == 0 {
			break
		}
		if i == 1000 {
			t.Fatal("connection still counted")
		}
		time.Sleep(time.Millisecond)
	}
	if count(st, "AskObject") != loads || count(st, "AskTIDs") != tids || st.BytesIn < in || st.Accepted != 1 {
		t.Errorf("after close: %+v", st)
	}
	if be.FileStorage() != fs {
		t.Error("FileStorage")
	}
}
