"""zodbd serve as a drop-in for runzeo: what an operator sees when moving a
zeo.conf and a command line over. Each case runs zodbd serve with the stock
client; where the reference's behaviour is the point and cheap to get, the
same case runs against runzeo (from the venv) too.

- <eventlog>: STDOUT/STDERR streams, levels (on <eventlog> and <logfile>),
  format and dateformat, several <logfile>s, runzeo's default, the keys
  zodbd cannot honour refused; ZEO's logger names and messages (new
  connection, disconnected with the client's label, transaction timeout).
- quota: FileStorageQuotaError, as ZODB/py's FileStorage raises it.
- a bare port listens on all interfaces.
- <zeo> read-only over a storage that is not: the storage is opened (and
  created) for writing, the server refuses writes.
- a busy port stops the server before it creates or locks any file.

Network: clients only ever connect to 127.0.0.1.
"""
import os
import re
import socket
import subprocess
import time

import pytest
from zeoserver import Server, free_port, read
from ZEO.ClientStorage import ClientStorage
from ZEO.Exceptions import ClientDisconnected, ServerException
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ReadOnlyError
from ZODB.utils import z64

RUNZEO = os.path.join(os.path.dirname(os.path.abspath(os.sys.executable)), 'runzeo')


def conf(port, storage, zeo='', eventlog=''):
    return '<zeo>\n  address %s\n%s\n</zeo>\n%s\n%s\n' % (port, zeo, storage, eventlog)


def fs_section(path, extra=''):
    return '<filestorage 1>\n  path %s\n%s\n</filestorage>' % (path, extra)


