package neosqlite

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodbtools"
)

// TestTools runs the storage-independent tools (zodbtools) on a NEO DB.
func TestTools(t *testing.T) {
	ctx := context.Background()
	db := openT(t, "testdata/storage.sqlite")
	var out bytes.Buffer
	if err := zodbtools.Dump(ctx, &out, db, 0, zodb.TidMax, true); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{
		"txn 040d2ea0037ed3aa \" \"",
		"obj 0000000000000003 102445 sha1:8f79023def774927a063176504620b3d5875f957",
		"obj 0000000000000001 from 040d2ea007d0e588", // T5, undo of T4
	} {
		if !strings.Contains(s, want) {
			t.Errorf("zdump output lacks %q:\n%s", want, s)
		}
	}
	if n := strings.Count(s, "\ntxn ") + strings.Count(s[:4], "txn "); n != 6 {
		t.Errorf("zdump: %d transactions, want 6:\n%s", n, s)
	}
	out.Reset()
	if err := zodbtools.Info(ctx, &out, db); err != nil || !strings.Contains(out.String(), "head=040d2ea007f05aee\n") ||
		!strings.Contains(out.String(), "last_oid=0000000000000004\n") {
		t.Errorf("info: %v\n%s", err, out.String())
	}
	if _, err := zodbtools.Hash(ctx, db, zodb.TidMax, "sha1"); err != nil {
		t.Errorf("hash: %v", err)
	}
}
