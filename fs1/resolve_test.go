package fs1

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// load returns the current data of oid.
func loadString(t *testing.T, fs *FileStorage, oid zodb.Oid) string {
	t.Helper()
	data, _, err := fs.Load(bg, zodb.Xid{Oid: oid, At: zodb.TidMax})
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func resolvingTxn(t *testing.T, fs *FileStorage) zodb.ResolvingTxn {
	t.Helper()
	tx, err := fs.Begin(bg, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tx.Abort) // a failing test must not leave the commit lock held
	return tx.(zodb.ResolvingTxn)
}

// A transaction whose vote returned conflicts keeps the commit lock: no
// other transaction commits before it has stored its resolution and voted
// again, which then cannot conflict.
func TestVoteResolvingHoldsLock(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "v1"})
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "a"})

	b := resolvingTxn(t, fs)
	b.Store(1, t1, []byte("b"))
	_, err := b.VoteResolving(bg, nil)
	var conflicts zodb.ConflictErrors
	if !errors.As(err, &conflicts) || len(conflicts) != 1 {
		t.Fatalf("vote: %v, want one conflict", err)
	}
	if ce := conflicts[0]; ce.Oid != 1 || ce.Committed != t2 || ce.Serial != t1 || string(ce.Data) != "b" {
		t.Fatalf("conflict %+v data %q", ce, ce.Data)
	}

	// Another committer of the same object waits for the lock.
	other := make(chan error, 1)
	go func() {
		_, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(1, t2, []byte("c")) })
		other <- err
	}()
	for fs.w.commit.Waiting() == 0 {
		select {
		case err := <-other:
			t.Fatalf("a commit went through while a conflicted transaction held the lock: %v", err)
		default:
			time.Sleep(time.Millisecond)
		}
	}

	b.Store(1, t2, []byte("a+b"))
	resolved, err := b.VoteResolving(bg, nil)
	if err != nil || len(resolved) != 0 {
		t.Fatalf("second vote: %v %v", resolved, err)
	}
	if _, err := b.Finish(bg, nil); err != nil {
		t.Fatal(err)
	}
	if got := loadString(t, fs, 1); got != "a+b" {
		t.Fatalf("after the resolved commit: %q", got)
	}
	// The waiting committer based its store on t2: it conflicts now.
	if err := <-other; !errors.As(err, &conflicts) {
		t.Fatalf("the waiting commit: %v, want a conflict", err)
	}
	if got := loadString(t, fs, 1); got != "a+b" {
		t.Fatalf("after the waiting commit: %q", got)
	}
}

// Abort of a conflicted transaction releases the commit lock.
func TestVoteResolvingAbort(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "v1"})
	commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "a"})
	b := resolvingTxn(t, fs)
	b.Store(1, t1, []byte("b"))
	if _, err := b.VoteResolving(bg, nil); err == nil {
		t.Fatal("no conflict")
	}
	b.Abort()
	if _, err := b.Finish(bg, nil); !errors.Is(err, zodb.ErrTxnState) {
		t.Fatalf("finish after abort: %v", err)
	}
	commit(t, fs, nil, map[zodb.Oid]string{2: "x"}) // would block on the lock
}

// The revision a conflict names is durable and loadable when VoteResolving
// returns, also while the transaction that wrote it waits for its fsync: a
// client resolving the conflict loads it at once.
func TestVoteResolvingConflictLoadable(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "v1"})

	n0 := fs.w.nsync.Load()
	gate := make(chan struct{})
	realSync := fs.w.sync
	fs.w.sync = func(slot int) error { <-gate; return realSync(slot) }
	finished := make(chan error, 1)
	go func() {
		_, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(1, t1, []byte("a")) })
		finished <- err
	}()
	// Let the syncer go on a while after the conflict is found (without
	// the wait, VoteResolving returns before that, and the load fails).
	go func() {
		time.Sleep(100 * time.Millisecond)
		close(gate)
	}()

	b := resolvingTxn(t, fs)
	b.Store(1, t1, []byte("b"))
	// The first commit must have finished (be the head, its fsync under
	// way) before b votes, else b does not conflict.
	for fs.w.nsync.Load() == n0 {
		time.Sleep(time.Millisecond)
	}
	_, err := b.VoteResolving(bg, nil)
	var conflicts zodb.ConflictErrors
	if !errors.As(err, &conflicts) {
		t.Fatalf("vote: %v", err)
	}
	data, serial, err := fs.Load(bg, zodb.Xid{Oid: 1, At: conflicts[0].Committed})
	if err != nil || serial != conflicts[0].Committed || string(data) != "a" {
		t.Fatalf("load of the committed serial %s: %q %s %v", conflicts[0].Committed, data, serial, err)
	}
	b.Abort()
	if err := <-finished; err != nil {
		t.Fatal(err)
	}
}

// concat is a resolver that shows its arguments.
func concat(old, committed, new []byte) ([]byte, error) {
	if string(new) == "refuse" {
		return nil, errors.New("refused")
	}
	return []byte(fmt.Sprintf("%s|%s|%s", old, committed, new)), nil
}

