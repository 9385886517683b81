package serialize_test

import (
	"bytes"
	"compress/zlib"
	"errors"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"testing"

	"github.com/zodbd/zodbd/internal/pickle"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodb/serialize"
)

// Hostile records: each builds, at a given size, an attack on a pickle
// reader. The class pickle is a plain one; the state pickle carries the
// attack, and ends with a reference to oid 1 where the attack leaves a
// usable stack, so that a record within the limits still gives an answer.

const hostileClass = "\x80\x03cK\nK\nq\x00."

func record(state ...[]byte) []byte {
	b := []byte(hostileClass + "\x80\x03")
	for _, s := range state {
		b = append(b, s...)
	}
	return b
}

var ref1 = []byte("C\x08\x00\x00\x00\x00\x00\x00\x00\x01Q0")

// deepTuples: n nested one-item tuples (TUPLE1 n times), then a reference.
func deepTuples(n int) []byte {
	return record([]byte{pickle.OpNone}, bytes.Repeat([]byte{pickle.OpTuple1}, n), ref1, []byte{pickle.OpStop})
}

// deepMarks: n nested MARK ... TUPLE.
func deepMarks(n int) []byte {
	return record(bytes.Repeat([]byte{pickle.OpMark}, n), ref1, []byte{pickle.OpNone},
		bytes.Repeat([]byte{pickle.OpTuple}, n), []byte{pickle.OpStop})
}

// memoDag: L(i) = (L(i-1), L(i-1)) through the memo, 2**levels values
// as a tree, then [L(levels)] * n.
func memoDag(levels, n int) []byte {
	b := []byte{pickle.OpNone, pickle.OpBinput, 0}
	for i := 1; i <= levels; i++ {
		b = append(b, pickle.OpBinget, byte(i-1), pickle.OpBinget, byte(i-1), pickle.OpTuple2, pickle.OpBinput, byte(i), pickle.OpPop)
	}
	chunk := append(append([]byte{pickle.OpMark}, bytes.Repeat([]byte{pickle.OpBinget, byte(levels)}, 1000)...), pickle.OpAppends)
	b = append(b, pickle.OpEmptyList)
	b = append(b, bytes.Repeat(chunk, n/1000)...)
	return record(b, ref1, []byte{pickle.OpStop})
}

// noneList: a list of n Nones, in batches of 1000 (as pickle writes it)
// or as one MARK ... LIST.
func noneList(n int, batched bool) []byte {
	if !batched {
		return record([]byte{pickle.OpMark}, bytes.Repeat([]byte{pickle.OpNone}, n), []byte{pickle.OpList}, ref1, []byte{pickle.OpStop})
	}
	chunk := append(append([]byte{pickle.OpMark}, bytes.Repeat([]byte{pickle.OpNone}, 1000)...), pickle.OpAppends)
	return record([]byte{pickle.OpEmptyList}, bytes.Repeat(chunk, n/1000), ref1, []byte{pickle.OpStop})
}

// memoSpread: n PUTs at indexes far apart, then a GET of the last.
func memoSpread(n int) []byte {
	b := []byte{pickle.OpNone}
	for i := 0; i < n; i++ {
		b = append(b, pickle.OpLongBinput, 0xff, 0xff, byte(i), byte(i>>8))
	}
	return record(b, ref1, []byte{pickle.OpStop})
}

// zlibRecord is rec as zc.zlibstorage stores it.
func zlibRecord(rec []byte) []byte {
	var z bytes.Buffer
	w, _ := zlib.NewWriterLevel(&z, zlib.BestCompression)
	w.Write(rec)
	w.Close()
	return append([]byte(".z"), z.Bytes()...)
}

// zlibBomb: a compressed record that inflates to n bytes (a valid class
// pickle, then zeros), made without holding them.
func zlibBomb(n int) []byte {
	var z bytes.Buffer
	w, _ := zlib.NewWriterLevel(&z, zlib.BestCompression)
	w.Write([]byte(hostileClass))
	zeros := make([]byte, 1<<20)
	for n -= len(hostileClass); n > 0; n -= len(zeros) {
		w.Write(zeros[:min(n, len(zeros))])
	}
	w.Close()
	return append([]byte(".z"), z.Bytes()...)
}

type hostileRecord struct {
	name string
	data []byte
	ok   bool // within DefaultLimits: References answers [1] (else an error)
	// overSmall: over the limits of TestHostileRecords' small run.
	overSmall bool
}

func hostileRecords(scale int) []hostileRecord {
	return []hostileRecord{
		{"deep tuples", deepTuples(100 * scale), true, false},
		{"deep marks", deepMarks(100 * scale), true, false},
		{"memo dag", memoDag(60, 1000*scale), true, false},
		{"list of None", noneList(20000*scale, true), true, false},
		{"list of None unbatched", noneList(20000*scale, false), scale < 400, true},
		{"memo spread", memoSpread(100 * scale), true, false},
		{"compressed list of None", zlibRecord(noneList(20000*scale, false)), scale < 400, true},
		{"zlib bomb", zlibBomb(8 << 20), false, true},
	}
}

var allocSample = []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}

