package wire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"runtime"
	"runtime/metrics"
	"testing"

	"github.com/zodbd/zodbd/internal/pickle"
)

// Hostile frames: each builds, at a given size, one of the attacks a
// server has seen (see tests/test_hostile.py for them against zodbd
// serve).

func pickleStr(s string) []byte {
	return append(binary.LittleEndian.AppendUint32([]byte{pickle.OpBinunicode}, uint32(len(s))), s...)
}

// pickleMessage is (msgid, False, name, args) with msgid and args given as
// pickle fragments that push one value each.
func pickleMessage(msgid []byte, name string, args []byte) []byte {
	b := []byte{pickle.OpProto, 3, pickle.OpMark}
	b = append(b, msgid...)
	b = append(b, pickle.OpNewfalse)
	b = append(b, pickleStr(name)...)
	b = append(b, args...)
	return append(b, pickle.OpTuple, pickle.OpStop)
}

var registerArgs = append(pickleStr("1"), pickle.OpNewfalse, pickle.OpTuple2)

// nestedMsgid: register whose msgid is n nested one-element tuples.
func nestedMsgid(n int) []byte {
	id := append([]byte{pickle.OpBinint1, 1}, bytes.Repeat([]byte{pickle.OpTuple1}, n)...)
	return pickleMessage(id, "register", registerArgs)
}

// dagMsgid: register whose msgid is (1, L1, ..., Llevels), L(i) = (L(i-1),
// L(i-1)) through the memo: 2**levels values from a few hundred bytes.
func dagMsgid(levels int) []byte {
	id := []byte{pickle.OpMark, pickle.OpBinint1, 1, pickle.OpBinput, 0}
	for i := 1; i <= levels; i++ {
		id = append(id, pickle.OpBinget, byte(i-1), pickle.OpBinget, byte(i-1), pickle.OpTuple2, pickle.OpBinput, byte(i))
	}
	return pickleMessage(append(id, pickle.OpTuple), "register", registerArgs)
}

// listOfNone: a call whose argument is a list of about size Nones.
func listOfNone(size int) []byte {
	chunk := append(append([]byte{pickle.OpMark}, bytes.Repeat([]byte{pickle.OpNone}, 1000)...), pickle.OpAppends)
	args := append([]byte{pickle.OpEmptyList}, bytes.Repeat(chunk, size/len(chunk))...)
	return pickleMessage([]byte{pickle.OpBinint1, 1}, "register", append(args, pickle.OpTuple1))
}

// listOfRefs: a call whose arguments are ('x', [v] * n) with v one memo
// entry referenced n times.
func listOfRefs(n int) []byte {
	chunk := append(append([]byte{pickle.OpMark}, bytes.Repeat([]byte{pickle.OpBinget, 0}, 1000)...), pickle.OpAppends)
	args := append(pickleStr("x"), pickle.OpBinput, 0, pickle.OpEmptyList)
	args = append(args, bytes.Repeat(chunk, n/1000)...)
	return pickleMessage([]byte{pickle.OpBinint1, 1}, "register", append(args, pickle.OpTuple2))
}

// nilArray: msgpack [1, False, "register", [[None] * n]].
func nilArray(n int) []byte {
	b := []byte{0x94, 0x01, 0xc2, 0xa8}
	b = append(b, "register"...)
	b = append(b, 0x91, 0xdd)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	return append(b, bytes.Repeat([]byte{0xc0}, n)...)
}

// deepArray: msgpack [1, False, "register", [[[...]]]] n deep.
func deepArray(n int) []byte {
	b := []byte{0x94, 0x01, 0xc2, 0xa8}
	b = append(b, "register"...)
	return append(append(b, bytes.Repeat([]byte{0x91}, n)...), 0xc0)
}

type hostileCase struct {
	name  string
	m     Marshal
	frame []byte
}

