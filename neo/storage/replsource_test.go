package storage_test

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/zodb"
)

// replModel is the data replTestData commits: what a ReplicationSource
// must list, in commit (tid) order.
type replModel struct {
	txns []replModelTxn
}

type replModelTxn struct {
	tid  zodb.Tid
	user []byte
	oids []zodb.Oid // as committed (the transaction's oid list)
	objs []storage.VotedObject
}

// tids returns the model's tids of partition p of np in [min, max].
func (m *replModel) tids(p, np uint32, min, max zodb.Tid) []zodb.Tid {
	var r []zodb.Tid
	for _, t := range m.txns {
		if uint64(t.tid)%uint64(np) == uint64(p) && min <= t.tid && t.tid <= max {
			r = append(r, t.tid)
		}
	}
	return r
}

// records returns the model's records of partition p of np in (serial,
// oid) order from position (minTid, minOid) up to maxTid.
func (m *replModel) records(p, np uint32, minTid, maxTid zodb.Tid, minOid zodb.Oid) []storage.RecordKey {
	var r []storage.RecordKey
	for _, t := range m.txns {
		if t.tid < minTid || t.tid > maxTid {
			continue
		}
		var oids []zodb.Oid
		for _, o := range t.objs {
			if uint64(o.Oid)%uint64(np) == uint64(p) && (t.tid > minTid || o.Oid >= minOid) {
				oids = append(oids, o.Oid)
			}
		}
		slices.Sort(oids)
		for _, oid := range oids {
			r = append(r, storage.RecordKey{Serial: t.tid, Oid: oid})
		}
	}
	return r
}

// replTestBase is the first tid of replTestData.
const replTestBase = zodb.Tid(0x0300000000000000)

// replTestData commits through w the same transactions whatever the
// backend: 30 transactions over oids 0..13, with records stored raw and
// zlib-compressed, undo records (backpointers) and a deletion. Each is
// voted with ttid = tid (what a FileStorage source reports as ttid).
func replTestData(t testing.TB, w storage.Writer) *replModel {
	t.Helper()
	ctx := context.Background()
	m := &replModel{}
	last := map[zodb.Oid]zodb.Tid{} // oid -> serial of its last revision with data
	for i := range 30 {
		tid := replTestBase + zodb.Tid(i)*0x10001 // all residues mod 2, 3
		mt := replModelTxn{tid: tid, user: fmt.Appendf(nil, "user %d", i)}
		for k := range 1 + i%4 {
			oid := zodb.Oid((i*5 + k*3) % 14)
			if slices.Contains(mt.oids, oid) {
				continue
			}
			mt.oids = append(mt.oids, oid)
			data := bytes.Repeat(fmt.Appendf(nil, "oid %d in txn %d; ", oid, i), 1+i%7)
			o := storage.VotedObject{Oid: oid, Checksum: sha1.Sum(data), Data: data}
			switch {
			case i == 23 && k == 0:
				o = storage.VotedObject{Oid: oid, NoData: true}
			case i%6 == 5 && last[oid] != 0:
				o = storage.VotedObject{Oid: oid, DataSerial: last[oid]}
			case i%4 == 2:
				var buf bytes.Buffer
				zw := zlib.NewWriter(&buf)
				zw.Write(data)
				zw.Close()
				o = storage.VotedObject{Oid: oid, Compression: 1, Checksum: sha1.Sum(buf.Bytes()), Data: buf.Bytes()}
			}
			if !o.NoData && o.DataSerial == 0 {
				last[oid] = tid
			}
			mt.objs = append(mt.objs, o)
		}
		vt := &storage.VotedTxn{TTid: tid, Meta: &storage.TxnMeta{User: mt.user, Description: []byte("replication test"), Oids: mt.oids}, Objects: mt.objs}
		if err := w.Vote(ctx, vt); err != nil {
			t.Fatalf("vote %s: %v", tid, err)
		}
		if err := w.Lock(ctx, tid, tid); err != nil {
			t.Fatalf("lock %s: %v", tid, err)
		}
		if err := w.Unlock(ctx, tid, tid); err != nil {
			t.Fatalf("unlock %s: %v", tid, err)
		}
		m.txns = append(m.txns, mt)
	}
	return m
}

