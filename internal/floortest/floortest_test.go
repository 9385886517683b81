package floortest

import (
	"errors"
	"os"
	"testing"
	"time"
)

// TestEcho checks that each round trip gets exactly the answer size it
// asks for: a byte too many or too few would show in the next one.
func TestEcho(t *testing.T) {
	c := StartEcho(t, 30).Dial(t)
	for _, n := range []int{0, 1, 160, 4096, 100 << 10, 7} {
		if err := c.RoundTrip(n); err != nil {
			t.Fatalf("RoundTrip(%d): %v", n, err)
		}
	}
	// Nothing is left unread: no byte comes within 50 ms.
	c.nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := c.nc.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after the round trips: read %d bytes, %v; want a timeout", n, err)
	}
}

// TestCompare checks the metrics Compare reports: a side that makes two
// round trips per round trip of the floor is about twice as slow, one
// that makes three is slower than that, relative to the first side too.
func TestCompare(t *testing.T) {
	e := StartEcho(t, 16)
	var failed bool
	r := testing.Benchmark(func(b *testing.B) {
		floor, two, three := e.Dial(b), e.Dial(b), e.Dial(b)
		rt := func(c *Conn, per int) func(i, k int) bool {
			return func(i, k int) bool {
				for j := 0; j < k*per; j++ {
					if err := c.RoundTrip(100); err != nil {
						failed = true
						return false
					}
				}
				return true
			}
		}
		Compare(b, rt(floor, 1), Side{"two", rt(two, 2)}, Side{"three", rt(three, 3)})
	})
	if failed {
		t.Fatal("a round trip failed")
	}
	for _, m := range []string{"floor-ns/op", "two-ns/op", "three-ns/op", "two-x-floor", "three-x-floor", "three-x-two"} {
		if _, ok := r.Extra[m]; !ok {
			t.Errorf("no metric %s in %v", m, r.Extra)
		}
	}
	if _, ok := r.Extra["two-x-two"]; ok {
		t.Errorf("metric two-x-two reported: %v", r.Extra)
	}
	if x := r.Extra["two-x-floor"]; x < 1.3 {
		t.Errorf("two-x-floor = %.2f, want about 2", x)
	}
	if x := r.Extra["three-x-floor"]; x < 1.8 {
		t.Errorf("three-x-floor = %.2f, want about 3", x)
	}
	if x := r.Extra["three-x-two"]; x < 1.1 {
		t.Errorf("three-x-two = %.2f, want about 1.5", x)
	}
}
