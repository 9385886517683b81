package storage_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// TestReplayConflict plays NEO/py's run cf-write (testdata/neo/README.md;
// recorded by scripts/neo_record_conflict.py) against our node: two NEO/py
// clients A and B, one BTrees.Length and one PersistentMapping. B stores
// Length with the serial it read before A's T2: the node must answer with
// T2 as conflict serial, then B loads T2, resolves and stores again with
// serial T2 (answered "no conflict") and commits T3; later B stores the
// mapping with a stale serial, is answered T4 (ZODB raises ConflictError,
// unresolvable) and aborts. The master's lock/unlock of every transaction
// and its AbortTransaction for B's aborted one are replayed in capture
// order. Every packet the node sends must equal NEO/py's storage's, byte
// for byte, but RequestIdentification (the node's own port); none of them
// depends on timing: ttids and tids are the master's, and each client's
// store is sent only after the master's unlock of the transaction it
// conflicts with (the replay waits for the node to finish each unlock).
//
// It runs on a new NEO/py SQLite database, the state NEO/py's storage
// started the run from: neostorage had just created it (schema, config
// version and cluster name; it identifies with no node id), which
// neosqlite.Create reproduces (the recorder's copy, taken once the master
// had given it nid 1, has the same schema statements); and on the
// in-memory Writer.
func TestReplayConflict(t *testing.T) {
	conns := []string{"c00-storage-master", "c02-client-storage", "c04-client-storage"}
	const (
		t0 = zodb.Tid(0x040d44c2cad6f700) // ZODB.DB's root creation
		t1 = zodb.Tid(0x040d44c2caeba8ee)
		t2 = zodb.Tid(0x040d44c2cf08ae77)
		t3 = zodb.Tid(0x040d44c2d070c2bb)
		t4 = zodb.Tid(0x040d44c2d1de62cc)
	)
	// The capture is what this test is about: B's two stores answered
	// with a conflict serial.
	wantInCapture(t, "cf-write", "c04-client-storage",
		"AnswerStoreObject{Conflict:"+t2.String()+"}",
		"AnswerStoreObject{Conflict:"+t4.String()+"}",
		"AbortTransaction")
	t.Run("sqlite", func(t *testing.T) {
		be := newSQLiteBackend(t)
		replayWriteRun(t, "cf-write", conns, be)

		// What NEO/py's clients read at the end: oid 1 (Length) at T3, the
		// resolved store, oid 2 (mapping) at T4; B's T5 left nothing.
		ctx := context.Background()
		ids, err := be.LastIDs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !ids.HasTid || ids.Tid != t4 || ids.FirstTid != t0 {
			t.Errorf("LastIDs: %+v, want last tid %v, first %v", ids, t4, t0)
		}
		for _, w := range []struct {
			oid    zodb.Oid
			serial zodb.Tid
		}{{0, t1}, {1, t3}, {2, t4}} {
			var o storage.Object
			if err := be.Object(ctx, w.oid, 0, 0, &o); err != nil {
				t.Errorf("oid %d: %v", w.oid, err)
			} else if o.Serial != w.serial {
				t.Errorf("oid %d: serial %v, want %v", w.oid, o.Serial, w.serial)
			}
		}
		var o storage.Object
		if err := be.Object(ctx, 1, 0, t3, &o); err != nil || o.Serial != t2 {
			t.Errorf("oid 1 before T3: %v %v, want serial %v", o.Serial, err, t2)
		}
		if locked, err := be.LockedTransactions(ctx); err != nil || len(locked) != 0 {
			t.Errorf("LockedTransactions: %v %v, want none", locked, err)
		}
	})
	t.Run("mem", func(t *testing.T) {
		be := newMemWriter()
		replayWriteRun(t, "cf-write", conns, be)
		if err := be.check(); err != nil {
			t.Errorf("Writer contract: %v", err)
		}
		unlocked := 0
		for _, c := range be.log() {
			if strings.HasPrefix(c, "Unlock ") {
				unlocked++
			}
		}
		if unlocked != 5 {
			t.Errorf("%d transactions unlocked, want 5 (root, T1..T4):\n%s", unlocked, strings.Join(be.log(), "\n"))
		}
	})
}