// newReplSQLite returns a new SQLite backend whose node (nodeNID) holds
// the np partitions of its table, UP_TO_DATE.
func newReplSQLite(t testing.TB, np int) *sqlitebackend.Backend {
	t.Helper()
	ctx := context.Background()
	be := newSQLiteBackend(t)
	if err := be.SetIdentity(ctx, cluster, nodeNID); err != nil {
		t.Fatal(err)
	}
	var cells []storage.Cell
	for p := range np {
		cells = append(cells, storage.Cell{Partition: uint32(p), NID: nodeNID, State: proto.UpToDate})
	}
	if err := be.SetPartitionTable(ctx, 1, 0, cells, true, 0); err != nil {
		t.Fatal(err)
	}
	return be
}

// newReplFS1 returns a new FileStorage backend, read-write.
func newReplFS1(t testing.TB) *fs1backend.Backend {
	t.Helper()
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

// TestReplicationSource checks both backends' ReplicationSource on the
// same data, with 1, 2 and 3 partitions (FileStorage: the whole file,
// filtered): the lists against the model (ranges, positions, limits,
// empty ranges), and the transactions and records against each other.
func TestReplicationSource(t *testing.T) {
	ctx := context.Background()
	fs := newReplFS1(t)
	model := replTestData(t, fs)
	tids := model.tids(0, 1, 0, proto.MaxTid)
	lastTid := tids[len(tids)-1]
	for _, np := range []uint32{1, 2, 3} {
		sq := newReplSQLite(t, int(np))
		replTestData(t, sq)
		srcs := map[string]storage.ReplicationSource{"fs1": fs, "sqlite": sq}
		for p := range np {
			for _, r := range []struct{ min, max zodb.Tid }{
				{0, proto.MaxTid}, {tids[3], tids[20]}, {tids[3] + 1, tids[20] - 1}, {tids[5], tids[5]},
				{tids[7], tids[6]}, {lastTid + 1, proto.MaxTid}, {0, proto.InvalidTid},
			} {
				want := model.tids(p, np, r.min, r.max)
				for _, limit := range []int{1, 2, 5, 1000} {
					w := want[:min(limit, len(want))]
					for name, src := range srcs {
						got, err := src.ReplicationTIDs(ctx, p, np, r.min, r.max, limit, nil)
						if err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						if !slices.Equal(got, w) {
							t.Errorf("%s np=%d: ReplicationTIDs(%d, %s, %s, %d) = %v, want %v", name, np, p, r.min, r.max, limit, got, w)
						}
					}
				}
			}
			for _, r := range []struct {
				min, max zodb.Tid
				minOid   zodb.Oid
			}{
				{0, proto.MaxTid, 0}, {tids[4], tids[19], 0}, {tids[4], tids[19], 6}, {tids[9], tids[9], 3},
				{tids[9], tids[8], 0}, {lastTid, proto.MaxTid, 100}, {tids[2] + 1, tids[25], 0},
			} {
				want := model.records(p, np, r.min, r.max, r.minOid)
				for _, limit := range []int{1, 3, 7, 10000} {
					w := want[:min(limit, len(want))]
					for name, src := range srcs {
						got, err := src.ReplicationRecords(ctx, p, np, r.min, r.max, r.minOid, limit, nil)
						if err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						if !slices.Equal(got, w) {
							t.Errorf("%s np=%d: ReplicationRecords(%d, %s, %s, %s, %d) = %v, want %v", name, np, p, r.min, r.max, r.minOid, limit, got, w)
						}
					}
				}
			}
		}
		if np > 1 {
			continue
		}
		// Transactions and records: the same from both.
		for _, mt := range model.txns {
			a, err := fs.ReplicationTransaction(ctx, mt.tid)
			if err != nil {
				t.Fatal(err)
			}
			b, err := sq.ReplicationTransaction(ctx, mt.tid)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a, b) || !bytes.Equal(a.User, mt.user) || a.TTid != mt.tid || a.Pack != nil {
				t.Errorf("ReplicationTransaction(%s): fs1 %+v, sqlite %+v", mt.tid, a, b)
			}
			for _, o := range mt.objs {
				var x, y storage.Object
				if err := fs.ReplicationObject(ctx, o.Oid, mt.tid, &x); err != nil {
					t.Fatal(err)
				}
				if err := sq.ReplicationObject(ctx, o.Oid, mt.tid, &y); err != nil {
					t.Fatal(err)
				}
				x.NextSerial, y.NextSerial = 0, 0 // (not part of the contract)
				if len(x.Data) == 0 && len(y.Data) == 0 {
					x.Data, y.Data = nil, nil
				}
				if !reflect.DeepEqual(x, y) || x.NoData != o.NoData || x.DataSerial != o.DataSerial {
					t.Errorf("ReplicationObject(%s, %s): fs1 %+v, sqlite %+v", o.Oid, mt.tid, x, y)
				}
				if !o.NoData && o.DataSerial == 0 && (!bytes.Equal(x.Data, o.Data) || x.Compression != o.Compression || x.Checksum != o.Checksum) {
					t.Errorf("ReplicationObject(%s, %s): %+v, want the data stored", o.Oid, mt.tid, x)
				}
			}
		}
		for name, src := range map[string]storage.ReplicationSource{"fs1": fs, "sqlite": sq} {
			var o storage.Object
			if _, err := src.ReplicationTransaction(ctx, lastTid+1); err == nil {
				t.Errorf("%s: ReplicationTransaction of a tid not committed: no error", name)
			}
			if err := src.ReplicationObject(ctx, 1, lastTid+1, &o); err == nil {
				t.Errorf("%s: ReplicationObject of a serial not committed: no error", name)
			}
			if pack, err := src.CompletedPack(ctx, 0); err != nil || pack != 0 {
				t.Errorf("%s: CompletedPack = %s, %v", name, pack, err)
			}
		}
	}
}

