"""zodbd's zc.zlibstorage support against zc.zlibstorage itself (PyPI
zc.zlibstorage 1.2.0, ZODB 6.4, runzeo over the same conf): what a stock
client reads, pack's GC through compressed records, conflict resolution,
undo, copy, the tools, damaged records.

An audit found four differences, fixed (the class refs printed for a
compressed record, getTid of a damaged one, the file position of a damaged
record in refs' error, an undo that failed on a runzeo-written file after
zodbd stored an unchanged state again); two stay, strict xfails
documented in docs/zeo-server.md: Go's deflate writes other bytes than
zlib's, and near the limit keeps plain a record zc.zlibstorage compresses.
"""
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
import zlib

import pytest
import transaction
from BTrees.Length import Length
from BTrees.OOBTree import OOBucket
from persistent.mapping import PersistentMapping
from ZEO.ClientStorage import ClientStorage
from ZODB import DB
from ZODB.Connection import TransactionMetaData
from ZODB.FileStorage import FileStorage
from ZODB.POSException import ConflictError, POSKeyError
from ZODB.serialize import referencesf
from ZODB.utils import p64, u64, z64
from zc.zlibstorage import ZlibStorage, compress, decompress

from testutil import fstest, read, zodbd
from test_zlibstorage import TEXT, conf, zlib_blob_conf as blob_conf
from zeoserver import Server, free_port, runzeo_cmd


def server(kind, zodbd_bin, path, tmp_path, section='zlibstorage', compress=None, zeo=''):
    port = free_port()
    return Server(zodbd_bin, path, tmp_path, kind=kind, port=port,
                  conf=conf(port, path, section, compress, zeo)).start()


@pytest.fixture
def servers():
    started = []
    yield started
    for s in started:
        s.stop()


@pytest.fixture
def both(zodbd_bin, tmp_path, servers):
    """both(orig, section, compress, zeo) yields (kind, server) for zodbd,
    then runzeo, each serving its own copy of the file orig (a new file
    when orig is None) with the same zeo.conf; they are stopped when the
    test ends."""
    def each(orig=None, section='zlibstorage', compress=None, zeo=''):
        for kind in ('zodbd', 'runzeo'):
            p = str(tmp_path / (kind + '.fs'))
            if orig is not None:
                shutil.copyfile(orig, p)
            srv = server(kind, zodbd_bin, p, tmp_path, section, compress, zeo)
            servers.append(srv)
            yield kind, srv
    return each


def raw_records(path):
    """[(oid, tid, data)] of every data record of a FileStorage, raw."""
    st = FileStorage(path, read_only=True)
    try:
        return [(r.oid, r.tid, r.data) for t in st.iterator() for r in t]
    finally:
        st.close()


def store_raw(cs, items):
    """Commit [(oid, serial, data)] through the storage API; return tid."""
    t = TransactionMetaData()
    cs.tpc_begin(t)
    for oid, serial, data in items:
        cs.store(oid, serial, data, '', t)
    cs.tpc_vote(t)
    return cs.tpc_finish(t)


# A pickle of 52 bytes that zc.zlibstorage stores as 49 ('.z' + 47 bytes
# of zlib); Go's deflate (which ends every stream with an extra empty
# final block) makes it 52 or more, not shorter, so zodbd stores it plain.
SMALL = pickle.dumps({i: 'v%d' % i for i in range(4)}, 3)
# The root's first record, as ZODB writes it in every new database (64
# bytes; zc.zlibstorage: 61 bytes compressed; zodbd: stored plain).
ROOT0 = (b'\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.'
         b'\x80\x03}q\x01X\x04\x00\x00\x00dataq\x02}q\x03s.')


# ---------------------------------------------------------------- bytes

def test_compress_function_threshold_matches():
    """The rules of compress() that need no deflate: <= 20 bytes and
    '.z'-prefixed data stay as they are (checked through the server
    below); here only the Python oracle's rules, as a reference."""
    assert compress(b'a' * 20) == b'a' * 20
    assert compress(b'a' * 21).startswith(b'.z')
    assert compress(b'.z' + b'a' * 40) == b'.z' + b'a' * 40
    assert len(SMALL) == 52 and compress(SMALL).startswith(b'.z')


def _store_via_zodbd(zodbd_bin, tmp_path, servers, datas):
    path = str(tmp_path / 'Data.fs')
    srv = server('zodbd', zodbd_bin, path, tmp_path)
    servers.append(srv)
    cs = ClientStorage(srv.addr, wait_timeout=10)
    try:
        oids = [cs.new_oid() for _ in datas]
        store_raw(cs, [(o, z64, d) for o, d in zip(oids, datas)])
        # What a stock client loads back is the plain data.
        for o, d in zip(oids, datas):
            assert cs.load(o)[0] == d
    finally:
        cs.close()
    srv.stop()
    recs = {oid: data for oid, _, data in raw_records(path)}
    return [recs[o] for o in oids]


