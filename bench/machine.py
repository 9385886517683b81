"""What bench/run.py records about the machine, how it judges whether the
machine is quiet, how it splits the CPUs between server and load
generator (--pin), and how it tunes CPU frequency and idle states (--tune)
and puts them back.

Everything is read from /proc and /sys; $ZODBD_BENCH_SYSFS replaces /sys
(the tests point it at a fake tree to check that --tune restores what it
changed).
"""
import os
import platform
import re
import shutil
import subprocess
import sys
import time

SYSFS = os.environ.get('ZODBD_BENCH_SYSFS', '/sys')
CPU_DIR = os.path.join(SYSFS, 'devices/system/cpu')


def read(path, default=None):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def parse_cpulist(s):
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]"""
    cpus = []
    for part in (s or '').split(','):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition('-')
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(cpus))


def format_cpulist(cpus):
    cpus = sorted(set(cpus))
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else '%d-%d' % (cpus[i], cpus[j]))
        i = j + 1
    return ','.join(out)


def online_cpus():
    s = read(os.path.join(CPU_DIR, 'online'))
    if s:
        return parse_cpulist(s)
    return sorted(os.sched_getaffinity(0))


def sibling_groups(cpus):
    """The online CPUs grouped by physical core (SMT siblings together)."""
    groups, seen = [], set()
    for c in cpus:
        if c in seen:
            continue
        sib = read(os.path.join(CPU_DIR, 'cpu%d/topology/thread_siblings_list' % c))
        g = [x for x in parse_cpulist(sib) if x in cpus] if sib else [c]
        if c not in g:
            g = [c]
        seen.update(g)
        groups.append(g)
    return groups


def split_cpus(cpus=None):
    """Server and load-generator CPU sets for --pin: whole physical cores
    (SMT siblings stay on the same side), half each, the server's first.
    Returns (server, load, note)."""
    cpus = cpus or online_cpus()
    groups = sibling_groups(cpus)
    if len(groups) >= 2:
        half = len(groups) // 2
        srv = [c for g in groups[:half] for c in g]
        load = [c for g in groups[half:] for c in g]
        return srv, load, ''
    if len(cpus) >= 2:  # one core with SMT: siblings cannot be kept apart
        return cpus[:len(cpus) // 2], cpus[len(cpus) // 2:], \
            'one physical core: server and load generator share it (SMT siblings)'
    return cpus, cpus, 'one CPU: nothing to pin apart'


def cpu_model():
    model = None
    flags = ''
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                k, _, v = line.partition(':')
                k = k.strip()
                if k == 'model name' and model is None:
                    model = v.strip()
                elif k == 'flags' and not flags:
                    flags = v
    except OSError:
        pass
    return model or platform.processor() or 'unknown', ' hypervisor ' in (' ' + flags + ' ')


def cstates(cpu):
    """[(name, exit latency µs, disabled)] of cpu's idle states, or []."""
    d = os.path.join(CPU_DIR, 'cpu%d/cpuidle' % cpu)
    out = []
    if not os.path.isdir(d):
        return out
    for st in sorted(os.listdir(d), key=lambda s: int(s[5:]) if s[5:].isdigit() else 0):
        if not st.startswith('state'):
            continue
        p = os.path.join(d, st)
        out.append((read(os.path.join(p, 'name'), st),
                    int(read(os.path.join(p, 'latency'), '0') or 0),
                    read(os.path.join(p, 'disable'), '0') == '1'))
    return out


def idle_residency():
    """{idle state name: µs spent in it, summed over the online CPUs} from
    cpuidle's counters, or {} where the kernel exposes none. The difference
    of two readings says how much of a round the CPUs spent in which state
    (a deep state costs a wake-up latency per request)."""
    out = {}
    for cpu in online_cpus():
        d = os.path.join(CPU_DIR, 'cpu%d/cpuidle' % cpu)
        if not os.path.isdir(d):
            continue
        for st in os.listdir(d):
            if not st.startswith('state'):
                continue
            t = read(os.path.join(d, st, 'time'))
            if t is None or not t.isdigit():
                continue
            name = read(os.path.join(d, st, 'name'), st)
            out[name] = out.get(name, 0) + int(t)
    return out


