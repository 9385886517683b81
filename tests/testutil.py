"""Helpers shared by the interop tests (not fixtures: see conftest.py)."""
import os
import signal
import subprocess
import sys
import threading
import time


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


def rss(pid, field='VmRSS'):
    """The process's field of /proc/PID/status, in bytes."""
    with open('/proc/%d/status' % pid) as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) * 1024
    raise AssertionError('no %s in /proc/%d/status' % (field, pid))


def reset_peak(pid):
    with open('/proc/%d/clear_refs' % pid, 'w') as f:
        f.write('5')


class Watchdog:
    """Kills pid (SIGKILL) when its RSS passes limit, until stopped."""

    def __init__(self, pid, limit):
        self.pid, self.limit = pid, limit
        self.killed_at = None
        self.peak_anon = 0  # the most RssAnon seen (not the file pages a process maps)
        self.done = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.done.wait(0.01):
            try:
                r = rss(self.pid)
                self.peak_anon = max(self.peak_anon, rss(self.pid, 'RssAnon'))
            except (OSError, AssertionError):
                return
            if r > self.limit:
                self.killed_at = r
                os.kill(self.pid, signal.SIGKILL)
                return

    def stop(self):
        self.done.set()
        self.t.join()


def signal_while_starting(argv, sig=signal.SIGTERM, what='starting', wait=5):
    """Start argv, a server whose start cannot finish (its storage's open
    blocks: a FIFO where it reads), send it sig after 1 s, and return its
    exit status; fail the test if it is still running wait seconds later
    (then kill it)."""
    import pytest
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        assert p.poll() is None, 'exited before the signal: %s' % p.returncode
        p.send_signal(sig)
        try:
            return p.wait(wait)
        except subprocess.TimeoutExpired:
            pytest.fail('still running %d s after %s (%s)' % (wait, sig.name, what))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