func heapAllocs() uint64 {
	metrics.Read(allocSample)
	return allocSample[0].Value.Uint64()
}

// refsAllocBound is the most scanning data (n bytes, m once decompressed)
// may allocate with limits lim: the inflate (three times its output at
// most), and about 4 times the 48 bytes of a value for each value held
// (slices growing by doubling, each value made by at least one byte).
func refsAllocBound(lim serialize.Limits, data []byte) uint64 {
	m := len(data)
	var inflate uint64
	if len(data) >= 2 && data[0] == '.' && data[1] == 'z' {
		m = min(lim.MaxInflated, 1100*len(data)) // zlib inflates 1032 times at most
		inflate = 64<<10 + 3*uint64(m)
	}
	return 64<<10 + inflate + 200*uint64(min(m, lim.MaxValues))
}

// refsMeasured scans data with a fresh Scanner with limits lim and
// returns the fewest bytes one of up to 3 scans allocated: the count is
// the process's, and a measure over the bound is taken again before it
// counts.
func refsMeasured(lim serialize.Limits, data []byte) ([]zodb.Oid, error, uint64) {
	var refs []zodb.Oid
	var err error
	a := uint64(math.MaxUint64)
	for try := 0; try < 3 && a > refsAllocBound(lim, data); try++ {
		s := serialize.Scanner{Limits: lim}
		a0 := heapAllocs()
		refs, err = s.AppendReferences(nil, data)
		a = min(a, heapAllocs()-a0)
	}
	return refs, err, a
}

// TestHostileRecords: every attack is refused, or answered, within the
// allocation bound; over the limits, the error wraps ErrLimit.
func TestHostileRecords(t *testing.T) {
	scale := 100
	if testing.Short() || raceDetector {
		scale = 10
	}
	small := serialize.Limits{MaxInflated: 1 << 20, MaxValues: 1 << 14}
	for _, lim := range []serialize.Limits{serialize.DefaultLimits, small} {
		for _, c := range hostileRecords(scale) {
			refs, err, a := refsMeasured(lim, c.data)
			if bound := refsAllocBound(lim, c.data); a > bound {
				t.Errorf("%s (%d bytes, limits %+v): allocated %d, bound %d", c.name, len(c.data), lim, a, bound)
			}
			if lim == serialize.DefaultLimits {
				if c.ok && (err != nil || !slices.Equal(refs, []zodb.Oid{1})) {
					t.Errorf("%s: %v %v, want [1]", c.name, refs, err)
				}
				if !c.ok && err == nil {
					t.Errorf("%s: %v, want an error", c.name, refs)
				}
			} else if c.overSmall && !errors.Is(err, serialize.ErrLimit) {
				t.Errorf("%s: %v %v, want an error wrapping ErrLimit", c.name, refs, err)
			}
			var se *serialize.Error
			if err != nil && !errors.As(err, &se) {
				t.Errorf("%s: error %T without a position: %v", c.name, err, err)
			}
			t.Logf("%s: %d bytes, limits %+v: allocated %d (%.1f x): %v", c.name, len(c.data), lim, a, float64(a)/float64(len(c.data)), err)
		}
	}
}

// TestHostileFullSize: a list of 20M Nones in one MARK (20 MB), and a
// record that inflates to 300 MiB, are refused at DefaultLimits, with
// memory in proportion to the limits.
func TestHostileFullSize(t *testing.T) {
	if testing.Short() || raceDetector {
		t.Skip("20 MB records, and a 300 MiB inflate")
	}
	for _, c := range []hostileRecord{
		{"20M Nones", noneList(20_000_000, false), false, true},
		{"zlib bomb", zlibBomb(300 << 20), false, true},
	} {
		_, err, a := refsMeasured(serialize.DefaultLimits, c.data)
		if !errors.Is(err, serialize.ErrLimit) {
			t.Errorf("%s: %v, want an error wrapping ErrLimit", c.name, err)
		}
		if bound := refsAllocBound(serialize.DefaultLimits, c.data); a > bound {
			t.Errorf("%s: allocated %d, bound %d", c.name, a, bound)
		}
		t.Logf("%s: %d bytes: allocated %d (%.1f x): %v", c.name, len(c.data), a, float64(a)/float64(len(c.data)), err)
	}
}

// FuzzReferencesAlloc scans arbitrary records with small limits and fails
// when a scan allocates more than refsAllocBound, or recurses (the
// goroutine stacks are limited to 1 MiB meanwhile: a deep recursion is a
// crash). The seeds are the attacks, small.
func FuzzReferencesAlloc(f *testing.F) {
	for _, c := range hostileRecords(1) {
		if len(c.data) < 64<<10 {
			f.Add(c.data)
		}
	}
	f.Add(zlibBomb(4 << 20))
	f.Add(zlibRecord(memoDag(60, 3000)))
	lim := serialize.Limits{MaxInflated: 256 << 10, MaxValues: 1 << 12}
	defer debug.SetMaxStack(debug.SetMaxStack(1 << 20))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err, a := refsMeasured(lim, data)
		if bound := refsAllocBound(lim, data); a > bound {
			t.Fatalf("%d bytes: allocated %d, bound %d (%v)", len(data), a, bound, err)
		}
	})
}
