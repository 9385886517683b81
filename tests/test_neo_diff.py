"""A differential test of zodbd's NEO storage node against NEO/py's
(opt-in: NEOPY_SRC and NEOPY_PYTHON, like tests/test_neo_writes.py).

Two clusters, each NEO/py's master and one storage node: A NEO/py's own
(SQLite), B zodbd's (`zodbd-sqlite`, `zodbd-fs`). The same seeded random
sequence of raw storage-API calls (new_oid, store with current and stale
serials, deleteObject, checkCurrentSerialInTransaction, vote/finish/abort,
two interleaved clients, undo, undoLog ranges, loadBefore/loadSerial at
probe tids, history, lastTransaction, iterator ranges, NEO's pack), run by
NEO/py's client (DRIVER, under NEO/py's Python), then the whole content;
tids mapped to commit indices; every answer and exception class compared.
Which of several conflicts of one transaction is reported first depends on
answer timing: a failed transaction is compared as "Conflict*".

The random driver is not deterministic even NEO/py against NEO/py (two
clients in one process: lastTransaction/invalidation timing, which
conflict is reported first), so test_differential only runs with
ZODBD_NEO_DIFF=1: a failure there is a lead to minimize, not a proof.
What it found, minimized: test_history_size_as_neopy (the FileStorage
node's history counted the 2 bytes of ".z" of a compressed record;
fixed).
test_check_current_serial_after_pack and
test_check_current_serial_of_deleted_object_after_pack are the attempts
to minimize the check+store divergences test_differential showed: they
pass (zodbd matches NEO/py there)."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import neocluster  # noqa: E402

SRC = os.environ.get('NEOPY_SRC')
PY = os.environ.get('NEOPY_PYTHON')
pytestmark = pytest.mark.skipif(not (SRC and PY), reason='NEOPY_SRC and NEOPY_PYTHON not set (opt-in)')
SEEDS = [int(x) for x in os.environ.get('ZODBD_NEO_DIFF_SEEDS', '1,2').split(',')]
NOPS = int(os.environ.get('ZODBD_NEO_DIFF_OPS', '150'))

DRIVER = r'''
import sys, json, random, time, traceback
from neo.client.Storage import Storage
from ZODB.utils import p64, u64, z64, maxtid
from ZODB.Connection import TransactionMetaData
from ZODB.tests.MinPO import MinPO
from ZODB.tests.StorageTestBase import zodb_pickle, zodb_unpickle
from ZODB.serialize import referencesf
from BTrees.Length import Length

master, name, seed, nops, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
import faulthandler; faulthandler.dump_traceback_later(120, exit=True)
rnd = random.Random(seed)
s1 = Storage(master_nodes=master, name=name)
s2 = Storage(master_nodes=master, name=name)
s1.app.wait_for_pack = s2.app.wait_for_pack = True
tids = []       # index -> tid
tidx = {}
trace = []

def T(t):
    if t is None: return None
    if t not in tidx:
        tidx[t] = len(tids); tids.append(t)
    return 'T%d' % tidx[t]

def norm(v):
    if isinstance(v, bytes) and len(v) == 8 and v in tidx:
        return 'T%d' % tidx[v]
    if isinstance(v, bytes):
        try:
            o = zodb_unpickle(v)
            return 'D:%r' % (getattr(o, 'value', None) if isinstance(o, MinPO) else o.value)
        except Exception:
            return 'B:' + v.hex()
    if isinstance(v, (list, tuple)): return [norm(x) for x in v]
    if isinstance(v, dict): return sorted([[str(norm(k)), norm(x)] for k, x in v.items()])
    return v

def rec(op, args, fn):
    try:
        r = fn()
        trace.append([op, args, 'ok', r])
        return r
    except Exception as e:
        trace.append([op, args, 'exc', type(e).__name__])
        return e

oids = []       # oid ints
serials = {}    # oid -> list of tids committed (driver's view)
lengths = set()

def data(oid, kind=None):
    if oid in lengths:
        l = Length(rnd.randint(1, 5)); return zodb_pickle(l)
    return zodb_pickle(MinPO(rnd.randint(0, 10**6)))

def probe_tid():
    if not tids: return z64
    c = rnd.random()
    t = rnd.choice(tids)
    if c < .1: return p64(1)
    if c < .2: return maxtid
    if c < .6: return t
    if c < .8: return p64(u64(t) + 1)
    return p64(u64(t) - 1)

def txn_ops(s, txn, desc):
    ops = []
    for _ in range(rnd.randint(1, 4)):
        c = rnd.random()
        if c < .25 or not oids:
            oid = u64(s.new_oid()); oids.append(oid); serials[oid] = []
            if rnd.random() < .2: lengths.add(oid)
            ops.append(('store', oid, z64))
        elif c < .7:
            oid = rnd.choice(oids)
            ser = serials[oid][-1] if serials[oid] else z64
            if rnd.random() < .15 and len(serials[oid]) > 1: ser = rnd.choice(serials[oid][:-1])
            ops.append(('store', oid, ser))
        elif c < .8:
            oid = rnd.choice(oids)
            ser = serials[oid][-1] if serials[oid] else z64
            ops.append(('delete', oid, ser))
        else:
            oid = rnd.choice(oids)
            ser = serials[oid][-1] if serials[oid] else z64
            if rnd.random() < .3 and len(serials[oid]) > 1: ser = rnd.choice(serials[oid][:-1])
            ops.append(('check', oid, ser))
    ops = [(op, oid, ser, data(oid) if op == 'store' else None) for op, oid, ser in ops]
    done = []
    for op, oid, ser, d in ops:
        if oid in [x[1] for x in done]: continue
        try:
            if op == 'store':
                s.store(p64(oid), ser, d, '', txn)
            elif op == 'delete':
                s.deleteObject(p64(oid), ser, txn)
            else:
                s.checkCurrentSerialInTransaction(p64(oid), ser, txn)
        except Exception as e:
            trace.append(['txn-fail', desc, 'Conflict' if 'Conflict' in type(e).__name__ else type(e).__name__])
            return None
        done.append((op, oid))
    trace.append(['txn-ops', desc, [[op, oid, norm(ser)] for op, oid, ser, d in ops]])
    return done

def commit(s, desc):
    txn = TransactionMetaData(description=desc)
    s.tpc_begin(txn)
    done = txn_ops(s, txn, desc)
    if done is None:
        s.tpc_abort(txn); trace.append(['abort', desc]); return
    if rnd.random() < .1:
        s.tpc_abort(txn); trace.append(['abort-early', desc]); return
    try:
        r = s.tpc_vote(txn)
    except Exception as e:
        trace.append(['txn-fail', desc, 'Conflict' if 'Conflict' in type(e).__name__ else type(e).__name__])
        s.tpc_abort(txn); return
    if rnd.random() < .08:
        s.tpc_abort(txn); trace.append(['abort-after-vote', desc]); return
    tid = s.tpc_finish(txn)
    trace.append(['finish', desc, T(tid)])
    for op, oid in done:
        if op != 'check': serials[oid].append(tid)
        if op == 'delete': pass

def undo(s):
    log = s.undoLog(0, 50)
    if not log: return
    d = rnd.choice(log)
    txn = TransactionMetaData(description='undo')
    s.tpc_begin(txn)
    r = rec('undo', [norm(d['id'])], lambda: s.undo(d['id'], txn))
    if isinstance(r, Exception):
        s.tpc_abort(txn); return
    r = rec('vote', ['undo'], lambda: s.tpc_vote(txn))
    if isinstance(r, Exception):
        s.tpc_abort(txn); return
    tid = s.tpc_finish(txn)
    trace.append(['finish', 'undo', T(tid)])
    for oid in r[1] if isinstance(r, tuple) and r else []:
        serials[u64(oid)].append(tid)
    # refresh driver view of undone oids
    for oid in oids:
        try: serials[oid].append(s.load(p64(oid))[1])
        except Exception: pass

def reads(s):
    if not oids: return
    oid = rnd.choice(oids)
    c = rnd.random()
    if c < .3:
        t = probe_tid()
        rec('loadBefore', [oid, norm(t) if t in tidx else 'probe'], lambda: norm(s.loadBefore(p64(oid), t)))
    elif c < .5:
        t = probe_tid()
        rec('loadSerial', [oid], lambda: norm(s.loadSerial(p64(oid), t)))
    elif c < .6:
        rec('load', [oid], lambda: norm(s.load(p64(oid))))
    elif c < .75:
        n = rnd.choice([1, 3, 100])
        rec('history', [oid, n], lambda: [(norm(h['tid']), h['size'], h['description']) for h in s.history(p64(oid), n)])
    elif c < .85:
        a, b = rnd.randint(0, 10), rnd.randint(-30, 30)
        rec('undoLog', [a, b], lambda: [(norm(d['id']), d['description']) for d in s.undoLog(a, b)])
    elif c < .92:
        rec('lastTransaction', [], lambda: T(s.lastTransaction()))
    else:
        a, b = probe_tid(), probe_tid()
        if rnd.random() < .3: a = None
        if rnd.random() < .3: b = None
        def it():
            res = []
            for t in s.iterator(a, b):
                res.append([T(t.tid), t.status, t.description, sorted([(u64(r.oid), norm(r.data), norm(r.data_txn)) for r in t], key=str)])
            return res
        rec('iterator', [], it)

def interleaved():
    # two clients, disjoint or same oid, sequential interleaving
    if len(oids) < 2: return
    a, b = rnd.sample(oids, 2)
    if rnd.random() < .3: b = a
    t1 = TransactionMetaData(description='i1'); t2 = TransactionMetaData(description='i2')
    s1.tpc_begin(t1); s2.tpc_begin(t2)
    sa = serials[a][-1] if serials[a] else z64
    sb = serials[b][-1] if serials[b] else z64
    r1 = rec('store', ['i1', a], lambda: s1.store(p64(a), sa, data(a), '', t1))
    r1 = rec('vote', ['i1'], lambda: s1.tpc_vote(t1))
    if b == a:
        s1.tpc_finish(t1) if not isinstance(r1, Exception) else s1.tpc_abort(t1)
        r2 = rec('store', ['i2', b], lambda: s2.store(p64(b), sb, data(b), '', t2))
        r2 = rec('vote', ['i2'], lambda: s2.tpc_vote(t2)) if not isinstance(r2, Exception) else r2
        if isinstance(r2, Exception): s2.tpc_abort(t2)
        else: trace.append(['finish', 'i2', T(s2.tpc_finish(t2))])
    else:
        r2 = rec('store', ['i2', b], lambda: s2.store(p64(b), sb, data(b), '', t2))
        r2 = rec('vote', ['i2'], lambda: s2.tpc_vote(t2)) if not isinstance(r2, Exception) else r2
        if isinstance(r2, Exception): s2.tpc_abort(t2)
        else: trace.append(['finish', 'i2', T(s2.tpc_finish(t2))])
        if isinstance(r1, Exception): s1.tpc_abort(t1)
        else: trace.append(['finish', 'i1', T(s1.tpc_finish(t1))])
    for oid in (a, b):
        try: serials[oid].append(s1.load(p64(oid))[1])
        except Exception: pass

for i in range(nops):
    c = rnd.random()
    s = s1 if rnd.random() < .7 else s2
    if c < .4: commit(s, 't%d' % i)
    elif c < .5: undo(s)
    elif c < .56: interleaved()
    elif c < .58 and tids:
        t = rnd.choice(tids)
        rec('pack', [T(t)], lambda: s.app.pack(t))
        trace.append(['lastTransaction', T(s.lastTransaction())])
    else: reads(s)
# final content
def dump():
    res = []
    for t in s1.iterator():
        res.append([T(t.tid), t.status, t.description, sorted([(u64(r.oid), norm(r.data), norm(r.data_txn)) for r in t], key=str)])
    return res
rec('final-iterator', [], dump)
for oid in oids:
    rec('final-history', [oid], lambda: [norm(h['tid']) for h in s1.history(p64(oid), 1000)])
    for t in list(tids):
        rec('final-loadBefore', [oid, T(t)], lambda: norm(s1.loadBefore(p64(oid), t)))
with open(out, 'w') as f:
    json.dump(trace, f, default=repr)
s1.close(); s2.close()
'''


def run_py(tmp_path, kind, zodbd, script, *args, name='x'):
    """Starts a cluster of `kind` in tmp_path/name, runs `script` (Python
    source) with NEO/py's Python as SCRIPT MASTER CLUSTER ARGS...; its
    stdout."""
    d = tmp_path / name
    d.mkdir()
    (d / 'script.py').write_text(script)
    c = neocluster.Cluster(kind, str(d), SRC, PY, zodbd=zodbd).start()
    try:
        env = dict(c.env, PYTHONPATH=SRC)
        p = subprocess.run([PY, str(d / 'script.py'), c.master, c.name] + [str(a) for a in args],
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-5000:] + c.logs()
        return p.stdout
    finally:
        c.stop()


def trace(tmp_path, kind, zodbd, seed):
    out = tmp_path / ('%s-%d.json' % (kind, seed))
    run_py(tmp_path, kind, zodbd, DRIVER, seed, NOPS, out, name='%s-%d' % (kind, seed))
    return json.loads(out.read_text())


@pytest.mark.skipif(os.environ.get('ZODBD_NEO_DIFF') != '1', reason='not deterministic (see above): ZODBD_NEO_DIFF=1')
@pytest.mark.parametrize('seed', SEEDS)
@pytest.mark.parametrize('kind', ['zodbd-sqlite', 'zodbd-fs'])
def test_differential(kind, seed, tmp_path, zodbd_bin):
    a = trace(tmp_path, 'neopy', zodbd_bin, seed)
    b = trace(tmp_path, kind, zodbd_bin, seed)
    diffs = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y]
    assert not diffs and len(a) == len(b), '%d vs %d entries; first differences:\n%s' % (
        len(a), len(b), '\n'.join('%d\n  neopy %s\n  zodbd %s' % (i, json.dumps(x)[:300], json.dumps(y)[:300])
                                 for i, x, y in diffs[:6]))


COMMON = r'''
import sys
from neo.client.Storage import Storage
from ZODB.utils import p64, u64, z64
from ZODB.Connection import TransactionMetaData
from ZODB.tests.MinPO import MinPO
from ZODB.tests.StorageTestBase import zodb_pickle
s = Storage(master_nodes=sys.argv[1], name=sys.argv[2])
s.app.wait_for_pack = True

def commit(stores=(), checks=()):
    t = TransactionMetaData()
    s.tpc_begin(t)
    try:
        for oid, ser in checks:
            s.checkCurrentSerialInTransaction(oid, ser, t)
        for oid, ser, v in stores:
            if v is None:
                s.deleteObject(oid, ser, t)
            else:
                s.store(oid, ser, zodb_pickle(MinPO(v)), '', t)
        s.tpc_vote(t)
    except Exception as e:
        s.tpc_abort(t)
        return type(e).__name__
    return s.tpc_finish(t)
'''

HISTORY_SIZE = COMMON + r'''
oid = s.new_oid()
commit([(oid, z64, 1)])
print(s.history(oid, 1)[0]['size'], len(s.load(oid)[0]))
'''


@pytest.mark.parametrize('kind', ['zodbd-sqlite', 'zodbd-fs'])
def test_history_size_as_neopy(kind, tmp_path, zodbd_bin):
    """history()'s size of a 66-byte record: NEO/py's node answers 65
    (the length it stores, as NEO/py's client compressed it with its
    one-byte header...), zodbd's FileStorage node 67: the sizes differ by 2
    (seen in the differential run on every history)."""
    ref = run_py(tmp_path, 'neopy', zodbd_bin, HISTORY_SIZE, name='ref').split()
    got = run_py(tmp_path, kind, zodbd_bin, HISTORY_SIZE).split()
    assert got == ref


CHECK_AFTER_PACK = COMMON + r'''
a = s.new_oid(); b = s.new_oid()
t1 = commit([(a, z64, 1), (b, z64, 1)])
t2 = commit([(a, t1, 2)])
t3 = commit([(b, t1, 2)])
s.app.pack(t2)
print(commit(checks=[(b, t3)], stores=[(a, t2, 3)]) if True else None)
print(commit(checks=[(a, s.load(a)[1])]))
'''


@pytest.mark.parametrize('kind', ['neopy', 'zodbd-sqlite', 'zodbd-fs'])
def test_check_current_serial_after_pack(kind, tmp_path, zodbd_bin):
    """checkCurrentSerialInTransaction of an object's current serial,
    newer than a pack's tid, after that pack: accepted by NEO/py's node;
    seen in the differential run (seed 1, after `pack T16`, ReadConflictError
    from the FileStorage node)."""
    out = run_py(tmp_path, kind, zodbd_bin, CHECK_AFTER_PACK).split()
    assert 'Conflict' not in ' '.join(out), out


CHECK_DELETED = COMMON + r'''
a = s.new_oid(); b = s.new_oid()
t1 = commit([(a, z64, 1)])
t2 = commit([(a, t1, 2)])
t3 = commit([(a, t2, None)])          # a deleted
s.app.pack(t3)                        # a's records all go (deleted as of the pack)
r4 = commit([(a, t3, None)])          # deleted again
print(type(r4).__name__)
print(commit(checks=[(a, t2)], stores=[(b, z64, 1)]) if isinstance(r4, bytes) else '-')
'''


@pytest.mark.parametrize('kind', ['zodbd-sqlite', 'zodbd-fs'])
def test_check_current_serial_of_deleted_object_after_pack(kind, tmp_path, zodbd_bin):
    """Seen in the differential run (seed 2, t10): an object deleted, packed
    away, deleted again; then checkCurrentSerialInTransaction with a stale
    serial: the outcome (tid or exception class) must be NEO/py's."""
    ref = run_py(tmp_path, 'neopy', zodbd_bin, CHECK_DELETED, name='ref').split()
    got = run_py(tmp_path, kind, zodbd_bin, CHECK_DELETED).split()
    norm = lambda out: [x if not x.startswith('b') else 'tid' for x in out]
    assert norm(got) == norm(ref), (got, ref)
