package fs1

import (
	"fmt"
	"testing"
)

// BenchmarkNewOids measures NewOids on a read-write storage: n=1 as a
// ZODB/py FileStorage's new_oid asks, n=100 as a ZEO client's new_oids.
// With the oid mark, one call in oidBlock/n writes and fsyncs the mark;
// the others take one mutex, as before the mark. marks/op reports those
// writes; nomark measures the common path alone.
func BenchmarkNewOids(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			fs := createStorage(b, nil)
			defer fs.Close()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := fs.NewOids(bg, n); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportMarks(b, fs)
		})
		// The common path alone: one write of the mark, before the loop.
		b.Run(fmt.Sprintf("n=%d/nomark", n), func(b *testing.B) {
			setOidBlock(b, 1<<40)
			fs := createStorage(b, nil)
			defer fs.Close()
			if _, err := fs.NewOids(bg, 1); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := fs.NewOids(bg, n); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("n=%d/parallel", n), func(b *testing.B) {
			fs := createStorage(b, nil)
			defer fs.Close()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := fs.NewOids(bg, n); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			reportMarks(b, fs)
		})
	}
}

func reportMarks(b *testing.B, fs *FileStorage) {
	a := &fs.w.oids
	a.markMu.Lock()
	b.ReportMetric(float64(a.mark.nput)/float64(b.N), "marks/op")
	a.markMu.Unlock()
}
