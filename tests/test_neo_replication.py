"""Live test of replication from `zodbd neo-storage` to NEO/py's storage
node (opt-in, like tests/test_neo_writes.py: NEOPY_SRC and NEOPY_PYTHON,
see docs/neo.md).

A NEO/py master and admin with zodbd's node as the only storage (`zodbd-fs`:
FileStorage, 1 partition; `zodbd-sqlite`: SQLite, 2 partitions); NEO/py's
client commits a workload (tests/neo_repl_worker.py) and reads it all back.
Then a NEO/py storage node joins: `neoctl set replicas 1`, `neoctl add`,
`neoctl tweak`, and it replicates every partition from zodbd's node (its
cells go UP_TO_DATE); `neoctl check` of every partition compares its
replicas with zodbd's (the node's metrics show that it answered the check
requests) and no cell is found corrupted. zodbd's node is then killed: the
cluster runs on NEO/py's node alone, and its client reads back exactly what
it read from zodbd's."""
import json
import os
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


@pytest.mark.parametrize('kind,partitions', [('zodbd-fs', 1), ('zodbd-sqlite', 2)])
def test_neopy_replicates_from_zodbd(kind, partitions, tmp_path, zodbd_bin):
    metrics = '127.0.0.1:%d' % neocluster.free_port()
    c = neocluster.Cluster(kind, str(tmp_path), SRC, PY, zodbd=zodbd_bin, admin=True, partitions=partitions,
                           zodbd_args=['--http-addr', metrics])
    c.start()
    try:
        c.wait_running()
        worker(c, 'commit')
        before = json.loads(worker(c, 'dump'))
        assert len(before['txns']) > 1100 and any(r[1] is None for t in before['txns'] for r in t[4]), \
            'workload not as designed'

        # NEO/py's storage node joins and replicates every partition.
        s2 = c.add_storage('neopy')
        s2name = c.wait(lambda: c.node_state(s2) == 'PENDING' and c.node_id(s2), 'NEO/py node to be pending')
        c.ctl('set', 'replicas', '1')
        c.replicas = 1
        c.ctl('add', s2name)
        c.ctl('tweak')
        rows = c.wait_up_to_date()
        assert rows[s2name] == 'U' * partitions, rows
        served = neocluster.requests_served(metrics)
        for req in ('AskFetchTransactions', 'AskFetchObjects'):
            assert served.get(req, 0) >= 2, served  # more than one chunk each

        # Replica check of every partition against zodbd's node.
        c.check()
        served = neocluster.requests_served(metrics)
        for req in ('AskCheckTIDRange', 'AskCheckSerialRange'):
            assert served.get(req, 0) >= partitions, served

        # zodbd's node goes: NEO/py's serves everything alone.
        c.kill_storage()
        c.wait_running()
        after = json.loads(worker(c, 'dump'))
        assert after == before
    finally:
        c.stop()
