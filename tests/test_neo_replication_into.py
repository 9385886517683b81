"""Live tests of NEO replication INTO a node that joins a running cluster
(opt-in like tests/test_neo_interop.py: NEOPY_SRC and NEOPY_PYTHON, see
docs/neo.md); clusters from tests/neocluster.py.

A NEO/py cluster (master -p 2 -r 1, admin) with one storage (S1, NEO/py's)
holding data; a zodbd node (SQLite backend) is started, `neoctl add` +
`neoctl tweak` give it both partitions OUT_OF_DATE: it replicates them
from S1 and the master makes them UP_TO_DATE; `neoctl check` of both
partitions passes; then S1 is SIGKILLed and NEO/py's client reads every
transaction record and every object through the zodbd node alone:
identical to what it read with S1. The second test does the same while a
NEO/py client keeps committing during the replication (those transactions
reach the zodbd node through the commit path); the third with a zodbd node
as the source; the fourth goes on to replicas=0: the zodbd node deletes
the rows of the partition it no longer holds. The last one adds a node
(zodbd's or NEO/py's) to a loaded mixed cluster (a zodbd and a NEO/py
node, -p 12 -r 1) while a client commits. test_check_finds_a_difference
shows that the harness's check fails when two replicas differ."""
import json
import os
import re
import sqlite3
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import neocluster  # noqa: E402

SRC = os.environ.get('NEOPY_SRC')
PY = os.environ.get('NEOPY_PYTHON')
pytestmark = pytest.mark.skipif(not (SRC and PY), reason='NEOPY_SRC and NEOPY_PYTHON not set (opt-in)')
NAME = 'repl'


def cluster(tmp_path, zodbd, kinds, partitions=2):
    c = neocluster.Cluster(kinds, str(tmp_path), SRC, PY, zodbd=zodbd, name=NAME, admin=True,
                           partitions=partitions, replicas=1)
    c.env['PYTHONPATH'] = os.pathsep.join([SRC, HERE])
    return c


def commit(c, n, tag):
    c.run_client('neo_repl_client.py', 'commit', str(n), tag)


def dump(c, path):
    c.run_client('neo_repl_client.py', 'dump', path)
    with open(path) as f:
        return json.load(f)


class Loop:
    """A NEO/py client committing (neo_repl_client.py loop) until stop()."""

    def __init__(self, c, tmp_path):
        self.stopfile = str(tmp_path / 'stop')
        self.p = subprocess.Popen([PY, os.path.join(HERE, 'neo_repl_client.py'), 'loop', c.master, NAME,
                                   self.stopfile], env=c.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)

    def stop(self):
        """How many transactions it committed."""
        open(self.stopfile, 'w').close()
        out, _ = self.p.communicate(timeout=60)
        assert self.p.returncode == 0, out[-3000:]
        return int(out.split()[-1])

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def join(c, kind, during=None):
    """Starts a node of the given kind, `neoctl add` (during() then runs),
    `neoctl tweak`; returns its index and node id once every cell is
    UP_TO_DATE."""
    i = c.add_storage(kind)
    nid = c.wait(lambda: c.node_state(i) == 'PENDING' and c.node_id(i), 'node %d pending' % i)
    c.ctl('add', nid)
    if during:
        during()
    c.ctl('tweak')
    rows = c.wait_up_to_date()
    assert 'U' in rows[nid], rows  # it was given cells and they are up to date
    return i, nid


def kill_and_compare(c, tmp_path, before, *kill):
    """SIGKILLs the given nodes: what the others serve equals before."""
    for i in kill:
        c.kill_storage(i)
    after = dump(c, str(tmp_path / 'after.json'))
    assert after['records'] == before['records'], c.logs()
    assert after['current'] == before['current'], c.logs()
    for i, n in enumerate(c.nodes):
        assert i in kill or n.proc.poll() is None, c.logs()


def test_zodbd_replicates_from_neopy(tmp_path, zodbd_bin):
    c = cluster(tmp_path, zodbd_bin, ['neopy'])
    try:
        c.start()
        c.wait_running()
        commit(c, 40, 'a')
        join(c, 'zodbd-sqlite')
        commit(c, 5, 'b')  # committed to both nodes
        before = dump(c, str(tmp_path / 'before.json'))
        assert len(before['records']) > 40
        c.check()
        kill_and_compare(c, tmp_path, before, 0)
    finally:
        c.stop()


def test_zodbd_replicates_while_committing(tmp_path, zodbd_bin):
    c = cluster(tmp_path, zodbd_bin, ['neopy'])
    loop = []
    try:
        c.start()
        c.wait_running()
        commit(c, 60, 'a')

        def start_loop():
            loop.append(Loop(c, tmp_path))
            time.sleep(1)
        join(c, 'zodbd-sqlite', during=start_loop)
        time.sleep(1)  # commits go on with both nodes up to date
        assert loop[0].stop() > 0
        before = dump(c, str(tmp_path / 'before.json'))
        c.check()
        kill_and_compare(c, tmp_path, before, 0)
    finally:
        if loop:
            loop[0].kill()
        c.stop()


