"""Blobs through `zodbd serve` against runzeo, with the stock
ClientStorage (its own blob cache, and a blob directory shared with the
server). Written by an audit with runzeo as the oracle.

- test_random_blob_history_as_runzeo: a seeded random differential of raw
  storage calls with blobs (storeBlob, loadBlob, loadBefore, stale
  serials, tpc_abort before and after the vote, undo and redo of blob
  transactions, pack with gc on and off and loads at every tid through a
  fresh client), on both servers, shared and non-shared blob
  directories: answers, exception classes, blob bytes and the server blob
  directory (files, layout, modes) after every step. (40 seeds matched
  in the audit, also under <zlibstorage> and a lawn layout.)
- test_shared_blob_dir_server_killed_mid_commits: zodbd SIGKILLed while
  clients of a shared blob directory commit; every acknowledged blob
  reads back after a restart.

Documented differences (docs/zeo-server.md, strict xfails):
- test_blob_store_then_plain_store_of_one_oid_keeps_the_blob: storeBlob
  then a plain store of the same oid in one transaction (a storage-API
  client; ZODB's Connection never does it): runzeo (and ZODB/py's
  FileStorage called directly) commit the record with its blob; zodbd
  replays the last store of an oid only, the blob file dropped.
- test_missing_data_fs_empties_the_blob_dir_as_runzeo: a storage created
  because its file is missing: ZODB/py (runzeo) empties the blob
  directory; zodbd keeps it (a mistyped path would lose every blob), the
  old database's files unreachable from the new one's records (other
  tids), removed by its first pack with GC.
"""
import hashlib
import os
import random
import sys
import tempfile
import time

import pytest
import transaction
import ZODB
import ZODB.blob
import ZODB.FileStorage
import ZODB.utils
from ZEO.ClientStorage import ClientStorage
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import POSKeyError
from ZODB.utils import p64, u64, z64

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zeoserver import Server, free_port, runzeo_cmd  # noqa: E402

pytestmark = pytest.mark.skipif(not runzeo_cmd(), reason='no runzeo')


def conf(port, tmp, gc=True):
    return ('<zeo>\naddress 127.0.0.1:%d\n</zeo>\n'
            '<filestorage 1>\npath %s\nblob-dir %s\npack-gc %s\n</filestorage>\n'
            % (port, os.path.join(tmp, 'Data.fs'), os.path.join(tmp, 'blobs'),
               'true' if gc else 'false'))


_PICKLES = []


def pickles():
    """(a Blob's record, a root holding oids 1..5, a root holding 1..2),
    as ZODB/py writes them."""
    if not _PICKLES:
        d = tempfile.mkdtemp(prefix='audit-blobs-pickles-')
        fs = ZODB.FileStorage.FileStorage(os.path.join(d, 'x.fs'), blob_dir=os.path.join(d, 'b'))
        db = ZODB.DB(fs)
        tm = transaction.TransactionManager()
        r = db.open(tm).root()
        for i in range(1, 6):
            r['b%d' % i] = ZODB.blob.Blob(b'')
        tm.commit()
        blob, root_all = fs.load(p64(1))[0], fs.load(z64)[0]
        for i in range(3, 6):
            del r['b%d' % i]
        tm.commit()
        _PICKLES.extend([blob, root_all, fs.load(z64)[0]])
        db.close()
    return _PICKLES


def exname(e):
    return type(e).__module__ + '.' + type(e).__name__


def mkfile(cs, data):
    fd, p = tempfile.mkstemp(dir=cs.temporaryDirectory())
    os.write(fd, data)
    os.close(fd)
    return p


def snapshot(blobs, tids):
    """The server blob directory: relative path (tids as their commit
    index) -> (md5 of the bytes, mode); tmp/ counted, not listed."""
    names = {ZODB.utils.tid_repr(t): i for t, i in tids.items()}
    out = {}
    for dp, dns, fns in os.walk(blobs):
        rel = os.path.relpath(dp, blobs)
        for fn in fns:
            p = os.path.join(dp, fn)
            if fn == '.removed':  # ZODB/py's pack log, empty after a pack
                continue
            if rel == 'tmp' or rel.startswith('tmp' + os.sep):
                out['tmp#'] = out.get('tmp#', 0) + 1
                continue
            name = fn
            if fn.endswith('.blob'):
                name = 'T%s.blob' % names.get(fn[:-5], fn[:-5])
            elif '.tmp' in fn:
                name = 'upload.tmp'
            with open(p, 'rb') as f:
                out[os.path.join(rel, name)] = (hashlib.md5(f.read()).hexdigest(),
                                                oct(os.stat(p).st_mode & 0o777))
    return out


