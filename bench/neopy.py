"""NEO/py for `make bench`: import a dataset into a NEO/py SQLite database,
and serve one as a one-storage NEO/py cluster (master + storage) in the
foreground, until SIGTERM.

NEO/py runs from a source tree (NEO_PY, on PYTHONPATH) with a Python that
has its dependencies (msgpack, ZODB, six, python-dateutil); see docs/neo.md.

    neopy.py import --src DIR --python PY [--cluster NAME] Data.fs neo.sqlite
    neopy.py serve  --src DIR --python PY --addr HOST:PORT --cluster NAME neo.sqlite

`serve` prints "operational" once NEO/py's own client can read from the
cluster (the harness waits for that line)."""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests'))
from zeoserver import free_port  # noqa: E402  (shared with the tests: never one port twice)


class Nodes:
    def __init__(self, a, logdir):
        self.a, self.logdir, self.procs = a, logdir, []
        self.env = dict(os.environ, PYTHONPATH=a.src)

    def spawn(self, script, *args):
        log = open(os.path.join(self.logdir, script + '.log'), 'ab')
        p = subprocess.Popen([self.a.python, '-c', 'import neo.scripts.%s as m; m.main()' % script] + list(args),
                             env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_listen(addr, timeout=30):
    host, port = addr.rsplit(':', 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit('neopy: nothing listens on %s' % addr)


def cmd_import(a):
    """Importer backend: NEO/py copies the FileStorage into the SQLite DB."""
    work = tempfile.mkdtemp(prefix='neopy-import-')
    # A copy: NEO/py's FileStorage would leave .index/.lock/.tmp beside it.
    fs = os.path.join(work, 'Data.fs')
    shutil.copyfile(a.fs, fs)
    conf = os.path.join(work, 'importer.conf')
    with open(conf, 'w') as f:
        f.write('[neo]\nadapter=SQLite\ndatabase=%s\n[root]\nstorage=\n  <filestorage>\n'
                '    path %s\n  </filestorage>\n' % (os.path.abspath(a.db), fs))
    master = '127.0.0.1:%d' % free_port()
    n = Nodes(a, work)
    try:
        n.spawn('neomaster', '-c', a.cluster, '-b', master, '-m', master, '-p', '1', '-r', '0', '-A', '1')
        wait_listen(master)
        n.spawn('neostorage', '-c', a.cluster, '-b', '127.0.0.1:%d' % free_port(), '-m', master,
                '-a', 'Importer', '-d', conf)
        log = os.path.join(work, 'neostorage.log')
        deadline = time.monotonic() + a.timeout
        while time.monotonic() < deadline:
            if 'All data are imported' in open(log, errors='replace').read():
                break
            if any(p.poll() is not None for p in n.procs):
                raise SystemExit('neopy import: a node exited; logs in %s' % work)
            time.sleep(0.2)
        else:
            raise SystemExit('neopy import: not done in %ds; logs in %s' % (a.timeout, work))
    finally:
        n.stop()
    shutil.rmtree(work)
    print('imported %s into %s' % (a.fs, a.db))


PROBE = '''
import sys
from neo.client.Storage import Storage
st = Storage(master_nodes=sys.argv[1], name=sys.argv[2], read_only=True)
st.load(b"\\0" * 8)
st.close()
'''


def cmd_serve(a):
    logdir = a.logdir or tempfile.mkdtemp(prefix='neopy-serve-')
    n = Nodes(a, logdir)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    try:
        n.spawn('neomaster', '-c', a.cluster, '-b', a.addr, '-m', a.addr, '-p', '1', '-r', '0')
        wait_listen(a.addr)
        # The storage's node id and partition table are in the DB: the
        # cluster starts by itself.
        n.spawn('neostorage', '-c', a.cluster, '-b', '127.0.0.1:%d' % free_port(), '-m', a.addr,
                '-a', 'SQLite', '-d', os.path.abspath(a.db))
        deadline = time.monotonic() + 60
        while not stop:
            p = subprocess.run([a.python, '-c', PROBE, a.addr, a.cluster], env=n.env,
                               capture_output=True, timeout=60)
            if p.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise SystemExit('neopy serve: the cluster does not serve: %s' % p.stderr.decode()[-500:])
            time.sleep(0.3)
        print('operational (NEO/py cluster %s on %s, logs in %s)' % (a.cluster, a.addr, logdir), flush=True)
        while not stop:
            if any(p.poll() is not None for p in n.procs):
                raise SystemExit('neopy serve: a node exited; logs in %s' % logdir)
            time.sleep(0.2)
    finally:
        n.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest='cmd', required=True)
    for name in ('import', 'serve'):
        p = sub.add_parser(name)
        p.add_argument('--src', required=True, help='NEO/py source tree')
        p.add_argument('--python', required=True, help='a Python with NEO/py\'s dependencies')
    p = sub.choices['import']
    p.add_argument('--cluster', default='bench', help='the cluster the database will belong to')
    p.add_argument('fs')
    p.add_argument('db')
    p.add_argument('--timeout', type=int, default=1800)
    p = sub.choices['serve']
    p.add_argument('--addr', required=True)
    p.add_argument('--cluster', default='bench')
    p.add_argument('--logdir')
    p.add_argument('db')
    a = ap.parse_args()
    {'import': cmd_import, 'serve': cmd_serve}[a.cmd](a)


if __name__ == '__main__':
    main()
