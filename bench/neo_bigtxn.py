"""One big transaction through a zodbd NEO storage node: the node's peak
anonymous memory and the commit's time, for zodbd builds, paired; with
--small, the small commits of `zodbd wrk --commit` instead.

    neo_bigtxn.py [--mib 384] [--rounds 2] [--backends fs,sqlite] NAME=ZODBD_TEST_BIN ...
    neo_bigtxn.py --small 16 [-d 4] [--rounds 4] NAME=ZODBD_TEST_BIN ...

The builds must be test builds (`make build-test`: `neo-storage
--with-master` runs the test master in the node's process). A source
Data.fs holding MIB MiB in one transaction (objects of 8 MiB of random
data, a PersistentMapping each) is written once with ZODB/py. Each round
starts, for every backend and every build in turn (the order alternating
from round to round), a node (`neo-storage --read-write`) on an empty
database in a scratch directory ($TMPDIR for the node too, where its
spools go), and commits the source into it with `zodbd copy` of the same
build (or of --client), whose peak anonymous memory it also prints; it
prints the seconds the copy took and the node's
RssAnon, idle and at its peak (sampled every 10 ms: the SQLite backend
maps its file, whose pages are the page cache's, not the node's). With
--small C, C Go committers (`zodbd wrk --commit -c C -d D`) commit small
transactions instead: commits/s, p50, p99 and the node's CPU time per
commit (/proc/PID/stat across the run, over the commits measured; wrk's
setup transactions make it a little high).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', 'tests'))
from testutil import Watchdog, rss  # noqa: E402
from zeoserver import free_port  # noqa: E402
sys.path.insert(0, HERE)
from machine import proc_cpu_seconds  # noqa: E402

MiB = 1 << 20
NO_LIMIT = 1 << 62


def run(cmd):
    """cmd's exit status, stdout, stderr and peak anonymous memory (bytes,
    sampled every 10 ms; the rusage of a child of this Python would count
    this process's own peak, from before the exec)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        sampler = Watchdog(p.pid, NO_LIMIT)
        p.wait()
        sampler.stop()
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read().decode(), err.read().decode(), sampler.peak_anon


def make_source(path, mib):
    import transaction
    from persistent.mapping import PersistentMapping
    from ZODB import DB
    from ZODB.FileStorage import FileStorage
    data = [os.urandom(8 * MiB) for _ in range(4)]
    db = DB(FileStorage(path, create=True))
    tm = transaction.TransactionManager()
    root = db.open(tm).root()
    for i in range(mib // 8):
        root['big%d' % i] = PersistentMapping(d=data[i % 4] + b'%d' % i)
    tm.commit()
    db.close()


def one(a, name, binary, backend, src):
    d = tempfile.mkdtemp(prefix='neo-bigtxn-')
    try:
        if backend == 'fs':
            from ZODB.FileStorage import FileStorage
            db = os.path.join(d, 'Data.fs')
            FileStorage(db, create=True).close()
        else:
            db = 'sqlite:' + os.path.join(d, 'neo.sqlite')
        mport = free_port()
        url = 'neo://bench@127.0.0.1:%d' % mport
        env = dict(os.environ, TMPDIR=d)
        with open(os.path.join(d, 'node.log'), 'wb') as log:
            node = subprocess.Popen([binary, 'neo-storage', '--cluster', 'bench', '--read-write',
                                     '--with-master', '127.0.0.1:%d' % mport, db],
                                    stdout=log, stderr=subprocess.STDOUT, env=env)
        client = a.client or binary
        try:
            deadline = time.time() + 30
            while subprocess.run([client, 'hash', url], capture_output=True).returncode != 0:
                if node.poll() is not None or time.time() > deadline:
                    raise SystemExit('neo_bigtxn: %s %s: the node did not start (log in %s)' % (name, backend, d))
                time.sleep(0.2)
            time.sleep(0.2)
            idle = rss(node.pid, 'RssAnon')
            cpu0 = proc_cpu_seconds(node.pid)
            sampler = Watchdog(node.pid, NO_LIMIT)
            t0 = time.time()
            if a.small:
                rc, out, err, crss = run([client, 'wrk', '--commit', '-c', str(a.small), '-d', '%gs' % a.d, '--json', url])
            else:
                rc, out, err, crss = run([client, 'copy', '-q', src, url])
            dt = time.time() - t0
            cpu = proc_cpu_seconds(node.pid) - cpu0
            sampler.stop()
            peak = sampler.peak_anon
            if rc != 0:
                raise SystemExit('neo_bigtxn: %s %s: %s' % (name, backend, err[-2000:]))
        finally:
            node.terminate()
            node.wait(30)
        if a.small:
            j = json.loads(out.splitlines()[0])
            print('%-8s %-6s %2d committers: %6.0f commits/s, p50 %6.0f us, p99 %6.0f us, node CPU %5.0f us/commit, node RssAnon peak %4d MiB'
                  % (name, backend, a.small, j['ops_per_s'], j['latency_ns']['p50'] / 1e3,
                     j['latency_ns']['p99'] / 1e3, cpu / max(j['ops'], 1) * 1e6, peak // MiB), flush=True)
        else:
            print('%-8s %-6s %5d MiB in one transaction: %6.1f s, node RssAnon idle %4d MiB, peak %5d MiB; client peak RssAnon %5d MiB'
                  % (name, backend, a.mib, dt, idle // MiB, peak // MiB, crss // MiB), flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--mib', type=int, default=384)
    p.add_argument('--rounds', type=int, default=2)
    p.add_argument('--backends', default='fs,sqlite')
    p.add_argument('--small', type=int, default=0, metavar='C', help='C committers of small transactions instead')
    p.add_argument('-d', type=float, default=4, help='seconds per --small point')
    p.add_argument('--client', help='the zodbd that commits (default: each build itself)')
    p.add_argument('builds', nargs='+', metavar='NAME=ZODBD_TEST_BIN')
    a = p.parse_args()
    builds = [tuple(s.split('=', 1)) for s in a.builds]
    scratch = tempfile.mkdtemp(prefix='neo-bigtxn-src-')
    try:
        src = os.path.join(scratch, 'src.fs')
        if not a.small:
            make_source(src, a.mib)
        for r in range(a.rounds):
            for backend in a.backends.split(','):
                order = builds if r % 2 == 0 else builds[::-1]
                for name, binary in order:
                    one(a, name, binary, backend, src)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