def test_threshold_and_prefix_through_server(zodbd_bin, tmp_path, servers):
    """<zlibstorage>: data of 20 bytes is stored plain, 21 compressible
    bytes compressed, '.z'-prefixed data as it is, incompressible data
    plain; every compressed record decompresses (zc.zlibstorage's
    decompress) to the data stored."""
    datas = [b'a' * 20, b'a' * 21, b'.z' + zlib.compress(b'b' * 100),
             os.urandom(200), TEXT.encode()]
    got = _store_via_zodbd(zodbd_bin, tmp_path, servers, datas)
    for d, g in zip(datas, got):
        assert g.startswith(b'.z') == compress(d).startswith(b'.z'), (d, g)
        assert decompress(g) == decompress(d)


@pytest.mark.xfail(strict=True, reason="Go's deflate output is a few bytes longer than zlib's for "
                   "small records (docs/zeo-server.md)")
def test_compress_decision_matches_python(zodbd_bin, tmp_path, servers):
    """Not yet: zc.zlibstorage stores a record compressed when '.z' +
    zlib.compress(data) is shorter than data. zodbd decides with Go's
    deflate, whose output is longer for some small records: a 52-byte
    pickle that zc.zlibstorage compresses to 49 bytes is stored plain by
    zodbd (Data.fs differs from what runzeo writes for the same store);
    so is the root object's first record of every new database (64 bytes,
    61 compressed by zc.zlibstorage)."""
    got = _store_via_zodbd(zodbd_bin, tmp_path, servers, [SMALL, ROOT0])
    assert [g[:2] == b'.z' for g in got] == [True, True], got


@pytest.mark.xfail(strict=True, reason="Go's deflate is not zlib's: other bytes, the same data "
                   "(docs/zeo-server.md)")
def test_compressed_bytes_identical_to_python(zodbd_bin, tmp_path, servers):
    """Not yet (documented in docs/zeo-server.md as a known difference):
    the compressed bytes zodbd writes are not zc.zlibstorage's
    ('.z' + zlib.compress(data)): the same store through runzeo and
    through zodbd gives different Data.fs bytes."""
    data = TEXT.encode()
    got, = _store_via_zodbd(zodbd_bin, tmp_path, servers, [data])
    assert got == compress(data)


# ------------------------------------------------- what a client reads

def build_py(path):
    """A database written by ZODB/py through ZlibStorage: compressed
    mappings, revisions, an undone transaction (backpointers), a
    compressed Length and bucket. Returns {name: oid}."""
    db = DB(ZlibStorage(FileStorage(path)))
    try:
        conn = db.open()
        root = conn.root()
        root['a'] = PersistentMapping({'text': TEXT, 'n': 1})
        root['b'] = PersistentMapping({'text': TEXT + 'b'})
        root['len'] = Length(0)
        root['bucket'] = OOBucket({('k%03d' % i): TEXT[:40] for i in range(40)})
        transaction.commit()
        root['a']['n'] = 2
        transaction.commit()
        root['b']['n'] = 3
        transaction.commit()
        oids = {k: root[k]._p_oid for k in ('a', 'b', 'len', 'bucket')}
        oids['root'] = z64
        conn.close()
        last = db.storage.lastTransaction()
        db.undo(db.undoLog(0, 1)[0]['id'])  # undo root['b']['n'] = 3
        transaction.commit()
        return oids
    finally:
        db.close()


def client_view(addr, oids):
    """Everything a stock ClientStorage reads of the objects."""
    cs = ClientStorage(addr, wait_timeout=10, read_only=True)
    try:
        out = {}
        for name, oid in sorted(oids.items()):
            data, serial = cs.load(oid)
            hist = cs.history(oid, 10)
            out[name, 'load'] = (data, serial)
            out[name, 'history'] = [(h['tid'], h['size']) for h in hist]
            for h in hist:
                out[name, 'loadSerial', h['tid']] = cs.loadSerial(oid, h['tid'])
                out[name, 'loadBefore', h['tid']] = cs.loadBefore(oid, p64(u64(h['tid']) + 1))
            out[name, 'getTid'] = cs.getTid(oid)
        its = []
        for t in cs.iterator():
            its.append((t.tid, t.status, t.user, t.description,
                        [(r.oid, r.tid, r.data, r.data_txn) for r in t]))
        out['iterator'] = its
        nxt, recs = None, []
        while True:
            oid, tid, data, nxt = cs.record_iternext(nxt)
            recs.append((oid, tid, data))
            if nxt is None:
                break
        out['record_iternext'] = recs
        out['undoLog'] = [(d['id'], d['description']) for d in cs.undoLog(0, 20)]
        return out
    finally:
        cs.close()


@pytest.mark.parametrize('section', ['zlibstorage', 'serverzlibstorage'])
def test_client_reads_match_runzeo(zodbd_bin, tmp_path, servers, section, both):
    """A file written by ZODB/py through ZlibStorage, served by zodbd and
    by runzeo with the same zeo.conf: load, loadBefore, loadSerial,
    history (sizes), getTid, the iterator (data, data_txn),
    record_iternext and undoLog answer the same to a stock client."""
    path = str(tmp_path / 'Orig.fs')
    oids = build_py(path)
    views = {}
    for kind, srv in both(path, section):
        p = srv.path
        views[kind] = client_view(srv.addr, oids)
        srv.stop()
    z, r = views['zodbd'], views['runzeo']
    assert set(z) == set(r)
    for k in r:
        assert z[k] == r[k], k
    if section == 'zlibstorage':
        assert not r['a', 'load'][0].startswith(b'.z')
    else:
        assert r['a', 'load'][0].startswith(b'.z')


