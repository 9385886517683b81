"""The server killed under contention: 4 client processes (the stock
ZEO.ClientStorage and ZODB.DB) commit the catalog workload of
tests/zeo_contention_app.py through one server while the test SIGKILLs
the server at a random moment of their commits and starts it again on the
same file and port, ZODBD_ZEO_KILLS times (default 8).

A commit cut by the kill raises ClientDisconnected in the client, which
cannot know whether it committed (its tpc_finish may have reached the
server, the answer not): once reconnected, the client reads its own
document, which only that commit sets to its number, and counts the
commit as done or tries it again. Then, as in test_zeo_contention: no
other exception reached the application, nothing was logged as an error
but the transaction package's report of the cut tpc_finish, no
acknowledged commit is lost and no commit counted as failed is in the
file (the catalog's trees are exactly the replay of the counted commits
in tid order, its Lengths agree), every client reconnected each time
and kept its cache (ZEO's client refuses a server whose last transaction
is older than what it has seen, and drops its cache when the server
cannot list what changed since), and the file passes fstest.

With a blob in every commit (test_zodbd_killed_with_blobs, 30 kB
uploaded through the server, kills landing in uploads), also: each
client's last blob reads back, ZODB/py's FileStorage on the same files
finds every committed document revision's blob with the data its commit
stored, and no upload is left in the blob directory's tmp (the restarted
server removes those of the killed one).

The same run against runzeo (fewer kills: it starts slowly) shows that
the test itself is sound.
"""
import os
import re
import random
import signal
import threading
import time

import pytest

import zeo_contention_app as app
from test_zeo_contention import summary
from testutil import fstest
from zeoserver import Server, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
NPROCS = 4
KILLS = int(os.environ.get('ZODBD_ZEO_KILLS', '8'))

# The server remembers every transaction of the run for getInvalidations
# (and finds them in the file when it restarts): a client that reconnects
# keeps its cache, and "dropping stale cache" is a failure. The same
# zeo.conf serves both kinds (the file is created when missing).
QUEUE = 100000
CONF = '''
<zeo>
  address 127.0.0.1:%(port)d
  invalidation-queue-size %(queue)d
</zeo>
<filestorage 1>
  path %(path)s
  %(blobs)s
</filestorage>
'''

# What a kill makes the clients log, and nothing else: the transaction
# package's report of a tpc_finish that raised (CRITICAL), ZODB's of a
# load cut by the disconnection (ERROR, then raised), the server's answer
# to a vote or finish sent on the new connection for a transaction begun
# on the one killed (StorageTransactionError(None, txn): no transaction
# there; runzeo's _check_tid answers the same), and the stock client's
# own error when a one-way call of that transaction (call_async, or
# call_async_iter for a blob's upload) finds its protocol gone (an
# AttributeError in asyncio's callback: ClientIO calls self.protocol's
# method, and the protocol is None once the connection is lost).
EXPECTED_LOG = [re.compile(p) for p in (
    r'^A storage error occurred during the second phase of the two-phase commit',
    r"^Couldn't load state for ",
    r' from server: ZODB\.POSException\.StorageTransactionError:\(None, \d+\)',
)]
ONE_WAY = re.compile(r'^Exception in callback ClientIO\.(call_async|call_async_iter)\(')


def expected(e):
    """Whether the logged record e is one that a kill makes a client log."""
    m = ONE_WAY.match(e['msg'])
    if m:
        return "'NoneType' object has no attribute '%s'" % m.group(1) in (e.get('exc') or '')
    return any(p.search(e['msg']) for p in EXPECTED_LOG)


def killer(srv, kills, rng, stop_file, failures):
    """Kill srv (SIGKILL) kills times, each at a random moment once the
    clients commit again after the previous restart, and start it again;
    then create stop_file."""
    try:
        for _ in range(kills):
            size = os.path.getsize(srv.path)
            deadline = time.time() + 30
            # Commits are going on: the file grew since the restart.
            while os.path.getsize(srv.path) <= size:
                if time.time() > deadline:
                    raise RuntimeError('no commit within 30 s of a restart')
                time.sleep(0.02)
            time.sleep(rng.uniform(0, 0.3))
            srv.stop(signal.SIGKILL)
            srv.start()
    except BaseException as e:
        failures.append(e)
    finally:
        open(stop_file, 'w').close()


