package neosqlite

import (
	"context"
	"crypto/sha1"
	"database/sql"
	"reflect"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// replObject is a replicated record of oid at serial with data and its
// checksum.
func replObject(oid zodb.Oid, serial zodb.Tid, data string) ReplObject {
	return ReplObject{Oid: oid, Serial: serial, Data: []byte(data), Checksum: sha1.Sum([]byte(data))}
}

// countRows runs q, a SELECT COUNT(*), on the database at path (read-only)
// and returns its count.
func countRows(t *testing.T, path, q string, args ...any) (n int) {
	t.Helper()
	sq, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer sq.Close()
	if err := sq.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// TestReplicationSink writes what a replication brings (transactions, a
// pack order, records with data, an undo backpointer, a deletion), twice
// (the second time changes nothing), lists it back (TIDsFrom,
// ReplicationRecords), deletes what a source would say is gone, records the
// progress durably (kept across a reopen), lowers the completed pack, makes
// the cells readable and reads the data, and drops a discarded partition.
func TestReplicationSink(t *testing.T) {
	ctx := context.Background()
	// Node 1 replicates both partitions from node 2; last pack id 7.
	db, path := newReplTarget(t, 2, 7)
	defer func() { db.Close() }()
	var err error
	const t1, t2, t3 = testTid, testTid + 1, testTid + 2 // partitions 0, 1, 0
	undo := replObject(2, t3, "a")
	undo.DataSerial = t1
	batch := &ReplBatch{
		Txns: []ReplTxn{
			{Tid: t1, TTid: t1 - 5, User: []byte("u"), Description: []byte("d1"), Extension: []byte{}, Oids: []zodb.Oid{2, 3}},
			{Tid: t2, TTid: t2 - 5, Oids: []zodb.Oid{3}},
			{Tid: t3, TTid: t3 - 5, Oids: []zodb.Oid{2, 4}, Pack: &ReplPack{Approved: 1, PackTid: t2}},
		},
		Objects: []ReplObject{replObject(2, t1, "a"), replObject(3, t2, "b"), undo, {Oid: 4, Serial: t3, NoData: true}},
	}
	for range 2 {
		if err := db.StoreReplicated(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	count := func(q string, args ...any) int { t.Helper(); return countRows(t, path, q, args...) }
	if n := count("SELECT COUNT(*) FROM trans"); n != 3 {
		t.Errorf("%d trans rows, want 3", n)
	}
	if n := count("SELECT COUNT(*) FROM obj"); n != 4 {
		t.Errorf("%d obj rows, want 4", n)
	}
	// NEO/py's data ids: per partition of the oid; the undo record
	// reuses its revision's data row.
	if n := count("SELECT COUNT(*) FROM data"); n != 2 {
		t.Errorf("%d data rows, want 2", n)
	}
	if n := count("SELECT COUNT(*) FROM obj WHERE oid=2 AND data_id=0"); n != 2 {
		t.Errorf("oid 2: %d records with data id 0, want 2", n)
	}
	if n := count("SELECT COUNT(*) FROM obj WHERE oid=2 AND tid=? AND value_tid=?", int64(t3), int64(t1)); n != 1 {
		t.Error("undo record: no value_tid")
	}
	if n := count("SELECT COUNT(*) FROM obj WHERE oid=3 AND data_id=?", int64(1)<<48); n != 1 {
		t.Error("oid 3: data id not in partition 1's range")
	}
	if n := count("SELECT COUNT(*) FROM pack WHERE tid=? AND approved=1 AND pack_tid=?", int64(t3), int64(t2)); n != 1 {
		t.Error("pack order not stored")
	}

	known := func(p uint32, min, max zodb.Tid, n int) ([]zodb.Tid, error) {
		return db.TIDsFrom(ctx, min, max, n, []uint32{p})
	}
	records := func(p uint32, minTid, maxTid zodb.Tid, minOid zodb.Oid, n int) ([]SerialOid, error) {
		var r []SerialOid
		err := db.ReplicationRecords(ctx, p, minTid, maxTid, minOid, n, func(serial zodb.Tid, oid zodb.Oid) {
			r = append(r, SerialOid{serial, oid})
		})
		return r, err
	}
	tids, err := known(0, 0, zodb.TidMax, 10)
	if err != nil || !reflect.DeepEqual(tids, []zodb.Tid{t1, t3}) {
		t.Errorf("KnownTIDs(0) = %v, %v", tids, err)
	}
	if tids, _ := known(0, t1+1, zodb.TidMax, 10); !reflect.DeepEqual(tids, []zodb.Tid{t3}) {
		t.Errorf("KnownTIDs(0, from t1+1) = %v", tids)
	}
	recs, err := records(0, 0, zodb.TidMax, 0, 10)
	if want := []SerialOid{{t1, 2}, {t3, 2}, {t3, 4}}; err != nil || !reflect.DeepEqual(recs, want) {
		t.Errorf("KnownRecords(0) = %v, %v; want %v", recs, err, want)
	}
	if recs, _ := records(0, t3, zodb.TidMax, 3, 10); !reflect.DeepEqual(recs, []SerialOid{{t3, 4}}) {
		t.Errorf("KnownRecords(0, from (t3, 3)) = %v", recs)
	}
	if recs, _ := records(0, 0, t1, 0, 10); !reflect.DeepEqual(recs, []SerialOid{{t1, 2}}) {
		t.Errorf("KnownRecords(0, up to t1) = %v", recs)
	}
	if recs, _ := records(0, 0, zodb.TidMax, 0, 1); len(recs) != 1 {
		t.Errorf("KnownRecords(0, limit 1) = %v", recs)
	}

	// What the source does not have.
	if err := db.StoreReplicated(ctx, &ReplBatch{DeleteTids: []zodb.Tid{t3}, DeleteObjs: []SerialOid{{t3, 4}}}); err != nil {
		t.Fatal(err)
	}
	if n := count("SELECT COUNT(*) FROM trans WHERE tid=?", int64(t3)); n != 0 {
		t.Error("deleted transaction still there")
	}
	if n := count("SELECT COUNT(*) FROM pack"); n != 0 {
		t.Error("deleted transaction's pack order still there")
	}
	if n := count("SELECT COUNT(*) FROM obj WHERE oid=4"); n != 0 {
		t.Error("deleted record still there")
	}
	// A data row stays while a record references it.
	if err := db.StoreReplicated(ctx, &ReplBatch{DeleteObjs: []SerialOid{{t1, 2}}}); err != nil {
		t.Fatal(err)
	}
	if n := count("SELECT COUNT(*) FROM data WHERE id=0"); n != 1 {
		t.Error("data row of the undo record deleted")
	}
	if err := db.StoreReplicated(ctx, &ReplBatch{Objects: []ReplObject{replObject(2, t1, "a")}}); err != nil {
		t.Fatal(err)
	}

	// Progress and pack, across a reopen.
	if err := db.SetReplicatedTid(ctx, 0, t3, true); err != nil {
		t.Fatal(err)
	}
	if err := db.UpdateCompletedPack(ctx, 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := db.UpdateCompletedPack(ctx, 0, 9); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if db, err = OpenWriter(ctx, path); err != nil {
		t.Fatal(err)
	}
	for _, c := range db.PartitionTable() {
		if c.Nid != 1 {
			continue
		}
		want := Cell{Partition: c.Partition, Nid: 1, State: OutOfDate, Pack: 7, HasPack: true}
		if c.Partition == 0 {
			want.ReplicatedTid, want.Pack = t3, 5
		}
		if c != want {
			t.Errorf("cell %+v, want %+v", c, want)
		}
	}

	// Readable: the replicated data is served.
	if err := db.SetPartitionTable(ctx, 2, 1, []CellChange{{0, 1, UpToDate}, {1, 1, UpToDate}}, false, 0); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		oid  zodb.Oid
		at   zodb.Tid
		data string
	}{{2, t1, "a"}, {3, t2, "b"}, {2, t3, "a"}} {
		data, _, err := db.Load(ctx, zodb.Xid{Oid: x.oid, At: x.at})
		if err != nil || string(data) != x.data {
			t.Errorf("load %s at %s: %q, %v; want %q", x.oid, x.at, data, err, x.data)
		}
	}

	// Partition 1 discarded, then dropped one record at a time.
	if err := db.SetPartitionTable(ctx, 3, 1, []CellChange{{1, 1, Discarded}}, false, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		more, err := db.DropPartition(ctx, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !more {
			break
		}
		if i > 5 {
			t.Fatal("DropPartition does not end")
		}
	}
	if n := count("SELECT COUNT(*) FROM obj WHERE partition=1") + count("SELECT COUNT(*) FROM trans WHERE partition=1"); n != 0 {
		t.Errorf("%d rows of partition 1 left", n)
	}
	if n := count("SELECT COUNT(*) FROM data WHERE id>=?", int64(1)<<48); n != 0 {
		t.Errorf("%d data rows of partition 1 left", n)
	}
	if n := count("SELECT COUNT(*) FROM obj WHERE partition=0"); n != 2 {
		t.Errorf("partition 0: %d obj rows, want 2", n)
	}
}
