package fs1

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"

	ogrek "github.com/kisielk/og-rek"

	"github.com/zodbd/zodbd/internal/pickle"
	"github.com/zodbd/zodbd/zodb"
)

// Hostile index files: each builds, at a given size, an attack on a pickle
// reader, after a valid first pickle (the position).

var ixPos = []byte{pickle.OpProto, 3, pickle.OpBinint, 0, 0, 0, 1, pickle.OpStop} // 1<<24

func ixFile(pickles ...[]byte) []byte {
	b := append([]byte(nil), ixPos...)
	for _, p := range pickles {
		b = append(b, p...)
	}
	return b
}

var ixEnd = []byte{pickle.OpNone, pickle.OpStop}

// ixBucketPickle is (prefix, bucket) for oids hi<<16 | k, k < n, at
// positions 100 + k.
func ixBucketPickle(hi uint64, n int, memo bool) []byte {
	b := []byte{pickle.OpShortBinbytes, 6}
	b = binary.BigEndian.AppendUint64(b, hi)[:0]
	b = append(b, pickle.OpShortBinbytes, 6)
	var p [8]byte
	binary.BigEndian.PutUint64(p[:], hi)
	b = append(b, p[2:]...)
	bucket := make([]byte, 8*n)
	for k := 0; k < n; k++ {
		binary.BigEndian.PutUint16(bucket[2*k:], uint16(k))
		binary.BigEndian.PutUint16(bucket[2*n+6*k+2:], 0)
		binary.BigEndian.PutUint32(bucket[2*n+6*k+2:], uint32(100+k))
	}
	b = append(b, pickle.OpBinbytes)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(bucket)))
	b = append(b, bucket...)
	if memo {
		b = append(b, pickle.OpBinput, 1)
	}
	return append(b, pickle.OpTuple2, pickle.OpStop)
}

// ixBucketReuse: a bucket of n oids memoized, then m pickles that use it
// under other prefixes (each m pickle is 12 bytes, and stands for n oids).
func ixBucketReuse(n, m int) []byte {
	b := ixFile(ixBucketPickle(0, n, true))
	for i := 1; i <= m; i++ {
		b = append(b, pickle.OpShortBinbytes, 6, 0, 0, 0, byte(i>>16), byte(i>>8), byte(i), pickle.OpBinget, 1, pickle.OpTuple2, pickle.OpStop)
	}
	return append(b, ixEnd...)
}

// ixDeep: a bucket pickle whose prefix is n nested MARKs, or n nested
// one-item tuples.
func ixDeep(n int, marks bool) []byte {
	if marks {
		return ixFile(append(append(bytes.Repeat([]byte{pickle.OpMark}, n), pickle.OpNone), bytes.Repeat([]byte{pickle.OpTuple}, n)...), ixEnd)
	}
	return ixFile(append(append([]byte{pickle.OpNone}, bytes.Repeat([]byte{pickle.OpTuple1}, n)...), pickle.OpStop), ixEnd)
}

// ixMemoDag: L(i) = (L(i-1), L(i-1)) through the memo, as pickle 2.
func ixMemoDag(levels int) []byte {
	b := []byte{pickle.OpNone, pickle.OpBinput, 0}
	for i := 1; i <= levels; i++ {
		b = append(b, pickle.OpBinget, byte(i-1), pickle.OpTuple2, pickle.OpBinput, byte(i))
	}
	return ixFile(append(b, pickle.OpBinget, byte(levels), pickle.OpTuple2, pickle.OpStop), ixEnd)
}

// ixNones: pickle 2 is a tuple of n Nones.
func ixNones(n int) []byte {
	return ixFile(append(append([]byte{pickle.OpMark}, bytes.Repeat([]byte{pickle.OpNone}, n)...), pickle.OpTuple, pickle.OpStop), ixEnd)
}

// ixMemoFlood: n MEMOIZEs of one value.
func ixMemoFlood(n int) []byte {
	return ixFile(append(append([]byte{pickle.OpNone}, bytes.Repeat([]byte{pickle.OpMemoize}, n)...), pickle.OpStop), ixEnd)
}

// ixBigHeader: a bucket whose length header says 4 GiB (or 2**63), with
// a few bytes after it.
func ixBigHeader(op byte) []byte {
	b := []byte{pickle.OpShortBinbytes, 6, 0, 0, 0, 0, 0, 0, op}
	if op == pickle.OpBinbytes8 {
		b = binary.LittleEndian.AppendUint64(b, 1<<63-1)
	} else {
		b = binary.LittleEndian.AppendUint32(b, 1<<32-1)
	}
	return ixFile(append(b, make([]byte, 1000)...))
}

