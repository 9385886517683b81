"""NEO replication benchmark (issue 23): a fresh storage node catching up
a database from a running one, zodbd's and NEO/py's nodes as source and
as target; loads/s of two zodbd nodes (replicas 1) against one; commit
latency with two nodes (replicas 1) against one (replicas 0).

Runs under NEO/py's Python (it drives NEO/py's admin in-process, so the
end of a replication is seen within milliseconds, not a neoctl start-up):

    PY=/tmp/neovenv/bin/python
    $PY bench/neorepl.py prepare --src /tmp/neopy --zodbd bin/zodbd --txns 48000 --work W
    $PY bench/neorepl.py prepare --src /tmp/neopy --zodbd bin/zodbd --wczblk1 300 --work W2
    $PY bench/neorepl.py run --src /tmp/neopy --zodbd bin/zodbd --work W [--rounds 3] \\
        [--pairs zodbd:zodbd,neopy:zodbd,zodbd:neopy,neopy:neopy,zodbd-fs:zodbd] [-d 3] [-c 16,64] \\
        [--zodbd-base OLD --pairs base:base,zodbd:zodbd,neopy:neopy] [--no-wrk] [--verify]

`prepare` makes W/prod1.fs (scripts/gen_dataset.py prod1 TXNS, with
os.fsync disabled: the generator's output does not depend on it; or,
with --wczblk1 MB, W/wczblk1.fs: an MB-megabyte wendelin.core-like
array, records of 4 KiB chunks instead of prod1's 1.4 KiB mean) and
W/source.sqlite, a NEO/py storage database of the same data: a cluster
(NEO/py's master, -p 1 -r 1) whose one storage is zodbd's node on the
Data.fs, into which a NEO/py storage node replicates; the zodbd node is
then dropped from the partition table, so the database is one node's
whole cluster.

`run`, each round (the pairs' order reversed every other round): for each
source:target pair, a fresh cluster (NEO/py's master -p 1 -r 1 -A 1, an
admin) whose one storage node is the source on a fresh copy of
source.sqlite (`zodbd`: zodbd neo-storage --read-write sqlite:...,
`neopy`: neostorage -a SQLite; `zodbd-fs`: zodbd on a copy of the Data.fs;
`base`: the zodbd binary --zodbd-base, to pair a change with its base in
one run),
then a target on an empty database (`zodbd`: SQLite; `neopy`); the clock
runs from TweakPartitionTable (after AddPendingNodes) until the admin
shows the target's cell UP_TO_DATE. Replication MB/s = the object data
as stored (sum of the data rows' lengths, uncompressed here) over that
time. The copies are fresh files just written: the source reads from the
page cache.

For the zodbd:zodbd and base:base pairs the round also runs, with the source alone and
then with both nodes up to date (unless --no-wrk): `zodbd wrk --cache off -c C -d D`
(loads/s; every load a request, the client spreading them at random over
the readable cells) and `zodbd wrk --commit -c 1 -d D` (commit latency:
one copy of each record with one node, two with replicas 1).

Prints one line per measure, then medians and per-round ratios; --out
writes every point as JSON."""
import argparse
import json
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', 'tests'))
from zeoserver import free_port, wait_listening  # noqa: E402  (shared with the tests)
CLUSTER = 'bench'


def tail(path, n=3000):
    try:
        with open(path, errors='replace') as f:
            return f.read()[-n:]
    except OSError:
        return ''


