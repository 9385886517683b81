#!/usr/bin/env python3
"""`make bench`: zodbd serve against runzeo (and NEO, when there is one),
every server on its own copy of each dataset, the workloads repeated in
interleaved rounds, against a bare TCP ping-pong floor measured in the
same run. The -U servers (zodbd-Z-U, runzeo-Z-U, floor-U) listen on a Unix
socket instead, for clients on the server's host, and are compared with
each other. Results: raw Go benchmark files, a benchstat comparison, a
summary with medians (min-max, n) and ratios, and plots.

    .venv/bin/python bench/run.py [options]      (or: make bench BENCHFLAGS='...')

Run with -h for the options; BENCHMARKS.md ("make bench") explains what is
measured and how to read it. Runs in the project venv (ZODB, ZEO).
"""
import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
GEN_DATASET = os.path.join(REPO, 'scripts', 'gen_dataset.py')  # the datasets and their reference hashes
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(REPO, 'tests'))
import latency  # noqa: E402
import machine  # noqa: E402
from zeoserver import free_port, runzeo_cmd  # noqa: E402  (shared with the tests)

BENCHSTAT = 'golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da'
SMALL_DATASETS = ['prod1-1024', 'wczblk1-8']
WORKLOADS = ['hash', 'pyload', 'wrk', 'commit', 'gocommit']
COMMIT_WORKLOADS = ('commit', 'gocommit')
# What each workload measures, for the report.
WORKLOAD_DOC = {
    'hash': 'serial `zodbd hash zeo://…`: every object once, one request in flight (Go client); time per object',
    'pyload': 'serial loadBefore loop through the stock Python client (`ZEO.ClientStorage`, cache off); time per object',
    'wrk': '`zodbd wrk -c N`: N connections, one request in flight each, random objects (Go client)',
    'commit': 'N Python committers (`ZEO.DB`, one process each), small transactions on their own objects',
    'gocommit': 'N Go committers (`zodbd wrk --commit -c N`: one process, a connection each), '
                'transactions of 1–3 of their own objects; the server\'s commit path without the Python clients\' CPU',
}
# The machine conditions a round runs under (--conditions): ratios against
# the reference are reported for each separately, since the gain of a fast
# server over a slow one depends on whether idle vCPUs must be woken up.
CONDITIONS = {
    'quiet': 'nothing but the benchmark runs',
    'busy': 'a busy-loop process (--neighbours of them) runs beside the servers and clients',
}
BENCH_NAME = {'hash': 'Hash', 'pyload': 'PyLoad', 'wrk': 'Wrk', 'commit': 'Commit', 'gocommit': 'GoCommit'}

# name: (implementation, marshalling)
SERVERS = {
    'floor': ('floor', '-'),
    'zodbd-Z': ('zodbd', 'pickle'),
    'zodbd-M': ('zodbd', 'msgpack'),
    'zodbd-Z-bp': ('zodbd', 'pickle'),  # zodbd-Z with --busy-poll on (docs/scheduling.md)
    'runzeo-Z': ('runzeo', 'pickle'),
    # -U: the same server listening on a Unix socket instead of 127.0.0.1
    # (clients on the server's host), compared with runzeo-Z-U and floor-U.
    'floor-U': ('floor', '-'),
    'zodbd-Z-U': ('zodbd', 'pickle'),
    'runzeo-Z-U': ('runzeo', 'pickle'),
    'runzeo-M': ('runzeo', 'msgpack'),
    'zodbd-neo': ('zodbd-neo', 'neo'),
    'zodbd-neo-nosha1': ('zodbd-neo', 'neo'),  # the same node without sha1 on either side (--no-checksum, ?verify=0)
    'neo-py': ('neo-py', 'neo'),  # NEO/py's master + SQLite storage (--neo-py), on the dataset imported by NEO/py
    'zodbd-neo-sqlite': ('zodbd-neo-sqlite', 'neo'),  # zodbd neo-storage on that same imported database
}
SQLITE_IMPLS = ('neo-py', 'zodbd-neo-sqlite')
BASELINE = {'pickle': 'runzeo-Z', 'msgpack': 'runzeo-M'}
NEO_CLUSTER = 'bench'


def unix_socket(name):
    """Whether server `name` listens on a Unix socket (the -U variants)."""
    return name.endswith('-U')


def floor_of(name):
    """The bare ping-pong over the same transport as server `name`."""
    return 'floor-U' if unix_socket(name) else 'floor'


def client_url(variant, srv):
    """The URL the Go tools (hash, wrk) open for a server."""
    if variant['marshal'] == 'neo':
        q = '?verify=0' if srv.name.endswith('-nosha1') else ''
        return 'neo://%s@%s%s' % (NEO_CLUSTER, srv.addr, q)
    return 'zeo://' + srv.addr


def log(*a):
    print(*a, flush=True)


def die(msg):
    log('bench: ' + msg)
    sys.exit(1)


def csv(s, conv=str):
    return [conv(x) for x in s.split(',') if x.strip()] if s else []


def fmt_ns(ns):
    if ns is None:
        return '—'
    for unit, div in (('s', 1e9), ('ms', 1e6), ('µs', 1e3)):
        if ns >= div:
            v = ns / div
            return ('%.3g' % v if v < 100 else '%.0f' % v) + ' ' + unit
    return '%.0f ns' % ns


def fmt_num(x):
    if x is None:
        return '—'
    if x >= 1e6:
        return '%.2f M' % (x / 1e6)
    if x >= 1e4:
        return '%.1f k' % (x / 1e3)
    return '%.0f' % x if x >= 100 else '%.3g' % x


# ---------------------------------------------------------------- options

