package zeo

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"os/exec"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/pickle"
	"github.com/zodbd/zodbd/zeo/wire"
)

// TestTpcBeginExtensionAmplification: tpc_begin's extension dict is
// re-encoded by encodeExtension (txn.go tpcBegin) with every memo
// reference expanded. A client's frame of ~40 KB whose extension is
// {'k': (b,) * 16000}, b one 4 KiB bytes value memoized once, passed the
// server's decoder (wire.ServerLimits charged one value per reference to a
// bytes value, whatever its size) and made the server allocate 64 MiB
// for the transaction's extension, which FileStorage refuses anyway (its
// extension length is 16 bits). With b of 1 MiB (a ~1 MB frame) it is
// 16 GiB: one unauthenticated request OOM-kills the server. ZEO/py keeps
// the shared object and re-pickles it with a memo (a few KiB).
func TestTpcBeginExtensionAmplification(t *testing.T) {
	big := bytes.Repeat([]byte{'x'}, 4<<10)
	const refs = 16000
	b := []byte{pickle.OpProto, 3, pickle.OpMark, pickle.OpBinint1, 1, pickle.OpNewfalse}
	str := func(s string) {
		b = append(b, pickle.OpShortBinunicode, byte(len(s)))
		b = append(b, s...)
	}
	str("tpc_begin")
	b = append(b, pickle.OpMark, pickle.OpBinint1, 1, pickle.OpShortBinbytes, 0, pickle.OpShortBinbytes, 0)
	b = append(b, pickle.OpEmptyDict, pickle.OpMark)
	str("k")
	b = append(b, pickle.OpMark, pickle.OpBinbytes)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(big)))
	b = append(b, big...)
	b = append(b, pickle.OpBinput, 0)
	b = append(b, bytes.Repeat([]byte{pickle.OpBinget, 0}, refs-1)...)
	b = append(b, pickle.OpTuple, pickle.OpSetitems, pickle.OpNone)
	str(" ")
	b = append(b, pickle.OpTuple, pickle.OpTuple, pickle.OpStop)

	d := wire.NewDecoder(wire.Pickle)
	d.Limits = wire.ServerLimits // as conn.go sets it
	msg, err := d.DecodeMessage(b)
	if err != nil {
		t.Logf("refused by the decoder: %v", err)
		return
	}
	ext := &msg.Args.Items[3]
	out := wire.DumpsExtension(ext)
	if len(out) > 64*len(b) {
		t.Errorf("a %d-byte tpc_begin frame made encodeExtension allocate a %d-byte extension (%.0fx)", len(b), len(out), float64(len(out))/float64(len(b)))
	}
}

// TestTpcBeginExtensionSet: the stock ZEO client pickles
// a transaction extension holding a set or a frozenset as
// REDUCE(builtins.set, ([...],)); ZEO/py's server unpickles it (builtins
// is one of its safe modules) and stores the set. zodbd's decoder turns
// the call into a List (wire.reduceGlobal), marked as a set, which
// encodeExtension stored as a list: the transaction's metadata was
// silently changed ({'s': {1, 2}} read back as {'s': [1, 2]} in
// undoLog/undoInfo/history/iterators). (A bytearray, also allowed by
// ZEO/py, is refused.)
func TestTpcBeginExtensionSet(t *testing.T) {
	py := datasets.Python(t)
	// ZEO.asyncio.marshal.encoder(b'Z5')(1, False, 'tpc_begin', (1, b'u',
	// b'd', {'s': {1, 2}, 'f': frozenset([3])}, None, ' '))
	frame := []byte("\x80\x03(K\x01\x89X\t\x00\x00\x00tpc_begin(K\x01C\x01uC\x01d}(X\x01\x00\x00\x00scbuiltins\nset\n](K\x01K\x02e\x85RX\x01\x00\x00\x00fcbuiltins\nfrozenset\n]K\x03a\x85RuNX\x01\x00\x00\x00 tt.")
	d := wire.NewDecoder(wire.Pickle)
	d.Limits = wire.ServerLimits
	msg, err := d.DecodeMessage(frame)
	if err != nil {
		t.Fatalf("zodbd refuses a tpc_begin ZEO/py accepts: %v", err)
	}
	stored := wire.DumpsExtension(&msg.Args.Items[3])
	out, err := exec.Command(py, "-c", `
import sys, zodbpickle.pickle as p
ext = p.loads(bytes.fromhex(sys.argv[1]))
print(ext == {'s': {1, 2}, 'f': frozenset([3])}, ext)`, hex.EncodeToString(stored)).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "True") {
		t.Errorf("the extension {'s': {1, 2}, 'f': frozenset({3})} is stored as %s", strings.TrimPrefix(strings.TrimSpace(string(out)), "False "))
	}
}

// TestStoredExtensionBigInt: a transaction extension that ZODB/py
// stored (zodbpickle.dumps(ext, 3)) holding an int beyond 64 bits does
// not decode with wire's Value model for requests, and decodeExtension then
// returned an empty dict: undoLog, undoInfo (and its specification
// matching) and history answered without any of the transaction's
// extension keys, where ZEO/py returns them all. Encoded again, it is
// what ZODB/py stored.
func TestStoredExtensionBigInt(t *testing.T) {
	// zodbpickle.pickle.dumps({'app': 'x', 'n': 2**70}, 3)
	stored := []byte("\x80\x03}q\x00(X\x03\x00\x00\x00appq\x01X\x01\x00\x00\x00xq\x02X\x01\x00\x00\x00nq\x03\x8a\t\x00\x00\x00\x00\x00\x00\x00\x00@u.")
	ext := decodeExtension(stored)
	found := false
	for i := 0; i+1 < len(ext.Items); i += 2 {
		if string(ext.Items[i].B) == "app" {
			found = true
		}
	}
	if !found {
		t.Errorf("decodeExtension(%q) = %v: the key 'app' ZEO/py returns is gone", stored, ext)
	}
	py := datasets.Python(t)
	out, err := exec.Command(py, "-c", `
import sys, zodbpickle.pickle as p
ext = p.loads(bytes.fromhex(sys.argv[1]))
print(ext == {'app': 'x', 'n': 2**70}, ext)`, hex.EncodeToString(wire.DumpsExtension(&ext))).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "True") {
		t.Errorf("the extension {'app': 'x', 'n': 2**70} is encoded again as %s", strings.TrimPrefix(strings.TrimSpace(string(out)), "False "))
	}
}
