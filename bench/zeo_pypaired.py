"""Python-client loads against two ZEO servers, paired block by block: the
stock ZEO.ClientStorage (cache off) loads every oid of the storage from
server A and from server B (the same file), alternating in blocks of
--block loads, the one that goes first alternating too. Prints each
side's µs per object and the median over the blocks of A's time over B's,
as Go benchmark lines: a machine whose speed drifts moves both sides of a
block alike, which rounds minutes apart (bench/zeo_pyload.sh) do not.

usage: zeo_pypaired.py A_HOST:PORT B_HOST:PORT NAME [--block 100] [--loads N]
"""
import argparse
import statistics
import time

from ZEO.ClientStorage import ClientStorage
from ZODB.POSException import POSKeyError
from ZODB.utils import maxtid, p64


def connect(addr):
    host, port = addr.rsplit(':', 1)
    return ClientStorage((host, int(port)), read_only=True, wait_timeout=30,
                         cache_size=0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('a', metavar='A_HOST:PORT')
    ap.add_argument('b', metavar='B_HOST:PORT')
    ap.add_argument('name')
    ap.add_argument('--block', type=int, default=100)
    ap.add_argument('--loads', type=int, default=100000,
                    help='loads per side (default 100000)')
    args = ap.parse_args()
    a, b = connect(args.a), connect(args.b)
    try:
        call_a, call_b = a._call, b._call
        n = len(a)
        oids = []
        for oid in range(10 * n + 1000):
            if len(oids) == n:
                break
            try:
                if call_a('loadBefore', p64(oid), maxtid) is not None:
                    call_b('loadBefore', p64(oid), maxtid)  # warm B too
                    oids.append(p64(oid))
            except POSKeyError:
                pass
        clock = time.perf_counter_ns
        k = args.block

        def run(call, i):
            t0 = clock()
            for j in range(i, i + k):
                call('loadBefore', oids[j % len(oids)], maxtid)
            return clock() - t0

        ta = tb = 0
        ratios = []
        for blk, i in enumerate(range(0, args.loads, k)):
            if blk % 2 == 0:
                da = run(call_a, i)
                db = run(call_b, i)
            else:
                db = run(call_b, i)
                da = run(call_a, i)
            ta += da
            tb += db
            ratios.append(da / db)
        loads = len(ratios) * k
        print('BenchmarkPyPaired/%s %d %.2f a-us/object %.2f b-us/object '
              '%.3f a-x-b' % (args.name, loads, ta / loads / 1e3,
                              tb / loads / 1e3, statistics.median(ratios)),
              flush=True)
    finally:
        a.close()
        b.close()


if __name__ == '__main__':
    main()
