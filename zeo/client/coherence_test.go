package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/internal/zeotest"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zodb"
)

// Clients that commit and read through their own cache against zodbd's
// ZEO server (storagetest.CommitReadCoherence).
func TestCommitReadCoherence(t *testing.T) {
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	storagetest.CommitReadCoherence(t, func(t testing.TB, cache int64) storagetest.CoherentClient {
		return dial(t, addr, &client.Options{ReadWrite: true, CacheSize: cache})
	})
}

// Prefetch racing with Close (run with -race): Fail finished, and
// recycled, the prefetch's load while its Ask still read it.
func TestPrefetchCloseRace(t *testing.T) {
	ctx := context.Background()
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	for i := 0; i < 30; i++ {
		c := dial(t, addr, &client.Options{CacheSize: 1 << 20})
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for o := zodb.Oid(0); ; o++ {
				select {
				case <-stop:
					return
				default:
				}
				c.Prefetch(ctx, zodb.Xid{Oid: o % 1000, At: zodb.Tid(o)})
			}
		}()
		time.Sleep(time.Millisecond)
		c.Close()
		close(stop)
		<-done
	}
}