# ------------------------------------------------------- hostile records

def build_bad(path):
    """Three compressed mappings, then a transaction that stores, raw
    (FileStorage without the wrapper): '.z' + garbage, '.z' + a truncated
    zlib stream, '.z' + zlib + trailing bytes (zlib.decompress ignores
    them). Returns the three oids."""
    db = DB(ZlibStorage(FileStorage(path)))
    conn = db.open()
    root = conn.root()
    for i in range(3):
        root['m%d' % i] = PersistentMapping({'text': TEXT})
    transaction.commit()
    oids = [root['m%d' % i]._p_oid for i in range(3)]
    db.close()
    st = FileStorage(path)
    full = zlib.compress(pickle.dumps(1, 3) + b'x' * 200)
    store_raw(st, [(oids[0], st.load(oids[0])[1], b'.zgarbage garbage garbage'),
                   (oids[1], st.load(oids[1])[1], b'.z' + full[:len(full) // 2]),
                   (oids[2], st.load(oids[2])[1], b'.z' + full + b'trailing')])
    st.close()
    return oids


def hostile_view(addr, oids):
    cs = ClientStorage(addr, wait_timeout=10, read_only=True)
    try:
        out = []
        for oid in oids:
            try:
                out.append(('ok', cs.load(oid)[0]))
            except Exception as e:
                out.append(('error', type(e).__name__))
        try:
            n = sum(1 for t in cs.iterator() for r in t)
            out.append(('iterator', n))
        except Exception as e:
            out.append(('iterator error', type(e).__name__))
        out.append(('root', cs.load(z64)[0][:2]))
        return out
    finally:
        cs.close()


def test_hostile_records_served_like_runzeo(zodbd_bin, tmp_path, both):
    """<zlibstorage> serving damaged compressed records: the load of each
    fails for the client as it does with runzeo (trailing bytes after the
    zlib stream are accepted by both), the iterator fails, and the server
    goes on serving."""
    path = str(tmp_path / 'Orig.fs')
    oids = build_bad(path)
    views = {}
    for kind, srv in both(path):
        p = srv.path
        views[kind] = hostile_view(srv.addr, oids)
        srv.stop()
    print(views)
    z, r = views['zodbd'], views['runzeo']
    assert [x[0] for x in z] == [x[0] for x in r]
    assert z[2] == r[2]


# ------------------------------------------------------------------ pack

def build_garbage(path):
    """ZODB/py through ZlibStorage: root -> a -> deep (deep referenced only
    from a's compressed record), and junk, dropped from the root. Returns
    (deep oid, junk oid)."""
    db = DB(ZlibStorage(FileStorage(path)))
    try:
        conn = db.open()
        root = conn.root()
        root['a'] = PersistentMapping({'text': TEXT})
        root['a']['deep'] = PersistentMapping({'text': TEXT + 'deep'})
        root['junk'] = PersistentMapping({'text': TEXT + 'junk'})
        transaction.commit()
        deep, junk = root['a']['deep']._p_oid, root['junk']._p_oid
        del root['junk']
        root['a']['n'] = 1
        transaction.commit()
        conn.close()
        return deep, junk
    finally:
        db.close()


def py_pack(path, t):
    st = ZlibStorage(FileStorage(path))
    try:
        st.pack(t, referencesf)
    finally:
        st.close()


@pytest.mark.parametrize('section', ['zlibstorage', 'serverzlibstorage'])
def test_online_pack_gc_through_compressed_refs(zodbd_bin, tmp_path, servers, section):
    """Pack through a stock ClientStorage on zodbd: an object referenced
    only from a compressed record survives, the garbage goes, and the
    packed file is byte-identical to ZODB/py's pack through ZlibStorage."""
    orig = str(tmp_path / 'Orig.fs')
    deep, junk = build_garbage(orig)
    time.sleep(0.02)
    t = time.time()
    ours, theirs = str(tmp_path / 'ours.fs'), str(tmp_path / 'theirs.fs')
    shutil.copyfile(orig, ours)
    shutil.copyfile(orig, theirs)
    srv = server('zodbd', zodbd_bin, ours, tmp_path, section)
    servers.append(srv)
    cs = ClientStorage(srv.addr, wait_timeout=10)
    try:
        cs.pack(t, referencesf, wait=1)
        assert decompress(cs.load(deep)[0]).find(b'deep') > 0
        with pytest.raises(POSKeyError):
            cs.load(junk)
    finally:
        cs.close()
    srv.stop()
    py_pack(theirs, t)
    fstest(ours)
    assert read(ours) == read(theirs)


def test_offline_pack_gc_through_compressed_refs(zodbd_bin, tmp_path):
    """`zodbd pack` of a file written through ZlibStorage: same bytes as
    ZODB/py's pack through ZlibStorage; the deep object survives."""
    orig = str(tmp_path / 'Orig.fs')
    deep, junk = build_garbage(orig)
    time.sleep(0.02)
    t = time.time()
    ours, theirs = str(tmp_path / 'ours.fs'), str(tmp_path / 'theirs.fs')
    shutil.copyfile(orig, ours)
    shutil.copyfile(orig, theirs)
    zodbd(zodbd_bin, 'pack', '--time', repr(t), ours)
    py_pack(theirs, t)
    assert read(ours) == read(theirs)
    st = ZlibStorage(FileStorage(ours, read_only=True))
    try:
        assert b'deep' in st.load(deep)[0]
        with pytest.raises(POSKeyError):
            st.load(junk)
    finally:
        st.close()


# --------------------------------------------------- conflict resolution

def zeo_db(addr, wrap):
    """A DB of a stock ClientStorage of addr, wrapped in ZlibStorage
    (client-side compression, for <serverzlibstorage>) when wrap."""
    cs = ClientStorage(addr, wait_timeout=10)
    return DB(ZlibStorage(cs) if wrap else cs)


def conflict_run(addr, wrap):
    """Two clients change a compressed OOBucket and a Length concurrently:
    the second commit conflicts and the server resolves it. Returns the
    state as a fresh client sees it."""
    db1 = zeo_db(addr, wrap)
    db2 = None
    try:
        tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
        c1 = db1.open(tm1)
        c1.root()['bucket'] = OOBucket({('k%03d' % i): TEXT[:40] for i in range(40)})
        c1.root()['len'] = Length(10)
        tm1.commit()
        db2 = zeo_db(addr, wrap)
        c2 = db2.open(tm2)
        b1, b2 = c1.root()['bucket'], c2.root()['bucket']
        l1, l2 = c1.root()['len'], c2.root()['len']
        b2._p_activate()
        l2._p_activate()
        b1['k010x'] = 'one ' * 10
        l1.change(5)
        tm1.commit()
        b2['k030x'] = 'two ' * 10
        del b2['k020']
        l2.change(7)
        tm2.commit()  # conflicts: resolved in the server
        oids = b1._p_oid, l1._p_oid
        c1.close()
        c2.close()
    finally:
        db1.close()
        if db2 is not None:
            db2.close()
    db = zeo_db(addr, wrap)
    try:
        c = db.open()
        r = c.root()
        state = (dict(r['bucket'].items()), r['len']())
        c.close()
        return state, oids
    finally:
        db.close()


@pytest.mark.parametrize('section,wrap,comp', [
    ('zlibstorage', False, None),
    ('serverzlibstorage', True, None),
    ('serverzlibstorage', True, False),
])
def test_server_conflict_resolution_matches_runzeo(zodbd_bin, tmp_path, servers,
                                                   section, wrap, comp, both):
    """A conflict on a compressed OOBucket and a Length, resolved in the
    server: the merged state, and whether the merged records are stored
    compressed, are runzeo's (<zlibstorage>: decompress, resolve,
    recompress; <serverzlibstorage>: compressed unless compress false)."""
    got = {}
    for kind, srv in both(None, section, comp):
        p = srv.path
        try:
            state, oids = conflict_run(srv.addr, wrap)
        except ConflictError as e:
            raise AssertionError('%s: %s' % (kind, e))
        srv.stop()
        last = {}
        for oid, tid, data in raw_records(p):
            last[oid] = data
        got[kind] = state, [last[o][:2] == b'.z' for o in oids], [decompress(last[o]) for o in oids]
        fstest(p)
    z, r = got['zodbd'], got['runzeo']
    assert z[0] == r[0]
    assert 'k010x' in z[0][0] and 'k030x' in z[0][0] and 'k020' not in z[0][0] and z[0][1] == 22
    assert z[1] == r[1]
    print(kind, z[1], r[1])
    # The merged records carry the same class pickle.
    for zd, rd in zip(z[2], r[2]):
        assert zd[:zd.index(b'.') + 1] == rd[:rd.index(b'.') + 1]


from persistent import Persistent  # noqa: E402


class Counter(Persistent):
    """A class zodbd cannot resolve: its conflicts go to the client."""

    def __init__(self):
        self.n = 0
        self.text = TEXT

    def _p_resolveConflict(self, old, committed, new):
        committed['n'] += new['n'] - old['n']
        return committed


def client_conflict_run(addr, wrap):
    db1 = zeo_db(addr, wrap)
    db2 = None
    try:
        tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
        c1 = db1.open(tm1)
        c1.root()['c'] = Counter()
        tm1.commit()
        db2 = zeo_db(addr, wrap)
        c2 = db2.open(tm2)
        o1, o2 = c1.root()['c'], c2.root()['c']
        o2._p_activate()
        o1.n += 1
        tm1.commit()
        o2.n += 10
        tm2.commit()
        oid = o1._p_oid
    finally:
        db1.close()
        if db2 is not None:
            db2.close()
    db = zeo_db(addr, wrap)
    try:
        c = db.open()
        return c.root()['c'].n, oid
    finally:
        db.close()


@pytest.mark.parametrize('section,wrap', [('zlibstorage', False), ('serverzlibstorage', True)])
def test_client_conflict_resolution_matches_runzeo(zodbd_bin, tmp_path, servers, section, wrap, both):
    """A conflict on a class the server does not resolve, resolved by the
    client (runzeo: client-conflict-resolution true): same state, and the
    record is stored compressed, as with runzeo."""
    got = {}
    for kind, srv in both(None, section, zeo='client-conflict-resolution true'):
        p = srv.path
        try:
            n, oid = client_conflict_run(srv.addr, wrap)
        except ConflictError as e:
            raise AssertionError('%s: %s' % (kind, e))
        srv.stop()
        last = {o: d for o, _, d in raw_records(p)}
        got[kind] = n, last[oid][:2] == b'.z'
        fstest(p)
    assert got['zodbd'] == got['runzeo'] == (11, True)


# ------------------------------------------------------------------ undo

def undo_run(addr, wrap):
    cs = ClientStorage(addr, wait_timeout=10)
    db = DB(ZlibStorage(cs) if wrap else cs)
    try:
        tm = transaction.TransactionManager()
        c = db.open(tm)
        r = c.root()
        r['bucket'] = OOBucket({('k%03d' % i): TEXT[:40] for i in range(40)})
        r['len'] = Length(10)
        r['m'] = PersistentMapping({'text': TEXT})
        tm.commit()
        r['bucket']['k010x'] = 'one ' * 10
        r['len'].change(5)
        tm.get().note('first')
        tm.commit()
        r['bucket']['k030x'] = 'two ' * 10
        r['len'].change(7)
        r['m']['n'] = 1
        tm.get().note('second')
        tm.commit()
        log = db.undoLog(0, 10)
        first = [d['id'] for d in log if d['description'] == 'first'][0]
        second = [d['id'] for d in log if d['description'] == 'second'][0]
        # Undo 'first' needs conflict resolution (bucket, len changed
        # since); then undo of 'second' of m is a plain backpointer.
        db.undo(first, tm.get())
        tm.commit()
        db.undo(second, tm.get())
        try:
            tm.commit()
        except Exception as e:
            tm.abort()
            second_err = type(e).__name__
        else:
            second_err = None
        c.close()
        c = db.open(tm)
        r = c.root()
        return (dict(r['bucket'].items()), r['len'](), dict(r['m']), second_err), \
            [r[k]._p_oid for k in ('bucket', 'len', 'm')]
    finally:
        db.close()


@pytest.mark.parametrize('section,wrap', [('zlibstorage', False), ('serverzlibstorage', True)])
def test_undo_matches_runzeo(zodbd_bin, tmp_path, servers, section, wrap, both):
    """Undo through the server with compressed records: an undo that needs
    conflict resolution (decompress, resolve, recompress) and a plain one
    (backpointer): same states and same compressed-or-not records as
    runzeo."""
    got = {}
    for kind, srv in both(None, section):
        p = srv.path
        state, oids = undo_run(srv.addr, wrap)
        srv.stop()
        last = {}
        for o, _, d in raw_records(p):
            last[o] = d
        got[kind] = state, [last.get(o, b'')[:2] == b'.z' for o in oids]
        fstest(p)
    print(got)
    assert got['zodbd'] == got['runzeo']


# ------------------------------------------------------------------ copy

def py_copy(src_storage, dst):
    st = FileStorage(dst, create=True)
    try:
        st.copyTransactionsFrom(src_storage)
    finally:
        st.close()


def test_copy_compressed_file_matches_python(zodbd_bin, tmp_path):
    """`zodbd copy` of a file written through ZlibStorage (undo
    backpointers included): the records stay compressed, the copy is
    byte-identical to ZODB/py's copyTransactionsFrom, and ZlibStorage
    reads it."""
    orig = str(tmp_path / 'Orig.fs')
    oids = build_py(orig)
    ours, theirs = str(tmp_path / 'ours.fs'), str(tmp_path / 'theirs.fs')
    zodbd(zodbd_bin, 'copy', '-q', orig, ours)
    src = FileStorage(orig, read_only=True)
    try:
        py_copy(src, theirs)
    finally:
        src.close()
    assert read(ours) == read(theirs)
    st = ZlibStorage(FileStorage(ours, read_only=True))
    try:
        assert b'compresses well' in st.load(oids['a'])[0]
    finally:
        st.close()


def test_copy_from_zlibstorage_server_matches_python(zodbd_bin, tmp_path, servers):
    """`zodbd copy zeo://...` from a <zlibstorage> server (its iterator
    decompresses) gives the same file as ZODB/py's copyTransactionsFrom
    a ClientStorage of runzeo with the same conf."""
    orig = str(tmp_path / 'Orig.fs')
    build_py(orig)
    served = str(tmp_path / 'served.fs')
    shutil.copyfile(orig, served)
    srv = server('zodbd', zodbd_bin, served, tmp_path)
    servers.append(srv)
    ours = str(tmp_path / 'ours.fs')
    zodbd(zodbd_bin, 'copy', '-q', 'zeo://127.0.0.1:%d' % srv.port, ours)
    srv.stop()
    rz = str(tmp_path / 'rz.fs')
    shutil.copyfile(orig, rz)
    srv = server('runzeo', zodbd_bin, rz, tmp_path)
    servers.append(srv)
    theirs = str(tmp_path / 'theirs.fs')
    cs = ClientStorage(srv.addr, wait_timeout=10, read_only=True)
    try:
        py_copy(cs, theirs)
    finally:
        cs.close()
    srv.stop()
    assert not any(d and d.startswith(b'.z') for _, _, d in raw_records(ours))
    assert read(ours) == read(theirs)


# ----------------------------------------------------------------- tools

def py_tool(*args):
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True)
    return p.stdout


def test_dump_and_tail_match_fsdump_fstail(zodbd_bin, tmp_path):
    """`zodbd dump`, `dump -v` and `tail` of a compressed file print what
    ZODB/py's fsdump, Dumper and fstail print (fsdump shows no class for
    a '.z' record: neither does zodbd)."""
    path = str(tmp_path / 'Data.fs')
    build_py(path)
    assert zodbd(zodbd_bin, 'dump', path).stdout == py_tool('-m', 'ZODB.FileStorage.fsdump', path)
    assert zodbd(zodbd_bin, 'tail', path).stdout == py_tool('-m', 'ZODB.scripts.fstail', path)
    verbose = py_tool('-c', 'import sys; from ZODB.FileStorage.fsdump import Dumper; '
                      'Dumper(sys.argv[1], sys.stdout).dump()', path)
    assert zodbd(zodbd_bin, 'dump', '-v', path).stdout == verbose


def decompressed_copy(src, dst):
    """dst: src with every record decompressed (ZlibStorage's iterator),
    same tids."""
    st = ZlibStorage(FileStorage(src, read_only=True))
    try:
        py_copy(st, dst)
    finally:
        st.close()


def test_refs_class_of_compressed_records(zodbd_bin, tmp_path):
    """Fixed: `zodbd refs` / `referrers` / `refs --dangling` read the
    references of a compressed record (decompressing it) but print its
    class as '.' (the class pickle is read from the raw '.z' bytes): the
    same database uncompressed prints persistent.mapping.PersistentMapping.
    (fsrefs cannot read '.z' records at all; the oracle is the output on
    the decompressed copy.)"""
    path = str(tmp_path / 'Data.fs')
    deep, junk = build_garbage(path)
    # Make a dangling reference: delete 'deep' (still referenced by 'a').
    st = ZlibStorage(FileStorage(path))
    t = TransactionMetaData()
    st.tpc_begin(t)
    st.deleteObject(deep, st.load(deep)[1], t)
    st.tpc_vote(t)
    st.tpc_finish(t)
    st.close()
    plain = str(tmp_path / 'plain.fs')
    decompressed_copy(path, plain)
    for args in (['refs'], ['refs', '--dangling'], ['referrers']):
        extra = [deep.hex()] if args == ['referrers'] else []
        z = zodbd(zodbd_bin, *args, path, *extra, check=False)
        p = zodbd(zodbd_bin, *args, plain, *extra, check=False)
        assert (z.returncode, z.stdout) == (p.returncode, p.stdout), args


# ----------------------------------------------------------------- blobs

def blob_files(d):
    """The oid directories of the blob files (tids differ per run)."""
    return sorted(os.path.relpath(r, d)
                  for r, _, fs in os.walk(d) for f in fs if f.endswith('.blob'))


def test_blob_pack_gc_through_compressed_refs(zodbd_bin, tmp_path, servers):
    """<zlibstorage> around <blobstorage>: a blob referenced only from a
    compressed mapping survives an online pack (with its file), a dropped
    one goes; the blob files left and the records are runzeo's."""
    import ZEO
    import ZODB.blob
    got = {}
    for kind in ('zodbd', 'runzeo'):
        d = tmp_path / kind
        d.mkdir()
        path, blobs = str(d / 'Data.fs'), str(d / 'blobs')
        port = free_port()
        srv = Server(zodbd_bin, path, d, kind=kind, port=port,
                     conf=blob_conf(port, path, blobs)).start()
        servers.append(srv)
        db = ZEO.DB(srv.addr, blob_dir=str(d / 'cache'), wait_timeout=10)
        try:
            tm = transaction.TransactionManager()
            c = db.open(tm)
            r = c.root()
            r['m'] = PersistentMapping({'text': TEXT, 'keep': ZODB.blob.Blob(b'kept ' * 100)})
            r['drop'] = ZODB.blob.Blob(b'dropped ' * 100)
            tm.commit()
            del r['drop']
            tm.commit()
            time.sleep(0.02)
            db.pack(time.time())
            c.close()
            c = db.open(tm)
            with c.root()['m']['keep'].open() as f:
                assert f.read() == b'kept ' * 100
            c.close()
        finally:
            db.close()
        srv.stop()
        got[kind] = (blob_files(blobs),
                     [(u64(o), d[:2] == b'.z', decompress(d)) for o, _, d in raw_records(path)])
    z, r = got['zodbd'], got['runzeo']
    assert len(z[0]) == 1
    assert z[0] == r[0]
    assert [x[:2] for x in z[1]] == [x[:2] for x in r[1]]


def test_getTid_of_damaged_record_like_runzeo(zodbd_bin, tmp_path, both):
    """Fixed: ZEO's getTid under <zlibstorage>: runzeo answers it from
    the FileStorage (ZlibStorage has no getTid: __getattr__ hands it to
    the base, which never decompresses), so it answers for a record
    whose zlib data is damaged; zodbd loads and decompresses the record
    for its serial (zeo/methods.go getTid) and fails."""
    path = str(tmp_path / 'Orig.fs')
    oids = build_bad(path)
    got = {}
    for kind, srv in both(path):
        p = srv.path
        cs = ClientStorage(srv.addr, wait_timeout=10, read_only=True)
        try:
            out = []
            for oid in oids[:2]:
                try:
                    out.append(cs.getTid(oid))
                except Exception as e:
                    out.append(type(e).__name__)
            got[kind] = out
        finally:
            cs.close()
        srv.stop()
    assert all(isinstance(x, bytes) for x in got['runzeo'])
    assert got['zodbd'] == got['runzeo']


@pytest.mark.parametrize('comp', [True, False])
def test_store_load_edges_match_runzeo(zodbd_bin, tmp_path, servers, comp, both):
    """<zlibstorage compress true|false>: what lands in Data.fs (compressed
    or not) for data a plain client stores, and what it loads back,
    including '.z' + zlib of nothing (zc.zlibstorage returns such a
    record as it is) and '.z' data from a client (stored as is, loaded
    decompressed), are runzeo's."""
    datas = [b'a' * 20, b'a' * 21, TEXT.encode(), b'.z' + zlib.compress(b''),
             b'.z' + zlib.compress(TEXT.encode()), os.urandom(64)]
    got = {}
    for kind, srv in both(None, 'zlibstorage', comp):
        p = srv.path
        cs = ClientStorage(srv.addr, wait_timeout=10)
        try:
            oids = [cs.new_oid() for _ in datas]
            store_raw(cs, [(o, z64, d) for o, d in zip(oids, datas)])
            loads = [cs.load(o)[0] for o in oids]
        finally:
            cs.close()
        srv.stop()
        recs = {o: d for o, _, d in raw_records(p)}
        got[kind] = loads, [recs[o][:2] == b'.z' for o in oids], [decompress(recs[o]) for o in oids]
    assert got['zodbd'] == got['runzeo']


def test_conflict_on_damaged_committed_record(zodbd_bin, tmp_path, both):
    """A store conflicting with a committed record whose zlib data is
    damaged (<zlibstorage>, a Length, which both servers resolve): runzeo
    answers ConflictError (tryToResolveConflict turns any failure into
    one); zodbd must refuse the store too, with a ConflictError, and go
    on serving."""
    path = str(tmp_path / 'Orig.fs')
    db = DB(ZlibStorage(FileStorage(path)))
    c = db.open()
    c.root()['len'] = Length(0)
    transaction.commit()
    oid = c.root()['len']._p_oid
    c.root()['len'].change(5)
    transaction.commit()
    db.close()
    st = FileStorage(path)
    old_data, old_serial = st.load(oid)
    store_raw(st, [(oid, old_serial, b'.zgarbage garbage garbage')])
    st.close()
    got = {}
    for kind, srv in both(path):
        p = srv.path
        cs = ClientStorage(srv.addr, wait_timeout=10)
        try:
            try:
                # Length(0) + 7 from the serial before the damage.
                data = old_data[:old_data.rindex(b'K')] + b'K\x0c.'
                store_raw(cs, [(oid, old_serial, data)])
                got[kind] = 'committed'
            except ConflictError:
                got[kind] = 'ConflictError'
            except Exception as e:
                got[kind] = type(e).__name__ + ': ' + str(e)[:200]
            got[kind, 'root'] = cs.load(z64)[0][:2]
        finally:
            cs.close()
        srv.stop()
    assert got['runzeo'] == 'ConflictError'
    assert got == dict(got, zodbd=got['runzeo']) and got['zodbd', 'root'] == got['runzeo', 'root']


def test_restore_into_zlibstorage_server_matches_runzeo(zodbd_bin, tmp_path, both):
    """copyTransactionsFrom a plain file (undo backpointers included) into
    a ClientStorage of a <zlibstorage> server (ZEO's restorea: the server
    compresses what it restores): the records (compressed or not, their
    data, their backpointers) are runzeo's."""
    orig = str(tmp_path / 'Orig.fs')
    build_py(orig)
    plain = str(tmp_path / 'plain.fs')
    decompressed_copy(orig, plain)
    got = {}
    for kind, srv in both(None):
        p = srv.path
        cs = ClientStorage(srv.addr, wait_timeout=10)
        src = FileStorage(plain, read_only=True)
        try:
            cs.copyTransactionsFrom(src)
        finally:
            src.close()
            cs.close()
        srv.stop()
        st = FileStorage(p, read_only=True)
        try:
            got[kind] = [(t.tid, [(r.oid, r.data is not None and r.data[:2] == b'.z',
                                   r.data and decompress(r.data), r.data_txn) for r in t])
                         for t in st.iterator()]
        finally:
            st.close()
    # (Whether a record is compressed differs for the root's first record:
    # test_compress_decision_matches_python.)
    strip = lambda v: [(tid, [(o, d, b) for o, _, d, b in recs]) for tid, recs in v]
    assert strip(got['zodbd']) == strip(got['runzeo'])
    assert [x[1] for _, recs in got['zodbd'][1:] for x in recs] == \
        [x[1] for _, recs in got['runzeo'][1:] for x in recs]


def test_undo_after_identical_rewrite_on_python_written_file(zodbd_bin, tmp_path, both):
    """Fixed (a consequence of the compressed bytes differing): FileStorage's
    undo copies a backpointer when the current data equals the undone
    data (byte comparison of the stored, compressed records). On a Data.fs
    written by runzeo/ZODB through ZlibStorage and then served by zodbd, a
    client re-storing an object unchanged (any setattr to the same value)
    gets other compressed bytes for the same pickle, so undoing the
    transaction before it fails ("Some data were modified by a later
    transaction") where runzeo undoes it."""
    orig = str(tmp_path / 'Orig.fs')
    db = DB(ZlibStorage(FileStorage(orig)))
    c = db.open()
    c.root()['x'] = PersistentMapping({'text': TEXT})
    transaction.commit()
    c.root()['x']['n'] = 1
    transaction.get().note('second')
    transaction.commit()
    db.close()
    got = {}
    for kind, srv in both(orig):
        p = srv.path
        db = DB(ClientStorage(srv.addr, wait_timeout=10))
        try:
            tm = transaction.TransactionManager()
            c = db.open(tm)
            x = c.root()['x']
            x['n'] = 1  # the same state, stored again
            tm.commit()
            second = [d['id'] for d in db.undoLog(0, 10) if d['description'] == 'second'][0]
            db.undo(second, tm.get())
            try:
                tm.commit()
                c.close()
                c = db.open(tm)
                got[kind] = dict(c.root()['x'])
            except Exception as e:
                tm.abort()
                got[kind] = type(e).__name__
            c.close()
        finally:
            db.close()
        srv.stop()
    assert got['runzeo'] == {'text': TEXT}
    assert got['zodbd'] == got['runzeo']


def test_big_compressed_record_roundtrip(zodbd_bin, tmp_path, servers):
    """A 12 MiB compressible record through <zlibstorage> (inflates past
    zlibx's 8 MiB turn): stored compressed, loaded back whole by three
    concurrent clients; ZlibStorage reads the file."""
    path = str(tmp_path / 'Data.fs')
    srv = server('zodbd', zodbd_bin, path, tmp_path)
    servers.append(srv)
    data = (TEXT.encode() + os.urandom(8)) * (12 * 1024 * 1024 // 708)
    cs = ClientStorage(srv.addr, wait_timeout=10)
    try:
        oid = cs.new_oid()
        store_raw(cs, [(oid, z64, data)])
    finally:
        cs.close()
    results = []

    def load():
        c = ClientStorage(srv.addr, wait_timeout=10, read_only=True)
        try:
            results.append(c.load(oid)[0] == data)
        finally:
            c.close()
    ts = [threading.Thread(target=load) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    srv.stop()
    assert results == [True] * 3
    rec = [d for o, _, d in raw_records(path) if o == oid][0]
    assert rec.startswith(b'.z') and len(rec) < len(data) // 4
    st = ZlibStorage(FileStorage(path, read_only=True))
    try:
        assert st.load(oid)[0] == data
    finally:
        st.close()


def test_tools_on_damaged_compressed_records(zodbd_bin, tmp_path):
    """Damaged '.z' records: dump, tail and verify print what fsdump,
    fstail and fstest print; copy copies them as they are; pack packs
    without GC and its warning names the file and the record's position;
    refs and referrers fail cleanly (exit 1, no panic)."""
    path = str(tmp_path / 'Data.fs')
    oids = build_bad(path)
    st = FileStorage(path, read_only=True)
    pos = st._index[oids[0]]
    st.close()
    assert zodbd(zodbd_bin, 'dump', path).stdout == py_tool('-m', 'ZODB.FileStorage.fsdump', path)
    assert zodbd(zodbd_bin, 'tail', path).stdout == py_tool('-m', 'ZODB.scripts.fstail', path)
    zodbd(zodbd_bin, 'verify', path)
    fstest(path)
    dst = str(tmp_path / 'copy.fs')
    zodbd(zodbd_bin, 'copy', '-q', path, dst)
    assert read(dst) == read(path)
    packed = str(tmp_path / 'packed.fs')
    shutil.copyfile(path, packed)
    p = zodbd(zodbd_bin, 'pack', packed)
    assert 'without GC' in p.stderr and '%s:%d' % (packed, pos) in p.stderr, p.stderr
    fstest(packed)
    for args in (['refs', path], ['refs', '--dangling', path], ['referrers', path, '1']):
        r = zodbd(zodbd_bin, *args, check=False)
        assert r.returncode == 1 and 'zlib' in r.stderr, (args, r.stderr)
        assert 'panic' not in r.stderr and 'goroutine' not in r.stderr


def test_refs_error_names_record_position(zodbd_bin, tmp_path):
    """Fixed (minor): on a damaged '.z' record, refs and referrers fail
    naming the oid and "record offset 0" (an offset in the pickle, never
    reached: the zlib header is bad) but not the record's position in the
    file, which pack's warning gives ('FILE:POS')."""
    path = str(tmp_path / 'Data.fs')
    oids = build_bad(path)
    st = FileStorage(path, read_only=True)
    pos = st._index[oids[0]]
    st.close()
    for args in (['refs', path], ['refs', '--dangling', path], ['referrers', path, '1']):
        r = zodbd(zodbd_bin, *args, check=False)
        assert '%s:%d' % (path, pos) in r.stderr, (args, r.stderr)
