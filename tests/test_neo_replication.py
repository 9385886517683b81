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
import re
import subprocess
import sys
import time
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import neocluster  # noqa: E402

SRC = os.environ.get('NEOPY_SRC')
PY = os.environ.get('NEOPY_PYTHON')
pytestmark = pytest.mark.skipif(not (SRC and PY), reason='NEOPY_SRC and NEOPY_PYTHON not set (opt-in)')


def worker(c, mode):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, HERE]))
    p = subprocess.run([PY, os.path.join(HERE, 'neo_repl_worker.py'), mode, c.master, c.name],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-5000:] + c.logs()
    return p.stdout


def requests_served(metrics_addr):
    """The count of each NEO request zodbd's node served, from its metrics."""
    text = urllib.request.urlopen('http://%s/metrics' % metrics_addr, timeout=10).read().decode()
    counts = {}
    for m in re.finditer(r'^zodbd_request_duration_seconds_count\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        counts[labels.get('method')] = float(m.group(2))
    return counts


def wait(cond, what, c, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        r = cond()
        if r:
            return r
        if time.monotonic() > deadline:
            raise AssertionError('timeout waiting for %s\n%s' % (what, c.logs()))
        time.sleep(0.2)


@pytest.mark.parametrize('kind,partitions', [('zodbd-fs', 1), ('zodbd-sqlite', 2)])
def test_neopy_replicates_from_zodbd(kind, partitions, tmp_path, zodbd_bin):
    metrics = '127.0.0.1:%d' % neocluster.free_port()
    c = neocluster.Cluster(kind, str(tmp_path), SRC, PY, zodbd=zodbd_bin, admin=True, partitions=partitions,
                           zodbd_args=['--http-addr', metrics])
    c.start()
    s2 = None
    try:
        wait(lambda: 'RUNNING' in c.ctl('print', 'cluster'), 'the cluster to run', c)
        worker(c, 'commit')
        before = json.loads(worker(c, 'dump'))
        assert len(before['txns']) > 1100 and any(r[1] is None for t in before['txns'] for r in t[4]), \
            'workload not as designed'

        # NEO/py's storage node joins and replicates every partition.
        port = neocluster.free_port()
        s2 = c._spawn('storage2', c._neo('neostorage') + [
            '-c', c.name, '-b', '127.0.0.1:%d' % port, '-m', c.master, '-a', 'SQLite',
            '-d', str(tmp_path / 'neopy.sqlite')])
        node = wait(lambda: re.search(r'^(S\d+) \| STORAGE \| 127\.0\.0\.1:%d \| PENDING' % port,
                                      c.ctl('print', 'node'), re.M), 'NEO/py node to be pending', c)
        s2name = node.group(1)
        c.ctl('set', 'replicas', '1')
        c.ctl('add', s2name)
        c.ctl('tweak')

        def replicated():
            pt = c.ctl('print', 'pt')
            rows = dict(line.split(' ', 1) for line in pt.splitlines() if re.match(r'S\d+ ', line))
            return s2name in rows and rows[s2name].split()[-1] == 'U' * partitions and pt
        wait(replicated, 'replication', c, timeout=120)
        served = requests_served(metrics)
        for req in ('AskFetchTransactions', 'AskFetchObjects'):
            assert served.get(req, 0) >= 2, served  # more than one chunk each

        # Replica check of every partition against zodbd's node.
        c.ctl('check', *['%d:' % p for p in range(partitions)])

        def corrupted():
            # what the master says of a mismatch: a log line, cells CORRUPTED
            with open(os.path.join(c.dir, 'master.log'), errors='replace') as f:
                log = [line for line in f if 'corrupted' in line]
            pt = c.ctl('print', 'pt')
            cells = ''.join(line.split()[-1] for line in pt.splitlines() if re.match(r'S\d+ ', line))
            return log + ([pt] if 'C' in cells else [])
        wait(lambda: corrupted() or requests_served(metrics).get('AskCheckSerialRange', 0) >= partitions,
             'the check requests', c)
        time.sleep(2)  # a late mismatch would be reported by now
        assert not corrupted(), corrupted()
        served = requests_served(metrics)
        assert served.get('AskCheckTIDRange', 0) >= partitions, served

        # zodbd's node goes: NEO/py's serves everything alone.
        c.kill_storage()
        wait(lambda: 'RUNNING' in c.ctl('print', 'cluster'), 'the cluster to run', c)
        after = json.loads(worker(c, 'dump'))
        assert after == before
    finally:
        if s2 is not None and s2.poll() is None:
            s2.terminate()
            try:
                s2.wait(10)
            except subprocess.TimeoutExpired:
                s2.kill()
                s2.wait()
        c.stop()