func hostileCases(scale int) []hostileCase {
	return []hostileCase{
		{"nested msgid", Pickle, nestedMsgid(35 * scale)},
		{"memo dag msgid", Pickle, dagMsgid(40)},
		{"list of None", Pickle, listOfNone(500 * scale)},
		{"list of refs", Pickle, listOfRefs(200 * scale)},
		{"nil array", Msgpack, nilArray(500 * scale)},
		{"deep array", Msgpack, deepArray(35 * scale)},
	}
}

// allocBound is the most decoding a frame of n bytes may allocate with
// limits lim: a fixed multiple of the values the limits allow (about 10
// times the 72 bytes of a Value: the stack, the arena, lists growing),
// and never more than a fixed multiple of n.
func allocBound(lim Limits, n int) uint64 {
	vals := min(n, lim.BaseValues+n/lim.BytesPerValue)
	return 64<<10 + 8*uint64(n) + 720*uint64(vals)
}

// depthOf is the nesting of v, walked without recursion; it stops counting
// at limit+1 and after visiting budget values.
func depthOf(v *Value, limit, budget int) int {
	type item struct {
		v *Value
		d int
	}
	stack := []item{{v, 0}}
	deepest := 0
	for len(stack) > 0 && budget > 0 {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		budget--
		if len(it.v.Items) > 0 {
			if it.d+1 > deepest {
				deepest = it.d + 1
			}
			if deepest > limit {
				return deepest
			}
			for i := range it.v.Items {
				stack = append(stack, item{&it.v.Items[i], it.d + 1})
			}
		}
	}
	return deepest
}

var allocSample = []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}

// heapAllocs returns the bytes allocated on the heap so far (as
// runtime.MemStats' TotalAlloc, without stopping the world).
func heapAllocs() uint64 {
	metrics.Read(allocSample)
	return allocSample[0].Value.Uint64()
}

// decodeMeasured decodes frame with limits lim and returns the bytes
// allocated meanwhile.
func decodeMeasured(m Marshal, lim Limits, frame []byte) (Message, error, uint64) {
	d := NewDecoder(m)
	d.Limits = lim
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	msg, err := d.DecodeMessage(frame)
	runtime.ReadMemStats(&m1)
	return msg, err, m1.TotalAlloc - m0.TotalAlloc
}

// TestHostileFrames: every attack is refused (or decoded within the
// bounds) with allocations within allocBound, both with ServerLimits and
// DefaultLimits.
func TestHostileFrames(t *testing.T) {
	for _, lim := range []Limits{ServerLimits, DefaultLimits} {
		for _, c := range hostileCases(1000) {
			msg, err, alloc := decodeMeasured(c.m, lim, c.frame)
			if bound := allocBound(lim, len(c.frame)); alloc > bound {
				t.Errorf("%s (%d bytes, limits %+v): allocated %d bytes, bound %d", c.name, len(c.frame), lim, alloc, bound)
			}
			if err == nil {
				if d := depthOf(&msg.ID, lim.MaxDepth, 1<<20); d > lim.MaxDepth {
					t.Errorf("%s: msgid nested %d deep", c.name, d)
				}
				if d := depthOf(&msg.Args, lim.MaxDepth, 1<<20); d > lim.MaxDepth {
					t.Errorf("%s: args nested %d deep", c.name, d)
				}
				{
					t.Errorf("%s (limits %+v): decoded, want an error", c.name, lim)
				}
			}
			t.Logf("%s: %d bytes, limits %+v: allocated %d (%.1f x): %v", c.name, len(c.frame), lim, alloc, float64(alloc)/float64(len(c.frame)), err)
		}
	}
}

// TestHostileFullSize: the attacks at the sizes seen against the server
// (3.5 M nestings, 50 MB lists), with ServerLimits: the allocation stays a
// small multiple of the frame.
func TestHostileFullSize(t *testing.T) {
	if testing.Short() {
		t.Skip("50 MB frames")
	}
	for _, c := range hostileCases(100000) {
		_, err, alloc := decodeMeasured(c.m, ServerLimits, c.frame)
		if err == nil {
			t.Errorf("%s: decoded, want an error", c.name)
		}
		if alloc > 2*uint64(len(c.frame))+1<<20 {
			t.Errorf("%s (%d bytes): allocated %d bytes (%.2f x)", c.name, len(c.frame), alloc, float64(alloc)/float64(len(c.frame)))
		}
		t.Logf("%s: %d bytes: allocated %d (%.2f x): %v", c.name, len(c.frame), alloc, float64(alloc)/float64(len(c.frame)), err)
	}
}

