package client_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/zodb"
)

// TestLoadReuse stresses the reuse of finished loads (load.go: loadCall):
// 16 goroutines load a few revisions over and over through one client with
// the cache off, so that most loads join one in flight, and every third
// load has a deadline that may expire while it waits or while it leads.
// Every answer must be the revision's data: a call or answer buffer reused
// while a caller still copied from it would show here, or to the race
// detector; a lost wake-up shows as the loads never finishing.
func TestLoadReuse(t *testing.T) {
	bg := context.Background()
	master, direct := fs1Cluster(t)
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{master}, CacheSize: -1})
	head, _ := c.LastTid(bg)
	const nOid = 4
	want := make([][]byte, nOid)
	for oid := range want {
		data, _, err := direct.Load(bg, zodb.Xid{Oid: zodb.Oid(oid), At: head})
		if err != nil {
			t.Fatal(err)
		}
		want[oid] = data
	}
	var wg sync.WaitGroup
	var loads, cancelled atomic.Int64
	stop := time.Now().Add(time.Second)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 0, 4096)
			for i := 0; time.Now().Before(stop); i++ {
				oid := (g + i) % nOid
				ctx, cancel := bg, context.CancelFunc(func() {})
				if i%3 == 0 {
					ctx, cancel = context.WithTimeout(bg, time.Duration(i%50)*time.Microsecond)
				}
				var data []byte
				var err error
				if i%2 == 0 {
					data, _, err = c.LoadAppend(ctx, zodb.Xid{Oid: zodb.Oid(oid), At: head}, buf[:0])
				} else {
					data, _, _, err = c.LoadBefore(ctx, zodb.Oid(oid), head+1, buf[:0])
				}
				cancel()
				switch {
				case err == nil:
					loads.Add(1)
					if !bytes.Equal(data, want[oid]) {
						t.Errorf("oid %d: got %d bytes, want %d bytes", oid, len(data), len(want[oid]))
						return
					}
				case errors.Is(err, context.DeadlineExceeded):
					cancelled.Add(1)
				default:
					t.Errorf("oid %d: %v", oid, err)
					return
				}
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		t.Fatal("loads still waiting 30 s after the end (a lost wake-up)")
	}
	t.Logf("%d loads, %d cancelled", loads.Load(), cancelled.Load())
	if loads.Load() == 0 || cancelled.Load() == 0 {
		t.Errorf("the stress did not stress: %d loads, %d cancelled", loads.Load(), cancelled.Load())
	}
}
