"""Python-client load benchmark: a loop of loadBefore over every oid of a
storage through ZEO.ClientStorage (cold client cache), against a ZEO
server at HOST:PORT. Prints µs/object as Go benchmark lines.

usage: zeo_pyload.py HOST:PORT NAME [ROUNDS] [--sample N] [--json FILE]

The oids are those of the server's storage, 0..LastOid walked by the
iterator-free method zodbd hash uses: loadBefore(oid, maxtid) for oid in
0..max_oid, skipping missing ones. That first walk is not timed (it also
warms the server up).

--sample N   load only N oids spread evenly over the storage (big datasets)
--json FILE  also write the last round's per-call latencies (ns) to FILE,
             summarized as bench/latency.py does (percentiles, histogram)
"""
import argparse
import json
import os
import sys
import time

from ZEO.ClientStorage import ClientStorage
from ZODB.POSException import POSKeyError
from ZODB.utils import maxtid, p64

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import latency  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description='ZEO loadBefore loop')
    ap.add_argument('addr', metavar='HOST:PORT|SOCKET')
    ap.add_argument('name')
    ap.add_argument('rounds', nargs='?', type=int, default=3)
    ap.add_argument('--sample', type=int, default=0)
    ap.add_argument('--json', metavar='FILE')
    a = ap.parse_args()
    cs = ClientStorage(latency.server_address(a.addr), read_only=True, wait_timeout=30,
                       cache_size=0)
    try:
        # Find the oids once (outside of the timing).
        n = len(cs)
        call = cs._call
        stride = max(1, n // a.sample) if a.sample else 1
        want = min(n, a.sample) if a.sample else n
        oids = []
        oid = 0
        while len(oids) < want and oid < 10 * n + 1000:
            try:
                if call('loadBefore', p64(oid), maxtid) is not None:
                    oids.append(p64(oid))
            except POSKeyError:
                pass
            oid += stride
        clock = time.perf_counter_ns
        for r in range(a.rounds):
            lat = []
            t0 = time.perf_counter()
            nbytes = 0
            for o in oids:
                c0 = clock()
                data, start, end = call('loadBefore', o, maxtid)
                lat.append(clock() - c0)
                nbytes += len(data)
            dt = time.perf_counter() - t0
            print('BenchmarkPyLoad/%s %d %.0f ns/op %.2f µs/object' % (
                a.name, len(oids), dt / len(oids) * 1e9, dt / len(oids) * 1e6),
                flush=True)
        if a.json:
            res = latency.summarize(lat, 1, dt, 'zeo_pyload', bytes=nbytes)
            with open(a.json, 'w') as f:
                json.dump(res, f)
    finally:
        cs.close()


if __name__ == '__main__':
    main()
