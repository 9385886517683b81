"""Two builds of zodbd side by side (before/after a change), paired: each
round starts build A's server then build B's on fresh copies of the same
file and measures both with the same client (B's `zodbd wrk`), so that the
machine's drift hits both alike.

    ab.py --a OLD_BIN --b NEW_BIN [--rounds N] [-d S] DATA.fs

Workloads: ZEO (`serve`): loads with 1 and 16 connections, commits with 16
Go committers; NEO (`neo-storage --with-master`, so the binaries must be
test builds, `make build-test`): loads with 1 and 16 connections. Prints
one line per point and the medians of B/A per workload."""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time


def start(cmd, log, pattern, timeout=30):
    f = open(log, 'wb')
    p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
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


def stop(p):
    p.terminate()
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def wrk(client, url, d, *args):
    out = subprocess.run([client, 'wrk', '-d', '%gs' % d, '--json', *args, url],
                         capture_output=True, text=True, timeout=d * 4 + 120)
    if out.returncode != 0:
        raise SystemExit('ab: wrk %s %s: %s' % (args, url, out.stderr[-2000:]))
    return json.loads(out.stdout)['ops_per_s']


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--a', required=True, help='build A (before)')
    ap.add_argument('--b', required=True, help='build B (after); its wrk is the client for both')
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('-d', type=float, default=2.0, help='seconds per point')
    ap.add_argument('data')
    a = ap.parse_args()
    res = {}
    for r in range(a.rounds):
        order = [('A', a.a), ('B', a.b)] if r % 2 == 0 else [('B', a.b), ('A', a.a)]
        for name, binary in order:
            work = tempfile.mkdtemp(prefix='ab-')
            fs = os.path.join(work, 'Data.fs')
            shutil.copyfile(a.data, fs)
            p, addr = start([binary, 'serve', '-a', '127.0.0.1:0', '-f', fs], os.path.join(work, 'serve.log'),
                            r'listening on (\S+)')
            url = 'zeo://' + addr
            try:
                pts = {'zeo load c=1': wrk(a.b, url, a.d, '-c', '1'),
                       'zeo load c=16': wrk(a.b, url, a.d, '-c', '16'),
                       'zeo commit c=16': wrk(a.b, url, a.d, '--commit', '-c', '16')}
            finally:
                stop(p)
            shutil.copyfile(a.data, fs)
            for ext in ('.index', '.lock', '.tmp'):
                if os.path.exists(fs + ext):
                    os.remove(fs + ext)
            port = 20000 + (os.getpid() + r * 7) % 20000
            p, _ = start([binary, 'neo-storage', '--cluster', 'ab', '--with-master', '127.0.0.1:%d' % port, fs],
                         os.path.join(work, 'neo.log'), r'(operational)')
            url = 'neo://ab@127.0.0.1:%d' % port
            try:
                pts['neo load c=1'] = wrk(a.b, url, a.d, '-c', '1')
                pts['neo load c=16'] = wrk(a.b, url, a.d, '-c', '16')
            finally:
                stop(p)
            shutil.rmtree(work, ignore_errors=True)
            for k, v in pts.items():
                res.setdefault(k, {}).setdefault(name, []).append(v)
                print('round %d %s %-16s %10.0f ops/s' % (r, name, k, v), flush=True)
    print('\n| workload | A ops/s | B ops/s | B/A (median of rounds) | B/A per round |')
    print('|---|---:|---:|---:|---|')
    for k, v in res.items():
        ratios = [b / x for x, b in zip(v['A'], v['B'])]
        print('| %s | %.0f | %.0f | %.2f | %s |' % (k, statistics.median(v['A']), statistics.median(v['B']),
                                                   statistics.median(ratios), ' '.join('%.2f' % x for x in ratios)))


if __name__ == '__main__':
    main()
