"""Commits under contention: many Python client processes (the stock
ZEO.ClientStorage and ZODB.DB) committing to the same objects, against
zodbd serve and runzeo (its default configuration: conflicts resolved on
the server), paired in one run.

Both servers run at once, each on its own new Data.fs. For each workload
(tests/zeo_contention_app.py: `length`, one shared BTrees.Length;
`catalog`, OOBTrees/OIBTree with a Length each and shared keys; `counter`,
a class only Python can resolve) and each number of processes, the servers
take turns in blocks of --block seconds, the one going first alternating,
--rounds blocks each: both see the same machine state. The clients retry
on ConflictError, as transaction.manager.attempts() does.

Reported per server: successful commits per second, p50 and p99 latency
of a successful commit (from its first attempt, retries included; and of
its last tm.commit() call), the ConflictErrors that reached the
application (each one a retry), the objects whose conflicts were resolved
in successful votes (by the server or the client), the conflicts the
clients tried to resolve (tryToResolveConflict calls: zodbd sends every
conflict to the client; runzeo resolves on the server), the exceptions other than ConflictError
that reached the application, the conflict resolutions that failed with
an error (e.g. POSKeyError), and whether the final state is exactly that
of the successful commits. Prints a table and Go benchmark lines.

usage: zeo_contention.py [--zodbd bin/zodbd] [--procs 4,16]
       [--workloads length,catalog] [--block 5] [--rounds 2] [--msgpack]
"""
import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, 'tests'))

import ZEO  # noqa: E402

import zeo_contention_app as app  # noqa: E402
from zeoserver import Server  # noqa: E402