class Run:
    """One server (zodbd or runzeo) with a blob directory, and a raw
    ClientStorage on it."""

    def __init__(self, kind, zodbd_bin, tmp, shared, gc=True):
        self.tmp = tempfile.mkdtemp(prefix=kind + '-', dir=str(tmp))
        self.shared = shared
        port = free_port()
        self.srv = Server(zodbd_bin, None, self.tmp, kind=kind, conf=conf(port, self.tmp, gc),
                          port=port).start()
        self.blobs = os.path.join(self.tmp, 'blobs')
        self.cs = self.client()
        self.tids = {}  # tid -> commit index (1, 2, ...)
        self.log = []

    def client(self):
        bd = self.blobs if self.shared else tempfile.mkdtemp(prefix='cache-', dir=self.tmp)
        return ClientStorage(self.srv.addr, blob_dir=bd, shared_blob_dir=self.shared,
                             wait_timeout=10)

    def close(self):
        self.cs.close()
        assert self.srv.stop() == 0

    def commit(self, label, ops, abort_at=None):
        """ops: ('blob', oid, serial, bytes), ('store', oid, serial,
        data), ('undo', label). Logs the outcome; returns the tid or
        None."""
        blob_pickle = pickles()[0]
        cs, t = self.cs, TransactionMetaData(description=label)
        try:
            cs.tpc_begin(t)
            for op in ops:
                if op[0] == 'blob':
                    cs.storeBlob(p64(op[1]), op[2], blob_pickle, mkfile(cs, op[3]), '', t)
                elif op[0] == 'store':
                    cs.store(p64(op[1]), op[2], op[3], '', t)
                else:
                    ids = [e['id'] for e in cs.undoLog(0, 1000)
                           if e['description'] in (op[1], op[1].encode())]
                    cs.undo(ids[0], t)
            if abort_at == 'before_vote':
                cs.tpc_abort(t)
                self.log.append((label, 'aborted'))
                return None
            cs.tpc_vote(t)
            if abort_at == 'after_vote':
                cs.tpc_abort(t)
                self.log.append((label, 'aborted after vote'))
                return None
            tid = cs.tpc_finish(t)
        except Exception as e:
            self.log.append((label, exname(e)))
            cs.tpc_abort(t)
            return None
        self.tids[tid] = len(self.tids) + 1
        self.log.append((label, 'T%d' % self.tids[tid]))
        return tid

    def loads(self, label, cs=None, oids=range(6)):
        cs = cs or self.cs
        for oid in oids:
            for tid, i in sorted(self.tids.items(), key=lambda x: x[1]):
                try:
                    with open(cs.loadBlob(p64(oid), tid), 'rb') as f:
                        got = hashlib.md5(f.read()).hexdigest()
                except Exception as e:
                    got = exname(e)
                try:
                    r = cs.loadBefore(p64(oid), p64(u64(tid) + 1))
                    before = r and (self.tids.get(r[1]), self.tids.get(r[2]))
                except Exception as e:
                    before = exname(e)
                self.log.append((label, oid, i, got, before))

    def snap(self, label):
        self.log.append((label, snapshot(self.blobs, self.tids)))


def both(zodbd_bin, tmp_path, shared, fn, gc=True):
    """fn(run) on runzeo and on zodbd; their logs."""
    logs = {}
    for kind in ('runzeo', 'zodbd'):
        r = Run(kind, zodbd_bin, tmp_path, shared, gc)
        try:
            fn(r)
        finally:
            r.close()
        logs[kind] = r.log
    return logs['runzeo'], logs['zodbd']


def assert_same(want, got):
    for i, (a, b) in enumerate(zip(want, got)):
        assert b == a, 'step %d differs: runzeo %r, zodbd %r' % (i, a, b)
    assert len(got) == len(want)


# -- A blob store and a plain store of one oid in one transaction ---------

@pytest.mark.xfail(strict=True, reason='documented difference: docs/zeo-server.md, What the server does (two stores of one oid)')
@pytest.mark.parametrize('shared', [False, True], ids=['cache', 'shared'])
def test_blob_store_then_plain_store_of_one_oid_keeps_the_blob(zodbd_bin, tmp_path, shared):
    """storeBlob then a plain store (a Blob's record) of the same oid in
    one transaction: runzeo replays the plain stores first and the blob
    stores after them, so the record committed has its blob file; zodbd
    replays only the last store and removes the blob's file, so the
    committed Blob record has no blob (loadBlob: POSKeyError) and an empty
    oid directory is left."""
    blob, root_all, _ = pickles()

    def fn(r):
        [r.cs.new_oid() for _ in range(5)]
        r.commit('t1', [('store', 0, z64, root_all), ('blob', 4, z64, b'four'),
                        ('store', 4, z64, blob)])
        r.loads('L', oids=[4])
        r.snap('S')
    assert_same(*both(zodbd_bin, tmp_path, shared, fn))


