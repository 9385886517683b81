"""The benchmark harness (`make bench`, bench/run.py) runs end to end in its
--quick form: zodbd serve and runzeo on the two small datasets, one round,
short workloads, the hashes through each server checked against ZODB/py's;
and --tune puts back every CPU setting it changed."""
import glob
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


@pytest.fixture(scope='module')
def quick_run(tmp_path_factory, zodbd_bin, zodbd_test_bin, dataset):
    for name in ('prod1-1024', 'wczblk1-8'):
        dataset(name)
    out = str(tmp_path_factory.mktemp('bench') / 'results')
    p = subprocess.run(
        [sys.executable, os.path.join(REPO, 'bench', 'run.py'), '--quick', '--no-benchstat', '--no-plots',
         '--servers', 'floor,zodbd-Z,runzeo-Z,zodbd-neo', '--committers', '2', '--clients', '2', '--zodbd', zodbd_bin,
         '--zodbd-test', zodbd_test_bin, '--out', out],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return out, p.stdout


def test_quick_run_results(quick_run):
    out, stdout = quick_run
    raw = sorted(glob.glob(os.path.join(out, 'raw', '*.txt')))
    # one file per run: 4 servers x 2 datasets x 1 round
    assert len(raw) == 8, raw
    for name in ('prod1-1024', 'wczblk1-8'):
        for srv in ('zodbd-Z', 'runzeo-Z'):
            assert '%s: ' % name in stdout and 'through %s == ZODB/py reference' % srv in stdout
    with open(os.path.join(out, 'raw', '01-prod1-1024-zodbd-Z.txt')) as f:
        text = f.read()
    for key in ('cpu:', 'commit:', 'governor:', 'cstates:', 'loadavg:', 'server: zodbd-Z'):
        assert key in text, key
    assert 'BenchmarkPyLoad/ds=prod1-1024 ' in text
    assert 'BenchmarkCommit/ds=prod1-1024/c=2 ' in text
    assert 'BenchmarkGoCommit/ds=prod1-1024/c=2 ' in text
    if 'hash workload skipped' not in stdout:  # zodbd hash zeo://...: checksum checked
        assert 'BenchmarkHash/ds=prod1-1024 ' in text
    if 'wrk workload skipped' not in stdout:
        assert 'BenchmarkWrk/ds=prod1-1024/c=2 ' in text
    # The NEO node: hash (checksum checked against the reference) and wrk
    # through neo://.
    with open(os.path.join(out, 'raw', '01-wczblk1-8-zodbd-neo.txt')) as f:
        text = f.read()
    assert 'BenchmarkHash/ds=wczblk1-8 ' in text
    assert 'BenchmarkWrk/ds=wczblk1-8/c=2 ' in text
    report = open(os.path.join(out, 'report.md')).read()
    assert 'vs runzeo-Z' in report and '× floor' in report and '## Summary' in report
    summary = json.load(open(os.path.join(out, 'summary.json')))
    got = {(a['workload'], a['server']) for a in summary['aggregate']}
    assert ('pyload', 'zodbd-Z') in got and ('pyload', 'runzeo-Z') in got and ('pyload', 'floor') in got
    assert ('commit', 'zodbd-Z') in got and ('commit', 'runzeo-Z') in got
    assert ('gocommit', 'zodbd-Z') in got and ('gocommit', 'runzeo-Z') in got
    # every server was stopped
    for log in glob.glob(os.path.join(out, 'logs', '*.server.log')):
        assert 'Traceback' not in open(log, errors='replace').read(), log


def test_quiet_and_busy_rounds(tmp_path, zodbd_bin, dataset):
    """Rounds alternate between a quiet machine and one with a busy-loop
    neighbour; the report gives the machine's state per round, the floor per
    condition, and each ratio per condition with the range across them; the
    wrk figures carry the server's CPU per load."""
    dataset('prod1-1024')
    out = str(tmp_path / 'results')
    p = subprocess.run(
        [sys.executable, os.path.join(REPO, 'bench', 'run.py'), '--quick', '--no-benchstat', '--no-plots',
         '--servers', 'floor,zodbd-Z,runzeo-Z', '--datasets', 'prod1-1024', '--workloads', 'wrk',
         '--clients', '1', '--rounds', '2', '--conditions', 'quiet,busy', '--zodbd', zodbd_bin,
         '--out', out],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    meta = json.load(open(os.path.join(out, 'meta.json')))
    assert [meta['round_state'][r]['condition'] for r in ('1', '2')] == ['quiet', 'busy']
    # the neighbour ran during round 2 only (its CPU time, not the CPUs'
    # idle share: on a machine busy with other work both rounds are ~0% idle)
    st = meta['round_state']
    assert st['1']['neighbour-cpu-s'] == 0 and st['2']['neighbour-cpu-s'] > 0.1, st
    assert 'idle-%' in st['1'] and 'idle-%' in st['2'], st
    report = open(os.path.join(out, 'report.md')).read()
    assert '## Rounds: machine state' in report and '## Quiet and busy' in report
    assert '| wrk | prod1-1024 | 1 | zodbd-Z vs runzeo-Z |' in report and 'holds across' in report
    assert 'server CPU/load' in report
    recs = []
    for fn in glob.glob(os.path.join(out, 'raw', '*.json')):
        recs += json.load(open(fn))['records']
    cpu = [r['metrics']['srv-cpu-ns/op'] for r in recs if r['server'] == 'zodbd-Z']
    assert len(cpu) == 2 and all(500 < x < 1e7 for x in cpu), cpu
    assert {r['condition'] for r in recs} == {'quiet', 'busy'}


def test_unix_socket_servers(tmp_path, zodbd_bin, dataset):
    """The -U servers listen on a Unix socket: zodbd and runzeo answer the
    stock client (hash checked) and every workload through it, and each is
    compared with the other and with the floor over the same socket type."""
    dataset('prod1-1024')
    out = str(tmp_path / 'results')
    p = subprocess.run(
        [sys.executable, os.path.join(REPO, 'bench', 'run.py'), '--quick', '--no-benchstat', '--no-plots',
         '--servers', 'floor,floor-U,zodbd-Z-U,runzeo-Z-U', '--datasets', 'prod1-1024',
         '--workloads', 'hash,pyload,wrk,commit', '--clients', '2', '--committers', '1',
         '--zodbd', zodbd_bin, '--out', out],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    for srv in ('zodbd-Z-U', 'runzeo-Z-U'):
        assert 'through %s == ZODB/py reference' % srv in p.stdout, p.stdout[-3000:]
        cmd = open(os.path.join(out, 'raw', '01-prod1-1024-%s.txt' % srv)).read()
        assert 'zeo.sock' in cmd, cmd[:2000]
    report = open(os.path.join(out, 'report.md')).read()
    assert 'zodbd-Z-U vs runzeo-Z-U' in report and 'zodbd-Z-U × floor' in report
    summary = json.load(open(os.path.join(out, 'summary.json')))
    got = {(a['workload'], a['server']) for a in summary['aggregate']}
    for w in ('hash', 'pyload', 'wrk'):
        assert {(w, 'zodbd-Z-U'), (w, 'runzeo-Z-U'), (w, 'floor-U')} <= got, (w, got)
    assert ('commit', 'zodbd-Z-U') in got and ('commit', 'runzeo-Z-U') in got


def test_report_and_plots_redone(quick_run):
    pytest.importorskip('matplotlib')
    out, _ = quick_run
    p = subprocess.run([sys.executable, os.path.join(REPO, 'bench', 'run.py'), '--report', out,
                        '--no-benchstat'], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for name in ('bars_pyload', 'ratios', 'hist_pyload_prod1-1024'):
        for ext in ('png', 'svg'):
            assert os.path.getsize(os.path.join(out, 'plots', '%s.%s' % (name, ext))) > 1000


def test_parse_wrk_lenient():
    sys.path.insert(0, os.path.join(REPO, 'bench'))
    import run
    r, h = run.parse_wrk('{"ops_per_s": 1000, "latency_us": {"p50": 12.5, "p99": 40}, '
                         '"histogram_ns": [[1000, 1100, 5]]}')
    assert r['ops/s'] == 1000 and r['p50-ns'] == 12500 and r['p99-ns'] == 40000 and h == [[1000, 1100, 5]]
    r, _ = run.parse_wrk('warming up\n{"throughput": 5, "p50_ms": 1, "p99_ms": 2}\n')
    assert r == {'ops/s': 5.0, 'p50-ns': 1e6, 'p99-ns': 2e6}


def test_tune_restores(tmp_path, monkeypatch):
    """--tune on a fake /sys: governor to performance, states deeper than
    C1 disabled, and everything back as it was after restore()."""
    cpu = tmp_path / 'devices/system/cpu'
    files = {}
    for c in (0, 1):
        d = cpu / ('cpu%d' % c)
        files[d / 'cpufreq/scaling_governor'] = 'powersave'
        files[d / 'cpufreq/scaling_available_governors'] = 'performance powersave'
        for i, (name, lat, dis) in enumerate([('POLL', 0, 0), ('C1', 1, 0), ('C2', 80, 0), ('C3', 400, 1)]):
            files[d / ('cpuidle/state%d/name' % i)] = name
            files[d / ('cpuidle/state%d/latency' % i)] = str(lat)
            files[d / ('cpuidle/state%d/disable' % i)] = str(dis)
    for p, v in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(v + '\n')
    (cpu / 'online').write_text('0-1\n')
    monkeypatch.setenv('ZODBD_BENCH_SYSFS', str(tmp_path))
    sys.path.insert(0, os.path.join(REPO, 'bench'))
    import importlib
    import machine
    machine = importlib.reload(machine)
    try:
        t = machine.Tuner([0, 1], log=lambda *a: None)
        assert t.apply()
        for c in (0, 1):
            d = cpu / ('cpu%d' % c)
            assert (d / 'cpufreq/scaling_governor').read_text().strip() == 'performance'
            assert [(d / ('cpuidle/state%d/disable' % i)).read_text().strip() for i in range(4)] == \
                ['0', '0', '1', '1']
        assert 'powersave' in t.restore_script()
        t.restore()
        for p, v in files.items():
            assert p.read_text().strip() == v, p
    finally:
        monkeypatch.delenv('ZODBD_BENCH_SYSFS')
        importlib.reload(machine)
