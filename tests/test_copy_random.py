"""`zodbd copy` against ZODB/py's copyTransactionsFrom on random histories.

docs/tools.md (zodbd copy) promises: every transaction keeps its tid,
status, user, description and extension bytes and its record order; undo
records stay backpointers; a record without data stays one; DST must be
empty (else nothing is written, `... must be empty`); a torn tail of SRC is
not copied; DST's .index is saved; DST's oid mark is raised to SRC's;
--src-blob-dir/--dst-blob-dir copy every record's blob file; and "when SRC
was written by ZODB/py's FileStorage (and DST is new), DST is
byte-identical to the complete transactions of SRC, and so is its .index".
SRC may also be zeo://, neo://, sqlite:; DST a NEO cluster.

The oracle is ZODB/py: FileStorage.copyTransactionsFrom (BaseStorage.copy,
and ZODB.blob.copyTransactionsFromTo for a blob directory) run on the same
source, and every revision read back through ZODB/py (iterator with its
metadata, loadBefore at every tid, history, undoLog, loadBlob).

Histories are random (seeded): new objects, modifications, BTrees, undo and
undoMultiple (backpointers, chains of them), undo of a creation (records
without data), deleteObject, several stores of one oid in a transaction,
binary/unicode user, description and extension (garbage extension bytes
too), empty transactions, big records (several MiB), blobs, a pack at a mid
time (status 'p').

COPY_SEEDS seeds (default 30; ZODBD_STRESS=1: 300) for FileStorage copies and
COPY_BACKEND_SEEDS (default 4; ZODBD_STRESS=1: 40) through zeo://, neo://, sqlite:.

Fixed (each failed before, in a test of its own below): an undo of an
object's change and of its creation in one transaction (two records of the
oid) could not be copied into NEO; transactions of status 'p' became
complete in NEO without a word (now a warning: NEO's commit keeps no
status); a source tid of 0 (damaged) got a new tid; the extension bytes
through zeo:// (as source or destination) were not ZODB/py's; file:// URLs
were refused; a refused blob copy left its destination directory behind.
"""
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from zeoserver import free_port, wait_listening  # noqa: E402
import randhist  # noqa: E402

PY = sys.executable
STRESS = os.environ.get('ZODBD_STRESS') == '1'
NSEEDS = int(os.environ.get('COPY_SEEDS') or (300 if STRESS else 30))


# ---------------------------------------------------------------------------
# Random histories: randhist.py.


def build(d, seed, steps=None, blobs=True, bigmib=3.0):
    return randhist.build(d, seed, steps, blobs, bigmib, wrapper=True)


# ---------------------------------------------------------------------------
# The oracle: ZODB/py's copy, and what ZODB/py reads.

def py_copy_zeo(url, dst):
    """ZODB/py's FileStorage(dst).copyTransactionsFrom(ClientStorage) of
    the ZEO server at url (zeo://127.0.0.1:PORT)."""
    from ZODB.FileStorage import FileStorage
    from ZEO.ClientStorage import ClientStorage
    cs = ClientStorage(('127.0.0.1', int(url.rsplit(':', 1)[1])), read_only=True, wait_timeout=10)
    d = FileStorage(dst, create=True)
    try:
        d.copyTransactionsFrom(cs)
    finally:
        d.close()
        cs.close()


def py_copy(src, dst, src_blobs=None, dst_blobs=None):
    """ZODB/py's FileStorage(dst).copyTransactionsFrom(FileStorage(src))."""
    from ZODB.FileStorage import FileStorage
    s = FileStorage(src, read_only=True, blob_dir=src_blobs)
    d = FileStorage(dst, create=not os.path.exists(dst), blob_dir=dst_blobs)
    try:
        d.copyTransactionsFrom(s)
    finally:
        d.close()
        s.close()


