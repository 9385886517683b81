"""Live test of NEO's backup mode with zodbd's nodes upstream (opt-in, like
tests/test_neo_writes.py: NEOPY_SRC and NEOPY_PYTHON, see docs/neo.md).

An upstream cluster ('up': NEO/py's master and admin, zodbd's node as its
storage: FileStorage or SQLite with 2 partitions) takes NEO/py's client's
workload (tests/neo_repl_worker.py). A backup cluster ('bk': NEO/py's
master started with the upstream's name and masters and --backup, two
NEO/py storage nodes with 1 replica) follows it: its master gets the
upstream's invalidations as a client would, the primary cell of each
partition fetches from zodbd's node (which serves the fetches to storage
nodes that identify anonymously, as NEO's backup storages do), the other
cell from that primary. The backup's backup_tid reaches the upstream's
last tid; it follows new commits; `neoctl check` in backup mode compares
every backup cell with the upstream's (zodbd's node answers the check
requests); then the backup cluster leaves backup mode (STOPPING_BACKUP,
RUNNING) and its client reads back exactly what it read from zodbd's.

The same with zodbd's nodes as the backup cluster's members
(test_zodbd_backup_members, SQLite): two zodbd nodes following zodbd's
node, and a zodbd node beside a NEO/py node following NEO/py's node; they
take the master's Replicate orders (from the upstream's node,
anonymously, or from the partition's primary cell in the backup cluster),
keep the backup tid, answer NEO/py's client in backup mode up to it and
refuse its commits, catch up after a SIGKILL, and are checked against the
upstream by `neoctl check`; leaving backup mode truncates them at the
backup tid."""
import json
import os
import re
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import neocluster  # noqa: E402

SRC = os.environ.get('NEOPY_SRC')
PY = os.environ.get('NEOPY_PYTHON')
pytestmark = pytest.mark.skipif(not (SRC and PY), reason='NEOPY_SRC and NEOPY_PYTHON not set (opt-in)')


def worker(c, mode):
    return c.run_client('neo_repl_worker.py', mode)


def read_when_caught_up(c, want, timeout=120):
    """worker(c, 'dump') once it reads want: the master's backup_tid is
    its partitions' best cells' (min over partitions of the max over their
    cells), while each node bounds its clients' reads by its own backup
    tid: until every cell caught up from the partition's primary, a
    client reading one gets TID_NOT_FOUND, or less than the backup_tid
    (NEO/py's nodes the same). What it read last."""
    deadline = time.monotonic() + timeout
    got = None
    while True:
        try:
            got = json.loads(worker(c, 'dump'))
            if got == want:
                return got
        except AssertionError:
            pass
        if time.monotonic() > deadline:
            return got
        time.sleep(1)


def ids(c):
    """(backup_tid or None, last_tid) from `neoctl print ids`."""
    out = c.ctl('print', 'ids')
    b = re.search(r'backup_tid = (0x[0-9a-f]+)', out)
    last = re.search(r'last_tid = (0x[0-9a-f]+)', out)
    return (int(b.group(1), 16) if b else None), int(last.group(1), 16)


@pytest.mark.parametrize('kind,partitions', [('zodbd-fs', 1), ('zodbd-sqlite', 2)])
def test_neopy_backup_of_zodbd(kind, partitions, tmp_path, zodbd_bin):
    run_backup(kind, 'neopy+neopy', partitions, tmp_path, zodbd_bin)


@pytest.mark.parametrize('kind,members,partitions', [
    pytest.param('zodbd-sqlite', 'zodbd-sqlite+zodbd-sqlite', 2, id='zodbd-of-zodbd'),
    pytest.param('neopy', 'zodbd-sqlite+neopy', 3, id='zodbd-neopy-of-neopy'),
])
def test_zodbd_backup_members(kind, members, partitions, tmp_path, zodbd_bin):
    run_backup(kind, members, partitions, tmp_path, zodbd_bin)


