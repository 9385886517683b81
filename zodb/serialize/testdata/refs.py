"""Reference answers of ZODB/py's referencesf for the Go tests of
zodb/serialize (references_test.go). Run with the project's venv python.

    refs.py corpus   print, as JSON, a list of hex object records made with
                     zodbpickle: every form of persistent reference ZODB
                     writes or reads (oid, (oid, class), weak and
                     cross-database references, protocol 1 and 3, memo
                     shared between the class and the state pickle)
    refs.py refs     read hex records from stdin, one per line; for each,
                     print one JSON line: {"refs": [hex oid, ...]} or
                     {"err": "ExceptionName: message"}, or {"skip": true}
                     for a record with a PUT of a memo index above 2**16
                     (zodbpickle allocates, and later frees, a memo array of
                     twice that many entries, which takes seconds; mutated
                     records have such indexes)
"""
import io
import json
import pickletools
import random
import sys

import zodbpickle.pickle as zpickle
from ZODB.serialize import referencesf


class Ref:
    """A stand-in object whose persistent id is pid."""

    def __init__(self, pid):
        self.pid = pid


class Klass:
    pass


class Other:
    pass


def record(meta, state, protocol=3):
    f = io.BytesIO()
    p = zpickle.Pickler(f, protocol)

    def persistent_id(obj):
        if isinstance(obj, Ref):
            return obj.pid
        return None
    p.persistent_id = persistent_id
    p.dump(meta)
    p.dump(state)
    return f.getvalue()


def oid(n):
    return n.to_bytes(8, 'big')


def corpus():
    out = []
    for proto in (1, 2, 3):
        meta = (Klass, None)
        out.append(record(meta, {'a': Ref(oid(1))}, proto))
        out.append(record(meta, {'a': Ref((oid(2), Klass))}, proto))
        out.append(record(meta, {'a': Ref((oid(3), None))}, proto))
        out.append(record(Klass, [Ref((oid(4), Klass)), Ref((oid(5), Klass)),
                                  Ref((oid(4), Klass))], proto))
        out.append(record(meta, {'w': Ref(['w', (oid(6),)]),
                                 'w2': Ref(['w', (oid(7), 'db2')]),
                                 'm': Ref(['m', ('db2', oid(8), Klass)]),
                                 'n': Ref(['n', ('db2', oid(9))]),
                                 'x': Ref(oid(10))}, proto))
        out.append(record(meta, (Ref(oid(11)), {'k': [Ref(oid(12)), 1, 2.5]},
                                 {Ref(oid(13))}), proto))
        # The same class everywhere: GLOBAL memoized by the class pickle
        # and fetched by the state pickle.
        out.append(record(Klass, {'kids': [Ref((oid(i), Klass))
                                           for i in range(20, 30)]}, proto))
        out.append(record(meta, {'o': Other(), 'r': Ref(oid(31))}, proto))
        out.append(record(meta, None, proto))
        out.append(record(meta, {'big': b'x' * 300, 'r': Ref(oid(1 << 60))},
                          proto))
        # oids that are not 8 bytes, and persistent ids of other types
        out.append(record(meta, Ref(b'abc'), proto))
        out.append(record(meta, Ref(42), proto))
        out.append(record(meta, Ref(()), proto))
        out.append(record(meta, Ref((42, None)), proto))
        out.append(record(meta, Ref('text-oid'), proto))
        out.append(record(meta, Ref({'a': 1}), proto))
    # Python 2 style: protocol 1, oids as SHORT_BINSTRING (str); one ASCII,
    # one not.
    for raw in (b'\0\0\0\0\0\0\0\x07', b'\0\0\0\0\0\0\0\x99'):
        out.append(b'(c__main__\nKlass\nq\x01Nt.}q\x02U\x01aU\x08' + raw +
                   b'q\x03h\x01\x86Qs.')
    # PERSID (text persistent id) and protocol 0
    out.append(b'c__main__\nKlass\n.(dp0\nS\'a\'\nP00000001\nsPabcdefgh\n.')
    out.append(record((Klass, None), {'a': Ref(oid(1)), 'b': [1, 2, 3]}, 0))
    # Random nested states: containers, shared (memoized) parts, instances
    # of plain classes (REDUCE/NEWOBJ/BUILD), references of every form.
    rng = random.Random(1)
    for _ in range(400):
        shared = []
        state = rand_value(rng, 4, shared)
        out.append(record(rng.choice([(Klass, None), Klass]), state,
                          rng.choice((1, 2, 3, 3, 3))))
    return [r.hex() for r in out]


class WithState:
    def __init__(self, state):
        self.__dict__.update(state)


class Reduced:
    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return (Reduced, self.args)


class MyList(list):
    pass


class MyDict(dict):
    pass


def rand_ref(rng):
    o = oid(rng.randrange(1 << rng.choice((8, 16, 64))))
    return Ref(rng.choice([
        o, (o, Klass), (o, None), o, (o, Klass),
        ['w', (o,)], ['m', ('db2', o, Klass)], ['n', ('db2', o)]]))


def rand_value(rng, depth, shared):
    if shared and rng.random() < 0.1:
        return rng.choice(shared)
    r = rng.random()
    if depth <= 0 or r < 0.35:
        v = rng.choice([
            None, True, False, rng.randrange(-1 << 40, 1 << 40),
            rng.randrange(256), 1 << 70, 1.5, 'text', 'caf\xe9',
            b'\x00\x01' * rng.randrange(3), b'x' * rng.randrange(300),
            rand_ref(rng), rand_ref(rng)])
    else:
        kids = [rand_value(rng, depth - 1, shared)
                for _ in range(rng.randrange(5))]
        kind = rng.randrange(8)
        if kind == 0:
            v = kids
        elif kind == 1:
            v = tuple(kids)
        elif kind == 2:
            v = {('k%d' % i): k for i, k in enumerate(kids)}
        elif kind == 3:
            v = WithState({('a%d' % i): k for i, k in enumerate(kids)})
        elif kind == 4:
            v = Reduced(*kids)
        elif kind == 5:
            v = MyList(kids)
        elif kind == 6:
            v = MyDict({i: k for i, k in enumerate(kids)})
        else:
            v = {i: k for i, k in enumerate(kids)}
    if rng.random() < 0.3:
        shared.append(v)
    return v


def huge_memo(data):
    f = io.BytesIO(data)
    try:
        for _ in range(2):
            for op, arg, _ in pickletools.genops(f):
                if op.name in ('PUT', 'LONG_BINPUT') and int(arg) > 1 << 16:
                    return True
    except Exception:
        pass
    return False


def refs():
    for line in sys.stdin:
        data = bytes.fromhex(line.strip())
        if huge_memo(data):
            sys.stdout.write('{"skip": true}\n')
            continue
        try:
            res = {'refs': [o.hex() for o in referencesf(data)]}
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            res = {'err': '%s: %s' % (type(e).__name__, e)}
        sys.stdout.write(json.dumps(res) + '\n')


if __name__ == '__main__':
    if sys.argv[1] == 'corpus':
        json.dump(corpus(), sys.stdout)
    elif sys.argv[1] == 'refs':
        refs()
    else:
        sys.exit('usage: refs.py corpus|refs')