# -- A seeded random differential with blobs -------------------------------

def random_history(seed, nsteps, gc):
    """The steps of one seeded history, as a function of a Run. It keeps
    off what differs by design or by runzeo's own quirks: stores never
    name an oid twice in one transaction (runzeo replays its blob stores
    in reverse; see the test above for a blob and a plain store); with GC
    the root keeps every object (docs/zeo-server.md: an object unreachable
    at the pack time and reachable again keeps its blob in zodbd); undo
    never takes a transaction before the last pack time (runzeo writes
    every blob record twice, so its pack marks the transaction packed and
    its undoLog drops it where zodbd's and ZODB/py's pack leave it) nor
    the first one (a missing root: ZODB/py's pack fails)."""
    blob, root_all, root_some = pickles()

    def fn(r):
        rnd = random.Random(seed)
        cs = r.cs
        [cs.new_oid() for _ in range(5)]
        labels, times = [], []
        undo_from = 1  # labels[undo_from:] may be undone

        def cur(oid):
            try:
                return cs.load(p64(oid))[1]
            except POSKeyError:
                return z64

        def committed(label, tid):
            if tid:
                labels.append(label)
                times.append(time.time())
                time.sleep(0.01)

        committed('init', r.commit('init', [('store', 0, z64, root_all)] +
                                   [('blob', k, z64, b'init%d' % k) for k in range(1, 6)]))
        for i in range(nsteps):
            x = rnd.random()
            if x < 0.67:
                abort_at = None if x < 0.55 else 'before_vote' if x < 0.62 else 'after_vote'
                ops = []
                for _ in range(rnd.randint(1, 3)):
                    if rnd.random() < 0.15:
                        if not gc and not any(o[1] == 0 for o in ops):
                            ops.append(('store', 0, cur(0), rnd.choice([root_all, root_all, root_some])))
                        continue
                    oid = rnd.randint(1, 5)
                    if any(o[1] == oid for o in ops):
                        continue
                    serial = cur(oid)
                    if rnd.random() < 0.15 and r.tids:
                        serial = rnd.choice(sorted(r.tids) + [z64])  # stale
                    ops.append(('blob', oid, serial,
                                b'%d-%d-' % (seed, i) + b'x' * rnd.choice([0, 5, 70000])))
                tid = r.commit('s%d' % i, ops, abort_at)
                committed('s%d' % i, tid)
            elif x < 0.85:
                if len(labels) > undo_from:
                    lab = rnd.choice(labels[undo_from:])
                    committed('u%d' % i, r.commit('u%d' % i, [('undo', lab)]))
            elif x < 0.92:
                k = rnd.randrange(len(times))
                undo_from = max(undo_from, k + 1)
                try:
                    cs.pack(times[k], wait=True)
                    r.log.append(('pack', i, k, 'ok'))
                except Exception as e:
                    r.log.append(('pack', i, k, exname(e)))
                c2 = r.client()  # a fresh cache: the server's files
                r.loads('P%d' % i, c2)
                c2.close()
            else:
                r.loads('L%d' % i)
            r.snap('S%d' % i)
        c2 = r.client()
        r.loads('END', c2)
        c2.close()
    return fn


@pytest.mark.parametrize('seed', [22, 31])  # GC on, off
@pytest.mark.parametrize('shared', [False, True], ids=['cache', 'shared'])
def test_random_blob_history_as_runzeo(zodbd_bin, tmp_path, shared, seed):
    """Passes: answers, exception classes, blob bytes, loads at every tid
    and the server blob directory after every step are runzeo's."""
    gc = seed % 2 == 0
    assert_same(*both(zodbd_bin, tmp_path, shared, random_history(seed, 40, gc), gc=gc))


# -- zodbd SIGKILLed while clients of a shared blob directory commit -------

WRITER = r'''
import os, sys, tempfile, hashlib
from ZEO.ClientStorage import ClientStorage
from ZODB.Connection import TransactionMetaData
from ZODB.utils import z64
port, blobs, seed, blob = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), bytes.fromhex(sys.argv[4])
cs = ClientStorage(('127.0.0.1', port), blob_dir=blobs, shared_blob_dir=True, wait_timeout=2)
i = 0
while True:
    oids = [cs.new_oid() for _ in range(3)]
    t = TransactionMetaData()
    cs.tpc_begin(t)
    sums = []
    for oid in oids:
        d = b'%d-%d-' % (seed, i) + os.urandom([100, 200000, 2000000][i % 3])
        i += 1
        fd, p = tempfile.mkstemp(dir=cs.temporaryDirectory())
        os.write(fd, d)
        os.close(fd)
        cs.storeBlob(oid, z64, blob, p, '', t)
        sums.append((oid.hex(), hashlib.md5(d).hexdigest()))
    cs.tpc_vote(t)
    tid = cs.tpc_finish(t)
    for o, m in sums:
        print(o, tid.hex(), m, flush=True)
'''