// TestReplayDeadlock plays NEO/py's run dl-write: two NEO/py clients lock
// two BTrees.Length objects X (oid 1) and Y (oid 2) in opposite orders
// (scripts/neo_record_conflict.py, workload_dl). B (the younger ttid)
// stores X; A (older) stores Y, then X: the node must send B
// NotifyDeadlock(B's ttid, X) and delay A's store; B stores Y (delayed
// behind A's lock) and asks AskRelockObject(X): the node releases B's lock
// on X, A's delayed store is answered (no conflict), A commits (T2); then
// B's store of Y and its relock of X are both answered with conflict
// serial T2 (the relock with B's stored serial and data, as NEO/py sends
// them back), B resolves both and stores again (T3). Each packet is
// compared byte for byte; the replay sends the next client packet only
// after the node's previous one it waits for, so the order of the node's
// decisions is the capture's and nothing here depends on timing.
func TestReplayDeadlock(t *testing.T) {
	conns := []string{"c00-storage-master", "c02-client-storage", "c04-client-storage"}
	const (
		t1 = zodb.Tid(0x040d44c2ee02f899)
		t2 = zodb.Tid(0x040d44c2f8333011)
		t3 = zodb.Tid(0x040d44c2f84d7fee)
	)
	wantInCapture(t, "dl-write", "c04-client-storage",
		"NotifyDeadlock", "AskRelockObject",
		"AnswerRelockObject{Conflict:"+t2.String()+"}",
		"AnswerStoreObject{Conflict:"+t2.String()+"}")
	t.Run("sqlite", func(t *testing.T) {
		be := newSQLiteBackend(t)
		replayWriteRun(t, "dl-write", conns, be)
		ctx := context.Background()
		for _, w := range []struct {
			oid    zodb.Oid
			serial zodb.Tid
		}{{0, t1}, {1, t3}, {2, t3}} {
			var o storage.Object
			if err := be.Object(ctx, w.oid, 0, 0, &o); err != nil {
				t.Errorf("oid %d: %v", w.oid, err)
			} else if o.Serial != w.serial {
				t.Errorf("oid %d: serial %v, want %v", w.oid, o.Serial, w.serial)
			}
		}
		if locked, err := be.LockedTransactions(ctx); err != nil || len(locked) != 0 {
			t.Errorf("LockedTransactions: %v %v, want none", locked, err)
		}
	})
	t.Run("mem", func(t *testing.T) {
		be := newMemWriter()
		replayWriteRun(t, "dl-write", conns, be)
		if err := be.check(); err != nil {
			t.Errorf("Writer contract: %v", err)
		}
	})
}

// wantInCapture fails t unless the recorded connection holds packets
// described by want, each "Name" or "Name{Conflict:tid}" (an answer to a
// store or relock with that conflict serial).
func wantInCapture(t *testing.T, run, name string, want ...string) {
	t.Helper()
	c := loadCaptured(t, run, name)
	seen := map[string]bool{}
	for i, rp := range c.Packets {
		if rp.Kind == "handshake" {
			continue
		}
		seen[rp.Name] = true
		p, err := proto.ParsePacket(c.raw(i))
		if err != nil {
			t.Fatal(err)
		}
		switch m := decodeArgs(t, p).(type) {
		case *proto.AnswerStoreObject:
			if m.Conflict != 0 {
				seen[fmt.Sprintf("AnswerStoreObject{Conflict:%v}", m.Conflict)] = true
			}
		case *proto.AnswerRelockObject:
			if m.Conflict != nil {
				seen[fmt.Sprintf("AnswerRelockObject{Conflict:%v}", m.Conflict.ConflictTid)] = true
			}
		}
	}
	for _, w := range want {
		if !seen[w] {
			t.Errorf("%s-%s: capture has no %s", run, name, w)
		}
	}
}
