"""Python-client load benchmark: a loop of loadBefore over every oid of a
storage through ZEO.ClientStorage (cold client cache), against a ZEO
server at HOST:PORT. Prints µs/object as Go benchmark lines.

usage: zeo_pyload.py HOST:PORT NAME [ROUNDS]

The oids are those of the server's storage, 0..LastOid walked by the
iterator-free method zodbd hash uses: loadBefore(oid, maxtid) for oid in
0..max_oid, skipping missing ones.
"""
import sys
import time

from ZEO.ClientStorage import ClientStorage
from ZODB.POSException import POSKeyError
from ZODB.utils import maxtid, p64


def main():
    host, port = sys.argv[1].rsplit(':', 1)
    name = sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    cs = ClientStorage((host, int(port)), read_only=True, wait_timeout=30,
                       cache_size=0)
    try:
        # Find the oids once (outside of the timing).
        n = len(cs)
        call = cs._call
        oids = []
        oid = 0
        while len(oids) < n and oid < 10 * n + 1000:
            try:
                if call('loadBefore', p64(oid), maxtid) is not None:
                    oids.append(p64(oid))
            except POSKeyError:
                pass
            oid += 1
        for r in range(rounds):
            t0 = time.perf_counter()
            nbytes = 0
            for o in oids:
                data, start, end = call('loadBefore', o, maxtid)
                nbytes += len(data)
            dt = time.perf_counter() - t0
            print('BenchmarkPyLoad/%s %d %.0f ns/op %.2f µs/object' % (
                name, len(oids), dt / len(oids) * 1e9, dt / len(oids) * 1e6),
                flush=True)
    finally:
        cs.close()


if __name__ == '__main__':
    main()
