package zlibx

import (
	"bytes"
	"compress/zlib"
	"errors"
	"math"
	"runtime/metrics"
	"testing"
	"time"
)

func deflate(b []byte) []byte {
	var z bytes.Buffer
	w := zlib.NewWriter(&z)
	w.Write(b)
	w.Close()
	return z.Bytes()
}

func TestAppendInflate(t *testing.T) {
	for _, n := range []int{0, 1, 100, 70000, 1 << 20} {
		want := bytes.Repeat([]byte("zodbd "), n/6+1)[:n]
		z := deflate(want)
		for i := 0; i < 2; i++ { // a fresh reader, then a pooled one
			got, err := AppendInflate([]byte("prefix"), z)
			if err != nil || !bytes.Equal(got, append([]byte("prefix"), want...)) {
				t.Fatalf("%d bytes: %v, got %d bytes", n, err, len(got))
			}
		}
	}
	if got, err := AppendInflate([]byte("x"), []byte("not zlib")); err == nil || string(got) != "x" {
		t.Fatalf("bad input: %q %v", got, err)
	}
	// Damage after the header, in a pooled reader.
	z := deflate(bytes.Repeat([]byte("abc"), 1000))
	z[len(z)/2] ^= 0xff
	if got, err := AppendInflate([]byte("x"), z[:len(z)-6]); err == nil || string(got) != "x" {
		t.Fatalf("damaged input: %d bytes, %v", len(got), err)
	}
}

// TestAppendInflateMax: an output of exactly the bound is returned, one
// byte more is a *TooBigError, with dst unchanged, whatever dst's room.
func TestAppendInflateMax(t *testing.T) {
	for _, n := range []int{0, 1, 511, 512, 513, 4096, 70000, 300000} {
		want := bytes.Repeat([]byte("zodbd "), n/6+1)[:n]
		z := deflate(want)
		for _, dst := range [][]byte{nil, []byte("pre"), make([]byte, 3, 1<<20)} {
			got, err := AppendInflateMax(dst, z, n)
			if err != nil || !bytes.Equal(got[len(dst):], want) || !bytes.Equal(got[:len(dst)], dst) {
				t.Fatalf("%d bytes, bound %d: %v, got %d bytes", n, n, err, len(got))
			}
			if n == 0 {
				continue
			}
			got, err = AppendInflateMax(dst, z, n-1)
			var tb *TooBigError
			if !errors.As(err, &tb) || tb.Max != n-1 || !errors.Is(err, ErrTooBig) || len(got) != len(dst) {
				t.Fatalf("%d bytes, bound %d: %v, got %d bytes", n, n-1, err, len(got))
			}
		}
	}
}

var allocSample = []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}

// heapAllocs returns the bytes allocated on the heap so far by the process.
func heapAllocs() uint64 {
	metrics.Read(allocSample)
	return allocSample[0].Value.Uint64()
}

// inflateAllocBound is the most AppendInflateMax may allocate for src of
// n bytes and the bound limit: a fresh reader (about 45 KiB), the first
// guess, and twice the output's bound (doubling, rounded to size classes).
func inflateAllocBound(n, limit int) uint64 {
	return 128<<10 + 4*uint64(n) + 3*uint64(limit)
}

// inflateMeasured returns the fewest bytes that one of up to 3 runs of
// AppendInflateMax(nil, src, limit) allocated (the count is the process's:
// a measure over the bound is taken again before it counts).
func inflateMeasured(src []byte, limit int) (uint64, error) {
	a := uint64(math.MaxUint64)
	var err error
	for try := 0; try < 3 && a > inflateAllocBound(len(src), limit); try++ {
		a0 := heapAllocs()
		_, err = AppendInflateMax(nil, src, limit)
		a = min(a, heapAllocs()-a0)
	}
	return a, err
}

