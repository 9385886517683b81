package fs1

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zodb"
)

// TestRecentTidsAndChangesBetween checks RecentTids and ChangesBetween on
// the fixtures against a forward iteration: RecentTids(n) for every n, and
// ChangesBetween for every pair of bounds (the tids of the file, some
// bounds between them, 0 and TidMax). 1.fs has records of ~100 KB, whose next
// header ChangesBetween reads alone, and undo records (backpointers).
func TestRecentTidsAndChangesBetween(t *testing.T) {
	ctx := context.Background()
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			fs := openFixture(t, name)
			var all []zodb.Tid
			var allOids [][]zodb.Oid
			storagetest.Walk(t, ctx, fs.Iterate(ctx, 0, zodb.TidMax), func(txn *zodb.TxnInfo, recs []zodb.DataInfo) {
				all = append(all, txn.Tid)
				var oids []zodb.Oid
				for _, d := range recs {
					oids = append(oids, d.Oid)
				}
				allOids = append(allOids, oids)
			})
			if name != "empty" && len(all) < 10 {
				t.Fatalf("%d transactions in the fixture", len(all))
			}
			for n := 0; n <= len(all)+2; n++ {
				tids, err := fs.RecentTids(ctx, n)
				if err != nil {
					t.Fatal(err)
				}
				if want := all[len(all)-min(n, len(all)):]; !slices.Equal(tids, want) {
					t.Fatalf("RecentTids(%d) = %v, want %v", n, tids, want)
				}
			}
			bounds := []zodb.Tid{0, zodb.TidMax}
			for i, tid := range all {
				bounds = append(bounds, tid)
				if i%8 == 0 {
					bounds = append(bounds, tid-1, tid+1)
				}
			}
			for _, after := range bounds {
				for _, upto := range bounds {
					tids, oids, err := fs.ChangesBetween(ctx, after, upto)
					if err != nil {
						t.Fatal(err)
					}
					var wantTids []zodb.Tid
					var wantOids [][]zodb.Oid
					for i, tid := range all {
						if after < tid && tid <= upto {
							wantTids = append(wantTids, tid)
							wantOids = append(wantOids, allOids[i])
						}
					}
					if !slices.Equal(tids, wantTids) || fmt.Sprint(oids) != fmt.Sprint(wantOids) {
						t.Fatalf("ChangesBetween(%s, %s) = %v %v, want %v %v", after, upto, tids, oids, wantTids, wantOids)
					}
				}
			}
		})
	}
}

// TestAppendBigTxns appends to the FileStorage file $ZODBD_BIGTXNS_FS 100
// transactions of 10 000 new objects each (~100-byte pickles; a large
// import), whose oids a ZEO server's invalidation queue covers at start:
// the file the start-up benchmark in BENCHMARKS.md serves. Skipped without
// that variable.
func TestAppendBigTxns(t *testing.T) {
	path := os.Getenv("ZODBD_BIGTXNS_FS")
	if path == "" {
		t.Skip("ZODBD_BIGTXNS_FS not set")
	}
	const ntxn, nrec = 100, 10000
	fs, err := Open(path, &Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	s := fs.state.Load()
	pos, tid, oid := s.end, s.lastTid, s.index.MaxOid()+1
	fs.Close()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(pos); err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(io.NewOffsetWriter(f, pos), 1<<20)
	payload := make([]byte, 64)
	var buf []byte
	for i := 0; i < ntxn; i++ {
		tid = zodb.TidFromUnix(float64(tid.Time().Add(time.Second).UnixNano()) / 1e9)
		var recs []byte
		for k := 0; k < nrec; k++ {
			data := packRecord(nil, nil, 60, payload)
			recs = appendDataHeader(recs, oid, tid, 0, pos, int64(len(data)))
			recs = append(recs, data...)
			oid++
		}
		tlen := int64(TxnHeaderFixSize + len(recs))
		buf = appendTxnHeader(buf[:0], tid, tlen, ' ', nil, nil, nil)
		buf = append(buf, recs...)
		buf = binary.BigEndian.AppendUint64(buf, uint64(tlen))
		if _, err := w.Write(buf); err != nil {
			t.Fatal(err)
		}
		pos += tlen + 8
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	os.Remove(path + ".index")
	fmt.Printf("appended %d transactions of %d records; %s is %d bytes\n", ntxn, nrec, path, pos)
}
