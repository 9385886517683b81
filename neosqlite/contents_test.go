package neosqlite

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// The fixtures are copies of NEO/py test vectors (testdata/neo at the
// repository root, README.md there): storage.sqlite (run p1
// after p1-read) and db/*.sqlite, each with the .contents.json that lists
// every row it holds, and client-results/*.json (what the NEO/py client
// returned). See testdata/neo/README.md.

var fixtures = []struct {
	name, db, contents string
}{
	{"p1", "testdata/storage.sqlite", "testdata/storage.sqlite.contents.json"},
	{"p2-unfinished", "testdata/db/p2-unfinished.sqlite", "testdata/db/p2-unfinished.contents.json"},
	{"repl-s1", "testdata/db/repl-s1.sqlite", "testdata/db/repl-s1.contents.json"},
	{"repl-s2", "testdata/db/repl-s2.sqlite", "testdata/db/repl-s2.contents.json"},
}

type contents struct {
	Config map[string]string `json:"config"`
	PT     []struct {
		Partition uint32 `json:"partition"`
		Nid       int32  `json:"nid"`
		TidColumn int64  `json:"tid_column"`
		Pack      *int64 `json:"pack"`
	} `json:"pt"`
	Trans  []transRow `json:"trans"`
	TTrans []transRow `json:"ttrans"`
	Data   []struct {
		DataID int64 `json:"data_id"`
		HashOK bool  `json:"hash_ok"`
	} `json:"data"`
	Obj  []objJSON `json:"obj"`
	TObj []objJSON `json:"tobj"`
	Pack []struct {
		Tid      string  `json:"tid"`
		Approved *int    `json:"approved"`
		Partial  int     `json:"partial"`
		OidsHex  *string `json:"oids_hex"`
		PackTid  string  `json:"pack_tid"`
	} `json:"pack"`
}

type transRow struct {
	Partition   uint32   `json:"partition"`
	Tid         string   `json:"tid"`
	TTid        string   `json:"ttid"`
	Packed      int      `json:"packed"`
	Oids        []string `json:"oids"`
	User        string   `json:"user"`
	Description string   `json:"description"`
	ExtHex      string   `json:"ext_hex"`
}