type ixHostile struct {
	name string
	data []byte
}

func ixHostileCases(scale int) []ixHostile {
	return []ixHostile{
		{"bucket reuse", ixBucketReuse(8192, 10*scale)},
		{"deep marks", ixDeep(100*scale, true)},
		{"deep tuples", ixDeep(100*scale, false)},
		{"memo dag", ixMemoDag(60)},
		{"tuple of None", ixNones(20000 * scale)},
		{"memo flood", ixMemoFlood(10000 * scale)},
		{"4 GiB bucket header", ixBigHeader(pickle.OpBinbytes)},
		{"2**63 bucket header", ixBigHeader(pickle.OpBinbytes8)},
		{"LONG4 header", ixFile([]byte{pickle.OpLong4, 0xff, 0xff, 0xff, 0x7f, 1, 2, 3})},
	}
}

var ixAllocSample = []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}

func ixHeapAllocs() uint64 {
	metrics.Read(ixAllocSample)
	return ixAllocSample[0].Value.Uint64()
}

// ixAllocBound is the most loading an index file of n bytes may allocate:
// the 1 MiB read buffer, the index's dense chunk table (512 KiB at most),
// and a fixed multiple of n (index nodes of about 1 KiB for a pickle of
// about 25 bytes, scratch and memo buffers).
func ixAllocBound(n int) uint64 { return 2<<20 + 64*uint64(n) }

// ixLoadMeasured loads b and returns the fewest bytes one of up to 3 loads
// allocated (the count is the process's: a measure over the bound is taken
// again before it counts).
func ixLoadMeasured(b []byte) (int64, *Index, error, uint64) {
	var pos int64
	var idx *Index
	var err error
	a := uint64(math.MaxUint64)
	for try := 0; try < 3 && a > ixAllocBound(len(b)); try++ {
		a0 := ixHeapAllocs()
		pos, idx, err = loadIndex(bytes.NewReader(b), "hostile.index", int64(len(b)), -1)
		a = min(a, ixHeapAllocs()-a0)
	}
	return pos, idx, err, a
}

// TestLoadIndexHostile: every attack is refused, with an error naming the
// file and an offset, within the allocation bound.
func TestLoadIndexHostile(t *testing.T) {
	scale := 100
	if testing.Short() {
		scale = 10
	}
	for _, c := range ixHostileCases(scale) {
		_, idx, err, a := ixLoadMeasured(c.data)
		if bound := ixAllocBound(len(c.data)); a > bound {
			t.Errorf("%s (%d bytes): allocated %d, bound %d", c.name, len(c.data), a, bound)
		}
		var ie *IndexFileError
		if err == nil {
			t.Errorf("%s: loaded %d oids, want an error", c.name, idx.Len())
		} else if !errors.As(err, &ie) || !strings.Contains(err.Error(), "offset") {
			t.Errorf("%s: error without the file or an offset: %v", c.name, err)
		}
		t.Logf("%s: %d bytes: allocated %d (%.1f x): %v", c.name, len(c.data), a, float64(a)/float64(len(c.data)), err)
	}
	// Reuse of a memoized bucket within the budget (a few times) loads.
	b := ixBucketReuse(64, 3)
	if _, idx, err := loadIndex(bytes.NewReader(b), "reuse", -1, -1); err != nil || idx.Len() != 4*64 {
		t.Errorf("a bucket used 4 times: %v", err)
	}
}

