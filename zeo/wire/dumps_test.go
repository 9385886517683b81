package wire

import (
	"bytes"
	"encoding/hex"
	"os/exec"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
)

// dumpsPy prints, for each Python expression on stdin, the message
// pickle of its value (ZEO/py's marshal: protocol 3, fast mode) and what
// pickle.dumps(value, 3) writes for the object a ZEO/py server decodes
// from that message (as ZODB stores a transaction's extension).
const dumpsPy = `
import io, pickle, sys, zodbpickle.pickle as zp
for line in sys.stdin:
    x = eval(line)
    f = io.BytesIO()
    p = pickle.Pickler(f, 3)
    p.fast = 1
    p.dump(x)
    m = f.getvalue()
    print(m.hex(), zp.dumps(pickle.loads(m), 3).hex())
`

// TestDumpsAsPython: Dumps writes what ZODB/py's server stores for the
// extension a client sends (tpc_begin), byte for byte: memo entries,
// one-item SETITEM/APPEND, batches of 1000, sets, the objects Python
// shares (one-character str, one-byte bytes). zodbd wrote the dict
// without memo entries and with SETITEMS for one item: the same value,
// other bytes than runzeo's in Data.fs.
func TestDumpsAsPython(t *testing.T) {
	py := datasets.Python(t)
	exprs := []string{
		`{'k': 'v'}`,
		`{'user_id': 'admin', 'app': 'Plone', 'n': 3, 'f': 1.5, 'none': None, 't': True}`,
		`{'x': 'a', 'y': 'a', 'z': 'é', 'w': 'é', 'e': '', 'e2': '', 'b': b'', 'b1': b'q', 'b2': b'q', 'long': 'ab', 'long2': 'ab'}`,
		`{'t0': (), 't1': (1,), 't2': (1, 'x'), 't3': (1, 2, 3), 't4': (1, 2, 3, 4), 'l0': [], 'l1': [1], 'l2': [1, 2]}`,
		`{'s': {1, 2}, 'fs': frozenset([3]), 's2': {4}}`,
		`{'nested': {'a': [{'b': (b'\x00' * 300, 'z' * 300)}]}}`,
		`{'ints': [0, 255, 256, 65535, 65536, -1, -2**31, 2**31 - 1, 2**31, -2**31 - 1, 2**63 - 1, -2**63, 2**70, -2**70, 2**2100]}`,
		`{str(i): i for i in range(2500)}`,
		`{'l': list(range(2001)), 'l1001': list(range(1001))}`,
		`{'many': ['s%d' % i for i in range(300)]}`,
		`{'u': 'ünïcødé €', 'surrogate-free': '\U0001F600'}`,
	}
	cmd := exec.Command(py, "-c", dumpsPy)
	cmd.Stdin = strings.NewReader(strings.Join(exprs, "\n") + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(exprs) {
		t.Fatalf("python printed %d lines for %d expressions:\n%s", len(lines), len(exprs), out)
	}
	for i, line := range lines {
		f := strings.Fields(line)
		msg, _ := hex.DecodeString(f[0])
		want, _ := hex.DecodeString(f[1])
		d := NewDecoder(Pickle)
		d.BigInts = true
		v, err := d.Decode(msg)
		if err != nil {
			t.Errorf("%s: decode: %v", exprs[i], err)
			continue
		}
		if got := Dumps(&v); !bytes.Equal(got, want) {
			t.Errorf("%.60s: Dumps\n %q\nwant (pickle.dumps)\n %q", exprs[i], got, want)
		}
	}
}