// The resolver merges stale stores under the lock; what it refuses goes to
// the caller.
func TestVoteResolvingNative(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "o1", 2: "o2", 3: "o3"})
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1, 2: t1}, map[zodb.Oid]string{1: "c1", 2: "c2"})
	b := resolvingTxn(t, fs)
	b.Store(1, t1, []byte("n1"))
	b.Store(2, t1, []byte("refuse"))
	b.Store(3, t1, []byte("n3"))
	_, err := b.VoteResolving(bg, concat)
	var conflicts zodb.ConflictErrors
	if !errors.As(err, &conflicts) || len(conflicts) != 1 || conflicts[0].Oid != 2 || conflicts[0].Committed != t2 {
		t.Fatalf("vote: %v", err)
	}
	b.Store(2, t2, []byte("r2"))
	resolved, err := b.VoteResolving(bg, concat)
	if err != nil || !slices.Equal(resolved, []zodb.Oid{1}) {
		t.Fatalf("second vote: %v %v, want [1] resolved", resolved, err)
	}
	if _, err := b.Finish(bg, nil); err != nil {
		t.Fatal(err)
	}
	for oid, want := range map[zodb.Oid]string{1: "o1|c1|n1", 2: "r2", 3: "n3"} {
		if got := loadString(t, fs, oid); got != want {
			t.Errorf("oid %s: %q, want %q", oid, got, want)
		}
	}
}

// An undo of a revision changed later is given to the resolver (old: the
// undone revision, committed: the current one, new: the one before the
// undone); what it cannot merge is an UndoError, as with Vote.
func TestVoteResolvingUndo(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "A", 2: "X", 3: "P"})
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1, 2: t1, 3: t1}, map[zodb.Oid]string{1: "B", 2: "Y", 3: "Q"})
	t3 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t2, 3: t2}, map[zodb.Oid]string{1: "C", 3: "refuse"})

	// A plain Vote refuses.
	if _, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Undo(t2) }); !errors.As(err, new(*zodb.UndoError)) {
		t.Fatalf("plain undo: %v, want an UndoError", err)
	}
	// The resolver refuses oid 3 (its "new", the revision before the
	// undone one, is P; its committed one is "refuse").
	refuse3 := func(old, committed, new []byte) ([]byte, error) {
		if string(committed) == "refuse" {
			return nil, errors.New("refused")
		}
		return concat(old, committed, new)
	}
	b := resolvingTxn(t, fs)
	b.Undo(t2)
	var ue *zodb.UndoError
	if _, err := b.VoteResolving(bg, refuse3); !errors.As(err, &ue) || ue.Oid != 3 {
		t.Fatalf("undo with an unresolvable object: %v, want an UndoError for oid 3", err)
	}
	commit(t, fs, map[zodb.Oid]zodb.Tid{3: t3}, map[zodb.Oid]string{3: "R"})

	b = resolvingTxn(t, fs)
	b.Undo(t2)
	undone, err := b.VoteResolving(bg, refuse3)
	if err != nil {
		t.Fatal(err)
	}
	if want := []zodb.Oid{2, 1, 3}; !slices.Equal(undone, want) {
		t.Errorf("undone %v, want %v", undone, want)
	}
	tid, err := b.Finish(bg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for oid, want := range map[zodb.Oid]string{1: "B|C|A", 2: "X", 3: "Q|R|P"} {
		if got := loadString(t, fs, oid); got != want {
			t.Errorf("oid %s: %q, want %q", oid, got, want)
		}
	}
	// One record per oid in the undo transaction.
	it := fs.Iterate(bg, tid, tid)
	_, dit, err := it.NextTxn(bg)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		if _, err := dit.NextData(bg); err != nil {
			break
		}
		n++
	}
	if n != 3 {
		t.Errorf("undo transaction has %d records, want 3", n)
	}
}

// A resolver's final refusal (zodb.ErrNotResolvable) fails the vote with a
// ConflictError at once: no client could resolve it, so the lock is not
// held for one to try. After an earlier stale store, that one's conflict
// comes first (ZODB/py, resolving in order, names it): the vote after its
// resolution fails with the refusal.
func TestVoteResolvingRefused(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "o1", 2: "o2"})
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1, 2: t1}, map[zodb.Oid]string{1: "c1", 2: "c2"})
	refuse := func(old, committed, new []byte) ([]byte, error) {
		if string(new) == "final" {
			return nil, fmt.Errorf("bucket: %w", zodb.ErrNotResolvable)
		}
		return nil, errors.New("cannot tell")
	}
	for i, earlier := range []bool{false, true} {
		b := resolvingTxn(t, fs)
		if earlier {
			b.Store(1, t1, []byte("other"))
		}
		b.Store(2, t1, []byte("final"))
		_, err := b.VoteResolving(bg, refuse)
		if earlier {
			var ces zodb.ConflictErrors
			if !errors.As(err, &ces) || len(ces) != 1 || ces[0].Oid != 1 {
				t.Fatalf("vote: %v, want the conflict of oid 1 (stored first) alone", err)
			}
			b.Store(1, t2, []byte("resolved"))
			_, err = b.VoteResolving(bg, refuse)
		}
		var ce *zodb.ConflictError
		if !errors.As(err, &ce) || ce.Oid != 2 || ce.Committed != t2 || ce.Serial != t1 {
			t.Fatalf("vote: %v, want the final conflict of oid 2", err)
		}
		if _, err := b.VoteResolving(bg, refuse); !errors.Is(err, zodb.ErrTxnState) {
			t.Fatalf("vote after a final conflict: %v, want ErrTxnState", err)
		}
		commit(t, fs, nil, map[zodb.Oid]string{zodb.Oid(3 + i): "x"}) // the lock is free
	}
}
