package msgp

import (
	"bytes"
	"testing"
)

// TestScannerResumes: sizing an object fed a few bytes at a time gives
// Len's answer and examines each object once.
func TestScannerResumes(t *testing.T) {
	objs := [][]byte{
		requestIdentification,
		append(AppendArrayHeader(nil, 100000), bytes.Repeat([]byte{0xc0}, 100000)...),
		append(append(AppendArrayHeader(nil, 3), AppendBin(nil, make([]byte, 70000))...), 0x91, 0x92, 0xc0, 0x81, 0xa1, 'k', 0x01, 0xc3),
	}
	for i, obj := range objs {
		want, err := Len(obj)
		if err != nil {
			t.Fatalf("object %d: %v", i, err)
		}
		for _, step := range []int{1, 3, 4096} {
			var s Scanner
			var got int
			for end := min(step, len(obj)); ; end = min(end+step, len(obj)) {
				n, err := s.Len(obj[:end])
				if err == nil {
					got = n
					break
				}
				if err != ErrShort || end == len(obj) {
					t.Fatalf("object %d, step %d: %v at %d bytes", i, step, err, end)
				}
			}
			if got != want {
				t.Errorf("object %d, step %d: Len %d, want %d", i, step, got, want)
			}
			if max := int64(len(obj)); s.Steps > max {
				t.Errorf("object %d, step %d: %d steps for %d bytes", i, step, s.Steps, len(obj))
			}
		}
	}
}

// FuzzScanner: the Scanner fed in two pieces agrees with Len.
func FuzzScanner(f *testing.F) {
	f.Add(requestIdentification, 5)
	f.Fuzz(func(t *testing.T, b []byte, cut int) {
		n, err := Len(b)
		if cut < 0 || cut > len(b) {
			cut = len(b) / 2
		}
		var s Scanner
		n1, err1 := s.Len(b[:cut])
		if err1 == ErrShort {
			n1, err1 = s.Len(b)
		}
		if (err == nil) != (err1 == nil) || n != n1 {
			t.Fatalf("Len %d %v, Scanner %d %v (cut %d)", n, err, n1, err1, cut)
		}
	})
}
