package storage_test

import (
	"bytes"
	"context"
	"crypto/sha1"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zodb"
)

// neopyServeScript is NEO/py's source side of replication (handlers/storage.py
// askFetchTransactions, askFetchObjects, askCheckTIDRange,
// askCheckSerialRange), run with NEO/py's SQLiteDatabaseManager on a copy
// of the database the Go node serves. Requests in, packets out (JSON).
const neopyServeScript = `
import json, sys
from neo.lib.util import p64, u64
from neo.lib.protocol import ZERO_HASH
from neo.storage.database.sqlite import SQLiteDatabaseManager
dm = SQLiteDatabaseManager(sys.argv[1]); dm.setup(); dm._readable_set
def h(b): return None if b is None else bytes(b).hex()
def t(x): return None if x is None else str(u64(x))
out = []
for r in json.load(open(sys.argv[2])):
    k = r['kind']; P = r['partition']; L = r['length']
    mn = p64(int(r['min'])); mx = p64(int(r['max']))
    pk = []
    if k == 'txn':
        peer = set(p64(int(x)) for x in r['known'])
        comp = dm.getPackedIDs()[P] if r['pack'] else None
        tl = dm.getReplicationTIDList(mn, mx, L + 1, P)
        nxt = tl.pop() if L < len(tl) else None
        for tid in tl:
            if tid in peer:
                peer.remove(tid); continue
            oids, user, desc, ext, packed, ttid, pack = dm.getTransaction(tid)
            pk.append(['AddTransaction', t(tid), h(user), h(desc), h(ext), bool(packed), t(ttid),
                [t(o) for o in oids], None if pack is None else
                [pack[0], pack[1], None if pack[2] is None else [t(o) for o in pack[2]], t(pack[3])]])
        pk.append(['AnswerFetchTransactions', t(nxt), sorted(t(x) for x in peer), t(comp)])
    elif k == 'obj':
        od = {}
        for s, oids in r['known']:
            od[p64(int(s))] = tuple(p64(int(o)) for o in oids)
        ol = dm.getReplicationObjectList(mn, mx, L + 1, P, p64(int(r['minoid'])))
        if L < len(ol):
            nt, no = ol.pop()
        else:
            nt = no = None
        for serial, oid in ol:
            oid_set = od.get(serial)
            if oid_set:
                if type(oid_set) is tuple:
                    od[serial] = oid_set = set(oid_set)
                if oid in oid_set:
                    oid_set.remove(oid)
                    if not oid_set:
                        del od[serial]
                    continue
            o = dm.fetchObject(oid, serial)
            if not o:
                pk.append(['Error']); break
            if not o[2]:
                o = o[0], 0, ZERO_HASH, b'', o[4]
            pk.append(['AddObject', t(oid), t(o[0]), o[1], h(o[2]), h(o[3]), t(o[4])])
        else:
            pk.append(['AnswerFetchObjects', t(nt), t(no),
                sorted([t(s), sorted(t(o) for o in oids)] for s, oids in od.items())])
    elif k == 'ctid':
        c, s, m = dm.checkTIDRange(P, L, mn, mx)
        pk.append(['AnswerCheckTIDRange', c, h(s), t(m)])
    elif k == 'cser':
        c, s, m, s2, m2 = dm.checkSerialRange(P, L, mn, mx, p64(int(r['minoid'])))
        pk.append(['AnswerCheckSerialRange', c, h(s), t(m), h(s2), t(m2)])
    out.append(pk)
json.dump(out, open(sys.argv[3], 'w'))
`

// neopyReplReq is one request for both sides.
type neopyReplReq struct {
	Kind      string     `json:"kind"`
	Partition uint32     `json:"partition"`
	Length    int        `json:"length"`
	Min       string     `json:"min"`
	Max       string     `json:"max"`
	MinOid    string     `json:"minoid"`
	Pack      bool       `json:"pack"`
	known     []zodb.Tid // for Go
	knownObj  []proto.SerialOids
}

