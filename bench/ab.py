"""Two builds of zodbd side by side (before/after a change), paired: each
round starts build A's server then build B's on fresh copies of the same
file and measures both with the same client (B's `zodbd wrk`), so that the
machine's drift hits both alike; the order alternates from round to round.

    ab.py --a OLD_BIN --b NEW_BIN [--rounds N] [-d S] DATA.fs
    ab.py --a OLD_BIN --b NEW_BIN --runzeo --loads-only [--clients 1,16] DATA.fs
    ab.py --a OLD_BIN --b NEW_BIN --commits-only [--committers 1,16,64] DATA.fs

Workloads: ZEO (`serve`): loads with 1 and 16 connections, commits with 16
Go committers (--committers: other counts); NEO (`neo-storage --with-master`, so the binaries must be
test builds, `make build-test`): loads with 1 and 16 connections.
--loads-only keeps the ZEO loads (at --clients connections, each with
--inflight loads in flight) and drops the rest, --commits-only the ZEO
commits (the server's CPU per commit beside them); --runzeo adds ZEO's own server (`python -m ZEO.runzeo` of --python)
as a third server R, and --floor the bare TCP ping-pong (bench/pingpong)
as server F, rotated into the same rounds. --a-arg/--b-arg give one build
extra `zodbd serve` arguments: with the same binary as A and B, that
compares a setting (e.g. --b-arg=--gomaxprocs=1). --unix puts every ZEO
server (A, B, R and F) on a Unix socket instead of 127.0.0.1 (needs
--loads-only).

For every ZEO load point it records loads/s, p50 and p99 (wrk's
histogram), and the server's CPU per load: the user+system time of the
server process (/proc/PID/stat) across the `zodbd wrk` run, over the loads
it answered in that time (the measured ones plus wrk's first pass, which
loads every object once before the clock starts). That is the server's CPU
alone, whatever the clients (on the same machine) cost. Each round also
records the machine's state: load average before and after, and the share
of the CPUs that other processes used meanwhile (the machine's busy time
less this script's, its servers' and its clients'). With --perf (Linux
perf), the server's system calls and context switches per load too: counts,
which the machine's noise moves much less than times.

Prints one line per point, then per workload and metric the medians (and
ranges) of each server and the medians (and per-round values) of the
paired ratios B/A and, with --runzeo, A/R and B/R."""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import latency  # noqa: E402
import machine  # noqa: E402


def start(cmd, log, pattern, timeout=30, env=None):
    f = open(log, 'wb')
    p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, open(log, errors='replace').read())
        if m:
            return p, m.group(1)
        if p.poll() is not None:
            break
        time.sleep(0.05)
    p.kill()
    raise SystemExit('ab: %s did not start: %s' % (cmd, open(log, errors='replace').read()[-2000:]))