def pct(xs, q):
    if not xs:
        return float('nan')
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--zodbd', default=os.environ.get('ZODBD') or os.path.join(REPO, 'bin', 'zodbd'))
    ap.add_argument('--servers', default='zodbd,runzeo')
    ap.add_argument('--procs', default='4,16', help='client processes, comma-separated (default 4,16)')
    ap.add_argument('--workloads', default='length,catalog', help='of %s' % ','.join(app.WORKLOADS))
    ap.add_argument('--block', type=float, default=5, help='seconds per block (default 5)')
    ap.add_argument('--rounds', type=int, default=2, help='blocks per server (default 2)')
    ap.add_argument('--msgpack', action='store_true', help='both servers speak msgpack (M5)')
    args = ap.parse_args()
    servers = args.servers.split(',')
    procs = [int(x) for x in args.procs.split(',')]
    workloads = args.workloads.split(',')
    print('$ %s' % ' '.join(shlex.quote(a) for a in [sys.executable] + sys.argv), flush=True)
    # runzeo resolves Counter; keep a PYTHONPATH that holds ZODB itself
    os.environ['PYTHONPATH'] = os.pathsep.join(
        [os.path.join(REPO, 'tests')] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    tmp = tempfile.mkdtemp(prefix='zeo_contention.')
    rows, lines = [], []
    for w in workloads:
        srv, reports = {}, {s: [] for s in servers}
        try:
            for s in servers:
                d = os.path.join(tmp, '%s-%s' % (w, s))
                os.mkdir(d)
                srv[s] = Server(args.zodbd, os.path.join(d, 'Data.fs'), d, kind=s, msgpack=args.msgpack,
                                extra=['--create'] if s == 'zodbd' else []).start()
                app.run_setup({'addr': srv[s].addr, 'workload': w, 'nprocs': max(procs)})
            run = 0
            for n in procs:
                acc = {s: {'ok': 0, 'secs': 0.0, 'lat': [], 'clat': [], 'conflicts': 0, 'resolves': 0, 'resolved': 0,
                           'errors': 0, 'reserr': 0, 'gaveup': 0} for s in servers}
                for r in range(args.rounds):
                    order = servers if r % 2 == 0 else servers[::-1]
                    for s in order:
                        run += 1
                        reps = app.run_clients(srv[s].addr, w, n, duration=args.block, seed=run,
                                               timeout=args.block * 10 + 120)
                        reports[s].extend(reps)
                        a = acc[s]
                        a['ok'] += sum(x['ok'] for x in reps)
                        a['secs'] += max(x['elapsed'] for x in reps)
                        for x in reps:
                            a['lat'] += x['latencies']
                            a['clat'] += x['commit_latencies']
                            a['conflicts'] += x['conflicts']
                            a['resolves'] += x['client_resolves']
                            a['resolved'] += x['resolved']
                            a['errors'] += len(x['errors'])
                            a['reserr'] += len(x['resolution_errors'])
                            a['gaveup'] += x['gaveup']
                        print('  %s c=%d %s round %d: %d commits in %.1f s, %d ConflictErrors, %d errors'
                              % (w, n, s, r, sum(x['ok'] for x in reps), max(x['elapsed'] for x in reps),
                                 sum(x['conflicts'] for x in reps), sum(len(x['errors']) for x in reps)),
                              file=sys.stderr, flush=True)
                for s in servers:
                    a = acc[s]
                    a.update(w=w, n=n, s=s, cps=a['ok'] / a['secs'] if a['secs'] else 0,
                             p50=pct(a['lat'], .5) * 1e3, p99=pct(a['lat'], .99) * 1e3,
                             cp50=pct(a['clat'], .5) * 1e3, cp99=pct(a['clat'], .99) * 1e3)
                    rows.append(a)
                    lines.append('BenchmarkContention/%s/c=%d/%s %d %.1f commits/s %.2f p50-ms %.2f p99-ms '
                                 '%d app-conflicts %d client-resolves %d errors %d resolve-errors'
                                 % (w, n, s, a['ok'], a['cps'], a['p50'], a['p99'], a['conflicts'],
                                    a['resolves'], a['errors'], a['reserr']))
            # The final state of each server against all its successful commits.
            for s in servers:
                db = ZEO.DB(srv[s].addr, wait_timeout=30)
                try:
                    bad = [p for p in app.problems(db.open().root(), w, reports[s])
                           if not p.startswith('client ')]  # the errors are counted above
                finally:
                    db.close()
                for a in rows:
                    if a['w'] == w and a['s'] == s:
                        a['state'] = 'ok' if not bad else 'WRONG (%d)' % len(bad)
                for p in bad[:5]:
                    print('%s %s: %s' % (w, s, p), file=sys.stderr)
        finally:
            for s in srv.values():
                s.stop()
    print()
    print('block %.0f s x %d rounds per server, %s, %d cores, load average %s'
          % (args.block, args.rounds, 'msgpack' if args.msgpack else 'pickle', os.cpu_count(),
             ' '.join('%.1f' % x for x in os.getloadavg())))
    print()
    print('| workload | procs | server | commits/s | p50 ms | p99 ms | commit() p50/p99 ms '
          '| ConflictErrors to app | resolved in votes | client resolves | other errors | resolve errors | gave up | final state |')
    print('|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|')
    for a in rows:
        print('| %s | %d | %s | %.1f | %.1f | %.1f | %.1f / %.1f | %d | %d | %d | %d | %d | %d | %s |'
              % (a['w'], a['n'], a['s'], a['cps'], a['p50'], a['p99'], a['cp50'], a['cp99'],
                 a['conflicts'], a['resolved'], a['resolves'], a['errors'], a['reserr'], a['gaveup'], a.get('state', '?')))
    if 'zodbd' in servers and 'runzeo' in servers:
        print()
        for w in workloads:
            for n in procs:
                z = [a for a in rows if (a['w'], a['n'], a['s']) == (w, n, 'zodbd')][0]
                r = [a for a in rows if (a['w'], a['n'], a['s']) == (w, n, 'runzeo')][0]
                ratio = z['cps'] / r['cps'] if r['cps'] else float('nan')
                # ConflictErrors are compared per successful commit: a server
                # that commits 5x more meets more of the workload's genuine
                # conflicts (the same key changed by two transactions).
                zc = z['conflicts'] / z['ok'] if z['ok'] else float('inf')
                rc = r['conflicts'] / r['ok'] if r['ok'] else float('inf')
                fewer = zc < rc or (zc == 0 and rc == 0)
                print('%s c=%d: zodbd/runzeo successful commits/s %.2fx; ConflictErrors to app %d vs %d '
                      '(%.2f vs %.2f per successful commit)%s'
                      % (w, n, ratio, z['conflicts'], r['conflicts'], zc, rc,
                         '' if n != max(procs) else '  (target >= 2x, fewer per commit: %s)'
                         % ('met' if ratio >= 2 and fewer and not z['errors'] and not z['reserr'] else 'NOT met')))
    print()
    for line in lines:
        print(line)


if __name__ == '__main__':
    main()