func (r neopyReplReq) MarshalJSON() ([]byte, error) {
	m := map[string]any{"kind": r.Kind, "partition": r.Partition, "length": r.Length, "min": r.Min, "max": r.Max,
		"minoid": r.MinOid, "pack": r.Pack}
	switch r.Kind {
	case "txn":
		k := []string{}
		for _, t := range r.known {
			k = append(k, neopyReplU64s(uint64(t)))
		}
		m["known"] = k
	case "obj":
		k := [][]any{}
		for _, e := range r.knownObj {
			oids := []string{}
			for _, o := range e.Oids {
				oids = append(oids, neopyReplU64s(uint64(o)))
			}
			k = append(k, []any{neopyReplU64s(uint64(e.Serial)), oids})
		}
		m["known"] = k
	}
	return json.Marshal(m)
}

func neopyReplU64s(x uint64) string { return json.Number(neopyReplFmtU(x)).String() }

func neopyReplFmtU(x uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + x%10)
		x /= 10
		if x == 0 {
			break
		}
	}
	return string(b[i:])
}

func neopyReplTid(t zodb.Tid) any {
	if t == proto.InvalidTid {
		return nil
	}
	return neopyReplFmtU(uint64(t))
}

func neopyReplOid(o zodb.Oid) any {
	if o == proto.InvalidOid {
		return nil
	}
	return neopyReplFmtU(uint64(o))
}

func neopyReplHex(b []byte) any { return hex.EncodeToString(b) }

// neopyReplGo turns the packets the Go node sent into NEO/py script's terms.
func neopyReplGo(t *testing.T, ps []proto.Packet) []any {
	var r []any
	for _, p := range ps {
		switch m := decodeArgs(t, p).(type) {
		case *proto.AddTransaction:
			oids := []any{}
			for _, o := range m.Oids {
				oids = append(oids, neopyReplOid(o))
			}
			var pack any
			if m.Pack != nil {
				var appr any
				if m.Pack.ApprovedSet {
					appr = m.Pack.Approved
				}
				var poids any
				if m.Pack.OidsSet {
					l := []any{}
					for _, o := range m.Pack.Oids {
						l = append(l, neopyReplOid(o))
					}
					poids = l
				}
				pack = []any{appr, m.Pack.Partial, poids, neopyReplTid(m.Pack.PackTid)}
			}
			r = append(r, []any{"AddTransaction", neopyReplTid(m.Tid), neopyReplHex(m.User), neopyReplHex(m.Description), neopyReplHex(m.Extension), m.Packed, neopyReplTid(m.TTid), oids, pack})
		case *proto.AnswerFetchTransactions:
			del := []string{}
			for _, x := range m.TidsToDelete {
				del = append(del, neopyReplFmtU(uint64(x)))
			}
			sort.Strings(del)
			r = append(r, []any{"AnswerFetchTransactions", neopyReplTid(m.NextTid), del, neopyReplTid(m.CompletedPack)})
		case *proto.AddObject:
			r = append(r, []any{"AddObject", neopyReplOid(m.Oid), neopyReplTid(m.Serial), m.Compression, neopyReplHex(m.Checksum[:]), neopyReplHex(m.Data), neopyReplTid(m.DataSerial)})
		case *proto.AnswerFetchObjects:
			d := [][]any{}
			for _, e := range m.ObjectDict {
				oids := []string{}
				for _, o := range e.Oids {
					oids = append(oids, neopyReplFmtU(uint64(o)))
				}
				sort.Strings(oids)
				d = append(d, []any{neopyReplFmtU(uint64(e.Serial)), oids})
			}
			sort.Slice(d, func(i, j int) bool { return d[i][0].(string) < d[j][0].(string) })
			r = append(r, []any{"AnswerFetchObjects", neopyReplTid(m.NextTid), neopyReplOid(m.NextOid), d})
		case *proto.AnswerCheckTIDRange:
			r = append(r, []any{"AnswerCheckTIDRange", m.Count, neopyReplHex(m.Checksum[:]), neopyReplTid(m.MaxTid)})
		case *proto.AnswerCheckSerialRange:
			r = append(r, []any{"AnswerCheckSerialRange", m.Count, neopyReplHex(m.TidChecksum[:]), neopyReplTid(m.MaxTid), neopyReplHex(m.OidChecksum[:]), neopyReplOid(m.MaxOid)})
		case *proto.Error:
			r = append(r, []any{"Error"})
		default:
			t.Fatalf("unexpected %T", m)
		}
	}
	return r
}