// TestLimitErrorNamesMsgid: a message refused for its size, whose msgid
// and flags came first, reports them, so that the server can answer it.
func TestLimitErrorNamesMsgid(t *testing.T) {
	for _, c := range []hostileCase{
		{"pickle", Pickle, listOfNone(1 << 20)},
		{"msgpack", Msgpack, nilArray(1 << 20)},
		// An int beyond 64 bits (pack(2**63)): answered too, as ZEO/py
		// answers OverflowError.
		{"pickle LONG", Pickle, pickleMessage([]byte{pickle.OpBinint1, 1}, "pack",
			[]byte{pickle.OpLong1, 9, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, pickle.OpTuple1})},
		{"msgpack uint64", Msgpack, append([]byte{0x94, 0x01, 0xc2, 0xa4, 'p', 'a', 'c', 'k', 0x91, 0xcf}, 0x80, 0, 0, 0, 0, 0, 0, 0)},
	} {
		d := NewDecoder(c.m)
		d.Limits = ServerLimits
		_, err := d.DecodeMessage(c.frame)
		var de *DecodeError
		if !errors.As(err, &de) || !de.Limit || !de.HasID || de.ID.Kind != Int || de.ID.Int != 1 || de.Oneway {
			t.Errorf("%s: %v (%+v), want a limit error naming msgid 1", c.name, err, de)
		}
	}
	// A malformed message names no msgid it did not finish.
	_, err := NewDecoder(Pickle).DecodeMessage([]byte{pickle.OpProto, 3, pickle.OpMark, pickle.OpBinint1})
	var de *DecodeError
	if !errors.As(err, &de) || de.HasID {
		t.Errorf("truncated msgid: %v (%+v)", err, de)
	}
}

// TestRelease: the decoder keeps nothing of a big message after Release.
func TestRelease(t *testing.T) {
	for _, c := range []hostileCase{
		{"memo", Pickle, pickleMessage([]byte{pickle.OpBinint1, 1}, "x", append([]byte{pickle.OpNone}, bytes.Repeat([]byte{pickle.OpMemoize}, 5000)...))},
		{"msgpack", Msgpack, nilArray(50000)},
		{"tuple", Pickle, pickleMessage([]byte{pickle.OpBinint1, 1}, "x", append(append([]byte{pickle.OpMark}, bytes.Repeat([]byte{pickle.OpNone}, 50000)...), pickle.OpTuple))},
	} {
		d := NewDecoder(c.m)
		if _, err := d.DecodeMessage(c.frame); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if cap(d.arena) <= keepValues && cap(d.stack) <= keepValues && cap(d.memo) <= keepValues {
			t.Errorf("%s: the decoder did not grow (arena %d, stack %d): the test tests nothing", c.name, cap(d.arena), cap(d.stack))
		}
		d.Release()
		if cap(d.arena) > keepValues || cap(d.stack) > keepValues || cap(d.memo) > keepValues {
			t.Errorf("%s: after Release: arena %d, stack %d, memo %d values", c.name, cap(d.arena), cap(d.stack), cap(d.memo))
		}
	}
}