type objJSON struct {
	Partition   uint32  `json:"partition"`
	Oid         string  `json:"oid"`
	Tid         string  `json:"tid"`
	DataID      *int64  `json:"data_id"`
	ValueTid    *string `json:"value_tid"`
	Hash        *string `json:"hash"`
	Compression *int    `json:"compression"`
	StoredLen   *int    `json:"stored_len"`
	RawLen      *int    `json:"raw_len"`
	RawSha1     *string `json:"raw_sha1"`
}

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func tid(t testing.TB, s string) zodb.Tid {
	t.Helper()
	v, err := zodb.ParseTid(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func oid(t testing.TB, s string) zodb.Oid {
	t.Helper()
	v, err := zodb.ParseOid(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func openT(t testing.TB, path string) *DB {
	t.Helper()
	db, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func sha1hex(b []byte) string {
	s := sha1.Sum(b)
	return hex.EncodeToString(s[:])
}

// TestContents checks that every DB file shows exactly the rows its
// .contents.json lists, through the raw API and the zodb.Storage view.
func TestContents(t *testing.T) {
	for _, fx := range fixtures {
		t.Run(fx.name, func(t *testing.T) {
			var c contents
			readJSON(t, fx.contents, &c)
			db := openT(t, fx.db)
			checkContents(t, db, &c)
		})
	}
}

func checkContents(t *testing.T, db *DB, c *contents) {
	ctx := context.Background()

	// config
	cfg := db.Config()
	if cfg.Name != c.Config["name"] || cfg.Version != c.Config["version"] || cfg.Version != "4" {
		t.Errorf("config %+v, want %v", cfg, c.Config)
	}
	if want, _ := strconv.Atoi(c.Config["nid"]); !cfg.HasNid || cfg.Nid != int32(want) {
		t.Errorf("nid %d (has %v), want %d", cfg.Nid, cfg.HasNid, want)
	}
	if want, _ := strconv.ParseUint(c.Config["ptid"], 10, 64); !cfg.HasPTID || cfg.PTID != want {
		t.Errorf("ptid %d, want %d", cfg.PTID, want)
	}
	if want, _ := strconv.Atoi(c.Config["replicas"]); cfg.NumReplicas != want {
		t.Errorf("replicas %d, want %d", cfg.NumReplicas, want)
	}
	if cfg.BackupTid != 0 || cfg.TruncateTid != 0 {
		t.Errorf("backup/truncate tid %s %s, want none", cfg.BackupTid, cfg.TruncateTid)
	}

	// pt
	np := 0
	var wantPT []Cell
	readable := map[uint32]bool{}
	for _, r := range c.PT {
		np = max(np, int(r.Partition)+1)
		cell := Cell{Partition: r.Partition, Nid: r.Nid, State: CellState(max(0, -r.TidColumn))}
		if r.TidColumn >= 0 {
			cell.ReplicatedTid = zodb.Tid(r.TidColumn)
		}
		if r.Pack != nil {
			cell.Pack, cell.HasPack = zodb.Tid(*r.Pack), true
		}
		wantPT = append(wantPT, cell)
		if r.Nid == cfg.Nid && cell.State.Readable() {
			readable[r.Partition] = true
		}
	}
	sort.Slice(wantPT, func(i, j int) bool {
		a, b := wantPT[i], wantPT[j]
		return a.Partition < b.Partition || a.Partition == b.Partition && a.Nid < b.Nid
	})
	if got := db.PartitionTable(); !reflect.DeepEqual(got, wantPT) {
		t.Errorf("pt:\n got %+v\nwant %+v", got, wantPT)
	}
	if cfg.NumPartitions != np || db.NumPartitions() != np {
		t.Errorf("partitions %d, want %d", cfg.NumPartitions, np)
	}
	var wantReadable []uint32
	for p := range readable {
		wantReadable = append(wantReadable, p)
	}
	slices.Sort(wantReadable)
	if got := db.ReadablePartitions(); !slices.Equal(got, wantReadable) {
		t.Errorf("readable %v, want %v", got, wantReadable)
	}

	// trans: TransactionInformation, TIDs, TIDsFrom
	var tids []zodb.Tid
	for _, r := range c.Trans {
		ti := tid(t, r.Tid)
		if r.Partition != db.Partition(uint64(ti)) {
			t.Errorf("trans %s: partition %d in the file, %d computed", ti, r.Partition, db.Partition(uint64(ti)))
		}
		got, err := db.TransactionInformation(ctx, ti)
		if !readable[r.Partition] {
			if !errors.Is(err, ErrNonReadableCell) {
				t.Errorf("trans %s in unreadable partition: err %v", ti, err)
			}
			continue
		}
		tids = append(tids, ti)
		if err != nil {
			t.Errorf("trans %s: %v", ti, err)
			continue
		}
		ext, _ := hex.DecodeString(r.ExtHex)
		want := &TxnInfo{Tid: ti, User: []byte(r.User), Description: []byte(r.Description),
			Extension: ext, Packed: r.Packed != 0, TTid: tid(t, r.TTid), Oids: []zodb.Oid{}}
		for _, o := range r.Oids {
			want.Oids = append(want.Oids, oid(t, o))
		}
		if len(got.Oids) == 0 {
			got.Oids = []zodb.Oid{}
		}
		for _, p := range c.Pack {
			if tid(t, p.Tid) == ti {
				po := &PackOrder{Partial: p.Partial != 0, PackTid: tid(t, p.PackTid)}
				if p.Approved != nil {
					po.Approved, po.HasApproved = *p.Approved != 0, true
				}
				if p.OidsHex != nil {
					b, _ := hex.DecodeString(*p.OidsHex)
					po.Oids, _ = splitOids(b)
				}
				want.Pack = po
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("trans %s:\n got %+v\nwant %+v", ti, got, want)
		}
	}
	slices.Sort(tids)
	if got, err := db.TIDsFrom(ctx, 0, zodb.TidMax, -1, nil); err != nil || !slices.Equal(got, tids) {
		t.Errorf("TIDsFrom: %v %v, want %v", got, err, tids)
	}
	if len(tids) > 1 {
		got, err := db.TIDsFrom(ctx, tids[1], tids[len(tids)-1]-1, 1000, nil)
		if err != nil || !slices.Equal(got, tids[1:len(tids)-1]) {
			t.Errorf("TIDsFrom(2nd, last-1): %v %v", got, err)
		}
		if got, _ := db.TIDsFrom(ctx, 0, zodb.TidMax, 1, nil); !slices.Equal(got, tids[:1]) {
			t.Errorf("TIDsFrom(length 1): %v", got)
		}
	}
	desc := slices.Clone(tids)
	slices.Reverse(desc)
	if got, err := db.TIDs(ctx, 0, 1000, nil); err != nil || !slices.Equal(got, desc) {
		t.Errorf("TIDs: %v %v, want %v", got, err, desc)
	}
	if len(desc) > 2 {
		if got, err := db.TIDs(ctx, 1, 3, db.ReadablePartitions()); err != nil || !slices.Equal(got, desc[1:3]) {
			t.Errorf("TIDs[1:3]: %v %v, want %v", got, err, desc[1:3])
		}
	}
	if _, err := db.TIDs(ctx, 2, 2, nil); err == nil {
		t.Errorf("TIDs(2, 2): no error")
	}
	for p := range uint32(np) {
		_, err := db.TIDs(ctx, 0, 10, []uint32{p})
		if readable[p] != (err == nil) {
			t.Errorf("TIDs partition %d: err %v, readable %v", p, err, readable[p])
		}
	}

	// ttrans/tobj: locked transactions, never visible as committed.
	wantLocked := map[zodb.Tid]zodb.Tid{}
	for _, r := range c.TObj {
		wantLocked[tid(t, r.Tid)] = 0
	}
	for _, r := range c.TTrans {
		final := tid(t, r.Tid)
		wantLocked[tid(t, r.TTid)] = final
		if _, err := db.TransactionInformation(ctx, final); !isTidNotFound(err) {
			t.Errorf("locked transaction %s visible: %v", final, err)
		}
		if got, err := db.FinalTID(ctx, tid(t, r.TTid)); err != nil || got != 0 {
			t.Errorf("FinalTID(locked %s) = %s, %v", r.TTid, got, err)
		}
		if slices.Contains(tids, final) {
			t.Errorf("locked transaction %s in TIDs", final)
		}
	}
	if got, err := db.LockedTransactions(ctx); err != nil || !reflect.DeepEqual(got, wantLocked) {
		t.Errorf("LockedTransactions %v %v, want %v", got, err, wantLocked)
	}
	for _, r := range c.Trans {
		if !readable[r.Partition] {
			continue
		}
		if got, err := db.FinalTID(ctx, tid(t, r.TTid)); err != nil || got != tid(t, r.Tid) {
			t.Errorf("FinalTID(%s) = %s, %v; want %s", r.TTid, got, err, r.Tid)
		}
	}

	// obj: every row, exactly.
	byOid := map[zodb.Oid][]objJSON{}
	for _, r := range c.Obj {
		o := oid(t, r.Oid)
		byOid[o] = append(byOid[o], r)
	}
	var maxOid zodb.Oid
	var maxTid zodb.Tid
	for o, rs := range byOid {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Tid < rs[j].Tid })
		if !readable[db.Partition(uint64(o))] {
			t.Errorf("obj rows for oid %s in an unreadable partition", o)
			continue
		}
		maxOid = max(maxOid, o)
		var hist []HistoryEntry
		for i, r := range rs {
			serial := tid(t, r.Tid)
			maxTid = max(maxTid, serial)
			var next zodb.Tid
			if i+1 < len(rs) {
				next = tid(t, rs[i+1].Tid)
			}
			checkObjRow(t, db, o, serial, next, r)
			hist = append([]HistoryEntry{{serial, *r.StoredLen}}, hist...)
		}
		got, err := db.ObjectHistory(ctx, o, 0, 100)
		if err != nil || !reflect.DeepEqual(got, hist) {
			t.Errorf("history %s: %v %v, want %v", o, got, err, hist)
		}
		if len(hist) > 1 {
			got, err := db.ObjectHistory(ctx, o, 1, 2)
			if err != nil || !reflect.DeepEqual(got, hist[1:2]) {
				t.Errorf("history %s [1,2): %v %v", o, got, err)
			}
		}
		if _, err := db.ObjectHistory(ctx, o, len(hist), len(hist)+1); !isOidNotFound(err) {
			t.Errorf("history %s past the end: %v", o, err)
		}
		// latest and before
		last := rs[len(rs)-1]
		ob, err := db.Object(ctx, o, 0, 0, nil)
		if err != nil || ob.Serial != tid(t, last.Tid) || ob.NextSerial != 0 {
			t.Errorf("latest %s: %+v %v", o, ob, err)
		}
		first := tid(t, rs[0].Tid)
		if _, err := db.Object(ctx, o, 0, first, nil); !isOidNotFound(err) {
			t.Errorf("%s before first serial: %v", o, err)
		}
		if _, err := db.Object(ctx, o, first-1, 0, nil); !isOidNotFound(err) {
			t.Errorf("%s at a non-serial: %v", o, err)
		}
		if _, _, err := db.Load(ctx, zodb.Xid{Oid: o, At: first - 1}); !isNoData(err, 0) {
			t.Errorf("load %s before creation: %v", o, err)
		}
	}
	// oids without rows in the readable partitions
	for o := zodb.Oid(0); o <= maxOid+zodb.Oid(2*np); o++ {
		if _, ok := byOid[o]; ok {
			continue
		}
		_, err := db.Object(ctx, o, 0, 0, nil)
		var want error
		if readable[db.Partition(uint64(o))] {
			var no *zodb.NoObjectError
			if !errors.As(err, &no) {
				t.Errorf("oid %s without rows: %v", o, err)
			}
			if _, err := db.ObjectHistory(ctx, o, 0, 1); !isOidNotFound(err) {
				t.Errorf("history of oid %s without rows: %v", o, err)
			}
			if _, err := db.History(ctx, o, 10); !errors.As(err, &no) {
				t.Errorf("History of oid %s without rows: %v", o, err)
			}
		} else if !errors.Is(err, ErrNonReadableCell) {
			t.Errorf("oid %s in an unreadable partition: %v, want %v", o, err, want)
		}
	}
	// tobj rows are not visible
	for _, r := range c.TObj {
		o := oid(t, r.Oid)
		for _, ttr := range c.TTrans {
			if _, err := db.Object(ctx, o, tid(t, ttr.Tid), 0, nil); !isOidNotFound(err) {
				t.Errorf("tobj %s@%s visible at its final tid: %v", o, ttr.Tid, err)
			}
		}
		if _, err := db.Object(ctx, o, tid(t, r.Tid), 0, nil); !isOidNotFound(err) {
			t.Errorf("tobj %s@%s visible at its ttid: %v", o, r.Tid, err)
		}
	}

	// LastIDs
	for _, r := range c.Trans {
		if readable[r.Partition] {
			maxTid = max(maxTid, tid(t, r.Tid))
		}
	}
	firstTid := MaxTid
	if len(tids) > 0 {
		firstTid = tids[0]
	}
	lt, lo, ft, err := db.LastIDs(ctx, nil)
	if err != nil || lt != maxTid || lo != maxOid || ft != firstTid {
		t.Errorf("LastIDs = %s %s %s %v, want %s %s %s", lt, lo, ft, err, maxTid, maxOid, firstTid)
	}
	if full, _ := db.LastIDsFull(ctx, nil); full.HasOid != (len(byOid) > 0) || full.HasTid != (maxTid != 0) {
		t.Errorf("LastIDsFull %+v", full)
	}
	if len(readable) > 0 {
		lt2, lo2, ft2, err := db.LastIDs(ctx, db.ReadablePartitions())
		if err != nil || lt2 != lt || lo2 != lo || ft2 != ft {
			t.Errorf("LastIDs(explicit readable partitions) = %s %s %s %v", lt2, lo2, ft2, err)
		}
		got, err := db.TIDsFrom(ctx, 0, zodb.TidMax, -1, db.ReadablePartitions())
		if err != nil || !slices.Equal(got, tids) {
			t.Errorf("TIDsFrom(explicit readable partitions) = %v %v", got, err)
		}
	}
	if full, _ := db.LastIDsFull(ctx, []uint32{}); full != (LastIDsInfo{FirstTid: MaxTid}) {
		t.Errorf("LastIDsFull(no partition) %+v", full)
	}
	if ltid, err := db.LastTid(ctx); err != nil || ltid != maxTid {
		t.Errorf("LastTid %s %v", ltid, err)
	}

	// data rows: all hashes match (the loads above verified them).
	for _, d := range c.Data {
		if !d.HashOK {
			t.Errorf("fixture data %d: hash not ok", d.DataID)
		}
	}
}

// checkObjRow checks one obj row through Object (raw) and Load.
func checkObjRow(t *testing.T, db *DB, o zodb.Oid, serial, next zodb.Tid, r objJSON) {
	ctx := context.Background()
	ob, err := db.Object(ctx, o, serial, 0, nil)
	if err != nil {
		t.Errorf("object %s@%s: %v", o, serial, err)
		return
	}
	var wantDS zodb.Tid
	if r.ValueTid != nil {
		wantDS = tid(t, *r.ValueTid)
	}
	if ob.Oid != o || ob.Serial != serial || ob.NextSerial != next || ob.DataSerial != wantDS || ob.NoData != (r.DataID == nil) {
		t.Errorf("object %s@%s: %+v; want next %s, data serial %s", o, serial, ob, next, wantDS)
	}
	// the same row through "before next" (or latest)
	ob2, err := db.Object(ctx, o, 0, next, nil)
	if err != nil || ob2.Serial != serial || ob2.NextSerial != next {
		t.Errorf("object %s before %s: %+v %v", o, next, ob2, err)
	}
	data, s, err := db.Load(ctx, zodb.Xid{Oid: o, At: serial})
	if r.DataID == nil {
		if !isNoData(err, serial) {
			t.Errorf("load %s@%s: %v, want NoDataError", o, serial, err)
		}
		return
	}
	if ob.Compression != uint8(*r.Compression) || len(ob.Data) != *r.StoredLen || hex.EncodeToString(ob.Checksum[:]) != *r.Hash || sha1hex(ob.Data) != *r.Hash {
		t.Errorf("object %s@%s: compression %d len %d checksum %x; want %d %d %s", o, serial, ob.Compression, len(ob.Data), ob.Checksum, *r.Compression, *r.StoredLen, *r.Hash)
	}
	if err != nil || s != serial || len(data) != *r.RawLen || sha1hex(data) != *r.RawSha1 {
		t.Errorf("load %s@%s: serial %s len %d sha1 %s %v; want len %d sha1 %s", o, serial, s, len(data), sha1hex(data), err, *r.RawLen, *r.RawSha1)
	}
	// LoadAppend appends
	buf := make([]byte, 3, 10)
	data, _, err = db.LoadAppend(ctx, zodb.Xid{Oid: o, At: serial}, buf)
	if err != nil || len(data) != 3+*r.RawLen || sha1hex(data[3:]) != *r.RawSha1 {
		t.Errorf("loadAppend %s@%s: len %d %v", o, serial, len(data), err)
	}
	before := next
	if before == 0 {
		before = zodb.TidMax
	}
	data, s, n, err := db.LoadBefore(ctx, o, before, nil)
	if err != nil || s != serial || n != next || sha1hex(data) != *r.RawSha1 {
		t.Errorf("loadBefore %s<%s: %s %s %v", o, before, s, n, err)
	}
}

func isOidNotFound(err error) bool {
	var e *OidNotFoundError
	return errors.As(err, &e)
}

func isTidNotFound(err error) bool {
	var e *TidNotFoundError
	return errors.As(err, &e)
}

func isNoData(err error, deletedAt zodb.Tid) bool {
	var e *zodb.NoDataError
	return errors.As(err, &e) && e.DeletedAt == deletedAt
}
