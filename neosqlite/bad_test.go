package neosqlite

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"database/sql"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/zodb"
)

// copyDB copies a fixture into a temporary directory and applies the SQL
// statements to the copy (opened read-write, which this package never does).
func copyDB(t *testing.T, src string, stmts ...string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "storage.sqlite")
	datasets.CopyTo(t, src, dst)
	exec(t, dst, stmts...)
	return dst
}

func exec(t *testing.T, path string, stmts ...string) {
	t.Helper()
	if len(stmts) == 0 {
		return
	}
	w, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, s := range stmts {
		if _, err := w.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func wantErr(t *testing.T, err error, target error, substr ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v", target)
	}
	if target != nil && !errors.Is(err, target) {
		t.Errorf("error %q does not wrap %v", err, target)
	}
	for _, s := range substr {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
}

func TestOpenBad(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()

	// A missing file is an error and is not created.
	missing := filepath.Join(dir, "missing.sqlite")
	_, err := Open(ctx, missing)
	wantErr(t, err, os.ErrNotExist, missing)
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open created %s", missing)
	}

	// A directory.
	_, err = Open(ctx, dir)
	wantErr(t, err, nil, "not a regular file")

	// Not SQLite.
	junk := filepath.Join(dir, "junk.sqlite")
	os.WriteFile(junk, bytes.Repeat([]byte("this is not an SQLite database\n"), 200), 0o644)
	_, err = Open(ctx, junk)
	wantErr(t, err, ErrNotNEO, junk, "not a database")

	// An empty file is an empty SQLite database: no NEO tables.
	empty := filepath.Join(dir, "empty.sqlite")
	os.WriteFile(empty, nil, 0o644)
	_, err = Open(ctx, empty)
	wantErr(t, err, ErrNotNEO, empty, `no table "config"`)
	if fi, _ := os.Stat(empty); fi.Size() != 0 {
		t.Errorf("Open wrote into %s", empty)
	}

	// SQLite, but another schema.
	other := filepath.Join(dir, "other.sqlite")
	exec(t, other, "CREATE TABLE foo (x)")
	_, err = Open(ctx, other)
	wantErr(t, err, ErrNotNEO, `no table "config"`)

	// Another schema version.
	_, err = Open(ctx, copyDB(t, "testdata/storage.sqlite", "UPDATE config SET value='3' WHERE name='version'"))
	wantErr(t, err, ErrNotNEO, `schema version "3"`)
	_, err = Open(ctx, copyDB(t, "testdata/storage.sqlite", "DELETE FROM config WHERE name='version'"))
	wantErr(t, err, ErrNotNEO, "no version")

	// Malformed config.
	_, err = Open(ctx, copyDB(t, "testdata/storage.sqlite", "UPDATE config SET value='x' WHERE name='nid'"))
	wantErr(t, err, ErrCorrupt, "nid")
	_, err = Open(ctx, copyDB(t, "testdata/storage.sqlite", "INSERT INTO config VALUES ('backup_tid', 'zz')"))
	wantErr(t, err, ErrCorrupt, "backup_tid")
}

func TestConfigOptional(t *testing.T) {
	db := openT(t, copyDB(t, "testdata/storage.sqlite",
		"INSERT INTO config VALUES ('backup_tid', '040d2ea007e0dc11')",
		"INSERT INTO config VALUES ('truncate_tid', '040d2ea007f05aee')"))
	if c := db.Config(); c.BackupTid != 0x040d2ea007e0dc11 || c.TruncateTid != 0x040d2ea007f05aee {
		t.Errorf("config %+v", c)
	}
	// A node that never got an id has no readable partition.
	db = openT(t, copyDB(t, "testdata/storage.sqlite", "DELETE FROM config WHERE name='nid'"))
	if c := db.Config(); c.HasNid || len(db.ReadablePartitions()) != 0 {
		t.Errorf("config %+v, readable %v", c, db.ReadablePartitions())
	}
	_, err := db.Object(context.Background(), 0, 0, 0, nil)
	wantErr(t, err, ErrNonReadableCell)
	// An OUT_OF_DATE cell is not readable; its tid column is the
	// replicated tid.
	db = openT(t, copyDB(t, "testdata/storage.sqlite", "UPDATE pt SET tid=1234"))
	if pt := db.PartitionTable(); pt[0].State != OutOfDate || pt[0].ReplicatedTid != 1234 || len(db.ReadablePartitions()) != 0 {
		t.Errorf("pt %+v", pt)
	}
	if tids, err := db.TIDs(context.Background(), 0, 10, nil); err != nil || tids != nil {
		t.Errorf("TIDs without readable partition: %v %v", tids, err)
	}
	_, err = db.TIDs(context.Background(), 0, 10, []uint32{0})
	wantErr(t, err, ErrNonReadableCell)
}

// rootT3 is the tid of the last revision of oid 0 in storage.sqlite; its
// data row is 5. Oid 3 (T3) uses data row 7.
const (
	rootT3 = zodb.Tid(0x040d2ea007e0dc11)
	oid3T3 = zodb.Tid(0x040d2ea007e0dc11)
)

func TestCorruptData(t *testing.T) {
	ctx := context.Background()

	// The stored hash does not match the data: Load fails naming oid,
	// serial and data id; the raw Object passes the row on (the NEO
	// client checks it).
	db := openT(t, copyDB(t, "testdata/storage.sqlite", "UPDATE data SET hash=zeroblob(20) WHERE id=5"))
	_, _, err := db.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax})
	wantErr(t, err, ErrCorrupt, "oid 0000000000000000", rootT3.String(), "data_id 5", "checksum mismatch")
	var op *zodb.OpError
	if !errors.As(err, &op) || op.Op != "load" {
		t.Errorf("load error %v is not an OpError", err)
	}
	_, _, _, err = db.LoadBefore(ctx, 0, zodb.TidMax, nil)
	wantErr(t, err, ErrCorrupt, "data_id 5")
	if o, err := db.Object(ctx, 0, 0, 0, nil); err != nil || o.Checksum != [20]byte{} {
		t.Errorf("raw Object of a bad row: %+v %v", o, err)
	}
	it := db.Iterate(ctx, rootT3, rootT3)
	_, dit, err := it.NextTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = dit.NextData(ctx)
	wantErr(t, err, ErrCorrupt, "data_id 5")
	// other objects still load
	if _, _, err := db.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax}); err != nil {
		t.Error(err)
	}

	// A data row is missing.
	db = openT(t, copyDB(t, "testdata/storage.sqlite", "DELETE FROM data WHERE id=7"))
	_, err = db.Object(ctx, 3, 0, 0, nil)
	wantErr(t, err, ErrCorrupt, "neosqlite: ", "obj row (partition 0, oid 0000000000000003, tid "+oid3T3.String()+"): ", "data_id 7 missing")
	_, _, err = db.Load(ctx, zodb.Xid{Oid: 3, At: zodb.TidMax})
	wantErr(t, err, ErrCorrupt, "data_id 7 missing")

	// Undecodable zlib data with a matching hash, a bad compression flag,
	// a bad hash length.
	bad := []byte("not zlib at all")
	sum := sha1.Sum(bad)
	db = openT(t, copyDB(t, "testdata/storage.sqlite",
		"UPDATE data SET value=x'"+hexs(bad)+"', hash=x'"+hexs(sum[:])+"' WHERE id=5",
		"UPDATE data SET compression=7 WHERE id=6",
		"UPDATE data SET hash=x'0102' WHERE id=2"))
	_, _, err = db.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax})
	wantErr(t, err, ErrCorrupt, "data_id 5", "zlib")
	_, _, err = db.Load(ctx, zodb.Xid{Oid: 4, At: zodb.TidMax})
	wantErr(t, err, ErrCorrupt, "data_id 6", "compression 7")
	_, err = db.Object(ctx, 2, 0, 0, nil)
	wantErr(t, err, ErrCorrupt, "data_id 2", "hash of 2 bytes")

	// A truncated zlib stream.
	var zb bytes.Buffer
	zw := zlib.NewWriter(&zb)
	zw.Write(bytes.Repeat([]byte("x"), 1000))
	zw.Close()
	trunc := zb.Bytes()[:zb.Len()-3]
	sum = sha1.Sum(trunc)
	db = openT(t, copyDB(t, "testdata/storage.sqlite",
		"UPDATE data SET value=x'"+hexs(trunc)+"', hash=x'"+hexs(sum[:])+"' WHERE id=5"))
	_, _, err = db.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax})
	wantErr(t, err, ErrCorrupt, "data_id 5", "zlib")

	// An oids field whose length is not a multiple of 8.
	db = openT(t, copyDB(t, "testdata/storage.sqlite", "UPDATE trans SET oids=x'010203' WHERE tid="+itoa(rootT3)))
	_, err = db.TransactionInformation(ctx, rootT3)
	wantErr(t, err, ErrCorrupt, "trans row (partition 0, tid "+rootT3.String()+")", "oids")
	it = db.Iterate(ctx, rootT3, rootT3)
	_, _, err = it.NextTxn(ctx)
	wantErr(t, err, ErrCorrupt, "oids")
}