// TestMemoMutation: appending to a list that came from the memo is
// refused (it would share, and regrow, the memo entry's items).
func TestMemoMutation(t *testing.T) {
	b := []byte{pickle.OpProto, 3, pickle.OpEmptyList, pickle.OpBinput, 0, pickle.OpBinget, 0, pickle.OpNone, pickle.OpAppend, pickle.OpTuple2, pickle.OpStop}
	if v, err := NewDecoder(Pickle).Decode(b); err == nil {
		t.Errorf("decoded as %v, want an error", v)
	}
	// The way a non-fast pickler writes a list (PUT, then APPENDS on
	// the stack's copy) is fine.
	b = []byte{pickle.OpProto, 3, pickle.OpEmptyList, pickle.OpBinput, 0, pickle.OpMark, pickle.OpNone, pickle.OpNone, pickle.OpAppends, pickle.OpStop}
	if v, err := NewDecoder(Pickle).Decode(b); err != nil || v.Len() != 2 {
		t.Errorf("PUT then APPENDS: %v %v", v, err)
	}
}

// FuzzDecodeAlloc decodes arbitrary frames with ServerLimits and
// DefaultLimits and fails when a decode allocates more than allocBound
// or builds values nested deeper than the limit. The seeds are the
// attacks, small.
func FuzzDecodeAlloc(f *testing.F) {
	for _, c := range hostileCases(3) {
		f.Add(byte(c.m), c.frame)
	}
	f.Add(byte(Pickle), dagMsgid(12))
	f.Fuzz(func(t *testing.T, m byte, b []byte) {
		mm := Pickle
		if m&1 == 1 {
			mm = Msgpack
		}
		for _, lim := range []Limits{ServerLimits, DefaultLimits} {
			// The count is the process's: the fuzzing engine allocates
			// too. Amplification repeats; a measure is taken again
			// before it counts as one.
			var v Value
			var err error
			a := uint64(math.MaxUint64)
			for try := 0; try < 3 && a > allocBound(lim, len(b)); try++ {
				d := NewDecoder(mm)
				d.Limits = lim
				a0 := heapAllocs()
				v, err = d.Decode(b)
				a = min(a, heapAllocs()-a0)
			}
			if a > allocBound(lim, len(b)) {
				t.Fatalf("limits %+v: decoding %d bytes allocated %d (bound %d)", lim, len(b), a, allocBound(lim, len(b)))
			}
			if err == nil {
				if dp := depthOf(&v, lim.MaxDepth, lim.BaseValues+len(b)/lim.BytesPerValue+1); dp > lim.MaxDepth {
					t.Fatalf("limits %+v: value nested %d deep", lim, dp)
				}
			}
		}
	})
}

// TestReadFrameGrows: a frame header that announces 200 MB followed by
// a few bytes costs memory in proportion to the bytes, not the header.
func TestReadFrameGrows(t *testing.T) {
	in := binary.BigEndian.AppendUint32(nil, 200<<20)
	in = append(in, make([]byte, 3<<20)...)
	a0 := heapAllocs()
	_, err := ReadFrame(bufio.NewReaderSize(bytes.NewReader(in), 64<<10), nil, 256<<20)
	if a := heapAllocs() - a0; a > 16<<20 {
		t.Errorf("allocated %d bytes for 3 MiB of a frame", a)
	}
	if err != io.ErrUnexpectedEOF {
		t.Errorf("err %v, want io.ErrUnexpectedEOF", err)
	}
	// Frames of every size around the steps read back whole.
	for _, n := range []int{0, 1, growStart - 1, growStart, growStart + 1, 3*growStart + 7, 9 * growStart} {
		payload := make([]byte, n)
		for i := range payload {
			payload[i] = byte(i * 7)
		}
		in := append(binary.BigEndian.AppendUint32(nil, uint32(n)), payload...)
		got, err := ReadFrame(bufio.NewReader(bytes.NewReader(in)), nil, 256<<20)
		if err != nil || !bytes.Equal(got, payload) {
			t.Errorf("frame of %d bytes: %d bytes back, %v", n, len(got), err)
		}
	}
}

// expandedSize is what Encoder.Value writes for v, roughly: each value's
// bytes plus one byte of header, memo references expanded (walked without
// recursion, without allocating the encoding).
func expandedSize(v *Value) uint64 {
	var n uint64
	stack := []*Value{v}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n += 1 + uint64(len(x.B))
		for i := range x.Items {
			stack = append(stack, &x.Items[i])
		}
	}
	return n
}