def wait_for(pred, what, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError('timed out waiting for ' + what)


def run_serve(zodbd_bin, args, cwd, timeout=30):
    """Run zodbd serve expecting it to exit by itself (a refused start)."""
    return subprocess.run([zodbd_bin, 'serve'] + args, cwd=str(cwd), capture_output=True,
                          text=True, timeout=timeout)


# --- <eventlog> ---

def test_eventlog_streams_levels_format(zodbd_bin, tmp_path, tmp_copy, monkeypatch):
    """Two <logfile>s: STDOUT with a format and no level of its own, a file
    at level error; the <eventlog> level (warning) drops INFO for both. No
    file named STDOUT is created (it used to be)."""
    monkeypatch.chdir(tmp_path)
    port = free_port()
    errlog = str(tmp_path / 'errors.log')
    eventlog = '''<eventlog>
  level warning
  <logfile>
    path STDOUT
    format %%(levelname)s|%%(name)s|%%(message)s
  </logfile>
  <logfile>
    path %s
    level error
    dateformat %%H:%%M
    format %%(asctime)s %%(levelname)s %%(message)s
  </logfile>
</eventlog>''' % errlog
    srv = Server(zodbd_bin, None, tmp_path, conf=conf('127.0.0.1:%d' % port, fs_section(tmp_copy('1.fs')),
                                                      zeo='read-only true', eventlog=eventlog), port=port).start()
    try:
        # A bad handshake is an ERROR of ZEO.asyncio.server; the
        # connections of wait_listening and of the client are INFO.
        s = socket.create_connection(('127.0.0.1', port))
        s.recv(100)
        s.sendall(b'\x00\x00\x00\x02XX')
        s.close()
        cs = ClientStorage(('127.0.0.1', port), read_only=True, wait_timeout=10)
        cs.load(z64)
        cs.close()
        wait_for(lambda: 'bad handshake' in srv.output(), 'the bad handshake in the log')
    finally:
        assert srv.stop() == 0
    out = srv.output()
    assert re.search(r'^ERROR\|ZEO\.asyncio\.server\|.*bad handshake', out, re.M), out
    assert 'INFO' not in out and 'listening on' not in out, out
    assert not os.path.exists(tmp_path / 'STDOUT')
    err = read(errlog)
    assert re.fullmatch(r'\d\d:\d\d ERROR .*bad handshake.*\n', err), err


@pytest.mark.parametrize('kind', ['zodbd', 'runzeo'])
def test_eventlog_default(zodbd_bin, tmp_path, tmp_copy, kind):
    """No <eventlog>: standard error, level INFO, ZConfig's default format
    ("------" then date, level, logger, message), as runzeo."""
    port = free_port()
    srv = Server(zodbd_bin, None, tmp_path, kind=kind,
                 conf=conf('127.0.0.1:%d' % port, fs_section(tmp_copy('1.fs'))), port=port).start()
    srv.stop()
    assert re.search(r'^------\n\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d INFO ZEO\.asyncio\.server listening on ',
                     srv.output(), re.M), srv.output()


def test_eventlog_connections(zodbd_bin, tmp_path, tmp_copy):
    """ZEO's lines for a client: the new connection (zeoserverlog's form)
    and its disconnection under ZEO.StorageServer, with the label the
    client gave (client_label)."""
    port = free_port()
    srv = Server(zodbd_bin, None, tmp_path, conf=conf('127.0.0.1:%d' % port, fs_section(tmp_copy('1.fs')),
                                                      zeo='read-only true'), port=port).start()
    try:
        cs = ClientStorage(('127.0.0.1', port), read_only=True, wait_timeout=10, client_label='worker-7')
        cs.load(z64)
        cs.close()
        wait_for(lambda: 'disconnected' in srv.output(), 'the disconnection in the log')
    finally:
        srv.stop()
    out = srv.output()
    assert re.search(r"INFO ZEO\.asyncio\.server new connection \('127\.0\.0\.1', \d+\): received handshake 'Z5'", out), out
    assert re.search(r"INFO ZEO\.StorageServer \(worker-7 127\.0\.0\.1:\d+\) disconnected$", out, re.M), out


@pytest.mark.parametrize('text,why', [
    ('<logfile>\npath x.log\nformat %(bogus)s\n</logfile>', 'unknown field %(bogus)'),
    ('<logfile>\npath x.log\nwhen midnight\nold-files 3\n</logfile>', 'rotation at given times is not supported'),
    ('<logfile>\npath STDOUT\nmax-size 1MB\nold-files 2\n</logfile>', 'cannot rotate STDOUT'),
    ('<syslog>\n</syslog>', 'files and standard streams only'),
    ('level noisy', 'not a log level'),
])
def test_eventlog_refused(zodbd_bin, tmp_path, tmp_copy, text, why):
    """A key zodbd cannot honour stops it with the reason, before it
    touches the storage."""
    path = str(tmp_path / 'new.fs')
    c = tmp_path / 'zeo.conf'
    c.write_text(conf('127.0.0.1:%d' % free_port(), fs_section(path), eventlog='<eventlog>\n%s\n</eventlog>' % text))
    p = run_serve(zodbd_bin, ['-C', str(c)], tmp_path)
    assert p.returncode != 0 and why in p.stderr, p.stderr
    assert not os.path.exists(path)


def test_eventlog_size_rotation(zodbd_bin, tmp_path, tmp_copy):
    """max-size and old-files rotate the file as Python's
    RotatingFileHandler: no file reaches max-size, old-files are kept."""
    port = free_port()
    log = str(tmp_path / 'zeo.log')
    eventlog = '<eventlog>\n<logfile>\npath %s\nmax-size 600\nold-files 2\n</logfile>\n</eventlog>' % log
    srv = Server(zodbd_bin, None, tmp_path, conf=conf('127.0.0.1:%d' % port, fs_section(tmp_copy('1.fs')),
                                                      zeo='read-only true', eventlog=eventlog), port=port).start()
    try:
        for i in range(8):  # two lines a client: new connection, disconnected
            cs = ClientStorage(('127.0.0.1', port), read_only=True, wait_timeout=10)
            cs.load(z64)
            cs.close()
        wait_for(lambda: os.path.exists(log + '.2'), 'two rotations')
    finally:
        srv.stop()
    for p in (log, log + '.1', log + '.2'):
        assert 0 < os.path.getsize(p) < 600, p
    assert not os.path.exists(log + '.3')


def test_transaction_timeout_logged_as_zeo(zodbd_bin, tmp_path):
    """ZEO's own check (ZEO.tests.ConnectionTests.TimeoutTests): a line
    with 'CRITICAL ZEO.StorageServer' and 'Transaction timeout after'."""
    port = free_port()
    srv = Server(zodbd_bin, None, tmp_path, conf=conf('127.0.0.1:%d' % port,
                                                      fs_section(str(tmp_path / 'Data.fs')),
                                                      zeo='transaction-timeout 1'), port=port).start()
    try:
        cs = ClientStorage(('127.0.0.1', port), wait_timeout=10)
        t = TransactionMetaData()
        cs.tpc_begin(t)
        cs.tpc_vote(t)
        time.sleep(2)
        with pytest.raises(ClientDisconnected):
            cs.tpc_finish(t)
        cs.tpc_abort(t)
        cs.close()
    finally:
        srv.stop()
    assert re.search(r'CRITICAL ZEO\.StorageServer .*Transaction timeout after 1 seconds', srv.output()), srv.output()


# --- quota ---

def fill(cs, n, size):
    """Commit n transactions of one new object of size bytes each."""
    for i in range(n):
        t = TransactionMetaData()
        cs.tpc_begin(t)
        cs.store(cs.new_oid(), z64, b'x' * size, '', t)
        cs.tpc_vote(t)
        cs.tpc_finish(t)


@pytest.mark.parametrize('kind', ['zodbd', 'runzeo'])
def test_quota(zodbd_bin, tmp_path, kind):
    """<filestorage> quota: the vote of a transaction whose data record
    would start past the quota fails with ZODB/py's FileStorageQuotaError
    (the client raises it as a ServerException naming the class); the file
    keeps what was committed, and the storage still serves."""
    port = free_port()
    srv = Server(zodbd_bin, None, tmp_path, kind=kind,
                 conf=conf('127.0.0.1:%d' % port, fs_section(str(tmp_path / 'Data.fs'), 'quota 2KB')),
                 port=port).start()
    try:
        cs = ClientStorage(('127.0.0.1', port), wait_timeout=10)
        fill(cs, 3, 300)  # each about 400 bytes in the file
        size = os.path.getsize(tmp_path / 'Data.fs')
        t = TransactionMetaData()
        cs.tpc_begin(t)
        cs.store(cs.new_oid(), z64, b'y' * 300, '', t)
        cs.store(cs.new_oid(), z64, b'y' * 2000, '', t)
        cs.store(cs.new_oid(), z64, b'y' * 10, '', t)  # starts past 2 KiB
        with pytest.raises(ServerException) as e:
            cs.tpc_vote(t)
        cs.tpc_abort(t)
        assert e.value.args[0] == 'ZODB.FileStorage.FileStorage.FileStorageQuotaError', e.value.args
        assert 'The storage quota has been exceeded.' in str(e.value.args[1]), e.value.args
        assert os.path.getsize(tmp_path / 'Data.fs') == size
        assert cs.lastTransaction() != z64
        cs.close()
    finally:
        srv.stop()


# --- addresses, read-only, start order ---

@pytest.mark.parametrize('how', ['-a', 'conf'])
def test_bare_port_listens_on_all_interfaces(zodbd_bin, tmp_path, tmp_copy, how):
    """runzeo's address 8100 is ('', 8100): every interface. The log says
    where zodbd listens; the client connects through 127.0.0.1."""
    port = free_port()
    if how == '-a':
        srv = Server(zodbd_bin, tmp_copy('1.fs'), tmp_path, extra=['-r', '-a', str(port)], port=port)
    else:
        srv = Server(zodbd_bin, None, tmp_path, conf=conf(str(port), fs_section(tmp_copy('1.fs')),
                                                          zeo='read-only true'), port=port)
    srv.start()
    try:
        cs = ClientStorage(('127.0.0.1', port), read_only=True, wait_timeout=10)
        cs.load(z64)
        cs.close()
    finally:
        srv.stop()
    m = re.search(r'listening on (\S+):%d \(all interfaces' % port, srv.output())
    assert m and m.group(1) in ('[::]', '0.0.0.0'), srv.output()


@pytest.mark.parametrize('kind', ['zodbd', 'runzeo'])
def test_read_only_server_over_writable_storage_creates_it(zodbd_bin, tmp_path, kind):
    """<zeo> read-only true, <filestorage> neither read-only nor create, on
    a missing file: runzeo starts (FileStorage, not read-only itself,
    creates the file); writes are refused to the clients."""
    port = free_port()
    path = tmp_path / 'missing.fs'
    srv = Server(zodbd_bin, None, tmp_path, kind=kind,
                 conf=conf('127.0.0.1:%d' % port, fs_section(str(path), 'create false'), zeo='read-only true'),
                 port=port).start()
    try:
        assert path.exists()
        cs = ClientStorage(('127.0.0.1', port), read_only_fallback=True, wait_timeout=10)
        assert cs.isReadOnly()
        with pytest.raises(ReadOnlyError):
            cs.new_oid()
        assert cs.lastTransaction() == z64
        cs.close()
    finally:
        srv.stop()


@pytest.mark.parametrize('kind', ['zodbd', 'runzeo'])
def test_busy_port_creates_no_file(zodbd_bin, tmp_path, kind):
    """A port in use stops the server before it creates new.fs, its .index
    or its .lock."""
    busy = socket.socket()
    busy.bind(('127.0.0.1', 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        cmd = [zodbd_bin, 'serve'] if kind == 'zodbd' else [RUNZEO]
        p = subprocess.run(cmd + ['-a', '127.0.0.1:%d' % port, '-f', 'new.fs'], cwd=str(tmp_path),
                           capture_output=True, text=True, timeout=60)
    finally:
        busy.close()
    assert p.returncode != 0
    if kind == 'zodbd':
        assert 'address already in use' in p.stderr, p.stderr
    assert sorted(os.listdir(tmp_path)) == [], os.listdir(tmp_path)
