package storage_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// TestCounters: Go NEO clients increment three shared counters through a
// read-write node, two per transaction in random order (conflicts, and the
// deadlock avoidance of two transactions locking the same oids in
// opposite orders), retrying on conflict: no increment is lost or applied
// twice, on each backend. Disrupted: meanwhile other clients store to the
// counters and go away before or after their vote; the locks they held
// are released (the connection's end, the master's client-lost abort) and
// the counters come out exact.
func TestCounters(t *testing.T) {
	for _, bk := range []string{"mem", "fs1", "sqlite"} {
		for _, disrupt := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/disrupted=%v", bk, disrupt), func(t *testing.T) {
				var be storage.Backend
				switch bk {
				case "mem":
					be = newMemWriter()
				case "fs1":
					fb, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { fb.Close() })
					be = fb
				case "sqlite":
					be = newSQLiteBackend(t)
				}
				counters(t, be, disrupt)
			})
		}
	}
}

func counters(t *testing.T, be storage.Backend, disrupt bool) {
	m, _, _ := neotest.StartNode(t, cluster, be)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func() *client.Client {
		c, err := client.Dial(ctx, &client.Options{Cluster: cluster, Masters: []string{m.Addr()}, Logf: func(string, ...interface{}) {}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	const ncounters, clients, commits = 3, 5, 20
	c0 := dial()
	defer c0.Close()
	oids, err := c0.NewOids(ctx, ncounters)
	if err != nil {
		t.Fatal(err)
	}
	tx, _ := c0.Begin(ctx, zodb.TxnMeta{})
	for _, o := range oids {
		tx.Store(o, 0, []byte("0"))
	}
	if _, err := tx.Vote(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var disrupted, retries atomic.Int64
	var dwg sync.WaitGroup
	for d := range map[bool]int{false: 0, true: 2}[disrupt] {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			rnd := rand.New(rand.NewPCG(uint64(d), 99))
			for {
				select {
				case <-stop:
					return
				default:
				}
				c := dial()
				if tx, err := c.Begin(ctx, zodb.TxnMeta{}); err == nil {
					for _, j := range rnd.Perm(ncounters)[:2] {
						if _, serial, err := c.Load(ctx, zodb.Xid{Oid: oids[j], At: zodb.TidMax}); err == nil {
							tx.Store(oids[j], serial, []byte("garbage"))
						}
					}
					if rnd.IntN(2) == 0 {
						vctx, vcancel := context.WithTimeout(ctx, 200*time.Millisecond)
						tx.Vote(vctx)
						vcancel()
					} else {
						time.Sleep(time.Duration(rnd.IntN(5)) * time.Millisecond)
					}
				}
				c.Close()
				disrupted.Add(1)
			}
		}()
	}

	var mu sync.Mutex
	want := make([]int, ncounters)
	var wg sync.WaitGroup
	errs := make([]error, clients)
	for i := range clients {
		c := dial()
		defer c.Close()
		rnd := rand.New(rand.NewPCG(uint64(i), 7))
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = func() error {
				for k := 0; k < commits; {
					perm := rnd.Perm(ncounters)[:2]
					tx, err := c.Begin(ctx, zodb.TxnMeta{})
					if err != nil {
						return err
					}
					for _, j := range perm {
						data, serial, err := c.Load(ctx, zodb.Xid{Oid: oids[j], At: zodb.TidMax})
						if err != nil {
							tx.Abort()
							return err
						}
						v, _ := strconv.Atoi(string(data))
						tx.Store(oids[j], serial, []byte(strconv.Itoa(v+1)))
					}
					if _, err := tx.Vote(ctx); err != nil {
						tx.Abort()
						var ce zodb.ConflictErrors
						var ce1 *zodb.ConflictError
						if errors.As(err, &ce) || errors.As(err, &ce1) {
							retries.Add(1)
							c.Sync(ctx)
							continue
						}
						return err
					}
					if _, err := tx.Finish(ctx, nil); err != nil {
						return err
					}
					mu.Lock()
					want[perm[0]]++
					want[perm[1]]++
					mu.Unlock()
					k++
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(stop)
	dwg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	c := dial()
	defer c.Close()
	for j, o := range oids {
		data, _, err := c.Load(ctx, zodb.Xid{Oid: o, At: zodb.TidMax})
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := strconv.Atoi(string(data)); got != want[j] {
			t.Errorf("counter %d: %q, want %d", j, data, want[j])
		}
	}
	if retries.Load() == 0 {
		t.Error("no conflict: the test checks nothing of the locks")
	}
	t.Logf("%d conflicts retried, %d clients gone mid-transaction", retries.Load(), disrupted.Load())
}
