package client_test

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// TestFaultsLoadCtxStorageSilentAtIdentification: the master says a
// storage is up; the storage accepts the connection but never answers the
// client's identification (hung, overloaded). A Load whose context ends
// after 300 ms returns then; the goroutine that happened to start the
// shared dial waited for Options.Timeout instead (the dial is bounded by
// the timeout, not by its context: now it runs on a goroutine of its own,
// which every caller waits for as far as its context lets it).
func TestFaultsLoadCtxStorageSilentAtIdentification(t *testing.T) {
	ms := newMemStore()
	ms.add(1, 0x100, []byte("data"))
	ms.hook = func(pc *peerConn, req packet) bool {
		return req.Code == proto.CodeRequestIdentification // swallowed: never answered
	}
	fm := startCluster(t, 1, 0x100, ms)
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, Timeout: 8 * time.Second,
		Logf: func(string, ...any) {}})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
	el := time.Since(start)
	t.Logf("Load: %v after %v", err, el)
	if el > 2*time.Second {
		t.Errorf("Load(ctx with a 300 ms deadline) returned after %v (err %v): its context was ignored while it dialled the storage", el, err)
	}
}

// TestFaultsCloseDuringStorageDial: Close while a load dials a
// storage that does not answer its identification. Close returned, but the
// Load stayed blocked until Options.Timeout: the dial's context was cut
// from both the caller's context and the client's failure (Close now
// cancels it).
func TestFaultsCloseDuringStorageDial(t *testing.T) {
	ms := newMemStore()
	ms.add(1, 0x100, []byte("data"))
	ms.hook = func(pc *peerConn, req packet) bool {
		return req.Code == proto.CodeRequestIdentification
	}
	fm := startCluster(t, 1, 0x100, ms)
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, Timeout: 8 * time.Second,
		Logf: func(string, ...any) {}})
	res := make(chan error, 1)
	go func() {
		_, _, err := c.Load(context.Background(), zodb.Xid{Oid: 1, At: zodb.TidMax})
		res <- err
	}()
	time.Sleep(300 * time.Millisecond)
	c.Close()
	select {
	case err := <-res:
		t.Logf("Load after Close: %v", err)
	case <-time.After(2 * time.Second):
		t.Errorf("Load still blocked 2 s after Close (a storage dial in progress)")
		<-res
	}
}

// TestFaultsLoadCtxStorageStallsMidAnswer: the storage sends half of
// its AnswerObject and stalls; a Load with a 300 ms deadline must return.
func TestFaultsLoadCtxStorageStallsMidAnswer(t *testing.T) {
	ms := newMemStore()
	ms.add(1, 0x100, make([]byte, 1000))
	ms.hook = func(pc *peerConn, req packet) bool {
		if req.Code != proto.CodeAskObject {
			return false
		}
		ans := &proto.AnswerObject{Oid: 1, Serial: 0x100, NextSerial: proto.InvalidTid, DataSerial: proto.InvalidTid,
			Data: make([]byte, 1000)}
		b := encodePacket(nil, packet{ID: req.ID, Code: ans.Code(), Args: ans.AppendArgs(nil)})
		pc.write(b[:len(b)/2])
		return true
	}
	fm := startCluster(t, 1, 0x100, ms)
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, Timeout: 8 * time.Second,
		Logf: func(string, ...any) {}})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
	el := time.Since(start)
	t.Logf("Load: %v after %v", err, el)
	if el > 2*time.Second {
		t.Errorf("Load(ctx with a 300 ms deadline) returned after %v: the storage stalled inside its answer", el)
	}
}

// TestFaultsFinishCancelledCommits: Finish with a context already
// done still sent AskFinishTransaction and reported an error ("the
// transaction may commit still"); it committed. Now it aborts and the
// error says it did not commit.
func TestFaultsFinishCancelledCommits(t *testing.T) {
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, "test", be)
	bg := context.Background()
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{master}, Logf: func(string, ...any) {}})
	other := dialT(t, &client.Options{Cluster: "test", Masters: []string{master}, Logf: func(string, ...any) {}})
	oids, err := c.NewOids(bg, 1)
	if err != nil {
		t.Fatal(err)
	}
	txn, err := c.Begin(bg, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	txn.Store(oids[0], 0, []byte("data"))
	if _, err := txn.Vote(bg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	_, ferr := txn.Finish(ctx, nil)
	time.Sleep(500 * time.Millisecond)
	other.Sync(bg)
	_, serial, lerr := other.Load(bg, zodb.Xid{Oid: oids[0], At: zodb.TidMax})
	t.Logf("Finish: %v; load from another client: %s, %v", ferr, serial, lerr)
	if ferr != nil && lerr == nil {
		t.Errorf("Finish(cancelled ctx) reported %v, but the transaction committed (%s)", ferr, serial)
	}
}

// TestFaultsDialCancelSilentMaster: a master that accepts
// but never does the handshake; Dial's cancelled context ends it.
func TestFaultsDialCancelSilentMaster(t *testing.T) {
	s := startFakeOpt(t, true, func(pc *peerConn) { io.Copy(io.Discard, pc.nc) })
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	c, err := client.Dial(ctx, &client.Options{Cluster: "test", Masters: []string{s.addr()}, Timeout: 8 * time.Second,
		Logf: func(string, ...any) {}})
	if err == nil {
		c.Close()
	}
	t.Logf("Dial: %v after %v", err, time.Since(start))
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("Dial returned after %v (%v), its context cancelled after 200 ms", el, err)
	}
}

// TestFaultsCacheHitAfterMasterLost: as the ZEO client's (the same
// clientcore): once the master is lost, the client is failed (LastTid,
// Sync fail with DisconnectedError, Watch is closed), yet a Load at
// TidMax of a cached object answered from the cache without error.
func TestFaultsCacheHitAfterMasterLost(t *testing.T) {
	ms := newMemStore()
	ms.add(1, 0x100, []byte("old"))
	fm := startCluster(t, 1, 0x100, ms)
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, Logf: func(string, ...any) {}})
	ctx := context.Background()
	if _, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax}); err != nil {
		t.Fatal(err)
	}
	ch, err := c.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fm.srv.close() // the master goes away
	for range ch {
	}
	_, lerr := c.LastTid(ctx)
	data, serial, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
	var de *client.DisconnectedError
	if !errors.As(err, &de) {
		t.Errorf("Load(TidMax) after the master was lost: %q@%s, err %v (LastTid: %v); want DisconnectedError", data, serial, err, lerr)
	}
}

// TestFaultsLoadStorageRefused: the master says the only
// storage is running, but its port refuses connections: a Load fails
// within a second with *client.NoReadableCellError (not a disconnection
// of the client, which goes on working).
func TestFaultsLoadStorageRefused(t *testing.T) {
	ms := newMemStore()
	ms.add(1, 0x100, []byte("data"))
	fm := startCluster(t, 1, 0x100, ms)
	// The storage's listener goes away: its port refuses.
	dead := startFake(t, func(pc *peerConn) {})
	port := dead.port()
	dead.close()
	fm.storages[0].Addr.Port = port
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, Logf: func(string, ...any) {}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
	var nrc *client.NoReadableCellError
	if !errors.As(err, &nrc) || time.Since(start) > time.Second {
		t.Errorf("Load: %v after %v; want NoReadableCellError at once", err, time.Since(start))
	}
	if _, err := c.Sync(ctx); err != nil {
		t.Errorf("Sync after: %v", err)
	}
}
