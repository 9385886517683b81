"""A one-storage NEO cluster for tests and benchmarks: NEO/py's master
(and, when asked, admin) with one storage node that is NEO/py's own
(`neopy`: neostorage on SQLite) or zodbd's (`zodbd-fs`: zodbd neo-storage
on a FileStorage; `zodbd-sqlite`: on a NEO/py SQLite database).

Plain Python (no pytest): it is also imported by scripts that run under
NEO/py's Python (tests/neo_mixins.py) and by bench/neo_commit.py. NEO/py
runs from its source tree (NEOPY_SRC) with a Python that has its
dependencies (NEOPY_PYTHON); see docs/neo.md."""
import os
import signal
import subprocess

from zeoserver import free_port, wait_listening

KINDS = ('neopy', 'zodbd-fs', 'zodbd-sqlite')


class Cluster:
    """NEO/py's master (-p PARTITIONS, default 1, -r 0, autostart with one storage), an optional
    admin, and one storage node of the given kind on a database in
    workdir (created empty unless it exists). start() returns once the
    storage's port is open; clients wait for the cluster to run."""

    def __init__(self, kind, workdir, src, python, zodbd=None, name='test', admin=False, zodbd_args=(),
                 partitions=1):
        if kind not in KINDS:
            raise ValueError('unknown storage kind %r' % kind)
        self.kind, self.dir, self.src, self.python = kind, workdir, src, python
        self.zodbd, self.name, self.want_admin = zodbd, name, admin
        self.zodbd_args = list(zodbd_args)
        self.partitions = partitions
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [src] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
        self.master = '127.0.0.1:%d' % free_port()
        self.admin = '127.0.0.1:%d' % free_port() if admin else None
        self.sport = free_port()
        self.mproc = self.sproc = self.aproc = None
        if kind == 'zodbd-fs':
            self.db = os.path.join(workdir, 'Data.fs')
        else:
            self.db = os.path.join(workdir, 'neo.sqlite')

    def _spawn(self, name, cmd):
        log = open(os.path.join(self.dir, name + '.log'), 'ab')
        return subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)

    def _wait(self, addr, proc, name):
        host, port = addr.rsplit(':', 1)
        wait_listening((host, int(port)), proc, os.path.join(self.dir, name + '.log'))

    def _neo(self, script):
        return [self.python, '-c', 'import neo.scripts.%s as m; m.main()' % script]

    def start(self):
        self.mproc = self._spawn('master', self._neo('neomaster') + [
            '-c', self.name, '-b', self.master, '-m', self.master, '-p', str(self.partitions), '-r', '0', '-A', '1'])
        self._wait(self.master, self.mproc, 'master')
        self.start_storage()
        if self.want_admin:
            self.aproc = self._spawn('admin', self._neo('neoadmin') + ['-c', self.name, '-b', self.admin,
                                                                      '-m', self.master])
            self._wait(self.admin, self.aproc, 'admin')
        return self

    def storage_cmd(self):
        bind = '127.0.0.1:%d' % self.sport
        if self.kind == 'neopy':
            return self._neo('neostorage') + ['-c', self.name, '-b', bind, '-m', self.master,
                                              '-a', 'SQLite', '-d', self.db]
        if self.kind == 'zodbd-fs' and not os.path.exists(self.db):
            open(self.db, 'wb').write(b'FS21')  # an empty FileStorage
        backend = self.db if self.kind == 'zodbd-fs' else 'sqlite:' + self.db
        return [self.zodbd, 'neo-storage', '--cluster', self.name, '--masters', self.master,
                '--bind', bind, '--read-write'] + self.zodbd_args + [backend]

    def start_storage(self):
        self.sproc = self._spawn('storage', self.storage_cmd())
        self._wait('127.0.0.1:%d' % self.sport, self.sproc, 'storage')

    def kill_storage(self, sig=signal.SIGKILL):
        if self.sproc is not None and self.sproc.poll() is None:
            self.sproc.send_signal(sig)
        if self.sproc is not None:
            self.sproc.wait(20)

    def ctl(self, *args):
        p = subprocess.run(self._neo('neoctl') + ['-a', self.admin] + list(args), env=self.env,
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError('neoctl %s: %s' % (' '.join(args), p.stdout + p.stderr))
        return p.stdout

    def stop(self):
        for p in (self.aproc, self.sproc, self.mproc):
            if p is not None and p.poll() is None:
                p.terminate()
        for p in (self.aproc, self.sproc, self.mproc):
            if p is None:
                continue
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def logs(self, tail=3000):
        out = []
        for name in ('master', 'storage', 'admin'):
            path = os.path.join(self.dir, name + '.log')
            if os.path.exists(path):
                with open(path, errors='replace') as f:
                    out.append('--- %s.log\n%s' % (name, f.read()[-tail:]))
        return '\n'.join(out)