def run(kind, zodbd_bin, tmp_path, monkeypatch, kills, blobs=False):
    monkeypatch.setenv('PYTHONPATH', HERE)  # runzeo imports the app's classes
    path = str(tmp_path / 'Data.fs')
    blob_dir = str(tmp_path / 'blobs')
    port = free_port()
    conf = CONF % {'port': port, 'queue': QUEUE, 'path': path,
                   'blobs': 'blob-dir %s' % blob_dir if blobs else ''}
    srv = Server(zodbd_bin, path, tmp_path, kind=kind, port=port, conf=conf).start()
    cfg = {'addr': srv.addr, 'workload': 'catalog', 'nprocs': NPROCS}
    if blobs:
        cfg['blob_dir'] = str(tmp_path / 'client-blobs')
    stop_file = str(tmp_path / 'stop')
    try:
        app.run_setup(cfg)
        failures = []
        t = threading.Thread(target=killer, args=(srv, kills, random.Random(kills), stop_file, failures))
        t.start()
        try:
            # A kill cycle takes 1-2 s (the stock client waits 1-2 s to
            # reconnect).
            reports = app.run_clients(srv.addr, 'catalog', NPROCS, ssl=False, timeout=30 + 5 * kills,
                                      extra={'stop_file': stop_file, 'restarts': True,
                                             'blob_dir': cfg.get('blob_dir')})
        except RuntimeError as e:
            # Clients stuck: what they logged at CRITICAL is in the
            # captured stderr.
            failures.append(e)
        finally:
            open(stop_file, 'w').close()
            t.join()
        assert not failures, '%s\nserver log:\n%s' % (failures, srv.output()[-3000:])
        for r in reports:
            r['logged'] = [e for e in r['logged'] if not expected(e)]
        db = app.open_db(cfg)
        try:
            root = db.open().root()
            problems = app.problems(root, 'catalog', reports)
            if blobs:
                problems += blob_problems(root, reports)
        finally:
            db.close()
        ok = sum(r['ok'] for r in reports)
        if problems:
            pytest.fail('%s, %d kills, %d processes: %d ok, %d problems\n%s'
                        % (kind, kills, NPROCS, ok, len(problems), summary(problems)), pytrace=False)
        # The kills cut commits, and the clients committed between them.
        assert sum(r['disconnects'] for r in reports) >= kills
        assert ok >= kills
        rc = srv.stop()
        assert rc == 0, srv.output()[-4000:]
        assert 'panic:' not in srv.output(), srv.output()[-4000:]
        fstest(path)
        if blobs:
            check_blob_files(path, blob_dir)
        return reports
    finally:
        srv.stop()


def blob_problems(root, reports):
    """Each client's document holds the blob of its last commit."""
    out = []
    for r in reports:
        if not r['log']:
            continue
        p = r['proc']
        doc = root['doc-%d' % p]
        with doc['blob'].open('r') as f:
            got = f.read()
        if got != app.blob_data(p, doc['i']):
            out.append('client %d: the blob of commit %d holds %r...' % (p, doc['i'], got[:40]))
    return out


def check_blob_files(path, blob_dir):
    """ZODB/py's FileStorage on the same files finds the blob file of
    every document revision with the data its commit stored (the blob of
    process p's commit i is blob_data(p, i)); no upload is left in the blob
    directory's tmp."""
    import io
    import pickle
    import ZODB
    import ZODB.FileStorage

    def state(data):
        u = pickle.Unpickler(io.BytesIO(data))
        u.persistent_load = lambda ref: ref
        u.load()  # the class
        return u.load()
    fs = ZODB.FileStorage.FileStorage(path, blob_dir=blob_dir, read_only=True)
    db = ZODB.DB(fs)
    try:
        root = db.open().root()
        docs = {root[k]._p_oid: int(k[4:]) for k in root if k.startswith('doc-')}
        n = 0
        for t in fs.iterator():
            for r in t:
                if r.oid not in docs or not r.data:
                    continue
                d = state(r.data)['data']
                if 'blob' not in d:
                    continue  # the setup's
                ref = d['blob']
                oid = ref[0] if isinstance(ref, tuple) else ref
                with open(fs.loadBlob(oid, t.tid), 'rb') as f:
                    got = f.read()
                want = app.blob_data(docs[r.oid], d['i'])
                assert got == want, 'doc-%d commit %d: blob %r@%r holds %r...' % (
                    docs[r.oid], d['i'], oid, t.tid, got[:40])
                n += 1
        assert n > 0
    finally:
        db.close()
    left = [f for f in os.listdir(os.path.join(blob_dir, 'tmp')) if f.startswith('zodbd-')]
    assert not left, left


def test_zodbd_killed_under_contention(zodbd_bin, tmp_path, monkeypatch):
    run('zodbd', zodbd_bin, tmp_path, monkeypatch, KILLS)


def test_zodbd_killed_with_blobs(zodbd_bin, tmp_path, monkeypatch):
    """The same with a blob in every commit (30 kB, uploaded through the
    server): every acknowledged blob is there with its data."""
    run('zodbd', zodbd_bin, tmp_path, monkeypatch, KILLS, blobs=True)


def test_runzeo_reference(zodbd_bin, tmp_path, monkeypatch):
    run('runzeo', zodbd_bin, tmp_path, monkeypatch, 2)
