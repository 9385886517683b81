package fs1

import (
	"bufio"
	"encoding/binary"
	"math"
	"math/rand"
	"os"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// writeSynthetic writes a valid FileStorage file of about size bytes at path
// for benchmarks: transactions of 1-5 records whose sizes follow the
// lognormal distribution of NEO's PROD1 statistics, 80% of them new objects.
// It returns the number of objects. (The real FileStorage writer is a later
// piece of zodbd; this minimal one exists only to make big test files.)
func writeSynthetic(tb testing.TB, path string, size int64) int {
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	w.WriteString(Magic30)
	rng := rand.New(rand.NewSource(1))
	pos := int64(HeaderSize)
	last := map[zodb.Oid]int64{}
	noid := 0
	tid := zodb.TidFromUnix(1.7e9)
	payload := make([]byte, 1<<16)
	rng.Read(payload)
	var hdr [DataHeaderSize]byte
	for pos < size {
		tid += zodb.Tid(1 + rng.Intn(1<<20))
		n := 1 + rng.Intn(5)
		type rec struct {
			oid zodb.Oid
			n   int
		}
		recs := make([]rec, n)
		tlen := int64(TxnHeaderFixSize)
		for i := range recs {
			var oid zodb.Oid
			if noid == 0 || rng.Float64() < 0.8 {
				oid = zodb.Oid(noid)
				noid++
			} else {
				oid = zodb.Oid(rng.Intn(noid))
			}
			for j := 0; j < i; j++ {
				if recs[j].oid == oid {
					oid = zodb.Oid(noid)
					noid++
				}
			}
			sz := int(math.Exp(6.04 + 1.56*rng.NormFloat64()))
			sz = max(1, min(sz, len(payload)))
			recs[i] = rec{oid, sz}
			tlen += DataHeaderSize + int64(sz)
		}
		var th [TxnHeaderFixSize]byte
		binary.BigEndian.PutUint64(th[0:], uint64(tid))
		binary.BigEndian.PutUint64(th[8:], uint64(tlen))
		th[16] = ' '
		w.Write(th[:])
		tpos := pos
		dpos := pos + TxnHeaderFixSize
		for _, r := range recs {
			binary.BigEndian.PutUint64(hdr[0:], uint64(r.oid))
			binary.BigEndian.PutUint64(hdr[8:], uint64(tid))
			binary.BigEndian.PutUint64(hdr[16:], uint64(last[r.oid]))
			binary.BigEndian.PutUint64(hdr[24:], uint64(tpos))
			binary.BigEndian.PutUint16(hdr[32:], 0)
			binary.BigEndian.PutUint64(hdr[34:], uint64(r.n))
			w.Write(hdr[:])
			w.Write(payload[:r.n])
			last[r.oid] = dpos
			dpos += DataHeaderSize + int64(r.n)
		}
		var tl [8]byte
		binary.BigEndian.PutUint64(tl[:], uint64(tlen))
		w.Write(tl[:])
		pos = tpos + tlen + 8
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	return noid
}

func TestSyntheticFile(t *testing.T) {
	path := t.TempDir() + "/synth.fs"
	n := writeSynthetic(t, path, 4<<20)
	fs, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	if fs.Len() != n {
		t.Fatalf("Len = %d, want %d", fs.Len(), n)
	}
	if fs.TornPos() != 0 {
		t.Fatalf("unexpected torn tail at %d", fs.TornPos())
	}
}
