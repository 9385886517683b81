"""Commit workload: N committers, each a process with its own ZEO client
(ZEO.DB) or, with --neo, NEO client (neo.client.Storage: run it with a
Python that imports NEO/py), commit small transactions as fast as they can
for DUR seconds;
reports commits/s and the latency of transaction.commit() (the client's
whole two-phase commit: stores, vote, finish, invalidations).

usage: zeo_commit.py HOST:PORT NAME [-c N] [-d DUR] [--warmup S]
                     [--objects K] [--size BYTES] [--json FILE] [--neo CLUSTER]

With --neo CLUSTER, HOST:PORT is the NEO master of that cluster.

Before the run, one client creates K PersistentMappings per committer
under root['zodbd-bench-commit-N']. Each transaction then changes 1 to 3 of
the committer's own objects (BYTES of random data each), so committers
never conflict: what is measured is the server's commit path (commit lock,
fsync, invalidations to the other clients), not conflict resolution. The
server must be writable; run it on a scratch copy of a database.

Prints a Go benchmark line; --json writes the latencies (ns) summarized as
bench/latency.py does.
"""
import argparse
import json
import multiprocessing
import os
import random
import sys
import time

import transaction
from persistent.mapping import PersistentMapping
from ZODB.POSException import ConflictError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import latency  # noqa: E402


NEO_CLUSTER = None  # set by --neo


def open_db(addr):
    if NEO_CLUSTER is not None:
        from neo.client.Storage import Storage
        from ZODB import DB
        return DB(Storage(master_nodes='%s:%d' % addr, name=NEO_CLUSTER))
    import ZEO  # not imported at the top: NEO/py's Python may not have it
    return ZEO.DB(addr, wait_timeout=30)


def setup(addr, key, n, k):
    db = open_db(addr)
    try:
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        conn.root()[key] = PersistentMapping(
            {i: [PersistentMapping() for _ in range(k)] for i in range(n)})
        tm.commit()
        conn.close()
    finally:
        db.close()


def committer(addr, key, i, size, warmup, dur, barrier, q):
    try:
        rnd = random.Random(i)
        db = open_db(addr)
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        objs = conn.root()[key][i]
        conflicts = 0

        def one():
            nonlocal conflicts
            for o in rnd.sample(objs, rnd.randint(1, min(3, len(objs)))):
                o['v'] = os.urandom(size)
            try:
                tm.commit()
            except ConflictError:
                conflicts += 1
                tm.abort()

        deadline = time.monotonic() + warmup
        one()
        while time.monotonic() < deadline:
            one()
        barrier.wait(timeout=60)
        clock = time.perf_counter_ns
        lat = []
        end = time.monotonic() + dur
        while time.monotonic() < end:
            c0 = clock()
            one()
            lat.append(clock() - c0)
        conn.close()
        db.close()
        q.put((i, lat, conflicts, None))
    except BaseException as e:  # report, never hang the parent
        try:
            barrier.abort()
        except Exception:
            pass
        q.put((i, [], 0, '%s: %s' % (type(e).__name__, e)))


def main():
    ap = argparse.ArgumentParser(description='ZEO commit workload')
    ap.add_argument('addr', metavar='HOST:PORT|SOCKET')
    ap.add_argument('name')
    ap.add_argument('-c', type=int, default=1, help='committers (processes)')
    ap.add_argument('-d', type=float, default=2.0, help='measured seconds')
    ap.add_argument('--warmup', type=float, default=0.3)
    ap.add_argument('--objects', type=int, default=10)
    ap.add_argument('--size', type=int, default=300)
    ap.add_argument('--json', metavar='FILE')
    ap.add_argument('--neo', metavar='CLUSTER', help='HOST:PORT is the master of this NEO cluster')
    a = ap.parse_args()
    global NEO_CLUSTER
    NEO_CLUSTER = a.neo
    addr = latency.server_address(a.addr)
    key = 'zodbd-bench-commit-%d' % a.c
    setup(addr, key, a.c, a.objects)

    # fork: the children share the imported modules (quick start); the
    # parent holds no ZEO connection (setup closed it) when they fork.
    ctx = multiprocessing.get_context('fork')
    barrier = ctx.Barrier(a.c)
    q = ctx.Queue()
    procs = [ctx.Process(target=committer,
                         args=(addr, key, i, a.size, a.warmup, a.d, barrier, q))
             for i in range(a.c)]
    for p in procs:
        p.start()
    results = [q.get(timeout=a.d + a.warmup + 120) for _ in procs]
    for p in procs:
        p.join()
    errors = [r[3] for r in results if r[3]]
    if errors:
        sys.exit('zeo_commit: committer failed: %s' % errors[0])
    lat = [x for r in results for x in r[1]]
    conflicts = sum(r[2] for r in results)
    res = latency.summarize(lat, a.c, a.d, 'zeo_commit', conflicts=conflicts)
    print('BenchmarkCommit/%s/c=%d %d %.0f ns/op %.1f commits/s' % (
        a.name, a.c, res['ops'], 1e9 / res['ops_per_s'] if res['ops'] else 0,
        res['ops_per_s']), flush=True)
    if a.json:
        with open(a.json, 'w') as f:
            json.dump(res, f)


if __name__ == '__main__':
    main()