// TestZlibBomb: 128 MiB of zeros (about 128 KiB of zlib data) is refused at the
// bound, allocating in proportion to the bound.
func TestZlibBomb(t *testing.T) {
	if testing.Short() || raceDetector {
		t.Skip("inflates 32 MiB")
	}
	bomb := zeroBomb(128 << 20)
	for _, limit := range []int{1 << 20, 32 << 20} {
		a, err := inflateMeasured(bomb, limit)
		if !errors.Is(err, ErrTooBig) {
			t.Errorf("bound %d: %v, want ErrTooBig", limit, err)
		}
		if a > inflateAllocBound(len(bomb), limit) {
			t.Errorf("bound %d: allocated %d bytes for %d of zlib data", limit, a, len(bomb))
		}
		t.Logf("bomb of %d bytes, bound %d: allocated %d: %v", len(bomb), limit, a, err)
	}
}

// zeroBomb is the zlib data of n zero bytes, made without holding them.
func zeroBomb(n int) []byte {
	var z bytes.Buffer
	w, _ := zlib.NewWriterLevel(&z, zlib.BestCompression)
	zeros := make([]byte, 1<<20)
	for ; n > 0; n -= len(zeros) {
		w.Write(zeros[:min(n, len(zeros))])
	}
	w.Close()
	return z.Bytes()
}

// FuzzInflateMax inflates arbitrary data under a bound and fails when it
// allocates more than inflateAllocBound, or returns more than the bound.
// The seeds include zlib bombs.
func FuzzInflateMax(f *testing.F) {
	f.Add(deflate([]byte("hello, zodbd")), uint32(100))
	f.Add(zeroBomb(1<<20), uint32(4096))
	f.Add(zeroBomb(64<<10), uint32(64<<10))
	f.Add(deflate(bytes.Repeat([]byte{'N'}, 1<<16)), uint32(1<<16-1))
	f.Fuzz(func(t *testing.T, src []byte, limit uint32) {
		lim := int(limit % (8 << 20))
		a, err := inflateMeasured(src, lim)
		if a > inflateAllocBound(len(src), lim) {
			t.Fatalf("%d bytes, bound %d: allocated %d (%v)", len(src), lim, a, err)
		}
		got, err := AppendInflateMax([]byte("x"), src, lim)
		if len(got)-1 > lim || (err != nil && string(got) != "x") {
			t.Fatalf("bound %d: %d bytes back, %v", lim, len(got)-1, err)
		}
		if err == nil {
			if all, err := AppendInflateMax(nil, src, MaxRecord); err != nil || !bytes.Equal(all, got[1:]) {
				t.Fatalf("bound %d: differs from the unbounded inflate (%v)", lim, err)
			}
		}
	})
}

// TestBigInflatesTakeTurns: concurrent inflates of records that stand for
// far more than they hold (zlib bombs stored by a client, loaded by many)
// each held up to MaxRecord at once: 8 loads of a 1 MiB record, 8 GiB.
// An output past bigOutput now waits while another one's is: while the
// turn is taken, an inflate past it waits, and a small one does not.
func TestBigInflatesTakeTurns(t *testing.T) {
	small := deflate(bytes.Repeat([]byte{'a'}, 1<<20))
	big := zeroBomb(bigOutput + 1<<20)
	bigTurn <- struct{}{} // another inflate has the turn
	if out, err := AppendInflate(nil, small); err != nil || len(out) != 1<<20 {
		t.Fatalf("small inflate while the turn is taken: %d bytes, %v", len(out), err)
	}
	done := make(chan error, 1)
	go func() {
		out, err := AppendInflate(nil, big)
		if err == nil && len(out) != bigOutput+1<<20 {
			err = errors.New("wrong output length")
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("an inflate past %d bytes went on while another one's turn was taken (%v)", bigOutput, err)
	case <-time.After(200 * time.Millisecond):
	}
	<-bigTurn
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case bigTurn <- struct{}{}:
		<-bigTurn
	default:
		t.Fatal("the turn was not given back")
	}
}