// TestMemoBytesAmplification: a tpc_begin whose extension dict is
// {'k': (b, b, ..., b)} with b one 64 KiB bytes value memoized once and
// fetched 16000 times (BINGET, 2 bytes each). The Limits counted each
// memo reference as the number of values it expands to (1 for a bytes
// value), not as its bytes, so ServerLimits accepted the ~100 KB frame; the
// zeo server then re-encodes the extension (zeo/txn.go tpcBegin ->
// encodeExtension -> Encoder.Value), which writes 1 GiB: a 10000x
// amplification from an unauthenticated request (with 1 MiB values, tens
// of GiB: the server is OOM-killed).
// The same with an int of 64 KiB (LONG4) for a decoder that takes them
// (BigInts: a server's).
func TestMemoBytesAmplification(t *testing.T) {
	for _, op := range []byte{pickle.OpBinbytes, pickle.OpLong4} {
		memoAmplification(t, op)
	}
}

func memoAmplification(t *testing.T, op byte) {
	big := bytes.Repeat([]byte{'x'}, 64<<10)
	const refs = 16000
	var args []byte
	args = append(args, pickle.OpMark, pickle.OpBinint1, 1) // txn id
	args = append(args, pickle.OpShortBinbytes, 0, pickle.OpShortBinbytes, 0)
	args = append(args, pickle.OpEmptyDict, pickle.OpMark)
	args = append(args, pickleStr("k")...)
	args = append(args, pickle.OpMark, op)
	args = binary.LittleEndian.AppendUint32(args, uint32(len(big)))
	args = append(args, big...)
	args = append(args, pickle.OpBinput, 0)
	args = append(args, bytes.Repeat([]byte{pickle.OpBinget, 0}, refs-1)...)
	args = append(args, pickle.OpTuple, pickle.OpSetitems)
	args = append(args, pickle.OpNone)
	args = append(args, pickleStr(" ")...)
	args = append(args, pickle.OpTuple)
	frame := pickleMessage([]byte{pickle.OpBinint1, 1}, "tpc_begin", args)

	d := NewDecoder(Pickle)
	d.Limits = ServerLimits
	d.BigInts = true
	msg, err := d.DecodeMessage(frame)
	if err != nil {
		t.Logf("refused: %v", err)
		return
	}
	ext := &msg.Args.Items[3]
	if ext.Kind != Dict {
		t.Fatalf("ext is a %s", ext.Kind)
	}
	got := expandedSize(ext)
	// What the decoder promises: a frame of n bytes decodes to at most
	// 16384 + n/256 values "(about 1.2 MiB + 0.3 n)".
	bound := uint64(2<<20) + 4*uint64(len(frame))
	if got > bound {
		t.Errorf("a %d-byte frame decoded under ServerLimits to an extension dict that re-encodes to %d bytes (%.0fx the frame; bound %d): memo references to big strings are charged 1 value each",
			len(frame), got, float64(got)/float64(len(frame)), bound)
	}
}

// TestMsgpackUint64RoundTrip: a msgpack uint64 beyond int64 (a msgid, a
// pack time) decodes, with BigInts, to an int and encodes back to the same
// uint64 (it was refused, then echoed as None).
func TestMsgpackUint64RoundTrip(t *testing.T) {
	for _, u := range []uint64{1 << 63, 1<<64 - 1} {
		frame := binary.BigEndian.AppendUint64([]byte{0xcf}, u)
		d := NewDecoder(Msgpack)
		d.BigInts = true
		v, err := d.Decode(frame)
		if err != nil || v.Kind != Int || v.B == nil {
			t.Fatalf("%d: %v %v", u, v, err)
		}
		e := Encoder{M: Msgpack}
		e.Value(&v)
		if !bytes.Equal(e.Buf, frame) {
			t.Errorf("%d: encoded back as %x, want %x", u, e.Buf, frame)
		}
	}
}
