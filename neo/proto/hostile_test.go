package proto

import (
	"bytes"
	"errors"
	"io"
	"math"
	"runtime/metrics"
	"sort"
	"testing"

	"github.com/zodbd/zodbd/neo/internal/msgp"
)

var allocSample = []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}

// heapAllocs returns the bytes allocated on the heap so far.
func heapAllocs() uint64 {
	metrics.Read(allocSample)
	return allocSample[0].Value.Uint64()
}

// pieces is a reader that returns its pieces one per Read, each in reads
// of at most max bytes.
type pieces struct {
	p   [][]byte
	max int
}

func (r *pieces) Read(b []byte) (int, error) {
	for len(r.p) > 0 && len(r.p[0]) == 0 {
		r.p = r.p[1:]
	}
	if len(r.p) == 0 {
		return 0, io.EOF
	}
	n := copy(b[:min(len(b), r.max)], r.p[0])
	r.p[0] = r.p[0][n:]
	return n, nil
}

// nilArgsPacket is [1, code, [nil] * n].
func nilArgsPacket(code uint16, n int) []byte {
	b := appendPacketHeader(nil, 1, code)
	b = msgp.AppendArrayHeader(b, n)
	return append(b, bytes.Repeat([]byte{0xc0}, n)...)
}

// TestReaderLinear: a packet of 20 M objects arriving 4 KiB at a time is
// sized once, not once per read.
func TestReaderLinear(t *testing.T) {
	pkt := nilArgsPacket(CodeAskObject, 20<<20)
	r := NewReader(&pieces{p: [][]byte{pkt}, max: 4096})
	p, err := r.ReadPacket()
	if err != nil || p.Code != CodeAskObject {
		t.Fatalf("%v %v", p.Code, err)
	}
	if objs := int64(20<<20 + 4); r.scan.Steps > 2*objs {
		t.Errorf("%d objects examined for a packet of %d", r.scan.Steps, objs)
	}
}

// TestReaderShrinks: once a big packet is consumed and nothing is
// buffered, the Reader's buffer goes back to its default size.
func TestReaderShrinks(t *testing.T) {
	big := nilArgsPacket(CodePing, 4<<20)
	small := AppendPacket(nil, 2, &Ping{})
	r := NewReader(&pieces{p: [][]byte{big, small}, max: 1 << 20})
	if _, err := r.ReadPacket(); err != nil {
		t.Fatal(err)
	}
	if len(r.buf) < 4<<20 {
		t.Fatalf("buffer of %d bytes after a 4 MiB packet: the test tests nothing", len(r.buf))
	}
	if p, err := r.ReadPacket(); err != nil || p.ID != 2 {
		t.Fatalf("%v %v", p, err)
	}
	if len(r.buf) > maxKeptBuf {
		t.Errorf("buffer of %d bytes kept", len(r.buf))
	}
}

// TestDecodeAllocBound: a RequestIdentification whose extra map has a
// million nil pairs (2 MB) is refused, allocating a fixed multiple of it
// at most; so is a list of nils where node infos are expected.
func TestDecodeAllocBound(t *testing.T) {
	extra := msgp.AppendMapHeader(nil, 1<<20)
	extra = append(extra, bytes.Repeat([]byte{0xc0}, 2<<20)...)
	ri := (&RequestIdentification{NodeType: Client, NID: NoNode, ClusterName: "x", IdTime: NoIdTime}).AppendArgs(nil)
	// Replace the (empty) extra map, the last argument, by the big one.
	ri = append(ri[:len(ri)-1], extra...)
	nodes := msgp.AppendArrayHeader(nil, 2)
	nodes = append(nodes, 0xc0)
	nodes = msgp.AppendArrayHeader(nodes, 1<<20)
	nodes = append(nodes, bytes.Repeat([]byte{0xc0}, 1<<20)...)
	for _, c := range []struct {
		m    Msg
		args []byte
	}{{new(RequestIdentification), ri}, {new(NotifyNodeInformation), nodes}} {
		a0 := heapAllocs()
		err := c.m.DecodeArgs(c.args)
		a := heapAllocs() - a0
		if !errors.Is(err, errTooMany) {
			t.Errorf("%T: %v, want errTooMany", c.m, err)
		}
		if bound := allocBound(len(c.args)); a > bound {
			t.Errorf("%T: allocated %d for %d bytes (bound %d)", c.m, a, len(c.args), bound)
		}
	}
}

// allocBound is the most that decoding args of n bytes may allocate: the
// lists' bound, and strings copied out of the args.
func allocBound(n int) uint64 { return 2*allocBase + uint64(allocFactor+2)*uint64(n) }

// FuzzDecodeAlloc decodes arbitrary args as every packet type and fails
// when a decode allocates more than allocBound.
func FuzzDecodeAlloc(f *testing.F) {
	f.Add(uint16(CodeRequestIdentification), msgp.AppendMapHeader(msgp.AppendArrayHeader(nil, 6), 1000))
	f.Add(uint16(CodeNotifyNodeInformation), nodesSeed())
	f.Add(uint16(CodeSendPartitionTable), append(msgp.AppendArrayHeader(msgp.AppendArrayHeader(nil, 3), 1), 0xc0))
	codes := make([]uint16, 0, len(codeNames))
	for c := range codeNames {
		codes = append(codes, c)
	}
	sort.Slice(codes, func(i, j int) bool { return codes[i] < codes[j] })
	f.Fuzz(func(t *testing.T, code uint16, args []byte) {
		m, ok := NewMsg(codes[int(code)%len(codes)])
		if !ok {
			return
		}
		// The engine allocates too: an amplification repeats.
		a := uint64(math.MaxUint64)
		for try := 0; try < 3 && a > allocBound(len(args)); try++ {
			m, _ = NewMsg(m.Code())
			a0 := heapAllocs()
			m.DecodeArgs(args)
			a = min(a, heapAllocs()-a0)
		}
		if a > allocBound(len(args)) {
			t.Fatalf("%T: decoding %d bytes allocated %d (bound %d)", m, len(args), a, allocBound(len(args)))
		}
	})
}

func nodesSeed() []byte {
	b := msgp.AppendArrayHeader(nil, 2)
	b = append(b, 0xc0)
	b = msgp.AppendArrayHeader(b, 200)
	return append(b, bytes.Repeat([]byte{0xc0}, 200)...)
}
