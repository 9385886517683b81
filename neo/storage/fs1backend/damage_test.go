package fs1backend

import (
	"bytes"
	"context"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// Damage in the part of the file a usable .index covers (which fs1.Open
// does not scan): the backend's reads report errors, never panic.
func TestDamagedUnderIndex(t *testing.T) {
	ctx := context.Background()
	src := "../../../fs1/testdata/1.fs"
	orig, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := os.ReadFile(src + ".index")
	if err != nil {
		t.Fatal(err)
	}
	topPos, _, err := fs1.LoadIndexFile(src + ".index")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "Data.fs")
	if err := os.WriteFile(path+".index", idx, 0o644); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(2))
	opened := 0
	for round := 0; round < 400; round++ {
		b := bytes.Clone(orig)
		for k := 0; k < 1+rng.Intn(4); k++ {
			i := fs1.HeaderSize + rng.Int63n(topPos-fs1.HeaderSize)
			b[i] = byte(rng.Intn(256))
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		fs, err := fs1.Open(path, &fs1.Options{Logf: func(string, ...interface{}) {}})
		if err != nil {
			continue
		}
		bk, err := New(fs)
		if err != nil {
			fs.Close()
			continue
		}
		opened++
		var o storage.Object
		for _, oid := range fs.Index().Oids() {
			bk.Object(ctx, oid, 0, 0, &o)
			bk.Object(ctx, oid, 0, 0x03f58e3d9c455bdd, &o)
			bk.ObjectHistory(ctx, oid, 0, 100)
		}
		tids, _ := bk.TIDsFrom(ctx, 0, zodb.TidMax, -1, nil)
		for _, tid := range tids {
			bk.TransactionInformation(ctx, tid)
		}
		bk.ReplicationRecords(ctx, 0, 1, 0, zodb.TidMax, 0, 100000, nil)
		bk.OIDsFrom(ctx, 0, 1000, 0, zodb.TidMax)
		bk.Close()
		fs.Close()
	}
	t.Logf("backend served %d of 400 damaged files", opened)
}
