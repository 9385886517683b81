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

zodbd's nodes cannot be members of a backup cluster (the node exits on
StartOperation [backup]: docs/neo.md)."""
import json
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import neocluster  # noqa: E402

SRC = os.environ.get('NEOPY_SRC')
PY = os.environ.get('NEOPY_PYTHON')
pytestmark = pytest.mark.skipif(not (SRC and PY), reason='NEOPY_SRC and NEOPY_PYTHON not set (opt-in)')


def worker(c, mode):
    return c.run_client('neo_repl_worker.py', mode)


def ids(c):
    """(backup_tid or None, last_tid) from `neoctl print ids`."""
    out = c.ctl('print', 'ids')
    b = re.search(r'backup_tid = (0x[0-9a-f]+)', out)
    last = re.search(r'last_tid = (0x[0-9a-f]+)', out)
    return (int(b.group(1), 16) if b else None), int(last.group(1), 16)


@pytest.mark.parametrize('kind,partitions', [('zodbd-fs', 1), ('zodbd-sqlite', 2)])
def test_neopy_backup_of_zodbd(kind, partitions, tmp_path, zodbd_bin):
    metrics = '127.0.0.1:%d' % neocluster.free_port()
    os.makedirs(str(tmp_path / 'up'))
    os.makedirs(str(tmp_path / 'bk'))
    up = neocluster.Cluster(kind, str(tmp_path / 'up'), SRC, PY, zodbd=zodbd_bin, name='up', admin=True,
                            partitions=partitions, zodbd_args=['--http-addr', metrics])
    bk = None
    try:
        up.start()
        up.wait_running()
        worker(up, 'commit')
        want = json.loads(worker(up, 'dump'))
        _, last = ids(up)

        bk = neocluster.Cluster('neopy+neopy', str(tmp_path / 'bk'), SRC, PY, name='bk', admin=True,
                                partitions=partitions, replicas=1,
                                master_args=['--upstream-cluster', 'up', '--upstream-masters', up.master,
                                             '--backup'])
        bk.start()
        bk.wait(lambda: 'BACKINGUP' in bk.ctl('print', 'cluster'), 'the backup cluster to back up', 120)
        bk.wait(lambda: ids(bk)[0] == last, 'backup_tid to reach the upstream last tid %#x' % last, 300)
        served = neocluster.requests_served(metrics)
        for req in ('AskFetchTransactions', 'AskFetchObjects'):
            assert served.get(req, 0) >= 2, served  # more than one chunk each

        # It follows new commits upstream.
        worker(up, 'more')
        want = json.loads(worker(up, 'dump'))
        _, last2 = ids(up)
        assert last2 > last
        bk.wait(lambda: ids(bk)[0] == last2, 'backup_tid to follow the upstream to %#x' % last2, 300)

        # neoctl check in backup mode: every backup cell against zodbd's.
        before = neocluster.requests_served(metrics)
        bk.check()
        served = neocluster.requests_served(metrics)
        for req in ('AskCheckTIDRange', 'AskCheckSerialRange'):
            assert served.get(req, 0) >= before.get(req, 0) + partitions, (before, served)

        # The backup cluster leaves backup mode and serves the same data.
        bk.ctl('set', 'cluster', 'STOPPING_BACKUP')
        bk.wait_running(120)
        got = json.loads(worker(bk, 'dump'))
        assert got == want
    finally:
        if bk is not None:
            bk.stop()
        up.stop()
