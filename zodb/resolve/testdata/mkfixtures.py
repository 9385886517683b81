"""Make fixtures.json: real conflicts of ZODB, with their records.

Run with the venv's Python from this directory:

    ../../../.venv/bin/python mkfixtures.py > fixtures.json

Each fixture is a conflict made by two connections of one database (a
FileStorage, or a FileStorage under zc.zlibstorage): the records old,
committed and new that ZODB's FileStorage hands to tryToResolveConflict
(captured by wrapping it), and what that gives: the resolved record, or
"refused" with the BTreesConflictError reason (computed by calling the
class's _p_resolveConflict on the states, as tryToResolveConflict does), or
"unresolvable" for a class without _p_resolveConflict.
"""

import io
import json
import os
import shutil
import sys
import tempfile

import transaction
import ZODB
import ZODB.FileStorage
from BTrees.IIBTree import IIBTree
from BTrees.IOBTree import IOBTree
from BTrees.Length import Length
from BTrees.LOBTree import LOBTree
from BTrees.OIBTree import OITreeSet
from BTrees.OOBTree import OOBTree
from BTrees.OOBTree import OOSet
from BTrees.QQBTree import QQBTree
from BTrees.fsBTree import fsBTree
from persistent.mapping import PersistentMapping
from ZODB.ConflictResolution import PersistentReferenceFactory
from ZODB.ConflictResolution import find_global
from ZODB.POSException import BTreesConflictError
from ZODB.POSException import ConflictError
from ZODB._compat import PersistentUnpickler


def states(old, com, new):
    prf = PersistentReferenceFactory()
    out = []
    for p in (old, com, new):
        if p[:2] == b'.z':
            import zlib
            p = zlib.decompress(p[2:])
        u = PersistentUnpickler(find_global, prf.persistent_load, io.BytesIO(p))
        meta = u.load()
        out.append(u.load())
    return meta, out


def conflict(name, setup, change1, change2, zlib=False):
    """setup(root) makes the object and returns it; change1/2(obj) change
    it in two concurrent transactions."""
    d = tempfile.mkdtemp()
    try:
        st = ZODB.FileStorage.FileStorage(os.path.join(d, 'Data.fs'))
        if zlib:
            import zc.zlibstorage
            st = zc.zlibstorage.ZlibStorage(st)
        db = ZODB.DB(st)
        fs = st.base if zlib else st
        seen = []
        orig = fs.tryToResolveConflict

        def capture(oid, committedSerial, oldSerial, newpickle, committedData=b''):
            old = fs.loadSerial(oid, oldSerial)
            com = committedData or fs.loadSerial(oid, committedSerial)
            rec = {'name': name, 'old': old.hex(), 'committed': com.hex(),
                   'new': newpickle.hex()}
            seen.append(rec)
            try:
                res = orig(oid, committedSerial, oldSerial, newpickle, committedData)
            except ConflictError:
                meta, (so, sc, sn) = states(old, com, newpickle)
                klass = meta[0] if isinstance(meta, tuple) else meta
                try:
                    klass.__new__(klass)._p_resolveConflict(so, sc, sn)
                except BTreesConflictError as e:
                    rec['refused'] = e.reason
                except AttributeError:
                    rec['unresolvable'] = True
                raise
            if res[:2] == b'.z':
                import zlib as z
                res = z.decompress(res[2:])
            rec['resolved'] = res.hex()
            return res
        fs.tryToResolveConflict = capture

        tm1 = transaction.TransactionManager()
        tm2 = transaction.TransactionManager()
        c1 = db.open(tm1)
        obj = setup(c1.root())
        tm1.commit()
        c2 = db.open(tm2)
        obj2 = c2.get(obj._p_oid)
        change1(obj)
        tm1.commit()
        change2(obj2)
        try:
            tm2.commit()
        except ConflictError:
            tm2.abort()
        db.close()
        assert seen, name
        return seen
    finally:
        shutil.rmtree(d)


