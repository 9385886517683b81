package zeo

import (
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/floortest"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// BenchmarkMetricsOverhead measures what Config.Metrics (per-method
// latency histograms) costs the loads: three servers on the same file, one
// with metrics ("on") and two without ("off", and "ref" in floortest's
// place of the floor), each with one connection, loaded in alternating
// blocks (floortest.Compare). on-x-off is the median over the blocks of
// the time with metrics over the time without (the bound: ≤ 1.02);
// off-x-floor, two servers without metrics, is the same comparison with
// no difference (its distance from 1 is the noise). The reference takes
// the floor's place because the side that follows the floor in each block
// pays for the switch from another kind of work (measured: 5–15% on
// pipelined loads with the TCP echo as the floor). Sub-benchmarks: rtt
// (one load in flight: the latency a client sees) and pipelined (batches
// of 32 loads in flight: the server's CPU per load dominates).
func BenchmarkMetricsOverhead(b *testing.B) {
	floortest.RunFiles(b, "..", func(b *testing.B, path string) {
		fs, err := fs1.Open(path, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { fs.Close() })
		quiet := func(string, ...interface{}) {}
		sc := []StorageConfig{{Name: "1", Storage: fs, ReadOnly: true}}
		ref := dialRaw(b, startServer(b, Config{Storages: sc, Logf: quiet}), wire.Pickle)
		off := dialRaw(b, startServer(b, Config{Storages: sc, Logf: quiet}), wire.Pickle)
		on := dialRaw(b, startServer(b, Config{Storages: sc, Logf: quiet, Metrics: true}), wire.Pickle)
		oids := fs.Index().Oids()

		for _, batch := range []struct {
			name string
			n    int
		}{{"rtt", 1}, {"pipelined", 32}} {
			b.Run(batch.name, func(b *testing.B) {
				side := func(c *rawClient) func(i, k int) bool {
					var buf []byte
					return func(i, k int) bool {
						for j := i; j < i+k; j += batch.n {
							n := min(batch.n, i+k-j)
							for m := 0; m < n; m++ {
								c.sendLoad(oids[(j+m)%len(oids)], zodb.TidMax)
							}
							c.flush(b)
							for m := 0; m < n; m++ {
								f, err := wire.ReadFrame(c.br, buf, 1<<30)
								if err != nil {
									b.Fatal(err)
								}
								buf = f[:0]
							}
						}
						return true
					}
				}
				b.ReportAllocs()
				floortest.Compare(b, side(ref), floortest.Side{Name: "off", Run: side(off)}, floortest.Side{Name: "on", Run: side(on)})
			})
		}
	})
}