def test_zodbd_replicates_from_zodbd(tmp_path, zodbd_bin):
    """The same with a zodbd node (SQLite) as the source: it serves the
    replication (replserve.go) and the checks."""
    c = cluster(tmp_path, zodbd_bin, ['zodbd-sqlite'])
    try:
        c.start()
        c.wait_running()
        commit(c, 40, 'a')
        join(c, 'zodbd-sqlite')
        commit(c, 5, 'b')
        before = dump(c, str(tmp_path / 'before.json'))
        c.check()
        kill_and_compare(c, tmp_path, before, 0)
    finally:
        c.stop()


def test_zodbd_drops_discarded_partition(tmp_path, zodbd_bin):
    """After the replication, `neoctl set replicas 0` + `neoctl tweak`: each
    node keeps one partition; the zodbd node deletes the rows of the one it
    no longer has, and the cluster still serves everything."""
    c = cluster(tmp_path, zodbd_bin, ['neopy'])
    try:
        c.start()
        c.wait_running()
        commit(c, 30, 'a')
        i, nid = join(c, 'zodbd-sqlite')
        before = dump(c, str(tmp_path / 'before.json'))
        c.ctl('set', 'replicas', '0')
        c.ctl('tweak')
        log = os.path.join(c.dir, c.nodes[i].label + '.log')

        def dropped():
            with open(log, errors='replace') as f:
                m = re.search(r'data of discarded partition (\d) deleted', f.read())
            return m and m.group(1)
        gone = int(c.wait(dropped, 'the zodbd node deletes a discarded partition'))
        row = c.pt()[nid]
        assert row == ('U.' if gone == 1 else '.U'), row
        db = sqlite3.connect('file:%s?mode=ro' % c.nodes[i].db, uri=True)
        counts = [db.execute('SELECT COUNT(*) FROM %s WHERE partition=?' % t, (p,)).fetchone()[0]
                  for t in ('obj', 'trans') for p in (gone, 1 - gone)]
        db.close()
        assert counts[0] == counts[2] == 0 and counts[1] > 0 and counts[3] > 0, counts
        after = dump(c, str(tmp_path / 'after.json'))
        assert after == before
    finally:
        c.stop()


@pytest.mark.parametrize('kind', ['zodbd-sqlite', 'neopy'])
def test_node_joins_loaded_mixed_cluster(kind, tmp_path, zodbd_bin):
    """A mixed cluster (a zodbd node on SQLite and a NEO/py node, -p 12
    -r 1) holding data, a client committing: a third node joins, is given
    cells by `neoctl tweak` (replicated from both kinds of source) and
    catches up while the commits go on; `neoctl check` of every partition
    passes; with the two first nodes killed in turn, the others serve
    every record and object."""
    c = cluster(tmp_path, zodbd_bin, ['zodbd-sqlite', 'neopy'], partitions=12)
    loop = []
    try:
        c.start()
        c.wait_up_to_date()
        commit(c, 60, 'a')

        def start_loop():
            loop.append(Loop(c, tmp_path))
            time.sleep(1)
        i, nid = join(c, kind, during=start_loop)
        time.sleep(1)
        assert loop[0].stop() > 0
        rows = c.pt()
        assert sum(r.count('U') for r in rows.values()) == 24 and rows[nid].count('U') >= 6, rows
        before = dump(c, str(tmp_path / 'before.json'))
        c.check()
        # Each partition is on two of the three nodes: killing one leaves
        # one readable cell of each.
        kill_and_compare(c, tmp_path, before, 0)
        c.start_storage(0)
        c.wait_up_to_date()
        kill_and_compare(c, tmp_path, before, 1)
    finally:
        if loop:
            loop[0].kill()
        c.stop()


def test_check_finds_a_difference(tmp_path, zodbd_bin):
    """The harness's check() fails when the replicas differ: a transaction
    row deleted behind the back of one of two zodbd nodes (-p 2 -r 1) is
    reported by `neoctl check`."""
    c = cluster(tmp_path, zodbd_bin, ['zodbd-sqlite', 'zodbd-sqlite'])
    try:
        c.start()
        c.wait_up_to_date()
        commit(c, 10, 'a')
        c.check()  # the same on both
        db = sqlite3.connect(c.nodes[1].db, timeout=10)
        with db:
            n = db.execute('DELETE FROM trans WHERE partition=0 AND tid=(SELECT MAX(tid) FROM trans'
                           ' WHERE partition=0)').rowcount
        db.close()
        assert n == 1
        with pytest.raises(AssertionError, match='neoctl check found differences') as e:
            c.check()
        # zodbd's checker logs it; NEO/py's master, told, logs it too
        assert re.search(r'partition 0 differs|Partition 0 corrupted', str(e.value)), str(e.value)[:3000]
    finally:
        c.stop()
