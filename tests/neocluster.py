"""NEO clusters for tests and benchmarks: NEO/py's master (and, when asked,
admin) with storage nodes that are NEO/py's own (`neopy`: neostorage on
SQLite) or zodbd's (`zodbd-fs`: zodbd neo-storage on a FileStorage;
`zodbd-sqlite`: on a NEO/py SQLite database), in any mix.

    Cluster('zodbd-fs', dir, src, python, zodbd=...)            # one node, -p 1 -r 0
    Cluster('zodbd-sqlite+neopy/p2/r1', dir, src, python, ...)   # a layout (see layout())
    Cluster(['zodbd-sqlite', 'neopy'], dir, ..., partitions=12, replicas=1)

The master starts the cluster by itself once the first nodes are there
(-A number of nodes); nodes added later (add_storage) are PENDING until
`neoctl add`. neoctl runs through the admin, started when asked or when
the cluster has several nodes. Node i's process can be killed and
restarted on its database (kill_storage(i), start_storage(i)). Several
masters (masters=N), NEO/py's TLS for every node, neoctl and zodbd's
nodes (tls=(ca, cert, key)), read-only zodbd nodes (read_write=False) and
more options of the masters (master_args: a backup cluster's upstream)
are there for the interoperability tests.

Plain Python (no pytest): it is also imported by scripts that run under
NEO/py's Python (tests/neo_mixins.py) and by bench/neo_commit.py. NEO/py
runs from its source tree (NEOPY_SRC) with a Python that has its
dependencies (NEOPY_PYTHON); see docs/neo.md."""
import os
import re
import signal
import sqlite3
import subprocess
import time
import urllib.request

from zeoserver import free_port, wait_listening

KINDS = ('neopy', 'zodbd-fs', 'zodbd-sqlite')
HERE = os.path.dirname(os.path.abspath(__file__))


