"""Random FileStorage histories made by ZODB/py, for the tests that check
zodbd's tools and copy against ZODB/py's on them (test_tools_random.py,
test_copy_random.py).

A history is a random list of steps (or the steps given), each one or more
transactions made through ZODB/py: new objects, modifications, BTrees with
many buckets, big records, blobs, undo and undoMultiple, undo of a
creation (records without data), records written through the storage API
(persistent, weak and cross-database references, several records of one
oid in a transaction, deleteObject), binary and unicode metadata and
extensions, empty transactions, rich object states and a pack at a mid
time.
"""
import json
import os
import subprocess
import sys

PY = sys.executable

GEN = r'''
import base64, io, json, random, sys, time
import transaction, ZODB, ZODB.FileStorage
import zodbpickle.pickle as zp
from persistent.mapping import PersistentMapping
from persistent.list import PersistentList
from BTrees.OOBTree import OOBTree
from BTrees.IOBTree import IOBTree
from BTrees.Length import Length
from ZODB.blob import Blob, BlobStorage
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import UndoError, POSKeyError, ConflictError
from ZODB.utils import p64, u64, z64
from ZODB.TimeStamp import TimeStamp
from persistent import Persistent
from persistent.wref import WeakRef
import collections, datetime, decimal

path, blobdir, seed, bigmib, wrapper = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == '1'
steps = json.loads(sys.argv[6]) if len(sys.argv) > 6 else None
rnd = random.Random(seed)
if blobdir and wrapper and seed % 2:
    # ZODB.blob.BlobStorage wrapping a plain FileStorage (the old way)
    fs = BlobStorage(blobdir, ZODB.FileStorage.FileStorage(path))
else:
    fs = ZODB.FileStorage.FileStorage(path, blob_dir=blobdir or None)
import ZODB.MappingStorage
databases = {}
db = ZODB.DB(fs, databases=databases, database_name='main')
ZODB.DB(ZODB.MappingStorage.MappingStorage(), databases=databases, database_name='other')
tm = transaction.TransactionManager()
c = db.open(tm)
root = c.root()
conn_objs = []     # keys of root holding connection objects
raw_oids = []      # oids written only through the storage API
raw_creates = []   # tids of transactions that only created one raw oid
packed = [False]

def rtext(n):
    alphabet = 'abc xyz\u00e9\u00fc\u4e2d\U0001f600\n\t"\'\\\x00\x7f\u200b\u0085'
    return ''.join(rnd.choice(alphabet) for _ in range(n))

def rbytes(n):
    return bytes(rnd.randrange(256) for _ in range(n)) if n < 4096 else rnd.randbytes(n)

def rmeta():
    k = rnd.random()
    if k < 0.3:
        return '', '', None
    if k < 0.6:
        return rtext(rnd.randint(0, 12)), rtext(rnd.randint(0, 30)), {rtext(3): rtext(4), 'n': rnd.randint(-5, 10**12)}
    ext = {'b': rbytes(rnd.randint(0, 8)), 'l': [1, 2.5, None, True], 't': (1, 'x'),
           rtext(2): {'nested': rbytes(3)}}
    if rnd.random() < 0.2:
        ext = {}
    return rbytes(rnd.randint(0, 20)), rbytes(rnd.randint(0, 40)), ext

def conn_meta():
    u, d, e = rmeta()
    t = tm.get()
    if isinstance(u, bytes):
        u, d = u.decode('latin-1'), d.decode('latin-1')
    t.user = u
    t.description = d
    for k, v in (e or {}).items():
        t.setExtendedInfo(k, v)

def commit():
    conn_meta()
    try:
        tm.commit()
    except (ConflictError, POSKeyError, UndoError):
        tm.abort()

class Ref:
    def __init__(self, ref):
        self.ref = ref

def raw_pickle(refs, size, cls=PersistentMapping):
    buf = io.BytesIO()
    p = zp.Pickler(buf, 3)
    p.persistent_id = lambda o: o.ref if isinstance(o, Ref) else None
    p.dump((cls, None))
    state = {'data': {'k%d' % i: Ref(r) for i, r in enumerate(refs)}}
    if size:
        state['pad'] = rbytes(size)
    p.dump(state)
    return buf.getvalue()

def some_ref():
    oids = raw_oids + [getattr(root[k], '_p_oid', None) for k in conn_objs]
    oids = [o for o in oids if o]
    oid = rnd.choice(oids) if oids and rnd.random() < 0.8 else p64(rnd.randint(0x900, 0x9ff))
    kind = rnd.randrange(6)
    if kind == 0:
        return oid
    if kind == 1:
        return (oid, PersistentMapping)
    if kind == 2:
        return ['w', (oid,)]
    if kind == 3:
        return ['m', ('other', oid, PersistentMapping)]
    if kind == 4:
        return ['n', ('other', oid)]
    return (oid, None)

def raw_txn(stores, deletes=(), meta=None):
    u, d, e = meta or rmeta()
    if isinstance(u, str):
        u, d = u.encode('utf-8'), d.encode('utf-8')
    t = TransactionMetaData(u, d, e)
    if rnd.random() < 0.1:
        t = TransactionMetaData(u, d, rbytes(rnd.randint(1, 10)))  # garbage extension bytes
    fs.tpc_begin(t)
    try:
        for oid, data in stores:
            try:
                serial = fs.load(oid)[1]
            except (KeyError, POSKeyError):
                serial = z64
            fs.store(oid, serial, data, '', t)
        for oid in deletes:
            fs.deleteObject(oid, fs.load(oid)[1], t)
        fs.tpc_vote(t)
    except Exception:
        fs.tpc_abort(t)
        raise
    return fs.tpc_finish(t)

def op_new():
    for _ in range(rnd.randint(1, 4)):
        k = 'o%d' % len(conn_objs)
        kind = rnd.randrange(5)
        if kind == 0:
            o = PersistentMapping(a=rtext(5))
        elif kind == 1:
            o = PersistentList([rnd.randint(0, 9)] * rnd.randint(0, 5))
        elif kind == 2:
            o = OOBTree()
        elif kind == 3:
            o = Length(rnd.randint(0, 100))
        else:
            o = IOBTree()
        if conn_objs and rnd.random() < 0.5:
            tgt = root[rnd.choice(conn_objs)]
            if isinstance(tgt, PersistentMapping):
                tgt['ref' + k] = o
        root[k] = o
        conn_objs.append(k)
    commit()

def op_modify():
    for _ in range(rnd.randint(1, 3)):
        if not conn_objs:
            return
        o = root[rnd.choice(conn_objs)]
        try:
            if isinstance(o, PersistentMapping):
                o[rtext(2)] = rnd.randint(0, 10)
            elif isinstance(o, PersistentList):
                o.append(rtext(2))
            elif isinstance(o, Length):
                o.change(1)
            elif isinstance(o, OOBTree):
                o[rtext(3)] = rtext(3)
            elif isinstance(o, IOBTree):
                o[rnd.randint(0, 10**6)] = rtext(2)
        except (POSKeyError, KeyError):
            pass
    commit()

def op_btree():
    t = root.get('bt')
    if t is None:
        t = root['bt'] = OOBTree()
    n = rnd.choice([50, 300, 1500])
    for i in range(n):
        t['%08d' % rnd.randint(0, 10**7)] = PersistentMapping(i=i) if rnd.random() < 0.05 else i
    commit()
    if rnd.random() < 0.5:
        for k in list(t.keys())[:n // 3]:
            del t[k]
        commit()

def op_big():
    n = int(bigmib * (1 << 20)) if bigmib and rnd.random() < 0.5 else rnd.choice([70000, 200000])
    root['big%d' % rnd.randint(0, 3)] = rbytes(n)
    commit()

def op_blob():
    if not blobdir:
        return
    k = 'blob%d' % rnd.randint(0, 3)
    b = root.get(k)
    n = rnd.choice([0, 1, 100, 5000, 70000])
    if b is None:
        root[k] = Blob(rbytes(n))
    else:
        with b.open('w') as f:
            f.write(rbytes(n))
    commit()

def op_undo():
    log = db.undoLog(0, 30)
    if len(log) >= len(db.undoLog(0, 10**6)):
        log = log[:-1]  # never undo the root's creation
    if not log:
        return
    ids = [rnd.choice(log)['id'] for _ in range(rnd.choice([1, 1, 2, 3]))]
    ids = list(dict.fromkeys(ids))
    try:
        if len(ids) == 1:
            db.undo(ids[0], tm.get())
        else:
            db.undoMultiple(ids, tm.get())
        commit()
    except (UndoError, POSKeyError, ConflictError):
        tm.abort()

def op_undo_create():
    if not raw_creates:
        return
    tid = raw_creates.pop(rnd.randrange(len(raw_creates)))
    try:
        db.undo(base64.encodebytes(tid).rstrip(), tm.get())
        commit()
    except (UndoError, POSKeyError):
        tm.abort()

def op_raw_create():
    oid = fs.new_oid()
    raw_oids.append(oid)
    cls = rnd.choice([PersistentMapping, PersistentMapping, OOBTree, PersistentList])
    tid = raw_txn([(oid, raw_pickle([some_ref() for _ in range(rnd.randint(0, 4))],
                                    rnd.choice([0, 10, 3000]), cls))])
    raw_creates.append(tid)

def op_raw_modify():
    if not raw_oids:
        return
    oids = list(dict.fromkeys(rnd.choice(raw_oids) for _ in range(rnd.randint(1, 3))))
    stores = []
    for oid in oids:
        stores.append((oid, raw_pickle([some_ref() for _ in range(rnd.randint(0, 3))], 5)))
    raw_txn(stores)

def op_raw_multi():
    # Several records of one oid in one transaction.
    if not raw_oids:
        return
    oid = rnd.choice(raw_oids)
    u, d, e = rmeta()
    if isinstance(u, str):
        u, d = u.encode('utf-8'), d.encode('utf-8')
    t = TransactionMetaData(u, d, e)
    fs.tpc_begin(t)
    try:
        try:
            serial = fs.load(oid)[1]
        except (KeyError, POSKeyError):
            serial = z64
        for i in range(rnd.randint(2, 3)):
            fs.store(oid, serial, raw_pickle([some_ref()], i), '', t)
        fs.tpc_vote(t)
    except Exception:
        fs.tpc_abort(t)
        raise
    fs.tpc_finish(t)

def op_empty():
    raw_txn([])

def op_delete():
    live = []
    for oid in raw_oids:
        try:
            fs.load(oid)
            live.append(oid)
        except (KeyError, POSKeyError):
            pass
    if live:
        raw_txn([], [rnd.choice(live)])

class Plain(object):
    pass

class NewArgs(Persistent):
    def __getnewargs__(self):
        return (1,)
    def __new__(cls, *a):
        return Persistent.__new__(cls)

def rich_value(depth=0):
    objs = [root[k] for k in conn_objs if k in root]
    k = rnd.randrange(16)
    p = rnd.choice(objs) if objs else 1
    if depth > 2:
        return p
    if k == 0:
        return {rich_value(3), rich_value(3)} if objs else {1, 2}
    if k == 1:
        return frozenset([p, 5])
    if k == 2:
        return bytearray(rbytes(3))
    if k == 3:
        return complex(1, rnd.random())
    if k == 4:
        return datetime.datetime(2020, 1, 2, 3, 4, 5, rnd.randrange(10**6))
    if k == 5:
        return decimal.Decimal('1.%d' % rnd.randrange(100))
    if k == 6:
        return collections.OrderedDict([('a', p), ('b', rich_value(depth + 1))])
    if k == 7:
        o = Plain()
        o.x = p
        o.y = rich_value(depth + 1)
        return o
    if k == 8:
        return WeakRef(p) if objs else 1
    if k == 9:
        return (p, (p, [p, {'k': p}]))
    if k == 10:
        return {p: 1} if objs else {}
    if k == 11:
        return float(rnd.choice(['nan', 'inf', '-inf', '1e300', '-0.0']))
    if k == 12:
        return 2 ** rnd.randrange(60, 200) * rnd.choice([1, -1])
    if k == 13:
        return collections.defaultdict(list, {'a': [p]})
    if k == 14:
        return other_root() if rnd.random() < 0.5 else NewArgs()
    return rtext(rnd.randint(0, 5)).encode('utf-8')

_other = []
def other_root():
    if not _other:
        oc = c.get_connection('other')
        _other.append(oc.root())
    r = _other[0]
    o = PersistentMapping()
    r[rtext(3)] = o
    return o

def op_rich():
    for _ in range(rnd.randint(1, 3)):
        k = 'rich%d' % rnd.randrange(5)
        m = root.get(k)
        if m is None or not isinstance(m, PersistentMapping):
            m = root[k] = PersistentMapping()
            conn_objs.append(k)
        m[rtext(2)] = rich_value()
    commit()

def op_pack():
    if packed[0]:
        return
    tids = [t.tid for t in fs.iterator()]
    if len(tids) < 2:
        return
    tid = rnd.choice(tids[:-1])
    t = TimeStamp(tid).timeTime() + 1e-6
    try:
        db.pack(t)
        packed[0] = True
    except Exception as e:
        print('pack failed', type(e).__name__, e, file=sys.stderr)

OPS = {'new': (op_new, 6), 'modify': (op_modify, 6), 'btree': (op_btree, 2), 'big': (op_big, 1),
       'blob': (op_blob, 1), 'undo': (op_undo, 3), 'undo_create': (op_undo_create, 2),
       'raw_create': (op_raw_create, 3), 'raw_modify': (op_raw_modify, 2), 'raw_multi': (op_raw_multi, 1),
       'empty': (op_empty, 1), 'delete': (op_delete, 1), 'pack': (op_pack, 1), 'rich': (op_rich, 3)}
names = [n for n in OPS for _ in range(OPS[n][1])]
if steps is None:
    steps = [rnd.choice(names) for _ in range(rnd.randint(4, 30))]
done = []
for s in steps:
    try:
        OPS[s][0]()
        done.append(s)
    except Exception as e:
        tm.abort()
        done.append(s + '!')
        print('op', s, 'failed:', type(e).__name__, e, file=sys.stderr)
tm.abort()
db.close()
print(json.dumps(done))
'''


def build(d, seed, steps=None, blobs=True, bigmib=0.0, wrapper=False):
    """Makes d/Data.fs (and d/blobs with blobs) from seed, or from the
    steps given; bigmib, when not 0, is the size of half the big records
    (MiB); wrapper makes odd seeds write blobs through ZODB.blob's
    BlobStorage wrapper. Returns the path, the blob directory ('' without)
    and the steps done (a failed one with a '!')."""
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, 'Data.fs')
    bdir = os.path.join(d, 'blobs') if blobs else ''
    args = [PY, '-c', GEN, path, bdir, str(seed), str(bigmib), '1' if wrapper else '']
    if steps is not None:
        args.append(json.dumps(steps))
    p = subprocess.run(args, capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    return path, bdir, json.loads(p.stdout)
