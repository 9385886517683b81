"""zodbd's reference and space tools against ZODB/py's, paired.

    integrity.py [--rounds N] [--zodbd BIN] [--python PY] FILE...

For each FILE and round, runs `zodbd refs --dangling` and fsrefs, then
`zodbd analyze` and analyze.py, alternating which goes first, with the
file in the page cache (one untimed read first). Checks that the reports
are identical and prints the median wall time and MB/s of each, and the
ratio Python/zodbd."""
import argparse
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd):
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True)
    return time.monotonic() - t, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--rounds', type=int, default=5)
    ap.add_argument('--zodbd', default=os.path.join(REPO, 'bin', 'zodbd'))
    ap.add_argument('--python', default=os.path.join(REPO, '.venv', 'bin', 'python'))
    ap.add_argument('files', nargs='+')
    a = ap.parse_args()
    fsrefs = [a.python, '-c', 'import sys; from ZODB.scripts.fsrefs import main; main(sys.argv[1])']
    analyze = [a.python, '-m', 'ZODB.scripts.analyze']
    for f in a.files:
        mb = os.path.getsize(f) / 1e6
        with open(f, 'rb') as fh:
            while fh.read(1 << 20):
                pass
        for tool, ours, theirs in [('refs', [a.zodbd, 'refs', '--dangling'], fsrefs),
                                   ('analyze', [a.zodbd, 'analyze'], analyze)]:
            tg, tp = [], []
            for r in range(a.rounds):
                pair = [(ours, tg), (theirs, tp)]
                if r % 2:
                    pair.reverse()
                outs = []
                for cmd, acc in pair:
                    dt, out = timed(cmd + [f])
                    acc.append(dt)
                    outs.append(out)
                if outs[0] != outs[1]:
                    sys.exit('%s %s: the reports differ' % (tool, f))
            g, p = statistics.median(tg), statistics.median(tp)
            print('%-8s %-28s %7.1f MB  zodbd %6.3fs (%7.1f MB/s)  python %6.3fs (%6.1f MB/s)  %5.1fx' % (
                tool, os.path.basename(f), mb, g, mb / g, p, mb / p, p / g))


if __name__ == '__main__':
    main()