def requests_served(metrics_addr):
    """The count of each NEO request a zodbd node served, from its metrics
    (--http-addr metrics_addr)."""
    text = urllib.request.urlopen('http://%s/metrics' % metrics_addr, timeout=10).read().decode()
    counts = {}
    for m in re.finditer(r'^zodbd_request_duration_seconds_count\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        counts[labels.get('method')] = float(m.group(2))
    return counts


def layout(spec):
    """(kinds, partitions, replicas) of a layout spec: kinds joined by '+',
    then optional /pN (partitions, default 1) and /rN (replicas, default
    0): 'zodbd-fs', 'zodbd-sqlite+neopy/p2/r1'."""
    parts = spec.split('/')
    kinds = parts[0].split('+')
    np, nr = 1, 0
    for p in parts[1:]:
        m = re.match(r'^([pr])(\d+)$', p)
        if not m:
            raise ValueError('bad layout %r: %r' % (spec, p))
        if m.group(1) == 'p':
            np = int(m.group(2))
        else:
            nr = int(m.group(2))
    for k in kinds:
        if k not in KINDS:
            raise ValueError('unknown storage kind %r' % k)
    return kinds, np, nr


class Node:
    """One storage node: its kind, database, label (log name), address and
    process (None until started)."""

    def __init__(self, kind, db, label):
        self.kind, self.db, self.label = kind, db, label
        self.port = free_port()
        self.addr = '127.0.0.1:%d' % self.port
        self.proc = None

    @property
    def zodbd(self):
        return self.kind != 'neopy'


class Cluster:
    """NEO/py's master (-p PARTITIONS -r REPLICAS -A number of initial
    nodes), an optional admin, and storage nodes of the given kinds on
    databases in workdir (created empty unless they exist; a FileStorage
    by zodbd's node, read-write only). start() returns once every port is
    open; clients wait for the cluster to run (wait_running,
    wait_up_to_date with an admin).

    With one node the single-node attributes of old are kept: kind, db,
    sport, sproc (node 0), logs master.log, storage.log, admin.log.
    master is the masters' addresses in NEO/py's syntax (space-separated);
    with several, master i logs to master-PORT.log."""

    def __init__(self, kind, workdir, src, python, zodbd=None, name='test', admin=False, zodbd_args=(),
                 partitions=None, replicas=None, masters=1, tls=None, read_write=True, master_args=()):
        if isinstance(kind, str):
            kinds, np, nr = layout(kind)
        else:
            kinds, np, nr = list(kind), 1, 0
        for k in kinds:
            if k not in KINDS:
                raise ValueError('unknown storage kind %r' % k)
        self.partitions = np if partitions is None else partitions
        self.replicas = nr if replicas is None else replicas
        self.kind, self.dir, self.src, self.python = kinds[0], workdir, src, python
        self.zodbd, self.name = zodbd, name
        self.want_admin = admin or len(kinds) > 1 or self.replicas > 0
        self.zodbd_args = (['--read-write'] if read_write else []) + list(zodbd_args)
        self.tls = ['--ca', tls[0], '--cert', tls[1], '--key', tls[2]] if tls else []
        self.master_args = list(master_args)
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [src] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
        self.masters = ['127.0.0.1:%d' % free_port() for _ in range(masters)]
        self.master = ' '.join(self.masters)
        self.admin = '127.0.0.1:%d' % free_port() if self.want_admin else None
        self.mprocs = {}  # address -> process
        self.aproc = None
        self.nodes = []
        self.single = len(kinds) == 1
        for k in kinds:
            self._new_node(k)
        self.initial = len(kinds)

    def _new_node(self, kind):
        i = len(self.nodes)
        label = 'storage' if self.single and i == 0 else 's%d' % i
        ext = '.fs' if kind == 'zodbd-fs' else '.sqlite'
        base = ('Data' if kind == 'zodbd-fs' else 'neo') if label == 'storage' else label
        self.nodes.append(Node(kind, os.path.join(self.dir, base + ext), label))
        return i

    # The single-node names (node 0).
    @property
    def db(self):
        return self.nodes[0].db

    @db.setter
    def db(self, path):
        self.nodes[0].db = path

    @property
    def sport(self):
        return self.nodes[0].port

    @property
    def sproc(self):
        return self.nodes[0].proc

    def _spawn(self, name, cmd):
        log = open(os.path.join(self.dir, name + '.log'), 'ab')
        return subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)

    def _wait(self, addr, proc, name):
        host, port = addr.rsplit(':', 1)
        wait_listening((host, int(port)), proc, os.path.join(self.dir, name + '.log'))

    def _neo(self, script):
        return [self.python, '-c', 'import neo.scripts.%s as m; m.main()' % script]

    def _master_logs(self):
        if len(self.masters) == 1:
            return ['master']
        return ['master-' + a.rsplit(':', 1)[1] for a in self.masters]

    def start(self):
        for addr, log in zip(self.masters, self._master_logs()):
            self.mprocs[addr] = self._spawn(log, self._neo('neomaster') + [
                '-c', self.name, '-b', addr, '-m', self.master, '-p', str(self.partitions),
                '-r', str(self.replicas), '-A', str(self.initial)] + self.tls + self.master_args)
        for addr, log in zip(self.masters, self._master_logs()):
            self._wait(addr, self.mprocs[addr], log)
        for i in range(len(self.nodes)):
            self.start_storage(i)
        if self.want_admin:
            self.aproc = self._spawn('admin', self._neo('neoadmin') + ['-c', self.name, '-b', self.admin,
                                                                      '-m', self.master] + self.tls)
            self._wait(self.admin, self.aproc, 'admin')
        return self

    def storage_cmd(self, i=0):
        n = self.nodes[i]
        if n.kind == 'neopy':
            # -l: a debug log (SQLite, flushed on SIGRTMIN) where its
            # checker says which partitions it checked (_checked); not
            # for the one node of a single-node cluster (benchmarks).
            log = [] if n.label == 'storage' else ['-l', n.db + '.log']
            return self._neo('neostorage') + ['-c', self.name, '-b', n.addr, '-m', self.master,
                                              '-a', 'SQLite', '-d', n.db] + log + self.tls
        backend = n.db if n.kind == 'zodbd-fs' else 'sqlite:' + n.db
        return [self.zodbd, 'neo-storage', '--cluster', self.name, '--masters', ','.join(self.masters),
                '--bind', n.addr] + self.tls + self.zodbd_args + [backend]

    def start_storage(self, i=0):
        n = self.nodes[i]
        n.proc = self._spawn(n.label, self.storage_cmd(i))
        self._wait(n.addr, n.proc, n.label)

    def add_storage(self, kind):
        """Starts a new node of the given kind on a new database: the
        master sees it PENDING until `neoctl add` (add_node). Its index."""
        i = self._new_node(kind)
        self.start_storage(i)
        return i

    def kill_storage(self, i=0, sig=signal.SIGKILL):
        p = self.nodes[i].proc
        if p is not None and p.poll() is None:
            p.send_signal(sig)
        if p is not None:
            p.wait(20)

    def run_client(self, script, cmd, *args, timeout=600):
        """Runs `SCRIPT CMD MASTER NAME ARGS...` (a script beside this file,
        such as neo_repl_worker.py) with NEO/py's Python, against this
        cluster; returns its stdout. AssertionError, with the cluster's
        logs, if it fails."""
        env = dict(self.env, PYTHONPATH=os.pathsep.join([self.src, HERE]))
        p = subprocess.run([self.python, os.path.join(HERE, script), cmd, self.master, self.name] + list(args),
                           env=env, capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, '%s %s failed:\n%s' % (script, cmd, p.stderr[-5000:] + self.logs())
        return p.stdout

    def ctl(self, *args):
        p = subprocess.run(self._neo('neoctl') + ['-a', self.admin] + self.tls + list(args), env=self.env,
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError('neoctl %s: %s' % (' '.join(args), p.stdout + p.stderr))
        return p.stdout

    def wait(self, cond, what, timeout=60):
        """cond()'s first true value, polled (a neoctl error counts as not
        yet); AssertionError with the logs after timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = cond()
                if r:
                    return r
            except RuntimeError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError('timeout (%ds) waiting for %s\n%s' % (timeout, what, self.logs()))
            time.sleep(0.2)

    def wait_running(self, timeout=60):
        self.wait(lambda: 'RUNNING' in self.ctl('print', 'cluster'), 'the cluster to run', timeout)

    def node_id(self, i):
        """The node id (S1, ...) the master gave node i, None if unknown."""
        m = re.search(r'^(\S+) \| STORAGE \| %s \|' % re.escape(self.nodes[i].addr),
                      self.ctl('print', 'node'), re.M)
        return m and m.group(1)

    def node_state(self, i):
        m = re.search(r'^\S+ \| STORAGE \| %s \| (\w+)' % re.escape(self.nodes[i].addr),
                      self.ctl('print', 'node'), re.M)
        return m and m.group(1)

    def add_node(self, i):
        """`neoctl add` of node i (once the master knows it) then `neoctl
        tweak`: the master gives it cells, OUT_OF_DATE."""
        nid = self.wait(lambda: self.node_state(i) == 'PENDING' and self.node_id(i),
                        'node %d pending' % i)
        self.ctl('add', nid)
        self.ctl('tweak')
        return nid

    def pt(self):
        """{node id: cell states}, one letter per partition ('U' up to
        date, 'O' out of date, 'F' feeding, 'C' corrupted, 'D' discarded,
        '.' no cell), from `neoctl print pt`."""
        rows = {}
        for line in self.ctl('print', 'pt').splitlines():
            m = re.match(r'^(S\d+) \S ([A-Z.]+)$', line)
            if m:
                rows[m.group(1)] = m.group(2)
        return rows

    def up_to_date(self):
        """The table when every partition has replicas+1 cells, all
        UP_TO_DATE, and the cluster runs; else None."""
        rows = self.pt()
        if len(rows) < self.replicas + 1:
            return None
        for p in range(self.partitions):
            cells = [r[p] for r in rows.values()]
            if any(c not in 'U.' for c in cells) or cells.count('U') < self.replicas + 1:
                return None
        return 'RUNNING' in self.ctl('print', 'cluster') and rows

    def wait_up_to_date(self, timeout=120):
        return self.wait(self.up_to_date, 'every cell UP_TO_DATE', timeout)

    def _checked(self):
        """Every "partition P checked" line of the nodes' logs, as a list
        of partitions (NEO/py's nodes: flushed from their debug log)."""
        out = []
        for n in self.nodes:
            if n.zodbd:
                path = os.path.join(self.dir, n.label + '.log')
                if os.path.exists(path):
                    with open(path, errors='replace') as f:
                        out += [int(p) for p in re.findall(r'partition (\d+) checked', f.read())]
                continue
            if n.proc is None or n.proc.poll() is not None or not os.path.exists(n.db + '.log'):
                continue
            n.proc.send_signal(signal.SIGRTMIN)  # NEO/py: flush the log
            time.sleep(0.1)
            try:
                db = sqlite3.connect('file:%s?mode=ro' % (n.db + '.log'), uri=True, timeout=5)
                try:
                    rows = db.execute("SELECT msg FROM log WHERE msg LIKE 'partition % checked%'").fetchall()
                finally:
                    db.close()
            except sqlite3.Error:
                continue
            out += [int(re.match(r'partition (\d+)', r[0]).group(1)) for r in rows]
        return out

    def corruption(self):
        """What says a check found a difference: the master's log lines
        (NEO/py's master logs the corruption reports; cells stay
        UP_TO_DATE), zodbd's nodes' "differs" lines, CORRUPTED cells."""
        out = []
        for name in self._master_logs():
            with open(os.path.join(self.dir, name + '.log'), errors='replace') as f:
                out += [l for l in f if 'corrupted' in l]
        for n in self.nodes:
            path = os.path.join(self.dir, n.label + '.log')
            if n.zodbd and os.path.exists(path):
                with open(path, errors='replace') as f:
                    out += [l for l in f if re.search(r'partition \d+ differs', l)]
        out += ['%s: %s' % r for r in self.pt().items() if 'C' in r[1]]
        return out

    def check(self, timeout=180):
        """`neoctl check` of every partition; returns once the node that
        checks each partition (one of its readable cells' nodes) reported
        it checked. AssertionError if a difference is reported. Every
        partition must have two readable cells or more (the master checks
        no other)."""
        before = self._checked()
        self.ctl('check', *['%d:' % p for p in range(self.partitions)])

        def done():
            bad = self.corruption()
            assert not bad, 'neoctl check found differences: %s\n%s' % (bad, self.logs())
            got = self._checked()
            return all(got.count(p) > before.count(p) for p in range(self.partitions))
        self.wait(done, 'neoctl check of every partition', timeout)
        bad = self.corruption()
        assert not bad, 'neoctl check found differences: %s\n%s' % (bad, self.logs())

    def stop(self, clean=False):
        """Stops every process. With clean, first `neoctl set cluster
        STOPPING` and a wait for node 0 to exit: returns its exit status
        (None otherwise; the processes are stopped even if that fails)."""
        rc = None
        try:
            if clean:
                self.ctl('set', 'cluster', 'STOPPING')
                rc = self.nodes[0].proc.wait(20)
        finally:
            procs = [self.aproc] + [n.proc for n in self.nodes] + list(self.mprocs.values())
            for p in procs:
                if p is not None and p.poll() is None:
                    p.terminate()
            for p in procs:
                if p is None:
                    continue
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        return rc

    def logs(self, tail=3000):
        out = []
        for name in self._master_logs() + [n.label for n in self.nodes] + ['admin']:
            path = os.path.join(self.dir, name + '.log')
            if os.path.exists(path):
                with open(path, errors='replace') as f:
                    out.append('--- %s.log\n%s' % (name, f.read()[-tail:]))
        return '\n'.join(out)