// normalize round-trips v through JSON (numbers as json.Number; the
// Python side sorts its lists of strings the same way).
func neopyReplNorm(t *testing.T, v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var r any
	if err := d.Decode(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

func neopyReplPython(t *testing.T) string {
	py := os.Getenv("NEOPY_PYTHON")
	if _, err := os.Stat(py); err != nil {
		t.Skip("no NEO/py venv")
	}
	if _, err := os.Stat(filepath.Join(os.Getenv("NEOPY_SRC"), "neo")); err != nil {
		t.Skip("no NEO/py source")
	}
	return py
}

// neopyReplData commits replTestData plus edge cases: a pack order, an undo
// of a deletion (value_tid pointing at a record without data), records at
// boundary oids.
func neopyReplData(t *testing.T, be storage.Writer, packs bool) {
	ctx := context.Background()
	replTestData(t, be)
	base := replTestBase + 0x1000000
	commit := func(tid zodb.Tid, objs []storage.VotedObject, oids []zodb.Oid, pack *proto.PackRequest) {
		vt := &storage.VotedTxn{TTid: tid, Meta: &storage.TxnMeta{User: []byte("u"), Oids: oids}, Objects: objs}
		var err error
		if pack != nil && !packs {
			pack = nil
		}
		if pack != nil {
			err = be.(*sqlitebackend.Backend).VotePack(ctx, vt, pack)
		} else {
			err = be.Vote(ctx, vt)
		}
		if err != nil {
			t.Fatal(err)
		}
		if pack != nil {
			err = be.(*sqlitebackend.Backend).LockPack(ctx, tid, tid, true)
		} else {
			err = be.Lock(ctx, tid, tid)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := be.Unlock(ctx, tid, tid); err != nil {
			t.Fatal(err)
		}
	}
	// oid 100: created, deleted, then an undo pointing at the deletion.
	commit(base, []storage.VotedObject{{Oid: 100, Data: []byte("x"), Checksum: neopyReplSha1x("x")}}, []zodb.Oid{100}, nil)
	commit(base+1, []storage.VotedObject{{Oid: 100, NoData: true}}, []zodb.Oid{100}, nil)
	commit(base+2, []storage.VotedObject{{Oid: 100, DataSerial: base + 1}}, []zodb.Oid{100}, nil)
	// empty data, and a pack order (partial, then full).
	empty := storage.VotedObject{Oid: 101, Data: []byte{}, Checksum: neopyReplSha1x("")}
	if !packs { // FileStorage: no empty data
		empty = storage.VotedObject{Oid: 101, Data: []byte("y"), Checksum: neopyReplSha1x("y")}
	}
	commit(base+3, []storage.VotedObject{empty}, []zodb.Oid{101}, &proto.PackRequest{PackTid: base, Oids: []zodb.Oid{100}, OidsSet: true})
	commit(base+4, nil, nil, &proto.PackRequest{PackTid: base + 1})
}

func TestReplServeVsNeopy(t *testing.T) {
	neopyReplServe(t, 3, nil)
}

// TestReplServeFS1VsNeopy: a FileStorage node (one partition) serves
// the same data as NEO/py serves from SQLite.
func TestReplServeFS1VsNeopy(t *testing.T) {
	fs := newReplFS1(t)
	neopyReplData(t, fs, false)
	neopyReplServe(t, 1, fs)
}

func neopyReplServe(t *testing.T, np uint32, server storage.Backend) {
	neopyReplServeWith(t, np, server, func(be *sqlitebackend.Backend) { neopyReplData(t, be, server == nil) }, nil)
}

func neopyReplServeWith(t *testing.T, np uint32, server storage.Backend, fill func(*sqlitebackend.Backend), lengths []int) {
	py := neopyReplPython(t)
	ctx := context.Background()
	be := newReplSQLite(t, int(np))
	fill(be)
	path := be.Path()
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	theirs := filepath.Join(dir, "neopy.sqlite")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(theirs, b, 0o644); err != nil {
		t.Fatal(err)
	}
	be2, err := sqlitebackend.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be2.Close() })

	// Every tid and record of each partition.
	var reqs []neopyReplReq
	str := func(x uint64) string { return neopyReplFmtU(x) }
	maxT := str(uint64(proto.MaxTid))
	for p := uint32(0); p < np; p++ {
		tids, err := be2.ReplicationTIDs(ctx, p, np, 0, proto.MaxTid, 1<<20, nil)
		if err != nil {
			t.Fatal(err)
		}
		recs, err := be2.ReplicationRecords(ctx, p, np, 0, proto.MaxTid, 0, 1<<20, nil)
		if err != nil {
			t.Fatal(err)
		}
		n, nr := len(tids), len(recs)
		mid := tids[n/2]
		rmid := recs[nr/2]
		ls := append([]int{0, 1, n - 1, n, n + 1, 1000}, lengths...)
		for _, l := range ls {
			reqs = append(reqs,
				neopyReplReq{Kind: "txn", Partition: p, Length: l, Min: "0", Max: maxT, Pack: true, known: []zodb.Tid{tids[0], tids[n-1], 5}},
				neopyReplReq{Kind: "ctid", Partition: p, Length: l, Min: "0", Max: maxT},
				neopyReplReq{Kind: "ctid", Partition: p, Length: l, Min: str(uint64(mid)), Max: str(uint64(tids[n-1]))},
				neopyReplReq{Kind: "ctid", Partition: p, Length: l, Min: str(uint64(mid) + 1), Max: str(uint64(mid))},
			)
		}
		ls = append([]int{0, 1, nr - 1, nr, nr + 1, 1000}, lengths...)
		for _, l := range ls {
			reqs = append(reqs,
				neopyReplReq{Kind: "obj", Partition: p, Length: l, Min: "0", Max: maxT, MinOid: "0",
					knownObj: []proto.SerialOids{{Serial: recs[0].Serial, Oids: []zodb.Oid{recs[0].Oid, 999}}, {Serial: recs[nr-1].Serial, Oids: []zodb.Oid{recs[nr-1].Oid}}, {Serial: 7, Oids: []zodb.Oid{3}}, {Serial: 8, Oids: []zodb.Oid{}}}},
				neopyReplReq{Kind: "obj", Partition: p, Length: l, Min: str(uint64(rmid.Serial)), Max: maxT, MinOid: str(uint64(rmid.Oid))},
				neopyReplReq{Kind: "obj", Partition: p, Length: l, Min: str(uint64(rmid.Serial)), Max: str(uint64(rmid.Serial)), MinOid: str(uint64(rmid.Oid) + 1)},
				neopyReplReq{Kind: "cser", Partition: p, Length: l, Min: "0", Max: maxT, MinOid: "0"},
				neopyReplReq{Kind: "cser", Partition: p, Length: l, Min: str(uint64(rmid.Serial)), Max: maxT, MinOid: str(uint64(rmid.Oid))},
				neopyReplReq{Kind: "cser", Partition: p, Length: l, Min: str(uint64(rmid.Serial)), Max: str(uint64(rmid.Serial) - 1), MinOid: "0"},
			)
		}
	}
	if len(lengths) > 0 {
		// The node serves a fetch in chunks of at most replChunk
		// (documented; a NEO/py replicator asks 1000): only the checks
		// are compared past it.
		kept := reqs[:0]
		for _, r := range reqs {
			if (r.Kind == "txn" || r.Kind == "obj") && r.Length > 10000 {
				continue
			}
			kept = append(kept, r)
		}
		reqs = kept
	}
	rb, _ := json.Marshal(reqs)
	reqPath := filepath.Join(dir, "reqs.json")
	outPath := filepath.Join(dir, "out.json")
	scriptPath := filepath.Join(dir, "serve.py")
	os.WriteFile(reqPath, rb, 0o644)
	os.WriteFile(scriptPath, []byte(neopyServeScript), 0o644)
	cmd := osexec.Command(py, scriptPath, theirs, reqPath, outPath)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+os.Getenv("NEOPY_SRC"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("neopy: %v\n%s", err, out)
	}
	ob, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(ob))
	d.UseNumber()
	var want []any
	if err := d.Decode(&want); err != nil {
		t.Fatal(err)
	}

	if server == nil {
		server = be2
	}
	c := startWriteCluster(t, server, nil)
	cl := replPeer(t, c)
	u := func(s string) uint64 {
		var x uint64
		for _, ch := range s {
			x = x*10 + uint64(ch-'0')
		}
		return x
	}
	fails := 0
	for i, r := range reqs {
		var m proto.Msg
		switch r.Kind {
		case "txn":
			m = &proto.AskFetchTransactions{Partition: r.Partition, Length: uint32(r.Length), MinTid: zodb.Tid(u(r.Min)), MaxTid: zodb.Tid(u(r.Max)), KnownTids: r.known, AskPackInfo: r.Pack}
		case "obj":
			m = &proto.AskFetchObjects{Partition: r.Partition, Length: uint32(r.Length), MinTid: zodb.Tid(u(r.Min)), MaxTid: zodb.Tid(u(r.Max)), MinOid: zodb.Oid(u(r.MinOid)), ObjectDict: r.knownObj}
		case "ctid":
			m = &proto.AskCheckTIDRange{Partition: r.Partition, Length: uint32(r.Length), MinTid: zodb.Tid(u(r.Min)), MaxTid: zodb.Tid(u(r.Max))}
		case "cser":
			m = &proto.AskCheckSerialRange{Partition: r.Partition, Length: uint32(r.Length), MinTid: zodb.Tid(u(r.Min)), MaxTid: zodb.Tid(u(r.Max)), MinOid: zodb.Oid(u(r.MinOid))}
		}
		got := neopyReplNorm(t, neopyReplGo(t, cl.ask(m)))
		w := neopyReplNorm(t, want[i])
		if !reflect.DeepEqual(got, w) {
			fails++
			if fails <= 8 {
				gl, wl := got.([]any), w.([]any)
				j := 0
				for j < len(gl) && j < len(wl) && reflect.DeepEqual(gl[j], wl[j]) {
					j++
				}
				var ge, we any
				if j < len(gl) {
					ge = gl[j]
				}
				if j < len(wl) {
					we = wl[j]
				}
				gb, _ := json.Marshal(ge)
				wb, _ := json.Marshal(we)
				t.Errorf("request %d %+v: %d/%d packets, first difference at %d:\n go:    %.600s\n neopy: %.600s", i, r, len(gl), len(wl), j, gb, wb)
			}
		}
	}
	t.Logf("compared %d requests", len(reqs))
	if fails > 0 {
		t.Errorf("%d of %d requests answered differently from NEO/py", fails, len(reqs))
	}
}

