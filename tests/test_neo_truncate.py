"""Live tests of `neoctl truncate` on clusters with zodbd's storage nodes
(opt-in, like tests/test_neo_writes.py: NEOPY_SRC and NEOPY_PYTHON, see
docs/neo.md).

NEO/py's master stops the cluster and sends Truncate(TID) to every
storage node; each records the order, reports it in its recovery answer
and deletes what follows TID when the master asks its last ids; the
cluster then starts again by itself. A SQLite node of zodbd's must end
with exactly what NEO/py's node beside it keeps; a FileStorage node,
which cannot cut its file, must stop with an error rather than go on
serving the transactions the others deleted."""
import json
import os
import sqlite3
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import neocluster  # noqa: E402

SRC = os.environ.get('NEOPY_SRC')
PY = os.environ.get('NEOPY_PYTHON')
pytestmark = pytest.mark.skipif(not (SRC and PY), reason='NEOPY_SRC and NEOPY_PYTHON not set (opt-in)')


def client(c, what):
    """tests/neo_pack_check.py WHAT against cluster c: the iterator's tids
    and records per transaction."""
    env = dict(os.environ, NEOPY_SRC=SRC, PYTHONPATH=os.pathsep.join([SRC, HERE]))
    p = subprocess.run([PY, os.path.join(HERE, 'neo_pack_check.py'), c.master, c.name, what],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-5000:] + c.logs()
    return json.loads(p.stdout.splitlines()[-1])


@pytest.mark.parametrize('spec', [
    pytest.param('zodbd-sqlite+neopy/p2/r1', id='zodbd-neopy-p2r1'),
    pytest.param('zodbd-sqlite+zodbd-sqlite/p3/r1', id='2zodbd-p3r1'),
])
def test_truncate(spec, tmp_path, zodbd_bin):
    """20 commits, `neoctl truncate` at the 13th: the cluster runs again
    with the first 13 transactions, their records unchanged; no row of
    zodbd's databases is after the tid; `neoctl check` passes; each node
    alone (the other killed) serves the same; new commits follow."""
    c = neocluster.Cluster(spec, str(tmp_path), SRC, PY, zodbd=zodbd_bin)
    c.start()
    try:
        c.wait_up_to_date()
        before = client(c, 'commit')
        assert len(before['tids']) >= 20, before
        k = 12
        tid = before['tids'][k]
        c.ctl('truncate', 'tid:0x' + tid)
        c.wait_up_to_date(timeout=120)
        after = client(c, 'list')
        assert after['tids'] == before['tids'][:k + 1], (after, before)
        assert after['counts'] == before['counts'][:k + 1], (after, before)
        for i, node in enumerate(c.nodes):
            log = open(os.path.join(c.dir, node.label + '.log'), errors='replace').read()
            if node.zodbd:
                assert 'database truncated after %s' % tid in log, log[-3000:]
                db = sqlite3.connect('file:%s?mode=ro' % node.db, uri=True)
                try:
                    for table in ('trans', 'obj'):
                        n, = db.execute('SELECT COUNT(*) FROM %s WHERE tid > ?' % table,
                                        (int(tid, 16),)).fetchone()
                        assert n == 0, (node.label, table, n)
                    n, = db.execute("SELECT COUNT(*) FROM config WHERE name='truncate_tid'").fetchone()
                    assert n == 0, node.label
                finally:
                    db.close()
        c.check()
        c.kill_storage(1)
        alone = client(c, 'list')
        assert alone == after, (alone, after)
        c.start_storage(1)
        c.wait_up_to_date(timeout=120)
        c.kill_storage(0)
        alone = client(c, 'list')
        assert alone == after, (alone, after)
        c.start_storage(0)
        c.wait_up_to_date(timeout=120)
        more = client(c, 'commit')
        assert more['tids'][:k + 1] == after['tids'] and len(more['tids']) > k + 1, more
        assert more['tids'][k + 1] > before['tids'][-1], more
        c.check()
    finally:
        c.stop()


def test_truncate_refused_on_filestorage(tmp_path, zodbd_bin):
    """A FileStorage node cannot cut its file: on Truncate it stops, with
    an error saying why, and its file keeps every transaction."""
    c = neocluster.Cluster('zodbd-fs', str(tmp_path), SRC, PY, zodbd=zodbd_bin, admin=True)
    c.start()
    try:
        c.wait_running()
        before = client(c, 'commit')
        c.ctl('truncate', 'tid:0x' + before['tids'][12])
        node = c.nodes[0]
        node.proc.wait(60)
        assert node.proc.returncode != 0
        log = open(os.path.join(c.dir, node.label + '.log'), errors='replace').read()
        assert 'this node cannot do it' in log and 'FileStorage' in log, log[-3000:]
        out = subprocess.run([zodbd_bin, 'info', node.db], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert before['tids'][-1] in out.stdout.replace('0x', ''), out.stdout
    finally:
        c.stop()