def proc_cpu_seconds(pid):
    """User + system CPU seconds of process pid and its waited-for
    children, from /proc/PID/stat; None if the process is gone."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            fields = f.read().rsplit(')', 1)[1].split()
    except OSError:
        return None
    # fields[0] is the state (field 3): utime..cstime are fields 14..17
    return sum(int(x) for x in fields[11:15]) / os.sysconf('SC_CLK_TCK')


class BusyNeighbour:
    """n processes that spin on a CPU each (unpinned) while the context is
    open: the "busy-loop neighbour" condition of bench/run.py, under which
    idle vCPUs are rarely idle, so wake-up latencies vanish from the round
    trips measured beside it."""

    def __init__(self, n=1):
        self.n, self.procs = n, []
        self.cpu_s = 0.0  # CPU seconds the neighbours got, known after the context


    def __enter__(self):
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, '-c', 'while True: pass'],
                                               start_new_session=True))
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            try:
                with open('/proc/%d/stat' % p.pid) as f:
                    fields = f.read().rsplit(')', 1)[1].split()
                self.cpu_s += (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')
            except (OSError, IndexError, ValueError):
                pass
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []
        return False


def boost_state():
    b = read(os.path.join(CPU_DIR, 'cpufreq/boost'))
    if b is not None:
        return 'on' if b == '1' else 'off'
    nt = read(os.path.join(CPU_DIR, 'intel_pstate/no_turbo'))
    if nt is not None:
        return 'off' if nt == '1' else 'on'
    return 'n/a (not exposed)'


def cpu_times():
    """(total, idle+iowait, steal) jiffies from /proc/stat."""
    with open('/proc/stat') as f:
        v = [int(x) for x in f.readline().split()[1:]]
    v += [0] * (8 - len(v))
    return sum(v[:8]), v[3] + v[4], v[7]


def proc_cpu():
    """{pid: (utime+stime jiffies, comm)} of every process."""
    out = {}
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % pid) as f:
                s = f.read()
        except OSError:
            continue
        rp = s.rfind(')')
        comm = s[s.find('(') + 1:rp]
        fields = s[rp + 2:].split()
        out[int(pid)] = (int(fields[11]) + int(fields[12]), comm)
    return out


def cmdline(pid):
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return f.read().replace(b'\0', b' ').decode(errors='replace').strip()
    except OSError:
        return ''


def busy_processes(interval=1.0, threshold=5.0, exclude=()):
    """Processes that used more than threshold % of one CPU over interval,
    and the machine's busy and steal % over it."""
    hz = os.sysconf('SC_CLK_TCK')
    a, ta = proc_cpu(), cpu_times()
    time.sleep(interval)
    b, tb = proc_cpu(), cpu_times()
    busy = []
    for pid, (t, comm) in b.items():
        if pid in exclude or pid not in a:
            continue
        pct = (t - a[pid][0]) / hz / interval * 100
        if pct >= threshold:
            busy.append((pct, pid, comm, cmdline(pid)[:100]))
    busy.sort(reverse=True)
    total = tb[0] - ta[0] or 1
    return busy, 100.0 * (1 - (tb[1] - ta[1]) / total), 100.0 * (tb[2] - ta[2]) / total


