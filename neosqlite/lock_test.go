package neosqlite

import (
	"bytes"
	"context"
	"errors"
	"os"
	"runtime"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// OpenExclusive takes NEO/py's storage lock: a second one fails, a plain
// Open still reads, and both read the same; the lock goes with Close.
func TestOpenExclusive(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("NEO/py's storage lock is a Linux abstract socket")
	}
	ctx := context.Background()
	path := copyDB(t, "testdata/storage.sqlite")
	ex, err := OpenExclusive(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenExclusive(ctx, path); !errors.Is(err, ErrLocked) {
		t.Fatalf("second OpenExclusive: %v, want ErrLocked", err)
	}
	ro, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	for oid := zodb.Oid(0); oid < 5; oid++ {
		a, sa, err1 := ex.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
		b, sb, err2 := ro.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
		if err1 != nil || err2 != nil || sa != sb || !bytes.Equal(a, b) {
			t.Fatalf("oid %s: exclusive %d bytes @%s %v, shared %d bytes @%s %v", oid, len(a), sa, err1, len(b), sb, err2)
		}
	}
	if err := ex.Close(); err != nil {
		t.Fatal(err)
	}
	ex2, err := OpenExclusive(ctx, path)
	if err != nil {
		t.Fatalf("after Close: %v", err)
	}
	ex2.Close()

	// A journal beside the file (a writer stopped mid-transaction): not
	// immutable, so that SQLite rolls back to the last commit.
	if err := os.WriteFile(path+"-journal", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ex3, err := OpenExclusive(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer ex3.Close()
	if _, _, err := ex3.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax}); err != nil {
		t.Fatal(err)
	}
}
