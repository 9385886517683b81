"""Live test of NEO replication INTO a zodbd node (opt-in like
tests/test_neo_interop.py: NEOPY_SRC and NEOPY_PYTHON, see docs/neo.md).

A NEO/py cluster (master -p 2 -r 1, admin) with one NEO/py storage (S1)
holding data; a zodbd node (SQLite backend) is started, `neoctl add` +
`neoctl tweak` give it both partitions OUT_OF_DATE: it replicates them
from S1 and the master makes them UP_TO_DATE; `neoctl check` runs; then
S1 is SIGKILLed and NEO/py's client reads every transaction record and
every object through the zodbd node alone: identical to what it read with
S1. The second test does the same while a NEO/py client keeps committing
during the replication (those transactions reach the zodbd node through
the commit path); the third with a zodbd node as the source (skipped when
that node does not serve replication); the fourth goes on to replicas=0:
the zodbd node deletes the rows of the partition it no longer holds."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from zeoserver import free_port, wait_listening  # noqa: E402

SRC = os.environ.get('NEOPY_SRC')
PY = os.environ.get('NEOPY_PYTHON')
pytestmark = pytest.mark.skipif(not (SRC and PY), reason='NEOPY_SRC and NEOPY_PYTHON not set (opt-in)')
NAME = 'repl'


class Cluster:
    def __init__(self, d, zodbd):
        self.d, self.zodbd = d, zodbd
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, HERE]))
        self.master = '127.0.0.1:%d' % free_port()
        self.admin = '127.0.0.1:%d' % free_port()
        self.procs = {}

    def spawn(self, name, cmd, addr):
        log = open(os.path.join(self.d, name + '.log'), 'ab')
        p = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.d)
        self.procs[name] = p
        host, port = addr.rsplit(':', 1)
        wait_listening((host, int(port)), p, os.path.join(self.d, name + '.log'))
        return p

    def neo(self, script):
        return [PY, '-c', 'import neo.scripts.%s as m; m.main()' % script]

    def start(self, source='neopy'):
        self.spawn('master', self.neo('neomaster') + ['-c', NAME, '-b', self.master, '-m', self.master,
                                                       '-p', '2', '-r', '1', '-A', '1'], self.master)
        s1 = '127.0.0.1:%d' % free_port()
        db = os.path.join(self.d, 's1.sqlite')
        if source == 'neopy':
            cmd = self.neo('neostorage') + ['-c', NAME, '-b', s1, '-m', self.master, '-a', 'SQLite', '-d', db]
        else:  # zodbd: the node serving replication
            cmd = [self.zodbd, 'neo-storage', '--cluster', NAME, '--masters', self.master, '--bind', s1,
                   '--read-write', 'sqlite:' + db]
        self.spawn('s1', cmd, s1)
        self.spawn('admin', self.neo('neoadmin') + ['-c', NAME, '-b', self.admin, '-m', self.master], self.admin)
        self.wait(lambda: 'RUNNING' in self.ctl('print', 'cluster'), 'cluster running')

    def start_zodbd(self):
        s2 = '127.0.0.1:%d' % free_port()
        self.s2 = s2
        self.spawn('s2', [self.zodbd, 'neo-storage', '--cluster', NAME, '--masters', self.master, '--bind', s2,
                          '--read-write', 'sqlite:' + os.path.join(self.d, 's2.sqlite')], s2)

    def ctl(self, *args):
        p = subprocess.run(self.neo('neoctl') + ['-a', self.admin] + list(args), env=self.env,
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError('neoctl %s: %s' % (' '.join(args), p.stdout + p.stderr))
        return p.stdout

    def client(self, *args, **kw):
        return subprocess.run([PY, os.path.join(HERE, 'neo_repl_client.py')] + list(args[:1]) +
                              [self.master, NAME] + list(args[1:]), env=self.env, capture_output=True,
                              text=True, timeout=kw.get('timeout', 300))

    def wait(self, cond, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if cond():
                    return
            except RuntimeError:
                pass
            time.sleep(0.2)
        raise AssertionError('timeout waiting for %s\n%s' % (what, self.logs()))

    def s2_nid(self):
        for line in self.ctl('print', 'node').splitlines():
            if self.s2 in line:
                return line.split('|')[0].strip()
        return None

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def logs(self, tail=4000):
        out = []
        for name in self.procs:
            with open(os.path.join(self.d, name + '.log'), errors='replace') as f:
                out.append('--- %s.log\n%s' % (name, f.read()[-tail:]))
        return '\n'.join(out)


def dump(c, path):
    p = c.client('dump', path)
    assert p.returncode == 0, p.stderr[-3000:] + c.logs()
    return json.load(open(path))


def replicate_and_check(c, tmp_path, during=None):
    c.start_zodbd()
    c.wait(lambda: c.s2_nid() is not None, 'zodbd node known to the master')
    nid = c.s2_nid()
    c.ctl('add', nid)
    if during:
        during()
    c.ctl('tweak')

    def up_to_date():
        log = open(os.path.join(c.d, 's2.log'), errors='replace').read()
        if 'error 9' in log or 'BACKEND_NOT_IMPLEMENTED' in log:
            pytest.skip('the source node does not serve replication (zodbd without the serving side)')
        pt = c.ctl('print', 'pt')
        row = [l for l in pt.splitlines() if l.startswith(nid + ' ')]
        return row and re.search(r' UU$', row[0]) is not None
    c.wait(up_to_date, 'the zodbd node up to date', timeout=120)
    return nid


def check_and_kill(c, tmp_path, before):
    c.ctl('check', '0:', '1:')

    def checked():
        # the master asks the node of each partition's last cell: ours
        log = open(os.path.join(c.d, 's2.log'), errors='replace').read()
        return all('partition %d checked' % p in log for p in (0, 1))
    c.wait(checked, 'the zodbd node checks both partitions')
    pt = c.ctl('print', 'pt')
    assert 'C' not in ''.join(l.split(' ', 2)[-1] for l in pt.splitlines() if not l.startswith('#')), pt
    c.procs['s1'].send_signal(signal.SIGKILL)
    c.procs['s1'].wait(20)
    after = dump(c, str(tmp_path / 'after.json'))
    assert after['records'] == before['records'], c.logs()
    assert after['current'] == before['current'], c.logs()
    assert c.procs['s2'].poll() is None, c.logs()


def test_zodbd_replicates_from_neopy(tmp_path, zodbd_bin):
    c = Cluster(str(tmp_path), zodbd_bin)
    try:
        c.start()
        p = c.client('commit', '40', 'a')
        assert p.returncode == 0, p.stderr[-3000:] + c.logs()
        replicate_and_check(c, tmp_path)
        p = c.client('commit', '5', 'b')  # committed to both nodes
        assert p.returncode == 0, p.stderr[-3000:] + c.logs()
        before = dump(c, str(tmp_path / 'before.json'))
        assert len(before['records']) > 40
        check_and_kill(c, tmp_path, before)
    finally:
        c.stop()


def test_zodbd_replicates_while_committing(tmp_path, zodbd_bin):
    c = Cluster(str(tmp_path), zodbd_bin)
    stop = str(tmp_path / 'stop')
    loop = []
    try:
        c.start()
        p = c.client('commit', '60', 'a')
        assert p.returncode == 0, p.stderr[-3000:] + c.logs()

        def start_loop():
            loop.append(subprocess.Popen([PY, os.path.join(HERE, 'neo_repl_client.py'), 'loop', c.master, NAME,
                                          stop], env=c.env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True))
            time.sleep(1)
        replicate_and_check(c, tmp_path, during=start_loop)
        time.sleep(1)  # commits go on with both nodes up to date
        open(stop, 'w').close()
        out, _ = loop[0].communicate(timeout=60)
        assert loop[0].returncode == 0, out[-3000:]
        assert int(out.split()[-1]) > 0, out
        before = dump(c, str(tmp_path / 'before.json'))
        check_and_kill(c, tmp_path, before)
    finally:
        if loop and loop[0].poll() is None:
            loop[0].kill()
        c.stop()


def test_zodbd_replicates_from_zodbd(tmp_path, zodbd_bin):
    """The same with a zodbd node (SQLite) as the source: it serves the
    replication (replserve.go) and the checks."""
    c = Cluster(str(tmp_path), zodbd_bin)
    try:
        c.start(source='zodbd')
        p = c.client('commit', '40', 'a')
        assert p.returncode == 0, p.stderr[-3000:] + c.logs()
        replicate_and_check(c, tmp_path)
        p = c.client('commit', '5', 'b')
        assert p.returncode == 0, p.stderr[-3000:] + c.logs()
        before = dump(c, str(tmp_path / 'before.json'))
        check_and_kill(c, tmp_path, before)
    finally:
        c.stop()


def test_zodbd_drops_discarded_partition(tmp_path, zodbd_bin):
    """After the replication, `neoctl set replicas 0` + `neoctl tweak`: each
    node keeps one partition; the zodbd node deletes the rows of the one it
    no longer has, and the cluster still serves everything."""
    import sqlite3
    c = Cluster(str(tmp_path), zodbd_bin)
    try:
        c.start()
        p = c.client('commit', '30', 'a')
        assert p.returncode == 0, p.stderr[-3000:] + c.logs()
        nid = replicate_and_check(c, tmp_path)
        before = dump(c, str(tmp_path / 'before.json'))
        c.ctl('set', 'replicas', '0')
        c.ctl('tweak')

        def dropped():
            log = open(os.path.join(c.d, 's2.log'), errors='replace').read()
            m = re.search(r'data of discarded partition (\d) deleted', log)
            return m and m.group(1)
        c.wait(dropped, 'the zodbd node deletes a discarded partition')
        gone = int(dropped())
        row = [l for l in c.ctl('print', 'pt').splitlines() if l.startswith(nid + ' ')][0]
        assert row.endswith(' U.' if gone == 1 else ' .U'), row
        db = sqlite3.connect('file:%s?mode=ro' % os.path.join(c.d, 's2.sqlite'), uri=True)
        counts = [db.execute('SELECT COUNT(*) FROM %s WHERE partition=?' % t, (p,)).fetchone()[0]
                  for t in ('obj', 'trans') for p in (gone, 1 - gone)]
        db.close()
        assert counts[0] == counts[2] == 0 and counts[1] > 0 and counts[3] > 0, counts
        after = dump(c, str(tmp_path / 'after.json'))
        assert after == before
    finally:
        c.stop()
