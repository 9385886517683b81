"""ZEO under contention, zodbd against runzeo as the oracle.

Deterministic two-client conflicts (tests/contention_oracle_worker.py,
SCENARIOS) on BTrees of several families (one inline bucket, several
buckets that split), TreeSets, OOSet, BTrees.Length, a Counter resolved by
Python, PersistentMappings, readCurrent and a catalog of IITreeSets: the
outcome of the conflicting commit (committed, or the exception with its
oid, serials and class_name) and the final state must be those runzeo
gives; every client's view must be coherent after sync.

Random multi-process runs (several client processes, ConflictError retried)
must keep the invariants on both servers: each Length equals its tree's
size, counters equal their successful increments, the trees hold exactly
what the successful commits did; also with the server SIGKILLed and
restarted in the middle.

What it found (fixed):

- test_conflict_matches_runzeo[*-pm_then_tree_refused]: a transaction with
  a stale store nobody can resolve (a PersistentMapping), then a stale
  BTree store that BTrees' rules refuse: runzeo's ConflictError named the
  first (the store that failed first), zodbd's the later BTree (fs1
  checkConflicts returned a native refusal at once, ahead of the earlier
  conflicts it would have returned to the client).
- test_stale_store_and_delete_matches_runzeo[*-store-delete]: likewise a
  stale store then a stale deleteObject: runzeo named the store, zodbd the
  delete (zeo/txn.go's vote picked the first delete among the conflicts).

Deliberate differences (xfail strict): zodbd holds the commit lock while a
client resolves a conflict of a class it does not resolve natively, so a
client slow in its _p_resolveConflict stops every commit meanwhile; an
undo of a counter changed later fails (docs/zeo-server.md).
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import contention_oracle_worker as w
from testutil import fstest
from zeoserver import Server

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def _pythonpath(monkeypatch):
    """runzeo (and the workers) import zeo_contention_app and
    contention_oracle_worker: this directory on PYTHONPATH, for the test."""
    monkeypatch.setenv('PYTHONPATH', HERE)


def start(kind, zodbd_bin, tmp, extra=(), msgpack=False):
    os.makedirs(tmp, exist_ok=True)
    path = os.path.join(tmp, 'Data.fs')
    x = list(extra) + (['--create'] if kind == 'zodbd' else [])
    return Server(zodbd_bin, path, tmp, kind=kind, extra=x, msgpack=msgpack).start()


# The scenarios over msgpack too with ZODBD_STRESS=1 (the suite's time).
STRESS = os.environ.get('ZODBD_STRESS') == '1'


@pytest.fixture(scope='module', params=['pickle', 'msgpack'] if STRESS else ['pickle'])
def servers(zodbd_bin, tmp_path_factory, request):
    old = os.environ.get('PYTHONPATH')
    os.environ['PYTHONPATH'] = HERE  # runzeo imports zeo_contention_app.Counter
    base = tmp_path_factory.mktemp('contention')
    mp = request.param == 'msgpack'
    srvs = {k: start(k, zodbd_bin, str(base / k), msgpack=mp) for k in ('runzeo', 'zodbd')}
    try:
        yield srvs
    finally:
        for s in srvs.values():
            s.stop()
        if old is None:
            os.environ.pop('PYTHONPATH', None)
        else:
            os.environ['PYTHONPATH'] = old


@pytest.mark.parametrize('name', sorted(w.SCENARIOS))
def test_conflict_matches_runzeo(servers, name):
    ref = w.run_scenario(servers['runzeo'].addr, name)
    got = w.run_scenario(servers['zodbd'].addr, name)
    assert ref['problems'] == [] and ref['views'] == {}, ref
    assert got['problems'] == [], got['problems']
    assert got['views'] == {}, got['views']
    assert got['outcome'] == ref['outcome'], (got['outcome'], ref['outcome'])
    assert got['final'] == ref['final']


# -- random multi-process contention -----------------------------------------

NPROCS = int(os.environ.get("AUDITC_NPROCS", "4"))


def file_txns(path):
    """(tid, note) of every transaction of the Data.fs at path, in order."""
    from ZODB.FileStorage import FileStorage
    from ZODB.utils import u64
    fs = FileStorage(path, read_only=True)
    try:
        return [(u64(t.tid), t.description.decode()) for t in fs.iterator()]
    finally:
        fs.close()


def file_view(path):
    import ZODB
    from ZODB.FileStorage import FileStorage
    db = ZODB.DB(FileStorage(path, read_only=True))
    try:
        return w.random_view(db.open())
    finally:
        db.close()


def run_random(kind, zodbd_bin, tmp_path, seed, commits, kill_after=None, duration=90, hot=0, cache=False,
               msgpack=False):
    wenv = dict(os.environ, AUDITC_HOT=str(hot))
    if cache:
        wenv['AUDITC_CACHE'] = str(tmp_path / 'caches')
        os.makedirs(wenv['AUDITC_CACHE'], exist_ok=True)
    tmp = str(tmp_path / kind)
    srv = start(kind, zodbd_bin, tmp, msgpack=msgpack)
    sync = os.path.join(tmp, 'sync')
    os.makedirs(sync)
    procs = []
    try:
        w.random_setup(srv.addr)
        addr = '%s:%d' % srv.addr
        errs = []
        for p in range(NPROCS):
            errs.append(os.path.join(sync, 'stderr-%d' % p))
            with open(errs[-1], 'w') as ef, open(os.path.join(sync, 'stdout-%d' % p), 'w') as of:
                procs.append(subprocess.Popen(
                    [sys.executable, os.path.join(HERE, 'contention_oracle_worker.py'), 'random',
                     addr, str(p), str(seed), str(commits), str(duration), sync],
                    stdout=of, stderr=ef, text=True, env=wenv))

        def tails():
            return '\n'.join('--- worker %d (rc %s):\n%s' % (p, procs[p].poll(), open(errs[p]).read()[-3000:])
                             for p in range(NPROCS))
        kills = 0
        if kill_after is not None:
            for delay in kill_after:
                time.sleep(delay)
                srv.stop(signal.SIGKILL)
                kills += 1
                srv = Server(zodbd_bin, srv.path, tmp, kind=kind, port=srv.port, msgpack=msgpack).start()
        deadline = time.time() + duration + 60
        while not all(os.path.exists(os.path.join(sync, 'log-%d.json' % p)) for p in range(NPROCS)):
            if time.time() > deadline:
                for pr in procs:  # (faulthandler: their stacks to stderr)
                    if pr.poll() is None:
                        pr.send_signal(signal.SIGUSR1)
                time.sleep(1)
                pytest.fail('workers did not finish:\n' + tails(), pytrace=False)
            for p, pr in enumerate(procs):
                if pr.poll() is not None and not os.path.exists(os.path.join(sync, 'log-%d.json' % p)):
                    pytest.fail('worker %d died:\n%s' % (p, tails()), pytrace=False)
            time.sleep(0.1)
        import ZEO
        db = ZEO.DB(srv.addr, wait_timeout=30)
        last = db.lastTransaction()
        db.close()
        with open(os.path.join(sync, 'final'), 'w') as f:
            f.write(last.hex())
        reports = []
        for p, pr in enumerate(procs):
            pr.wait(timeout=120)
            assert pr.returncode == 0, tails()
            with open(os.path.join(sync, 'stdout-%d' % p)) as f:
                reports.append(json.loads(f.read().strip().splitlines()[-1]))
        rc = srv.stop()
        assert rc == 0, srv.output()[-3000:]
        txns = file_txns(srv.path)
        model, problems = w.random_model(reports, txns)
        final = file_view(srv.path)
        for n in ('io', 'oo', 'lo', 'ts', 'set'):
            if final['n_' + n] != len(final[n]):
                problems.append('Length n_%s is %d, tree has %d keys' % (n, final['n_' + n], len(final[n])))
        for k in model:
            if final[k] != model[k]:
                problems.append('%s: final %.300r, model %.300r' % (k, final[k], model[k]))
        oid_reuse = 0
        for r in reports:
            errors = r['errors']
            if kind == 'runzeo' and kill_after:
                # runzeo's FileStorage hands out again, after a crash, the
                # new oids it gave before it (no durable oid mark, as
                # zodbd's Data.fs.oid): a client that still holds an
                # object of such an oid fails to add the new one. Not
                # what this test looks at.
                same = [e for e in errors if 'A different object already has the same oid' in e]
                oid_reuse += len(same)
                errors = [e for e in errors if e not in same]
            if errors:
                problems.append('process %d errors: %s' % (r['p'], errors[:3]))
            if r.get('view') != final:
                v = r.get('view')
                d = {k: (v[k], final[k]) for k in final if v[k] != final[k]} if isinstance(v, dict) else v
                problems.append('process %d view incoherent: %.500r' % (r['p'], d))
        fstest(srv.path)
        ok = sum(1 for r in reports for e in r['log'] if e[0] is not None)
        ck = {}
        for r in reports:
            for k, v in r['conflict_kinds'].items():
                ck[k] = ck.get(k, 0) + v
        info = {'kind': kind, 'ok': ok, 'conflicts': sum(r['conflicts'] for r in reports), 'by_class': ck,
                'disconnects': sum(r['disconnects'] for r in reports), 'kills': kills,
                'runzeo_oid_reuse': oid_reuse}
        print('INFO', info)
        return problems, info
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
                pr.wait()
        srv.stop()


@pytest.mark.parametrize('kind', ['runzeo', 'zodbd'])
@pytest.mark.parametrize('seed,hot', [(1, 0), (2, 80)])
def test_random_contention_invariants(zodbd_bin, tmp_path, kind, seed, hot):
    problems, info = run_random(kind, zodbd_bin, tmp_path, seed, commits=60, hot=hot)
    assert problems == [], '\n'.join(problems[:30])
    assert info['conflicts'] > 0


@pytest.mark.parametrize('kind,msgpack', [('runzeo', False), ('zodbd', False), ('zodbd', True)])
def test_random_contention_sigkill_restart(zodbd_bin, tmp_path, kind, msgpack):
    problems, info = run_random(kind, zodbd_bin, tmp_path, 3, commits=400,
                                kill_after=[2.5, 1.5, 2.0], duration=12, hot=80, cache=True,
                                msgpack=msgpack)
    if problems and info['runzeo_oid_reuse']:
        # runzeo gave an oid a client already held (see run_random): two
        # objects then share it, and whatever the run finds next follows
        # from that known flaw, not from what the test looks at.
        pytest.xfail('runzeo reused oids after a kill (%d clients saw it): %s'
                     % (info['runzeo_oid_reuse'], problems[0]))
    assert problems == [], '\n'.join(problems[:30])
    assert info['kills'] == 3


# -- a client slow (or killed) while it resolves a conflict -------------------

def slow_resolution(kind, zodbd_bin, tmp_path, kill):
    """Client B's commit conflicts on a SlowCounter (resolved by Python:
    runzeo resolves it in the server, zodbd leaves it to the client, whose
    resolution takes 30 s, or which is SIGKILLed in it). Meanwhile client
    C commits an unrelated object: how long C's commit takes."""
    import threading
    import transaction
    import ZEO
    srv = start(kind, zodbd_bin, str(tmp_path / kind))
    b = None
    try:
        db = ZEO.DB(srv.addr, wait_timeout=30)
        with db.transaction() as c:
            c.root()['slow'] = w.SlowCounter()
            c.root()['other'] = w.SlowCounter()
        marker = str(tmp_path / 'resolving')
        env = dict(os.environ, AUDITC_SLOW_RESOLVE=marker)
        b = subprocess.Popen([sys.executable, os.path.join(HERE, 'contention_oracle_worker.py'),
                              'slow', '%s:%d' % srv.addr], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        assert b.stdout.readline().strip() == 'ready'
        with db.transaction() as c:
            c.root()['slow'].value += 1
        b.stdin.write('go\n')
        b.stdin.flush()
        deadline = time.time() + 10
        while not os.path.exists(marker) and b.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        if kill:
            b.kill()
            b.wait()
        done = []

        def commit_other():
            try:
                with db.transaction() as c:
                    c.root()['other'].value += 1
                done.append(time.time())
            except Exception:
                pass
        t0 = time.time()
        th = threading.Thread(target=commit_other, daemon=True)
        th.start()
        th.join(8)
        took = done[0] - t0 if done else None
        db.close()
        return took
    finally:
        if b is not None and b.poll() is None:
            b.kill()
            b.wait()
        srv.stop()


@pytest.mark.parametrize('kind', ['runzeo', 'zodbd'])
def test_client_killed_while_resolving_releases_lock(zodbd_bin, tmp_path, kind):
    """A client SIGKILLed in its conflict resolution does not hold up the
    others."""
    took = slow_resolution(kind, zodbd_bin, tmp_path, kill=True)
    assert took is not None and took < 5, took


@pytest.mark.parametrize('kind', [
    'runzeo',
    pytest.param('zodbd', marks=pytest.mark.xfail(strict=True, reason=(
        'deliberate (fs1/resolve.go): zodbd leaves the conflicts of classes it does not '
        'resolve natively (any class with its own _p_resolveConflict) to the client and holds '
        'the commit lock while the client resolves, so that the second vote cannot meet a newer '
        'revision; runzeo resolves them in the server (it imports the class), and with '
        'client-conflict-resolution it releases the lock. A client slow in its resolution '
        'stops every commit of the storage until it finishes or transaction-timeout.'))),
])
def test_client_slow_resolving_does_not_block_others(zodbd_bin, tmp_path, kind):
    took = slow_resolution(kind, zodbd_bin, tmp_path, kill=False)
    assert took is not None and took < 5, took


# -- deleteObject (zc.zodbdgc and the like) beside a stale store -------------

def stale_store_and_delete(addr, order):
    """A raw ClientStorage transaction with, in `order`, a stale store of a
    PersistentMapping (which nobody can resolve) and a stale deleteObject;
    the exception of its vote as (class, oid label, class_name)."""
    import transaction
    import ZEO
    from ZEO.ClientStorage import ClientStorage
    from ZODB.Connection import TransactionMetaData
    from ZODB.POSException import ConflictError
    from persistent.mapping import PersistentMapping
    db = ZEO.DB(addr, wait_timeout=30)
    try:
        with db.transaction() as c:
            c.root()['s'] = PersistentMapping(v=0)
            c.root()['d'] = PersistentMapping(v=0)
        c = db.open()
        s, d = c.root()['s'], c.root()['d']
        so, ss, do, ds = s._p_oid, s._p_serial, d._p_oid, d._p_serial
        c.close()
        with db.transaction() as c:
            c.root()['s']['v'] = 1
            c.root()['d']['v'] = 1
        names = {so: 's', do: 'd'}
        st = ClientStorage(addr, wait_timeout=30)
        try:
            t = TransactionMetaData()
            st.tpc_begin(t)
            for what in order:
                if what == 'store':
                    st.store(so, ss, st.loadSerial(so, ss), '', t)
                else:
                    st.deleteObject(do, ds, t)
            try:
                st.tpc_vote(t)
                st.tpc_finish(t)
                return ['committed']
            except ConflictError as e:
                st.tpc_abort(t)
                return [type(e).__name__, names.get(e.oid, e.oid), e.class_name]
        finally:
            st.close()
    finally:
        db.close()


@pytest.mark.parametrize('order', [('store', 'delete'), ('delete', 'store')], ids=['store-delete', 'delete-store'])
def test_stale_store_and_delete_matches_runzeo(servers, order):
    ref = stale_store_and_delete(servers['runzeo'].addr, order)
    got = stale_store_and_delete(servers['zodbd'].addr, order)
    assert got == ref


def check_only_txn(addr, stale):
    """A raw ClientStorage transaction with only a
    checkCurrentSerialInTransaction (stale or not): its outcome, and
    whether it became a transaction of the storage."""
    import ZEO
    from ZEO.ClientStorage import ClientStorage
    from ZODB.Connection import TransactionMetaData
    from ZODB.POSException import ConflictError
    from persistent.mapping import PersistentMapping
    db = ZEO.DB(addr, wait_timeout=30)
    try:
        with db.transaction() as c:
            c.root()['x'] = PersistentMapping(v=0)
        c = db.open()
        o, s = c.root()['x']._p_oid, c.root()['x']._p_serial
        c.close()
        if stale:
            with db.transaction() as c:
                c.root()['x']['v'] = 1
        st = ClientStorage(addr, wait_timeout=30)
        try:
            before = st.lastTransaction()
            t = TransactionMetaData()
            st.tpc_begin(t)
            st.checkCurrentSerialInTransaction(o, s, t)
            try:
                st.tpc_vote(t)
                tid = st.tpc_finish(t)
                out = ['committed', tid > before, len(list(st.iterator(tid, tid)))]
            except ConflictError as e:
                st.tpc_abort(t)
                out = [type(e).__name__, e.oid == o]
            return out
        finally:
            st.close()
    finally:
        db.close()


@pytest.mark.parametrize('stale', [False, True], ids=['current', 'stale'])
def test_check_only_transaction_matches_runzeo(servers, stale):
    assert check_only_txn(servers['zodbd'].addr, stale) == check_only_txn(servers['runzeo'].addr, stale)


# -- undo of a counter's increment that was incremented again ---------------

def undo_counter(kind, zodbd_bin, tmp_path):
    import transaction
    import ZEO
    from zeo_contention_app import Counter
    srv = start(kind, zodbd_bin, str(tmp_path / kind))
    try:
        db = ZEO.DB(srv.addr, wait_timeout=30)
        try:
            with db.transaction() as c:
                c.root()['ctr'] = Counter()
            with db.transaction('first') as c:
                c.root()['ctr'].inc(5)
            with db.transaction('second') as c:
                c.root()['ctr'].inc(10)
            ids = [d['id'] for d in db.undoLog(0, 10) if d['description'] in ('first', b'first')]
            try:
                db.undo(ids[0])  # (DB.undo joins the thread's transaction)
                transaction.commit()
            except Exception as e:
                transaction.abort()
                return type(e).__name__
            with db.transaction() as c:
                return c.root()['ctr'].value
        finally:
            db.close()
    finally:
        srv.stop()


@pytest.mark.parametrize('kind', [
    'runzeo',
    pytest.param('zodbd', marks=pytest.mark.xfail(strict=True, reason=(
        'deliberate (docs/zeo-server.md, Undo): zodbd resolves an undo only with its native '
        'resolvers (Length, BTrees buckets); runzeo resolves it with any class the server can '
        'import (here a counter with its own _p_resolveConflict), so there the undo succeeds '
        'and with zodbd it is an UndoError'))),
])
def test_undo_of_counter_changed_later(zodbd_bin, tmp_path, kind):
    assert undo_counter(kind, zodbd_bin, tmp_path) == 10