class Cluster:
    """NEO/py's master (-p 1 -r 1 -A 1) and admin, storage nodes added by
    storage(), every process's output in dir/NAME.log."""

    def __init__(self, a, d):
        self.a, self.dir = a, d
        self.env = dict(os.environ, PYTHONPATH=a.src)
        self.master = '127.0.0.1:%d' % free_port()
        self.admin = '127.0.0.1:%d' % free_port()
        self.procs = {}
        self.ctl = None

    def spawn(self, name, cmd, addr):
        log = os.path.join(self.dir, name + '.log')
        p = subprocess.Popen(cmd, env=self.env, stdout=open(log, 'ab'), stderr=subprocess.STDOUT, cwd=self.dir)
        self.procs[name] = p
        host, port = addr.rsplit(':', 1)
        wait_listening((host, int(port)), p, log, timeout=60)
        return p

    def neo(self, script):
        return [sys.executable, '-c', 'import neo.scripts.%s as m; m.main()' % script]

    def start(self):
        self.spawn('master', self.neo('neomaster') + ['-c', CLUSTER, '-b', self.master, '-m', self.master,
                                                       '-p', '1', '-r', '1', '-A', '1'], self.master)
        self.spawn('admin', self.neo('neoadmin') + ['-c', CLUSTER, '-b', self.admin, '-m', self.master],
                   self.admin)
        from neo.neoctl.neoctl import NeoCTL
        from neo.lib.util import parseNodeAddress
        self.ctl = NeoCTL(parseNodeAddress(self.admin))
        return self

    def storage(self, name, kind, db, extra=()):
        """Starts a storage node of kind zodbd (SQLite, or FileStorage
        when db ends in .fs), base (zodbd's --zodbd-base) or neopy on db;
        returns its address."""
        addr = '127.0.0.1:%d' % free_port()
        cpus = getattr(self.a, 'node_cpus', {}).get(name)  # run's --node-cpus
        if kind == 'neopy':
            cmd = (['taskset', '-c', cpus] if cpus else []) + self.neo('neostorage') + ['-c', CLUSTER, '-b', addr, '-m', self.master, '-a', 'SQLite', '-d', db]
        else:
            backend = db if db.endswith('.fs') else 'sqlite:' + db
            exe = self.a.zodbd_base if kind == 'base' else self.a.zodbd
            cmd = [exe, 'neo-storage', '--cluster', CLUSTER, '--masters', self.master, '--bind', addr,
                   '--read-write'] + (['--cpus', cpus] if cpus else []) + list(extra) + [backend]
        self.spawn(name, cmd, addr)
        return addr

    def wait(self, cond, what, timeout=120, step=0.01):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                v = cond()
            except Exception:  # not ready yet (NotReadyException, connection)
                v = None
            if v:
                return v
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise SystemExit('neorepl: %s exited while waiting for %s\n%s' % (name, what, self.logs()))
            time.sleep(step)
        raise SystemExit('neorepl: timeout waiting for %s\n%s' % (what, self.logs()))

    def running(self):
        from neo.lib.protocol import ClusterStates
        return self.ctl.getClusterState() == ClusterStates.RUNNING

    def nid(self, addr):
        from neo.lib.protocol import NodeTypes
        from neo.lib.util import parseNodeAddress
        want = parseNodeAddress(addr)
        for _, naddr, nid, _, _ in self.ctl.getNodeList(NodeTypes.STORAGE):
            if naddr and tuple(naddr) == want:
                return nid
        return None

    def cell_states(self, nid):
        """The states of nid's cells (as strings, e.g. 'UP_TO_DATE')."""
        _, _, rows = self.ctl.getPartitionRowList()
        return [str(s) for cells in rows for n, s in cells if n == nid]

    def add(self, addr):
        """AddPendingNodes + TweakPartitionTable for the node at addr; returns its nid."""
        nid = self.wait(lambda: self.nid(addr), 'node %s known to the master' % addr)
        self.ctl.enableStorageList([nid])
        self.ctl.tweakPartitionTable()
        return nid

    def forget(self, nid):
        """Removes the stopped node nid and its cells (neoctl drop)."""
        from neo.lib.protocol import NodeStates
        self.wait(lambda: any(n[2] == nid and n[3] == NodeStates.DOWN for n in self.ctl.getNodeList()),
                  'node %d down' % nid)
        self.ctl.dropNode(nid)
        self.wait(lambda: not self.cell_states(nid), 'node %d out of the table' % nid)

    def up_to_date(self, nid):
        st = self.cell_states(nid)
        return bool(st) and all(s == 'UP_TO_DATE' for s in st)

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def logs(self, n=2000):
        return '\n'.join('--- %s.log\n%s' % (k, tail(os.path.join(self.dir, k + '.log'), n)) for k in self.procs)


