package fs1_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zodb"
)

// neoPack is the pack a NEO storage node on a FileStorage runs.
var neoPack = fs1.PackOptions{NoGC: true, KeepEmptyTxns: true, NoBackTargets: true, Logf: quiet}

// TestPackNEO packs 1.fs (undo backpointers and chains of them, an undone
// creation, a deleted object) at every transaction's tid and between
// transactions as a NEO node does (KeepEmptyTxns, NoBackTargets): every
// transaction is still there; before the pack time the only records are
// the revisions current at it (nothing for a deleted object); from the pack
// time on every object loads as in the original (checkPacked: fstest, the
// index too); packing again changes nothing. A few of the packed files,
// with transactions left without records, are then read by ZODB/py:
// fstest passes and its iterator gives the transactions and records
// zodbd's does.
func TestPackNEO(t *testing.T) {
	orig := openRO(t, "testdata/1.fs")
	origTids := txnTids(t, orig)
	var ats []zodb.Tid
	for _, tid := range origTids {
		ats = append(ats, tid-1, tid)
	}
	ats = append(ats, zodb.TidMax)
	ctx := context.Background()
	pyChecked := 0
	for i, at := range ats {
		t.Run(at.String(), func(t *testing.T) {
			path := datasets.CopyFile(t, "testdata/1.fs")
			st, err := fs1.PackFile(ctx, path, at, &neoPack)
			if err != nil {
				t.Fatal(err)
			}
			if !st.Changed {
				return
			}
			checkPacked(t, "testdata/1.fs", path, at, false)
			packed := openRO(t, path)
			if got := txnTids(t, packed); fmt.Sprint(got) != fmt.Sprint(origTids) {
				t.Errorf("transactions %v, want all of the original's %v", got, origTids)
			}
			empty := 0
			storagetest.Walk(t, ctx, packed.Iterate(ctx, 0, at), func(txn *zodb.TxnInfo, recs []zodb.DataInfo) {
				if len(recs) == 0 {
					empty++
				}
				for _, r := range recs {
					want := load(t, orig, r.Oid, at)
					if want.absent || want.serial != r.Tid || !bytes.Equal(want.data, r.Data) {
						t.Errorf("record %s@%s kept before the pack time: not the revision current at it (%s)", r.Oid, r.Tid, want.serial)
					}
				}
			})
			b, _ := os.ReadFile(path)
			st2, err := fs1.PackFile(ctx, path, at, &neoPack)
			if err != nil {
				t.Fatal(err)
			}
			if again, _ := os.ReadFile(path); st2.Changed || !bytes.Equal(again, b) {
				t.Fatalf("packing again at the same time changed the file (%+v)", st2)
			}
			// ZODB/py on a few of the files with transactions left
			// without records: the first, one in the middle, the last.
			if empty > 0 && (pyChecked == 0 || i == len(ats)/2 || i == len(ats)-1) {
				pyChecked++
				if got, want := pyIterate(t, path), goIterate(t, packed); got != want {
					t.Errorf("ZODB/py iterates:\n%s\nzodbd:\n%s", got, want)
				}
			}
		})
	}
	if pyChecked == 0 && !t.Failed() {
		t.Error("no packed file with an empty transaction was checked with ZODB/py")
	}
}

// goIterate lists the transactions and records of st, as pyIterate does.
func goIterate(t *testing.T, st *fs1.FileStorage) string {
	ctx := context.Background()
	var b strings.Builder
	storagetest.Walk(t, ctx, st.Iterate(ctx, 0, zodb.TidMax), func(txn *zodb.TxnInfo, recs []zodb.DataInfo) {
		fmt.Fprintf(&b, "txn %s %c %d\n", txn.Tid, txn.Status, len(recs))
		for _, r := range recs {
			d := "-"
			if r.Data != nil {
				d = hex.EncodeToString(r.Data)
			}
			fmt.Fprintf(&b, " %s %s\n", r.Oid, d)
		}
	})
	return b.String()
}

// pyIterate runs ZODB/py's fstest on path, then lists its transactions
// and records with ZODB/py's FileStorage iterator. Without the venv it
// skips, unless $CI is set.
func pyIterate(t *testing.T, path string) string {
	t.Helper()
	py := datasets.Python(t)
	if out, err := exec.Command(py, "-m", "ZODB.scripts.fstest", path).CombinedOutput(); err != nil || len(out) != 0 {
		t.Fatalf("fstest %s: %v\n%s", path, err, out)
	}
	const script = `
import sys
from ZODB.FileStorage import FileStorage
s = FileStorage(sys.argv[1], read_only=True)
for txn in s.iterator():
    recs = list(txn)
    print("txn %s %s %d" % (txn.tid.hex(), txn.status, len(recs)))
    for r in recs:
        print(" %s %s" % (r.oid.hex(), "-" if r.data is None else r.data.hex()))
s.close()
`
	out, err := exec.Command(py, "-c", script, path).CombinedOutput()
	if err != nil {
		t.Fatalf("ZODB/py iterator on %s: %v\n%s", path, err, out)
	}
	return string(out)
}