func neopyReplSha1x(s string) [20]byte { return sha1.Sum([]byte(s)) }

// TestReplServeLargeVsNeopy: checks and fetches over more than the
// node's chunk (replChunk, 10000) of tids and records, lengths around it.
func TestReplServeLargeVsNeopy(t *testing.T) {
	neopyReplServeWith(t, 2, nil, func(be *sqlitebackend.Backend) {
		var b storage.ReplBatch
		for i := range 25003 {
			tid := replTestBase + zodb.Tid(i/2)*7 + zodb.Tid(i%2)
			b.Txns = append(b.Txns, storage.ReplTxn{TxnInfo: storage.TxnInfo{Tid: tid, Oids: []zodb.Oid{zodb.Oid(i % 5)}}, TTid: tid})
			for k := range 2 + i%3 {
				d := []byte{byte(i), byte(k)}
				b.Objects = append(b.Objects, storage.Object{Oid: zodb.Oid(i%7 + 7*k), Serial: tid, Data: d, Checksum: sha1.Sum(d)})
			}
		}
		if err := be.StoreReplicated(context.Background(), &b); err != nil {
			t.Fatal(err)
		}
	}, []int{9999, 10000, 10001, 20000, 20001, 40000})
}

// TestReplFS1UndoToDeletion: a record whose undo points at a
// deletion (NEO's obj row data_id NULL, value_tid set) goes out from a
// FileStorage node with data_serial; NEO/py's source sends value_tid
// there (fetchObject: (serial, 0, ZERO_HASH, b”, value_tid)), and a
// replica stores it as value_tid.
func TestReplFS1UndoToDeletion(t *testing.T) {
	ctx := context.Background()
	fs := newReplFS1(t)
	neopyReplData(t, fs, false)
	base := replTestBase + 0x1000000
	var o storage.Object
	if err := fs.ReplicationObject(ctx, 100, base+2, &o); err != nil {
		t.Fatal(err)
	}
	if !o.NoData || o.DataSerial != base+1 {
		t.Errorf("oid 100 @%s (undo to the deletion at %s): NoData %v, DataSerial %s; want NoData, DataSerial %s", base+2, base+1, o.NoData, o.DataSerial, base+1)
	}
}