def cmd_prepare(a):
    os.makedirs(a.work, exist_ok=True)
    name, size = ('wczblk1', a.wczblk1) if a.wczblk1 else ('prod1', a.txns)
    fs = os.path.join(a.work, name + '.fs')
    if not os.path.exists(fs):
        gen = ('import os, sys, runpy; os.fsync = lambda fd: None; '
               'sys.argv = ["gen_dataset.py", %r, %r, "%d"]; '
               'runpy.run_path(%r, run_name="__main__")' % (name, fs + '.tmp', size,
                                                            os.path.join(HERE, '..', 'scripts', 'gen_dataset.py')))
        subprocess.run([a.venv_python, '-c', gen], check=True)
        for ext in ('.index', '.lock', '.tmp'):
            if os.path.exists(fs + '.tmp' + ext):
                os.remove(fs + '.tmp' + ext)
        os.rename(fs + '.tmp', fs)
    out = os.path.join(a.work, 'source.sqlite')
    d = tempfile.mkdtemp(prefix='neorepl-prepare-', dir=a.work)
    c = Cluster(a, d).start()
    try:
        fscopy = os.path.join(d, 'Data.fs')
        shutil.copyfile(fs, fscopy)
        s1addr = c.storage('s1', 'zodbd', fscopy)
        c.wait(c.running, 'cluster running', timeout=300)
        s1 = c.wait(lambda: c.nid(s1addr), 'the zodbd node known')
        db = os.path.join(d, 'neopy.sqlite')
        addr = c.storage('s2', 'neopy', db)
        t0 = time.monotonic()
        nid = c.add(addr)
        c.wait(lambda: c.up_to_date(nid), 'the NEO/py node up to date', timeout=3600, step=0.5)
        print('prepare: NEO/py replicated %s from zodbd in %.1f s' % (fs, time.monotonic() - t0), flush=True)
        p = c.procs.pop('s1')
        p.terminate()
        p.wait(20)
        c.forget(s1)
        # NEO/py's node commits the new partition table a moment later
        # (a deferred commit): wait until the file has it.
        c.wait(lambda: not node_in_pt(db, s1), 'the zodbd node out of %s' % db, step=0.2)
    finally:
        c.stop()
    shutil.move(db, out)
    shutil.rmtree(d, ignore_errors=True)
    print('prepare: %s: %s' % (out, describe(out)))


def node_in_pt(db, nid):
    con = sqlite3.connect('file:%s?mode=ro' % db, uri=True, timeout=1)
    try:
        return con.execute('SELECT count(*) FROM pt WHERE nid=?', (nid,)).fetchone()[0] > 0
    finally:
        con.close()


def describe(db):
    con = sqlite3.connect('file:%s?mode=ro' % db, uri=True)
    try:
        n = con.execute('SELECT count(*) FROM obj').fetchone()[0]
        t = con.execute('SELECT count(*) FROM trans').fetchone()[0]
        b = con.execute('SELECT coalesce(sum(length(value)), 0) FROM data').fetchone()[0]
    finally:
        con.close()
    return {'records': n, 'txns': t, 'data_bytes': b}


def digest(db):
    """sha1 of what a replication copies: every trans row and every obj
    row with its data row (value bytes included), in key order."""
    import hashlib
    h = hashlib.sha1()
    con = sqlite3.connect('file:%s?mode=ro' % db, uri=True)
    try:
        for row in con.execute('SELECT partition, tid, packed, oids, user, description, ext, ttid FROM trans'
                               ' ORDER BY partition, tid'):
            h.update(repr(row).encode())
        for row in con.execute('SELECT o.partition, o.oid, o.tid, o.value_tid, d.compression, d.hash, d.value'
                               ' FROM obj o LEFT JOIN data d ON d.id=o.data_id ORDER BY o.partition, o.oid, o.tid'):
            h.update(repr(row[:-1]).encode())
            h.update(b'%d:' % len(row[-1] or b''))
            h.update(row[-1] or b'')
    finally:
        con.close()
    return h.hexdigest()


