"""NEO commit benchmark: commits/s and commit latency of NEO/py's client
against a one-storage NEO cluster (NEO/py's master, -p 1 -r 0) whose
storage node is NEO/py's own (`neopy`: neostorage, SQLite) or zodbd's
(`zodbd-sqlite`: zodbd neo-storage sqlite:PATH; `zodbd-fs`: zodbd
neo-storage on a FileStorage), each on a fresh, empty database, paired in
rounds that alternate the storages.

    neo_commit.py --src NEOPY --python PY [--zodbd BIN] [--storages a,b]
                  [--committers 1,4,16] [-d S] [--rounds N] [--out FILE]

The workload is bench/zeo_commit.py --neo (each committer a process with
its own NEO/py client, changing 1 to 3 of its own objects per
transaction: no conflicts). Prints one line per point and a table of
medians over the rounds with zodbd/NEO/py ratios; --out writes every
point as JSON."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from neopy import free_port, wait_listen  # noqa: E402

CLUSTER = 'bench'


class Cluster:
    """A NEO/py master (autostart) and one storage node of the given kind."""

    def __init__(self, a, kind, work):
        self.procs, self.work = [], work
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([a.src] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
        self.env = env
        self.master = '127.0.0.1:%d' % free_port()
        self.spawn('master', [a.python, '-c', 'import neo.scripts.neomaster as m; m.main()', '-c', CLUSTER,
                              '-b', self.master, '-m', self.master, '-p', '1', '-r', '0', '-A', '1'])
        wait_listen(self.master)
        bind = '127.0.0.1:%d' % free_port()
        if kind == 'neopy':
            self.spawn('storage', [a.python, '-c', 'import neo.scripts.neostorage as m; m.main()', '-c', CLUSTER,
                                   '-b', bind, '-m', self.master, '-a', 'SQLite', '-d',
                                   os.path.join(work, 'neo.sqlite')])
        elif kind == 'zodbd-sqlite':
            self.spawn('storage', [a.zodbd, 'neo-storage', '--cluster', CLUSTER, '--masters', self.master,
                                   '--bind', bind, 'sqlite:' + os.path.join(work, 'neo.sqlite')])
        elif kind == 'zodbd-fs':
            fs = os.path.join(work, 'Data.fs')
            subprocess.run([a.python, '-c', 'import sys; from ZODB.FileStorage import FileStorage; '
                            'FileStorage(sys.argv[1], create=True).close()', fs], check=True, env=env)
            self.spawn('storage', [a.zodbd, 'neo-storage', '--cluster', CLUSTER, '--masters', self.master,
                                   '--bind', bind, fs])
        else:
            raise SystemExit('neo_commit: unknown storage %r' % kind)

    def spawn(self, name, cmd):
        log = open(os.path.join(self.work, name + '.log'), 'ab')
        p = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.work)
        self.procs.append(p)

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


def run_point(a, cl, kind, c):
    out = os.path.join(cl.work, 'c%d.json' % c)
    cmd = [a.python, os.path.join(HERE, 'zeo_commit.py'), cl.master, kind, '-c', str(c), '-d', str(a.d),
           '--neo', CLUSTER, '--json', out]
    p = subprocess.run(cmd, env=cl.env, capture_output=True, text=True, timeout=a.d * 4 + 300)
    if p.returncode != 0:
        raise SystemExit('neo_commit: %s c=%d failed: %s\n(logs in %s)' % (kind, c, p.stderr[-2000:], cl.work))
    with open(out) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--src', required=True, help='NEO/py source tree')
    ap.add_argument('--python', required=True, help='a Python with NEO/py\'s dependencies and ZODB')
    ap.add_argument('--zodbd', default=os.path.join(HERE, '..', 'bin', 'zodbd'))
    ap.add_argument('--storages', default='neopy,zodbd-sqlite,zodbd-fs')
    ap.add_argument('--committers', default='1,4,16')
    ap.add_argument('-d', type=float, default=3.0, help='measured seconds per point')
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--out', help='JSON file of every point')
    a = ap.parse_args()
    kinds = a.storages.split(',')
    cs = [int(x) for x in a.committers.split(',')]
    points = []
    for r in range(a.rounds):
        order = kinds if r % 2 == 0 else kinds[::-1]
        for kind in order:
            work = tempfile.mkdtemp(prefix='neo-commit-%s-' % kind)
            cl = Cluster(a, kind, work)
            try:
                for c in cs:
                    res = run_point(a, cl, kind, c)
                    pt = {'round': r, 'storage': kind, 'c': c, 'commits_s': res['ops_per_s'],
                          'p50_ms': res['latency_ns']['p50'] / 1e6, 'p99_ms': res['latency_ns']['p99'] / 1e6}
                    points.append(pt)
                    print('round %d %-13s c=%-3d %8.1f commits/s  p50 %.2f ms  p99 %.2f ms' % (
                        r, kind, c, pt['commits_s'], pt['p50_ms'], pt['p99_ms']), flush=True)
            finally:
                cl.stop()
            shutil.rmtree(work, ignore_errors=True)
    print('\nmedians over %d rounds (ratio: commits/s against neopy)' % a.rounds)
    print('| storage | committers | commits/s | p50 ms | p99 ms | ratio |')
    print('|---|---:|---:|---:|---:|---:|')
    for kind in kinds:
        for c in cs:
            ps = [p for p in points if p['storage'] == kind and p['c'] == c]
            med = statistics.median(p['commits_s'] for p in ps)
            ref = [p['commits_s'] for p in points if p['storage'] == 'neopy' and p['c'] == c]
            ratio = '%.2f' % (med / statistics.median(ref)) if ref and kind != 'neopy' else ''
            print('| %s | %d | %.0f | %.2f | %.2f | %s |' % (
                kind, c, med, statistics.median(p['p50_ms'] for p in ps),
                statistics.median(p['p99_ms'] for p in ps), ratio))
    if a.out:
        with open(a.out, 'w') as f:
            json.dump(points, f, indent=1)


if __name__ == '__main__':
    main()
