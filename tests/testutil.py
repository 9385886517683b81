"""Helpers shared by the interop tests (not fixtures: see conftest.py)."""
import subprocess
import sys


def zodbd(zodbd_bin, *args, check=True):
    """Run zodbd; with check, assert it exits 0 (showing its output)."""
    p = subprocess.run([zodbd_bin, *map(str, args)], capture_output=True,
                       text=True)
    if check:
        assert p.returncode == 0, (
            'zodbd %s: exit %d\nstdout: %s\nstderr: %s'
            % (' '.join(map(str, args)), p.returncode, p.stdout, p.stderr))
    return p


def fstest(path):
    """Assert that ZODB/py's fstest accepts path silently."""
    p = subprocess.run([sys.executable, '-m', 'ZODB.scripts.fstest', path],
                       capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == '' and p.stderr == '', (
        'fstest %s: exit %d\n%s%s' % (path, p.returncode, p.stdout, p.stderr))


def read(path):
    with open(path, 'rb') as f:
        return f.read()