// TestNoData checks records without data (deleteObject, undone creation):
// obj.data_id NULL.
func TestNoData(t *testing.T) {
	ctx := context.Background()
	const del = zodb.Tid(0x040d2ea008000000)
	path := copyDB(t, "testdata/storage.sqlite",
		"INSERT INTO trans VALUES (0, "+itoa(del)+", 0, x'0000000000000002', x'', CAST('delete note' AS BLOB), x'', "+itoa(del-5)+")",
		"INSERT INTO obj VALUES (0, 2, "+itoa(del)+", NULL, NULL)")
	db := openT(t, path)
	_, _, err := db.Load(ctx, zodb.Xid{Oid: 2, At: zodb.TidMax})
	if !isNoData(err, del) {
		t.Errorf("load deleted: %v", err)
	}
	if _, s, err := db.Load(ctx, zodb.Xid{Oid: 2, At: del - 1}); err != nil || s != 0x040d2ea007cae688 {
		t.Errorf("load before deletion: %s %v", s, err)
	}
	_, _, next, err := db.LoadBefore(ctx, 2, del, nil)
	if err != nil || next != del {
		t.Errorf("loadBefore deletion: next %s %v", next, err)
	}
	o, err := db.Object(ctx, 2, 0, 0, nil)
	if err != nil || !o.NoData || len(o.Data) != 0 || o.Checksum != [20]byte{} || o.Serial != del {
		t.Errorf("raw Object of a deletion: %+v %v", o, err)
	}
	h, err := db.ObjectHistory(ctx, 2, 0, 10)
	if err != nil || len(h) != 2 || h[0] != (HistoryEntry{del, 0}) {
		t.Errorf("history: %v %v", h, err)
	}
	it := db.Iterate(ctx, del, del)
	txn, dit, err := it.NextTxn(ctx)
	if err != nil || txn.Tid != del {
		t.Fatal(txn, err)
	}
	d, err := dit.NextData(ctx)
	if err != nil || d.Oid != 2 || d.Data != nil || d.DataTid != 0 {
		t.Errorf("iterate deletion: %+v %v", d, err)
	}
	if _, err := dit.NextData(ctx); err != io.EOF {
		t.Error(err)
	}
	if lt, _ := db.LastTid(ctx); lt != del {
		t.Errorf("LastTid %s", lt)
	}
	if ft, err := db.FinalTID(ctx, del-5); err != nil || ft != del {
		t.Errorf("FinalTID %s %v", ft, err)
	}
	// AskOIDsFrom: the deleted oid is examined but not listed; before the
	// deletion it is listed.
	if oids, next, more, err := db.OIDsFrom(ctx, 0, 1, 2, zodb.TidMax); err != nil || len(oids) != 0 || !more || next != 3 {
		t.Errorf("OIDsFrom at the deletion: %v next %s more %v %v", oids, next, more, err)
	}
	if oids, _, _, err := db.OIDsFrom(ctx, 0, 10, 0, del-1); err != nil || !slices.Contains(oids, 2) {
		t.Errorf("OIDsFrom before the deletion: %v %v", oids, err)
	}
	if oids, _, _, err := db.OIDsFrom(ctx, 0, 10, 0, del); err != nil || slices.Contains(oids, 2) || len(oids) == 0 {
		t.Errorf("OIDsFrom after the deletion: %v %v", oids, err)
	}
}

