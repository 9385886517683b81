"""One big transaction through the stock ZEO client: the server's peak RSS
(VmHWM) and the commit's time, for zodbd builds and runzeo, paired.

    zeo_bigtxn.py [--mib 1024] [--rounds 2] [--clients 1] [--runzeo] NAME=ZODBD_BIN ...

With --clients N, N client processes commit MIB MiB each at once (their
objects all under the root, so that they conflict on it and retry), and
the time is that of the slowest.

Each round starts every server in turn (the order alternating from round
to round) on a new, empty Data.fs in a scratch directory ($TMPDIR, which
is also where the servers' spools go), commits MIB MiB in one transaction
(objects of 8 MiB of random data, a PersistentMapping each) with
ZEO.ClientStorage, and prints the server's idle RSS, its peak RSS
(VmHWM) and the seconds transaction.commit() took.
"""
import argparse
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time

import transaction
import ZEO
from persistent.mapping import PersistentMapping
from ZODB.POSException import ConflictError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests'))
from zeoserver import Server, runzeo_cmd  # noqa: E402

MiB = 1 << 20


def status(pid, field):
    with open('/proc/%d/status' % pid) as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) * 1024
    raise RuntimeError('no %s for %d' % (field, pid))


def client(addr, mib, key, n):
    """A process: commits mib MiB in one transaction, retrying conflicts."""
    import random
    data = [os.urandom(8 * MiB) for _ in range(2)]
    db = ZEO.DB(addr, wait_timeout=30)
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    for _ in range(50):
        root = conn.root()
        for i in range(mib // 8):
            root['%s%d' % (key, i)] = PersistentMapping(d=data[i % 2] + b'%d' % i)
        try:
            tm.commit()
            break
        except ConflictError:
            tm.abort()
            time.sleep(random.random() / 10)
    else:
        raise RuntimeError('client %d: 50 conflicts in a row' % n)
    conn.close()
    db.close()


def one(name, binary, mib, data, clients=1):
    d = tempfile.mkdtemp(prefix='zeo-bigtxn-')
    try:
        kind = 'runzeo' if binary is None else 'zodbd'
        srv = Server(binary, os.path.join(d, 'Data.fs'), d, kind=kind).start()
        try:
            db = ZEO.DB(srv.addr, wait_timeout=30)
            tm = transaction.TransactionManager()
            conn = db.open(tm)
            root = conn.root()
            time.sleep(0.2)
            idle = status(srv.proc.pid, 'VmRSS')
            t0 = time.time()
            if clients == 1:
                for i in range(mib // 8):
                    root['big%d' % i] = PersistentMapping(d=data[i % len(data)] + b'%d' % i)
                tm.commit()
            else:
                ps = [multiprocessing.Process(target=client, args=(srv.addr, mib, 'c%d-' % n, n))
                      for n in range(clients)]
                for p in ps:
                    p.start()
                for p in ps:
                    p.join()
                    if p.exitcode:
                        raise RuntimeError('a client failed')
            dt = time.time() - t0
            peak = status(srv.proc.pid, 'VmHWM')
            conn.close()
            db.close()
        finally:
            srv.stop(signal.SIGKILL)
        print('%-8s %d x %5d MiB in one transaction: %6.1f s, server RSS idle %5d MiB, peak %6d MiB'
              % (name, clients, mib, dt, idle // MiB, peak // MiB), flush=True)
        return dt, peak
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--mib', type=int, default=1024)
    p.add_argument('--rounds', type=int, default=2)
    p.add_argument('--clients', type=int, default=1, help='client processes committing at once')
    p.add_argument('--runzeo', action='store_true', help='add runzeo (ZEO/py) as a server')
    p.add_argument('servers', nargs='+', metavar='NAME=ZODBD_BIN')
    a = p.parse_args()
    servers = [tuple(s.split('=', 1)) for s in a.servers]
    if a.runzeo:
        if not runzeo_cmd():
            p.error('--runzeo: no ZEO here')
        servers.append(('runzeo', None))
    data = [os.urandom(8 * MiB) for _ in range(4)]
    for r in range(a.rounds):
        order = servers if r % 2 == 0 else servers[::-1]
        for name, binary in order:
            one(name, binary, a.mib, data, a.clients)


if __name__ == '__main__':
    main()
