package client_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/zeotest"
	"github.com/zodbd/zodbd/zodb"
)

// TestAbandonedIteratorsForgotten: an iterator that the caller drops
// before its end (a search that found what it looked for) kept its
// server-side iterators (iterator_start's, iterator_record_start's) for
// as long as the connection lived: the client sent iterator_gc only after
// the last transaction, and zodb.Iterator has no Close. The server keeps
// at most 1024 per connection, after which every Iterate on that
// connection failed. (ZODB/py's ClientStorage sends iterator_gc for the
// iterators that are garbage-collected.) Half of them here also leave a
// record iterator behind, the other half move on from one.
func TestAbandonedIteratorsForgotten(t *testing.T) {
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	c := dial(t, addr, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 1100 {
		it := c.Iterate(ctx, 0, zodb.TidMax)
		_, data, err := it.NextTxn(ctx)
		if err != nil {
			t.Fatalf("iteration %d (the %d before it abandoned after their first transaction): %v", i, i, err)
		}
		if _, err := data.NextData(ctx); err != nil {
			t.Fatalf("iteration %d: first record: %v", i, err)
		}
		if i%2 == 0 { // on to the next transaction, the record iterator left
			if _, _, err := it.NextTxn(ctx); err != nil {
				t.Fatalf("iteration %d: second transaction: %v", i, err)
			}
		}
		// abandoned (a search that found its transaction), and
		// collected:
		if i%100 == 99 {
			runtime.GC()
		}
	}
}
