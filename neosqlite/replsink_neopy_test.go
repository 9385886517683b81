package neosqlite

import (
	"context"
	"crypto/sha1"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"os"
	osexec "os/exec"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// neopyReplSink applies replication ops with NEO/py's database manager the
// way its StorageOperationHandler does (addTransaction, addObject,
// answerFetchTransactions' and answerFetchObjects' deletions), then commits
// and dumps (as neopy_writes.py).
const neopyReplSink = `
import json, sqlite3, sys
from neo.lib.util import p64, u64
from neo.lib.protocol import ZERO_HASH
from neo.storage.database.sqlite import SQLiteDatabaseManager
dm = SQLiteDatabaseManager(sys.argv[1]); dm.setup(); dm._readable_set
res = []
for op in json.load(open(sys.argv[2])):
    k = op['op']
    try:
        if k == 'txn':
            dm.storeTransaction(p64(op['tid']), (), ([p64(x) for x in op['oids']],
                bytes.fromhex(op['user']), bytes.fromhex(op['desc']), bytes.fromhex(op['ext']),
                op['packed'], p64(op['ttid'])), False)
            if op.get('pack'):
                a, partial, oids, pt = op['pack']
                dm.storePackOrder(p64(op['tid']), a, partial, None if oids is None else [p64(x) for x in oids], p64(pt))
        elif k == 'obj':
            oid = p64(op['oid']); serial = p64(op['serial'])
            checksum = bytes.fromhex(op['checksum']); data = bytes.fromhex(op['data'])
            ds = op['data_serial']; ds = None if ds is None else p64(ds)
            if not data and checksum == ZERO_HASH:
                checksum = data = None
            data_id = dm.storeData(checksum, oid, data, op['compression'], ds)
            dm.storeTransaction(serial, ((oid, data_id, ds),), None, False)
        elif k == 'deltid':
            dm.deleteTransaction(p64(op['tid']))
        elif k == 'delobj':
            dm.deleteObject(p64(op['oid']), p64(op['serial']))
        elif k == 'commit':
            dm.commit()
        res.append(None)
    except Exception as e:
        dm.rollback() if hasattr(dm, 'rollback') else None
        res.append(type(e).__name__)
dm.commit()
c = sqlite3.connect(sys.argv[1])
out = {'results': res}
for t in ('pack', 'trans', 'obj', 'data'):
    rows = []
    for r in c.execute('SELECT * FROM ' + t):
        rows.append([('x:' + bytes(v).hex()) if isinstance(v, (bytes, memoryview)) else v for v in r])
    rows.sort(key=lambda r: json.dumps(r))
    out[t] = rows
json.dump(out, open(sys.argv[3], 'w'))
`

// neopyReplOp is one replication op, for both sides.
type neopyReplOp struct {
	Op          string  `json:"op"`
	Tid         uint64  `json:"tid,omitempty"`
	TTid        uint64  `json:"ttid,omitempty"`
	Oids        []int   `json:"oids"`
	User        string  `json:"user"`
	Desc        string  `json:"desc"`
	Ext         string  `json:"ext"`
	Packed      bool    `json:"packed"`
	Pack        []any   `json:"pack,omitempty"`
	Oid         uint64  `json:"oid,omitempty"`
	Serial      uint64  `json:"serial,omitempty"`
	Checksum    string  `json:"checksum"`
	Data        string  `json:"data"`
	Compression int     `json:"compression"`
	DataSerial  *uint64 `json:"data_serial"`
}

// neopyReplReplObject is what replicator.fetchObjects makes of an AddObject
// (storage.Object), as sqlitebackend passes it on.
func neopyReplReplObject(oid zodb.Oid, serial zodb.Tid, compression uint8, checksum [20]byte, data []byte, dataSerial zodb.Tid) ReplObject {
	ro := ReplObject{Oid: oid, Serial: serial, Compression: compression, Checksum: checksum, DataSerial: dataSerial}
	if len(data) == 0 && checksum == ([20]byte{}) {
		ro.NoData = ro.DataSerial == 0
	} else {
		ro.Data = append([]byte{}, data...) // keep: never nil
	}
	return ro
}

func neopyReplRun(t *testing.T, dedup bool, steps [][]neopyReplOp) {
	py := os.Getenv("NEOPY_PYTHON")
	if _, err := os.Stat(py); err != nil {
		t.Skip("no NEO/py venv")
	}
	if _, err := os.Stat(filepath.Join(os.Getenv("NEOPY_SRC"), "neo")); err != nil {
		t.Skip("no NEO/py")
	}
	ctx := context.Background()
	db, path := newReplTarget(t, 3, 0)
	if dedup {
		db.Close()
		sdb, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err = sdb.Exec("CREATE UNIQUE INDEX _data_i1 ON data(hash, compression)"); err != nil {
			t.Fatal(err)
		}
		sdb.Close()
		if db, err = OpenWriter(ctx, path); err != nil {
			t.Fatal(err)
		}
	}
	// NEO/py's copy, before any write.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	theirs := filepath.Join(dir, "neopy.sqlite")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(theirs, b, 0o644)
	db, err = OpenWriter(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	var all []neopyReplOp
	var gres []any
	for _, step := range steps {
		var batch ReplBatch
		for _, op := range step {
			all = append(all, op)
			switch op.Op {
			case "txn":
				rt := ReplTxn{Tid: zodb.Tid(op.Tid), TTid: zodb.Tid(op.TTid), User: neopyReplUnhexA(op.User), Description: neopyReplUnhexA(op.Desc), Extension: neopyReplUnhexA(op.Ext), Packed: op.Packed}
				for _, o := range op.Oids {
					rt.Oids = append(rt.Oids, zodb.Oid(o))
				}
				if op.Pack != nil {
					rp := &ReplPack{Approved: -1, PackTid: zodb.Tid(op.Pack[3].(uint64))}
					if a, ok := op.Pack[0].(bool); ok {
						rp.Approved = 0
						if a {
							rp.Approved = 1
						}
					}
					rp.Partial = op.Pack[1].(bool)
					if l, ok := op.Pack[2].([]int); ok {
						rp.Oids = []zodb.Oid{}
						for _, o := range l {
							rp.Oids = append(rp.Oids, zodb.Oid(o))
						}
					}
					rt.Pack = rp
				}
				batch.Txns = append(batch.Txns, rt)
			case "obj":
				var cs [20]byte
				copy(cs[:], neopyReplUnhexA(op.Checksum))
				ds := zodb.Tid(0)
				if op.DataSerial != nil {
					ds = zodb.Tid(*op.DataSerial)
				}
				batch.Objects = append(batch.Objects, neopyReplReplObject(zodb.Oid(op.Oid), zodb.Tid(op.Serial), uint8(op.Compression), cs, neopyReplUnhexA(op.Data), ds))
			case "deltid":
				batch.DeleteTids = append(batch.DeleteTids, zodb.Tid(op.Tid))
			case "delobj":
				batch.DeleteObjs = append(batch.DeleteObjs, SerialOid{Serial: zodb.Tid(op.Serial), Oid: zodb.Oid(op.Oid)})
			}
		}
		all = append(all, neopyReplOp{Op: "commit"})
		if err := db.StoreReplicated(ctx, &batch); err != nil {
			gres = append(gres, err.Error())
		} else {
			gres = append(gres, nil)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	got := dumpTables(t, path)

	ob, _ := json.Marshal(all)
	opsPath := filepath.Join(dir, "ops.json")
	os.WriteFile(opsPath, ob, 0o644)
	script := filepath.Join(dir, "sink.py")
	os.WriteFile(script, []byte(neopyReplSink), 0o644)
	outPath := filepath.Join(dir, "out.json")
	cmd := osexec.Command(py, script, theirs, opsPath, outPath)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+os.Getenv("NEOPY_SRC"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("neopy: %v\n%s", err, out)
	}
	wb, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	want := decodeJSON(t, wb).(map[string]any)
	t.Logf("go results %v, neopy results %v", gres, want["results"])
	for _, tab := range []string{"pack", "trans", "obj", "data"} {
		g, w := normJSON(t, got[tab]), want[tab]
		if !neopyReplJsonEqual(g, w) {
			gb, _ := json.Marshal(g)
			wb, _ := json.Marshal(w)
			t.Errorf("table %s differs from NEO/py's:\n go:    %s\n neopy: %s", tab, gb, wb)
		}
	}
}

func neopyReplJsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func neopyReplUnhexA(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	if b == nil {
		b = []byte{}
	}
	return b
}

func neopyReplHex(b []byte) string { return hex.EncodeToString(b) }

func neopyReplSum(s string) string { x := sha1.Sum([]byte(s)); return neopyReplHex(x[:]) }

func neopyReplU64p(x uint64) *uint64 { return &x }

const neopyReplAT = uint64(0x0300000000000000)

// TestReplSinkVsNeopy: records as a source sends them (data,
// compressed, empty data, deletion, undo with and without the revision
// here, undo of a deletion), pack orders, then deletions, in steps.
func TestReplSinkVsNeopy(t *testing.T) {
	for _, dedup := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "dedup"}[dedup], func(t *testing.T) {
			zero := neopyReplHex(make([]byte, 20))
			neopyReplRun(t, dedup, [][]neopyReplOp{
				{
					{Op: "txn", Tid: neopyReplAT, TTid: neopyReplAT - 1, Oids: []int{1, 2, 3}, User: neopyReplHex([]byte("u")), Desc: "", Ext: neopyReplHex([]byte("e"))},
					{Op: "txn", Tid: neopyReplAT + 1, TTid: neopyReplAT, Oids: []int{1}, Pack: []any{true, false, nil, neopyReplAT}},
					{Op: "txn", Tid: neopyReplAT + 2, TTid: neopyReplAT + 2, Oids: []int{4}, Packed: true, Pack: []any{nil, true, []int{}, neopyReplAT + 1}},
					{Op: "obj", Oid: 1, Serial: neopyReplAT, Checksum: neopyReplSum("a"), Data: neopyReplHex([]byte("a"))},
					{Op: "obj", Oid: 2, Serial: neopyReplAT, Checksum: neopyReplSum("a"), Data: neopyReplHex([]byte("a"))},
					{Op: "obj", Oid: 3, Serial: neopyReplAT, Checksum: neopyReplSum(""), Data: ""},
					{Op: "obj", Oid: 4, Serial: neopyReplAT, Checksum: neopyReplSum("a"), Data: neopyReplHex([]byte("a")), Compression: 1},
					{Op: "obj", Oid: 1, Serial: neopyReplAT + 1, Checksum: zero, Data: ""},                                                                                 // deletion
					{Op: "obj", Oid: 1, Serial: neopyReplAT + 2, Checksum: neopyReplSum("a"), Data: neopyReplHex([]byte("a")), DataSerial: neopyReplU64p(neopyReplAT)},     // undo, revision here
					{Op: "obj", Oid: 1, Serial: neopyReplAT + 3, Checksum: zero, Data: "", DataSerial: neopyReplU64p(neopyReplAT + 1)},                                     // undo to the deletion
					{Op: "obj", Oid: 7, Serial: neopyReplAT + 3, Checksum: neopyReplSum("b"), Data: neopyReplHex([]byte("b")), DataSerial: neopyReplU64p(neopyReplAT - 9)}, // undo, revision gone
					{Op: "obj", Oid: 8, Serial: neopyReplAT + 3, Checksum: zero, Data: "", DataSerial: neopyReplU64p(neopyReplAT - 9)},                                     // undo to a deletion gone
					{Op: "obj", Oid: 9, Serial: neopyReplAT + 3, Checksum: neopyReplSum(""), Data: "", DataSerial: neopyReplU64p(neopyReplAT - 9)},                         // undo to empty data, gone
				},
				{
					{Op: "deltid", Tid: neopyReplAT + 1},
					{Op: "delobj", Oid: 2, Serial: neopyReplAT},
					{Op: "delobj", Oid: 1, Serial: neopyReplAT},
					{Op: "delobj", Oid: 5, Serial: neopyReplAT},
				},
			})
		})
	}
}
