//go:build unix

package blob

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/vfs/crashfs"
	"github.com/zodbd/zodbd/zodb"
)

// TestPowerLoss: blob files placed by a Batch whose Sync returned survive
// a power loss, with their content, under vfs's durability contract (see
// fs1's TestPowerLoss for the model). Each workload opens a new blob
// directory, then for several transactions writes uploads into its tmp
// directory (written and fsynced, as the ZEO server does before a vote),
// moves them into place, links an earlier revision now and then (undo),
// and syncs the batch; the power fails at a random operation. 100 crash
// points (1000 with ZODBD_STRESS).
func TestPowerLoss(t *testing.T) {
	points := 100
	if os.Getenv("ZODBD_STRESS") != "" {
		points = 1000
	}
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	base := t.TempDir()
	synced := 0
	for i := 0; i < points && !t.Failed(); i++ {
		seed := rng.Int63()
		n, _ := blobPowerLoss(t, base, seed, -1)
		_, k := blobPowerLoss(t, base, seed, 1+rng.Intn(n+1))
		synced += k
	}
	if synced == 0 && !t.Failed() {
		t.Fatal("no batch was synced before the power loss: the test checks nothing")
	}
}

type blobRev struct {
	oid  zodb.Oid
	tid  zodb.Tid
	data []byte
}

// blobPowerLoss runs the workload of seed, crashing at operation crashAt
// (-1: never), checks the blob directory after the power loss and returns
// the number of file operations made and of blobs synced.
func blobPowerLoss(t *testing.T, base string, seed int64, crashAt int) (int, int) {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	torn := rng.Intn(2) == 0
	pt := crashfs.NewPoint(t, base, crashAt)
	defer pt.Remove()
	cfs, src := pt.FS, pt.Src
	var acked []blobRev
	func() {
		d, err := OpenFS(filepath.Join(src, "blobs"), "", cfs)
		if err != nil {
			return
		}
		tid := zodb.Tid(0x03d0000000000000)
		for k := 0; k < 2+rng.Intn(5); k++ {
			tid += zodb.Tid(1 + rng.Intn(1000))
			b := d.NewBatch()
			var placed []blobRev
			for j := 0; j < 1+rng.Intn(3); j++ {
				oid := zodb.Oid(1 + rng.Intn(300))
				if len(acked) > 0 && rng.Intn(4) == 0 {
					r := acked[rng.Intn(len(acked))]
					if d.Exists(r.oid, tid) {
						continue // uploaded in this batch: one blob per revision
					}
					if ok, err := b.Link(r.oid, r.tid, tid); err != nil || !ok {
						return
					}
					placed = append(placed, blobRev{r.oid, tid, r.data})
					continue
				}
				data := make([]byte, 1+rng.Intn(3000))
				rng.Read(data)
				f, err := cfs.OpenFile(filepath.Join(d.TempDir(), fmt.Sprintf("up%d-%d", k, j)), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
				if err != nil {
					return
				}
				_, err = cfs.WriteAt(f, data, 0)
				if err == nil {
					err = cfs.Sync(f)
				}
				f.Close()
				if err != nil {
					return
				}
				if d.Exists(oid, tid) {
					continue // two uploads for one oid
				}
				if err := b.Move(f.Name(), oid, tid); err != nil {
					return
				}
				placed = append(placed, blobRev{oid, tid, data})
			}
			if err := b.Sync(); err != nil {
				return
			}
			acked = append(acked, placed...)
		}
	}()
	n := cfs.Ops()
	cfs.Crash()
	if crashAt < 0 {
		return n, len(acked)
	}
	_, at := cfs.Crashed()
	where := fmt.Sprintf("crash at %s, torn %v", at, torn)
	after := pt.Materialize(t, seed, torn)
	if len(acked) == 0 {
		return n, 0
	}
	d, err := Open(filepath.Join(after, "blobs"), "")
	if err != nil {
		t.Fatalf("%s: reopen: %v", where, err)
	}
	if d.Layout() != "bushy" {
		t.Fatalf("%s: layout %s after the power loss", where, d.Layout())
	}
	for _, r := range acked {
		got, err := os.ReadFile(d.FilePath(r.oid, r.tid))
		if err != nil {
			t.Fatalf("%s: blob %s@%s: %v", where, r.oid, r.tid, err)
		}
		if !bytes.Equal(got, r.data) {
			t.Fatalf("%s: blob %s@%s has %d bytes, not the %d synced", where, r.oid, r.tid, len(got), len(r.data))
		}
	}
	return n, len(acked)
}

// TestPowerLossDirOfUndoneBatch: a batch that created an oid's directory
// and was undone before its Sync leaves that directory's entry not
// durable; a later batch placing a blob in the directory, found existing,
// must make it durable all the same, or a power loss takes the blob it
// synced.
func TestPowerLossDirOfUndoneBatch(t *testing.T) {
	pt := crashfs.NewPoint(t, t.TempDir(), -1)
	defer pt.Remove()
	cfs := pt.FS
	d, err := OpenFS(filepath.Join(pt.Src, "blobs"), "", cfs)
	if err != nil {
		t.Fatal(err)
	}
	upload := func(name string, data []byte) string {
		f, err := cfs.OpenFile(filepath.Join(d.TempDir(), name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := cfs.WriteAt(f, data, 0); err != nil {
			t.Fatal(err)
		}
		if err := cfs.Sync(f); err != nil {
			t.Fatal(err)
		}
		return f.Name()
	}
	const oid = zodb.Oid(0x1234)
	t1, t2 := zodb.Tid(0x03d0000000000001), zodb.Tid(0x03d0000000000002)
	a := d.NewBatch()
	if err := a.Move(upload("a", []byte("aborted")), oid, t1); err != nil {
		t.Fatal(err)
	}
	a.Undo() // the transaction failed before its Sync
	b := d.NewBatch()
	if err := b.Move(upload("b", []byte("committed")), oid, t2); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	cfs.Crash()
	after := pt.Materialize(t, 1, false)
	d2, err := Open(filepath.Join(after, "blobs"), "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(d2.FilePath(oid, t2)); err != nil || string(got) != "committed" {
		t.Fatalf("blob synced by the second batch after the power loss: %q, %v", got, err)
	}
}
