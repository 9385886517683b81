package fs1

import (
	"context"
	"errors"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/zodbd/zodbd/internal/floortest"
	"github.com/zodbd/zodbd/zodb"
)

// benchSize is the size of the synthetic file the benchmarks use;
// override with ZODBD_BENCH_MB.
func benchSize() int64 {
	if s := os.Getenv("ZODBD_BENCH_MB"); s != "" {
		if mb, err := strconv.Atoi(s); err == nil {
			return int64(mb) << 20
		}
	}
	return 256 << 20
}

var bench struct {
	once sync.Once
	path string
	n    int
	dir  string
}

func benchFile(b *testing.B) (string, int) {
	bench.once.Do(func() {
		dir, err := os.MkdirTemp("", "zodbd-bench")
		if err != nil {
			b.Fatal(err)
		}
		bench.dir = dir
		bench.path = dir + "/bench.fs"
		bench.n = writeSynthetic(b, bench.path, benchSize())
	})
	return bench.path, bench.n
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bench.dir != "" {
		os.RemoveAll(bench.dir)
	}
	os.Exit(code)
}

// BenchmarkScan measures index building by scanning a file from the page
// cache (the file was just written); MB/s is reported as the scan speed.
func BenchmarkScan(b *testing.B) {
	path, _ := benchFile(b)
	st, _ := os.Stat(path)
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.SetBytes(st.Size())
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		idx := NewIndex(0)
		if _, err := Scan(f, path, HeaderSize, st.Size(), 0, idx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoad measures Load of random latest revisions from the page cache
// with a caller-supplied buffer (the zero-allocation path).
func BenchmarkLoad(b *testing.B) {
	path, n := benchFile(b)
	fs, err := Open(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer fs.Close()
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewSource(rand.Int63()))
		buf := make([]byte, 0, 1<<16)
		for pb.Next() {
			oid := zodb.Oid(rng.Intn(n))
			data, _, err := fs.LoadAppend(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax}, buf[:0])
			if err != nil {
				b.Fatal(err)
			}
			buf = data
		}
	})
}

// BenchmarkLoadFiles is serial loads of every object of the fixture and of
// the datasets (`make datasets`), from the page cache: prod1-1024's objects
// are ~1.4 KiB, wczblk1-8's 4145 bytes, whose records (with their 42-byte
// header) one speculative read of 4096 bytes would not cover.
func BenchmarkLoadFiles(b *testing.B) {
	floortest.RunFiles(b, "..", func(b *testing.B, path string) {
		fs, err := Open(path, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer fs.Close()
		oids := fs.Index().Oids()
		ctx := context.Background()
		buf := make([]byte, 0, 64<<10)
		var nodata *zodb.NoDataError
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			data, _, err := fs.LoadAppend(ctx, zodb.Xid{Oid: oids[i%len(oids)], At: zodb.TidMax}, buf[:0])
			if err != nil && !errors.As(err, &nodata) { // 1.fs has deleted objects
				b.Fatal(err)
			}
			buf = data[:0]
		}
	})
}

// BenchmarkPreadFloor is the reference for BenchmarkLoad measured in the same
// run: one bare pread of the same size (header plus up to 4 KiB) at the
// position of a random object's record, with no index lookup or decoding.
// Load's ns/op over this one is the engine's own cost.
func BenchmarkPreadFloor(b *testing.B) {
	path, _ := benchFile(b)
	fs, err := Open(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer fs.Close()
	idx := fs.Index()
	var positions []int64
	for _, oid := range idx.Oids() {
		pos, _ := idx.Get(oid)
		positions = append(positions, pos)
	}
	end := fs.End()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewSource(rand.Int63()))
		buf := make([]byte, speculativeRead)
		for pb.Next() {
			pos := positions[rng.Intn(len(positions))]
			n := int64(len(buf))
			if pos+n > end {
				n = end - pos
			}
			if _, err := fs.file.ReadAt(buf[:n], pos); err != nil {
				b.Fatal(err)
			}
		}
	})
}
