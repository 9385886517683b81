package client_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// fakeWriteCluster is a fake cluster that takes commits: the master begins
// transactions (ttid 0x300), the storage answers each AskStoreObject with
// conflicts[oid] the first time (0: stored) and records, in order, the
// stores and votes it gets.
type fakeWriteCluster struct {
	fm *fakeMaster
	ms *memStore

	mu  sync.Mutex
	got []string // "store <oid> <serial> <data>", "vote <oids>"
}

func startWriteCluster(t *testing.T, conflicts map[zodb.Oid]zodb.Tid) *fakeWriteCluster {
	wc := &fakeWriteCluster{ms: newMemStore()}
	wc.ms.hook = func(pc *peerConn, req packet) bool {
		switch req.Code {
		case proto.CodeAskStoreObject:
			var m proto.AskStoreObject
			if err := m.DecodeArgs(req.Args); err != nil {
				t.Error(err)
				return false
			}
			wc.mu.Lock()
			wc.got = append(wc.got, "store "+m.Oid.String()+" "+m.Serial.String()+" "+string(m.Data))
			c := conflicts[m.Oid]
			delete(conflicts, m.Oid)
			wc.mu.Unlock()
			if c == 0 {
				c = proto.InvalidTid
			}
			pc.answerMsg(req, &proto.AnswerStoreObject{Conflict: c})
			return true
		case proto.CodeAskStoreTransaction:
			var m proto.AskStoreTransaction
			if err := m.DecodeArgs(req.Args); err != nil {
				t.Error(err)
				return false
			}
			wc.mu.Lock()
			wc.got = append(wc.got, "vote "+oidList(m.Oids))
			wc.mu.Unlock()
			pc.answerMsg(req, &proto.AnswerStoreTransaction{})
			return true
		case proto.CodeAbortTransaction:
			return true
		}
		return false
	}
	wc.fm = startCluster(t, 1, 0x100, wc.ms)
	wc.fm.hook = func(pc *peerConn, req packet) bool {
		switch req.Code {
		case proto.CodeAskBeginTransaction:
			pc.answerMsg(req, &proto.AnswerBeginTransaction{TTid: 0x300})
			return true
		case proto.CodeAbortTransaction:
			return true
		}
		return false
	}
	return wc
}

func oidList(oids []zodb.Oid) string {
	s := make([]string, len(oids))
	for i, oid := range oids {
		s[i] = oid.String()
	}
	return strings.Join(s, ",")
}

func (wc *fakeWriteCluster) log() []string {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	return append([]string(nil), wc.got...)
}

// TestResolveAheadOfInvalidation: a storage reports a conflict with a
// commit whose invalidation has not reached the client yet (the master
// committed it; the client's last tid is older). The merged data is
// stored based on that serial at once, before the vote: deferring it as a
// store based on a serial the client does not know yet left it unsent,
// and the storage committed the transaction without it (issue 22,
// TestClusterDeadlock's lost update).
func TestResolveAheadOfInvalidation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wc := startWriteCluster(t, map[zodb.Oid]zodb.Tid{1: 0x200})
	wc.ms.add(1, 0x100, []byte("1"))
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{wc.fm.addr()}, Resolve: counterResolver})
	if _, err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// Committed by another client; this one is not told yet.
	wc.ms.add(1, 0x200, []byte("5"))
	wc.fm.setLastTid(0x200)

	txn, err := c.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	if err := txn.Store(1, 0x100, []byte("2")); err != nil {
		t.Fatal(err)
	}
	resolved, err := txn.Vote(ctx)
	if err != nil {
		t.Fatalf("vote: %v", err)
	}
	if len(resolved) != 1 || resolved[0] != 1 {
		t.Errorf("vote: resolved %v; want [1]", resolved)
	}
	want := []string{
		"store 0000000000000001 0000000000000100 2",
		"store 0000000000000001 0000000000000200 6",
		"vote 0000000000000001",
	}
	if got := wc.log(); !slices.Equal(got, want) {
		t.Errorf("storage got\n%q\nwant\n%q", got, want)
	}
}

// TestVoteResolvingUnstoredConflict: a conflict VoteResolving leaves to
// the caller was not written; a caller that votes again without storing
// the oid again gets an error, and the storage no vote (it would commit
// the transaction without the object).
func TestVoteResolvingUnstoredConflict(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wc := startWriteCluster(t, map[zodb.Oid]zodb.Tid{1: 0x100})
	wc.ms.add(1, 0x100, []byte("1"))
	wc.fm.setLastTid(0x100)
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{wc.fm.addr()}})
	txn, err := c.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	rt := txn.(zodb.ResolvingTxn)
	if err := txn.Store(1, 0x80, []byte("2")); err != nil {
		t.Fatal(err)
	}
	var ce zodb.ConflictErrors
	if _, err := rt.VoteResolving(ctx, nil); !errors.As(err, &ce) {
		t.Fatalf("first VoteResolving: %v; want a conflict", err)
	}
	if _, err := rt.VoteResolving(ctx, nil); err == nil {
		t.Fatal("VoteResolving without storing the conflict again: no error")
	}
	for _, s := range wc.log() {
		if strings.HasPrefix(s, "vote") {
			t.Errorf("the storage got %q", s)
		}
	}
}
