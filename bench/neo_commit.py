"""NEO commit benchmark: commits/s and commit latency of NEO/py's client
against a one-storage NEO cluster (NEO/py's master, -p 1 -r 0) whose
storage node is NEO/py's own (`neopy`: neostorage, SQLite) or zodbd's
(`zodbd-sqlite`: zodbd neo-storage sqlite:PATH; `zodbd-fs`: zodbd
neo-storage on a FileStorage), each on a fresh, empty database, paired in
rounds that alternate the storages.

    neo_commit.py --src NEOPY --python PY [--zodbd BIN] [--storages a,b]
                  [--committers 1,4,16] [-d S] [--rounds N] [--go] [--out FILE]

The workload is bench/zeo_commit.py --neo (each committer a process with
its own NEO/py client, changing 1 to 3 of its own objects per
transaction: no conflicts); with --go also zodbd wrk --commit (that many
Go NEO clients in one process). Prints one line per point and a table of
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', 'tests'))
import neocluster  # noqa: E402

CLUSTER = 'bench'


def run_point(a, cl, kind, c):
    out = os.path.join(cl.dir, 'c%d.json' % c)
    cmd = [a.python, os.path.join(HERE, 'zeo_commit.py'), cl.master, kind, '-c', str(c), '-d', str(a.d),
           '--neo', CLUSTER, '--json', out]
    p = subprocess.run(cmd, env=cl.env, capture_output=True, text=True, timeout=a.d * 4 + 300)
    if p.returncode != 0:
        raise SystemExit('neo_commit: %s c=%d failed: %s\n(logs in %s)' % (kind, c, p.stderr[-2000:], cl.dir))
    with open(out) as f:
        return json.load(f)


def run_go_point(a, cl, kind, c):
    """zodbd wrk --commit: c Go NEO clients in one process."""
    cmd = [a.zodbd, 'wrk', '--commit', '-c', str(c), '-d', '%gs' % a.d, '--json',
           'neo://%s@%s' % (CLUSTER, cl.master)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.d * 4 + 300)
    if p.returncode != 0:
        raise SystemExit('neo_commit: go %s c=%d failed: %s\n(logs in %s)' % (kind, c, p.stderr[-2000:], cl.dir))
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--src', required=True, help='NEO/py source tree')
    ap.add_argument('--python', required=True, help='a Python with NEO/py\'s dependencies and ZODB')
    ap.add_argument('--zodbd', default=os.path.join(HERE, '..', 'bin', 'zodbd'))
    ap.add_argument('--storages', default='neopy,zodbd-sqlite,zodbd-fs')
    ap.add_argument('--committers', default='1,4,16')
    ap.add_argument('-d', type=float, default=3.0, help='measured seconds per point')
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--go', action='store_true', help='also Go committers (zodbd wrk --commit)')
    ap.add_argument('--out', help='JSON file of every point')
    a = ap.parse_args()
    kinds = a.storages.split(',')
    cs = [int(x) for x in a.committers.split(',')]
    points = []
    for r in range(a.rounds):
        order = kinds if r % 2 == 0 else kinds[::-1]
        for kind in order:
            work = tempfile.mkdtemp(prefix='neo-commit-%s-' % kind)
            cl = neocluster.Cluster(kind, work, a.src, a.python, zodbd=a.zodbd, name=CLUSTER).start()
            try:
                for client in ['py', 'go'] if a.go else ['py']:
                    for c in cs:
                        res = (run_go_point if client == 'go' else run_point)(a, cl, kind, c)
                        pt = {'round': r, 'storage': kind, 'client': client, 'c': c, 'commits_s': res['ops_per_s'],
                              'p50_ms': res['latency_ns']['p50'] / 1e6, 'p99_ms': res['latency_ns']['p99'] / 1e6}
                        points.append(pt)
                        print('round %d %-13s %s c=%-3d %8.1f commits/s  p50 %.2f ms  p99 %.2f ms' % (
                            r, kind, client, c, pt['commits_s'], pt['p50_ms'], pt['p99_ms']), flush=True)
            finally:
                cl.stop()
            shutil.rmtree(work, ignore_errors=True)
    print('\nmedians over %d rounds (ratio: commits/s against neopy with the same clients)' % a.rounds)
    print('| storage | clients | committers | commits/s | p50 ms | p99 ms | ratio |')
    print('|---|---|---:|---:|---:|---:|---:|')
    for client in ['py', 'go'] if a.go else ['py']:
        for kind in kinds:
            for c in cs:
                ps = [p for p in points if p['storage'] == kind and p['c'] == c and p['client'] == client]
                med = statistics.median(p['commits_s'] for p in ps)
                ref = [p['commits_s'] for p in points if p['storage'] == 'neopy' and p['c'] == c
                       and p['client'] == client]
                ratio = '%.2f' % (med / statistics.median(ref)) if ref and kind != 'neopy' else ''
                print('| %s | %s | %d | %.0f | %.2f | %.2f | %s |' % (
                    kind, 'NEO/py' if client == 'py' else 'Go', c, med,
                    statistics.median(p['p50_ms'] for p in ps), statistics.median(p['p99_ms'] for p in ps), ratio))
    if a.out:
        with open(a.out, 'w') as f:
            json.dump(points, f, indent=1)


if __name__ == '__main__':
    main()