def start_runzeo(python, fs, log, sock=None, timeout=60):
    """runzeo on a free port of 127.0.0.1, or on the Unix socket sock;
    returns (process, addr) once it accepts connections."""
    if sock:
        addr = sock
    else:
        s = socket.socket()
        s.bind(('127.0.0.1', 0))
        addr = '127.0.0.1:%d' % s.getsockname()[1]
        s.close()
    env = dict(os.environ)
    env.pop('ZEO_MSGPACK', None)
    f = open(log, 'wb')
    p = subprocess.Popen([python, '-m', 'ZEO.runzeo', '-a', addr, '-f', fs],
                         stdout=f, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            break
        try:
            latency.connect(addr, timeout=1).close()
            return p, addr
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise SystemExit('ab: runzeo did not start: %s' % open(log, errors='replace').read()[-2000:])


def stop(p):
    p.terminate()
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


PERF_EVENTS = 'raw_syscalls:sys_enter,context-switches'


def perf_start(pid, out):
    return subprocess.Popen(['perf', 'stat', '-x', ',', '-e', PERF_EVENTS, '-p', str(pid), '-o', out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def perf_stop(p, out):
    """{event: count} of a perf stat started by perf_start."""
    p.send_signal(signal.SIGINT)
    p.wait(20)
    counts = {}
    for line in open(out):
        f = line.strip().split(',')
        if len(f) > 2 and f[0].replace('.', '').isdigit():
            counts[f[2]] = float(f[0])
    return counts


def wrk(a, cmd, *args, pid=None):
    """One load generator run (cmd + args: `zodbd wrk ... URL` or the
    floor's `pingpong load ... ADDR`); returns {metric: value}. With pid,
    the server's CPU per load in µs (see the module doc) and, with
    --perf, its system calls and context switches per load."""
    cpu0 = machine.proc_cpu_seconds(pid) if pid else None
    perf = perf_start(pid, a.perf_out) if pid and a.perf else None
    try:
        out = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=a.d * 4 + 120)
    finally:
        counts = perf_stop(perf, a.perf_out) if perf else {}
    cpu1 = machine.proc_cpu_seconds(pid) if pid else None
    if out.returncode != 0:
        raise SystemExit('ab: %s: %s' % (shlex.join(cmd + list(args)), out.stderr[-2000:]))
    j = json.loads(out.stdout.strip().splitlines()[-1])
    if j.get('errors'):
        raise SystemExit('ab: %s: %s wrong or failed answers' % (shlex.join(cmd + list(args)), j['errors']))
    r = {'ops/s': j['ops_per_s'],
         'p50 µs': j['latency_ns']['p50'] / 1e3,
         'p99 µs': j['latency_ns']['p99'] / 1e3}
    if cpu0 is not None and cpu1 is not None and '--commit' in args:
        r['srv µs/commit'] = (cpu1 - cpu0) * 1e6 / j['ops']
    elif cpu0 is not None and cpu1 is not None:
        loads = j['ops'] + j.get('objects', 0)
        r['srv µs/load'] = (cpu1 - cpu0) * 1e6 / loads
        for ev, name in (('raw_syscalls:sys_enter', 'srv syscalls/load'), ('context-switches', 'srv ctxsw/load')):
            if ev in counts:
                r[name] = counts[ev] / loads
    return r


def zwrk(a, url, *args, pid=None):
    return wrk(a, [a.b, 'wrk', '-d', '%gs' % a.d, '--json'], *args, url, pid=pid)


def fresh(data, fs):
    shutil.copyfile(data, fs)
    for ext in ('.index', '.lock', '.tmp'):
        if os.path.exists(fs + ext):
            os.remove(fs + ext)


def point(c, k):
    return 'zeo load c=%d' % c + (' inflight=%d' % k if k > 1 else '')


def zeo_points(a, url, pid):
    pts = {}
    if not a.commits_only:
        for c in a.clients:
            for k in a.inflight:
                pts[point(c, k)] = zwrk(a, url, '-c', str(c), '--inflight', str(k), pid=pid)
    if not a.loads_only:
        for c in a.committers:
            pts['zeo commit c=%d' % c] = zwrk(a, url, '--commit', '-c', str(c), pid=pid)
    return pts


def listen_addr(a, work):
    """Where a ZEO server of this run listens: 127.0.0.1:0 (any port), or
    with --unix a socket in its work directory."""
    return os.path.join(work, 'zeo.sock') if a.unix else '127.0.0.1:0'


def run_zodbd(a, binary, args, work, r):
    fs = os.path.join(work, 'Data.fs')
    fresh(a.data, fs)
    p, addr = start([binary, 'serve', '-a', listen_addr(a, work), '-f', fs, *args],
                    os.path.join(work, 'serve.log'), r'listening on (\S+)')
    try:
        pts = zeo_points(a, 'zeo://' + addr, p.pid)
    finally:
        stop(p)
    if a.loads_only or a.commits_only:
        return pts
    fresh(a.data, fs)
    port = 20000 + (os.getpid() + r * 7) % 20000
    p, _ = start([binary, 'neo-storage', '--cluster', 'ab', '--with-master', '127.0.0.1:%d' % port, fs],
                 os.path.join(work, 'neo.log'), r'(operational)')
    url = 'neo://ab@127.0.0.1:%d' % port
    try:
        pts['neo load c=1'] = zwrk(a, url, '-c', '1')
        pts['neo load c=16'] = zwrk(a, url, '-c', '16')
    finally:
        stop(p)
    return pts


def run_runzeo(a, work):
    fs = os.path.join(work, 'Data.fs')
    fresh(a.data, fs)
    p, addr = start_runzeo(a.python, fs, os.path.join(work, 'runzeo.log'),
                           sock=listen_addr(a, work) if a.unix else None)
    try:
        return zeo_points(a, 'zeo://' + addr, p.pid)
    finally:
        stop(p)


def run_floor(a, work):
    """The bare ping-pong (bench/pingpong; over a Unix socket with --unix):
    frames of the dataset's record sizes echoed by a goroutine per
    connection, with the ZEO load points' connections: what a round trip
    costs with no server work."""
    p, addr = start([a.floor, 'serve', '-a', listen_addr(a, work)], os.path.join(work, 'floor.log'), r'listening (\S+)')
    sizes = os.path.splitext(a.data)[0] + '.sizes'
    try:
        return {'zeo load c=%d' % c: wrk(a, [a.floor, 'load', '-d', '%gs' % a.d, '-sizes', sizes],
                                         '-c', str(c), addr, pid=p.pid) for c in a.clients}
    finally:
        stop(p)


def own_cpu():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def fmt(metric, v):
    if metric.endswith(('syscalls/load', 'ctxsw/load')):
        return '%.2f' % v
    return '%.0f' % v if metric == 'ops/s' or v >= 100 else '%.1f' % v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--a', required=True, help='build A (before)')
    ap.add_argument('--b', required=True, help='build B (after); its wrk is the client for all')
    ap.add_argument('--runzeo', action='store_true', help='add runzeo (server R) to every round')
    ap.add_argument('--python', default=os.path.join(HERE, '..', '.venv', 'bin', 'python'),
                    help='the Python with ZEO, for --runzeo (default: .venv)')
    ap.add_argument('--loads-only', action='store_true', help='only the ZEO load points')
    ap.add_argument('--commits-only', action='store_true', help='only the ZEO commit points')
    ap.add_argument('--committers', default='16', help='Go committers of the ZEO commit points (default 16)')
    ap.add_argument('--clients', default='1,16', help='connections of the ZEO load points (default 1,16)')
    ap.add_argument('--floor', metavar='PINGPONG',
                    help='add the bare TCP ping-pong (server F; `go build -o bin/pingpong ./bench/pingpong`)')
    ap.add_argument('--perf', action='store_true',
                    help="also count the server's system calls and context switches per load (perf stat)")
    ap.add_argument('--inflight', default='1',
                    help='loads in flight per connection of the ZEO load points (`zodbd wrk --inflight`): '
                    'a list, e.g. 1,4 (default 1; the floor only does 1)')
    ap.add_argument('--serve-arg', dest='serve_args', action='append', default=[],
                    help='an extra argument of `zodbd serve`, for both builds (repeatable)')
    ap.add_argument('--a-arg', dest='a_args', action='append', default=[],
                    help='an extra argument of `zodbd serve` for A only (repeatable): with --a = --b, '
                    'compares a setting')
    ap.add_argument('--b-arg', dest='b_args', action='append', default=[],
                    help='an extra argument of `zodbd serve` for B only (repeatable)')
    ap.add_argument('--unix', action='store_true',
                    help='every ZEO server on a Unix socket instead of 127.0.0.1 (with --loads-only)')
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('-d', type=float, default=2.0, help='seconds per point')
    ap.add_argument('data')
    a = ap.parse_args()
    a.clients = [int(x) for x in a.clients.split(',')]
    a.committers = [int(x) for x in a.committers.split(',')]
    if a.loads_only and a.commits_only:
        ap.error('--loads-only and --commits-only exclude each other')
    if a.commits_only and (a.runzeo or a.floor):
        ap.error('--commits-only compares two zodbd builds (no --runzeo, --floor)')
    a.inflight = [int(x) for x in a.inflight.split(',')]
    if a.floor and not a.loads_only:
        ap.error('--floor needs --loads-only')
    if a.unix and not a.loads_only:
        ap.error('--unix needs --loads-only')
    a.perf_out = os.path.join(tempfile.gettempdir(), 'ab-perf-%d.txt' % os.getpid())
    servers = [('A', a.a), ('B', a.b)] + ([('R', None)] if a.runzeo else []) + ([('F', None)] if a.floor else [])
    ncpu = len(machine.online_cpus())
    res = {}
    print('# %s; %d CPUs; load average %s' % (time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()), ncpu,
                                              ' '.join(open('/proc/loadavg').read().split()[:3])), flush=True)
    for r in range(a.rounds):
        k = r % len(servers)
        order = servers[k:] + servers[:k]
        if r // len(servers) % 2:
            order.reverse()
        load0, t0, cpu0, own0 = os.getloadavg()[0], time.monotonic(), machine.cpu_times(), own_cpu()
        for name, binary in order:
            work = tempfile.mkdtemp(prefix='ab-')
            try:
                if name == 'R':
                    pts = run_runzeo(a, work)
                elif name == 'F':
                    pts = run_floor(a, work)
                else:
                    pts = run_zodbd(a, binary, a.serve_args + (a.a_args if name == 'A' else a.b_args), work, r)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            for wl, m in pts.items():
                for metric, v in m.items():
                    res.setdefault(wl, {}).setdefault(metric, {}).setdefault(name, []).append(v)
                print('round %d %s %-16s %s' % (r, name, wl, '  '.join(
                    '%s %s' % (metric, fmt(metric, v)) for metric, v in m.items())), flush=True)
        cpu1, own1, wall = machine.cpu_times(), own_cpu(), time.monotonic() - t0
        busy = ((cpu1[0] - cpu0[0]) - (cpu1[1] - cpu0[1]) - (cpu1[2] - cpu0[2])) / os.sysconf('SC_CLK_TCK')
        others = max(0.0, busy - (own1 - own0)) / (wall * ncpu) * 100
        print('round %d: order %s, load average %.2f -> %.2f, other processes used %.0f%% of the CPUs' % (
            r, ''.join(n for n, _ in order), load0, os.getloadavg()[0], others), flush=True)

    pairs = [('B', 'A')] + ([('A', 'R'), ('B', 'R')] if a.runzeo else []) + ([('B', 'F')] if a.floor else [])
    names = [n for n, _ in servers]
    print('\nmedian (min–max) of %d rounds; ratios are per round, paired, median first '
          '(>1: the first server higher)' % a.rounds)
    print('\n| workload | metric | %s | %s |' % (' | '.join(names), ' | '.join('%s/%s' % p for p in pairs)))
    print('|---|---|%s%s' % ('---:|' * len(names), '---|' * len(pairs)))
    for wl, metrics in res.items():
        for metric, v in metrics.items():
            cells = []
            for n in names:
                x = v.get(n)
                cells.append('%s (%s–%s)' % (fmt(metric, statistics.median(x)), fmt(metric, min(x)),
                                             fmt(metric, max(x))) if x else '')
            for p, q in pairs:
                if v.get(p) and v.get(q):
                    rs = [x / y for x, y in zip(v[p], v[q])]
                    cells.append('%.2f (%s)' % (statistics.median(rs), ' '.join('%.2f' % x for x in rs)))
                else:
                    cells.append('')
            print('| %s | %s | %s |' % (wl, metric, ' | '.join(cells)))


if __name__ == '__main__':
    main()
