"""`zodbd serve` as an operator runs it: zeo.conf read as ZConfig reads it
(section names in lower case; a key, a <zeo> or <ssl> section or a
%define given twice refused), values that cannot be honoured refused,
signals with a commit in flight, the pid file removed only once the
storages are closed, a log reader that goes away (SIGPIPE), start-up
failures in one line. Where runzeo's behaviour is the reference, the case
runs against runzeo (from the venv) too.

(A start that fails on a later storage leaves the files of the storages
opened before it, as runzeo does.)
"""
import fcntl
import os
import shutil
import signal
import subprocess
import time

import pytest
from zeoserver import Server, free_port, read, runzeo_cmd
from ZEO.ClientStorage import ClientStorage
from ZEO.Exceptions import ClientDisconnected
from ZODB.Connection import TransactionMetaData
from ZODB.FileStorage import FileStorage
from ZODB.POSException import POSKeyError
from ZODB.utils import p64, z64


def zeo_conf(port, body, zeo=''):
    return '<zeo>\n  address 127.0.0.1:%d\n%s\n</zeo>\n%s\n' % (port, zeo, body)


def fs_section(name, path, extra=''):
    return '<filestorage %s>\n  path %s\n%s\n</filestorage>\n' % (name, path, extra)


def wait_for(pred, what, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError('timed out waiting for ' + what)


def lock_held(path):
    """Whether another process holds the flock of path (a FileStorage's
    .lock, as zc.lockfile and zodbd take it)."""
    with open(path, 'a') as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def expect_refused(cmd, cwd, timeout=10):
    """Run a server command that must refuse to start: its exit status and
    standard error. A server still running after timeout fails the test."""
    p = subprocess.Popen(cmd, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        pytest.fail('started instead of refusing %r; its output:\n%s' % (cmd[2:], (out + err)[-1500:]))
    return p.returncode, out + err


def write_conf(tmp_path, text, name='zeo.conf'):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def server_cmd(kind, zodbd_bin):
    return [zodbd_bin, 'serve'] if kind == 'zodbd' else runzeo_cmd()


def commit(cs, oid, prev, data):
    t = TransactionMetaData()
    cs.tpc_begin(t)
    cs.store(oid, prev, data, '', t)
    cs.tpc_vote(t)
    return cs.tpc_finish(t)


# --- zeo.conf: what ZConfig does that zodbd must do too ---

@pytest.mark.parametrize('kind', ['zodbd', 'runzeo'])
def test_storage_section_name_is_lowercased_as_zconfig(zodbd_bin, tmp_path, kind):
    """ZConfig lower-cases section names: runzeo serves `<filestorage
    Main>` as storage 'main', so the clients of such a deployment ask for
    'main'. Moved to zodbd unchanged, they must still find it."""
    port = free_port()
    conf = zeo_conf(port, fs_section('Main', tmp_path / 'Data.fs'))
    srv = Server(zodbd_bin, None, tmp_path, kind=kind, conf=conf, port=port).start()
    try:
        try:
            cs = ClientStorage(srv.addr, storage='main', wait_timeout=8)
        except ClientDisconnected as e:
            pytest.fail("%s: client of storage 'main' not served (%r); log:\n%s"
                        % (kind, e, srv.output()[-1500:]))
        assert cs.lastTransaction() == z64
        cs.close()
    finally:
        srv.stop()


DUPLICATES = {
    'key twice in <zeo>': lambda port, tmp: (
        '<zeo>\n  address 127.0.0.1:%d\n  read-only true\n  read-only false\n</zeo>\n%s'
        % (port, fs_section('1', tmp / 'Data.fs'))),
    'two <zeo> sections': lambda port, tmp: (
        '<zeo>\n  address 127.0.0.1:%d\n</zeo>\n<zeo>\n  read-only true\n</zeo>\n%s'
        % (port, fs_section('1', tmp / 'Data.fs'))),
    'path twice in <filestorage>': lambda port, tmp: zeo_conf(
        port, fs_section('1', tmp / 'Data.fs', '  path %s' % (tmp / 'Other.fs'))),
    '%define redefined': lambda port, tmp: (
        '%%define DIR %s\n%%define DIR %s\n%s' % (tmp, tmp / 'other', zeo_conf(port, fs_section('1', '$DIR/Data.fs')))),
    'storages A and a': lambda port, tmp: zeo_conf(
        port, fs_section('A', tmp / 'A.fs') + fs_section('a', tmp / 'a.fs')),
}


@pytest.mark.parametrize('case', sorted(DUPLICATES))
@pytest.mark.parametrize('kind', ['zodbd', 'runzeo'])
def test_duplicate_key_or_section_refused(zodbd_bin, tmp_path, kind, case):
    """ZConfig refuses a key given twice in a section ("too many values")
    and a second <zeo> section; zodbd must not keep one of the two values
    silently."""
    (tmp_path / 'other').mkdir()
    conf = write_conf(tmp_path, DUPLICATES[case](free_port(), tmp_path))
    rc, err = expect_refused(server_cmd(kind, zodbd_bin) + ['-C', conf], tmp_path)
    assert rc != 0, err


# --- command-line values accepted and silently not honoured ---

@pytest.mark.parametrize('flag', [
    ['--invalidation-queue-size', '-1'],
    ['--max-frame', '-1'],
    ['--gomaxprocs', '-1'],
    ['-t', '-5'],
], ids=lambda f: ' '.join(f))
def test_nonsense_numbers_refused(zodbd_bin, tmp_path, flag):
    """A value the server cannot honour (a negative size, count or
    timeout) must be refused with a clear error, not replaced by a
    default (or by no timeout) without a word."""
    port = free_port()
    rc, err = expect_refused([zodbd_bin, 'serve', '-a', '127.0.0.1:%d' % port,
                              '-f', str(tmp_path / 'Data.fs')] + flag, tmp_path)
    assert rc != 0 and flag[0] in err, err


def test_create_with_configuration_file_not_ignored(zodbd_bin, tmp_path):
    """--create applies to -f files only; given with -C (no -f) it must be
    honoured or refused, not silently dropped."""
    path = tmp_path / 'Data.fs'
    fs = FileStorage(str(path))
    t = TransactionMetaData()
    fs.tpc_begin(t)
    fs.store(p64(1), z64, b'old data', '', t)
    fs.tpc_vote(t)
    fs.tpc_finish(t)
    fs.close()
    size = os.path.getsize(path)
    port = free_port()
    conf = write_conf(tmp_path, zeo_conf(port, fs_section('1', path)))
    rc, err = expect_refused([zodbd_bin, 'serve', '-C', conf, '--create'], tmp_path)
    assert rc != 0 and '--create' in err, err
    assert os.path.getsize(path) == size


# --- signals ---

@pytest.mark.parametrize('kind', ['zodbd', 'runzeo'])
def test_pid_file_removed_only_after_storage_lock_released(zodbd_bin, tmp_path, dataset, kind):
    """A supervisor that waits for the pid file to go before it starts the
    next server must find the storage unlocked: runzeo removes its pid file
    after closing the storages; zodbd must not remove it before."""
    path = tmp_path / 'Data.fs'
    shutil.copy(dataset('prod1-1024'), path)
    pid = tmp_path / 'zeo.pid'
    port = free_port()
    conf = zeo_conf(port, fs_section('1', path), zeo='  pid-filename %s' % pid)
    srv = Server(zodbd_bin, None, tmp_path, kind=kind, conf=conf, port=port).start()
    wait_for(pid.exists, 'the pid file', 60)
    # A commit, so that the index has something to save at close.
    cs = ClientStorage(srv.addr, wait_timeout=30)
    commit(cs, cs.new_oid(), z64, b'x' * 100)
    cs.close()
    proc = srv.proc
    lockf = open(str(path) + '.lock', 'a')
    held = None
    try:
        proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 30
        while os.path.exists(pid) and time.time() < deadline:
            pass
        assert not os.path.exists(pid), 'pid file still there'
        try:
            fcntl.flock(lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = False
            fcntl.flock(lockf, fcntl.LOCK_UN)
        except BlockingIOError:
            held = True
    finally:
        lockf.close()
        # It exits by itself: a second SIGTERM (stop's) while it exits
        # (removing the pid file is runzeo's last step) killed runzeo,
        # under load.
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        assert srv.stop() == 0
    assert held is False, '%s: the pid file was gone while the server still held %s.lock' % (kind, path)


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT])
def test_signal_with_commit_in_flight(zodbd_bin, tmp_path, sig):
    """SIGTERM/SIGINT with one commit acknowledged and another voted
    (holding the commit lock): exit 0; the voted one is refused to its
    client (disconnected), the acknowledged one is in the file; the file
    ends cleanly (no torn tail); the lock, pid file and nothing else
    left."""
    path = tmp_path / 'Data.fs'
    pid = tmp_path / 'zeo.pid'
    srv = Server(zodbd_bin, str(path), tmp_path, extra=['--pid-file', str(pid)]).start()
    wait_for(pid.exists, 'the pid file')
    cs = ClientStorage(srv.addr, wait_timeout=10)
    oid = cs.new_oid()
    tid1 = commit(cs, oid, z64, b'acknowledged')
    cs2 = ClientStorage(srv.addr, wait_timeout=2)
    oid2 = cs2.new_oid()
    t = TransactionMetaData()
    cs2.tpc_begin(t)
    cs2.store(oid2, z64, b'in flight', '', t)
    cs2.tpc_vote(t)
    assert srv.stop(sig) == 0
    with pytest.raises(ClientDisconnected):
        cs2.tpc_finish(t)
    cs.close()
    cs2.close()
    assert not pid.exists()
    assert not lock_held(str(path) + '.lock')
    fs = FileStorage(str(path), read_only=True)
    try:
        assert fs.load(oid) == (b'acknowledged', tid1)
        with pytest.raises(POSKeyError):
            fs.load(oid2)
        assert fs.getSize() == os.path.getsize(path)
    finally:
        fs.close()


# --- start-up failures ---

def test_bad_tls_files_one_line_no_file(zodbd_bin, tmp_path):
    """A TLS certificate that is missing stops the server before it binds
    or creates anything, with one line."""
    port = free_port()
    conf = write_conf(tmp_path, zeo_conf(
        port, fs_section('1', tmp_path / 'Data.fs'),
        zeo='  <ssl>\n    certificate %s\n    authenticate %s\n  </ssl>' % (tmp_path / 'nope.pem', tmp_path / 'ca.pem')))
    rc, err = expect_refused([zodbd_bin, 'serve', '-C', conf], tmp_path)
    assert rc == 1 and err.count('\n') == 1 and 'nope.pem' in err, err
    assert sorted(os.listdir(tmp_path)) == ['zeo.conf']


def test_unix_socket_and_sigusr2(zodbd_bin, tmp_path):
    """A Unix socket address: a second server on the same socket is refused
    and leaves the first's socket alone; SIGUSR2 reopens the <logfile> of
    zeo.conf (logrotate); SIGTERM removes the socket and the pid file."""
    sock = str(tmp_path / 'zeo.sock')
    log = str(tmp_path / 'zeo.log')
    pid = tmp_path / 'zeo.pid'
    conf = ('<zeo>\n  address %s\n  pid-filename %s\n</zeo>\n%s'
            '<eventlog>\n  <logfile>\n    path %s\n  </logfile>\n</eventlog>\n'
            % (sock, pid, fs_section('1', tmp_path / 'Data.fs'), log))
    cpath = write_conf(tmp_path, conf)
    p = subprocess.Popen([zodbd_bin, 'serve', '-C', cpath], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(pid.exists, 'the pid file')
        # Another server on the same socket, other files: refused.
        conf2 = conf.replace(str(pid), str(tmp_path / 'zeo2.pid')).replace(
            str(tmp_path / 'Data.fs'), str(tmp_path / 'Other.fs'))
        rc, err = expect_refused([zodbd_bin, 'serve', '-C', write_conf(tmp_path, conf2, 'zeo2.conf')], tmp_path)
        assert rc != 0 and 'already listening' in err, err
        assert not os.path.exists(tmp_path / 'Other.fs')
        cs = ClientStorage(sock, wait_timeout=10)
        commit(cs, cs.new_oid(), z64, b'data')
        cs.close()
        os.rename(log, log + '.1')
        p.send_signal(signal.SIGUSR2)
        wait_for(lambda: 'log reopened' in read(log), 'the log reopened after SIGUSR2')
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert not os.path.exists(sock)
    assert not pid.exists()
    assert not lock_held(str(tmp_path / 'Data.fs') + '.lock')
    assert 'shutting down' in read(log)


@pytest.mark.parametrize('kind', ['zodbd', 'runzeo'])
def test_log_reader_gone_does_not_kill_server(zodbd_bin, tmp_path, kind):
    """Logging to standard error (the default) through a pipe whose reader
    goes away (`zodbd serve ... 2>&1 | logger`, the logger restarted): the
    server must go on serving, as runzeo does (Python ignores SIGPIPE and
    reports the failed write), not die of SIGPIPE at its next log line with
    no clean shutdown."""
    port = free_port()
    cmd = server_cmd(kind, zodbd_bin) + ['-a', '127.0.0.1:%d' % port, '-f', str(tmp_path / 'Data.fs')]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        import socket
        def listening():
            try:
                socket.create_connection(('127.0.0.1', port), timeout=1).close()
                return True
            except OSError:
                return False
        wait_for(listening, 'the server to listen')
        time.sleep(1)
        p.stdout.close()  # the log reader goes away
        for _ in range(3):
            try:
                cs = ClientStorage(('127.0.0.1', port), wait_timeout=5)
                cs.lastTransaction()
                cs.close()
            except ClientDisconnected:
                break
            time.sleep(0.2)
        time.sleep(0.5)
        assert p.poll() is None, '%s died (exit status %s) when its log reader went away' % (kind, p.returncode)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(30)


def test_positional_argument_refused_in_one_line(zodbd_bin, tmp_path):
    """`zodbd serve Data.fs` (the file without -f): refused with one line
    naming the argument, as the other flag errors (internal/cli) and as
    runzeo ("positional arguments are not supported: ['Data.fs']"), not
    the whole usage text without a word about what is wrong."""
    p = subprocess.run([zodbd_bin, 'serve', 'Data.fs'], cwd=str(tmp_path), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 2
    assert 'Data.fs' in p.stderr and len(p.stderr.splitlines()) <= 2, p.stderr[:300]
    assert os.listdir(tmp_path) == []
