package blob_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// gateFS holds back the first Remove of a committed blob file made while
// armed, until release is closed (or 5 s pass).
type gateFS struct {
	vfs.FS
	mu      sync.Mutex
	armed   bool
	release chan struct{}
	held    chan struct{} // closed when the held Remove starts waiting
}

func (g *gateFS) Remove(name string) error {
	g.mu.Lock()
	hold := g.armed && strings.HasSuffix(name, blob.Suffix)
	if hold {
		g.armed = false
	}
	g.mu.Unlock()
	if hold {
		close(g.held)
		select {
		case <-g.release:
		case <-time.After(5 * time.Second):
		}
	}
	return g.FS.Remove(name)
}

func upload(t *testing.T, s *blob.Storage, content string) string {
	t.Helper()
	u, err := s.NewBlobUpload()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.Write([]byte(content)); err != nil {
		t.Fatal(err)
	}
	p, err := u.Close()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAbortRemovesFilesUnderLock: Abort removes the blob files placed at
// vote before the wrapped transaction's abort lets go of the commit lock:
// the next transaction may get the same tid (the storage's last tid ahead
// of the clock: every new tid is last+1) and place a file at the same
// path for the same oid, which a late removal took after it committed.
func TestAbortRemovesFilesUnderLock(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fs, err := fs1.Open(filepath.Join(dir, "Data.fs"), &fs1.Options{ReadWrite: true, Logf: func(string, ...interface{}) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	g := &gateFS{FS: vfs.OS, release: make(chan struct{}), held: make(chan struct{})}
	d, err := blob.OpenFS(filepath.Join(dir, "blobs"), "", g)
	if err != nil {
		t.Fatal(err)
	}
	s := blob.Wrap(fs, d)
	oids, err := s.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	oid := oids[0]

	// A first transaction with a tid an hour ahead of the clock (as after
	// a clock step back, or a copy from a machine whose clock was ahead).
	future := zodb.TidFromTime(time.Now().Add(time.Hour))
	tx0, err := s.Begin(ctx, zodb.TxnMeta{Tid: future})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx0.(zodb.BlobTxn).StoreBlob(oid, 0, []byte("d0"), upload(t, s, "v0")); err != nil {
		t.Fatal(err)
	}
	if _, err := tx0.Vote(ctx); err != nil {
		t.Fatal(err)
	}
	t0, err := tx0.Finish(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}

	// A: stores a blob, votes (tid t0+1, file placed), then aborts (as
	// tpc_abort after a successful vote, e.g. another database of the
	// same ZODB transaction failed its vote).
	txA, err := s.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if err := txA.(zodb.BlobTxn).StoreBlob(oid, t0, []byte("dA"), upload(t, s, "A")); err != nil {
		t.Fatal(err)
	}
	if _, err := txA.Vote(ctx); err != nil {
		t.Fatal(err)
	}
	tidA := txA.(interface{ Tid() zodb.Tid }).Tid()

	// B: another client's transaction storing the same oid, waiting for
	// the commit lock.
	type result struct {
		tid zodb.Tid
		err error
	}
	done := make(chan result, 1)
	go func() {
		txB, err := s.Begin(ctx, zodb.TxnMeta{})
		if err == nil {
			err = txB.(zodb.BlobTxn).StoreBlob(oid, t0, []byte("dB"), upload(t, s, "B"))
		}
		if err == nil {
			_, err = txB.Vote(ctx)
		}
		var tid zodb.Tid
		if err == nil {
			tid, err = txB.Finish(ctx, nil)
		}
		done <- result{tid, err}
	}()
	time.Sleep(200 * time.Millisecond) // B waits for the lock

	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()
	aborted := make(chan struct{})
	go func() { txA.Abort(); close(aborted) }()
	<-g.held                           // A's Undo is about to remove its file
	time.Sleep(100 * time.Millisecond) // B commits meanwhile if A let go of the lock
	close(g.release)
	<-aborted
	r := <-done
	if r.err != nil {
		t.Fatalf("B: %v", r.err)
	}
	if r.tid != tidA {
		t.Skipf("B got tid %s, A had %s: the paths differ", r.tid, tidA)
	}
	_, serial, err := fs.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
	if err != nil || serial != r.tid {
		t.Fatalf("load: serial %s err %v, want %s", serial, err, r.tid)
	}
	f, err := s.OpenBlob(ctx, oid, r.tid)
	if err != nil {
		t.Fatalf("the blob of committed transaction %s (oid %s) is gone: %v", r.tid, oid, err)
	}
	b, _ := readAll(f)
	if string(b) != "B" {
		t.Fatalf("blob of %s: %q, want %q", r.tid, b, "B")
	}
}

func readAll(f *os.File) ([]byte, error) {
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b := make([]byte, fi.Size())
	_, err = f.ReadAt(b, 0)
	return b, err
}
