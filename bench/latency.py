"""Latency summaries shared by the Python workloads of `make bench`, and
how they name a server (server_address).

summarize() gives the JSON schema that bench/pingpong (Go) prints and that
bench/run.py reads: ops, ops/s, percentiles in ns and a log-linear
histogram with 16 buckets per power of two (each at most 6% wide), as
[lower_ns, upper_ns, count] for the non-empty buckets.
"""
import math
import socket


def bucket(v):
    """The [lo, hi) histogram bucket of v (an int, ns)."""
    if v < 16:
        return v, v + 1
    e = v.bit_length() - 5
    lo = (v >> e) << e
    return lo, lo + (1 << e)


def percentile(sorted_samples, p):
    """The nearest-rank p-quantile (0 < p <= 1) of sorted samples."""
    n = len(sorted_samples)
    return sorted_samples[min(n - 1, max(0, math.ceil(p * n) - 1))]


def histogram(sorted_samples):
    h = []
    for s in sorted_samples:
        lo, hi = bucket(int(s))
        if h and h[-1][0] == lo:
            h[-1][2] += 1
        else:
            h.append([lo, hi, 1])
    return h


def summarize(samples_ns, clients, elapsed_s, tool, **extra):
    s = sorted(int(x) for x in samples_ns)
    r = {'tool': tool, 'clients': clients, 'duration_s': elapsed_s,
         'ops': len(s), 'ops_per_s': 0.0, 'latency_ns': {},
         'histogram_ns': []}
    r.update(extra)
    if not s:
        return r
    r['ops_per_s'] = len(s) / elapsed_s if elapsed_s > 0 else 0.0
    r['latency_ns'] = {
        'min': s[0], 'mean': sum(s) / len(s),
        'p50': percentile(s, .50), 'p90': percentile(s, .90),
        'p99': percentile(s, .99), 'p999': percentile(s, .999),
        'max': s[-1]}
    r['histogram_ns'] = histogram(s)
    return r


def server_address(s):
    """The address a workload's command line names: a Unix socket path (any
    text with a "/"), as ClientStorage and socket.connect take it, or
    HOST:PORT as a (host, port) tuple."""
    if '/' in s:
        return s
    host, port = s.rsplit(':', 1)
    return host, int(port)


def connect(s, timeout=None):
    """A socket connected to the server s names (see server_address); TCP
    ones with TCP_NODELAY, as the ZEO clients set it."""
    addr = server_address(s)
    if isinstance(addr, str):
        c = socket.socket(socket.AF_UNIX)
        c.settimeout(timeout)
        try:
            c.connect(addr)
        except OSError:
            c.close()
            raise
        return c
    c = socket.create_connection(addr, timeout=timeout)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c