def zodbd(zodbd_bin, *args, timeout=300, env=None):
    return subprocess.run([zodbd_bin, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def zodbd_ok(zodbd_bin, *args, **kw):
    p = zodbd(zodbd_bin, *args, **kw)
    assert p.returncode == 0, 'zodbd %s: exit %d\n%s%s' % (
        ' '.join(map(str, args)), p.returncode, p.stdout, p.stderr)
    return p


def read(path):
    with open(path, 'rb') as f:
        return f.read()


def first_diff(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def blob_files(d):
    """{relative path: sha1} of every file under blob dir d, but its tmp/."""
    out = {}
    for dp, dns, fns in os.walk(d):
        rel = os.path.relpath(dp, d)
        if rel == 'tmp' or rel.startswith('tmp' + os.sep):
            continue
        for fn in fns:
            p = os.path.join(dp, fn)
            out[os.path.normpath(os.path.join(rel, fn))] = hashlib.sha1(read(p)).hexdigest()
    return out


def blob_rel(oid, tid):
    """The path of a blob file in a bushy blob directory."""
    from ZODB.blob import BushyLayout
    return BushyLayout().getBlobFilePath(oid, tid)


def is_packed(path):
    from ZODB.FileStorage import FileStorage
    s = FileStorage(path, read_only=True)
    try:
        return any(t.status == 'p' for t in s.iterator())
    finally:
        s.close()


def nodata_blob_files(src, files):
    """The blob files (of files) of records without data of FileStorage src."""
    from ZODB.FileStorage import FileStorage
    s = FileStorage(src, read_only=True)
    out = set()
    try:
        for t in s.iterator():
            for r in t:
                if r.data is None and blob_rel(r.oid, r.tid) in files:
                    out.add(blob_rel(r.oid, r.tid))
    finally:
        s.close()
    return out


def snapshot(storage, blobs=False, order=True):
    """What ZODB/py reads from an open storage: every transaction (tid,
    status, user, description, extension bytes, its records: oid, tid, data,
    data_txn), undoLog, and for every oid loadBefore at every tid (and
    past the last), history, loadSerial of each revision, loadBlob."""
    from ZODB.POSException import POSKeyError
    from ZODB.utils import p64, u64
    txns = []
    oids = set()
    for t in storage.iterator():
        ext = getattr(t, 'extension_bytes', None)
        recs = []
        for r in t:
            recs.append((r.oid, r.tid, r.data, r.data_txn))
            oids.add(r.oid)
        if not order:
            # Record order and duplicates within a transaction aside: the
            # last record of each oid is what loads see.
            last = {}
            for r in recs:
                last[r[0]] = r
            recs = sorted(last.values())
        txns.append((t.tid, t.status, bytes(t.user), bytes(t.description), ext, recs))
    tids = [t[0] for t in txns]
    loads = {}
    for oid in sorted(oids):
        per = []
        for before in tids + [p64(u64(tids[-1]) + 1)]:
            try:
                r = storage.loadBefore(oid, before)
            except POSKeyError:
                r = 'POSKeyError'
            per.append(r)
        try:
            h = [(x['tid'], x.get('size')) for x in storage.history(oid, size=1 << 20)]
        except Exception as e:  # a garbage extension fails history
            h = type(e).__name__
        loads[oid] = (per, h)
    undo = []
    if hasattr(storage, 'undoLog'):
        try:
            for e in storage.undoLog(0, 1 << 30):
                undo.append(sorted((k, repr(v)) for k, v in e.items()))
        except Exception as e:  # a garbage extension fails undoLog
            undo = type(e).__name__
    bl = {}
    if blobs:
        for t in txns:
            for oid, tid, data, _ in t[5]:
                try:
                    fn = storage.loadBlob(oid, tid)
                except (POSKeyError, KeyError):
                    continue
                bl[(oid, tid)] = hashlib.sha1(read(fn)).hexdigest()
    return {'txns': txns, 'loads': loads, 'undo': undo, 'blobs': bl}


def fs_snapshot(path, blob_dir=None, order=True):
    from ZODB.FileStorage import FileStorage
    s = FileStorage(path, read_only=True, blob_dir=blob_dir)
    try:
        return snapshot(s, blobs=blob_dir is not None, order=order)
    finally:
        s.close()


def diff_snapshots(want, got):
    """The first differences between two snapshots, as text."""
    out = []
    wt, gt = want['txns'], got['txns']
    if len(wt) != len(gt):
        out.append('%d transactions, want %d' % (len(gt), len(wt)))
    for a, b in zip(wt, gt):
        if a != b:
            for name, x, y in zip(('tid', 'status', 'user', 'description', 'extension', 'records'), a, b):
                if x != y:
                    out.append('txn %s: %s %r, want %r' % (a[0].hex(), name, _short(y), _short(x)))
            if len(out) > 8:
                break
    for oid in want['loads']:
        if want['loads'][oid] != got['loads'].get(oid):
            out.append('oid %s: loadBefore/history differ' % oid.hex())
            if len(out) > 12:
                break
    if want['undo'] != got['undo']:
        out.append('undoLog differs: %d entries, want %d' % (len(got['undo']), len(want['undo'])))
    if want['blobs'] != got['blobs']:
        out.append('loadBlob differs: %d blobs, want %d' % (len(got['blobs']), len(want['blobs'])))
    return out


def _short(x):
    r = repr(x)
    return r if len(r) < 300 else r[:300] + '...'


# ---------------------------------------------------------------------------
# (1) + (2): FileStorage -> FileStorage, with and without blobs, against
# ZODB/py's copyTransactionsFrom.

def check_fs_copy(zodbd_bin, d, src, sblobs):
    """zodbd copy and ZODB/py's copy of src; returns a list of problems."""
    probs = []
    zd, pd = os.path.join(d, 'zodbd'), os.path.join(d, 'py')
    os.makedirs(zd)
    os.makedirs(pd)
    zdst, pdst = os.path.join(zd, 'Data.fs'), os.path.join(pd, 'Data.fs')
    zb = os.path.join(zd, 'blobs') if sblobs else None
    pb = os.path.join(pd, 'blobs') if sblobs else None
    args = ['copy', '-q', src, zdst]
    if sblobs:
        args = ['copy', '-q', '--src-blob-dir', sblobs, '--dst-blob-dir', zb, src, zdst]
    p = zodbd(zodbd_bin, *args)
    if p.returncode != 0:
        return ['zodbd copy: exit %d: %s' % (p.returncode, p.stderr)]
    py_copy(src, pdst, sblobs, pb)
    a, b = read(pdst), read(zdst)
    if a != b:
        probs.append('Data.fs: zodbd %d bytes, ZODB/py %d, first difference at %d'
                     % (len(b), len(a), first_diff(a, b)))
    if read(src) != a and not is_packed(src):
        # (a packed SRC has prev pointers 0 that no copy reproduces: see
        # test_packed_source_not_identical)
        probs.append('unpacked source: ZODB/py copy differs from the source at %d'
                     % first_diff(read(src), a))
    if os.path.exists(pdst + '.index'):
        if not os.path.exists(zdst + '.index'):
            probs.append('no .index')
        elif read(pdst + '.index') != read(zdst + '.index'):
            probs.append('.index differs')
    if sblobs:
        # ZODB/py copies the blob of a record whose data is a blob pickle;
        # zodbd (docs/tools.md) the file of every record that has one,
        # also the copy ZODB/py's undo makes for a record without data
        # (an undone creation): test_undone_blob_creation_keeps_file.
        pf, zf, sf = blob_files(pb), blob_files(zb), blob_files(sblobs)
        nodata = nodata_blob_files(src, sf)
        want = dict(pf)
        for k in nodata:
            want[k] = sf[k]
        if want != zf:
            miss = sorted(set(want) - set(zf))
            extra = sorted(set(zf) - set(want))
            chg = sorted(k for k in set(want) & set(zf) if want[k] != zf[k])
            probs.append('blob dir differs: missing %s extra %s changed %s'
                         % (miss[:5], extra[:5], chg[:5]))
        ws = fs_snapshot(pdst, pb)
        gs = fs_snapshot(zdst, zb)
        for k in list(gs['blobs']):
            # (but where the oid's other record of that transaction has
            # the blob: an undo of its change and of its creation)
            if blob_rel(*k) in nodata and k not in ws['blobs']:
                del gs['blobs'][k]
        probs += diff_snapshots(ws, gs)
    return probs


def test_random_fs_copies(zodbd_bin, tmp_path):
    failures = []
    for seed in range(NSEEDS):
        d = str(tmp_path / ('s%d' % seed))
        blobs = seed % 2 == 0 or seed % 3 == 0
        src, sblobs, steps = build(d, seed, blobs=blobs, bigmib=(6 if STRESS else 2.5))
        probs = check_fs_copy(zodbd_bin, d, src, sblobs or None)
        if probs:
            failures.append('seed %d blobs=%s steps %s:\n  %s' % (seed, blobs, steps, '\n  '.join(probs)))
    assert not failures, '\n\n'.join(failures)


# ---------------------------------------------------------------------------
# (3) Other backends: zeo:// (zodbd serve) as SRC and as DST, a NEO cluster
# (zodbd-test neo-storage --with-master, on a FileStorage and on SQLite) as
# DST, then neo:// and sqlite: as SRC back into a FileStorage.

class Proc:
    def __init__(self, args, addr, log):
        self.log = log
        with open(log, 'ab') as f:
            self.p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT)
        wait_listening(addr, self.p, log)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode


def serve(zodbd_bin, path, d, read_only=False):
    if not os.path.exists(path):
        from ZODB.FileStorage import FileStorage
        FileStorage(path, create=True).close()
    port = free_port()
    args = [zodbd_bin, 'serve', '-a', '127.0.0.1:%d' % port, '-f', path]
    if read_only:
        args.append('--read-only')
    return Proc(args, ('127.0.0.1', port), os.path.join(d, 'serve-%d.log' % port)), 'zeo://127.0.0.1:%d' % port


def neo_node(zodbd_bin, zodbd_test_bin, backend, d, cluster='copy'):
    """A NEO cluster of one zodbd node (with the test master) on backend (a
    FileStorage path or sqlite:PATH); returns (proc, url) once it answers."""
    if not backend.startswith('sqlite:') and not os.path.exists(backend):
        from ZODB.FileStorage import FileStorage
        FileStorage(backend, create=True).close()
    mport = free_port()
    proc = Proc([zodbd_test_bin, 'neo-storage', '--cluster', cluster, '--read-write',
                 '--with-master', '127.0.0.1:%d' % mport, backend],
                ('127.0.0.1', mport), os.path.join(d, 'neo-%d.log' % mport))
    url = 'neo://%s@127.0.0.1:%d' % (cluster, mport)
    deadline = time.time() + 30
    while True:
        p = zodbd(zodbd_bin, 'hash', url, timeout=60)
        if p.returncode == 0:
            return proc, url
        if time.time() > deadline:
            proc.stop()
            raise AssertionError('NEO cluster not operational: %s' % p.stderr)
        time.sleep(0.2)


def has_garbage_extension(path):
    from ZODB.FileStorage import FileStorage
    from ZODB._compat import loads
    s = FileStorage(path, read_only=True)
    try:
        for t in s.iterator():
            if t.extension_bytes:
                try:
                    loads(t.extension_bytes)
                except Exception:
                    return True
        return False
    finally:
        s.close()


def semantic(snap):
    """A snapshot without what a NEO round trip may change: each
    transaction's records as the last record of each oid, sorted, without
    data_txn (NEO keeps the data's tid, not FileStorage's one link)."""
    txns = [(t[0], t[1], t[2], t[3], t[4], sorted({r[0]: (r[0], r[1], r[2]) for r in t[5]}.values()))
            for t in snap['txns']]
    return {'txns': txns, 'loads': snap['loads'], 'undo': snap['undo'], 'blobs': snap['blobs']}


def neo_view(snap):
    """snap as NEO can keep it: status 'p' read as ' ', and without the
    undoLog (the packed transactions then show in it:
    test_neo_copy_packed_status_warned; its sizes count one record per
    oid)."""
    txns = [(t[0], ' ') + t[2:] for t in snap['txns']]
    return dict(snap, txns=txns, undo=None)


def check_backends(zodbd_bin, zodbd_test_bin, d, src, neo=True):
    probs = []
    ref = os.path.join(d, 'ref.fs')
    py_copy(src, ref)
    want = read(ref)
    # zeo:// as SRC, against ZODB/py's FileStorage.copyTransactionsFrom(
    # ClientStorage) through the same server. ZEO sends each extension as a
    # dict (a garbage one as {}), re-pickled by both, byte for byte.
    srv, url = serve(zodbd_bin, src, d, read_only=True)
    try:
        out = os.path.join(d, 'from-zeo.fs')
        p = zodbd(zodbd_bin, 'copy', '-q', url, out)
        pyout = os.path.join(d, 'py-from-zeo.fs')
        py_copy_zeo(url, pyout)
        if p.returncode != 0:
            probs.append('copy %s: exit %d %s' % (url, p.returncode, p.stderr))
        else:
            probs += ['zeo SRC: %s' % x for x in diff_snapshots(fs_snapshot(pyout), fs_snapshot(out))]
    finally:
        srv.stop()
    # zeo:// as DST (a garbage extension cannot go through ZEO, where
    # ZODB/py's ClientStorage fails too: the copy must fail, not skip it)
    dst = os.path.join(d, 'to-zeo.fs')
    srv, url = serve(zodbd_bin, dst, d)
    try:
        p = zodbd(zodbd_bin, 'copy', '-q', src, url)
    finally:
        srv.stop()
    garbage = has_garbage_extension(src)
    if p.returncode != 0:
        if not garbage:
            probs.append('copy to %s: exit %d %s' % (url, p.returncode, p.stderr))
    elif garbage:
        probs.append('copy to %s of a garbage extension: exit 0' % url)
    else:
        probs += ['zeo DST: %s' % x for x in diff_snapshots(fs_snapshot(ref), fs_snapshot(dst))]
    if not neo:
        return probs
    wsem = neo_view(semantic(fs_snapshot(ref)))
    for kind in ('fs', 'sqlite'):
        nd = os.path.join(d, 'neo-' + kind)
        os.makedirs(nd)
        backend = os.path.join(nd, 'Data.fs') if kind == 'fs' else 'sqlite:' + os.path.join(nd, 'neo.sqlite')
        proc, url = neo_node(zodbd_bin, zodbd_test_bin, backend, nd)
        back = os.path.join(nd, 'back.fs')
        try:
            p = zodbd(zodbd_bin, 'copy', '-q', src, url)
            if p.returncode != 0:
                probs.append('copy to %s (%s): exit %d %s' % (url, kind, p.returncode, p.stderr))
                continue
            p = zodbd(zodbd_bin, 'copy', '-q', url, back)
            if p.returncode != 0:
                probs.append('copy %s (%s) back: exit %d %s' % (url, kind, p.returncode, p.stderr))
                continue
        finally:
            proc.stop()
        g = neo_view(semantic(fs_snapshot(back)))
        probs += ['neo(%s) -> fs: %s' % (kind, x) for x in diff_snapshots(wsem, g)]
        if kind == 'fs':
            g = neo_view(semantic(fs_snapshot(backend)))
            probs += ['neo(fs) node file: %s' % x for x in diff_snapshots(wsem, g)]
        else:
            back2 = os.path.join(nd, 'back-sqlite.fs')
            p = zodbd(zodbd_bin, 'copy', '-q', backend, back2)
            if p.returncode != 0:
                probs.append('copy %s: exit %d %s' % (backend, p.returncode, p.stderr))
            else:
                g = neo_view(semantic(fs_snapshot(back2)))
                probs += ['sqlite -> fs: %s' % x for x in diff_snapshots(wsem, g)]
    return probs


NBACK = int(os.environ.get('COPY_BACKEND_SEEDS') or (40 if STRESS else 4))


def test_random_backend_copies(zodbd_bin, zodbd_test_bin, tmp_path):
    failures = []
    for seed in range(1000, 1000 + NBACK):
        d = str(tmp_path / ('s%d' % seed))
        src, _, steps = build(d, seed, blobs=False, bigmib=1.5)
        probs = check_backends(zodbd_bin, zodbd_test_bin, d, src)
        if probs:
            failures.append('seed %d steps %s:\n  %s' % (seed, steps, '\n  '.join(probs)))
    assert not failures, '\n\n'.join(failures)


# ---------------------------------------------------------------------------
# Single cases.

def raw_history(path, script, blob_dir=None, wrapper=False):
    """Run script (Python, with fs, db, commit(stores, meta), undo(tids),
    pack_at(tid)) against a new FileStorage at path; returns what the
    script puts in `out`."""
    code = r'''
import sys, json, time
import transaction, ZODB
from ZODB.FileStorage import FileStorage
from ZODB.Connection import TransactionMetaData
from ZODB.utils import p64, u64, z64
from ZODB.TimeStamp import TimeStamp
from ZODB.POSException import POSKeyError
import zodbpickle.pickle as zp
from persistent.mapping import PersistentMapping
if sys.argv[3] == '1':
    from ZODB.blob import BlobStorage
    fs = BlobStorage(sys.argv[2], FileStorage(sys.argv[1], create=True))
else:
    fs = FileStorage(sys.argv[1], create=True, blob_dir=sys.argv[2] or None)
db = ZODB.DB(fs)
out = {}
def pickle(x):
    import io
    b = io.BytesIO(); p = zp.Pickler(b, 3); p.dump((PersistentMapping, None)); p.dump({'data': x}); return b.getvalue()
def commit(stores=(), user=b'', desc=b'', ext=None, deletes=()):
    t = TransactionMetaData(user, desc, ext)
    fs.tpc_begin(t)
    for oid, data in stores:
        try:
            serial = fs.load(oid)[1]
        except POSKeyError:
            serial = z64
        fs.store(oid, serial, data, '', t)
    for oid in deletes:
        fs.deleteObject(oid, fs.load(oid)[1], t)
    fs.tpc_vote(t)
    return fs.tpc_finish(t)
def undo(tids):
    import base64
    t = TransactionMetaData(b'', b'undo', None)
    fs.tpc_begin(t)
    for tid in tids:
        fs.undo(base64.encodebytes(tid).rstrip(b'\n'), t)
    fs.tpc_vote(t)
    return fs.tpc_finish(t)
def pack_at(tid):
    db.pack(TimeStamp(tid).timeTime() + 1e-6)
''' + script + r'''
db.close()
print(json.dumps(out))
'''
    p = subprocess.run([PY, '-c', code, path, blob_dir or '', '1' if wrapper else ''], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def test_neo_copy_undo_multiple_with_creation(zodbd_bin, zodbd_test_bin, tmp_path):
    """An undoMultiple of an object's modification and of its creation
    (ZODB/py writes two records of the oid in the undo transaction: a
    backpointer, then a record without data) could not be copied into NEO:
    `zodbd copy SRC neo://` failed with "storage 1 reports the serial T1,
    older than T2 the store is based on (not up to date)" (the client
    based the second store on the oid's last revision, NEO's storages on
    the first store's data serial). Read back, it is what ZODB/py's copy
    holds, but the undo log's sizes (NEO keeps one record per oid)."""
    d = str(tmp_path)
    src = os.path.join(d, 'src.fs')
    raw_history(src, r'''
commit([(z64, pickle(0))])
t1 = commit([(p64(1), pickle(1))])
t2 = commit([(p64(1), pickle(2))])
undo([t2, t1])   # records of oid 1: backpointer to t1, then no data
commit([(z64, pickle(3))])
''')
    ref = os.path.join(d, 'ref.fs')
    py_copy(src, ref)
    zodbd_ok(zodbd_bin, 'copy', '-q', src, os.path.join(d, 'fs.fs'))
    assert read(os.path.join(d, 'fs.fs')) == read(ref)
    nd = os.path.join(d, 'neo')
    os.makedirs(nd)
    proc, url = neo_node(zodbd_bin, zodbd_test_bin, os.path.join(nd, 'Data.fs'), nd)
    try:
        p = zodbd(zodbd_bin, 'copy', '-q', src, url)
        assert p.returncode == 0, 'copy into NEO: exit %d: %s' % (p.returncode, p.stderr)
        back = os.path.join(d, 'back.fs')
        zodbd_ok(zodbd_bin, 'copy', '-q', url, back)
    finally:
        proc.stop()
    want, got = semantic(fs_snapshot(ref)), semantic(fs_snapshot(back))
    def nosize(undo):
        return [[kv for kv in u if kv[0] != 'size'] for u in undo]
    assert nosize(want.pop('undo')) == nosize(got.pop('undo'))
    assert diff_snapshots(dict(want, undo=None), dict(got, undo=None)) == []


def packed_source(path):
    """A FileStorage packed at a mid time by ZODB/py: its first transactions
    have status 'p' (not undoable); returns their tids (hex)."""
    return raw_history(path, r'''
t0 = commit([(z64, pickle(0))])
t1 = commit([(z64, pickle(1)), (p64(1), pickle('a'))])
t2 = commit([(p64(1), pickle('b'))])
t3 = commit([(z64, pickle(3))])
pack_at(t2)
out['packed'] = [t.tid.hex() for t in fs.iterator() if t.status == 'p']
''')['packed']


def test_neo_copy_packed_status_warned(zodbd_bin, zodbd_test_bin, tmp_path):
    """Copying a packed FileStorage into NEO turned status 'p' into ' '
    without a word (exit 0): read back (neo:// -> FileStorage, and the
    node's own file), the packed transactions are undoable (undoLog lists
    them). NEO's commit carries no status (ZODB/py's copy into a
    FileStorage keeps 'p'): the copy now says so on stderr."""
    d = str(tmp_path)
    src = os.path.join(d, 'src.fs')
    packed = packed_source(src)
    assert packed
    ref = os.path.join(d, 'ref.fs')
    py_copy(src, ref)
    nd = os.path.join(d, 'neo')
    os.makedirs(nd)
    node = os.path.join(nd, 'Data.fs')
    proc, url = neo_node(zodbd_bin, zodbd_test_bin, node, nd)
    try:
        p = zodbd(zodbd_bin, 'copy', '-q', src, url)
        back = os.path.join(d, 'back.fs')
        if p.returncode == 0:
            zodbd_ok(zodbd_bin, 'copy', '-q', url, back)
    finally:
        proc.stop()
    assert p.returncode == 0, p.stderr
    assert "%d transactions of status 'p' (packed) were committed" % len(packed) in p.stderr, p.stderr
    want = fs_snapshot(ref)
    for path in (back, node):
        got = fs_snapshot(path)
        assert [t[0].hex() for t in got['txns']] == [t[0].hex() for t in want['txns']]
        assert [t[0].hex() for t in got['txns'] if t[1] == 'p'] == []


def test_zeo_source_extension_bytes(zodbd_bin, tmp_path):
    """`zodbd copy zeo://SRC DST`: ZEO sends each extension as a dict; the
    zeo client re-pickled it without a memo (zeo/client/load.go pickleDict),
    so DST's extension bytes (and transaction sizes, undoLog's 'size')
    differed from what ZODB/py's FileStorage.copyTransactionsFrom(ClientStorage)
    writes through the same server: ZODB/py's dumps(ext, 3), the bytes
    ZODB/py wrote in SRC."""
    d = str(tmp_path)
    src = os.path.join(d, 'src.fs')
    raw_history(src, r'''
commit([(z64, pickle(0))], user=b'u', desc=b'd', ext={'a': 'x', 'b': ['x', 'x'], 'c': {'x': 1}})
''')
    srv, url = serve(zodbd_bin, src, d, read_only=True)
    try:
        z = os.path.join(d, 'z.fs')
        zodbd_ok(zodbd_bin, 'copy', '-q', url, z)
        pyd = os.path.join(d, 'py.fs')
        py_copy_zeo(url, pyd)
    finally:
        srv.stop()
    assert read(pyd) == read(src)  # ZODB/py: the source's bytes
    assert read(z) == read(pyd), 'zodbd copy zeo:// differs from ZODB/py at %d' % first_diff(read(pyd), read(z))


def small_source(path, n=3):
    raw_history(path, r'''
for i in range(%d):
    commit([(z64, pickle(i)), (p64(1), pickle('x' * i))], user=b'u%%d' %% i)
''' % n)
    return txn_positions(read(path))


def txn_positions(data):
    pos, out = 4, []
    while pos + 23 <= len(data):
        tl = struct.unpack('>Q', data[pos + 8:pos + 16])[0]
        out.append(pos)
        pos += tl + 8
    return out


def patch(path, off, b):
    data = bytearray(read(path))
    data[off:off + len(b)] = b
    with open(path, 'wb') as f:
        f.write(data)
    for ext in ('.index',):
        if os.path.exists(path + ext):
            os.remove(path + ext)


def ntxns(path):
    from ZODB.FileStorage import FileStorage
    s = FileStorage(path, read_only=True)
    try:
        return [(t.tid, t.status) for t in s.iterator()]
    finally:
        s.close()


def test_torn_tail_is_not_copied_with_a_warning(zodbd_bin, tmp_path):
    """docs/tools.md: a torn tail of SRC is not copied, with a warning that
    says where SRC ends, exit 0 (as ZODB/py's copy of a truncated file).
    zodbd also takes for a torn tail a last transaction whose status is not
    ' ' or 'p' (fs1/scan.go tornTail: its writer writes the status last,
    once the data is durable), where ZODB/py copies it, bad status and
    all. The same status in any other transaction fails the copy."""
    d = str(tmp_path)
    src = os.path.join(d, 'src.fs')
    pos = small_source(src)
    want = ntxns(src)
    for name, damage in (('cut', lambda p: open(p, 'r+b').truncate(len(read(p)) - 5)),
                         ('status', lambda p: patch(p, pos[-1] + 16, b'\0'))):
        s = os.path.join(d, name + '.fs')
        shutil.copyfile(src, s)
        damage(s)
        dst = os.path.join(d, name + '-dst.fs')
        p = zodbd(zodbd_bin, 'copy', '-q', s, dst)
        assert p.returncode == 0, p.stderr
        assert 'truncated, possibly due to damaged records at %d' % pos[-1] in p.stderr, p.stderr
        assert ntxns(dst) == want[:-1]
    src2 = os.path.join(d, 'src2.fs')
    small_source(src2)
    patch(src2, pos[-2] + 16, b'\0')
    p = zodbd(zodbd_bin, 'copy', src2, os.path.join(d, 'dst2.fs'))
    assert p.returncode == 1 and 'invalid status' in p.stderr, p.stderr


def test_zero_tid_refused(zodbd_bin, tmp_path):
    """A damaged source whose last transaction's tid reads 0 (fs1 only
    warns: "time-stamp reduction"): copyTransactions passed Tid 0 to Begin,
    which means "assign a tid", so DST got that transaction under a fresh
    tid of the current time, exit 0 (docs: each transaction keeps its
    tid). ZODB/py's copy notices ("Time stamps out of order") and gives it
    a tid just after the previous one; zodbd copy fails, naming it."""
    d = str(tmp_path)
    src = os.path.join(d, 'src.fs')
    pos = small_source(src)
    want = ntxns(src)
    patch(src, pos[-1], b'\0' * 8)
    ref = os.path.join(d, 'ref.fs')
    py_copy(src, ref)  # "Time stamps out of order": tid = previous + 1
    dst = os.path.join(d, 'dst.fs')
    p = zodbd(zodbd_bin, 'copy', src, dst)
    assert p.returncode != 0 and 'tids must increase' in p.stderr, (p.returncode, p.stderr)
    assert [t for t, _ in ntxns(dst)] == [t for t, _ in want[:-1]]


def test_zeo_destination_extension_bytes(zodbd_bin, tmp_path):
    """`zodbd copy SRC zeo://` into `zodbd serve`: the server re-pickled the
    tpc_begin extension dict without Python's memo (zeo/methods.go
    encodeExtension), so DST's extension bytes and transaction lengths
    differed from SRC's. Into ZODB/py's server (runzeo), the same zodbd copy
    (and ZODB/py's ClientStorage.copyTransactionsFrom) gives SRC's bytes:
    runzeo pickles with ZODB's dumps(ext, 3)."""
    from zeoserver import Server, runzeo_cmd
    from ZODB.FileStorage import FileStorage
    if not runzeo_cmd():
        pytest.skip('no runzeo')
    d = str(tmp_path)
    src = os.path.join(d, 'src.fs')
    raw_history(src, r'''
commit([(z64, pickle(0))], user=b'u', desc=b'd', ext={'a': 'x', 'b': ['x', 'x'], 'c': {'x': 1}})
''')
    got = {}
    for kind in ('runzeo', 'zodbd'):
        dst = os.path.join(d, kind + '.fs')
        FileStorage(dst, create=True).close()
        s = Server(zodbd_bin, dst, d, kind=kind).start()
        try:
            zodbd_ok(zodbd_bin, 'copy', '-q', src, 'zeo://127.0.0.1:%d' % s.port)
        finally:
            s.stop()
        got[kind] = read(dst)
    assert got['runzeo'] == read(src)
    assert got['zodbd'] == got['runzeo'], 'zodbd serve wrote %d bytes, runzeo %d; first difference at %d' % (
        len(got['zodbd']), len(got['runzeo']), first_diff(got['runzeo'], got['zodbd']))


# ---------------------------------------------------------------------------
# More single cases.

def test_copy_of_packed_source_matches_zodbpy(zodbd_bin, tmp_path):
    """A source packed by ZODB/py has data records with a previous-record
    pointer of 0 (fspack writes them so) that no restore reproduces: both
    ZODB/py's copy and zodbd's differ from SRC there, and are identical to
    each other (docs/tools.md's "byte-identical to SRC" holds for an
    unpacked SRC only)."""
    d = str(tmp_path)
    src = os.path.join(d, 'src.fs')
    raw_history(src, r'''
t0 = commit([(z64, pickle(0))])
t1 = commit([(p64(1), pickle('a')), (p64(2), pickle('b'))])
t2 = commit([(p64(1), pickle('c'))])
t3 = commit([(p64(2), pickle('d'))])
pack_at(t2)
''')
    ref, dst = os.path.join(d, 'ref.fs'), os.path.join(d, 'dst.fs')
    py_copy(src, ref)
    zodbd_ok(zodbd_bin, 'copy', '-q', src, dst)
    assert read(dst) == read(ref)
    assert read(dst + '.index') == read(ref + '.index')


def test_big_transaction_copy_matches_zodbpy(zodbd_bin, tmp_path):
    """A transaction of 12 MiB (past the 8 MiB the spool keeps in memory),
    undone (backpointers), then its undo undone: byte for byte ZODB/py's
    copy, and SRC."""
    d = str(tmp_path)
    src = os.path.join(d, 'src.fs')
    raw_history(src, r'''
import os
commit([(z64, pickle(0))])
t1 = commit([(p64(i), pickle(os.urandom(4 << 20))) for i in (1, 2, 3)], user=b'big', ext={'x': b'\xff'})
t2 = commit([(p64(i), pickle(os.urandom(1 << 20))) for i in (1, 2, 3)])
u = undo([t2])
undo([u])
''')
    ref, dst = os.path.join(d, 'ref.fs'), os.path.join(d, 'dst.fs')
    py_copy(src, ref)
    zodbd_ok(zodbd_bin, 'copy', '-q', src, dst)
    assert read(dst) == read(ref) == read(src)
    assert read(dst + '.index') == read(ref + '.index')


def test_undone_blob_creation_keeps_file(zodbd_bin, tmp_path):
    """ZODB/py's undo of a blob's creation (ZODB.blob.BlobStorage over a
    FileStorage) writes a record without data and a copy of the blob file
    under the undo's tid (so that undoing the undo
    finds it). ZODB/py's copyTransactionsFrom skips that file (the record's
    data is not a blob pickle); zodbd copies every record's file, as its
    docs say. In zodbd's copy, undoing the undo gives the blob back, as in
    SRC (and in ZODB/py's copy too)."""
    from ZODB.FileStorage import FileStorage
    import ZODB
    import transaction
    d = str(tmp_path)
    src, sb = os.path.join(d, 'src.fs'), os.path.join(d, 'src.blobs')
    raw_history(src, r'''
from ZODB.blob import Blob
tm = transaction.TransactionManager()
c = db.open(tm)
c.root()['x'] = PersistentMapping()
tm.commit()
c.root()['x']['b'] = Blob(b'payload')
tm.commit()
db.undo(db.undoLog(0, 1)[0]['id'], tm.get())
tm.commit()
''', blob_dir=sb, wrapper=True)
    res = {}
    srcfiles = blob_files(sb)
    for who in ('zodbd', 'py'):
        dst, db_ = os.path.join(d, who + '.fs'), os.path.join(d, who + '.blobs')
        if who == 'zodbd':
            zodbd_ok(zodbd_bin, 'copy', '-q', '--src-blob-dir', sb, '--dst-blob-dir', db_, src, dst)
            # every file of SRC, also the one of the undo record
            assert blob_files(db_) == srcfiles
        else:
            py_copy(src, dst, sb, db_)
            assert len(blob_files(db_)) == len(srcfiles) - 1
        db = ZODB.DB(FileStorage(dst, blob_dir=db_))
        tm = transaction.TransactionManager()
        try:
            db.undo(db.undoLog(0, 1)[0]['id'], tm.get())
            tm.commit()
            c = db.open(tm)
            try:
                with c.root()['x']['b'].open() as f:
                    res[who] = f.read()
            except Exception as e:
                res[who] = type(e).__name__
        finally:
            db.close()
    assert res['zodbd'] == b'payload'
    assert res['py'] == b'payload'


def test_non_empty_destination_refused_unchanged(zodbd_bin, tmp_path):
    d = str(tmp_path)
    other = os.path.join(d, 'other.fs')  # its tids before src's
    raw_history(other, 'commit([(z64, pickle(9))])')
    src = os.path.join(d, 'src.fs')
    small_source(src)
    dst = os.path.join(d, 'dst.fs')
    zodbd_ok(zodbd_bin, 'copy', '-q', src, dst)
    before = read(dst), read(dst + '.index')
    p = zodbd(zodbd_bin, 'copy', '-q', src, dst)
    assert p.returncode == 1 and 'must be empty' in p.stderr, p.stderr
    assert (read(dst), read(dst + '.index')) == before
    # A destination that ends after SRC's first transaction but before its
    # last: refused too, nothing written.
    p = zodbd(zodbd_bin, 'copy', '-q', other, dst)
    assert p.returncode == 1 and 'must be empty' in p.stderr, p.stderr
    assert read(dst) == before[0]


def test_append_to_destination_before_source_matches_zodbpy(zodbd_bin, tmp_path):
    """DST that ends before SRC's first transaction: SRC's transactions are
    appended, as ZODB/py's copyTransactionsFrom appends them."""
    d = str(tmp_path)
    first = os.path.join(d, 'first.fs')
    raw_history(first, 'commit([(z64, pickle(0))], user=b"first")\ncommit([(p64(5), pickle(5))])')
    src = os.path.join(d, 'src.fs')
    raw_history(src, r'''
commit([(z64, pickle(1))])
t = commit([(p64(5), pickle('x')), (p64(6), pickle('y'))])
undo([t])
''')
    z, p = os.path.join(d, 'z.fs'), os.path.join(d, 'p.fs')
    shutil.copyfile(first, z)
    shutil.copyfile(first, p)
    zodbd_ok(zodbd_bin, 'copy', '-q', src, z)
    py_copy(src, p)
    assert read(z) == read(p)


def test_write_failure_is_a_clean_error(zodbd_bin, tmp_path):
    """DST's file system full (RLIMIT_FSIZE: EFBIG, as ENOSPC would): exit
    1 naming the write, DST a valid prefix of complete transactions (fstest
    passes), and a second run refuses (`must be empty`) rather than
    appending a gap."""
    d = str(tmp_path)
    src = os.path.join(d, 'src.fs')
    raw_history(src, r'''
import os
for i in range(6):
    commit([(p64(i), pickle(os.urandom(100000)))])
''')
    dst = os.path.join(d, 'dst.fs')
    p = subprocess.run(['/bin/bash', '-c', 'ulimit -f 300 && exec "$0" copy -q "$1" "$2"', zodbd_bin, src, dst],
                       capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    assert 'file too large' in p.stderr, p.stderr
    n = len(ntxns(dst))
    assert 0 < n < 6
    fst = subprocess.run([PY, '-m', 'ZODB.scripts.fstest', dst], capture_output=True, text=True)
    assert fst.returncode == 0, fst.stdout + fst.stderr
    assert [t for t, _ in ntxns(dst)] == [t for t, _ in ntxns(src)][:n]
    p = zodbd(zodbd_bin, 'copy', '-q', src, dst)
    assert p.returncode == 1 and 'must be empty' in p.stderr


def test_blob_write_failure_is_a_clean_error(zodbd_bin, tmp_path):
    """The blob files are copied (not linked) into a blob directory on
    another file system; the copy of one fails (EFBIG): exit 1, and DST has
    no record whose blob is missing."""
    shm = '/dev/shm'
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(str(tmp_path)).st_dev:
        pytest.skip('no second file system')
    from ZODB.FileStorage import FileStorage
    d = str(tmp_path)
    src, sb = os.path.join(d, 'src.fs'), os.path.join(d, 'src.blobs')
    raw_history(src, r'''
import os
from ZODB.blob import Blob
tm = transaction.TransactionManager()
c = db.open(tm)
for i in range(4):
    c.root()['b%d' % i] = Blob(os.urandom(200000 * (i + 1)))
    tm.commit()
''', blob_dir=sb)
    other = os.path.join(shm, 'zodbd-copy-%d' % os.getpid())
    os.makedirs(other)
    try:
        dst, dbd = os.path.join(d, 'dst.fs'), os.path.join(other, 'blobs')
        p = subprocess.run(['/bin/bash', '-c', 'ulimit -f 600 && exec "$0" copy -q --src-blob-dir "$1" --dst-blob-dir "$2" "$3" "$4"',
                            zodbd_bin, sb, dbd, src, dst], capture_output=True, text=True)
        assert p.returncode == 1 and 'file too large' in p.stderr, p.stderr
        s = FileStorage(dst, read_only=True, blob_dir=dbd)
        try:
            for t in s.iterator():
                for r in t:
                    if r.data and b'ZODB.blob' in r.data[:40]:
                        with open(s.loadBlob(r.oid, r.tid), 'rb') as f:
                            assert len(f.read()) > 0
        finally:
            s.close()
    finally:
        shutil.rmtree(other)


@pytest.mark.parametrize('what', ['txn-length', 'redundant-length', 'data-tloc', 'version-length', 'status'])
def test_damaged_source_fails_before_writing(zodbd_bin, tmp_path, what):
    """Damage inside SRC (not its last transaction): exit 1 with the
    position, and no DST written."""
    d = str(tmp_path)
    src = os.path.join(d, 'src.fs')
    pos = small_source(src, 4)
    t = pos[1]
    data = read(src)
    tl = struct.unpack('>Q', data[t + 8:t + 16])[0]
    dpos = t + 23 + 2  # user 'u1'
    off, b = {'txn-length': (t + 8, struct.pack('>Q', tl + 3)),
              'redundant-length': (t + tl, struct.pack('>Q', tl + 1)),
              'data-tloc': (dpos + 24, struct.pack('>Q', 7)),
              'version-length': (dpos + 32, b'\0\3'),
              'status': (t + 16, b'x')}[what]
    patch(src, off, b)
    dst = os.path.join(d, 'dst.fs')
    p = zodbd(zodbd_bin, 'copy', '-q', src, dst)
    assert p.returncode == 1, p.stderr
    assert 'src.fs' in p.stderr
    assert not os.path.exists(dst) or ntxns(dst) == []


def test_file_url(zodbd_bin, tmp_path):
    """`zodbd copy file:///abs/SRC DST` (and DST as file://): isURL treated
    the registered "file" scheme as a path, and openFS/fs1.Open then looked
    for a file literally named "file:///..." ("no such file or directory"),
    where the other commands that take a storage URL (`zodbd hash
    file://...`) open it."""
    d = str(tmp_path)
    src = os.path.join(d, 'src.fs')
    small_source(src)
    zodbd_ok(zodbd_bin, 'hash', 'file://' + src)
    p = zodbd(zodbd_bin, 'copy', '-q', 'file://' + src, os.path.join(d, 'a.fs'))
    assert p.returncode == 0, p.stderr
    p = zodbd(zodbd_bin, 'copy', '-q', src, 'file://' + os.path.join(d, 'b.fs'))
    assert p.returncode == 0, p.stderr
    assert read(os.path.join(d, 'a.fs')) == read(os.path.join(d, 'b.fs')) == read(src)


def test_oid_mark_carried_to_destination(zodbd_bin, tmp_path):
    """Oids a `zodbd serve` handed out without storing them (SRC.oid) are
    not handed out again by a server on the copy (docs: DST's oid mark is
    raised to SRC's)."""
    from ZEO.ClientStorage import ClientStorage
    from ZODB.utils import u64
    d = str(tmp_path)
    src = os.path.join(d, 'src.fs')
    small_source(src)
    srv, url = serve(zodbd_bin, src, d)
    try:
        cs = ClientStorage(('127.0.0.1', int(url.rsplit(':', 1)[1])), wait_timeout=10)
        given = [u64(cs.new_oid()) for _ in range(300)]
        cs.close()
    finally:
        srv.stop()
    dst = os.path.join(d, 'dst.fs')
    zodbd_ok(zodbd_bin, 'copy', '-q', src, dst)
    srv, url = serve(zodbd_bin, dst, d)
    try:
        cs = ClientStorage(('127.0.0.1', int(url.rsplit(':', 1)[1])), wait_timeout=10)
        new = u64(cs.new_oid())
        cs.close()
    finally:
        srv.stop()
    assert new > max(given)


def test_refused_blob_copy_leaves_nothing(zodbd_bin, tmp_path):
    """`zodbd copy --src-blob-dir S --dst-blob-dir D SRC neo://...` is
    refused ("blob directories are for FileStorage SRC and DST only"), but
    it was only after D was created (with .layout and tmp/): runCopy
    opened the blob directories before it looked at the URLs."""
    d = str(tmp_path)
    src, sb = os.path.join(d, 'src.fs'), os.path.join(d, 'sb')
    raw_history(src, r'''
from ZODB.blob import Blob
tm = transaction.TransactionManager()
c = db.open(tm)
c.root()['b'] = Blob(b'x')
tm.commit()
''', blob_dir=sb)
    db_ = os.path.join(d, 'db')
    p = zodbd(zodbd_bin, 'copy', '--src-blob-dir', sb, '--dst-blob-dir', db_, src, 'neo://x@127.0.0.1:1')
    assert p.returncode != 0 and 'FileStorage SRC and DST only' in p.stderr, p.stderr
    assert not os.path.exists(db_), os.listdir(db_)
