//go:build unix

package blob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/vfs/crashfs"
	"github.com/zodbd/zodbd/zodb"
)

// TestStoragePowerLoss: the upload path of a Storage (what the ZEO server
// runs for storeBlobStart/Chunk/End and tpc_vote/tpc_finish) under power
// losses. Each workload opens a FileStorage and a blob directory through
// crashfs, and commits transactions whose records carry blobs: each blob
// is written as an upload in chunks, stored with StoreBlob, then the
// transaction votes and finishes; some stores are superseded by a second
// blob for the same oid, some transactions abort after their vote. The
// power fails at a random operation. After it, every acknowledged
// transaction (Finish returned) is in Data.fs with each of its blob files
// byte for byte, and every transaction that is in Data.fs at all, acked
// or not, has all its blob files intact: a committed record never lacks
// its blob. 100 crash points (1000 with ZODBD_STRESS, 20 with -short).
func TestStoragePowerLoss(t *testing.T) {
	points := 100
	if os.Getenv("ZODBD_STRESS") != "" {
		points = 1000
	} else if testing.Short() {
		points = 20
	}
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	base := t.TempDir()
	acked := 0
	for i := 0; i < points && !t.Failed(); i++ {
		seed := rng.Int63()
		n, _ := storagePowerLoss(t, base, seed, -1)
		_, k := storagePowerLoss(t, base, seed, 1+rng.Intn(n+1))
		acked += k
	}
	if acked == 0 && !t.Failed() {
		t.Fatal("no transaction was acknowledged before the power loss: the test checks nothing")
	}
}

type revKey struct {
	oid zodb.Oid
	tid zodb.Tid
}

// storagePowerLoss runs the workload of seed, crashing at operation
// crashAt (-1: never), checks what survives and returns the number of file
// operations made and of transactions acknowledged.
func storagePowerLoss(t *testing.T, base string, seed int64, crashAt int) (int, int) {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewSource(seed))
	torn := rng.Intn(2) == 0
	pt := crashfs.NewPoint(t, base, crashAt)
	defer pt.Remove()
	cfs, src := pt.FS, pt.Src
	crashed := func() bool { c, _ := cfs.Crashed(); return c }
	fail := func(what string, err error) {
		if !crashed() {
			t.Errorf("seed %d: %s: %v", seed, what, err)
		}
	}
	voted := map[revKey][]byte{} // the blob of each record voted
	var acked []zodb.Tid
	func() {
		quiet := func(string, ...interface{}) {}
		fs, err := fs1.Open(filepath.Join(src, "Data.fs"), &fs1.Options{ReadWrite: true, FS: cfs, Logf: quiet})
		if err != nil {
			fail("open", err)
			return
		}
		defer fs.Close()
		d, err := OpenFS(filepath.Join(src, "blobs"), "", cfs)
		if err != nil {
			fail("open blobs", err)
			return
		}
		s := Wrap(fs, d)
		serials := map[zodb.Oid]zodb.Tid{}
		var oids []zodb.Oid
		for k := 0; k < 2+rng.Intn(5); k++ {
			tx, err := s.Begin(ctx, zodb.TxnMeta{Description: []byte("blobs")})
			if err != nil {
				fail("begin", err)
				return
			}
			bt := tx.(zodb.BlobTxn)
			stored := map[zodb.Oid][]byte{}
			for j := 0; j < 1+rng.Intn(3); j++ {
				var oid zodb.Oid
				if len(oids) == 0 || rng.Intn(3) == 0 {
					new, err := s.NewOids(ctx, 1)
					if err != nil {
						fail("new oids", err)
						tx.Abort()
						return
					}
					oid = new[0]
					oids = append(oids, oid)
				} else {
					oid = oids[rng.Intn(len(oids))]
				}
				data := make([]byte, 1+rng.Intn(20000))
				rng.Read(data)
				u, err := s.NewBlobUpload()
				if err != nil {
					fail("upload", err)
					tx.Abort()
					return
				}
				for rest := data; len(rest) > 0; {
					n := min(len(rest), 1+rng.Intn(6000))
					if _, err := u.Write(rest[:n]); err != nil {
						fail("upload write", err)
						u.Abort()
						tx.Abort()
						return
					}
					rest = rest[n:]
				}
				path, err := u.Close()
				if err != nil {
					fail("upload close", err)
					tx.Abort()
					return
				}
				rec := []byte(fmt.Sprintf("blob record %s %d", oid, k))
				if err := bt.StoreBlob(oid, serials[oid], rec, path); err != nil {
					fail("store blob", err)
					tx.Abort()
					return
				}
				stored[oid] = data // a second store of oid replaces the first
			}
			if _, err := tx.Vote(ctx); err != nil {
				fail("vote", err)
				tx.Abort()
				return
			}
			tid := tx.(interface{ Tid() zodb.Tid }).Tid()
			for oid, data := range stored {
				voted[revKey{oid, tid}] = data
			}
			if rng.Intn(6) == 0 {
				tx.Abort()
				for oid := range stored {
					if d.Exists(oid, tid) && !crashed() {
						t.Errorf("seed %d: abort after vote left the blob of %s@%s", seed, oid, tid)
					}
				}
				continue
			}
			if _, err := tx.Finish(ctx, nil); err != nil {
				fail("finish", err)
				return
			}
			acked = append(acked, tid)
			for oid := range stored {
				serials[oid] = tid
			}
		}
	}()
	n := cfs.Ops()
	cfs.Crash()
	if crashAt < 0 {
		return n, len(acked)
	}
	_, at := cfs.Crashed()
	where := fmt.Sprintf("seed %d, crash at %s, torn %v", seed, at, torn)
	after := pt.Materialize(t, seed, torn)
	path := filepath.Join(after, "Data.fs")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) && len(acked) == 0 {
		return n, 0
	}
	fs, err := fs1.Open(path, nil)
	if err != nil {
		t.Fatalf("%s: reopen: %v", where, err)
	}
	defer fs.Close()
	// Every transaction in the file has its blobs; collect the tids.
	committed := map[zodb.Tid]bool{}
	var d *Dir
	it := fs.Iterate(ctx, 0, zodb.TidMax)
	for {
		ti, dit, err := it.NextTxn(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: iterate: %v", where, err)
		}
		committed[ti.Tid] = true
		if d == nil {
			if d, err = Open(filepath.Join(after, "blobs"), ""); err != nil {
				t.Fatalf("%s: reopen blobs: %v", where, err)
			}
			if d.Layout() != "bushy" {
				t.Fatalf("%s: layout %s after the power loss", where, d.Layout())
			}
		}
		for {
			di, err := dit.NextData(ctx)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: iterate: %v", where, err)
			}
			want, ok := voted[revKey{di.Oid, di.Tid}]
			if !ok {
				t.Fatalf("%s: record %s@%s was never voted", where, di.Oid, di.Tid)
			}
			got, err := os.ReadFile(d.FilePath(di.Oid, di.Tid))
			if err != nil {
				t.Fatalf("%s: committed record %s@%s (acked: %v): %v", where, di.Oid, di.Tid, contains(acked, di.Tid), err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: blob %s@%s has %d bytes, not the %d stored", where, di.Oid, di.Tid, len(got), len(want))
			}
		}
	}
	for _, tid := range acked {
		if !committed[tid] {
			t.Fatalf("%s: acknowledged transaction %s lost", where, tid)
		}
	}
	return n, len(acked)
}

func contains(tids []zodb.Tid, tid zodb.Tid) bool {
	for _, x := range tids {
		if x == tid {
			return true
		}
	}
	return false
}
