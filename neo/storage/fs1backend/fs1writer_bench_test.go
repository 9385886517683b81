package fs1backend

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// BenchmarkFS1WriterCommit commits transactions of 10 objects of 200 bytes
// through the Writer (Vote, Lock, Unlock) on a copy of a Data.fs, with 1
// or 16 committers, the default fs1 commit (two fdatasyncs for a lone
// transaction) and SingleFsync. Lock calls begin in tid order and Unlock
// calls come in tid order, as the node makes them; several Locks are in
// flight at once with several committers. It reports the final-tid log's
// fdatasyncs per commit (fs1's come on top: see fs1Writes).
func BenchmarkFS1WriterCommit(b *testing.B) {
	for _, single := range []bool{false, true} {
		for _, n := range []int{1, 16} {
			b.Run(fmt.Sprintf("singlefsync=%v/committers=%d", single, n), func(b *testing.B) {
				benchFS1Commit(b, n, single)
			})
		}
	}
}

func benchFS1Commit(b *testing.B, committers int, single bool) {
	ctx := context.Background()
	path := fs1Copy(b)
	be, err := OpenWriter(path, &fs1.Options{SingleFsync: single, Logf: func(string, ...interface{}) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	ids, _ := be.LastIDs(ctx)
	w := be.w

	var seq sync.Mutex // hands out tids and orders the Locks' beginnings
	next := ids.Tid
	prevUnlocked := make(chan struct{})
	close(prevUnlocked)
	data := []byte(strings.Repeat("x", 200))

	one := func(c int) error {
		seq.Lock()
		ttid := next + 1
		tid := next + 2
		next = tid
		mine := make(chan struct{})
		prev := prevUnlocked
		prevUnlocked = mine
		objs := make([]storage.VotedObject, 10)
		for i := range objs {
			objs[i] = storage.VotedObject{Oid: ids.Oid + 1 + zodb.Oid(c*10+i), Data: data}
		}
		if err := be.Vote(ctx, &storage.VotedTxn{TTid: ttid, Meta: &storage.TxnMeta{User: []byte("bench")}, Objects: objs}); err != nil {
			seq.Unlock()
			return err
		}
		locked := make(chan error, 1)
		go func() { locked <- be.Lock(ctx, ttid, tid) }()
		// Hold seq until this Lock has begun (registered its tid).
		for {
			w.mu.Lock()
			_, p := w.pending[tid]
			_, l := w.locked[ttid]
			v := w.voted[ttid]
			w.mu.Unlock()
			if p || l || v == nil || v.locking {
				break
			}
			runtime.Gosched()
		}
		seq.Unlock()
		if err := <-locked; err != nil {
			<-prev
			close(mine)
			return err
		}
		<-prev
		err := be.Unlock(ctx, ttid, tid)
		close(mine)
		return err
	}

	w.log.mu.Lock()
	sync0 := w.log.nsync
	w.log.mu.Unlock()
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make(chan error, committers)
	for c := 0; c < committers; c++ {
		ops := b.N / committers
		if c < b.N%committers {
			ops++
		}
		wg.Add(1)
		go func(c, ops int) {
			defer wg.Done()
			for i := 0; i < ops; i++ {
				if err := one(c); err != nil {
					errs <- err
					return
				}
			}
		}(c, ops)
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	w.log.mu.Lock()
	b.ReportMetric(float64(w.log.nsync-sync0)/float64(b.N), "logsyncs/op")
	w.log.mu.Unlock()
}

// BenchmarkFS1Object is the backend's Object without the network: a
// read-only backend, and one opened for writes (whose reads are bounded by
// the last unlocked tid), with a transaction locked and not unlocked that
// changed the object read (one more header read).
func BenchmarkFS1Object(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, be *Backend) {
		o := storage.Object{Data: make([]byte, 0, 64<<10)}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := be.Object(ctx, 0, 0, 0, &o); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("readonly", func(b *testing.B) {
		be, err := Open("../../../fs1/testdata/1.fs")
		if err != nil {
			b.Fatal(err)
		}
		defer be.Close()
		run(b, be)
	})
	for _, locked := range []bool{false, true} {
		b.Run(fmt.Sprintf("writer/locked=%v", locked), func(b *testing.B) {
			be, err := OpenWriter(fs1Copy(b), &fs1.Options{Logf: func(string, ...interface{}) {}})
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			if locked {
				g := newTids(b, be)
				ttid, tid := g.next(), g.next()
				if err := be.Vote(ctx, &storage.VotedTxn{TTid: ttid, Meta: &storage.TxnMeta{}, Objects: []storage.VotedObject{raw(0, "locked")}}); err != nil {
					b.Fatal(err)
				}
				if err := be.Lock(ctx, ttid, tid); err != nil {
					b.Fatal(err)
				}
			}
			run(b, be)
		})
	}
}
