package fs1

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// packRecord returns a ZODB object record (protocol 3, as ZODB/py writes a
// PersistentMapping) that refers to refs and holds n payload bytes.
func packRecord(b []byte, refs []zodb.Oid, n int, payload []byte) []byte {
	b = append(b, "\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.\x80\x03}q\x01("...)
	for i, r := range refs {
		b = append(b, 'X', 4, 0, 0, 0)
		b = fmt.Appendf(b, "%04d", i%10000)
		b = append(b, 'C', 8)
		b = binary.BigEndian.AppendUint64(b, uint64(r))
		b = append(b, 'h', 0, 0x86, 'Q')
	}
	b = append(b, 'X', 1, 0, 0, 0, 'p', 'B')
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	b = append(b, payload[:n]...)
	return append(b, 'u', '.')
}

// writePackSynthetic writes a FileStorage file of about size bytes whose
// records are real pickles referring to each other: the root refers to 64
// directories, each to containers of up to 32 leaves. Transactions create
// leaves (60%; the container is rewritten), change 1-4 leaves (30%; leaf
// sizes follow NEO's PROD1 lognormal), or drop a leaf from its container
// (10%: garbage). It returns the tid at 80% of the file, a typical pack
// time (most history before it).
func writePackSynthetic(tb testing.TB, path string, size int64) zodb.Tid {
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	w.WriteString(Magic30)
	rng := rand.New(rand.NewSource(1))
	payload := make([]byte, 1<<16)
	rng.Read(payload)
	pos := int64(HeaderSize)
	last := map[zodb.Oid]int64{}
	tid := zodb.TidFromUnix(1.7e9)
	var packTid zodb.Tid

	const ndirs = 64
	nextOid := zodb.Oid(1 + ndirs)
	dirs := make([][]zodb.Oid, ndirs) // containers of each directory
	kids := map[zodb.Oid][]zodb.Oid{} // leaves of each container
	var leaves []zodb.Oid
	leafSize := func() int { return max(1, min(int(math.Exp(6.04+1.56*rng.NormFloat64())), len(payload))) }

	type rec struct {
		oid  zodb.Oid
		data []byte
	}
	var buf []byte
	writeTxn := func(recs []rec) {
		tid += zodb.Tid(1 + rng.Intn(1<<20))
		tlen := int64(TxnHeaderFixSize)
		for _, r := range recs {
			tlen += DataHeaderSize + int64(len(r.data))
		}
		buf = appendTxnHeader(buf[:0], tid, tlen, ' ', nil, nil, nil)
		dpos := pos + TxnHeaderFixSize
		for _, r := range recs {
			buf = appendDataHeader(buf, r.oid, tid, last[r.oid], pos, int64(len(r.data)))
			buf = append(buf, r.data...)
			last[r.oid] = dpos
			dpos += DataHeaderSize + int64(len(r.data))
		}
		buf = binary.BigEndian.AppendUint64(buf, uint64(tlen))
		w.Write(buf)
		pos += tlen + 8
		if packTid == 0 && pos >= size*8/10 {
			packTid = tid
		}
	}
	// The root and the directories.
	var recs []rec
	rootRefs := make([]zodb.Oid, ndirs)
	for i := range rootRefs {
		rootRefs[i] = zodb.Oid(1 + i)
		recs = append(recs, rec{zodb.Oid(1 + i), packRecord(nil, nil, 10, payload)})
	}
	recs = append(recs, rec{0, packRecord(nil, rootRefs, 10, payload)})
	writeTxn(recs)
	for pos < size {
		recs = recs[:0]
		switch r := rng.Float64(); {
		case r < 0.6 || len(leaves) == 0:
			d := rng.Intn(ndirs)
			var c zodb.Oid
			if n := len(dirs[d]); n > 0 && len(kids[dirs[d][n-1]]) < 32 {
				c = dirs[d][n-1]
			} else {
				c = nextOid
				nextOid++
				dirs[d] = append(dirs[d], c)
				recs = append(recs, rec{zodb.Oid(1 + d), packRecord(nil, dirs[d], 10, payload)})
			}
			for k := 1 + rng.Intn(3); k > 0; k-- {
				leaf := nextOid
				nextOid++
				kids[c] = append(kids[c], leaf)
				leaves = append(leaves, leaf)
				recs = append(recs, rec{leaf, packRecord(nil, nil, leafSize(), payload)})
			}
			recs = append(recs, rec{c, packRecord(nil, kids[c], 10, payload)})
		case r < 0.9:
			seen := map[zodb.Oid]bool{}
			for k := 1 + rng.Intn(4); k > 0; k-- {
				leaf := leaves[rng.Intn(len(leaves))]
				if !seen[leaf] {
					seen[leaf] = true
					recs = append(recs, rec{leaf, packRecord(nil, nil, leafSize(), payload)})
				}
			}
		default:
			d := rng.Intn(ndirs)
			if len(dirs[d]) == 0 {
				continue
			}
			c := dirs[d][rng.Intn(len(dirs[d]))]
			if len(kids[c]) == 0 {
				continue
			}
			i := rng.Intn(len(kids[c]))
			kids[c] = append(kids[c][:i:i], kids[c][i+1:]...)
			recs = append(recs, rec{c, packRecord(nil, kids[c], 10, payload)})
		}
		writeTxn(recs)
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	return packTid
}

// BenchmarkPack packs a synthetic file of ZODB pickles (benchSize, default
// 256 MiB; ZODBD_BENCH_MB) at the tid at 80% of it, from the page cache
// into a new file (no fsync); MB/s is of the source. ZODBD_PACK_FILE and
// ZODBD_PACK_TID name another file and pack time instead.
func BenchmarkPack(b *testing.B) {
	var path string
	var at zodb.Tid
	var size int64
	if p := os.Getenv("ZODBD_PACK_FILE"); p != "" {
		path = p
		st, err := os.Stat(p)
		if err != nil {
			b.Fatal(err)
		}
		size = st.Size()
		at, err = zodb.ParseTid(os.Getenv("ZODBD_PACK_TID"))
		if err != nil {
			b.Fatal(err)
		}
	} else {
		path = filepath.Join(b.TempDir(), "pack.fs")
		at = writePackSynthetic(b, path, benchSize())
		st, _ := os.Stat(path)
		size = st.Size()
	}
	for _, gc := range []bool{true, false} {
		b.Run(fmt.Sprintf("gc=%v", gc), func(b *testing.B) {
			src, err := os.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			defer src.Close()
			dstPath := filepath.Join(b.TempDir(), "packed.fs")
			b.SetBytes(size)
			var st PackStats
			for b.Loop() {
				dst, err := os.Create(dstPath)
				if err != nil {
					b.Fatal(err)
				}
				p := NewPacker(src, path, dst, at, &PackOptions{NoGC: !gc})
				if err := p.Pack(context.Background(), size); err != nil {
					b.Fatal(err)
				}
				st = p.Stats()
				dst.Close()
			}
			b.ReportMetric(float64(st.SizeAfter)/float64(size), "after/before")
			b.ReportMetric(float64(st.Reachable), "reachable")
		})
	}
}

func TestPackSynthetic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.fs")
	at := writePackSynthetic(t, path, 4<<20)
	st, err := PackFile(context.Background(), path, at, &PackOptions{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Changed || !st.GC || st.BadRecords != 0 || st.DanglingRefs != 0 || st.Reachable >= st.Current {
		t.Fatalf("%+v", st)
	}
	t.Logf("%+v", st)
}

// TestWritePackSynthetic writes the file BenchmarkPack packs to
// $ZODBD_PACK_SYNTH (for comparisons with ZODB/py, see BENCHMARKS.md) and
// prints its pack tid; it is skipped without that variable.
func TestWritePackSynthetic(t *testing.T) {
	out := os.Getenv("ZODBD_PACK_SYNTH")
	if out == "" {
		t.Skip("ZODBD_PACK_SYNTH not set")
	}
	at := writePackSynthetic(t, out, benchSize())
	fmt.Printf("pack tid %s\n", at)
}