// loadIndexOgrek is the index loader as it was before indexpickle.go, on
// og-rek: the reference the fuzzer compares with.
func loadIndexOgrek(b []byte) (int64, *Index, error) {
	d := ogrek.NewDecoderWithConfig(bytes.NewReader(b), &ogrek.DecoderConfig{StrictUnicode: true})
	v, err := d.Decode()
	if err != nil {
		return 0, nil, err
	}
	var topPos int64
	switch v := v.(type) {
	case int64:
		topPos = v
	case *big.Int:
		if !v.IsInt64() {
			return 0, nil, errors.New("big")
		}
		topPos = v.Int64()
	default:
		return 0, nil, errors.New("not an int")
	}
	if topPos < 0 || topPos > maxIndexPos {
		return 0, nil, errors.New("range")
	}
	idx := NewIndex(0)
	for {
		v, err := d.Decode()
		if err != nil {
			return 0, nil, err
		}
		if _, ok := v.(ogrek.None); ok {
			return topPos, idx, nil
		}
		t, ok := v.(ogrek.Tuple)
		if !ok || len(t) != 2 {
			return 0, nil, errors.New("not a 2-tuple")
		}
		bs := func(v interface{}) (string, bool) {
			switch v := v.(type) {
			case ogrek.Bytes:
				return string(v), true
			case ogrek.ByteString:
				return string(v), true
			}
			return "", false
		}
		prefix, ok1 := bs(t[0])
		bucket, ok2 := bs(t[1])
		if !ok1 || !ok2 || len(prefix) != 6 || len(bucket)%8 != 0 {
			return 0, nil, errors.New("bad bucket")
		}
		var p [8]byte
		copy(p[2:], prefix)
		hi := zodb.Oid(binary.BigEndian.Uint64(p[:])) << 16
		n := len(bucket) / 8
		for i := 0; i < n; i++ {
			oid := hi | zodb.Oid(binary.BigEndian.Uint16([]byte(bucket[2*i:])))
			var q [8]byte
			copy(q[2:], bucket[2*n+6*i:2*n+6*i+6])
			pos := int64(binary.BigEndian.Uint64(q[:]))
			if pos < HeaderSize || pos >= topPos {
				return 0, nil, errors.New("pos")
			}
			idx.Set(oid, pos)
		}
	}
}

// ixStrict tells the errors of files that a general unpickler may read but
// that no ZODB writes, refused on purpose (see indexpickle.go).
func ixStrict(err error) bool {
	for _, s := range []string{"which no index file holds", "which no index pickle has", "memo entries", "memo references expand", "STOP with", "line longer"} {
		if strings.Contains(err.Error(), s) {
			return true
		}
	}
	return false
}

// FuzzLoadIndexAlloc loads arbitrary index files and fails when loading
// allocates more than ixAllocBound, recurses (goroutine stacks are limited
// to 1 MiB meanwhile: a deep recursion is a crash), errs without an
// offset, reads a file differently from og-rek's reading (the loader
// before indexpickle.go), or refuses one that og-rek reads for another
// reason than ixStrict's. The seeds are the real index files and the
// attacks, small.
func FuzzLoadIndexAlloc(f *testing.F) {
	for _, name := range ixFixtures {
		b, err := os.ReadFile(filepath.Join("testdata", name+".fs.index"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		want, pos, _ := ixExpect(f, name)
		for _, proto := range []int{0, 1, 2} {
			f.Add(py2Index(f, want, pos, proto))
		}
	}
	for _, c := range ixHostileCases(1) {
		f.Add(c.data)
	}
	defer debug.SetMaxStack(debug.SetMaxStack(1 << 20))
	f.Fuzz(func(t *testing.T, b []byte) {
		pos, idx, err, a := ixLoadMeasured(b)
		if bound := ixAllocBound(len(b)); a > bound {
			t.Fatalf("%d bytes: allocated %d, bound %d (%v)", len(b), a, bound, err)
		}
		rpos, ridx, rerr := loadIndexOgrek(b)
		if err != nil {
			if !strings.Contains(err.Error(), "offset") && !strings.Contains(err.Error(), "empty file") &&
				!errors.Is(err, ErrIndexOldFormat) {
				t.Fatalf("error without an offset: %v", err)
			}
			if rerr == nil && !ixStrict(err) {
				t.Fatalf("og-rek's reading loads it (%d oids): %v", ridx.Len(), err)
			}
			return
		}
		// og-rek refuses some files that Python reads (STRING escapes
		// such as \08, which Python reads as \0 and 8): only a file
		// both read is compared.
		if rerr == nil && (rpos != pos || !ridx.Equal(idx)) {
			t.Fatalf("loaded pos %d, og-rek's reading %d; diff:\n%s", pos, rpos, ixDiff(idx, ridx))
		}
	})
}

// failingReader returns its bytes, then err.
type failingReader struct {
	b   []byte
	err error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, r.err
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestLoadIndexReadError: an I/O error while reading is reported as
// itself, with its offset, not as a truncated file.
func TestLoadIndexReadError(t *testing.T) {
	good, err := os.ReadFile(filepath.Join("testdata", "1.fs.index"))
	if err != nil {
		t.Fatal(err)
	}
	eio := errors.New("input/output error")
	for _, n := range []int{0, 3, 8, 20, len(good) - 1} {
		_, _, err := loadIndex(&failingReader{good[:n], eio}, "eio.index", -1, -1)
		if !errors.Is(err, eio) || !strings.Contains(err.Error(), "offset") {
			t.Errorf("error after %d bytes: %v, want the I/O error with an offset", n, err)
		}
	}
}
