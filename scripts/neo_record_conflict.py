#!/usr/bin/env python3
"""Record a NEO/py cluster in which two NEO/py clients commit with conflicts.

Run with NEO/py's interpreter and source (never in CI):

    PYTHONPATH=/tmp/neopy /tmp/neovenv/bin/python scripts/neo_record_conflict.py OUTDIR [RUN]

RUN is cf-write (the default, the workload below) or dl-write (two
objects locked in opposite orders: NotifyDeadlock, AskRelockObject; see
workload_dl). Each starts a new cluster.

It starts NEO/py's neomaster (-p 1 -r 0), neostorage (-a SQLite) and
neoadmin on free 127.0.0.1 ports, with two recording proxies
(scripts/neo_record.py): one in front of the master (the storage and the
clients are given its address as the master's) and one in front of the
storage. NEO/py has no option to advertise an address other than the one
a node binds, so the clients, which run in this process, are made to dial
the storage proxy when they connect to the storage's address (the
connector's connect call is wrapped; nothing of NEO/py's sending or
receiving is changed, and the storage's address they know and log is the
real one).

Workload cf-write (cluster name `vectors`), two clients A and B, each its own
neo.client.Storage under a ZODB.DB:
  1. A creates the root and commits root['len'] = BTrees.Length.Length()
     and root['m'] = PersistentMapping() (T1).
  2. B opens a connection and reads len and m; A changes both and commits
     (T2).
  3. B, still on its old view, does len.change(2) and commits: its store
     is answered with T2 as conflict serial, B's client loads T2,
     resolves (Length._p_resolveConflict) and stores again (T3).
  4. B (new transaction, new view of m) reads m, A changes m and commits
     (T4), B changes m and commits: conflict, not resolvable: ZODB
     raises ConflictError and B aborts.
Then `neoctl set cluster STOPPING`.

Writes OUTDIR/decoded/<run>-cNN-*.{json,c2s.bin,s2c.bin}, OUTDIR/empty.sqlite
(the storage DB 0.5 s after neostorage started, before the cluster
started: schema, config name, version and the nid the master gave),
OUTDIR/final.sqlite (after the run) and OUTDIR/client-results.json (the
tids and values A and B saw). The admin and neoctl talk to the master
directly: those connections are not recorded.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import neo_record  # noqa: E402

CLUSTER = 'vectors'


def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port):
    for _ in range(400):
        try:
            socket.create_connection(('127.0.0.1', port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit('port %d not listening' % port)


MASTER = [None]


def workload_cf(Storage, res):
    import transaction
    import ZODB
    from BTrees.Length import Length
    from persistent.mapping import PersistentMapping
    from ZODB.POSException import ConflictError
    sa = Storage(master_nodes=MASTER[0], name=CLUSTER)
    dba = ZODB.DB(sa)
    tma = transaction.TransactionManager()
    ca = dba.open(tma)
    ra = ca.root()
    ra['len'] = Length()
    ra['m'] = PersistentMapping()
    tma.get().note(u'T1')
    tma.commit()
    res['T1'] = sa.lastTransaction().hex()

    sb = Storage(master_nodes=MASTER[0], name=CLUSTER)
    dbb = ZODB.DB(sb)
    tmb = transaction.TransactionManager()
    cb = dbb.open(tmb)
    tmb.begin()
    rb = cb.root()
    res['B_len_before'] = rb['len']()
    res['B_m_before'] = dict(rb['m'])

    tma.begin()
    ra['len'].change(1)
    ra['m']['a'] = 1
    tma.get().note(u'T2')
    tma.commit()
    res['T2'] = sa.lastTransaction().hex()
    time.sleep(0.3)

    rb['len'].change(2)
    tmb.get().note(u'T3')
    tmb.commit()  # conflict on len, resolved
    res['T3'] = sb.lastTransaction().hex()
    res['B_len_after'] = rb['len']()
    time.sleep(0.3)

    tmb.begin()
    res['B_m_before2'] = dict(rb['m'])
    tma.begin()
    ra['m']['a'] = 2
    tma.get().note(u'T4')
    tma.commit()
    res['T4'] = sa.lastTransaction().hex()
    time.sleep(0.3)
    rb['m']['b'] = 3
    tmb.get().note(u'T5 (conflicts)')
    try:
        tmb.commit()
        res['T5'] = 'committed?!'
    except ConflictError as e:
        res['T5'] = 'ConflictError: %s' % e
        tmb.abort()
    time.sleep(0.3)
    tma.begin()
    res['A_final'] = {'len': ra['len'](), 'm': dict(ra['m'])}
    tma.abort()
    return sa, sb, dba, dbb


def workload_dl(Storage, res):
    """Two objects locked in opposite orders (through the raw storage API,
    to order the stores): A begins (smaller ttid), B begins, B stores X,
    A stores Y then X (X is locked by the younger B: the storage sends B
    NotifyDeadlock and delays A), B stores Y (locked by the older A:
    delayed). B votes in a thread (it relocks X: AskRelockObject), A votes
    and finishes (T2); B is answered with conflicts on X and Y, resolves
    both (Length) and stores them again, votes and finishes (T3)."""
    import pickle
    import transaction
    import ZODB
    from BTrees.Length import Length
    from ZODB.Connection import TransactionMetaData

    def length_pickle(v):
        return pickle.dumps(Length, 3) + pickle.dumps(v, 3)

    sa = Storage(master_nodes=MASTER[0], name=CLUSTER)
    dba = ZODB.DB(sa)
    tma = transaction.TransactionManager()
    ca = dba.open(tma)
    ra = ca.root()
    ra['x'] = Length()
    ra['y'] = Length()
    tma.get().note(u'T1')
    tma.commit()
    x, y = ra['x']._p_oid, ra['y']._p_oid
    res['T1'] = sa.lastTransaction().hex()
    sb = Storage(master_nodes=MASTER[0], name=CLUSTER)
    dbb = ZODB.DB(sb)
    sx = sa.load(x)[1]
    sy = sa.load(y)[1]
    ta, tb = TransactionMetaData(description=b'T2 A'), TransactionMetaData(description=b'T3 B')
    sa.tpc_begin(ta)
    sb.tpc_begin(tb)
    sb.store(x, sx, length_pickle(10), '', tb)
    time.sleep(0.3)
    sa.store(y, sy, length_pickle(1), '', ta)
    time.sleep(0.2)
    sa.store(x, sx, length_pickle(1), '', ta)
    time.sleep(0.3)
    sb.store(y, sy, length_pickle(10), '', tb)
    time.sleep(0.3)
    err = []

    def vote_b():
        try:
            sb.tpc_vote(tb)
        except Exception as e:
            err.append(repr(e))
    th = threading.Thread(target=vote_b)
    th.start()
    time.sleep(0.3)
    sa.tpc_vote(ta)
    res['T2'] = sa.tpc_finish(ta).hex()
    th.join(20)
    res['B_vote'] = err or 'ok'
    if not err:
        res['T3'] = sb.tpc_finish(tb).hex()
    else:
        sb.tpc_abort(tb)
    time.sleep(0.3)
    res['x'] = pickle.loads(sa.load(x)[0][len(pickle.dumps(Length, 3)):])
    res['y'] = pickle.loads(sa.load(y)[0][len(pickle.dumps(Length, 3)):])
    return sa, sb, dba, dbb


WORKLOADS = {'cf-write': workload_cf, 'dl-write': workload_dl}


def main():
    out = os.path.abspath(sys.argv[1])
    run = sys.argv[2] if len(sys.argv) > 2 else 'cf-write'
    work = os.path.join(out, 'work')
    os.makedirs(work, exist_ok=True)
    py = sys.executable
    env = dict(os.environ)
    M, A, S, PM, PS = (free_port() for _ in range(5))
    counter = [0, threading.Lock()]
    pm = neo_record.RecordingProxy(('127.0.0.1', PM), ('127.0.0.1', M), 'master', counter)
    ps = neo_record.RecordingProxy(('127.0.0.1', PS), ('127.0.0.1', S), 'storage', counter)
    procs = []

    def spawn(name, args):
        log = open(os.path.join(work, name + '.log'), 'wb')
        p = subprocess.Popen([py, '-c', 'import neo.scripts.%s as m; m.main()' % name] + args,
                             env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
        procs.append(p)
        return p

    def ctl(*args):
        r = subprocess.run([py, '-c', 'import neo.scripts.neoctl as m; m.main()', '-a',
                            '127.0.0.1:%d' % A] + list(args), env=env, capture_output=True, text=True)
        return r.stdout + r.stderr

    db = os.path.join(work, 'storage.sqlite')
    spawn('neomaster', ['-c', CLUSTER, '-b', '127.0.0.1:%d' % M, '-m', '127.0.0.1:%d' % M,
                        '-p', '1', '-r', '0'])
    wait_port(M)
    spawn('neostorage', ['-c', CLUSTER, '-b', '127.0.0.1:%d' % S, '-m', '127.0.0.1:%d' % PM,
                         '-a', 'SQLite', '-d', db])
    wait_port(S)
    # The DB as neostorage created it, before the cluster starts: what
    # the replay starts from (sqlite3's backup: a consistent copy).
    import sqlite3
    for _ in range(100):
        if os.path.exists(db):
            break
        time.sleep(0.05)
    time.sleep(0.5)
    src = sqlite3.connect(db)
    dst = sqlite3.connect(os.path.join(out, 'empty.sqlite'))
    src.backup(dst)
    dst.close()
    src.close()
    spawn('neoadmin', ['-c', CLUSTER, '-b', '127.0.0.1:%d' % A, '-m', '127.0.0.1:%d' % M])
    wait_port(A)
    steps = []
    for _ in range(100):
        o = ctl('print', 'node')
        if 'STORAGE' in o and 'RUNNING' in o or 'PENDING' in o:
            break
        time.sleep(0.1)
    steps.append(('start', ctl('start')))
    for _ in range(100):
        o = ctl('print', 'cluster')
        if 'RUNNING' in o:
            break
        time.sleep(0.1)

    # The clients dial the storage proxy for the storage's address.
    from neo.lib import connector
    real = ('127.0.0.1', S)
    orig = connector.SocketConnector._connect

    def _connect(self, addr):
        if tuple(addr) == real:
            addr = ('127.0.0.1', PS)
        return orig(self, addr)
    connector.SocketConnector._connect = _connect

    from neo.client.Storage import Storage
    MASTER[0] = '127.0.0.1:%d' % PM

    res = {}
    sa, sb, dba, dbb = WORKLOADS[run](Storage, res)
    time.sleep(1.5)  # let the storage commit the last unlock
    dbb.close()
    dba.close()
    steps.append(('stop', ctl('set', 'cluster', 'STOPPING')))
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    time.sleep(0.5)
    pm.close()
    ps.close()
    idx = neo_record.write_run(os.path.join(out, 'decoded'), run, [pm, ps])
    with open(os.path.join(out, 'client-results.json'), 'w') as f:
        json.dump({'results': res, 'steps': steps}, f, indent=1)
    for c in idx:
        print(c['file'], c['packets'], c['c2s_bytes'], c['s2c_bytes'], ' '.join(c['names']))
    print(json.dumps(res, indent=1))
    shutil.copy(db, os.path.join(out, 'final.sqlite'))


if __name__ == '__main__':
    main()
