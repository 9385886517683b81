package resolve

// Differential tests of Resolve against BTrees' own
// _p_resolveConflict, run through ZODB's real tryToResolveConflict, on
// records made by ZODB's real serializer (ZODB.serialize.ObjectWriter) at
// pickle protocols 0 to 3, some zc.zlibstorage-compressed.

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
)

type oracleCase struct {
	Class     string  `json:"class"`
	Proto     int     `json:"proto"`
	KMode     *string `json:"kmode"`
	VMode     *string `json:"vmode"`
	Z         bool    `json:"z"`
	Want      string  `json:"want"`
	PyFail    string  `json:"pyfail"`
	Old       string  `json:"old"`
	Committed string  `json:"committed"`
	New       string  `json:"new"`
}

func oracleScript(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "oraclegen.py")
	if err := os.WriteFile(p, []byte(oracleGenPy), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// oracleRun generates n cases of seed, resolves them with Resolve and checks
// the results against ZODB's. It returns the failures by category.
func oracleRun(t *testing.T, py, script string, seed int64, n int, renc string) map[string][]string {
	t.Helper()
	gen := exec.Command(py, script, "gen", strconv.FormatInt(seed, 10), strconv.Itoa(n), renc)
	var stderr bytes.Buffer
	gen.Stderr = &stderr
	out, err := gen.Output()
	if err != nil {
		t.Fatalf("gen: %v\n%s", err, stderr.Bytes())
	}
	fails := map[string][]string{}
	refusedSeen := map[string]int{}
	defer func() { t.Logf("seed %d: Resolve's refusals where ZODB merges, by cause: %v", seed, refusedSeen) }()
	stats := map[string]int{}
	var checks bytes.Buffer
	enc := json.NewEncoder(&checks)
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 64<<20)
	i := -1
	for sc.Scan() {
		i++
		var c oracleCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
		dec := func(s string) []byte {
			b, err := hex.DecodeString(s)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		got, err := Resolve(dec(c.Old), dec(c.Committed), dec(c.New))
		var re *RefusedError
		errors.As(err, &re)
		desc := fmt.Sprintf("seed %d case %d %s proto %d z=%v: ", seed, i, c.Class, c.Proto, c.Z)
		detail := fmt.Sprintf("\n  old       %s\n  committed %s\n  new       %s", c.Old, c.Committed, c.New)
		fam := c.Class
		switch {
		case c.Want != "" && err == nil:
			stats[fam+" equal?"]++
			enc.Encode(map[string]any{"i": i, "class": c.Class, "want": c.Want, "got": hex.EncodeToString(got)})
		case c.Want != "":
			stats[fam+" refused-where-merges"]++
			msg := oracleNormalize(err.Error())
			if refusedSeen[msg]++; refusedSeen[msg] == 1 {
				fails["refused-where-BTrees-merges"] = append(fails["refused-where-BTrees-merges"], desc+err.Error()+detail)
			}
		case err == nil:
			fails["accepted-where-BTrees-refuses"] = append(fails["accepted-where-BTrees-refuses"], desc+"Python: "+c.PyFail+detail)
		case re != nil && strings.HasPrefix(c.PyFail, "reason ") && c.PyFail != fmt.Sprintf("reason %d", re.Reason):
			stats[fam+" both refuse"]++
			fails["other reason"] = append(fails["other reason"], desc+fmt.Sprintf("Python %s, Go reason %d", c.PyFail, re.Reason)+detail)
		default:
			stats[fam+" both refuse"]++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	// The same cases again, from 4 goroutines at once (pooled resolvers
	// reused concurrently): the results must be byte-identical.
	oracleConcurrent(t, out, fails)
	check := exec.Command(py, script, "check")
	check.Stdin = &checks
	res, err := check.CombinedOutput()
	if err != nil {
		fails["wrong merge"] = append(fails["wrong merge"], fmt.Sprintf("seed %d: %v\n%s", seed, err, res))
	}
	keys := make([]string, 0, len(stats))
	for k := range stats {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, stats[k])
	}
	t.Logf("seed %d: %d cases; %s; check: %s", seed, i+1, b.String(), bytes.TrimSpace(res))
	return fails
}

// oracleDiff runs the random differential test with the share renc of
// records written by the random-encoding pickler.
func oracleDiff(t *testing.T, seeds []int64, n int, renc string) {
	py := datasets.Python(t)
	script := oracleScript(t)
	if os.Getenv("ZODBD_STRESS") == "" {
		// The default run: one seed, a quarter of the cases (make
		// stress compares them all).
		seeds, n = seeds[:1], n/4
	}
	for _, seed := range seeds {
		fails := oracleRun(t, py, script, seed, n, renc)
		// Refusals where ZODB merges are logged (by cause) above: a
		// conflict the server leaves to the client, which resolves it
		// with BTrees (protocol 0/1 text forms of big ints, escapes,
		// inf; records inflating past Resolve's bounds).
		delete(fails, "refused-where-BTrees-merges")
		for cat, fs := range fails {
			for j, f := range fs {
				if j >= 5 {
					t.Errorf("%s: ... %d more", cat, len(fs)-j)
					break
				}
				t.Errorf("%s: %s", cat, f)
			}
		}
	}
}

// TestResolveMatchesBTrees: random conflicts of every class Resolve
// handles (all 22 families, buckets, sets, one-bucket trees, Length),
// records written by ZODB's ObjectWriter at protocols 0-3 (8% of them
// zlib-compressed as zc.zlibstorage does), oracle ZODB's
// tryToResolveConflict. Resolve must never merge where ZODB refuses, nor
// merge differently.
func TestResolveMatchesBTrees(t *testing.T) {
	oracleDiff(t, []int64{1, 2, 3}, 4000, "0")
}

// TestResolveMatchesBTreesRandomEncoding: as TestResolveMatchesBTrees, but each
// value of the records is written with a random choice among the opcodes
// that unpickle to it (BININT1/BININT2/BININT/INT/LONG/LONG1/LONG4,
// NEWTRUE/INT 01, BINFLOAT/FLOAT, BINUNICODE/SHORT_BINSTRING/BINSTRING/
// STRING/UNICODE, TUPLE1-3/MARK TUPLE, APPEND/APPENDS/LIST, random
// PUT/BINPUT/LONG_BINPUT and GET forms, POP/POP_MARK/DUP noise).
func TestResolveMatchesBTreesRandomEncoding(t *testing.T) {
	oracleDiff(t, []int64{11, 12, 13}, 4000, "1.0")
}

var oracleQuoted = regexp.MustCompile(`"[^"]*"|[0-9]+`)

func oracleNormalize(msg string) string { return oracleQuoted.ReplaceAllString(msg, "_") }

// oracleConcurrent resolves the cases of gen's output from 4 goroutines
// and compares each result with a sequential Resolve of the same case.
func oracleConcurrent(t *testing.T, out []byte, fails map[string][]string) {
	var recs [][3][]byte
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var c oracleCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
		var r [3][]byte
		for j, h := range []string{c.Old, c.Committed, c.New} {
			r[j], _ = hex.DecodeString(h)
		}
		recs = append(recs, r)
	}
	want := make([]string, len(recs))
	for i, r := range recs {
		got, err := Resolve(r[0], r[1], r[2])
		want[i] = fmt.Sprintf("%x %v", got, err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for k := range recs {
				i := (k + g*len(recs)/4) % len(recs)
				got, err := Resolve(recs[i][0], recs[i][1], recs[i][2])
				if s := fmt.Sprintf("%x %v", got, err); s != want[i] {
					mu.Lock()
					fails["concurrent Resolve differs"] = append(fails["concurrent Resolve differs"], fmt.Sprintf("case %d: %.300s, sequentially %.300s", i, s, want[i]))
					mu.Unlock()
				}
			}
		}(g)
	}
	wg.Wait()
}

const oracleGenPy = `
import io, json, random, sys, zlib, struct
import transaction, ZODB
import ZODB.serialize as zser
from ZODB.MappingStorage import MappingStorage
from ZODB.ConflictResolution import (tryToResolveConflict, PersistentReferenceFactory,
                                     find_global)
from ZODB.POSException import BTreesConflictError, ConflictError
from ZODB._compat import PersistentUnpickler
from persistent.mapping import PersistentMapping
from persistent.wref import WeakRef
import BTrees
import logging
logging.getLogger('ZODB.ConflictResolution').disabled = True
from BTrees.Length import Length

FAMS = ['IF', 'II', 'IO', 'IU', 'LF', 'LL', 'LO', 'LQ', 'OI', 'OL', 'OO',
        'OQ', 'OU', 'QF', 'QL', 'QO', 'QQ', 'UF', 'UI', 'UO', 'UU', 'fs']
LIM = {'I': (-2**31, 2**31 - 1), 'L': (-2**63, 2**63 - 1),
       'U': (0, 2**32 - 1), 'Q': (0, 2**64 - 1)}

class Store:
    """enough of a storage for tryToResolveConflict"""
    def __init__(self): self.recs = {}
    def loadSerial(self, oid, serial): return self.recs[serial]
    def _crs_untransform_record_data(self, d):
        return zlib.decompress(d[2:]) if d[:2] == b'.z' else d
    def _crs_transform_record_data(self, d): return d

def reason_of(old, com, new):
    """difftest-style direct call, to learn the BTrees reason / exception"""
    prf = PersistentReferenceFactory()
    def st(p):
        p = zlib.decompress(p[2:]) if p[:2] == b'.z' else p
        u = PersistentUnpickler(find_global, prf.persistent_load, io.BytesIO(p))
        m = u.load(); return m, u.load()
    meta, sn = st(new); _, so = st(old); _, sc = st(com)
    klass = meta[0] if isinstance(meta, tuple) else meta
    try:
        klass.__new__(klass)._p_resolveConflict(so, sc, sn)
    except BTreesConflictError as e:
        return ('reason', e.reason)
    except Exception as e:
        return ('exc', type(e).__name__)
    return ('ok', None)


class REnc:
    """A pickler that writes each value with a random choice among the
    opcode forms that unpickle to it (protocols 0-3), random memo PUT/GET,
    and stack noise (DUP/POP, MARK/POP_MARK)."""

    def __init__(self, r, pid):
        self.r = r; self.pid = pid; self.memo = {}; self.n = 0; self.out = bytearray()

    def w(self, b): self.out += b

    def put(self, obj):
        r = self.r
        if r.random() < 0.4:
            i = self.n; self.n += 1 + (r.random() < 0.1) * r.randrange(3)
            c = r.random()
            if i < 256 and c < 0.5: self.w(b'q' + bytes([i]))
            elif c < 0.8: self.w(b'r' + struct.pack('<I', i))
            else: self.w(b'p%d\n' % i)
            if obj is not None: self.memo[id(obj)] = (i, obj)

    def get(self, i):
        c = self.r.random()
        if i < 256 and c < 0.5: self.w(b'h' + bytes([i]))
        elif c < 0.8: self.w(b'j' + struct.pack('<I', i))
        else: self.w(b'g%d\n' % i)

    def noise(self):
        r = self.r
        c = r.random()
        if c < 0.03: self.w(b'N0')
        elif c < 0.05: self.w(b'(K\x05X\x01\x00\x00\x00z1')
        elif c < 0.06: self.w(b'(0')

    def dump(self, obj):
        self.noise()
        self.save(obj)
        self.w(b'.')

    def save(self, x):
        r = self.r
        if id(x) in self.memo and self.memo[id(x)][1] is x and r.random() < 0.8:
            self.get(self.memo[id(x)][0]); return
        p = self.pid(x)
        if p is not None:
            self.save(p); self.w(b'Q'); self.put(None); return
        t = type(x)
        if x is None: self.w(b'N')
        elif t is bool:
            self.w(r.choice([b'\x88' if x else b'\x89', b'I01\n' if x else b'I00\n']))
        elif t is int:
            forms = []
            if 0 <= x < 256: forms.append(b'K' + bytes([x]))
            if 0 <= x < 65536: forms.append(b'M' + struct.pack('<H', x))
            if -2**31 <= x < 2**31: forms.append(b'J' + struct.pack('<i', x))
            if -2**63 <= x < 2**63 and x not in (0, 1): forms.append(b'I%d\n' % x)
            if -2**63 <= x < 2**63: forms.append(b'L%dL\n' % x)
            n = (x.bit_length() + 8) // 8 if x else 0
            lb = x.to_bytes(n, 'little', signed=True) if n else b''
            forms.append(b'\x8a' + bytes([len(lb)]) + lb)
            forms.append(b'\x8b' + struct.pack('<i', len(lb)) + lb)
            self.w(r.choice(forms))
        elif t is float:
            forms = [b'G' + struct.pack('>d', x)]
            if x == x and abs(x) != float('inf'): forms.append(b'F' + repr(x).encode() + b'\n')
            self.w(r.choice(forms))
        elif t is str:
            e = x.encode('utf-8', 'surrogatepass')
            forms = [b'X' + struct.pack('<I', len(e)) + e]
            if x.isascii():
                a = x.encode()
                if len(a) < 256: forms.append(b'U' + bytes([len(a)]) + a)
                forms.append(b'T' + struct.pack('<i', len(a)) + a)
                if '\\' not in x and "'" not in x and '\n' not in x and '\r' not in x and x.isprintable():
                    forms.append(b"S'" + a + b"'\n")
            if all(ord(c) < 256 for c in x) and '\\' not in x and '\n' not in x and '\r' not in x:
                forms.append(b'V' + x.encode('latin-1') + b'\n')
            self.w(r.choice(forms))
        elif t is bytes:
            forms = [b'B' + struct.pack('<I', len(x)) + x]
            if len(x) < 256: forms.append(b'C' + bytes([len(x)]) + x)
            self.w(r.choice(forms))
        elif t is tuple:
            if not x and r.random() < 0.7: self.w(b')')
            elif 1 <= len(x) <= 3 and r.random() < 0.6:
                for i in x: self.save(i)
                self.w(bytes([0x85 + len(x) - 1]))
            else:
                self.w(b'(')
                for i in x: self.save(i)
                self.w(b't')
        elif t is list:
            if r.random() < 0.3:
                self.w(b'(')
                for i in x: self.save(i)
                self.w(b'l')
            else:
                self.w(b']'); self.put(x)
                i = 0
                while i < len(x):
                    if r.random() < 0.3:
                        self.save(x[i]); self.w(b'a'); i += 1
                    else:
                        k = r.randrange(1, len(x) - i + 1)
                        self.w(b'(')
                        for y in x[i:i + k]: self.save(y)
                        self.w(b'e'); i += k
                return
        elif t is dict:
            self.w(b'}'); self.put(x)
            if x:
                self.w(b'(')
                for k, v in x.items(): self.save(k); self.save(v)
                self.w(b'u')
            return
        elif isinstance(x, type):
            self.w(b'c' + x.__module__.encode() + b'\n' + x.__name__.encode() + b'\n')
        else:
            raise TypeError(t)
        self.put(x)

def renc_record(r, obj, klass, state):
    w = zser.ObjectWriter(obj)
    def pid(x):
        if isinstance(x, (type, int, float, str, bytes, tuple, list, dict, type(None))): return None
        return w.persistent_id(x)
    e = REnc(r, pid)
    if r.random() < 0.7: e.w(b'\x80' + bytes([r.choice([2, 3])]))
    if r.random() < 0.1: e.save((klass, None)); e.w(b'.')
    else: e.dump(klass)
    if r.random() < 0.7: e.w(b'\x80' + bytes([r.choice([2, 3])]))
    e.dump(state)
    return bytes(e.out)

class Gen:
    def __init__(self, seed, conn, objs):
        self.r = random.Random(seed); self.conn = conn; self.objs = objs; self.renc = 0.0

    def int_key(self, t):
        r = self.r; lo, hi = LIM[t]
        c = r.random()
        if c < 0.25: return r.choice([lo, hi, lo + 1, hi - 1, 0, 1, -1 if lo < 0 else 2, True, False])
        if c < 0.5: return r.randint(lo, hi)
        base = r.choice([0, lo, hi - 50, -25 if lo < 0 else 10])
        return min(max(lo, base + r.randrange(50)), hi)

    def okey(self, mode):
        r = self.r
        if mode == 'int': return r.choice([r.randrange(-40, 40), r.choice([2**63 - 1, -2**63, 2**64, -2**64 - 3, 2**100, 2**31])])
        if mode == 'str': return ''.join(r.choice(['a', 'b', 'z', '\xe9', '\u20ac', '\U0001f600', '\ud800', '\x00', '\n', '\\', ' ']) for _ in range(r.randrange(4)))
        if mode == 'bytes': return bytes(r.randrange(256) for _ in range(r.randrange(4)))
        if mode == 'float': return r.choice([0.5, -1.5, 1e300, -0.0, 0.0, 2.0, float('inf'), -float('inf'), 1e-310, 2.0**63, 2.0**64]) + r.randrange(3)
        if mode == 'num': return r.choice([r.randrange(-5, 5), r.randrange(-5, 5) + 0.5, True, False, float(r.randrange(-5, 5)), 2**53 + 1, float(2**53), 2**64, float(2**64)])
        if mode == 'tuple': return tuple(r.choice(['a', 'b', 1, 2, None]) for _ in range(r.randrange(3)))
        if mode == 'none': return r.choice([None, r.randrange(10)])
        raise ValueError(mode)

    def oval(self, mode):
        r = self.r
        if mode == 'int': return r.choice([0, 1, 2, -1, 2**70, -2**63 - 1, True])
        if mode == 'str': return r.choice(['x', 'y', '\xe9', '\U0001f600', ''])
        if mode == 'shared': return self.shared[r.randrange(len(self.shared))]
        if mode == 'pm': return self.objs['pm'][r.randrange(3)]
        if mode == 'wref': return WeakRef(self.objs['pm'][r.randrange(2)])
        if mode == 'mixed': return r.choice([None, 1, 1.0, 'a', b'a', (1, 'a'), [1], (None,), self.objs['pm'][0]])
        if mode == 'float': return r.choice([0.0, -0.0, 1.0, 1, True, 0.1, 2**53 + 1])
        raise ValueError(mode)

    def nval(self, t):
        r = self.r
        if t == 'F':
            return r.choice([0.1, 0.5, 1.0, 3, -2.5, 1 / 3.0, 3.4028234663852886e38, 3.4e38, 1e-45, 1.4e-45, 7e-46,
                             2**24 + 1, 2**31 - 1, -2**31, 2**62 + 2**38 + 1, True, False, 16777217.0, 0.1 + 2**-30, -0.0])
        if t == 's': return bytes(r.randrange(3) for _ in range(6))
        lo, hi = LIM[t]
        return r.choice([lo, hi, 0, 1, 2, True, False, lo + 1, hi - 1])

    def case(self):
        r = self.r
        proto = r.choice([3, 3, 3, 2, 1, 0])
        if r.random() < 0.06:
            return self.length_case(proto)
        fam = r.choice(FAMS)
        kind = r.choice(['Bucket', 'Set', 'BTree', 'TreeSet', 'Bucket'])
        mod = __import__('BTrees.%sBTree' % fam, fromlist=['x'])
        mapping = kind in ('Bucket', 'BTree')
        kt, vt = fam[0], fam[1]
        kmode = vmode = None
        if kt == 'O':
            kmode = r.choice(['int', 'str', 'bytes', 'float', 'num', 'tuple', 'none', 'str', 'int'])
        if mapping and vt == 'O':
            vmode = r.choice(['int', 'str', 'shared', 'pm', 'wref', 'mixed', 'float', 'int', 'pm'])
            self.shared = [(r.randrange(3),), [1, 2], 'sh', 2**80]
        if proto < 3 and (kmode == 'bytes' or vmode in ('pm', 'wref', 'mixed') or fam == 'fs'):
            proto = 3
        def key():
            if kt == 'O': return self.okey(kmode)
            if kt == 'f': return bytes([r.choice([0, 1, 255]), r.randrange(8)])
            return self.int_key(kt)
        def val():
            if not mapping: return None
            if vt == 'O': return self.oval(vmode)
            return self.nval('s' if fam == 'fs' else vt)
        def srt(items):
            try:
                s = sorted(items, key=lambda kv: (kv[0] is not None, kv[0] if kv[0] is not None else 0))
                out = []
                for k, v in s:
                    if out and ((k is None and out[-1][0] is None) or (k is not None and out[-1][0] is not None and k == out[-1][0])):
                        continue
                    out.append((k, v))
                return out
            except TypeError:
                return None
        n = r.choice([0, 1, 2, 3, 4, 6, 10, 20, 40, 300])
        old = None
        for _ in range(5):
            old = srt([(key(), val()) for _ in range(n)])
            if old is not None: break
        if old is None: old = []
        def change(items):
            items = list(items)
            for _ in range(r.choice([0, 1, 1, 2, 3, 6])):
                op = r.random()
                if op < 0.3:
                    k = key(); new = srt(items + [(k, val())])
                    if new is not None and len(new) > len(items): items = new
                elif op < 0.45:
                    k = key(); new = srt(items + [(k, val())])
                    if new is not None and len(new) > len(items) and (not items or new[0][0] is k or new[-1][0] is k): items = new
                elif op < 0.6 and items: del items[r.randrange(len(items))]
                elif op < 0.68 and items: del items[r.choice([0, -1])]
                elif items:
                    i = r.randrange(len(items)); items[i] = (items[i][0], val())
            if r.random() < 0.04: items = []
            return items
        com, new = change(old), change(old)
        if r.random() < 0.02:  # unsorted / duplicate keys, as a hostile client may send
            com = list(com) + list(old[:1])
        def flat(items):
            return tuple(x for kv in items for x in kv) if mapping else tuple(k for k, _ in items)
        nexts = [None] * 3
        if kind in ('Bucket', 'Set') and r.random() < 0.4:
            proto = 3
            nb = self.objs[('next', fam, kind)]
            nexts = [nb[0]] * 3
            if r.random() < 0.15:
                nexts[r.randrange(3)] = r.choice([None, nb[1]])
        states = []
        for items, nx in zip([old, com, new], nexts):
            bs = (flat(items), nx) if nx is not None else (flat(items),)
            if kind in ('BTree', 'TreeSet'):
                bs = None if (not items and r.random() < 0.6) else ((bs,),)
            states.append(bs)
        klass = getattr(mod, fam + kind)
        obj = self.objs[(fam, kind)]
        recs = []
        zser._protocol = proto
        renc = r.random() < self.renc
        if renc: proto = -1
        try:
            for st in states:
                if st is None: obj.__setstate__(None) if kind in ('BTree', 'TreeSet') else obj.__setstate__(((),))
                else: obj.__setstate__(st)
                if renc: recs.append(renc_record(r, obj, klass, obj.__getstate__()))
                else: recs.append(zser.ObjectWriter(obj).serialize(obj))
        except Exception as e:
            zser._protocol = 3
            return None
        zser._protocol = 3
        return self.finish('%s%s' % (fam, kind), proto, recs, kmode, vmode)

    def length_case(self, proto):
        r = self.r
        obj = self.objs['len']; recs = []
        zser._protocol = proto
        renc = r.random() < self.renc
        if renc: proto = -1
        for _ in range(3):
            obj.__setstate__(r.choice([r.randrange(-10**6, 10**6), 2**63 - 1, -2**63, 2**64, True, 0, 2**31, -2**31 - 1]))
            if renc: recs.append(renc_record(r, obj, Length, obj.__getstate__()))
            else: recs.append(zser.ObjectWriter(obj).serialize(obj))
        zser._protocol = 3
        return self.finish('Length', proto, recs, None, None)

    def finish(self, cls, proto, recs, kmode, vmode):
        r = self.r
        z = [False] * 3
        for i in range(3):
            if r.random() < 0.08:
                recs[i] = b'.z' + zlib.compress(recs[i]); z[i] = True
        st = Store(); st.recs = {b'old': recs[0], b'com': recs[1]}
        out = {'class': cls, 'proto': proto, 'kmode': kmode, 'vmode': vmode, 'z': any(z),
               'old': recs[0].hex(), 'committed': recs[1].hex(), 'new': recs[2].hex()}
        try:
            want = tryToResolveConflict(st, b'\0' * 8, b'com', b'old', recs[2])
            out['want'] = want.hex()
        except ConflictError:
            k, v = reason_of(recs[0], recs[1], recs[2])
            out['pyfail'] = '%s %s' % (k, v)
        return out

def setup():
    db = ZODB.DB(MappingStorage()); conn = db.open(); root = conn.root()
    objs = {'pm': [PersistentMapping() for _ in range(3)], 'len': Length()}
    for fam in FAMS:
        mod = __import__('BTrees.%sBTree' % fam, fromlist=['x'])
        for kind in ('Bucket', 'Set', 'BTree', 'TreeSet'):
            objs[(fam, kind)] = getattr(mod, fam + kind)()
        for kind in ('Bucket', 'Set'):
            objs[('next', fam, kind)] = [getattr(mod, fam + kind)() for _ in range(2)]
    i = 0
    for k, v in list(objs.items()):
        for o in (v if isinstance(v, list) else [v]):
            root[i] = o; i += 1
    transaction.commit()
    return conn, objs

class Mark:
    def __init__(self, d): self.d = d

def canon(x):
    t = type(x)
    if t is tuple or t is list: return (t.__name__, tuple(canon(i) for i in x))
    if t is dict: return ('dict', tuple(sorted((repr(canon(k)), repr(canon(v))) for k, v in x.items())))
    if t is float: return ('float', x.hex())
    if t is Mark: return ('ref', canon(x.d))
    if isinstance(x, type): return ('class', x.__module__, x.__qualname__)
    return (t.__name__, x)

def load(rec):
    u = PersistentUnpickler(find_global, Mark, io.BytesIO(rec))
    meta = u.load()
    if isinstance(meta, tuple) and len(meta) == 2 and not meta[1]:
        meta = meta[0]  # (klass, None) and klass are the same class pickle for ZODB
    return canon(meta), canon(u.load())

def main():
    if sys.argv[1] == 'gen':
        seed, n = int(sys.argv[2]), int(sys.argv[3])
        conn, objs = setup()
        g = Gen(seed, conn, objs)
        if len(sys.argv) > 4: g.renc = float(sys.argv[4])
        made = 0
        while made < n:
            c = g.case()
            if c is None: continue
            sys.stdout.write(json.dumps(c) + '\n'); made += 1
        return 0
    bad = 0; n = 0
    for line in sys.stdin:
        c = json.loads(line); n += 1
        want = load(bytes.fromhex(c['want']))
        try: got = load(bytes.fromhex(c['got']))
        except Exception as e: got = 'unpickling fails: %r' % e
        if got != want:
            bad += 1
            if bad <= 10: print('case %d (%s): want %r\n  got %r' % (c['i'], c.get('class'), want, got))
    print('checked %d; %d differ' % (n, bad))
    return 1 if bad else 0

if __name__ == '__main__':
    sys.exit(main())
`