def run_backup(kind, members, partitions, tmp_path, zodbd_bin):
    zodbd_up = kind != 'neopy'
    metrics = '127.0.0.1:%d' % neocluster.free_port()
    os.makedirs(str(tmp_path / 'up'))
    os.makedirs(str(tmp_path / 'bk'))
    up = neocluster.Cluster(kind, str(tmp_path / 'up'), SRC, PY, zodbd=zodbd_bin, name='up', admin=True,
                            partitions=partitions, zodbd_args=['--http-addr', metrics] if zodbd_up else ())
    bk = None
    try:
        up.start()
        up.wait_running()
        worker(up, 'commit')
        want = json.loads(worker(up, 'dump'))
        _, last = ids(up)

        bk = neocluster.Cluster(members, str(tmp_path / 'bk'), SRC, PY, zodbd=zodbd_bin, name='bk', admin=True,
                                partitions=partitions, replicas=1,
                                master_args=['--upstream-cluster', 'up', '--upstream-masters', up.master,
                                             '--backup'])
        bk.start()
        bk.wait(lambda: 'BACKINGUP' in bk.ctl('print', 'cluster'), 'the backup cluster to back up', 120)
        bk.wait(lambda: ids(bk)[0] == last, 'backup_tid to reach the upstream last tid %#x' % last, 300)
        if zodbd_up:
            served = neocluster.requests_served(metrics)
            for req in ('AskFetchTransactions', 'AskFetchObjects'):
                assert served.get(req, 0) >= 2, served  # more than one chunk each
        # Clients read the backup as of its backup tid, and cannot write.
        assert read_when_caught_up(bk, want) == want
        with pytest.raises(AssertionError, match='ReadOnly|read-only|read only'):
            worker(bk, 'more')

        # It follows new commits upstream; a zodbd member stopped
        # meanwhile (SIGKILL) catches up when it comes back.
        killed = bk.nodes[0].zodbd
        if killed:
            bk.kill_storage(0)
        worker(up, 'more')
        want = json.loads(worker(up, 'dump'))
        _, last2 = ids(up)
        assert last2 > last
        if killed:
            bk.start_storage(0)
            bk.wait(lambda: all(set(r) == {'U'} for r in bk.pt().values()) and len(bk.pt()) == len(bk.nodes),
                    'every cell of the backup cluster UP_TO_DATE again', 300)
        bk.wait(lambda: ids(bk)[0] == last2, 'backup_tid to follow the upstream to %#x' % last2, 300)
        if killed:
            assert read_when_caught_up(bk, want) == want

        # neoctl check in backup mode: every backup cell against the
        # upstream's.
        before = neocluster.requests_served(metrics) if zodbd_up else None
        bk.check()
        if zodbd_up:
            served = neocluster.requests_served(metrics)
            for req in ('AskCheckTIDRange', 'AskCheckSerialRange'):
                assert served.get(req, 0) >= before.get(req, 0) + partitions, (before, served)
        # Each zodbd member replicated (from upstream when primary of a
        # partition, else from the primary); with zodbd members only,
        # one of them fetched from upstream.
        upstream = 0
        for node in bk.nodes:
            if node.zodbd:
                log = open(os.path.join(bk.dir, node.label + '.log'), errors='replace').read()
                assert 'backup mode, backup tid' in log, log[-3000:]
                assert re.search(r'backup: replicating partition \d+ from ', log), log[-3000:]
                upstream += len(re.findall(r'backup: replicating partition \d+ from \S+ of upstream cluster up', log))
        if all(node.zodbd for node in bk.nodes):
            assert upstream > 0

        # The backup cluster leaves backup mode and serves the same data.
        bk.ctl('set', 'cluster', 'STOPPING_BACKUP')
        bk.wait_running(120)
        got = json.loads(worker(bk, 'dump'))
        assert got == want
        # And takes commits of its own.
        worker(bk, 'more')
    finally:
        if bk is not None:
            bk.stop()
        up.stop()
