package zeo

// Close and Shutdown wait for what the connections started that uses a
// storage: the caller closes the storages next.

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// gatedFinish is a FileStorage whose transactions' Finish says on
// entered that it started and waits for release.
type gatedFinish struct {
	*fs1.FileStorage
	entered chan struct{}
	release chan struct{}
}

func (s *gatedFinish) Begin(ctx context.Context, meta zodb.TxnMeta) (zodb.Txn, error) {
	t, err := s.FileStorage.Begin(ctx, meta)
	if err != nil {
		return nil, err
	}
	return &gatedFinishTxn{Txn: t, s: s}, nil
}

type gatedFinishTxn struct {
	zodb.Txn
	s *gatedFinish
}

func (t *gatedFinishTxn) Finish(ctx context.Context, onCommit func(zodb.Tid, []zodb.Oid)) (zodb.Tid, error) {
	t.s.entered <- struct{}{}
	<-t.s.release
	return t.Txn.Finish(ctx, onCommit)
}

// TestShutdownWaitsForFinish: Shutdown promises connections until
// ctx is done "to finish the commits they are in the middle of (finish
// waiting for its fsync)", and Close waits for "the connection
// goroutines"; but a tpc_finish runs on a goroutine of its own that
// neither waited for (abortTxn leaves a finishing transaction alone and
// cleanup returns): Shutdown returned nil, and Close returned, while the
// commit was still in the storage, which the caller closes next.
func TestShutdownWaitsForFinish(t *testing.T) {
	fs, err := fs1.Open(filepath.Join(t.TempDir(), "Data.fs"), &fs1.Options{Create: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	st := &gatedFinish{FileStorage: fs, entered: make(chan struct{}, 1), release: make(chan struct{})}
	srv, addr := startServerOn(t, Config{Storages: []StorageConfig{{Name: "1", Storage: st}}}, nil)
	c := dialRawRW(t, addr, wire.Pickle)
	if r := storeAndVote(t, c, 20, 5, true, 1, 0, []byte("a")); r.Len() != 0 {
		t.Fatalf("vote: %v", r)
	}
	c.send(t, 21, "tpc_finish", func(e *wire.Encoder) { e.Int(5) }, 1)
	<-st.entered // the commit is in the storage's Finish
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	select {
	case err := <-done:
		close(st.release)
		t.Fatalf("Shutdown returned (%v) while a tpc_finish was still committing in the storage", err)
	case <-time.After(500 * time.Millisecond):
		close(st.release) // Shutdown waits for the finish: right
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// gatedPack is a FileStorage whose Pack says on entered that it
// started, and once its ctx is done takes until release to return (a
// pack finishing the step it is in).
type gatedPack struct {
	*fs1.FileStorage
	entered chan struct{}
	release chan struct{}
}

func (s *gatedPack) Pack(ctx context.Context, at zodb.Tid, gc bool) error {
	s.entered <- struct{}{}
	<-ctx.Done()
	<-s.release
	return ctx.Err()
}

// TestCloseWaitsForPack: pack(t, wait=False) runs the pack on a
// goroutine that nothing tracked: Close cancelled its context but returned
// without waiting for it, so the pack was still inside the storage when
// Close returned (and the caller closed the storage).
func TestCloseWaitsForPack(t *testing.T) {
	fs, err := fs1.Open(filepath.Join(t.TempDir(), "Data.fs"), &fs1.Options{Create: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	st := &gatedPack{FileStorage: fs, entered: make(chan struct{}, 1), release: make(chan struct{})}
	srv, addr := startServerOn(t, Config{Storages: []StorageConfig{{Name: "1", Storage: st}}}, nil)
	c := dialRawRW(t, addr, wire.Pickle)
	c.call(t, 2, "pack", func(e *wire.Encoder) { e.Float(float64(time.Now().Unix())); e.Bool(false) }, 2)
	<-st.entered
	done := make(chan struct{})
	go func() { srv.Close(); close(done) }()
	select {
	case <-done:
		close(st.release)
		t.Fatal("Close returned while a pack it started (pack(wait=False)) was still running in the storage")
	case <-time.After(500 * time.Millisecond):
		close(st.release) // Close waits for the pack: right
		<-done
	}
}
