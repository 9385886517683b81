"""The floor of the Python-client load benchmark (bench/zeo_pyload.py): the
same number of serial round trips, with frames of the same sizes, from
Python over a plain blocking socket (TCP, or a Unix socket's path) to
bench/pingpong's echo server.
No ZEO client, no pickling: what any Python ZEO client pays at least.

usage: pyfloor.py HOST:PORT|SOCKET NAME --sizes FILE [--sample N] [--json FILE]

Prints a Go benchmark line like zeo_pyload.py's.
"""
import argparse
import json
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import latency  # noqa: E402

REQUEST = 70     # payload bytes of a pickled loadBefore request
ENVELOPE = 50    # bytes of a loadBefore reply beside the object data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('addr', metavar='HOST:PORT|SOCKET')
    ap.add_argument('name')
    ap.add_argument('--sizes', required=True)
    ap.add_argument('--sample', type=int, default=0)
    ap.add_argument('--json', metavar='FILE')
    a = ap.parse_args()
    with open(a.sizes) as f:
        sizes = [int(x) for x in f.read().split()]
    if a.sample:
        sizes = sizes[::max(1, len(sizes) // a.sample)][:a.sample]
    s = latency.connect(a.addr)
    rf = s.makefile('rb', buffering=65536)
    pad = b'\0' * (REQUEST - 4)
    reqs = [struct.pack('>II', REQUEST, n + ENVELOPE) + pad for n in sizes]

    def one(req):
        s.sendall(req)
        n, = struct.unpack('>I', rf.read(4))
        if len(rf.read(n)) != n:
            raise EOFError('short reply')

    for req in reqs:  # warm-up pass, like zeo_pyload's oid walk
        one(req)
    clock = time.perf_counter_ns
    lat = []
    t0 = time.perf_counter()
    for req in reqs:
        c0 = clock()
        one(req)
        lat.append(clock() - c0)
    dt = time.perf_counter() - t0
    s.close()
    print('BenchmarkPyLoad/%s %d %.0f ns/op %.2f µs/object' % (
        a.name, len(reqs), dt / len(reqs) * 1e9, dt / len(reqs) * 1e6),
        flush=True)
    if a.json:
        with open(a.json, 'w') as f:
            json.dump(latency.summarize(lat, 1, dt, 'pyfloor'), f)


if __name__ == '__main__':
    main()