// TestReplEndToEnd: node B replicates the 3 partitions of node A
// (SQLite, data with undo records, an undo to a deletion, deletions,
// compressed and empty data); B's rows must then be A's (trans, pack,
// obj with value_tid and the data each row points to).
func TestReplEndToEnd(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pathA := filepath.Join(dir, "a.db")
	if err := neosqlite.Create(pathA, neosqlite.CreateOptions{Name: "replfault"}); err != nil {
		t.Fatal(err)
	}
	be, err := sqlitebackend.Open(ctx, pathA)
	if err != nil {
		t.Fatal(err)
	}
	if err := be.SetIdentity(ctx, "replfault", nodeNID); err != nil {
		t.Fatal(err)
	}
	var cells []storage.Cell
	for p := range 3 {
		cells = append(cells, storage.Cell{Partition: uint32(p), NID: nodeNID, State: proto.UpToDate})
	}
	if err := be.SetPartitionTable(ctx, 1, 1, cells, true, 0); err != nil {
		t.Fatal(err)
	}
	neopyReplData(t, be, false)
	tid := replTestBase + 0x2000000
	d := []byte{}
	if err := be.Vote(ctx, &storage.VotedTxn{TTid: tid, Meta: &storage.TxnMeta{Oids: []zodb.Oid{102}}, Objects: []storage.VotedObject{{Oid: 102, Data: d, Checksum: sha1.Sum(d)}}}); err != nil {
		t.Fatal(err)
	}
	if err := be.Lock(ctx, tid, tid); err != nil {
		t.Fatal(err)
	}
	if err := be.Unlock(ctx, tid, tid); err != nil {
		t.Fatal(err)
	}
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}

	m := replStartMaster(t, 3)
	replStartNode(t, ctx, m, pathA, "")
	select {
	case <-m.Running():
	case <-time.After(20 * time.Second):
		t.Fatal("cluster did not start")
	}
	pathB := filepath.Join(dir, "b.db")
	b := replStartNode(t, ctx, m, pathB, "")
	replJoin(t, m, b)
	if err := m.Tweak(); err != nil {
		t.Fatal(err)
	}
	nidB := b.NID()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n := 0
		for p := range 3 {
			if st, ok := replCell(m.PartitionTable(), p, nidB); ok && st == proto.UpToDate {
				n++
			}
		}
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("B did not replicate its 3 partitions")
		}
	}
	rows := func(path string) map[string][]string {
		db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		r := map[string][]string{}
		for name, q := range map[string]string{
			"trans": "SELECT partition, tid, packed, hex(oids), hex(user), hex(description), hex(ext), ttid FROM trans ORDER BY tid",
			"pack":  "SELECT tid, approved, partial, hex(oids), pack_tid FROM pack ORDER BY tid",
			"obj": "SELECT o.partition, o.oid, o.tid, o.value_tid, o.data_id IS NULL, d.compression, hex(d.hash), hex(d.value)" +
				" FROM obj o LEFT JOIN data d ON o.data_id=d.id ORDER BY o.partition, o.oid, o.tid",
		} {
			rs, err := db.Query(q)
			if err != nil {
				t.Fatal(err)
			}
			cols, _ := rs.Columns()
			for rs.Next() {
				v := make([]any, len(cols))
				ptr := make([]any, len(cols))
				for i := range v {
					ptr[i] = &v[i]
				}
				if err := rs.Scan(ptr...); err != nil {
					t.Fatal(err)
				}
				r[name] = append(r[name], fmt.Sprint(v...))
			}
			rs.Close()
		}
		return r
	}
	ra, rb := rows(pathA), rows(pathB)
	for _, name := range []string{"trans", "pack", "obj"} {
		if !reflect.DeepEqual(ra[name], rb[name]) {
			for i := range max(len(ra[name]), len(rb[name])) {
				var x, y string
				if i < len(ra[name]) {
					x = ra[name][i]
				}
				if i < len(rb[name]) {
					y = rb[name][i]
				}
				if x != y {
					t.Errorf("%s row %d: source %q, replica %q", name, i, x, y)
				}
			}
		}
	}
	t.Logf("compared %d trans, %d obj rows", len(ra["trans"]), len(ra["obj"]))
}