def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog='bench/run.py', description=__doc__.split('\n\n')[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument('--quick', action='store_true',
                    help='CI smoke: small datasets, zodbd-Z and runzeo-Z (and the floor), 1 round, '
                         'short workloads; checks that everything runs and the hashes match')
    ap.add_argument('--rounds', type=int, help='rounds (each runs every server once); default 5, --quick 1')
    ap.add_argument('--servers', help='comma-separated, from: ' + ', '.join(SERVERS)
                    + ' (default: all but the -U ones, which listen on a Unix socket; missing ones are '
                      'skipped with a note)')
    ap.add_argument('--datasets', help='default: prod1-1024,wczblk1-8 and prod1-BIG')
    ap.add_argument('--big', type=int, default=8192, metavar='N',
                    help='also a prod1 dataset of N transactions (generated once into data/datasets); 0: none')
    ap.add_argument('--workloads', default=','.join(WORKLOADS), help='from: ' + ', '.join(WORKLOADS))
    ap.add_argument('--clients', help='wrk connection counts (default 1,2,4,8,16; --quick 1,4)')
    ap.add_argument('--big-clients', default='1,4,16',
                    help='wrk connection counts on the big prod1 dataset (each wrk run first reads every object)')
    ap.add_argument('--wrk-duration', type=float, metavar='S', help='seconds per wrk point (default 0.5; --quick 0.3)')
    ap.add_argument('--committers', help='commit workload committer counts (default 1,16; --quick 1,4)')
    ap.add_argument('--commit-duration', type=float, metavar='S', help='seconds per commit point (default 1.5; --quick 0.5)')
    ap.add_argument('--commit-datasets', default='prod1-1024',
                    help='datasets the commit workload runs on (on each server\'s scratch copy)')
    ap.add_argument('--pyload-sample', type=int, metavar='N',
                    help='pyload loads at most N objects per run (spread evenly), 0: all (default 4000; --quick 500)')
    ap.add_argument('--pin', action='store_true',
                    help='server and load generator on disjoint CPU sets (whole cores each)')
    ap.add_argument('--server-cpus', help='CPU list for the server (implies --pin)')
    ap.add_argument('--load-cpus', help='CPU list for the load generator (implies --pin)')
    ap.add_argument('--gomaxprocs', type=int, help='GOMAXPROCS of the Go servers (zodbd, the floor)')
    ap.add_argument('--tune', action='store_true',
                    help='root: performance governor, C-states deeper than C1 off during the run; restored after')
    ap.add_argument('--sched', action='store_true',
                    help='scheduling study: zodbd-Z bound/unbound × GOMAXPROCS variants (docs/scheduling.md)')
    ap.add_argument('--neo-py', metavar='DIR', help='a NEO/py source tree (neoppod) to include: servers neo-py '
                    'and zodbd-neo-sqlite on the dataset imported by NEO/py (skipped if absent; docs/neo.md)')
    ap.add_argument('--neo-py-python', metavar='PY', help='a Python with NEO/py\'s dependencies (msgpack, ZODB, '
                    'six, python-dateutil); default: the harness\'s')
    ap.add_argument('--out', help='results folder (default data/bench/<timestamp>)')
    ap.add_argument('--report', metavar='DIR', help='only redo the report, benchstat and plots of DIR')
    ap.add_argument('--no-plots', action='store_true')
    ap.add_argument('--no-benchstat', action='store_true')
    ap.add_argument('--conditions', help='machine conditions the rounds cycle through: quiet (nothing added) '
                    'and busy (--neighbours busy-loop processes beside the servers and clients); '
                    'default quiet,busy (rounds alternate; report per condition), --quick quiet')
    ap.add_argument('--neighbours', type=int, default=1, metavar='N',
                    help='busy-loop processes of the busy condition')
    ap.add_argument('--wait-quiet', type=float, default=0, metavar='S',
                    help='wait up to S seconds for the machine to be quiet before starting')
    ap.add_argument('--zodbd', default=os.environ.get('ZODBD', os.path.join(REPO, 'bin', 'zodbd')))
    ap.add_argument('--zodbd-test', default=os.environ.get('ZODBD_TEST', os.path.join(REPO, 'bin', 'zodbd-test')),
                    help='the test build of zodbd (make build), whose neo-storage --with-master runs the '
                         'NEO storage node of zodbd-neo* with the test master in the same process')
    a = ap.parse_args(argv)
    defaults = dict(rounds=5, clients='1,2,4,8,16', wrk_duration=0.5, committers='1,16',
                    commit_duration=1.5, pyload_sample=4000, conditions='quiet,busy')
    if a.quick:
        defaults.update(rounds=1, clients='1,4', wrk_duration=0.3, committers='1,4', commit_duration=0.5,
                        pyload_sample=500, conditions='quiet')
        a.big = 0
        a.servers = a.servers or 'floor,zodbd-Z,runzeo-Z'
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.server_cpus or a.load_cpus:
        a.pin = True
    for c in csv(a.conditions):
        if c not in CONDITIONS:
            ap.error('unknown condition %r (from: %s)' % (c, ', '.join(CONDITIONS)))
    return a


# ---------------------------------------------------------------- datasets

class Dataset:
    def __init__(self, name, path, refdir):
        self.name, self.path, self.refdir = name, path, refdir
        self.sizes = path[:-3] + '.sizes'

    def ref_hash(self, algo='crc32'):
        with open(os.path.join(self.refdir, self.name + '.hash')) as f:
            for line in f:
                if line.startswith(algo + ':'):
                    return line.split()[0]
        die('%s: no %s reference hash' % (self.name, algo))


def prepare_datasets(a, names):
    dsdir = os.path.join(REPO, 'data', 'datasets')
    os.makedirs(dsdir, exist_ok=True)
    env = dict(os.environ, PYTHON=sys.executable)
    out = []
    for name in names:
        path = os.path.join(dsdir, name + '.fs')
        if name in SMALL_DATASETS:
            refdir = os.path.join(REPO, 'testdata', 'datasets')
            if not os.path.exists(path):
                subprocess.run([os.path.join(REPO, 'scripts', 'dataset.sh'), name, path],
                               cwd=REPO, env=env, check=True)
        else:
            m = re.fullmatch(r'prod1-(\d+)', name)
            if not m:
                die('unknown dataset %s (prod1-N or %s)' % (name, ', '.join(SMALL_DATASETS)))
            refdir = dsdir
            gen = GEN_DATASET
            ref = os.path.join(dsdir, name + '.hash')
            if not os.path.exists(path):
                log('dataset %s: generating with gen_dataset.py prod1 %s' % (name, m.group(1)))
                tmp = path + '.tmp'
                subprocess.run([sys.executable, gen, 'prod1', tmp, m.group(1)], check=True,
                               stdout=subprocess.DEVNULL)
                for suffix in ('.index', '.lock', '.tmp'):
                    if os.path.exists(tmp + suffix):
                        os.remove(tmp + suffix)
                os.replace(tmp, path)
                if os.path.exists(ref):
                    os.remove(ref)
            if not os.path.exists(ref) or os.path.getmtime(ref) < os.path.getmtime(path):
                # The reference: ZODB/py's own FileStorage (gen_dataset.py hash).
                lines = [subprocess.run([sys.executable, gen, 'hash', path, '--' + algo], check=True,
                                        capture_output=True, text=True).stdout.strip()
                         for algo in ('crc32', 'sha1')]
                with open(ref, 'w') as f:
                    f.write('\n'.join(lines) + '\n')
        out.append(Dataset(name, path, refdir))
    # zodbd hash on the files == ZODB/py's reference (scripts/check_hashes.sh).
    for refdir in sorted({d.refdir for d in out}):
        names = [d.name for d in out if d.refdir == refdir]
        p = subprocess.run([os.path.join(REPO, 'scripts', 'check_hashes.sh'), a.zodbd, refdir, dsdir] + names,
                           cwd=REPO, capture_output=True, text=True)
        for line in p.stdout.splitlines():
            log('  ' + line)
        if p.returncode != 0:
            die('dataset hashes do not match ZODB/py\'s (above)')
    for d in out:
        if not os.path.exists(d.sizes) or os.path.getmtime(d.sizes) < os.path.getmtime(d.path):
            write_sizes(d)
    return out


def write_sizes(d):
    """The data size of every object, in oid order (the floor's frames)."""
    from ZODB.FileStorage import FileStorage
    from ZODB.POSException import POSKeyError
    from ZODB.utils import maxtid, p64
    fs = FileStorage(d.path, read_only=True)
    sizes = []
    try:
        oid = 0
        while True:
            try:
                r = fs.loadBefore(p64(oid), maxtid)
            except POSKeyError:
                break
            if r is None:
                break
            sizes.append(len(r[0]))
            oid += 1
    finally:
        fs.close()
    with open(d.sizes + '.tmp', 'w') as f:
        f.write('\n'.join(map(str, sizes)) + '\n')
    os.replace(d.sizes + '.tmp', d.sizes)


# ---------------------------------------------------------------- tools

def build_tools(a):
    bindir = os.path.join(REPO, '.bench', 'bin')
    os.makedirs(bindir, exist_ok=True)
    pp = os.path.join(bindir, 'pingpong')
    if shutil.which('go') is None and os.access(pp, os.X_OK):
        log('no go command: using the pingpong already built in .bench/bin')
        return pp, None
    subprocess.run(['go', 'build', '-o', pp, './bench/pingpong'], cwd=REPO, check=True)
    bs = None
    if not a.no_benchstat:
        bs = os.path.join(bindir, 'benchstat')
        if not os.path.exists(bs):
            log('installing %s into .bench/bin' % BENCHSTAT)
            p = subprocess.run(['go', 'install', BENCHSTAT], cwd=REPO,
                               env=dict(os.environ, GOBIN=bindir, GOFLAGS='-mod=mod'),
                               capture_output=True, text=True)
            if p.returncode != 0:
                log('benchstat: cannot install (%s); comparison tables skipped' % p.stderr.strip()[-300:])
                bs = None
    return pp, bs


def capabilities(a):
    """What this zodbd can do: hash over a URL, wrk, neo-storage."""
    def out(*args):
        p = subprocess.run([a.zodbd] + list(args), capture_output=True, text=True)
        return p.stdout + p.stderr
    helptext = out('help')
    cmds = {l.split()[0] for l in helptext.split('commands:', 1)[-1].splitlines() if l.startswith('  ') and l.split()}
    hashhelp = out('hash', '-h')
    return {
        'hash-url': 'zeo://' in hashhelp or 'URL' in hashhelp,
        'wrk': 'wrk' in cmds,
        'neo-storage': 'neo-storage' in cmds and os.access(a.zodbd_test, os.X_OK),
    }


# ---------------------------------------------------------------- servers

class Server:
    """One started server: a process listening on addr (127.0.0.1:PORT, or a
    Unix socket path) serving a scratch copy of a dataset; stop() ends it
    by its pid."""

    def __init__(self, name, cmd, env, addr, logpath, fs):
        self.name, self.cmd, self.addr, self.logpath, self.fs = name, cmd, addr, logpath, fs
        self.logf = open(logpath, 'wb')
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.logf, stderr=subprocess.STDOUT,
                                     cwd=REPO, start_new_session=True)
        LIVE.add(self)

    def wait_ready(self, timeout=180):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError('%s exited (%s) at start; log %s:\n%s' % (
                    self.name, self.proc.returncode, self.logpath, tail(self.logpath)))
            try:
                latency.connect(self.addr, timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError('%s did not listen on %s in %ds' % (self.name, self.addr, timeout))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                log('  %s (pid %d) ignored SIGTERM for 20 s: SIGKILL' % (self.name, self.proc.pid))
                self.proc.kill()
                self.proc.wait()
        self.logf.close()
        LIVE.discard(self)
        return self.proc.returncode


LIVE = set()
FAILURES = []


class Mismatch(Exception):
    """A server gave a wrong answer (a hash differs from ZODB/py's)."""


def tail(path, n=15):
    try:
        with open(path, errors='replace') as f:
            return ''.join(f.readlines()[-n:])
    except OSError:
        return ''


class Setup:
    """Everything a session needs: tools, pinning, per-server options."""

    def __init__(self, a, pingpong, caps, variants):
        self.a, self.pingpong, self.caps, self.variants = a, pingpong, caps, variants
        self.srv_cpus = self.load_cpus = None
        self.floor_only = set()
        if a.pin:
            s, l, note = machine.split_cpus()
            self.srv_cpus = machine.parse_cpulist(a.server_cpus) if a.server_cpus else s
            self.load_cpus = machine.parse_cpulist(a.load_cpus) if a.load_cpus else l
            if note:
                log('--pin: ' + note)
            log('--pin: server on CPUs %s, load generator on CPUs %s' % (
                machine.format_cpulist(self.srv_cpus), machine.format_cpulist(self.load_cpus)))

    def neo_python(self):
        return self.a.neo_py_python or sys.executable

    def neo_db(self, ds):
        """The dataset imported into a NEO/py SQLite database by NEO/py's
        Importer backend (once; cached in data/bench/neo-import/)."""
        d = os.path.join(REPO, 'data', 'bench', 'neo-import')
        os.makedirs(d, exist_ok=True)
        db = os.path.join(d, ds.name + '.sqlite')
        if not os.path.exists(db):
            log('    importing %s into NEO/py (Importer backend)' % ds.name)
            tmp = db + '.tmp'
            if os.path.exists(tmp):
                os.remove(tmp)
            subprocess.run([sys.executable, os.path.join(HERE, 'neopy.py'), 'import', '--src', self.a.neo_py,
                            '--python', self.neo_python(), '--cluster', NEO_CLUSTER, ds.path, tmp],
                           check=True, stdout=subprocess.DEVNULL, timeout=3600)
            os.rename(tmp, db)
        return db

    def load_prefix(self, variant):
        cpus = variant.get('load_cpus', self.load_cpus)
        return ['taskset', '-c', machine.format_cpulist(cpus)] if cpus else []

    def server_cmd(self, name, variant, fs, addr):
        impl, marshal = variant['impl'], variant['marshal']
        env = dict(os.environ)
        env.pop('ZEO_MSGPACK', None)
        env.pop('GOMAXPROCS', None)
        cpus = variant.get('srv_cpus', self.srv_cpus)
        gmp = variant.get('gomaxprocs', self.a.gomaxprocs)
        taskset = ['taskset', '-c', machine.format_cpulist(cpus)] if cpus else []
        if impl == 'zodbd':
            cmd = [self.a.zodbd, 'serve', '-a', addr, '-f', fs]
            if marshal == 'msgpack':
                cmd.append('--msgpack')
            if cpus:  # zodbd's own knob rather than taskset
                cmd += ['--cpus', machine.format_cpulist(cpus)]
            if gmp:
                cmd += ['--gomaxprocs', str(gmp)]
            if name.endswith('-bp'):
                cmd += ['--busy-poll', 'on']
            return cmd, env
        if impl == 'runzeo':
            if marshal == 'msgpack':
                env['ZEO_MSGPACK'] = '1'
            return taskset + runzeo_cmd() + ['-a', addr, '-f', fs], env
        if impl == 'floor':
            if gmp:
                env['GOMAXPROCS'] = str(gmp)
            return taskset + [self.pingpong, 'serve', '-a', addr], env
        if impl == 'neo-py':
            return [sys.executable, os.path.join(HERE, 'neopy.py'), 'serve', '--src', self.a.neo_py,
                    '--python', self.neo_python(), '--addr', addr, '--cluster', NEO_CLUSTER, fs], env
        if impl == 'zodbd-neo-sqlite':
            cmd = taskset + [self.a.zodbd_test, 'neo-storage', '--cluster', NEO_CLUSTER, '--with-master', addr]
            if gmp:
                cmd += ['--gomaxprocs', str(gmp)]
            return cmd + ['sqlite:' + fs], env
        if impl == 'zodbd-neo':
            # The storage node and, in the same process, the minimal master
            # of the test suite (not on the read path), listening on addr:
            # the test build of zodbd (the same node code as the release's).
            cmd = taskset + [self.a.zodbd_test, 'neo-storage', '--cluster', NEO_CLUSTER, '--with-master', addr]
            if gmp:
                cmd += ['--gomaxprocs', str(gmp)]
            if name.endswith('-nosha1'):
                cmd.append('--no-checksum')  # the flag that both sides honour
            return cmd + [fs], env
        raise RuntimeError('no way to start %s' % name)


def server_variants(a, caps):
    """{name: variant} of the servers to run, and the notes on those skipped."""
    notes = []
    if a.sched:
        return sched_variants(a), notes
    names = csv(a.servers) or [n for n in SERVERS if not unix_socket(n)]
    out = {}
    for n in names:
        if n not in SERVERS:
            die('unknown server %s (%s)' % (n, ', '.join(SERVERS)))
        impl, marshal = SERVERS[n]
        if impl == 'zodbd-neo' and not caps['neo-storage']:
            notes.append('%s skipped: this zodbd has no `neo-storage` command yet, or no test build '
                         'at %s (make build)' % (n, a.zodbd_test))
            continue
        if impl in SQLITE_IMPLS:
            if not a.neo_py:
                if a.servers:
                    notes.append('%s skipped: no --neo-py DIR given' % n)
                continue
            if not os.path.isdir(os.path.join(a.neo_py, 'neo')):
                notes.append('%s skipped: %s is not a NEO/py source tree' % (n, a.neo_py))
                continue
            if impl == 'zodbd-neo-sqlite' and not caps['neo-storage']:
                notes.append('%s skipped: this zodbd has no `neo-storage` command' % n)
                continue
        if impl == 'runzeo' and not runzeo_cmd():
            notes.append('%s skipped: no runzeo beside %s, and no ZEO module' % (n, sys.executable))
            continue
        out[n] = {'impl': impl, 'marshal': marshal}
    return out, notes


def sched_variants(a):
    """zodbd-Z under each scheduling setting (docs/scheduling.md). Bound:
    the server on its half of the cores with --cpus, the load generator on
    the other half; unbound: nobody pinned. GOMAXPROCS: unbound all CPUs
    (the default), 1, 2, 4, a quarter and half of them (where fewer than
    all: the CPU per load falls with fewer Ps, the loads/s peak between);
    bound 1, the bound set's size and twice it (more Ps than CPUs)."""
    n = len(machine.online_cpus())
    s, l, _ = machine.split_cpus()
    if a.server_cpus:
        s = machine.parse_cpulist(a.server_cpus)
    if a.load_cpus:
        l = machine.parse_cpulist(a.load_cpus)
    v = {'unbound-gmp%d' % n: {'gomaxprocs': n, 'srv_cpus': None, 'load_cpus': None}}
    for g in sorted({1, 2, 4, max(1, n // 4), max(1, n // 2)}):
        if g < n:
            v.setdefault('unbound-gmp%d' % g, {'gomaxprocs': g, 'srv_cpus': None, 'load_cpus': None})
    for g in sorted({1, len(s), 2 * len(s)}):
        v['bound-gmp%d' % g] = {'gomaxprocs': g, 'srv_cpus': s, 'load_cpus': l}
    for x in v.values():
        x.update(impl='zodbd', marshal='pickle')
    # Controls: the bare ping-pong, unbound and bound the same way, tells
    # what binding does to loopback round trips by themselves.
    v['floor'] = {'impl': 'floor', 'marshal': '-', 'srv_cpus': None, 'load_cpus': None}
    v['floor-bound'] = {'impl': 'floor', 'marshal': '-', 'srv_cpus': s, 'load_cpus': l}
    return v


# ---------------------------------------------------------------- workloads

def run_client(setup, variant, cmd, logpath, timeout):
    """Runs a load-generator command (pinned when asked); returns stdout.
    Its stderr goes to logpath; Python tracebacks there are counted as
    client errors (the stock ZEO client logs protocol violations that way)."""
    full = setup.load_prefix(variant) + cmd
    with open(logpath, 'ab') as errf:
        errf.write(('$ %s\n' % shlex.join(full)).encode())
        errf.flush()
        start = errf.tell()
        p = subprocess.run(full, stdout=subprocess.PIPE, stderr=errf, cwd=REPO, timeout=timeout)
    with open(logpath, 'rb') as f:
        f.seek(start)
        errs = f.read().decode(errors='replace')
    nerr = errs.count('Traceback (most recent call last)')
    if p.returncode != 0:
        raise RuntimeError('%s failed (exit %d); log %s:\n%s' % (cmd[0], p.returncode, logpath, errs[-2000:]))
    return p.stdout.decode(errors='replace'), nerr, errs


def first_error(errs):
    for line in errs.splitlines():
        if re.match(r'^\w*(Error|Exception)\b', line):
            return line.strip()[:200]
    return ''


def w_hash(setup, variant, srv, ds, logpath, quick):
    if variant['impl'] == 'floor':
        n = len(open(ds.sizes).read().split())
        out, _, _ = run_client(setup, variant, [setup.pingpong, 'load', '-c', '1', '-n', str(n),
                                                '-sizes', ds.sizes, srv.addr], logpath, 600)
        r = json.loads(out)
        return {"ns/op": r["latency_ns"].get("mean"), "objects": n}, r["histogram_ns"]
    out, nerr, errs = run_client(setup, variant, [setup.a.zodbd, 'hash', '--crc32', client_url(variant, srv)],
                                 logpath, 600)
    m = re.search(r'oid=0\.\.(\d+).*?\(([\d.]+) µs / object\)', out)
    if not m:
        raise RuntimeError('zodbd hash: cannot read %r' % out[:200])
    got = out.split()[0]
    want = ds.ref_hash('crc32')
    if got != want:
        raise Mismatch('zodbd hash over %s: %s, want %s (ZODB/py)' % (srv.name, got, want))
    return {'ns/op': float(m.group(2)) * 1e3, 'objects': int(m.group(1)) + 1, 'errors': nerr}, None


def w_pyload(setup, variant, srv, ds, logpath, quick):
    js = logpath + '.json'
    sample = ['--sample', str(setup.a.pyload_sample)] if setup.a.pyload_sample else []
    if variant['impl'] == 'floor':
        cmd = [sys.executable, os.path.join(HERE, 'pyfloor.py'), srv.addr, ds.name,
               '--sizes', ds.sizes, '--json', js] + sample
    else:
        cmd = [sys.executable, os.path.join(HERE, 'zeo_pyload.py'), srv.addr, ds.name, '1', '--json', js] + sample
    out, nerr, errs = run_client(setup, variant, cmd, logpath, 600)
    with open(js) as f:
        r = json.load(f)
    os.remove(js)
    lat = r['latency_ns']
    return {'ns/op': r['duration_s'] / r['ops'] * 1e9, 'p50-ns': lat['p50'], 'p99-ns': lat['p99'],
            'objects': r['ops'], 'errors': nerr}, r['histogram_ns']


def parse_wrk(text):
    """ops/s, p50, p99 (ns) and a histogram from `zodbd wrk --json` (or the
    floor's pingpong): the JSON object is read with lenient key names
    (ops_per_s / throughput / rps; latency_ns|_us|_ms {p50, p99} or p50_ns
    ...; histogram as [lo, hi, count] rows or {lo, hi, count} objects)."""
    obj = None
    for cand in [text] + [l for l in reversed(text.splitlines()) if l.strip().startswith('{')]:
        try:
            obj = json.loads(cand)
            break
        except ValueError:
            continue
    if not isinstance(obj, dict):
        return None
    flat = {}

    def walk(o, path):
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, path + (str(k).lower(),))
        else:
            flat[path] = o
    walk(obj, ())

    def unit_of(key):
        for u, mul in (('ns', 1), ('us', 1e3), ('µs', 1e3), ('ms', 1e6)):
            if re.search(r'(^|[._])%s($|[._])' % u, key) or key.endswith('_' + u):
                return mul
        if re.search(r'(^|[._])(s|sec|seconds)$', key):
            return 1e9
        return 1  # Go durations marshal as ns

    res = {}
    for path, v in flat.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not path:
            continue
        key, last = '.'.join(path), path[-1]
        if re.fullmatch(r'(ops|loads|requests|req|reqs)?_?(per_?s|per_?sec|/s)|throughput|rps|qps|ops_s', last) \
                and 'ops/s' not in res:
            res['ops/s'] = float(v)
        for p in ('50', '99'):
            if re.fullmatch(r'(p|q)?%s(\.0)?(_(ns|us|µs|ms|s))?|(latency_)?p%s_.*' % (p, p), last) \
                    and ('p%s-ns' % p) not in res:
                res['p%s-ns' % p] = float(v) * unit_of(key)
        if last in ('median',) and 'p50-ns' not in res:
            res['p50-ns'] = float(v) * unit_of(key)
    hist = None
    for k, v in obj.items():
        if 'hist' in k.lower() and isinstance(v, list) and v:
            mul = unit_of(k.lower())
            try:
                if isinstance(v[0], (list, tuple)) and len(v[0]) >= 3:
                    hist = [[x[0] * mul, x[1] * mul, x[2]] for x in v]
                elif isinstance(v[0], dict):
                    ks = {kk.lower(): kk for kk in v[0]}
                    lo = next(ks[x] for x in ks if x.startswith(('lo', 'from', 'min')))
                    hi = next(ks[x] for x in ks if x.startswith(('hi', 'to', 'max', 'up')))
                    cnt = next(ks[x] for x in ks if x.startswith(('count', 'n')))
                    hist = [[x[lo] * mul, x[hi] * mul, x[cnt]] for x in v]
            except (StopIteration, TypeError, IndexError):
                hist = None
    return res, hist


def w_wrk(setup, variant, srv, ds, logpath, quick, clients):
    d = setup.a.wrk_duration
    if variant['impl'] == 'floor':
        cmd = [setup.pingpong, 'load', '-c', str(clients), '-d', '%gs' % d, '-sizes', ds.sizes, srv.addr]
    else:
        cmd = [setup.a.zodbd, 'wrk', '-c', str(clients), '-d', '%gs' % d, '--cache=off', '--json',
               client_url(variant, srv)]
    cpu0 = machine.proc_cpu_seconds(srv.proc.pid)
    out, nerr, errs = run_client(setup, variant, cmd, logpath, 120 + 3 * d)
    cpu1 = machine.proc_cpu_seconds(srv.proc.pid)
    parsed = parse_wrk(out)
    if not parsed or 'ops/s' not in parsed[0]:
        raise RuntimeError('cannot read the output of %s: %r' % (shlex.join(cmd), out[:300]))
    res, hist = parsed
    res['ns/op'] = 1e9 / res['ops/s'] if res['ops/s'] else None
    res['errors'] = nerr
    try:
        j = json.loads(out.strip().splitlines()[-1])
        if j.get('errors'):  # wrong answers seen by wrk's checks
            res['errors'] += int(j['errors'])
            res['error-sample'] = 'zodbd wrk: %s wrong or failed loads' % j['errors']
        if j.get('ops'):
            res['ops'] = j['ops']
    except (ValueError, IndexError, AttributeError):
        pass
    # The server's CPU per load: its process's user+system time over the
    # run (clock ticks of 10 ms: a run of 0.5 s at 50k loads/s spends
    # ~0.3 s, so the resolution is a few %), over the loads it answered.
    ops = res.get('ops') or (res['ops/s'] * d if res.get('ops/s') else 0)
    if cpu0 is not None and cpu1 is not None and ops:
        res['srv-cpu-ns/op'] = (cpu1 - cpu0) * 1e9 / ops
    return res, hist


def w_commit(setup, variant, srv, ds, logpath, quick, clients):
    js = logpath + '.json'
    cmd = [sys.executable, os.path.join(HERE, 'zeo_commit.py'), srv.addr, ds.name, '-c', str(clients),
           '-d', str(setup.a.commit_duration), '--json', js]
    if quick:
        cmd += ['--warmup', '0.1']
    out, nerr, errs = run_client(setup, variant, cmd, logpath, 300 + setup.a.commit_duration)
    with open(js) as f:
        r = json.load(f)
    os.remove(js)
    lat = r['latency_ns']
    res = {'commits/s': r['ops_per_s'], 'ns/op': 1e9 / r['ops_per_s'] if r['ops_per_s'] else None,
           'p50-ns': lat.get('p50'), 'p99-ns': lat.get('p99'), 'errors': nerr,
           'conflicts': r.get('conflicts', 0)}
    if nerr:
        res['error-sample'] = first_error(errs)
    return res, r['histogram_ns']


def w_gocommit(setup, variant, srv, ds, logpath, quick, clients):
    d = setup.a.commit_duration
    cmd = [setup.a.zodbd, 'wrk', '--commit', '-c', str(clients), '-d', '%gs' % d, '--json', client_url(variant, srv)]
    out, nerr, errs = run_client(setup, variant, cmd, logpath, 120 + 3 * d)
    try:
        j = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError) as e:
        raise RuntimeError('cannot read the output of %s: %r' % (shlex.join(cmd), out[:300])) from e
    lat = j['latency_ns']
    res = {'commits/s': j['ops_per_s'], 'ns/op': 1e9 / j['ops_per_s'] if j['ops_per_s'] else None,
           'p50-ns': lat.get('p50'), 'p99-ns': lat.get('p99'), 'errors': nerr + int(j.get('errors') or 0),
           'ops': j.get('ops')}
    if j.get('errors'):
        res['error-sample'] = 'zodbd wrk --commit: %s failed commits, first: %s' % (j['errors'], j.get('first_error'))
    elif nerr:
        res['error-sample'] = first_error(errs)
    return res, j['histogram_ns']


def wait_neo_operational(srv, timeout=120):
    """Waits until the NEO storage node says it serves (its master listens
    earlier, and would refuse clients until then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(srv.logpath, errors='replace') as f:
                if 'operational' in f.read():
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError('%s: the NEO storage node did not become operational in %ds (log %s)'
                       % (srv.name, timeout, srv.logpath))


def check_through_server(a, srv, ds, logpath):
    """ZODB/py's hash of the dataset computed through the server (the stock
    Python client) == the reference."""
    gen = GEN_DATASET
    with open(logpath, 'ab') as errf:
        p = subprocess.run([sys.executable, gen, 'hash', 'zeo://' + srv.addr, '--crc32'],
                           stdout=subprocess.PIPE, stderr=errf, timeout=900)
    got = p.stdout.decode().split()[0] if p.stdout.split() else '(nothing)'
    want = ds.ref_hash('crc32')
    if p.returncode != 0 or got != want:
        raise Mismatch('hash through %s on %s: %s, want %s (log %s)' % (srv.name, ds.name, got, want, logpath))
    return got


# ---------------------------------------------------------------- a session

def session(setup, name, variant, ds, rnd, outdir, workloads, env, checked):
    """Start server `name` on a scratch copy of ds, run the workloads, stop
    it; returns the records and writes raw/<run>.{txt,json}."""
    a = setup.a
    tag = '%02d-%s-%s' % (rnd, ds.name, name)
    work = os.path.join(outdir, 'work')
    os.makedirs(work, exist_ok=True)
    logs = os.path.join(outdir, 'logs')
    os.makedirs(logs, exist_ok=True)
    if variant['impl'] in SQLITE_IMPLS:
        fs = os.path.join(work, tag + '.sqlite')
        shutil.copyfile(setup.neo_db(ds), fs)
    else:
        fs = os.path.join(work, tag + '.fs')
    if variant['impl'] not in ('floor',) + SQLITE_IMPLS:
        shutil.copyfile(ds.path, fs)
    if unix_socket(name):
        # A short path: a socket's must fit in 108 bytes.
        sockdir = tempfile.mkdtemp(prefix='zodbd-bench-')
        addr = os.path.join(sockdir, 'zeo.sock')
    else:
        sockdir, addr = None, '127.0.0.1:%d' % free_port()
    cmd, senv = setup.server_cmd(name, variant, fs, addr)
    srv = Server(name, cmd, senv, addr, os.path.join(logs, tag + '.server.log'), fs)
    clog = os.path.join(logs, tag + '.client.log')
    records = []
    t0, cpu0, own0 = time.monotonic(), machine.cpu_times(), own_cpu()
    try:
        srv.wait_ready()
        if variant['marshal'] == 'neo':
            wait_neo_operational(srv)
        # The stock Python client's view (ZODB/py's hash through the server)
        # once per server and dataset; on big datasets only without the
        # hash workload (which checks zodbd hash's checksum every run).
        nobj = len(open(ds.sizes).read().split())
        if variant['impl'] != 'floor' and variant['marshal'] != 'neo' and (name, ds.name) not in checked and \
                (nobj <= 10000 or 'hash' not in workloads):
            h = check_through_server(a, srv, ds, clog)
            checked.add((name, ds.name))
            log('    %s: %s through %s == ZODB/py reference' % (ds.name, h, name))

        def rec(workload, clients, fn, *args):
            try:
                res, hist = fn(setup, variant, srv, ds, clog, a.quick, *args)
            except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError, OSError) as e:
                # A failed workload costs its own figure, not the whole run
                # (wrong answers raise Mismatch, which does stop it).
                msg = '%s %s c=%s on %s, round %d: %s' % (name, workload, clients, ds.name, rnd,
                                                          str(e).splitlines()[0][:300])
                FAILURES.append(msg)
                log('    FAILED ' + msg)
                return
            records.append({'server': name, 'dataset': ds.name, 'round': rnd, 'workload': workload,
                            'clients': clients, 'metrics': res, 'hist': hist,
                            'condition': getattr(setup, 'condition', 'quiet')})
            if res.get('errors'):
                log('    WARNING %s %s c=%s: %d client-side errors (%s); see %s' % (
                    name, workload, clients, res['errors'], res.get('error-sample', ''), clog))

        if variant['impl'] != 'floor':
            workloads = [w for w in workloads if w not in setup.floor_only]
        if variant['marshal'] == 'neo':
            # The Python workloads use the stock ZEO client; the NEO
            # client is read-only.
            workloads = [w for w in workloads if w not in ('pyload',) + COMMIT_WORKLOADS]
        if 'hash' in workloads:
            rec('hash', 1, w_hash)
        if 'pyload' in workloads:
            rec('pyload', 1, w_pyload)
        if 'wrk' in workloads:
            big = a.big and ds.name == 'prod1-%d' % a.big
            for c in csv(a.big_clients if big else a.clients, int):
                rec('wrk', c, w_wrk, c)
        if 'commit' in workloads and variant['impl'] != 'floor' and ds.name in csv(a.commit_datasets):
            for c in csv(a.committers, int):
                rec('commit', c, w_commit, c)
        if 'gocommit' in workloads and variant['impl'] != 'floor' and ds.name in csv(a.commit_datasets):
            for c in csv(a.committers, int):
                rec('gocommit', c, w_gocommit, c)
    finally:
        rc = srv.stop()
        if sockdir:
            shutil.rmtree(sockdir, ignore_errors=True)
        for suffix in ('', '.index', '.lock', '.tmp', '.old', '-journal'):
            if os.path.exists(fs + suffix):
                os.remove(fs + suffix)
    if rc not in (0, -signal.SIGTERM):
        log('    note: %s exited with %s on SIGTERM (log %s)' % (name, rc, srv.logpath))
    # CPU used by other processes meanwhile: the machine's busy time less
    # this process's and its children's (servers and clients, all waited for).
    wall = time.monotonic() - t0
    cpu1, own1 = machine.cpu_times(), own_cpu()
    busy = ((cpu1[0] - cpu0[0]) - (cpu1[1] - cpu0[1]) - (cpu1[2] - cpu0[2])) / os.sysconf('SC_CLK_TCK')
    others = max(0.0, busy - (own1 - own0)) / (wall * len(machine.online_cpus())) * 100
    steal = 100.0 * (cpu1[2] - cpu0[2]) / max(1, cpu1[0] - cpu0[0])
    for r in records:
        r['others_cpu'], r['steal'] = others, steal
    write_raw(outdir, tag, name, variant, ds, rnd, env, shlex.join(cmd), records,
              {'others-cpu': '%.1f%%' % others, 'steal': '%.1f%%' % steal})
    log('    %-14s %-12s %5.1fs  %s%s' % (name, ds.name, wall, brief(records),
                                         '  [others used %.0f%% of the CPUs]' % others if others >= 10 else ''))
    return records


def own_cpu():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def brief(records):
    out = []
    for r in records:
        m = r['metrics']
        if r['workload'] in ('hash', 'pyload'):
            out.append('%s %s/obj' % (r['workload'], fmt_ns(m.get('ns/op'))))
        elif r['workload'] == 'wrk' and r['clients'] in (1, 16):
            out.append('wrk%d %s/s' % (r['clients'], fmt_num(m.get('ops/s'))))
        elif r['workload'] in COMMIT_WORKLOADS:
            out.append('%s%d %s/s' % (r['workload'], r['clients'], fmt_num(m.get('commits/s'))))
    return ', '.join(out)


UNITS = [('ns/op', 1), ('ops/s', 1), ('commits/s', 1), ('p50-ns', 1), ('p99-ns', 1)]


def bench_line(r):
    name = 'Benchmark%s/ds=%s' % (BENCH_NAME[r['workload']], r['dataset'])
    if r['workload'] in ('wrk',) + COMMIT_WORKLOADS:
        name += '/c=%d' % r['clients']
    m = r['metrics']
    n = int(m.get('objects') or m.get('ops') or max(1, round((m.get('ops/s') or m.get('commits/s') or 1))))
    vals = ' '.join('%.6g %s' % (m[u], u) for u, _ in UNITS if m.get(u) is not None)
    return '%s %d %s' % (name, n, vals)


def write_raw(outdir, tag, name, variant, ds, rnd, env, cmd, records, noise):
    raw = os.path.join(outdir, 'raw')
    os.makedirs(raw, exist_ok=True)
    hdr = dict(env)
    hdr.update({'server': name, 'impl': variant['impl'], 'marshal': variant['marshal'],
                'dataset': ds.name, 'run': str(rnd), 'server-cmd': cmd})
    hdr.update(noise)
    with open(os.path.join(raw, tag + '.txt'), 'w') as f:
        for k, v in hdr.items():
            f.write('%s: %s\n' % (k, str(v).replace('\n', ' ')))
        f.write('Unit ops/s better=higher\nUnit commits/s better=higher\n')
        for r in records:
            f.write(bench_line(r) + '\n')
    with open(os.path.join(raw, tag + '.json'), 'w') as f:
        json.dump({'header': hdr, 'variant': {k: v for k, v in variant.items()}, 'records': records}, f)


# ---------------------------------------------------------------- report

def load_results(outdir):
    recs, variants = [], {}
    raw = os.path.join(outdir, 'raw')
    for fn in sorted(os.listdir(raw)):
        if fn.endswith('.json'):
            with open(os.path.join(raw, fn)) as f:
                j = json.load(f)
            recs.extend(j['records'])
            variants[j['header']['server']] = j['variant']
    return recs, variants


def aggregate(recs):
    """{(workload, dataset, clients, server): {metric: [values by round]}}"""
    agg = {}
    for r in recs:
        k = (r['workload'], r['dataset'], r['clients'], r['server'])
        d = agg.setdefault(k, {'_rounds': []})
        d['_rounds'].append(r['round'])
        for m, v in r['metrics'].items():
            if isinstance(v, (int, float)):
                d.setdefault(m, []).append(v)
    return agg


def med(vals):
    return statistics.median(vals) if vals else None


def mmm(vals, f=fmt_ns):
    if not vals:
        return '—'
    if len(vals) == 1:
        return '%s (n=1)' % f(vals[0])
    return '%s (%s–%s, n=%d)' % (f(med(vals)), f(min(vals)), f(max(vals)), len(vals))


def paired_ratios(k_num, k_den, metric, recs_by_round):
    """Per-round ratio num/den (the same round: neighbours in time)."""
    a, b = recs_by_round.get(k_num, {}), recs_by_round.get(k_den, {})
    return [a[r][metric] / b[r][metric] for r in sorted(set(a) & set(b))
            if a[r].get(metric) and b[r].get(metric)]


def by_round(recs):
    out = {}
    for r in recs:
        out.setdefault((r['workload'], r['dataset'], r['clients'], r['server']), {})[r['round']] = r['metrics']
    return out


def baseline_of(name, variants, sched, order=()):
    if sched:  # zodbd variants against the first (the default), floors against the unbound floor
        if variants.get(name, {}).get('impl') == 'floor':
            return 'floor'
        return next((s for s in (order or variants) if variants.get(s, {}).get('impl') != 'floor'), None)
    ref = BASELINE.get(variants.get(name, {}).get('marshal') or SERVERS.get(name, ('', ''))[1])
    return ref + '-U' if ref and unix_socket(name) else ref


def ratio_cell(vals):
    if not vals:
        return '—'
    if len(vals) == 1:
        return '%.2f×' % vals[0]
    return '%.2f× (%.2f–%.2f)' % (med(vals), min(vals), max(vals))


EXTRA_HEAD = {'srv-cpu-ns/op': 'server CPU/load'}


def condition_section(meta, recs, servers, keys, ref_name, metric_of):
    """The report's "Quiet and busy" part: the machine's state round by
    round, how far the floor moved within each condition, and each server's
    ratio to its reference for each condition separately, with the range
    that holds across them (what a headline may claim)."""
    conds = meta.get('conditions') or []
    states = meta.get('round_state') or {}
    L = []
    if states:
        L.append('## Rounds: machine state\n')
        L.append('Condition, load average before/after, share of CPU time idle, and the share of the '
                 'round\'s CPU time spent in each cpuidle state (deep states mean wake-up latency per '
                 'request).\n')
        L.append('| round | condition | load before | load after | CPUs idle | neighbour CPU s | idle states |')
        L.append('|---:|---|---:|---:|---:|---:|---|')
        for r in sorted(states, key=int):
            st = states[r]
            ist = ' '.join('%s %.0f%%' % kv for kv in (st.get('idle-states-%') or {}).items()) or 'n/a'
            L.append('| %s | %s | %.2f | %.2f | %.0f%% | %.1f | %s |' % (
                r, st['condition'], st['loadavg-before'], st['loadavg-after'], st['idle-%'],
                st.get('neighbour-cpu-s', 0), ist))
        L.append('')
    if len(set(conds)) < 2:
        return L
    L.append('## Quiet and busy\n')
    L.append('Conditions: ' + '; '.join('**%s**: %s' % (c, CONDITIONS[c]) for c in dict.fromkeys(conds)) + '.')
    L.append('Each ratio is paired by round within one condition, median (min–max); "holds across" is the '
             'range of the conditions\' medians: the figure to quote.\n')
    if 'floor' in servers:
        L.append('The floor itself (bare TCP ping-pong), median (min–max) per condition: how much the machine moved.\n')
        L.append('| workload | dataset | N | ' + ' | '.join(dict.fromkeys(conds)) + ' |')
        L.append('|---|---|---:|' + '---:|' * len(set(conds)))
        for (w, d, c) in keys:
            mm, _ = metric_of[w]
            cells = []
            for cond in dict.fromkeys(conds):
                v = [r['metrics'][mm] for r in recs if r['server'] == 'floor' and r.get('condition') == cond
                     and (r['workload'], r['dataset'], r['clients']) == (w, d, c) and r['metrics'].get(mm)]
                f = fmt_num if mm.endswith('/s') else fmt_ns
                cells.append(('%s (%s–%s)' % (f(med(v)), f(min(v)), f(max(v))) if len(v) > 1 else f(v[0]))
                             if v else '—')
            L.append('| %s | %s | %s | %s |' % (w, d, c, ' | '.join(cells)))
        L.append('')
    cols = [s for s in servers if ref_name(s) and ref_name(s) != s and ref_name(s) in servers]
    if not cols:
        return L
    head = ['workload', 'dataset', 'N', 'server']
    head += list(dict.fromkeys(conds)) + ['holds across']
    L.append('| ' + ' | '.join(head) + ' |')
    L.append('|' + '---|' * len(head))
    for (w, d, c) in keys:
        mm, higher = metric_of[w]
        for s in cols:
            rn = ref_name(s)
            cells, meds = [], []
            for cond in dict.fromkeys(conds):
                rr = by_round([r for r in recs if r.get('condition') == cond])
                num, den = ((w, d, c, s), (w, d, c, rn)) if higher else ((w, d, c, rn), (w, d, c, s))
                v = paired_ratios(num, den, mm, rr)
                cells.append(ratio_cell(v))
                if v:
                    meds.append(med(v))
            across = ('%.2f–%.2f×' % (min(meds), max(meds))) if len(meds) == len(set(conds)) else '—'
            L.append('| %s | %s | %s | %s vs %s | %s | **%s** |' % (w, d, c, s, rn, ' | '.join(cells), across))
    L.append('')
    return L


def make_report(outdir, meta, bs):
    recs, variants = load_results(outdir)
    sched = meta.get('sched', False)
    servers = [s for s in meta['servers'] if s in variants]
    agg = aggregate(recs)
    rr = by_round(recs)
    keys = sorted({(r['workload'], r['dataset'], r['clients']) for r in recs},
                  key=lambda k: (WORKLOADS.index(k[0]), meta['datasets'].index(k[1]) if k[1] in meta['datasets'] else 0, k[2]))
    L = []
    L.append('# zodbd bench: %s\n' % meta['started'])
    L.append('Command: `%s`\n' % meta['command'])
    L.append('Rounds: %d, servers interleaved (order rotated each round). Medians (min–max, n = runs).' % meta['rounds'])
    L.append('Ratios are per round (server and reference in the same round), then median (min–max): '
             '"vs reference" = speed relative to the reference (>1: faster); "× floor" = how many times the '
             'bare ping-pong\'s time over the same transport (TCP, or a Unix socket for the -U servers; '
             '1 is the floor itself).\n')
    L.append('## Machine\n')
    L.append('```')
    for k, v in meta['env'].items():
        L.append('%s: %s' % (k, v))
    for k in ('busy-after', 'steal-during', 'duration'):
        if k in meta:
            L.append('%s: %s' % (k, meta[k]))
    L.append('```\n')
    others = [r['others_cpu'] for r in recs if 'others_cpu' in r]
    if others:
        # the busy condition's neighbours are other processes by design:
        # only the quiet rounds say whether the machine was quiet
        per_run = sorted({(r['round'], r['dataset'], r['server']): r['others_cpu'] for r in recs
                          if 'others_cpu' in r and r.get('condition', 'quiet') == 'quiet'}.values()) or [0.0]
        L.append('Noise: CPU used by other processes during the runs (the machine\'s busy time less the '
                 'harness\'s, servers\' and clients\'): median %.0f%%, max %.0f%% of all CPUs over %d runs; '
                 'steal max %.1f%%.\n' % (med(per_run), max(per_run), len(per_run),
                                           max(r.get('steal', 0) for r in recs)))
        if max(per_run) >= 10:
            meta.setdefault('warnings', []).append(
                'other processes used up to %.0f%% of the CPUs during the runs (median %.0f%%)' % (
                    max(per_run), med(per_run)))
    if meta.get('warnings'):
        L.append('**The machine was not quiet** (results are noisier than they should be):\n')
        L.extend('- ' + w for w in meta['warnings'])
        L.append('')
    if meta.get('failures'):
        L.append('**Failed** (these figures are missing):\n')
        L.extend('- ' + f for f in meta['failures'])
        L.append('')
    if meta.get('notes'):
        L.append('Skipped:\n')
        L.extend('- ' + n for n in meta['notes'])
        L.append('')
    errs = [(r['server'], r['workload'], r['dataset'], r['clients'], r['metrics'].get('errors'),
             r['metrics'].get('error-sample', '')) for r in recs if r['metrics'].get('errors')]
    if errs:
        L.append('**Client-side errors** (tracebacks logged by the stock ZEO client; the server broke '
                 'a protocol rule the client checks — see logs/):\n')
        seen = {}
        for s, w, d, c, n, ex in errs:
            k = (s, w, d, c)
            seen.setdefault(k, [0, ex])
            seen[k][0] += n
        for (s, w, d, c), (n, ex) in seen.items():
            L.append('- %s, %s c=%s on %s: %d errors over all rounds, e.g. `%s`' % (s, w, c, d, n, ex))
        L.append('')
    ref_name = (lambda s: baseline_of(s, variants, sched, servers))
    # Summary: every server's speed relative to its reference and its time
    # relative to the floor, one row per workload point.
    metric_of = {'hash': ('ns/op', False), 'pyload': ('ns/op', False), 'wrk': ('ops/s', True),
                 'commit': ('commits/s', True), 'gocommit': ('commits/s', True)}
    vs_cols = [s for s in servers if ref_name(s) and ref_name(s) != s and ref_name(s) in servers]
    fl_cols = [s for s in servers if s != floor_of(s) and floor_of(s) in servers]
    if vs_cols or fl_cols:
        L.append('## Summary\n')
        L.append('Speed relative to the reference (>1: faster), paired by round, median (min–max); '
                 'then time relative to the bare floor over the same transport (1: as fast as a ping-pong).\n')
        head = ['workload', 'dataset', 'N'] + ['%s vs %s' % (s, ref_name(s)) for s in vs_cols] + \
            ['%s × floor' % s for s in fl_cols]
        L.append('| ' + ' | '.join(head) + ' |')
        L.append('|' + '---|' * len(head))
        for (w, d, c) in keys:
            mm, higher = metric_of[w]
            row = [w, d, str(c)]
            for s in vs_cols:
                rn = ref_name(s)
                num, den = ((w, d, c, s), (w, d, c, rn)) if higher else ((w, d, c, rn), (w, d, c, s))
                cell = ratio_cell(paired_ratios(num, den, mm, rr))
                row.append('**%s**' % cell if cell != '—' else cell)
            for s in fl_cols:
                fl = floor_of(s)
                num, den = ((w, d, c, fl), (w, d, c, s)) if higher else ((w, d, c, s), (w, d, c, fl))
                row.append(ratio_cell(paired_ratios(num, den, mm, rr)))
            L.append('| ' + ' | '.join(row) + ' |')
        L.append('')
    L.extend(condition_section(meta, recs, servers, keys, ref_name, metric_of))
    for w in WORKLOADS:
        wkeys = [k for k in keys if k[0] == w]
        if not wkeys:
            continue
        L.append('## %s\n' % w)
        L.append(WORKLOAD_DOC[w] + '\n')
        main, label, f = {'hash': ('ns/op', 'time/object', fmt_ns), 'pyload': ('ns/op', 'time/object', fmt_ns),
                          'wrk': ('ops/s', 'loads/s', fmt_num), 'commit': ('commits/s', 'commits/s', fmt_num),
                          'gocommit': ('commits/s', 'commits/s', fmt_num)}[w]
        higher = main.endswith('/s')
        extra = [m for m in ('p50-ns', 'p99-ns', 'srv-cpu-ns/op') if any(m in agg.get((w, d, c, s), {})
                                                                         for (_, d, c) in wkeys for s in servers)]
        head = ['dataset', 'N' if w in ('wrk',) + COMMIT_WORKLOADS else 'objects', 'server', label + ' median (min–max)',
                'n', 'vs reference', '× floor'] + [EXTRA_HEAD.get(m, m[:3]) for m in extra]
        L.append('| ' + ' | '.join(head) + ' |')
        L.append('|' + '---|' * len(head))
        for (_, d, c) in wkeys:
            for s in servers:
                a = agg.get((w, d, c, s))
                if not a or main not in a:
                    continue
                v = a[main]
                cell = '%s (%s–%s)' % (f(med(v)), f(min(v)), f(max(v))) if len(v) > 1 else f(v[0])
                rn = ref_name(s)
                vr = vf = ''
                if rn and rn != s and (w, d, c, rn) in agg:
                    num, den = ((w, d, c, s), (w, d, c, rn)) if higher else ((w, d, c, rn), (w, d, c, s))
                    vr = '%s vs %s' % (ratio_cell(paired_ratios(num, den, main, rr)), rn)
                fl = floor_of(s)
                if s != fl and (w, d, c, fl) in agg:
                    num, den = ((w, d, c, fl), (w, d, c, s)) if higher else ((w, d, c, s), (w, d, c, fl))
                    vf = ratio_cell(paired_ratios(num, den, main, rr))
                elif s == fl:
                    vf = '1'
                n_obj = str(c) if w in ('wrk',) + COMMIT_WORKLOADS else '%d' % med(a.get('objects', [0]))
                row = [d, n_obj, s, cell, str(len(v)), vr, vf] + \
                    [fmt_ns(med(a[m])) if a.get(m) else '—' for m in extra]
                L.append('| ' + ' | '.join(row) + ' |')
        L.append('')
    if bs:
        L.append('## benchstat\n')
        L.append('`benchstat` (%s) of every server against its reference, from raw/*.txt; see benchstat.txt.\n' % BENCHSTAT.split('@')[1])
    L.append('## Files\n')
    L.append('- raw/*.txt: one Go benchmark file per run (server × dataset × round), environment in the header')
    L.append('- raw/*.json: the same runs with latency histograms; logs/: server and client logs')
    L.append('- benchstat.txt, summary.json, plots/*.png and *.svg')
    text = '\n'.join(L) + '\n'
    with open(os.path.join(outdir, 'report.md'), 'w') as f:
        f.write(text)
    summary = {'meta': meta, 'aggregate': [
        {'workload': k[0], 'dataset': k[1], 'clients': k[2], 'server': k[3],
         **{m: {'median': med(v), 'min': min(v), 'max': max(v), 'n': len(v)}
            for m, v in d.items() if not m.startswith('_')}} for k, d in agg.items()]}
    with open(os.path.join(outdir, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=1)
    return text


def run_benchstat(bs, outdir, meta, variants):
    raw = os.path.join(outdir, 'raw')
    files = sorted(os.path.join(raw, f) for f in os.listdir(raw) if f.endswith('.txt'))
    groups = []
    names = [s for s in meta['servers'] if s in variants]
    if meta.get('sched'):
        zs = [n for n in names if variants[n]['impl'] != 'floor']
        groups.append(('scheduling variants of zodbd-Z, against %s' % zs[0], zs))
        fl = [n for n in names if variants[n]['impl'] == 'floor']
        if len(fl) > 1:
            groups.append(('the bare TCP floor, bound against unbound', fl))
    else:
        for marshal, ref in BASELINE.items():
            for ref in (ref, ref + '-U'):  # over TCP, over a Unix socket
                u = unix_socket(ref)
                cols = [ref] + [s for s in names if s != ref and unix_socket(s) == u and
                                variants[s]['marshal'] in (marshal, 'neo')] + \
                    ([floor_of(ref)] if floor_of(ref) in names else [])
                if ref in names and len(cols) > 1:
                    groups.append(('%s: every server against %s' % (marshal, ref), cols))
    out = []
    for title, cols in groups:
        p = subprocess.run([bs, '-col', 'server@(%s)' % ' '.join(cols),
                            '-ignore', 'run,server-cmd,impl,marshal,dataset,commit,loadavg,busy-before,others-cpu,steal',
                            '-table', ''] + files, capture_output=True, text=True)
        out.append('### %s\n\n%s%s' % (title, p.stdout, p.stderr))
    text = '\n'.join(out)
    with open(os.path.join(outdir, 'benchstat.txt'), 'w') as f:
        f.write(text)
    return text


def finish(outdir, bs, no_plots):
    with open(os.path.join(outdir, 'meta.json')) as f:
        meta = json.load(f)
    recs, variants = load_results(outdir)
    if not recs:
        die('no results in %s' % outdir)
    bstext = run_benchstat(bs, outdir, meta, variants) if bs else ''
    text = make_report(outdir, meta, bs)
    if not no_plots:
        try:
            import plots
        except ImportError as e:
            log('plots skipped: %s (make bench installs requirements-bench.txt)' % e)
        else:
            made = plots.make_all(outdir, meta, recs, variants)
            log('plots: %s' % ', '.join(os.path.relpath(p, outdir) for p in made))
    return text, bstext


# ---------------------------------------------------------------- main

def wait_quiet(seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        busy, pct, steal = machine.busy_processes(2.0, exclude={os.getpid()})
        load1 = os.getloadavg()[0]
        if pct < 10 and load1 < 0.25 * len(machine.online_cpus()):
            return True
        log('waiting for a quiet machine: %.0f%% busy, load %.2f' % (pct, load1))
    return False


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.report:
        _, bs = build_tools(a) if not a.no_benchstat else (None, None)
        text, bstext = finish(a.report, bs, a.no_plots)
        print(text)
        return 0
    if not os.access(a.zodbd, os.X_OK):
        die('no zodbd at %s (make build)' % a.zodbd)
    started = datetime.datetime.now()
    outdir = a.out or os.path.join(REPO, 'data', 'bench', started.strftime('%Y%m%d-%H%M%S'))
    os.makedirs(outdir, exist_ok=True)
    if a.wait_quiet:
        wait_quiet(a.wait_quiet)
    env, warnings = machine.describe(REPO, outdir)
    log('== machine')
    for k, v in env.items():
        log('  %-15s %s' % (k + ':', v))
    for w in warnings:
        log('  WARNING: ' + w)

    pingpong, bs = build_tools(a)
    caps = capabilities(a)
    variants, notes = server_variants(a, caps)
    workloads = csv(a.workloads)
    floor_only = set()
    for w in workloads:
        if w not in WORKLOADS:
            die('unknown workload %s' % w)
    if 'hash' in workloads and not caps['hash-url']:
        workloads.remove('hash')
        notes.append('hash workload skipped: this `zodbd hash` takes no zeo:// URL yet (`zodbd hash -h`)')
    if 'wrk' in workloads and not caps['wrk']:
        workloads.remove('wrk')
        notes.append('wrk workload skipped: this zodbd has no `wrk` command yet (`zodbd help`); '
                     'so no latency/throughput-vs-clients curves for the servers'
                     + (', only for the floor' if 'floor' in variants else ''))
        if 'floor' in variants:
            workloads.append('wrk')  # the floor's own curve still runs
            floor_only.add('wrk')
    for n in notes:
        log('note: ' + n)

    names = csv(a.datasets) or (SMALL_DATASETS + (['prod1-%d' % a.big] if a.big else []))
    if a.sched and not a.datasets:
        names = ['prod1-1024']
    log('== datasets')
    datasets = prepare_datasets(a, names)

    setup = Setup(a, pingpong, caps, variants)
    setup.floor_only = floor_only
    order = list(variants)
    meta = {'started': started.isoformat(timespec='seconds'), 'command': shlex.join(['bench/run.py'] + (sys.argv[1:] if argv is None else argv)),
            'rounds': a.rounds, 'servers': order, 'datasets': [d.name for d in datasets],
            'workloads': workloads, 'env': env, 'warnings': warnings, 'notes': notes, 'sched': a.sched,
            'pin': bool(a.pin), 'server_cpus': machine.format_cpulist(setup.srv_cpus or []),
            'load_cpus': machine.format_cpulist(setup.load_cpus or [])}
    with open(os.path.join(outdir, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=1)

    tuner = machine.Tuner(machine.online_cpus(), log) if a.tune else None

    def on_signal(sig, frame):
        raise SystemExit('bench: signal %d: stopping (servers stopped, tuning restored)' % sig)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)

    t_start, cpu0 = time.monotonic(), machine.cpu_times()
    failed = None
    try:
        if tuner and tuner.apply() and tuner.saved:
            with open(os.path.join(outdir, 'tune-restore.sh'), 'w') as f:
                f.write('#!/bin/sh\n# undoes bench/run.py --tune, if it was killed before restoring\n'
                        + tuner.restore_script())
            log('--tune: if this run is killed, %s/tune-restore.sh undoes it' % outdir)
        checked = set()
        conditions = csv(a.conditions)
        meta['conditions'] = conditions
        meta['round_state'] = {}
        for rnd in range(1, a.rounds + 1):
            cond = conditions[(rnd - 1) % len(conditions)]
            setup.condition = cond
            log('== round %d/%d (%s)' % (rnd, a.rounds, cond))
            k = (rnd - 1) % len(order)
            rot = order[k:] + order[:k]
            st = {'condition': cond, 'loadavg-before': round(os.getloadavg()[0], 2)}
            idle0, cpu_r0, t_r0 = machine.idle_residency(), machine.cpu_times(), time.monotonic()
            with machine.BusyNeighbour(a.neighbours if cond == 'busy' else 0) as nb:
                for ds in datasets:
                    for name in rot:
                        session(setup, name, variants[name], ds, rnd, outdir, workloads, env, checked)
            st['neighbour-cpu-s'] = round(nb.cpu_s, 2)
            idle1, cpu_r1, wall = machine.idle_residency(), machine.cpu_times(), time.monotonic() - t_r0
            st['loadavg-after'] = round(os.getloadavg()[0], 2)
            st['idle-%'] = round(100.0 * (cpu_r1[1] - cpu_r0[1]) / max(1, cpu_r1[0] - cpu_r0[0]), 1)
            # share of the round's wall time (all CPUs) spent in each idle state
            ncpu = len(machine.online_cpus())
            st['idle-states-%'] = {n: round((idle1[n] - idle0.get(n, 0)) / 1e4 / (wall * ncpu), 1)
                                   for n in idle1}
            meta['round_state'][str(rnd)] = st
            log('   round %d: %s, load %.2f -> %.2f, CPUs idle %.0f%%%s' % (
                rnd, cond, st['loadavg-before'], st['loadavg-after'], st['idle-%'],
                ', idle states ' + ' '.join('%s %.0f%%' % kv for kv in st['idle-states-%'].items())
                if st['idle-states-%'] else ''))
    except (Exception, SystemExit, KeyboardInterrupt) as e:
        failed = e
    finally:
        for srv in list(LIVE):
            srv.stop()
        if tuner:
            tuner.restore()
        shutil.rmtree(os.path.join(outdir, 'work'), ignore_errors=True)
    cpu1 = machine.cpu_times()
    meta['failures'] = FAILURES
    meta['duration'] = '%.0f s' % (time.monotonic() - t_start)
    meta['steal-during'] = '%.1f%%' % (100.0 * (cpu1[2] - cpu0[2]) / max(1, cpu1[0] - cpu0[0]))
    meta['busy-after'] = 'loadavg %.2f' % os.getloadavg()[0]
    with open(os.path.join(outdir, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=1)
    if failed is not None:
        if isinstance(failed, KeyboardInterrupt):
            log('bench: interrupted')
        elif isinstance(failed, SystemExit):
            log(str(failed.code))
        else:
            log('bench: FAILED: %s' % failed)
        if not os.path.isdir(os.path.join(outdir, 'raw')):
            return 1
        log('bench: partial results follow')
    text, bstext = finish(outdir, bs, a.no_plots)
    print()
    print(text)
    if bstext:
        print(bstext)
    log('results: %s' % os.path.relpath(outdir, os.getcwd()))
    if FAILURES:
        log('bench: %d workload runs FAILED (listed in the report)' % len(FAILURES))
    return 1 if failed is not None or FAILURES else 0


if __name__ == '__main__':
    sys.exit(main())