def run_out(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return ''


def git_commit(repo):
    c = run_out(['git', '-C', repo, 'rev-parse', '--short=12', 'HEAD']) or 'unknown'
    dirty = run_out(['git', '-C', repo, 'status', '--porcelain', '--untracked-files=no'])
    return c + ('+dirty' if dirty else '')


def pkg_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return 'n/a'


def describe(repo, data_dir, sample_s=1.0):
    """The environment as an ordered dict of 'key: value' header lines, and
    the warnings that say the machine is not quiet."""
    cpus = online_cpus()
    model, vm = cpu_model()
    groups = sibling_groups(cpus)
    env = {}
    env['goos'] = sys.platform
    env['goarch'] = {'x86_64': 'amd64', 'aarch64': 'arm64'}.get(platform.machine(), platform.machine())
    env['cpu'] = model
    env['pkg'] = 'github.com/zodbd/zodbd/bench'
    env['commit'] = git_commit(repo)
    env['kernel'] = platform.release()
    osr = read('/etc/os-release', '')
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)', osr, re.M)
    env['os'] = m.group(1) if m else platform.system()
    env['virtualized'] = 'yes (hypervisor flag)' if vm else 'no'
    env['cpus-online'] = format_cpulist(cpus)
    env['physical-cores'] = str(len(groups))
    env['smt-siblings'] = '; '.join(format_cpulist(g) for g in groups if len(g) > 1) or 'none'
    mem = read('/proc/meminfo', '')
    m = re.search(r'MemTotal:\s+(\d+)', mem)
    env['memory'] = '%.1f GiB' % (int(m.group(1)) / 2**20) if m else 'unknown'
    govs = sorted(set(filter(None, (read(os.path.join(CPU_DIR, 'cpu%d/cpufreq/scaling_governor' % c)) for c in cpus))))
    env['governor'] = ','.join(govs) or 'n/a (no cpufreq: fixed or host-controlled)'
    env['boost'] = boost_state()
    cs = cstates(cpus[0]) if cpus else []
    env['cstates'] = ', '.join('%s(%dus%s)' % (n, lat, ',off' if dis else '') for n, lat, dis in cs) \
        or 'n/a (no cpuidle: idle states are the host\'s)'
    env['loadavg'] = ' '.join((read('/proc/loadavg', '') or '').split()[:3])
    env['go'] = run_out(['go', 'env', 'GOVERSION']) or 'n/a'
    env['python'] = platform.python_version()
    env['zodb'] = pkg_version('ZODB')
    env['zeo'] = pkg_version('ZEO')
    env['fs'] = run_out(['stat', '-f', '-c', '%T', data_dir]) or 'unknown'

    busy, busy_pct, steal = busy_processes(sample_s, exclude={os.getpid()})
    env['busy-before'] = '%.0f%% of all CPUs (steal %.1f%%)' % (busy_pct, steal)
    warnings = []
    load1 = float(env['loadavg'].split()[0]) if env['loadavg'] else 0.0
    if load1 > 0.25 * len(cpus):
        warnings.append('load average %.2f on %d CPUs: other work is running' % (load1, len(cpus)))
    if busy_pct > 10:
        warnings.append('the CPUs were %.0f%% busy before the run' % busy_pct)
    if steal > 1:
        warnings.append('steal time %.1f%%: the hypervisor gives our CPUs to others' % steal)
    for pct, pid, comm, cl in busy[:8]:
        warnings.append('busy process: pid %d %s %.0f%% CPU: %s' % (pid, comm, pct, cl))
    if govs and govs != ['performance']:
        warnings.append('CPU frequency governor %s (not performance): latency moves with frequency; see --tune' % ','.join(govs))
    deep = [n for n, lat, dis in cs if lat > 10 and not dis]
    if deep:
        warnings.append('deep C-states enabled (%s): wake-up latency adds to round trips; see --tune' % ', '.join(deep))
    if len(cpus) <= 2:
        warnings.append('only %d CPUs: server and load generator compete for them; absolute numbers are low and noisy' % len(cpus))
    return env, warnings


class Tuner:
    """--tune: performance governor and idle states deeper than C1 disabled
    on the given CPUs; restore() puts back every value it changed. Needs
    root (it writes /sys, as cpupower does)."""

    def __init__(self, cpus, log=print):
        self.cpus = cpus
        self.saved = []  # (path, old value), in the order written
        self.log = log

    def _write(self, path, value):
        old = read(path)
        if old is None or old == value:
            return
        with open(path, 'w') as f:
            f.write(value)
        self.saved.append((path, old))

    def restore_script(self):
        return ''.join("echo '%s' > %s\n" % (old, path) for path, old in reversed(self.saved))

    def apply(self):
        if os.geteuid() != 0 and SYSFS == '/sys':
            self.log('--tune: not root; nothing changed')
            return False
        if shutil.which('cpupower') is None:
            self.log('--tune: cpupower not found; tuning through /sys directly')
        for c in self.cpus:
            base = os.path.join(CPU_DIR, 'cpu%d' % c)
            gov = os.path.join(base, 'cpufreq/scaling_governor')
            avail = read(os.path.join(base, 'cpufreq/scaling_available_governors'), '')
            if os.path.exists(gov) and 'performance' in avail.split():
                self._write(gov, 'performance')
            states = cstates(c)
            # The exit latency of C1 (the first state that is not POLL).
            c1 = next((lat for n, lat, d in states if n.upper() != 'POLL'), None)
            for i, (name, lat, dis) in enumerate(states):
                if c1 is not None and lat > c1:
                    self._write(os.path.join(base, 'cpuidle/state%d/disable' % i), '1')
        if self.saved:
            self.log('--tune: changed %d settings (restored after the run)' % len(self.saved))
        else:
            self.log('--tune: nothing to change (no cpufreq/cpuidle control here, or already tuned)')
        return True

    def restore(self):
        while self.saved:
            path, old = self.saved.pop()
            try:
                with open(path, 'w') as f:
                    f.write(old)
            except OSError as e:
                self.log('--tune: could not restore %s to %r: %s' % (path, old, e))
