package storage_test

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// TestPackParity commits the same history to a FileStorage node's backend
// and to a SQLite node's, packs both at the same tid, and checks that the
// two hold the same copy of the partition, as NEO requires of replicas
// (`neoctl check`; a NEO client reading either node): the tids and the
// (serial, oid) records ReplicationSource lists, the checksums
// AskCheckTIDRange and AskCheckSerialRange answer, and every object's
// loadBefore answer at every tid. The history has what a pack treats
// apart: revisions replaced before the pack time, an object deleted before
// it and one deleted at it (NEO drops all of their records), undo records
// before and after it (one points to a revision the pack removes),
// transactions left without records, and a transaction without records
// from the start (a pack order's).
func TestPackParity(t *testing.T) {
	ctx := context.Background()
	fs := newReplFS1(t)
	sq := newReplSQLite(t, 1)
	backends := []struct {
		name string
		w    storage.Writer
		src  storage.ReplicationSource
	}{{"fs1", fs, fs}, {"sqlite", sq, sq}}

	tid := zodb.Tid(0x03e5_0000_0000_0000)
	var tids []zodb.Tid
	commit := func(objs ...storage.VotedObject) zodb.Tid {
		t.Helper()
		tid += 0x1000
		var oids []zodb.Oid
		for _, o := range objs {
			oids = append(oids, o.Oid)
		}
		for _, b := range backends {
			vt := &storage.VotedTxn{TTid: tid, Meta: &storage.TxnMeta{User: []byte("u"), Description: []byte(fmt.Sprintf("txn %d", len(tids))), Oids: oids}, Objects: objs}
			if err := b.w.Vote(ctx, vt); err != nil {
				t.Fatalf("%s: vote %s: %v", b.name, tid, err)
			}
			if err := b.w.Lock(ctx, tid, tid); err != nil {
				t.Fatalf("%s: lock %s: %v", b.name, tid, err)
			}
			if err := b.w.Unlock(ctx, tid, tid); err != nil {
				t.Fatalf("%s: unlock %s: %v", b.name, tid, err)
			}
		}
		tids = append(tids, tid)
		return tid
	}
	store := func(oid zodb.Oid, data string) storage.VotedObject {
		return storage.VotedObject{Oid: oid, Data: []byte(data), Checksum: sha1.Sum([]byte(data))}
	}
	undo := func(oid zodb.Oid, serial zodb.Tid) storage.VotedObject {
		return storage.VotedObject{Oid: oid, DataSerial: serial}
	}
	deletion := func(oid zodb.Oid) storage.VotedObject { return storage.VotedObject{Oid: oid, NoData: true} }

	t1 := commit(store(0, "root"), store(1, "a1"), store(2, "b1"), store(3, "c1"))
	commit(store(1, "a2"))                 // t2: a1 replaced
	commit(store(2, "b2"))                 // t3
	commit(deletion(3))                    // t4: oid 3 deleted before the pack time
	t5 := commit(undo(1, t1))              // t5: undo of t2, current at the pack time
	t6 := commit(store(4, "d1"))           // t6
	commit(store(4, "d2"), store(2, "b3")) // t7
	commit()                               // t8: no record (a pack order's transaction)
	commit(store(5, "e1"))                 // t9
	packTid := commit(deletion(5))         // t10: oid 5 deleted at the pack time
	commit(store(1, "a3"))                 // after the pack time
	commit(undo(1, t5))                    // undo of t11: points to the revision kept
	commit(undo(4, t6))                    // undo of t7: points to a revision the pack drops
	commit(store(6, "f1"), store(0, "root2"))
	last := tid

	type snapshot struct {
		tids    []zodb.Tid
		records []storage.RecordKey
		tsum    proto.AnswerCheckTIDRange
		ssum    proto.AnswerCheckSerialRange
		loads   map[string]string
	}
	snap := func(b storage.ReplicationSource, be storage.Backend) snapshot {
		t.Helper()
		var s snapshot
		var err error
		if s.tids, err = b.ReplicationTIDs(ctx, 0, 1, 0, proto.MaxTid, 1000, nil); err != nil {
			t.Fatal(err)
		}
		if s.records, err = b.ReplicationRecords(ctx, 0, 1, 0, proto.MaxTid, 0, 1000, nil); err != nil {
			t.Fatal(err)
		}
		if s.tsum, err = storage.CheckTIDs(ctx, b, 0, 1, 0, proto.MaxTid, 1000); err != nil {
			t.Fatal(err)
		}
		if s.ssum, err = storage.CheckSerials(ctx, b, 0, 1, 0, proto.MaxTid, 0, 1000); err != nil {
			t.Fatal(err)
		}
		// loadBefore(oid, tid) for each tid and one past the last.
		s.loads = map[string]string{}
		for oid := zodb.Oid(0); oid <= 7; oid++ {
			for _, before := range append(append([]zodb.Tid(nil), tids...), last+1) {
				var o storage.Object
				k := fmt.Sprintf("oid %s before %s", oid, before)
				err := be.Object(ctx, oid, 0, before, &o)
				var nf *zodb.NoObjectError
				switch {
				case errors.As(err, &nf):
					s.loads[k] = "no such object"
				case errors.Is(err, storage.ErrOidNotFound):
					s.loads[k] = "no revision before"
				case err != nil:
					t.Fatalf("%s: %v", k, err)
				case o.NoData:
					s.loads[k] = fmt.Sprintf("serial %s next %s deleted", o.Serial, o.NextSerial)
				default:
					// (Not DataSerial: an undo record kept by a pack
					// is written with its data in a FileStorage, with
					// data serial 0, while NEO keeps value_tid; NEO's
					// client reads no data_serial in a load.)
					s.loads[k] = fmt.Sprintf("serial %s next %s data %q", o.Serial, o.NextSerial, o.Data)
				}
			}
		}
		return s
	}
	compare := func(when string) {
		t.Helper()
		a, b := snap(fs, fs), snap(sq, sq)
		if fmt.Sprint(a.tids) != fmt.Sprint(b.tids) {
			t.Errorf("%s: tids differ:\nfs1    %v\nsqlite %v", when, a.tids, b.tids)
		}
		if fmt.Sprint(a.records) != fmt.Sprint(b.records) {
			t.Errorf("%s: records differ:\nfs1    %v\nsqlite %v", when, a.records, b.records)
		}
		if a.tsum != b.tsum {
			t.Errorf("%s: AskCheckTIDRange differs:\nfs1    %+v\nsqlite %+v", when, a.tsum, b.tsum)
		}
		if a.ssum != b.ssum {
			t.Errorf("%s: AskCheckSerialRange differs:\nfs1    %+v\nsqlite %+v", when, a.ssum, b.ssum)
		}
		for k, v := range a.loads {
			if testing.Verbose() {
				t.Logf("%s: %s: fs1 %s, sqlite %s", when, k, v, b.loads[k])
			}
			if b.loads[k] != v {
				t.Errorf("%s: %s: fs1 %s, sqlite %s", when, k, v, b.loads[k])
			}
		}
	}
	compare("before the pack")
	for _, b := range backends {
		if err := b.w.Pack(ctx, packTid, nil); err != nil {
			t.Fatalf("%s: pack: %v", b.name, err)
		}
	}
	compare("after the pack")
	// More commits, then a pack at the last tid (the transactions of the
	// first pack, packed again, and the undo records of the first one's
	// tail now before the pack time).
	commit(store(7, "g1"), store(2, "b4"))
	commit(deletion(7))
	commit(undo(2, tids[len(tids)-2]))
	last = tid
	compare("after more commits")
	for _, b := range backends {
		if err := b.w.Pack(ctx, last, nil); err != nil {
			t.Fatalf("%s: pack: %v", b.name, err)
		}
	}
	compare("after the second pack")
}