// TestReplicationObjects checks the SQLite backend's ReplicationScanner
// against its ReplicationRecords and ReplicationObject: the same keys in
// the same order for every range, position and limit, and the same
// records for those asked, values of more than a page (read through the
// blob handle) included; fn's error is returned as is. Likewise its
// ReplicationTransactions against ReplicationTIDs and
// ReplicationTransaction.
func TestReplicationObjects(t *testing.T) {
	ctx := context.Background()
	const np = 2
	sq := newReplSQLite(t, np)
	model := replTestData(t, sq)
	// Three transactions with values of a page and more.
	for i, size := range []int{3000, 70000, 1 << 20} {
		tid := replTestBase + zodb.Tid(40+i)*0x10001
		var objs []storage.VotedObject
		var oids []zodb.Oid
		for _, oid := range []zodb.Oid{zodb.Oid(2 + i), zodb.Oid(7 + i), 20} {
			data := bytes.Repeat(fmt.Appendf(nil, "%d/%d ", oid, i), size/6)
			objs = append(objs, storage.VotedObject{Oid: oid, Checksum: sha1.Sum(data), Data: data})
			oids = append(oids, oid)
		}
		vt := &storage.VotedTxn{TTid: tid, Meta: &storage.TxnMeta{Oids: oids}, Objects: objs}
		if err := sq.Vote(ctx, vt); err != nil {
			t.Fatal(err)
		}
		if err := sq.Lock(ctx, tid, tid); err != nil {
			t.Fatal(err)
		}
		if err := sq.Unlock(ctx, tid, tid); err != nil {
			t.Fatal(err)
		}
	}
	// Two pack orders (as a replication brings them): one approved and
	// partial, one not signed.
	packs := &storage.ReplBatch{Txns: []storage.ReplTxn{
		{TxnInfo: storage.TxnInfo{Tid: replTestBase + 50*0x10001, Description: []byte("pack"), Oids: []zodb.Oid{}}, TTid: replTestBase + 50*0x10001,
			Pack: &proto.TxnPack{Approved: true, ApprovedSet: true, Partial: true, Oids: []zodb.Oid{2, 5}, OidsSet: true, PackTid: replTestBase + 9*0x10001}},
		{TxnInfo: storage.TxnInfo{Tid: replTestBase + 52*0x10001, Oids: []zodb.Oid{}}, TTid: replTestBase + 52*0x10001,
			Pack: &proto.TxnPack{PackTid: replTestBase + 20*0x10001}},
	}}
	if err := sq.StoreReplicated(ctx, packs); err != nil {
		t.Fatal(err)
	}
	for _, tx := range packs.Txns {
		if got, err := sq.ReplicationTransaction(ctx, tx.Tid); err != nil || got.Pack == nil {
			t.Fatalf("pack order %s: %+v, %v", tx.Tid, got, err)
		}
	}
	tids := model.tids(0, 1, 0, proto.MaxTid)
	var sc storage.ReplicationScanner = sq
	for p := range uint32(np) {
		for _, r := range []struct {
			min, max zodb.Tid
			minOid   zodb.Oid
		}{
			{0, proto.MaxTid, 0}, {tids[4], tids[19], 6}, {tids[9], tids[9], 3}, {tids[9], tids[8], 0},
			{tids[2] + 1, proto.MaxTid, 0}, {tids[29], proto.MaxTid, 1}, {0, proto.MaxTid, proto.InvalidOid},
		} {
			for _, limit := range []int{1, 3, 7, 10000} {
				want, err := sq.ReplicationRecords(ctx, p, np, r.min, r.max, r.minOid, limit, nil)
				if err != nil {
					t.Fatal(err)
				}
				for skip := range 3 { // records read: none, every other one, all
					var keys []storage.RecordKey
					var got []storage.Object
					o := &storage.Object{Data: make([]byte, 0, 16)}
					err := sc.ReplicationObjects(ctx, p, np, r.min, r.max, r.minOid, limit, o,
						func(k storage.RecordKey) bool {
							keys = append(keys, k)
							return skip == 2 || skip == 1 && len(keys)%2 == 0
						},
						func(o *storage.Object) error {
							c := *o
							c.Data = slices.Clone(o.Data)
							got = append(got, c)
							return nil
						})
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(keys, want) {
						t.Fatalf("p=%d %+v limit %d: keys %v, want %v", p, r, limit, keys, want)
					}
					var n int
					for i, k := range keys {
						if !(skip == 2 || skip == 1 && (i+1)%2 == 0) {
							continue
						}
						var x storage.Object
						if err := sq.ReplicationObject(ctx, k.Oid, k.Serial, &x); err != nil {
							t.Fatal(err)
						}
						x.NextSerial = 0
						y := got[n]
						n++
						if len(x.Data) == 0 && len(y.Data) == 0 {
							x.Data, y.Data = nil, nil
						}
						if !reflect.DeepEqual(x, y) {
							t.Errorf("p=%d %+v limit %d: record %v: %+v, ReplicationObject %+v", p, r, limit, k, y, x)
						}
					}
					if n != len(got) {
						t.Errorf("p=%d %+v limit %d: %d records read, want %d", p, r, limit, len(got), n)
					}
				}
			}
		}
	}
	// Transactions: the scan against ReplicationTIDs and
	// ReplicationTransaction.
	for p := range uint32(np) {
		for _, r := range []struct{ min, max zodb.Tid }{
			{0, proto.MaxTid}, {tids[3], tids[20]}, {tids[3] + 1, tids[20] - 1}, {tids[5], tids[5]}, {tids[7], tids[6]},
		} {
			for _, limit := range []int{1, 2, 5, 1000} {
				want, err := sq.ReplicationTIDs(ctx, p, np, r.min, r.max, limit, nil)
				if err != nil {
					t.Fatal(err)
				}
				var seen []zodb.Tid
				n := 0
				err = sc.ReplicationTransactions(ctx, p, np, r.min, r.max, limit, &storage.ReplTxn{},
					func(tid zodb.Tid) bool { seen = append(seen, tid); return len(seen)%2 == 1 || tid > tids[29] },
					func(x *storage.ReplTxn) error {
						y, err := sq.ReplicationTransaction(ctx, seen[len(seen)-1])
						if err != nil {
							return err
						}
						if !reflect.DeepEqual(x, y) {
							t.Errorf("p=%d %+v limit %d: %+v, ReplicationTransaction %+v", p, r, limit, x, y)
						}
						n++
						return nil
					})
				if err != nil {
					t.Fatal(err)
				}
				reads := 0
				for i, tid := range want {
					if i%2 == 0 || tid > tids[29] {
						reads++
					}
				}
				if !slices.Equal(seen, want) || n != reads {
					t.Errorf("p=%d %+v limit %d: tids %v (%d read), want %v", p, r, limit, seen, n, want)
				}
			}
		}
	}
	stop := errors.New("stop")
	calls := 0
	err := sc.ReplicationObjects(ctx, 0, np, 0, proto.MaxTid, 0, 100, &storage.Object{},
		func(storage.RecordKey) bool { return true },
		func(*storage.Object) error { calls++; return stop })
	if err != stop || calls != 1 {
		t.Errorf("fn's error: %v after %d calls, want stop after 1", err, calls)
	}
}
