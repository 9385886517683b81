package storage_test

import (
	"bytes"
	"crypto/sha1"
	"errors"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// replPeer connects to the node as another storage node would to
// replicate from it (anonymously: NEO/py accepts a storage without node id,
// as a backup cluster's).
func replPeer(t testing.TB, c *writeCluster) *testClient {
	t.Helper()
	l, err := neotest.Dial(c.n.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	cl := &testClient{t: t, c: c, nid: proto.NoNode, replayLink: &replayLink{l: l}}
	id := cl.send(&proto.RequestIdentification{NodeType: proto.Storage, NID: proto.NoNode, ClusterName: cluster, IdTime: proto.NoIdTime})
	cl.expect(t, id, proto.CodeAcceptIdentification)
	return cl
}

// ask sends m and returns the packets the node sends with its msg_id: the
// notifications, then the answer (or Error) last.
func (cl *testClient) ask(m proto.Msg) []proto.Packet {
	cl.t.Helper()
	id := cl.send(m)
	var r []proto.Packet
	for {
		p := cl.expectFunc(cl.t, func(p proto.Packet) bool { return p.ID == id }, "packets of "+proto.CodeName(m.Code()))
		p.Args = slices.Clone(p.Args)
		r = append(r, p)
		if p.Code&proto.AnswerBit != 0 {
			return r
		}
	}
}

// wantError checks that ps is the single Error code.
func wantError(t testing.TB, what string, ps []proto.Packet, code proto.ErrorCode) {
	t.Helper()
	if len(ps) != 1 || ps[0].Code != proto.CodeError {
		t.Errorf("%s: %d packets, last %s, want Error", what, len(ps), proto.CodeName(ps[len(ps)-1].Code))
		return
	}
	if e := decodeArgs(t, ps[0]).(*proto.Error); e.ErrCode != code {
		t.Errorf("%s: Error %d %q, want code %d", what, e.ErrCode, e.Message, code)
	}
}

// decimalSum is sha1 over the comma-joined decimal numbers, as NEO/py
// checksums ranges.
func decimalSum[T ~uint64](xs []T) [20]byte {
	if len(xs) == 0 {
		return [20]byte{}
	}
	var s []string
	for _, x := range xs {
		s = append(s, strconv.FormatUint(uint64(x), 10))
	}
	return sha1.Sum([]byte(strings.Join(s, ",")))
}

// replScript sends the replication and check requests of partition p of
// np to the node and checks the results against the model; it returns
// every packet received, in order.
func replScript(t *testing.T, cl *testClient, model *replModel, p, np uint32) []proto.Packet {
	var all []proto.Packet
	ask := func(m proto.Msg) []proto.Packet {
		ps := cl.ask(m)
		all = append(all, ps...)
		return ps
	}
	tids := model.tids(p, np, 0, proto.MaxTid)
	recs := model.records(p, np, 0, proto.MaxTid, 0)
	byTid := map[zodb.Tid]*replModelTxn{}
	for i := range model.txns {
		byTid[model.txns[i].tid] = &model.txns[i]
	}
	const bogus = zodb.Tid(0x0100000000000000)

	// Transactions: those not known, then the known ones that are not
	// there; with a length, next_tid.
	checkAdds := func(what string, ps []proto.Packet, want []zodb.Tid) {
		t.Helper()
		var got []zodb.Tid
		for _, pk := range ps[:len(ps)-1] {
			a, ok := decodeArgs(t, pk).(*proto.AddTransaction)
			if !ok {
				t.Fatalf("%s: got %s", what, proto.CodeName(pk.Code))
			}
			got = append(got, a.Tid)
			mt := byTid[a.Tid]
			if mt == nil || !bytes.Equal(a.User, mt.user) || !slices.Equal(a.Oids, mt.oids) || a.TTid != a.Tid || a.Pack != nil || a.Packed {
				t.Errorf("%s: %+v, want %+v", what, a, mt)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: AddTransaction %v, want %v", what, got, want)
		}
	}
	ps := ask(&proto.AskFetchTransactions{Partition: p, Length: 1000, MinTid: 0, MaxTid: proto.MaxTid, KnownTids: []zodb.Tid{bogus, tids[1]}, AskPackInfo: true})
	checkAdds("fetch all", ps, slices.Delete(slices.Clone(tids), 1, 2))
	if a := decodeArgs(t, ps[len(ps)-1]); !reflect.DeepEqual(a, &proto.AnswerFetchTransactions{NextTid: proto.InvalidTid, TidsToDelete: []zodb.Tid{bogus}, CompletedPack: 0}) {
		t.Errorf("fetch all: %+v", a)
	}
	ps = ask(&proto.AskFetchTransactions{Partition: p, Length: 2, MinTid: tids[1], MaxTid: proto.MaxTid})
	checkAdds("fetch 2", ps, tids[1:3])
	if a := decodeArgs(t, ps[len(ps)-1]); !reflect.DeepEqual(a, &proto.AnswerFetchTransactions{NextTid: tids[3], CompletedPack: proto.InvalidTid}) {
		t.Errorf("fetch 2: %+v", a)
	}
	ps = ask(&proto.AskFetchTransactions{Partition: p, Length: 1000, MinTid: tids[4], MaxTid: tids[3], KnownTids: []zodb.Tid{tids[3]}})
	checkAdds("fetch of an empty range", ps, nil)
	if a := decodeArgs(t, ps[len(ps)-1]); !reflect.DeepEqual(a, &proto.AnswerFetchTransactions{NextTid: proto.InvalidTid, TidsToDelete: []zodb.Tid{tids[3]}, CompletedPack: proto.InvalidTid}) {
		t.Errorf("fetch of an empty range: %+v", a)
	}

	// Objects: likewise, with the known records by serial.
	checkObjs := func(what string, ps []proto.Packet, want []storage.RecordKey) {
		t.Helper()
		var got []storage.RecordKey
		for _, pk := range ps[:len(ps)-1] {
			a, ok := decodeArgs(t, pk).(*proto.AddObject)
			if !ok {
				t.Fatalf("%s: got %s", what, proto.CodeName(pk.Code))
			}
			got = append(got, storage.RecordKey{Serial: a.Serial, Oid: a.Oid})
			var o *storage.VotedObject
			for i, x := range byTid[a.Serial].objs {
				if x.Oid == a.Oid {
					o = &byTid[a.Serial].objs[i]
				}
			}
			switch {
			case o == nil:
				t.Errorf("%s: %+v not committed", what, a)
			case o.NoData:
				if a.Compression != 0 || a.Checksum != ([20]byte{}) || len(a.Data) != 0 || a.DataSerial != proto.InvalidTid {
					t.Errorf("%s: deletion %+v", what, a)
				}
			case o.DataSerial != 0:
				if a.DataSerial != o.DataSerial || a.Checksum != sha1.Sum(a.Data) {
					t.Errorf("%s: undo %+v, want data serial %s", what, a, o.DataSerial)
				}
			default:
				if a.Compression != o.Compression || a.Checksum != o.Checksum || !bytes.Equal(a.Data, o.Data) || a.DataSerial != proto.InvalidTid {
					t.Errorf("%s: %+v, want %+v", what, a, o)
				}
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: AddObject %v, want %v", what, got, want)
		}
	}
	known := []proto.SerialOids{{Serial: recs[0].Serial, Oids: []zodb.Oid{1000, recs[0].Oid}}, {Serial: bogus, Oids: []zodb.Oid{1, 2}}}
	ps = ask(&proto.AskFetchObjects{Partition: p, Length: 1000, MinTid: 0, MaxTid: proto.MaxTid, MinOid: 0, ObjectDict: known})
	checkObjs("fetch all objects", ps, recs[1:])
	if a := decodeArgs(t, ps[len(ps)-1]); !reflect.DeepEqual(a, &proto.AnswerFetchObjects{NextTid: proto.InvalidTid, NextOid: proto.InvalidOid,
		ObjectDict: []proto.SerialOids{{Serial: recs[0].Serial, Oids: []zodb.Oid{1000}}, {Serial: bogus, Oids: []zodb.Oid{1, 2}}}}) {
		t.Errorf("fetch all objects: %+v", a)
	}
	ps = ask(&proto.AskFetchObjects{Partition: p, Length: 3, MinTid: recs[1].Serial, MaxTid: proto.MaxTid, MinOid: recs[1].Oid,
		ObjectDict: []proto.SerialOids{{Serial: recs[2].Serial, Oids: []zodb.Oid{recs[2].Oid}}}})
	checkObjs("fetch 3 objects", ps, []storage.RecordKey{recs[1], recs[3]})
	if a := decodeArgs(t, ps[len(ps)-1]); !reflect.DeepEqual(a, &proto.AnswerFetchObjects{NextTid: recs[4].Serial, NextOid: recs[4].Oid}) {
		t.Errorf("fetch 3 objects: %+v", a)
	}
	ps = ask(&proto.AskFetchObjects{Partition: p, Length: 1000, MinTid: recs[len(recs)-1].Serial + 1, MaxTid: proto.MaxTid})
	checkObjs("fetch objects of an empty range", ps, nil)

	// Checks.
	checkTIDs := func(length uint32, min, max zodb.Tid, want []zodb.Tid) {
		t.Helper()
		ps := ask(&proto.AskCheckTIDRange{Partition: p, Length: length, MinTid: min, MaxTid: max})
		w := &proto.AnswerCheckTIDRange{Count: uint64(len(want)), Checksum: decimalSum(want)}
		if len(want) > 0 {
			w.MaxTid = want[len(want)-1]
		}
		if len(ps) != 1 || !reflect.DeepEqual(decodeArgs(t, ps[0]), w) {
			t.Errorf("AskCheckTIDRange(%d, %d, %s, %s): %+v, want %+v", p, length, min, max, decodeArgs(t, ps[0]), w)
		}
	}
	checkTIDs(40000, 0, proto.MaxTid, tids)
	checkTIDs(3, tids[1], proto.MaxTid, tids[1:4])
	checkTIDs(40000, tids[2], tids[5]-1, tids[2:5])
	checkTIDs(40000, tids[2], tids[1], nil)
	checkTIDs(0, 0, proto.MaxTid, nil)
	checkSerials := func(length uint32, min, max zodb.Tid, minOid zodb.Oid, want []storage.RecordKey) {
		t.Helper()
		ps := ask(&proto.AskCheckSerialRange{Partition: p, Length: length, MinTid: min, MaxTid: max, MinOid: minOid})
		var ts []zodb.Tid
		var os []zodb.Oid
		for _, r := range want {
			ts, os = append(ts, r.Serial), append(os, r.Oid)
		}
		w := &proto.AnswerCheckSerialRange{Count: uint64(len(want)), TidChecksum: decimalSum(ts), OidChecksum: decimalSum(os)}
		if len(want) > 0 {
			w.MaxTid, w.MaxOid = want[len(want)-1].Serial, want[len(want)-1].Oid
		}
		if len(ps) != 1 || !reflect.DeepEqual(decodeArgs(t, ps[0]), w) {
			t.Errorf("AskCheckSerialRange(%d, %d, %s, %s, %s): %+v, want %+v", p, length, min, max, minOid, decodeArgs(t, ps[0]), w)
		}
	}
	checkSerials(40000, 0, proto.MaxTid, 0, recs)
	checkSerials(5, recs[2].Serial, proto.MaxTid, recs[2].Oid, recs[2:7])
	checkSerials(40000, recs[3].Serial, recs[9].Serial, recs[3].Oid+1, model.records(p, np, recs[3].Serial, recs[9].Serial, recs[3].Oid+1))
	checkSerials(40000, recs[3].Serial, recs[2].Serial, 0, model.records(p, np, recs[3].Serial, recs[2].Serial, 0))
	checkSerials(40000, recs[3].Serial, recs[3].Serial-1, 0, nil)
	return all
}

// TestServeReplication serves another storage node's replication and
// check requests from both backends (one partition; SQLite also with 3),
// checks them against the committed data, and, for one partition, that
// both backends send the same bytes.
func TestServeReplication(t *testing.T) {
	fs := newReplFS1(t)
	model := replTestData(t, fs)
	sq1 := newReplSQLite(t, 1)
	replTestData(t, sq1)
	sq3 := newReplSQLite(t, 3)
	replTestData(t, sq3)

	var got1 [][]proto.Packet
	for _, tc := range []struct {
		name string
		be   storage.Backend
		np   uint32
	}{{"fs1", fs, 1}, {"sqlite", sq1, 1}, {"sqlite-3", sq3, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			c := startWriteCluster(t, tc.be, nil)
			cl := replPeer(t, c)
			for p := range tc.np {
				all := replScript(t, cl, model, p, tc.np)
				if tc.np == 1 {
					got1 = append(got1, all)
				}
			}
		})
	}
	if len(got1) == 2 {
		a, b := got1[0], got1[1]
		if len(a) != len(b) {
			t.Fatalf("fs1 sent %d packets, sqlite %d", len(a), len(b))
		}
		for i := range a {
			if a[i].Code != b[i].Code || !bytes.Equal(a[i].Args, b[i].Args) {
				t.Errorf("packet %d: fs1 %s %s, sqlite %s %s", i, proto.CodeName(a[i].Code), short(decodeArgs(t, a[i])), proto.CodeName(b[i].Code), short(decodeArgs(t, b[i])))
			}
		}
	}
}

// TestServeReplicationRefused: a partition not readable here is refused
// (REPLICATION_ERROR to a fetch, CHECKING_ERROR to a check of an
// out-of-date cell), a client may not ask, and a backend without a
// ReplicationSource answers BACKEND_NOT_IMPLEMENTED.
func TestServeReplicationRefused(t *testing.T) {
	sq := newReplSQLite(t, 2)
	model := replTestData(t, sq)
	c := startWriteCluster(t, sq, nil)
	c.send(&proto.NotifyPartitionChanges{PTid: 2, Changes: []proto.CellChange{{Offset: 0, NID: nodeNID, State: proto.OutOfDate}}})
	c.sync()
	cl := replPeer(t, c)
	wantError(t, "fetch of an out-of-date cell", cl.ask(&proto.AskFetchTransactions{Partition: 0, Length: 1000, MaxTid: proto.MaxTid}), proto.ReplicationError)
	wantError(t, "fetch of objects of an out-of-date cell", cl.ask(&proto.AskFetchObjects{Partition: 0, Length: 1000, MaxTid: proto.MaxTid}), proto.ReplicationError)
	wantError(t, "check of an out-of-date cell", cl.ask(&proto.AskCheckTIDRange{Partition: 0, Length: 1000, MaxTid: proto.MaxTid}), proto.CheckingError)
	wantError(t, "check of an out-of-date cell", cl.ask(&proto.AskCheckSerialRange{Partition: 0, Length: 1000, MaxTid: proto.MaxTid}), proto.CheckingError)
	wantError(t, "fetch of a partition that does not exist", cl.ask(&proto.AskFetchTransactions{Partition: 7, Length: 1000, MaxTid: proto.MaxTid}), proto.ReplicationError)
	// The other partition is served.
	ps := cl.ask(&proto.AskCheckTIDRange{Partition: 1, Length: 1000, MaxTid: proto.MaxTid})
	if a, ok := decodeArgs(t, ps[0]).(*proto.AnswerCheckTIDRange); !ok || a.Count != uint64(len(model.tids(1, 2, 0, proto.MaxTid))) {
		t.Errorf("check of partition 1: %+v", decodeArgs(t, ps[0]))
	}
	// FEEDING is readable.
	c.send(&proto.NotifyPartitionChanges{PTid: 3, Changes: []proto.CellChange{{Offset: 0, NID: nodeNID, State: proto.Feeding}}})
	c.sync()
	if ps := cl.ask(&proto.AskFetchTransactions{Partition: 0, Length: 1, MaxTid: proto.MaxTid}); len(ps) != 2 {
		t.Errorf("fetch of a feeding cell: %d packets, want 2", len(ps))
	}

	// A client is not a storage node.
	cli := c.client(-536870911)
	id := cli.send(&proto.AskFetchTransactions{Partition: 1, Length: 1000, MaxTid: proto.MaxTid})
	wantError(t, "fetch from a client", []proto.Packet{cli.expect(t, id, proto.CodeError)}, proto.ProtocolError)
	wantClosed(t, cli)

	// A backend that cannot be a source.
	c2 := startWriteCluster(t, newMemWriter(), nil)
	wantError(t, "fetch from a memWriter", replPeer(t, c2).ask(&proto.AskFetchTransactions{Partition: 0, Length: 1000, MaxTid: proto.MaxTid}), proto.BackendNotImplemented)
}

// wantClosed checks that the node closes cl's connection.
func wantClosed(t testing.TB, cl *testClient) {
	t.Helper()
	cl.l.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
	for range 10 {
		if _, err := cl.l.Recv(); err != nil {
			if !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "reset") {
				t.Errorf("connection not closed: %v", err)
			}
			return
		}
	}
	t.Error("connection not closed")
}

// TestServeReplicationLocked: a transaction locked but not yet unlocked
// delays a fetch of transactions (and a tid range check) that reaches it
// until its unlock, which then lists it; a fetch of objects (or a serial
// range check) reaching it is a protocol error, the link closed.
func TestServeReplicationLocked(t *testing.T) {
	sq := newReplSQLite(t, 1)
	model := replTestData(t, sq)
	tids := model.tids(0, 1, 0, proto.MaxTid)
	last := tids[len(tids)-1]
	c := startWriteCluster(t, sq, nil)
	cli := c.client(-536870911)
	ttid, tid := last+10, last+11
	if got := cli.storeAnswer(cli.store(ttid, 1000, 0, "locked")); got != proto.InvalidTid {
		t.Fatalf("store: conflict %s", got)
	}
	cli.vote(ttid, 1000)
	c.lock(ttid, tid)

	peer := replPeer(t, c)
	fetch := peer.send(&proto.AskFetchTransactions{Partition: 0, Length: 1000, MinTid: last, MaxTid: proto.MaxTid})
	check := peer.send(&proto.AskCheckTIDRange{Partition: 0, Length: 1000, MinTid: last, MaxTid: proto.MaxTid})
	// Below the locked tid: answered at once.
	if ps := peer.ask(&proto.AskCheckTIDRange{Partition: 0, Length: 1000, MinTid: 0, MaxTid: tid - 1}); decodeArgs(t, ps[0]).(*proto.AnswerCheckTIDRange).Count != uint64(len(tids)) {
		t.Errorf("check below the locked tid: %+v", decodeArgs(t, ps[0]))
	}
	peer.quiet("fetch and check up to a locked transaction")

	other := replPeer(t, c)
	wantError(t, "fetch of objects up to a locked transaction", other.ask(&proto.AskFetchObjects{Partition: 0, Length: 1000, MinTid: last, MaxTid: proto.MaxTid}), proto.ProtocolError)
	wantClosed(t, other)
	other = replPeer(t, c)
	wantError(t, "serial check up to a locked transaction", other.ask(&proto.AskCheckSerialRange{Partition: 0, Length: 1000, MinTid: last, MaxTid: proto.MaxTid}), proto.ProtocolError)
	wantClosed(t, other)

	c.unlock(ttid)
	var adds []zodb.Tid
	for {
		p := peer.expectFunc(t, func(p proto.Packet) bool { return p.ID == fetch }, "fetch")
		if p.Code != proto.CodeAddTransaction {
			break
		}
		adds = append(adds, decodeArgs(t, p).(*proto.AddTransaction).Tid)
	}
	if !slices.Equal(adds, []zodb.Tid{last, tid}) {
		t.Errorf("fetch after the unlock: %v, want [%s %s]", adds, last, tid)
	}
	if a := decodeArgs(t, peer.expect(t, check, proto.CodeAnswerCheckTIDRange)).(*proto.AnswerCheckTIDRange); a.Count != 2 || a.MaxTid != tid {
		t.Errorf("check after the unlock: %+v", a)
	}
}
