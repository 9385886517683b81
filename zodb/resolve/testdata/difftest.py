"""Differential test of zodb/resolve against BTrees' own _p_resolveConflict.

  difftest.py gen SEED N [KIND]
                           print N random cases as JSON lines; KIND:
                           Bucket, Set, BTree, TreeSet or Length (default:
                           any)
  difftest.py check        read JSON lines {"i", "want", "got"} (hex records)
                           and report those whose states differ

gen makes, for a random class (Length, or a bucket, set, BTree or TreeSet
of a random BTrees family), a random old state and two random changes of it
(committed and new; overlapping inserts, deletes and value changes, _next
changes, emptied buckets, trees of several buckets, keys and values of the
wrong type...), pickles the three as ZODB records (class pickle and state
pickle by one pickler, persistent references as ZODB writes them, some
compressed as zc.zlibstorage does), and resolves them as ZODB's
tryToResolveConflict does (with ZODB's PersistentReferenceFactory and
find_global, and the C classes of BTrees). Each line holds the records and
the outcome: the resolved record ("want"), or the BTreesConflictError
reason, or the name of another exception. "mayraise" marks cases where a
comparison may raise in Python, so that the error BTrees reports may be a
conflict reason that masks it.

check unpickles each pair of records with markers for persistent references
and classes and compares them type-exactly (1, 1.0 and True differ).
"""

import io
import json
import random
import sys
import zlib

import zodbpickle.pickle
from ZODB.ConflictResolution import PersistentReferenceFactory
from ZODB.ConflictResolution import find_global
from ZODB.ConflictResolution import persistent_id as cr_persistent_id
from ZODB.POSException import BTreesConflictError
from ZODB._compat import PersistentPickler
from ZODB._compat import PersistentUnpickler


FAMILIES = ['IF', 'II', 'IO', 'IU', 'LF', 'LL', 'LO', 'LQ', 'OI', 'OL', 'OO',
            'OQ', 'OU', 'QF', 'QL', 'QO', 'QQ', 'UF', 'UI', 'UO', 'UU', 'fs']
KINDS = ['Bucket', 'Set', 'BTree', 'TreeSet']


class Ref:
    """A persistent reference to pickle: its persistent id is data."""

    def __init__(self, data):
        self.data = data


def ref_pid(obj):
    if isinstance(obj, Ref):
        return obj.data
    return None


def record(klass, state):
    f = io.BytesIO()
    p = zodbpickle.pickle.Pickler(f, 3)
    p.persistent_id = ref_pid
    p.dump(klass)
    p.dump(state)
    return f.getvalue()


def py_resolve(old, com, new):
    """ZODB's tryToResolveConflict, minus the storage: the resolved record,
    or the exception."""
    prf = PersistentReferenceFactory()
    up = PersistentUnpickler(find_global, prf.persistent_load,
                             io.BytesIO(new))
    meta = up.load()
    klass = meta[0] if isinstance(meta, tuple) else meta
    newstate = up.load()

    def state(p):
        u = PersistentUnpickler(find_global, prf.persistent_load,
                                io.BytesIO(p))
        u.load()
        return u.load()
    oldstate = state(old)
    comstate = state(com)
    inst = klass.__new__(klass)
    resolved = inst._p_resolveConflict(oldstate, comstate, newstate)
    f = io.BytesIO()
    p = PersistentPickler(cr_persistent_id, f, 3)
    p.dump(meta)
    p.dump(resolved)
    return f.getvalue()


