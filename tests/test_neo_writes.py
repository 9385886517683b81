"""Live tests of NEO writes through `zodbd neo-storage` (opt-in, like
tests/test_neo_interop.py: NEOPY_SRC and NEOPY_PYTHON, see docs/neo.md).

NEO/py's master and client, unchanged, with zodbd's node as the only
storage (`zodbd-fs`: FileStorage backend; `zodbd-sqlite`: NEO/py's SQLite
schema); `neopy` (NEO/py's own storage node) runs the same tests as the
reference that shows the tests themselves right (ZODBD_NEO_REFERENCE=1).

- ZODB's storage test mixins (basic, conflict resolution, history,
  iterator, MT, pack, persistent, read-only, revision, synchronization,
  undo) through NEO/py's client, a fresh cluster per test
  (tests/neo_mixins.py, run with NEO/py's Python).
- A fault test: 4 NEO/py client processes commit while the storage node is
  SIGKILLed and restarted (ZODBD_NEO_KILLS times, default 50): every
  commit that returned is readable afterwards, no transaction is visible
  in part, and on SQLite NEO/py's own storage node, started on the
  database zodbd wrote, serves the same transactions.
- Both on replicated clusters (tests/neocluster.py layouts, LAYOUTS): the
  mixins on (a) two zodbd nodes -p 2 -r 1, (b) a zodbd and a NEO/py node
  -p 2 -r 1, (c) two zodbd nodes and a NEO/py node -p 12 -r 1, (d) a
  FileStorage zodbd node and a SQLite zodbd node -p 1 -r 1; the fault
  test on (a) and (c) with a zodbd node killed, which then catches up,
  and `neoctl check` of every partition.
- A transaction of 128 MiB through NEO/py's client: committed, read
  back, the node's memory bounded (its spools)."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import neocluster  # noqa: E402
from testutil import Watchdog, rss  # noqa: E402

SRC = os.environ.get('NEOPY_SRC')
PY = os.environ.get('NEOPY_PYTHON')
pytestmark = pytest.mark.skipif(not (SRC and PY), reason='NEOPY_SRC and NEOPY_PYTHON not set (opt-in)')

REFERENCE = bool(os.environ.get('ZODBD_NEO_REFERENCE'))
KINDS = ['zodbd-fs', 'zodbd-sqlite'] + (['neopy'] if REFERENCE else [])
# Replicated layouts (tests/neocluster.py): (a) two zodbd nodes, (b) a
# zodbd node and a NEO/py node, (c) three mixed nodes, (d) a FileStorage
# node and a SQLite node holding the same partition (the FileStorage node
# packs as NEO does: their copies stay equal after a pack); with
# ZODBD_NEO_REFERENCE, all-NEO/py clusters of the same shapes.
LAYOUTS = [
    pytest.param('zodbd-sqlite+zodbd-sqlite/p2/r1', id='a-2zodbd-p2r1'),
    pytest.param('zodbd-sqlite+neopy/p2/r1', id='b-zodbd-neopy-p2r1'),
    pytest.param('zodbd-sqlite+zodbd-sqlite+neopy/p12/r1', id='c-2zodbd-neopy-p12r1'),
    pytest.param('zodbd-fs+zodbd-sqlite/p1/r1', id='d-fs-sqlite-p1r1'),
] + ([pytest.param('neopy+neopy/p2/r1', id='ref-2neopy-p2r1'),
      pytest.param('neopy+neopy+neopy/p12/r1', id='ref-3neopy-p12r1')] if REFERENCE else [])


def neo_env():
    return dict(os.environ, NEOPY_SRC=SRC, PYTHONPATH=os.pathsep.join([SRC, HERE]))


@pytest.mark.parametrize('kind', KINDS + LAYOUTS)
def test_zodb_mixins(kind, tmp_path, zodbd_bin):
    out = tmp_path / 'results.json'
    p = subprocess.run([PY, os.path.join(HERE, 'neo_mixins.py'), kind, zodbd_bin, '--json', str(out)],
                       env=neo_env(), capture_output=True, text=True, timeout=3000)
    results = json.loads(out.read_text()) if out.exists() else {}
    bad = {i: r for i, r in results.items() if r['outcome'] in ('failure', 'error', 'xpass')}
    msg = '\n\n'.join('%s: %s\n%s\n%s' % (i, r['outcome'], r['detail'], r.get('logs', ''))
                      for i, r in sorted(bad.items()))
    assert p.returncode == 0 and results, (msg or p.stderr[-5000:])[:20000]
    ran = sum(1 for r in results.values() if r['outcome'] in ('success', 'xfail'))
    assert ran >= 80, results  # the suite ran (88 tests today, a few skipped by ZODB itself)


def fault_check(c, logs):
    """tests/neo_fault_check.py through c's master: its JSON summary, no
    problem found."""
    chk = subprocess.run([PY, os.path.join(HERE, 'neo_fault_check.py'), c.master, c.name] + logs,
                         env=neo_env(), capture_output=True, text=True, timeout=600)
    assert chk.returncode == 0, chk.stderr[-5000:] + c.logs()
    res = json.loads(chk.stdout)
    assert not res['problems'], res['problems']
    return res


def commit_through_kills(c, tmp_path, victim, kills, catch_up_every=0):
    """4 NEO/py client processes (tests/neo_fault_worker.py) commit while
    node `victim` of the started cluster c is SIGKILLed and restarted
    `kills` times, commits going on after each restart (and, every
    catch_up_every restarts, until every cell is UP_TO_DATE again: the
    other restarts kill it while it catches up); then the workers stop and
    every acknowledged commit is checked (fault_check). Returns the
    check's summary and the workers' logs."""
    stop = tmp_path / 'stop'
    logs = [str(tmp_path / ('w%d.log' % i)) for i in range(4)]
    env = neo_env()
    outs = [str(tmp_path / ('w%d.out' % i)) for i in range(4)]  # files: a full pipe would block a worker
    workers = [subprocess.Popen([PY, os.path.join(HERE, 'neo_fault_worker.py'), c.master, c.name, str(i),
                                 logs[i], str(stop)], env=env, stdout=open(outs[i], 'wb'),
                                stderr=subprocess.STDOUT) for i in range(4)]

    def output(i):
        with open(outs[i], errors='replace') as f:
            return f.read()[-3000:]

    def dead():
        # the workers that exited, with their output
        return [(i, w.returncode, output(i)) for i, w in enumerate(workers) if w.poll() is not None]

    try:
        def acked():
            return sum(sum(1 for _ in open(p)) for p in logs if os.path.exists(p))

        deadline = time.monotonic() + 60
        while acked() < 20:  # the workers commit before the first kill
            assert time.monotonic() < deadline, 'no commits: ' + c.logs()
            d = dead()
            assert not d, d
            time.sleep(0.1)
        rnd = random.Random(kills)
        for n in range(kills):
            before = acked()
            c.kill_storage(victim)
            time.sleep(rnd.uniform(0, 0.2))
            c.start_storage(victim)
            deadline = time.monotonic() + 60
            while acked() <= before:  # commits go on after the restart
                if time.monotonic() > deadline:
                    for w in workers:
                        w.send_signal(signal.SIGUSR1)
                    time.sleep(1)
                    raise AssertionError('no commit after restart %d:\n%s\n%s' % (
                        n, c.logs(), '\n'.join(output(i) for i in range(4))))
                d = dead()
                assert not d, d
                time.sleep(0.02)
            if catch_up_every and n % catch_up_every == catch_up_every - 1:
                c.wait_up_to_date(timeout=120)
            time.sleep(rnd.uniform(0, 0.3))
        stop.write_text('')
        for i, w in enumerate(workers):
            try:
                w.wait(120)
            except subprocess.TimeoutExpired:
                w.send_signal(signal.SIGUSR1)
                time.sleep(1)
                raise AssertionError('worker %d does not stop: %s' % (i, output(i)))
        assert all(w.returncode == 0 for w in workers), [(i, w.returncode, output(i)) for i, w in enumerate(workers)]
        res = fault_check(c, logs)
        assert sum(w['acked'] for w in res['workers']) >= kills, res
        return res, logs
    finally:
        stop.write_text('')
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()


@pytest.mark.parametrize('kind', KINDS)
def test_commits_survive_storage_kills(kind, tmp_path, zodbd_bin):
    kills = int(os.environ.get('ZODBD_NEO_KILLS', '50'))
    c = neocluster.Cluster(kind, str(tmp_path), SRC, PY, zodbd=zodbd_bin).start()
    try:
        res, logs = commit_through_kills(c, tmp_path, 0, kills)
    finally:
        c.stop()
    if kind == 'zodbd-sqlite':
        # NEO/py's storage node takes over the database zodbd wrote.
        ref = neocluster.Cluster('neopy', str(tmp_path), SRC, PY, name=c.name)
        ref.db = c.db
        ref.start()
        try:
            res2 = fault_check(ref, logs)
            assert res2 == res, (res2, res)
        finally:
            ref.stop()


@pytest.mark.parametrize('spec,other', [
    pytest.param('zodbd-sqlite+zodbd-sqlite/p2/r1', 1, id='a-2zodbd-p2r1'),
    pytest.param('zodbd-sqlite+zodbd-sqlite+neopy/p12/r1', 2, id='c-2zodbd-neopy-p12r1'),
])
def test_replicated_commits_survive_node_kills(spec, other, tmp_path, zodbd_bin):
    """The fault test on a replicated cluster: node 0 (zodbd's, SQLite)
    is SIGKILLed and restarted ZODBD_NEO_KILLS times while 4 clients
    commit (the other cells of its partitions take the commits meanwhile;
    it is killed again while it catches up, except every 10th restart,
    after which it catches up under the commits). Then every acknowledged
    commit is readable, node 0 catches up (every cell UP_TO_DATE), `neoctl
    check` of every partition passes, and with node `other` killed
    (node 0 then serves its partitions alone) the clients read the same."""
    kills = int(os.environ.get('ZODBD_NEO_KILLS', '50'))
    c = neocluster.Cluster(spec, str(tmp_path), SRC, PY, zodbd=zodbd_bin)
    c.start()
    try:
        c.wait_up_to_date()
        res, logs = commit_through_kills(c, tmp_path, 0, kills, catch_up_every=10)
        c.wait_up_to_date(timeout=300)
        with open(os.path.join(c.dir, c.nodes[0].label + '.log'), errors='replace') as f:
            log = f.read()
        assert 'replicating partition' in log, log[-3000:]  # it caught up by replication
        c.check()
        c.kill_storage(other)
        res2 = fault_check(c, logs)
        assert res2 == res, (res2, res)
    finally:
        c.stop()


def test_fs_and_sqlite_replicas_after_pack(tmp_path, zodbd_bin):
    """A FileStorage node and a SQLite node holding the same partition
    (-p 1 -r 1) stay equal through a pack (the FileStorage node packs as
    NEO does): 20 commits with an undo (tests/neo_pack_check.py), `neoctl
    check` passes; after db.pack() at the last commit, once both nodes
    packed, `neoctl check` passes again, the client's iterator lists every
    transaction committed (NEO's pack keeps them all), and the same with
    the SQLite node stopped (the FileStorage node serving alone)."""
    c = neocluster.Cluster('zodbd-fs+zodbd-sqlite/p1/r1', str(tmp_path), SRC, PY, zodbd=zodbd_bin)
    c.start()

    def client(what):
        p = subprocess.run([PY, os.path.join(HERE, 'neo_pack_check.py'), c.master, c.name, what],
                           env=neo_env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-5000:] + c.logs()
        return json.loads(p.stdout.splitlines()[-1])

    def packed():
        # every node logged its pack order done
        for node in c.nodes:
            with open(os.path.join(c.dir, node.label + '.log'), errors='replace') as f:
                if not re.search(r'pack order \S+ done', f.read()):
                    return False
        return True

    try:
        c.wait_up_to_date()
        before = client('commit')
        assert len(before['tids']) >= 20, before
        c.check()
        client('pack')
        c.wait(packed, 'both nodes packed', 120)
        c.check()
        after = client('list')
        # Every transaction committed, then the pack's; fewer records.
        assert after['tids'][:-1] == before['tids'], (after, before)
        assert after['records'] < before['records'], (after, before)
        c.kill_storage(1)
        alone = client('list')
        assert alone == after, (alone, after)
    finally:
        c.stop()


BIG_CLIENT = r'''
import os, sys, transaction
from neo.client.Storage import Storage
from ZODB import DB
from persistent.mapping import PersistentMapping
master, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
blobs = [os.urandom(8 << 20) for _ in range(4)]
db = DB(Storage(master_nodes=master, name=name))
tm = transaction.TransactionManager()
root = db.open(tm).root()
for i in range(n):
    root['big%d' % i] = PersistentMapping(d=blobs[i % 4] + b'%d' % i)
tm.commit()
db.close()
db = DB(Storage(master_nodes=master, name=name))
root = db.open().root()
for i in range(n):
    assert root['big%d' % i]['d'] == blobs[i % 4] + b'%d' % i, i
db.close()
print('ok')
'''


@pytest.mark.parametrize('kind', KINDS)
def test_big_transaction(kind, tmp_path, zodbd_bin):
    """NEO/py's client commits 128 MiB in one transaction (16 objects of
    8 MiB of random data) through the node and reads it back; the node's
    anonymous memory stays bounded (its spools, BENCHMARKS.md "One big
    transaction through a NEO storage node"), and it holds no spool file
    afterwards."""
    c = neocluster.Cluster(kind, str(tmp_path), SRC, PY, zodbd=zodbd_bin).start()
    try:
        pid = c.nodes[0].proc.pid
        idle = rss(pid, 'RssAnon')
        dog = Watchdog(pid, rss(pid) + (1 << 30))
        try:
            p = subprocess.run([PY, '-c', BIG_CLIENT, c.master, c.name, '16'], env=neo_env(),
                               capture_output=True, text=True, timeout=600)
        finally:
            dog.stop()
        assert p.returncode == 0 and 'ok' in p.stdout, p.stderr[-5000:] + c.logs()
        assert dog.killed_at is None, 'node RSS passed 1 GiB more than idle: killed'
        peak = dog.peak_anon
        print('%s: node RssAnon idle %d MiB, peak %d MiB' % (kind, idle >> 20, peak >> 20))
        if kind != 'neopy':
            # As tests/test_hostile.py::test_neo_big_transaction.
            bound = idle + (64 << 20) + 6 * (8 << 20) + ((64 << 20) + 10 * (8 << 20) if kind == 'zodbd-sqlite' else 0)
            assert peak <= bound, 'peak anonymous RSS %d MiB > bound %d MiB' % (peak >> 20, bound >> 20)
            deleted = []
            for fd in os.listdir('/proc/%d/fd' % pid):
                try:
                    f = os.readlink('/proc/%d/fd/%s' % (pid, fd))
                except OSError:
                    continue
                if f.endswith('(deleted)'):
                    deleted.append(f)
            assert not deleted, 'spool files still open: %s' % deleted
    finally:
        c.stop()
