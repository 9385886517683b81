"""Start and stop `zodbd serve` (or runzeo) processes for the ZEO tests."""
import os
import signal
import socket
import struct
import subprocess
import sys
import time

VENV_BIN = os.path.dirname(sys.executable)


_given_ports = set()


# Under pytest-xdist (make test runs the suite on two workers), worker K of
# N takes only the ports whose half is K modulo N (Linux's bind to port 0
# gives ports of one parity): a port one worker was given but does not
# listen on yet is never another's.
_WORKER = os.environ.get('PYTEST_XDIST_WORKER', '')
_WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT') or 1)
_MINE = int(_WORKER[2:]) % _WORKERS if _WORKER.startswith('gw') and _WORKERS > 1 else 0


def free_port():
    """A port free on 127.0.0.1 now, never one this process was given
    before: the kernel may hand a port just closed out again, so that two
    servers of one cluster, both not yet listening, got the same one."""
    for _ in range(100 * _WORKERS):
        s = socket.socket()
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
        s.close()
        if (port // 2) % _WORKERS == _MINE and port not in _given_ports:
            _given_ports.add(port)
            return port
    raise RuntimeError('no new free port in %d tries' % (100 * _WORKERS))


# ZEO framing on a raw socket, for the tests that speak the wire themselves.

def frame(payload):
    """payload as one ZEO frame: its length (4 bytes, big-endian), then it."""
    return struct.pack('>I', len(payload)) + payload


def send_frame(s, payload):
    s.sendall(frame(payload))


def recv_exact(s, n):
    """n bytes from s; EOFError when the peer closes first."""
    b = b''
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            raise EOFError
        b += chunk
    return b


def recv_frame(s):
    """One ZEO frame's payload from s; EOFError when the peer closes first."""
    n, = struct.unpack('>I', recv_exact(s, 4))
    return recv_exact(s, n)


def wait_listening(addr, proc, log, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError('server exited with %s:\n%s' % (proc.returncode, read(log)))
        try:
            if isinstance(addr, str):
                s = socket.socket(socket.AF_UNIX)
            else:
                s = socket.socket()
            s.connect(addr)
            s.close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError('server did not listen on %s in %ss:\n%s' % (addr, timeout, read(log)))


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ''


def runzeo_cmd():
    """The command that starts runzeo: the venv's script, else `python -m
    ZEO.runzeo` where ZEO was installed without scripts (pip --target); []
    where there is no ZEO."""
    script = os.path.join(VENV_BIN, 'runzeo')
    if os.path.exists(script):
        return [script]
    try:
        import ZEO.runzeo  # noqa: F401
    except ImportError:
        return []
    return [sys.executable, '-m', 'ZEO.runzeo']


# The log files of the servers started since the current test began:
# conftest.py shows their ends beside a test that fails.
STARTED_LOGS = []


class Server:
    """A server process on 127.0.0.1. kind is 'zodbd' or 'runzeo'.

    extra: more command-line arguments; conf: zeo.conf text (then path and
    extra are ignored except for the binary); preexec_fn: run in the child
    before the server starts (subprocess.Popen's)."""

    def __init__(self, zodbd_bin, path, tmpdir, kind='zodbd', msgpack=False,
                 extra=(), conf=None, port=None, preexec_fn=None):
        self.zodbd_bin = zodbd_bin
        self.path = path
        self.tmpdir = str(tmpdir)
        self.kind = kind
        self.msgpack = msgpack
        self.extra = list(extra)
        self.conf = conf
        self.port = port or free_port()
        self.addr = ('127.0.0.1', self.port)
        self.proc = None
        self.preexec_fn = preexec_fn
        self.log = os.path.join(self.tmpdir, 'server-%d.log' % self.port)

    def start(self):
        env = dict(os.environ)
        env.pop('ZEO_MSGPACK', None)
        if self.msgpack:
            env['ZEO_MSGPACK'] = '1'
        if self.conf is not None:
            cpath = os.path.join(self.tmpdir, 'zeo-%d.conf' % self.port)
            with open(cpath, 'w') as f:
                f.write(self.conf)
            args = ['-C', cpath]
        else:
            args = ['-f', self.path]
            if '-a' not in self.extra:  # an option given twice is refused (runzeo too)
                args = ['-a', '127.0.0.1:%d' % self.port] + args
        if self.kind == 'zodbd':
            cmd = [self.zodbd_bin, 'serve'] + args + self.extra
        else:
            cmd = runzeo_cmd() + args + self.extra
        with open(self.log, 'ab') as logf:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                         preexec_fn=self.preexec_fn)
        if self.log not in STARTED_LOGS:
            STARTED_LOGS.append(self.log)
        wait_listening(self.addr, self.proc, self.log)
        return self

    def stop(self, sig=signal.SIGTERM):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            deadline = time.time() + 20
            while True:
                try:
                    self.proc.wait(1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.time() > deadline:
                    if self.kind == 'zodbd':
                        # Go's runtime writes every goroutine's stack to
                        # the log, then exits 2: where the server hung.
                        self.proc.send_signal(signal.SIGQUIT)
                        try:
                            self.proc.wait(5)
                            break
                        except subprocess.TimeoutExpired:
                            pass
                    self.proc.kill()
                    self.proc.wait()
                    break
                if self.kind == 'runzeo':
                    self._wake()
        rc = self.proc.returncode
        self.proc = None
        return rc

    def _wake(self):
        """Connects to runzeo and hangs up, so that its main thread runs.

        CPython runs a signal's handler in the main thread only, between
        bytecodes: when the kernel hands SIGTERM to another of runzeo's
        threads, its main thread sleeps on in its event loop's poll, with
        no client and no timer to wake it, and runzeo's handler (which
        exits 0) waits for the next event. One connection is that event."""
        try:
            socket.create_connection(self.addr, timeout=1).close()
        except OSError:
            pass

    def output(self):
        return read(self.log)


def stock_client_commits(srv, key='hostile'):
    """A fresh stock client (ZEO.DB) of srv loads the root and adds one
    to root[key]; returns the new count."""
    import transaction
    import ZEO
    db = ZEO.DB(srv.addr, wait_timeout=10)
    try:
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        root = conn.root()
        root[key] = root.get(key, 0) + 1
        tm.commit()
        n = root[key]
        conn.close()
    finally:
        db.close()
    return n


def ssl_conf(port, path, testssl, read_only=True):
    """zeo.conf text of a server on 127.0.0.1:port serving path (read-only
    unless read_only is false) over TLS with ZEO's test certificates
    (ZEO.tests.testssl, passed as testssl): the server's, and the client's
    as the CA of clients."""
    return '''
<zeo>
  address 127.0.0.1:%d
  read-only %s
  <ssl>
    certificate %s
    key %s
    authenticate %s
  </ssl>
</zeo>
<filestorage 1>
  path %s
</filestorage>
''' % (port, 'true' if read_only else 'false', testssl.server_cert, testssl.server_key,
       testssl.client_cert, path)