def main():
    out = []

    def add(*a, **kw):
        out.extend(conflict(*a, **kw))

    def mk(cls, items):
        def setup(root):
            root['x'] = o = cls()
            o.update(items)
            return o
        return setup

    def length(root):
        root['x'] = o = Length(10)
        return o
    add('length', length, lambda o: o.change(5), lambda o: o.change(-3))
    add('length-big', length, lambda o: o.set(2**70), lambda o: o.change(1))
    add('oobtree-inline', mk(OOBTree, {'a': 1, 'b': (1, 2.5), 'c': 'x'}),
        lambda o: o.__setitem__('d', 4), lambda o: o.__setitem__('b', 'changed'))
    add('oobtree-inline-refused', mk(OOBTree, {'a': 1, 'b': 2}),
        lambda o: o.__setitem__('c', 3), lambda o: o.__setitem__('c', 3))
    add('oobtree-inline-delete-first', mk(OOBTree, {'a': 1, 'b': 2, 'c': 3}),
        lambda o: o.__setitem__('d', 4), lambda o: o.__delitem__('a'))

    def persistent_values(root):
        root['x'] = o = IOBTree()
        for i in range(5):
            o[i] = PersistentMapping()
        return o
    add('iobtree-refs', persistent_values,
        lambda o: o.__setitem__(10, PersistentMapping()),
        lambda o: o.__delitem__(3))

    def big(root):
        root['x'] = o = OOBTree()
        for i in range(100):
            o['k%03d' % i] = i
        return o

    def bucket_of(o):
        b = o._firstbucket._next  # a bucket with a _next
        return b
    # Conflicts in one bucket of a big tree: the bucket records conflict.
    add('oobucket', big,
        lambda o: o.__setitem__('k040x', 'a'),
        lambda o: o.__setitem__('k041', 'b'))
    add('oobucket-zlib', big,
        lambda o: o.__setitem__('k040x', 'a'),
        lambda o: o.__setitem__('k041', 'b'), zlib=True)
    add('iibtree', mk(IIBTree, {1: 2, 3: 4, 5: 6}),
        lambda o: o.__setitem__(7, 8), lambda o: o.__setitem__(3, -1))
    add('lobtree', mk(LOBTree, {2**40: 'a', -5: 'b'}),
        lambda o: o.__setitem__(2**41, 'c'), lambda o: o.__setitem__(-5, 'd'))
    add('qqbtree', mk(QQBTree, {2**63 + 5: 2**64 - 1, 1: 2}),
        lambda o: o.__setitem__(2**63, 3), lambda o: o.__setitem__(1, 2**63))
    add('fsbtree', mk(fsBTree, {b'ab': b'123456', b'cd': b'abcdef'}),
        lambda o: o.__setitem__(b'ef', b'xxxxxx'), lambda o: o.__setitem__(b'ab', b'yyyyyy'))
    add('oiset-tree', mk(OITreeSet, ['a', 'b', 'c']),
        lambda o: o.add('d'), lambda o: o.remove('b'))

    def ooset(root):
        root['x'] = t = OOBTree()
        t['s'] = o = OOSet(['a', 'b', 'c'])
        return o
    add('ooset', ooset, lambda o: o.add('0'), lambda o: o.add('z'))
    from BTrees.OOBTree import OOBucket

    def bucket30(root):
        root['x'] = o = OOBucket()
        for i in range(30):
            o['key%02d' % i] = 'value%d' % i
        return o
    add('oobucket-30', bucket30,
        lambda o: o.__setitem__('key05', 'changed'),
        lambda o: o.__setitem__('key25', 'changed too'))
    add('persistentmapping', mk(PersistentMapping, {'a': 1}),
        lambda o: o.__setitem__('b', 1), lambda o: o.__setitem__('c', 1))
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write('\n')


if __name__ == '__main__':
    main()