def test_shared_blob_dir_server_killed_mid_commits(zodbd_bin, tmp_path):
    """Passes: zodbd SIGKILLed while two clients of a shared blob
    directory commit blobs; after a restart every blob whose tpc_finish
    returned reads back with its bytes, and every blob file of a committed
    tid is a record's (a file of a tid that never committed may be left:
    docs/zeo-server.md)."""
    import signal
    import subprocess
    tmp = str(tmp_path)
    port = free_port()
    srv = Server(zodbd_bin, None, tmp, conf=conf(port, tmp), port=port).start()
    blobs = os.path.join(tmp, 'blobs')
    ws = [subprocess.Popen([sys.executable, '-c', WRITER, str(port), blobs, str(w), pickles()[0].hex()],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for w in range(2)]
    try:
        time.sleep(2.5)
        srv.stop(signal.SIGKILL)
        acked = []
        for w in ws:
            out = w.communicate(timeout=60)[0].decode()
            acked += [line.split() for line in out.splitlines() if line.strip()]
    finally:
        for w in ws:
            if w.poll() is None:
                w.kill()
                w.wait()
    assert len(acked) > 10, 'too few commits before the kill'
    srv.start()
    try:
        cs = ClientStorage(srv.addr, blob_dir=blobs, shared_blob_dir=True)
        try:
            for o, t, m in acked:
                with open(cs.loadBlob(bytes.fromhex(o), bytes.fromhex(t)), 'rb') as f:
                    assert hashlib.md5(f.read()).hexdigest() == m, (o, t)
            records = {(r.oid, txn.tid) for txn in cs.iterator() for r in txn}
            last = cs.lastTransaction()
        finally:
            cs.close()
    finally:
        assert srv.stop() == 0
    for dp, _, fns in os.walk(blobs):
        rel = os.path.relpath(dp, blobs)
        for fn in fns:
            if not fn.endswith('.blob'):
                continue
            oid = p64(int(''.join(x[2:] for x in rel.split(os.sep)), 16))
            tid = p64(int(fn[:-len('.blob')], 16))
            if tid <= last:
                assert (oid, tid) in records, os.path.join(rel, fn)


# -- A storage created because its file is missing -------------------------

@pytest.mark.xfail(strict=True, reason='documented difference: docs/zeo-server.md, Blobs (a missing Data.fs leaves the blob directory as it is)')
@pytest.mark.parametrize('layout', ['bushy', 'lawn'])
def test_missing_data_fs_empties_the_blob_dir_as_runzeo(zodbd_bin, tmp_path, layout):
    """A <filestorage> whose file is missing is created (without `create
    true`); ZODB/py's FileStorage then counts as created and empties its
    blob directory (FileStorage.__init__: create = 1 on ENOENT, then
    remove_committed_dir(blob_dir)), so runzeo starts with a fresh blob
    directory (bushy). zodbd empties it only with an explicit `create
    true`: the blob files of the database whose Data.fs was removed stay,
    and loadBlob serves them; the old layout stays too."""
    got = {}
    for kind in ('runzeo', 'zodbd'):
        tmp = tempfile.mkdtemp(prefix=kind + '-', dir=str(tmp_path))
        blobs = os.path.join(tmp, 'blobs')
        # The blob directory of an earlier database (its Data.fs gone).
        fs = ZODB.FileStorage.FileStorage(os.path.join(tmp, 'old.fs'), blob_dir=blobs)
        if layout == 'lawn':
            fs.close()
            for n in os.listdir(blobs):
                if n != 'tmp':
                    os.remove(os.path.join(blobs, n))
            with open(os.path.join(blobs, '.layout'), 'w') as f:
                f.write('lawn')
            fs = ZODB.FileStorage.FileStorage(os.path.join(tmp, 'old.fs'), blob_dir=blobs)
        db = ZODB.DB(fs)
        tm = transaction.TransactionManager()
        root = db.open(tm).root()
        root['b'] = ZODB.blob.Blob(b'old database')
        tm.commit()
        oid, tid = root['b']._p_oid, fs.lastTransaction()
        db.close()
        port = free_port()
        srv = Server(zodbd_bin, None, tmp, kind=kind, conf=conf(port, tmp), port=port).start()
        try:
            cs = ClientStorage(srv.addr, blob_dir=os.path.join(tmp, 'cache'))
            try:
                with open(cs.loadBlob(oid, tid), 'rb') as f:
                    load = f.read()
            except Exception as e:
                load = exname(e)
            cs.close()
        finally:
            assert srv.stop() == 0
        got[kind] = (load, snapshot(blobs, {}))
    assert got['zodbd'] == got['runzeo']