class Gen:
    def __init__(self, rnd):
        self.r = rnd
        self.mayraise = False

    # -- keys and values -------------------------------------------------

    def int_domain(self, t):
        r = self.r
        lo, hi = {'I': (-2**31, 2**31 - 1), 'L': (-2**63, 2**63 - 1),
                  'U': (0, 2**32 - 1), 'Q': (0, 2**64 - 1)}[t]
        base = [lo, hi, 0, 1, lo + 1, hi - 1] if r.random() < 0.3 else []
        span = r.choice([20, 40, 1000])
        start = r.choice([0, lo, hi - span, max(lo, -span // 2)])
        return base + [min(max(lo, start + i), hi) for i in range(span)]

    def obj_keys(self, mode):
        r = self.r
        if mode == 'int':
            return list(range(-5, 30))
        if mode == 'bigint':
            return [2**64 + i for i in range(20)] + [-2**70 - i for i in range(5)] + list(range(5))
        if mode == 'str':
            return [r.choice('abcdefgh') + r.choice(['', 'x', 'yz', '\xe9', '\u20ac', '\U0001f600'])
                    for _ in range(30)] + ['', 'a', 'b']
        if mode == 'bytes':
            return [bytes([r.randrange(256) for _ in range(r.randrange(3))]) for _ in range(30)]
        if mode == 'float':
            return [r.choice([0.5, -1.25, 1e300, -0.0, 3.0, float('inf'), float('-inf')]) + i for i in range(20)]
        if mode == 'intfloat':
            return list(range(15)) + [i + 0.5 for i in range(15)] + [2**53 + 1, float(2**53)]
        if mode == 'tuple':
            return [(r.choice('abc'), r.randrange(5)) for _ in range(30)] + [('a',), ('b', 1, 2)]
        if mode == 'none':
            return [None] + list(range(20))
        if mode == 'boolint':
            return [True, False] + list(range(2, 20))
        raise ValueError(mode)

    def dedupe_sorted(self, keys):
        """Keys sorted as BTrees does (None first), one per equal value."""
        out = []
        nones = [k for k in keys if k is None]
        rest = sorted(k for k in keys if k is not None)
        for k in rest:
            if out and out[-1] == k:
                continue
            out.append(k)
        return nones[:1] + out

    def ref(self, oid=None):
        r = self.r
        if oid is None:
            oid = bytes([0] * 6 + [r.randrange(3), r.randrange(256)])
        from persistent.mapping import PersistentMapping
        from BTrees.OOBTree import OOBTree
        form = r.randrange(7)
        if form == 0:
            return Ref(oid)
        if form == 1:
            return Ref(['w', (oid,)])
        if form == 2:
            return Ref(['m', ('other', oid, PersistentMapping)])
        if form == 3:
            return Ref(['n', ('other', oid)])
        return Ref((oid, r.choice([PersistentMapping, OOBTree])))

    def obj_value(self, mode):
        r = self.r
        if mode == 'int':
            return r.randrange(5)
        if mode == 'str':
            return r.choice(['x', 'y', 'z', '\xe9t\xe9'])
        if mode == 'tuple':
            return (r.randrange(3), r.choice(['a', 'b']), r.choice([None, 1.5, b'q']))
        if mode == 'list':
            return [r.randrange(3), [r.randrange(2)]]
        if mode == 'ref':
            return self.ref(bytes([0] * 7 + [r.randrange(4)]))
        if mode == 'none':
            return r.choice([None, 1, 2])
        if mode == 'float':
            return r.choice([0.5, 1.0, 1, -0.0, 0.0, 2, True])
        if mode == 'bigint':
            return r.choice([2**65, -2**65, 2**65 + 1, 1, 0])
        if mode == 'mixed':
            return r.choice([1, 'a', None, (1,), [1], b'a', 1.5, self.ref(), 2**70, {'a': 1}])
        if mode == 'dict':
            return {'a': r.randrange(2)}
        raise ValueError(mode)

    def native_value(self, t):
        r = self.r
        if t == 'F':
            return r.choice([0.1, 0.5, 1.0, 3, 1e10, -2.5, 0.3, 1 / 3.0])
        if t == 's':
            return bytes([r.randrange(3)] * 6)
        lo, hi = {'I': (-2**31, 2**31 - 1), 'L': (-2**63, 2**63 - 1),
                  'U': (0, 2**32 - 1), 'Q': (0, 2**64 - 1)}[t]
        return r.choice([lo, hi, 0, 1, 2, 3, True])

    # -- cases -----------------------------------------------------------

    def length_case(self):
        r = self.r

        def v():
            x = r.random()
            if x < 0.1:
                return r.choice([2**70, -2**63, 2**63 - 1, 2**64])
            if x < 0.15:
                return r.choice([True, False])
            if x < 0.17:
                self.mayraise = True
                return None
            return r.randrange(-1000, 1000)
        from BTrees.Length import Length
        return Length, v(), v(), v()

    def bucket_case(self, fam, kind):
        r = self.r
        mod = __import__('BTrees.%sBTree' % fam, fromlist=['x'])
        klass = getattr(mod, fam + kind)
        bucket_class = getattr(mod, fam + ('Set' if kind in ('Set', 'TreeSet') else 'Bucket'))
        mapping = kind in ('Bucket', 'BTree')
        kt, vt = fam[0], fam[1]

        if kt == 'O':
            kmode = r.choice(['int', 'str', 'bytes', 'float', 'intfloat', 'tuple',
                              'none', 'bigint', 'boolint', 'str', 'int'])
            domain = self.obj_keys(kmode)
        elif kt == 'f':
            domain = [bytes([a, b]) for a in (0, 1, 255) for b in range(12)]
        else:
            domain = self.int_domain(kt)
        vmode = None
        if mapping and vt == 'O':
            vmode = r.choice(['int', 'str', 'tuple', 'list', 'ref', 'ref', 'none',
                              'float', 'bigint', 'mixed', 'dict', 'int'])
            if vmode in ('mixed', 'dict', 'none', 'float', 'list', 'tuple', 'ref'):
                self.mayraise = True

        def value():
            if not mapping:
                return None
            if vt == 'O':
                return self.obj_value(vmode)
            return self.native_value('s' if fam == 'fs' else vt)

        n = r.choice([0, 1, 2, 3, 5, 8, 12, 12, 30])
        keys = self.dedupe_sorted(r.sample(domain, min(n, len(domain))))
        old = [(k, value()) for k in keys]

        def has(items, k):
            return any(k == kk if (k is not None and kk is not None) else k is kk
                       for kk, _ in items)

        def change(items):
            items = list(items)
            for _ in range(r.choice([0, 1, 1, 2, 3, 5])):
                op = r.random()
                if op < 0.35:  # insert
                    k = r.choice(domain)
                    if has(items, k):
                        continue
                    items.append((k, value()))
                    items.sort(key=lambda kv: (kv[0] is not None, kv[0] if kv[0] is not None else 0))
                elif op < 0.6 and items:  # delete
                    del items[r.randrange(len(items))]
                elif items:  # change a value
                    i = r.randrange(len(items))
                    items[i] = (items[i][0], value())
            if r.random() < 0.03:
                items = []
            return items

        com = change(old)
        new = change(old)

        # hostile keys/values for native families
        if kt in 'ILUQ' and r.random() < 0.03:
            self.mayraise = True
            bad = r.choice(['a', 2**64 + 5, -2**64, 1.5, None])
            (com if r.random() < 0.5 else new).append((bad, value()))

        def flat(items):
            if mapping:
                return tuple(x for kv in items for x in kv)
            return tuple(k for k, _ in items)

        next_ref = None
        if kind in ('Bucket', 'Set') and r.random() < 0.4:
            next_ref = Ref((b'\0' * 7 + b'\x99', bucket_class))

        def bstate(items, nxt):
            if nxt is not None:
                return (flat(items), nxt)
            return (flat(items),)

        nexts = [next_ref, next_ref, next_ref]
        if r.random() < 0.1:
            i = r.randrange(3)
            nexts[i] = r.choice([None, Ref(b'\0' * 7 + b'\x99'),
                                 Ref((b'\0' * 7 + b'\x98', bucket_class)),
                                 Ref((b'\0' * 7 + b'\x99', bucket_class))])

        states = [bstate(old, nexts[0]), bstate(com, nexts[1]), bstate(new, nexts[2])]
        if kind in ('BTree', 'TreeSet'):
            def tstate(st, items):
                if not items and r.random() < 0.7:
                    return None
                return ((st,),)
            states = [tstate(s, it) for s, it in zip(states, [old, com, new])]
            if r.random() < 0.05:
                i = r.randrange(3)
                states[i] = ((Ref(b'\0' * 7 + b'\x91'), 5, Ref(b'\0' * 7 + b'\x92')),
                             Ref(b'\0' * 7 + b'\x91'))
        elif r.random() < 0.03:
            states[0] = None
        return klass, states[0], states[1], states[2]

    def case(self, kind=None):
        r = self.r
        self.mayraise = False
        if kind == 'Length' or (kind is None and r.random() < 0.08):
            klass, so, sc, sn = self.length_case()
        else:
            fam = r.choice(FAMILIES)
            kind = kind or r.choice(KINDS)
            klass, so, sc, sn = self.bucket_case(fam, kind)
        recs = [record(klass, s) for s in (so, sc, sn)]
        out = {'class': '%s.%s' % (klass.__module__, klass.__name__),
               'mayraise': self.mayraise}
        try:
            want = py_resolve(*recs)
            out['want'] = want.hex()
        except BTreesConflictError as e:
            out['reason'] = e.reason
        except Exception as e:  # noqa: B902 any other refusal
            out['exc'] = type(e).__name__
        for i in range(3):
            if r.random() < 0.05:
                recs[i] = b'.z' + zlib.compress(recs[i])
        out['old'], out['committed'], out['new'] = [x.hex() for x in recs]
        return out


class PRMark:
    def __init__(self, ref):
        self.ref = ref


def canon(x):
    t = type(x)
    if t is tuple or t is list:
        return (t.__name__, tuple(canon(i) for i in x))
    if t is dict:
        return ('dict', tuple(sorted((repr(canon(k)), repr(canon(v))) for k, v in x.items())))
    if t is float:
        return ('float', x.hex())
    if t is PRMark:
        return ('ref', canon(x.ref))
    if t is type:
        return ('class', x.__module__, x.__qualname__)
    return (t.__name__, x)


def load(rec):
    u = PersistentUnpickler(find_global, PRMark, io.BytesIO(rec))
    meta = u.load()
    return canon(meta), canon(u.load())


def main():
    if sys.argv[1] == 'gen':
        seed, n = int(sys.argv[2]), int(sys.argv[3])
        kind = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != 'any' else None
        g = Gen(random.Random(seed))
        out = sys.stdout
        for _ in range(n):
            out.write(json.dumps(g.case(kind)) + '\n')
        return 0
    if sys.argv[1] == 'check':
        bad = 0
        for line in sys.stdin:
            c = json.loads(line)
            want = load(bytes.fromhex(c['want']))
            try:
                got = load(bytes.fromhex(c['got']))
            except Exception as e:  # noqa: B902
                got = 'unpickling fails: %r' % e
            if got != want:
                bad += 1
                if bad <= 10:
                    print('case %d: want %r\n  got %r' % (c['i'], want, got))
        print('checked; %d differ' % bad)
        return 1 if bad else 0
    raise SystemExit(__doc__)


if __name__ == '__main__':
    sys.exit(main())
