package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

func recvEvent(t *testing.T, w <-chan zodb.CommitEvent) zodb.CommitEvent {
	t.Helper()
	select {
	case ev, ok := <-w:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
	}
	panic("unreachable")
}

func loadStr(t *testing.T, c *client.Client, oid zodb.Oid, at zodb.Tid) (string, zodb.Tid) {
	t.Helper()
	data, serial, err := c.Load(context.Background(), zodb.Xid{Oid: oid, At: at})
	if err != nil {
		t.Fatalf("load %s@%s: %v", oid, at, err)
	}
	return string(data), serial
}

// TestInvalidations: the master's InvalidateObjects reach Watch in order,
// close the cached revisions, raise LastTid; Sync waits for them.
func TestInvalidations(t *testing.T) {
	ctx := context.Background()
	ms := newMemStore()
	ms.compress = true
	ms.add(1, 0x100, []byte("one"))
	ms.add(2, 0x100, []byte("two"))
	fm := startCluster(t, 2, 0x100, ms)
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
	w, err := c.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d, s := loadStr(t, c, 1, zodb.TidMax); d != "one" || s != 0x100 {
		t.Fatalf("load 1: %q %s", d, s)
	}
	if d, _ := loadStr(t, c, 2, zodb.TidMax); d != "two" {
		t.Fatalf("load 2: %q", d)
	}

	// Commit 0x200 (oid 1) and 0x300 (oid 2).
	ms.add(1, 0x200, []byte("one'"))
	fm.setLastTid(0x200)
	fm.broadcast(&proto.InvalidateObjects{Tid: 0x200, Oids: []zodb.Oid{1}})
	ms.add(2, 0x300, []byte("two'"))
	fm.setLastTid(0x300)
	fm.broadcast(&proto.InvalidateObjects{Tid: 0x300, Oids: []zodb.Oid{2}})
	if tid, err := c.Sync(ctx); err != nil || tid != 0x300 {
		t.Fatalf("Sync = %s, %v", tid, err)
	}
	if last, _ := c.LastTid(ctx); last != 0x300 {
		t.Errorf("LastTid = %s; want 0x300", last)
	}
	if ev := recvEvent(t, w); ev.Tid != 0x200 || len(ev.Oids) != 1 || ev.Oids[0] != 1 {
		t.Errorf("event %+v", ev)
	}
	if ev := recvEvent(t, w); ev.Tid != 0x300 || len(ev.Oids) != 1 || ev.Oids[0] != 2 {
		t.Errorf("event %+v", ev)
	}
	for _, tc := range []struct {
		oid    zodb.Oid
		at     zodb.Tid
		data   string
		serial zodb.Tid
	}{
		{1, zodb.TidMax, "one'", 0x200},
		{1, 0x1ff, "one", 0x100},
		{1, 0x200, "one'", 0x200},
		{2, 0x2ff, "two", 0x100},
		{2, zodb.TidMax, "two'", 0x300},
		{2, 0x300, "two'", 0x300},
	} {
		if d, s := loadStr(t, c, tc.oid, tc.at); d != tc.data || s != tc.serial {
			t.Errorf("load %s@%s: %q %s; want %q %s", tc.oid, tc.at, d, s, tc.data, tc.serial)
		}
	}
	st := c.CacheStats()
	if st.Revisions != 4 {
		t.Errorf("cache: %+v; want 4 revisions", st)
	}
}

// TestInvalidationOvertakesLoad: an invalidation that arrives while a load
// of the same oid is in flight, and whose answer still says "current",
// must close the cached range (the ordering problem of two connections).
func TestInvalidationOvertakesLoad(t *testing.T) {
	ctx := context.Background()
	ms := newMemStore()
	ms.add(1, 0x100, []byte("old"))
	release := make(chan struct{})
	held := make(chan struct{})
	first := true
	ms.hook = func(pc *peerConn, req packet) bool {
		if req.Code != proto.CodeAskObject || !first {
			return false
		}
		first = false
		// Answer "old, current" as computed now, after the invalidation.
		var m proto.AskObject
		m.DecodeArgs(req.Args)
		ans, _ := ms.answerObject(&m)
		close(held)
		go func() {
			<-release
			pc.answerMsg(req, ans)
		}()
		return true
	}
	fm := startCluster(t, 1, 0x100, ms)
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
	w, _ := c.Watch(ctx)
	done := make(chan string)
	go func() {
		d, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
		if err != nil {
			d = []byte(err.Error())
		}
		done <- string(d)
	}()
	<-held
	ms.add(1, 0x200, []byte("new"))
	fm.setLastTid(0x200)
	fm.broadcast(&proto.InvalidateObjects{Tid: 0x200, Oids: []zodb.Oid{1}})
	recvEvent(t, w)
	close(release)
	if d := <-done; d != "old" {
		t.Fatalf("first load: %q", d)
	}
	if d, s := loadStr(t, c, 1, zodb.TidMax); d != "new" || s != 0x200 {
		t.Errorf("load after invalidation: %q %s; want \"new\" 0x200", d, s)
	}
	if d, _ := loadStr(t, c, 1, 0x1ff); d != "old" {
		t.Errorf("load @0x1ff: %q", d)
	}
}

// TestPartitionChanges: cells change with NotifyPartitionChanges; reads
// follow the readable cells.
func TestPartitionChanges(t *testing.T) {
	ctx := context.Background()
	ms1, ms2 := newMemStore(), newMemStore()
	ms1.add(1, 0x100, []byte("from 1"))
	ms2.add(1, 0x100, []byte("from 2"))
	fm := startCluster(t, 1, 0x100, ms1, ms2)
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, CacheSize: -1})
	// Storage 2 leaves partition 0, then storage 1 becomes out of date
	// while 2 comes back.
	fm.broadcast(&proto.NotifyPartitionChanges{PTid: 2, Changes: []proto.CellChange{{Offset: 0, NID: 2, State: proto.Discarded}}})
	c.Sync(ctx) // a round trip on the master connection
	time.Sleep(50 * time.Millisecond)
	for range 10 {
		if d, _ := loadStr(t, c, 1, zodb.TidMax); d != "from 1" {
			t.Fatalf("load: %q; want from storage 1", d)
		}
	}
	fm.broadcast(&proto.NotifyPartitionChanges{PTid: 3, Changes: []proto.CellChange{{Offset: 0, NID: 2, State: proto.UpToDate}, {Offset: 0, NID: 1, State: proto.OutOfDate}}})
	c.Sync(ctx)
	time.Sleep(50 * time.Millisecond)
	for range 10 {
		if d, _ := loadStr(t, c, 1, zodb.TidMax); d != "from 2" {
			t.Fatalf("load: %q; want from storage 2", d)
		}
	}
}