def wrk(a, c, *args):
    cmd = (['taskset', '-c', a.wrk_cpus] if a.wrk_cpus else []) + [a.zodbd, 'wrk', '--json'] + list(args) + [
        'neo://%s@%s' % (CLUSTER, c.master)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit('neorepl: %s failed: %s\n%s' % (' '.join(cmd), p.stderr[-2000:], c.logs()))
    return json.loads(p.stdout)


def loads(a, c, r, pair, nodes, points):
    """Loads/s of `zodbd wrk --cache off` with each of a.c connection
    counts, against the cluster's nodes as they are."""
    names = [n for n in ('src', 'dst') if n in c.procs]
    for conns in a.c:
        cpu0 = [cpu_s(c.procs[n]) for n in names] + [children_cpu_s()]
        w = wrk(a, c, '--cache', 'off', '-c', str(conns), '-d', '%gs' % a.d)
        # CPU s of each node and of the client over the whole wrk run (its
        # checksum pass included): how the loads were spread, and what
        # each side cost.
        cpu = [cpu_s(c.procs[n]) for n in names] + [children_cpu_s()]
        cpu = dict(zip(names + ['wrk'], (x - y for x, y in zip(cpu, cpu0))))
        points.append({'round': r, 'what': 'loads', 'pair': pair, 'nodes': nodes, 'c': conns, 'ops_s': w['ops_per_s'],
                       'p50_us': w['latency_ns']['p50'] / 1e3, 'p99_us': w['latency_ns']['p99'] / 1e3,
                       'cpu_s': cpu, 'ops': w.get('ops')})
        print('round %d %s loads/s, %d node%s, -c %d: %.0f (p50 %.0f µs, p99 %.0f µs; CPU s %s)' % (
            r, pair, nodes, 's' if nodes > 1 else '', conns, w['ops_per_s'], w['latency_ns']['p50'] / 1e3,
            w['latency_ns']['p99'] / 1e3, ' '.join('%s %.2f' % x for x in cpu.items())), flush=True)


def data_fs(work):
    """The Data.fs prepare made in work (prod1.fs or wczblk1.fs)."""
    for name in ('prod1.fs', 'wczblk1.fs'):
        if os.path.exists(os.path.join(work, name)):
            return os.path.join(work, name)
    raise SystemExit('neorepl: no prod1.fs or wczblk1.fs in %s: run prepare first' % work)


def run_pair(a, r, src, dst, size, points):
    d = tempfile.mkdtemp(prefix='neorepl-%s-%s-' % (src, dst), dir=a.work)
    c = Cluster(a, d).start()
    try:
        if src == 'zodbd-fs':
            db = os.path.join(d, 'src.fs')
            shutil.copyfile(data_fs(a.work), db)
        else:
            db = os.path.join(d, 'src.sqlite')
            shutil.copyfile(os.path.join(a.work, 'source.sqlite'), db)
        # Untimed: the copy's write-back to the disk, which the kernel
        # would do during the replication, does not compete with the
        # target's writes (the copy stays in the page cache).
        os.sync()
        c.storage('src', src if src in ('neopy', 'base') else 'zodbd', db)
        c.wait(c.running, 'cluster running', timeout=300, step=0.1)
        pair = '%s:%s' % (src, dst)
        extra = src == dst and src in ('zodbd', 'base') and not a.no_wrk
        if extra:
            loads(a, c, r, pair, 1, points)
            w = wrk(a, c, '--commit', '-c', '1', '-d', '%gs' % a.d)
            lat = w['latency_ns']
            points.append({'round': r, 'what': 'commit', 'pair': pair, 'nodes': 1, 'p50_ms': lat['p50'] / 1e6,
                           'p99_ms': lat['p99'] / 1e6, 'ops_s': w['ops_per_s']})
            print('round %d commit, 1 node (-r 0): p50 %.2f ms p99 %.2f ms, %.0f/s' % (
                r, lat['p50'] / 1e6, lat['p99'] / 1e6, w['ops_per_s']), flush=True)
        addr = c.storage('dst', dst, os.path.join(d, 'dst.sqlite'),
                         extra=['--debug-addr', a.debug_addr] if a.debug_addr and dst != 'neopy' else ())
        cpu0 = {k: cpu_s(c.procs[k]) for k in ('src', 'dst')}
        t0 = time.monotonic()
        nid = c.add(addr)
        c.wait(lambda: c.up_to_date(nid), 'the target up to date', timeout=3600)
        dt = time.monotonic() - t0
        cpu = {k: cpu_s(c.procs[k]) - cpu0[k] for k in cpu0}
        got = describe(os.path.join(d, 'dst.sqlite'))
        if got['records'] < size['records']:
            raise SystemExit('neorepl: %s:%s: target has %d records, source %d' % (
                src, dst, got['records'], size['records']))
        if a.verify and src != 'zodbd-fs':
            if 'digest' not in size:
                size['digest'] = digest(os.path.join(a.work, 'source.sqlite'))
            got = digest(os.path.join(d, 'dst.sqlite'))
            if got != size['digest']:
                raise SystemExit('neorepl: %s:%s: the target differs from the source' % (src, dst))
        mbs = size['data_bytes'] / dt / 1e6
        # The target's WAL file: its size is the most it held (SQLite
        # reuses it from the start, never shrinks it).
        wal = os.path.join(d, 'dst.sqlite-wal')
        wal_mib = os.path.getsize(wal) / (1 << 20) if os.path.exists(wal) else 0
        points.append({'round': r, 'what': 'repl', 'pair': '%s:%s' % (src, dst), 's': dt, 'mb_s': mbs,
                       'records_s': size['records'] / dt, 'src_cpu_s': cpu['src'], 'dst_cpu_s': cpu['dst'],
                       'dst_wal_mib': wal_mib})
        print('round %d replication %-15s %6.2f s  %7.1f MB/s  %8.0f records/s  CPU s: source %.2f target %.2f'
              '  WAL %.0f MiB' % (r, src + ':' + dst, dt, mbs, size['records'] / dt, cpu['src'], cpu['dst'], wal_mib),
              flush=True)
        if extra:
            loads(a, c, r, pair, 2, points)
            w = wrk(a, c, '--commit', '-c', '1', '-d', '%gs' % a.d)
            lat = w['latency_ns']
            points.append({'round': r, 'what': 'commit', 'pair': pair, 'nodes': 2, 'p50_ms': lat['p50'] / 1e6,
                           'p99_ms': lat['p99'] / 1e6, 'ops_s': w['ops_per_s']})
            print('round %d commit, 2 nodes (-r 1): p50 %.2f ms p99 %.2f ms, %.0f/s' % (
                r, lat['p50'] / 1e6, lat['p99'] / 1e6, w['ops_per_s']), flush=True)
    finally:
        c.stop()
        shutil.rmtree(d, ignore_errors=True)


def cpu_s(p):
    """CPU seconds (user + system) the process p has used so far."""
    with open('/proc/%d/stat' % p.pid) as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def children_cpu_s():
    """CPU seconds (user + system) of this process's children that have
    ended and been waited for (each wrk run, once it returned)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def med(xs):
    return statistics.median(xs) if xs else float('nan')


def cmd_run(a):
    src_db = os.path.join(a.work, 'source.sqlite')
    size = describe(src_db)
    print('source: %s: %d records, %d transactions, %.1f MB of object data' % (
        src_db, size['records'], size['txns'], size['data_bytes'] / 1e6), flush=True)
    pairs = [tuple(p.split(':')) for p in a.pairs.split(',')]
    points = []
    for r in range(a.rounds):
        for src, dst in (pairs if r % 2 == 0 else pairs[::-1]):
            run_pair(a, r, src, dst, size, points)
    print('\nmedians over %d rounds' % a.rounds)
    print('| source → target | s | MB/s | records/s | × neopy:neopy (per round) | CPU s source | CPU s target |')
    print('|---|---:|---:|---:|---|---:|---:|')
    ref = {p['round']: p['mb_s'] for p in points if p['what'] == 'repl' and p['pair'] == 'neopy:neopy'}
    for src, dst in pairs:
        ps = [p for p in points if p['what'] == 'repl' and p['pair'] == '%s:%s' % (src, dst)]
        ratios = [p['mb_s'] / ref[p['round']] for p in ps if p['round'] in ref]
        print('| %s → %s | %.2f | %.1f | %.0f | %s | %.2f | %.2f |' % (
            src, dst, med([p['s'] for p in ps]), med([p['mb_s'] for p in ps]), med([p['records_s'] for p in ps]),
            '%.2f (%s)' % (med(ratios), ' '.join('%.2f' % x for x in ratios)) if ratios else '',
            med([p['src_cpu_s'] for p in ps]), med([p['dst_cpu_s'] for p in ps])))
    for pair in ['%s:%s' % p for p in pairs]:
        for conns in a.c:
            sel = [p for p in points if p['what'] == 'loads' and p['pair'] == pair and p['c'] == conns]
            one = {p['round']: p for p in sel if p['nodes'] == 1}
            two = {p['round']: p for p in sel if p['nodes'] == 2}
            if one:
                rs = [two[k]['ops_s'] / one[k]['ops_s'] for k in one if k in two]
                print('%s loads/s -c %d: 1 node %.0f, 2 nodes %.0f; 2/1 %.2f (%s)' % (
                    pair, conns, med([p['ops_s'] for p in one.values()]), med([p['ops_s'] for p in two.values()]),
                    med(rs), ' '.join('%.2f' % x for x in rs)))
        sel = [p for p in points if p['what'] == 'commit' and p['pair'] == pair]
        one = {p['round']: p for p in sel if p['nodes'] == 1}
        two = {p['round']: p for p in sel if p['nodes'] == 2}
        if one:
            rs = [two[k]['p50_ms'] / one[k]['p50_ms'] for k in one if k in two]
            print('%s commit latency -c 1: -r 0 p50 %.2f p99 %.2f ms; -r 1 p50 %.2f p99 %.2f ms; p50 ratio %.2f (%s)' % (
                pair, med([p['p50_ms'] for p in one.values()]), med([p['p99_ms'] for p in one.values()]),
                med([p['p50_ms'] for p in two.values()]), med([p['p99_ms'] for p in two.values()]),
                med(rs), ' '.join('%.2f' % x for x in rs)))
    if a.out:
        with open(a.out, 'w') as f:
            json.dump({'size': size, 'points': points}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest='cmd', required=True)
    for name in ('prepare', 'run'):
        p = sub.add_parser(name)
        p.add_argument('--src', required=True, help='NEO/py source tree')
        p.add_argument('--zodbd', default=os.path.join(HERE, '..', 'bin', 'zodbd'))
        p.add_argument('--work', required=True, help='directory of the datasets and the clusters')
    p = sub.choices['prepare']
    p.add_argument('--txns', type=int, default=48000, help='prod1 transactions (48000: about 300 MB)')
    p.add_argument('--wczblk1', type=int, metavar='MB', help='the wczblk1 dataset of MB megabytes instead of prod1')
    p.add_argument('--venv-python', default=os.path.join(HERE, '..', '.venv', 'bin', 'python'),
                   help='a Python with ZODB/py (the generator)')
    p = sub.choices['run']
    p.add_argument('--pairs', default='zodbd:zodbd,neopy:zodbd,zodbd:neopy,neopy:neopy')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('-d', type=float, default=3.0, help='seconds per wrk measure')
    p.add_argument('-c', type=lambda v: [int(x) for x in v.split(',')], default=[16],
                   help='wrk connection counts for loads/s, comma-separated (default 16)')
    p.add_argument('--node-cpus', metavar='SRC/DST', default={},
                   type=lambda v: dict(zip(('src', 'dst'), v.split('/'))),
                   help='CPU lists of the source and target nodes (zodbd --cpus, taskset for NEO/py), e.g. 0-2/3-5')
    p.add_argument('--wrk-cpus', metavar='LIST', help='CPU list of the zodbd wrk load generator (taskset)')
    p.add_argument('--debug-addr', help='zodbd targets serve pprof here (profiling)')
    p.add_argument('--out', help='JSON file of every point')
    p.add_argument('--zodbd-base', help='zodbd binary of the pairs\' node kind "base"')
    p.add_argument('--no-wrk', action='store_true', help='no loads/s and commit measures')
    p.add_argument('--verify', action='store_true',
                   help='check after each replication (untimed) that the target has the rows of the source')
    a = ap.parse_args()
    a.zodbd = os.path.abspath(a.zodbd)
    if getattr(a, 'zodbd_base', None):
        a.zodbd_base = os.path.abspath(a.zodbd_base)
    a.work = os.path.abspath(a.work)
    sys.path.insert(0, a.src)
    {'prepare': cmd_prepare, 'run': cmd_run}[a.cmd](a)


if __name__ == '__main__':
    main()