// TestReadOnly checks that reading leaves the file as it was: no write, no
// journal.
func TestReadOnly(t *testing.T) {
	path := copyDB(t, "testdata/storage.sqlite")
	sum := func() [32]byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return sha256.Sum256(b)
	}
	before := sum()
	db, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	var c contents
	readJSON(t, "testdata/storage.sqlite.contents.json", &c)
	checkContents(t, db, &c)
	db.Close()
	if sum() != before {
		t.Errorf("the file changed")
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Errorf("files beside the DB: %v", ents)
	}
	if _, err := db.Object(context.Background(), 0, 0, 0, nil); err == nil {
		t.Errorf("Object after Close: no error")
	}
}

func TestDriver(t *testing.T) {
	ctx := context.Background()
	abs, _ := filepath.Abs("testdata/storage.sqlite")
	for _, u := range []string{"sqlite://" + abs, "sqlite://testdata/storage.sqlite"} {
		stor, err := zodb.Open(ctx, u, nil)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if stor.URL() != "sqlite://"+abs {
			t.Errorf("URL %q", stor.URL())
		}
		if lt, err := stor.LastTid(ctx); err != nil || lt != 0x040d2ea007f05aee {
			t.Errorf("%s: LastTid %s %v", u, lt, err)
		}
		stor.Close()
	}
	if _, err := zodb.Open(ctx, "sqlite:///nonexistent/storage.sqlite", nil); err == nil {
		t.Errorf("opening a missing file: no error")
	}
}

func hexs(b []byte) string {
	const digits = "0123456789abcdef"
	s := make([]byte, 0, 2*len(b))
	for _, c := range b {
		s = append(s, digits[c>>4], digits[c&15])
	}
	return string(s)
}

func itoa(t zodb.Tid) string { return strconv.FormatUint(uint64(t), 10) }
