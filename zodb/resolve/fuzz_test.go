package resolve

import (
	"bytes"
	"errors"
	"runtime"
	"testing"
)

// allocBound is the most FuzzResolve lets Resolve allocate for records of
// n bytes (decompressed).
func allocBound(n int) uint64 { return 512*uint64(n) + 512<<10 }

// FuzzResolve resolves arbitrary records: Resolve must not panic, must
// allocate no more than a fixed multiple of the input size, and must
// return either a record that Resolve reads back as a state of the class
// or an error that is ErrUnsupported or a RefusedError. The seeds are the
// fixtures and mutations of them.
func FuzzResolve(f *testing.F) {
	for _, fx := range loadFixtures(f) {
		f.Add(fx.old, fx.committed, fx.new)
		f.Add(fx.old, fx.new, fx.committed)
		f.Add(fx.committed, fx.committed, fx.new)
	}
	f.Fuzz(func(t *testing.T, old, committed, new []byte) {
		// The decompressed size, outside the measure.
		n := 0
		for _, rec := range [][]byte{old, committed, new} {
			n += len(rec)
			if bytes.HasPrefix(rec, []byte(".z")) {
				if b, err := inflate(nil, rec[2:], expandFactor*len(rec)+expandSlack); err == nil {
					n += len(b)
				}
			}
		}
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		out, err := Resolve(old, committed, new)
		runtime.ReadMemStats(&m1)
		if a := m1.TotalAlloc - m0.TotalAlloc; a > allocBound(n) {
			t.Fatalf("Resolve allocated %d bytes for %d bytes of records (bound %d)", a, n, allocBound(n))
		}
		if err != nil {
			if !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrRefused) {
				t.Fatalf("error neither ErrUnsupported nor ErrRefused: %v", err)
			}
			return
		}
		// The result reads back: the same class, a state Resolve reads.
		if _, err := Resolve(out, out, out); err != nil && !errors.Is(err, ErrRefused) {
			t.Fatalf("Resolve's own result does not read back: %v\n%x", err, out)
		}
	})
}
