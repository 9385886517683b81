"""One big transaction through the stock ZEO client: the server's peak RSS
(VmHWM) and the commit's time, for zodbd builds and runzeo, paired.

    zeo_bigtxn.py [--mib 1024] [--rounds 2] [--runzeo] NAME=ZODBD_BIN ...

Each round starts every server in turn (the order alternating from round
to round) on a new, empty Data.fs in a scratch directory ($TMPDIR, which
is also where the servers' spools go), commits MIB MiB in one transaction
(objects of 8 MiB of random data, a PersistentMapping each) with
ZEO.ClientStorage, and prints the server's idle RSS, its peak RSS
(VmHWM) and the seconds transaction.commit() took.
"""
import argparse
import os
import shutil
import signal
import sys
import tempfile
import time

import transaction
import ZEO
from persistent.mapping import PersistentMapping

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests'))
from zeoserver import Server, runzeo_cmd  # noqa: E402

MiB = 1 << 20


def status(pid, field):
    with open('/proc/%d/status' % pid) as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) * 1024
    raise RuntimeError('no %s for %d' % (field, pid))


def one(name, binary, mib, data):
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
            for i in range(mib // 8):
                root['big%d' % i] = PersistentMapping(d=data[i % len(data)] + b'%d' % i)
            tm.commit()
            dt = time.time() - t0
            peak = status(srv.proc.pid, 'VmHWM')
            conn.close()
            db.close()
        finally:
            srv.stop(signal.SIGKILL)
        print('%-8s %5d MiB in one transaction: %6.1f s, server RSS idle %5d MiB, peak %6d MiB'
              % (name, mib, dt, idle // MiB, peak // MiB), flush=True)
        return dt, peak
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--mib', type=int, default=1024)
    p.add_argument('--rounds', type=int, default=2)
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
            one(name, binary, a.mib, data)


if __name__ == '__main__':
    main()
