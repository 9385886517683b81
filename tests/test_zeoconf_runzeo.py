"""zeo.conf keys: `zodbd serve -C` against runzeo (ZEO 6.2) and ZODB's and
ZEO's ZConfig schemas.

The rule: a key zodbd accepts is honoured (behaves as runzeo) or refused
with a clear error, never silently ignored. Each case runs the same
zeo.conf under zodbd and, where runzeo is the oracle, under runzeo, and
compares what a stock ZEO.ClientStorage (or the files) see. An audit
found five keys that were not (a <blobstorage>'s directory emptied by
create, pack-keep-old not applied to blobs, %define's inner whitespace,
zdaemon's <runner> keys and <eventlog>, transaction-timeout 0); the rest
are the keys checked that matched.
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest
from zeoserver import Server, free_port, recv_frame, runzeo_cmd, wait_listening, read
from ZEO.ClientStorage import ClientStorage
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import POSKeyError
from ZODB.utils import p64, u64, z64

KINDS = ['zodbd', 'runzeo']


def zconf(addr, body, zeo=''):
    return '<zeo>\n  address %s\n%s\n</zeo>\n%s\n' % (addr, zeo, body)


def fs(name, path, extra=''):
    return '<filestorage %s>\n  path %s\n%s\n</filestorage>\n' % (name, path, extra)


def start(kind, zodbd_bin, tmp_path, body, zeo='', **kw):
    port = free_port()
    return Server(zodbd_bin, None, tmp_path, kind=kind, conf=zconf('127.0.0.1:%d' % port, body, zeo),
                  port=port, **kw).start()


def refused(kind, zodbd_bin, tmp_path, text):
    """Run the server on zeo.conf text expecting it to refuse to start
    (exit by itself): (returncode, output)."""
    cpath = os.path.join(str(tmp_path), 'refused-%s.conf' % kind)
    with open(cpath, 'w') as f:
        f.write(text)
    cmd = ([zodbd_bin, 'serve'] if kind == 'zodbd' else runzeo_cmd()) + ['-C', cpath]
    try:
        p = subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return None, 'still running after 15 s: the configuration was accepted'
    return p.returncode, p.stdout + p.stderr


def commit(cs, oid, data=b'x', serial=z64):
    t = TransactionMetaData()
    cs.tpc_begin(t)
    cs.store(oid, serial, data, '', t)
    cs.tpc_vote(t)
    return cs.tpc_finish(t)


def wait_for(pred, timeout=5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


# --- several storages in one server ---

@pytest.mark.parametrize('kind', KINDS)
def test_two_filestorages_routing_and_invalidations(zodbd_bin, tmp_path, kind):
    """<filestorage 1> and <filestorage 2>: ClientStorage(storage='2')
    writes into the second file only, and a client of storage 1 gets no
    invalidation (its last tid does not move) from storage 2's commits."""
    a, b = tmp_path / 'a.fs', tmp_path / 'b.fs'
    srv = start(kind, zodbd_bin, tmp_path, fs('1', a) + fs('2', b))
    try:
        cs1 = ClientStorage(srv.addr, storage='1', wait_timeout=10)
        cs2 = ClientStorage(srv.addr, storage='2', wait_timeout=10)
        oid = p64(1)
        t1 = commit(cs1, oid, b'one')
        assert cs1.load(oid)[0] == b'one'  # cached in cs1
        size_a = os.path.getsize(a)
        t2 = commit(cs2, oid, b'two')
        assert t2 > t1
        assert cs2.load(oid)[0] == b'two'
        time.sleep(0.3)  # room for a stray invalidation to arrive
        assert cs1.lastTransaction() == t1
        assert cs1.load(oid) == (b'one', t1)
        assert cs1.lastTransaction() == t1
        latest, oids = cs1._call('getInvalidations', t1)
        assert (latest, oids) == (t1, [])
        assert cs1.loadBefore(oid, p64(u64(t2) + 1))[:2] == (b'one', t1)
        assert os.path.getsize(a) == size_a
        commit(cs2, p64(5), b'only in 2')
        with pytest.raises(POSKeyError):
            cs1.load(p64(5))
        cs1.close()
        cs2.close()
    finally:
        srv.stop()


@pytest.mark.parametrize('kind', KINDS)
def test_unnamed_storage_and_storage_1_refused(zodbd_bin, tmp_path, kind):
    """An unnamed storage is '1': one named 1 beside it is refused."""
    rc, out = refused(kind, zodbd_bin, tmp_path,
                      zconf('127.0.0.1:%d' % free_port(), fs('', tmp_path / 'a.fs') + fs('1', tmp_path / 'b.fs')))
    assert rc not in (0, None), out


# --- <zeo> keys ---

@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('key,env,want', [
    ('msgpack true', False, b'M5'),
    ('msgpack false', True, b'Z5'),   # the key wins over $ZEO_MSGPACK
    ('', True, b'M5'),                # no key: $ZEO_MSGPACK decides
])
def test_msgpack_key(zodbd_bin, tmp_path, kind, key, env, want):
    srv = start(kind, zodbd_bin, tmp_path, fs('1', tmp_path / 'Data.fs'), zeo=key, msgpack=env)
    try:
        s = socket.create_connection(srv.addr, timeout=10)
        try:
            assert recv_frame(s) == want
        finally:
            s.close()
    finally:
        srv.stop()


@pytest.mark.parametrize('kind', KINDS)
def test_address_unix_socket(zodbd_bin, tmp_path, kind):
    """address /path: a Unix socket the stock client commits through;
    removed at exit."""
    d = tempfile.mkdtemp(prefix='zc', dir='/tmp')
    try:
        sock = os.path.join(d, 'zeo.sock')
        cpath = os.path.join(d, 'zeo.conf')
        with open(cpath, 'w') as f:
            f.write(zconf(sock, fs('1', tmp_path / 'Data.fs')))
        cmd = ([zodbd_bin, 'serve'] if kind == 'zodbd' else runzeo_cmd()) + ['-C', cpath]
        log = os.path.join(d, 'log')
        with open(log, 'wb') as lf:
            p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT)
        try:
            wait_listening(sock, p, log)
            cs = ClientStorage(sock, wait_timeout=10)
            commit(cs, cs.new_oid())
            assert cs.lastTransaction() != z64
            cs.close()
        finally:
            p.terminate()
            p.wait(20)
        assert not os.path.exists(sock)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize('kind', KINDS)
def test_pid_filename(zodbd_bin, tmp_path, kind):
    pid = tmp_path / 'zeo.pid'
    srv = start(kind, zodbd_bin, tmp_path, fs('1', tmp_path / 'Data.fs'), zeo='pid-filename %s' % pid)
    try:
        assert wait_for(pid.exists)
        assert int(pid.read_text()) == srv.proc.pid
    finally:
        srv.stop()
    assert not pid.exists()


def _invalidations(cs, tids):
    """getInvalidations(tid) for z64 and each tid, with the tids in the
    answers given as indexes into tids (runs commit different tids)."""
    out = []
    for tid in [z64] + tids:
        r = cs._call('getInvalidations', tid)
        if r is None:
            out.append(None)
        else:
            latest, oids = r
            out.append((tids.index(latest) if latest in tids else latest, sorted(u64(o) for o in oids)))
    return out


def _inval_run(kind, zodbd_bin, tmp_path, zeo):
    path = tmp_path / ('%s.fs' % kind)
    body = fs('1', path)
    srv = start(kind, zodbd_bin, tmp_path, body, zeo=zeo)
    try:
        cs = ClientStorage(srv.addr, wait_timeout=10)
        tids = [commit(cs, p64(i + 1)) for i in range(4)]
        live = _invalidations(cs, tids)
        cs.close()
    finally:
        srv.stop()
    srv = start(kind, zodbd_bin, tmp_path, body, zeo=zeo)  # the queue seeded from the file
    try:
        cs = ClientStorage(srv.addr, wait_timeout=10)
        restarted = _invalidations(cs, tids)
        cs.close()
    finally:
        srv.stop()
    return live, restarted


@pytest.mark.parametrize('zeo', ['invalidation-queue-size 2',
                                 'invalidation-queue-size 2\n  invalidation-age 3600'])
def test_invalidation_queue_size_and_age(zodbd_bin, tmp_path, zeo):
    """getInvalidations answers as runzeo's for a short queue, with and
    without invalidation-age, live and after a restart."""
    got = _inval_run('zodbd', zodbd_bin, tmp_path, zeo)
    want = _inval_run('runzeo', zodbd_bin, tmp_path, zeo)
    assert got == want


# --- <filestorage> keys ---

@pytest.mark.parametrize('kind', KINDS)
def test_create_true_truncates(zodbd_bin, tmp_path, tmp_copy, kind):
    path = tmp_copy('1.fs')
    srv = start(kind, zodbd_bin, tmp_path, fs('1', path, 'create true'))
    try:
        cs = ClientStorage(srv.addr, wait_timeout=10)
        assert cs.lastTransaction() == z64
        cs.close()
    finally:
        srv.stop()


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('extra,gc,keep', [('', True, True), ('pack-gc false\n  pack-keep-old false', False, False)])
def test_pack_gc_and_keep_old(zodbd_bin, tmp_path, kind, extra, gc, keep):
    import transaction
    import ZODB
    from persistent.mapping import PersistentMapping
    path = tmp_path / 'Data.fs'
    srv = start(kind, zodbd_bin, tmp_path, fs('1', path, extra))
    try:
        db = ZODB.DB(ClientStorage(srv.addr, wait_timeout=10))
        tm = transaction.TransactionManager()
        c = db.open(tm)
        c.root()['x'] = x = PersistentMapping()
        tm.commit()
        xoid = x._p_oid
        del c.root()['x']
        tm.commit()
        c.close()
        time.sleep(0.05)
        db.pack()
        db.close()
        st = ClientStorage(srv.addr, wait_timeout=10)  # a fresh cache
        try:
            st.load(xoid)
            kept = True
        except POSKeyError:
            kept = False
        st.close()
        assert kept == (not gc)
        assert os.path.exists(str(path) + '.old') == keep
    finally:
        srv.stop()


@pytest.mark.parametrize('kind', KINDS)
def test_blobstorage_wrapper_create_keeps_its_blob_dir(zodbd_bin, tmp_path, kind):
    """<blobstorage blob-dir D> around <filestorage> create true: ZODB/py's
    FileStorage(create=True) has no blob directory of its own, and
    BlobStorage(D, ...) does not empty D; only <filestorage> blob-dir with
    create true empties it."""
    d = tmp_path / 'blobs'
    d.mkdir()
    (d / '.layout').write_text('bushy\n')
    (d / 'keep.txt').write_text('operator file')
    body = ('<blobstorage 1>\n  blob-dir %s\n' % d + fs('inner', tmp_path / 'Data.fs', 'create true')
            + '</blobstorage>\n')
    srv = start(kind, zodbd_bin, tmp_path, body)
    srv.stop()
    assert (d / 'keep.txt').exists()


@pytest.mark.parametrize('kind', KINDS)
def test_pack_keep_old_with_blob_dir_keeps_blobs_old(zodbd_bin, tmp_path, kind):
    """<filestorage> blob-dir with pack-keep-old true (the default): ZODB/py's
    pack moves the blob files it drops into BLOBDIR.old, as it keeps
    Data.fs.old."""
    import transaction
    import ZODB
    from ZODB.blob import Blob
    d = tmp_path / 'blobs'
    srv = start(kind, zodbd_bin, tmp_path, fs('1', tmp_path / 'Data.fs', 'blob-dir %s' % d))
    try:
        db = ZODB.DB(ClientStorage(srv.addr, wait_timeout=10, blob_dir=str(tmp_path / ('cache-%s' % kind))))
        tm = transaction.TransactionManager()
        c = db.open(tm)
        c.root()['b'] = b = Blob(b'first')
        tm.commit()
        with b.open('w') as f:
            f.write(b'second')
        tm.commit()
        c.close()
        time.sleep(0.05)
        db.pack()
        db.close()
    finally:
        srv.stop()
    assert os.path.exists(str(tmp_path / 'Data.fs.old'))
    assert os.path.isdir(str(d) + '.old'), sorted(os.listdir(tmp_path))


# --- ZConfig syntax ---

@pytest.mark.parametrize('kind', KINDS)
def test_define_keeps_inner_whitespace(zodbd_bin, tmp_path, kind):
    """%define NAME VALUE: ZConfig keeps VALUE as written after the name
    (rest.split(None, 1)), inner whitespace included."""
    d = tmp_path / 'a  b'
    d.mkdir()
    body = '%%define DIR %s\n' % d + fs('1', '$DIR/Data.fs')
    srv = start(kind, zodbd_bin, tmp_path, body)
    srv.stop()
    assert (d / 'Data.fs').exists(), sorted(os.listdir(tmp_path))


@pytest.mark.parametrize('kind', KINDS)
def test_define_substitution_and_case(zodbd_bin, tmp_path, kind):
    """%define with $NAME, ${NAME}, $$ and case-insensitive names, section
    names and keys."""
    body = ('%%define Dir %s\n' % tmp_path + '<FileStorage Main>\n  PATH ${dir}/d$$.fs\n</FileStorage>\n')
    srv = start(kind, zodbd_bin, tmp_path, body)
    try:
        cs = ClientStorage(srv.addr, storage='main', wait_timeout=10)
        cs.close()
    finally:
        srv.stop()
    assert (tmp_path / 'd$.fs').exists()


@pytest.mark.parametrize('kind', KINDS)
def test_runner_section_with_zdaemon_keys(zodbd_bin, tmp_path, kind):
    """<runner> (zdaemon's, for zeoctl) with keys of zdaemon's schema,
    python and zdrun included: runzeo starts, as it ignores <runner>."""
    body = fs('1', tmp_path / 'Data.fs') + ('<runner>\n  program runzeo\n  python %s\n  zdrun %s\n</runner>\n'
                                            % (sys.executable, sys.executable))
    srv = start(kind, zodbd_bin, tmp_path, body)
    srv.stop()


@pytest.mark.parametrize('text,why', [
    ('<mappingstorage 1>\n</mappingstorage>\n', 'mappingstorage'),
    ('%import ZEO\n<filestorage 1>\n path x.fs\n</filestorage>\n', 'import'),
    ('%include other.conf\n<filestorage 1>\n path x.fs\n</filestorage>\n', 'include'),
    ('<filestorage 1>\n path x.fs\n packer ZODB.FileStorage.packer\n</filestorage>\n', 'packer'),
    ('<filestorage 1>\n path x.fs\n frobnicate 1\n</filestorage>\n', 'frobnicate'),
    ('<zlibstorage 1>\n<filestorage 2>\n path x.fs\n</filestorage>\n</zlibstorage>\n', 'import zc.zlibstorage'),
])
def test_refused_with_the_line(zodbd_bin, tmp_path, text, why):
    """What zodbd cannot honour is refused at start, naming the line."""
    rc, out = refused('zodbd', zodbd_bin, tmp_path, zconf('127.0.0.1:%d' % free_port(), text))
    assert rc not in (0, None), out
    assert 'line ' in out and why in out, out


@pytest.mark.parametrize('kind', KINDS)
def test_ssl_without_authenticate_refused(zodbd_bin, tmp_path, kind):
    from ZEO.tests import testssl
    text = zconf('127.0.0.1:%d' % free_port(), fs('1', tmp_path / 'Data.fs'),
                 zeo='<ssl>\n certificate %s\n key %s\n</ssl>' % (testssl.server_cert, testssl.server_key))
    rc, out = refused(kind, zodbd_bin, tmp_path, text)
    assert rc not in (0, None), out
    assert 'authenticate' in out, out


@pytest.mark.parametrize('kind', KINDS)
def test_runner_section_with_its_eventlog(zodbd_bin, tmp_path, kind):
    """zdaemon's <runner> may hold an <eventlog> of its own (zdrun's log):
    runzeo starts."""
    body = fs('1', tmp_path / 'Data.fs') + (
        '<runner>\n  program runzeo\n  <eventlog>\n    <logfile>\n      path %s\n    </logfile>\n  </eventlog>\n</runner>\n'
        % (tmp_path / 'zdrun.log'))
    srv = start(kind, zodbd_bin, tmp_path, body)
    srv.stop()


@pytest.mark.parametrize('kind', KINDS)
def test_filestorage_read_only(zodbd_bin, tmp_path, tmp_copy, kind):
    """<filestorage> read-only true: writes and pack refused, the file and
    its directory as they were (no .lock, no .index written)."""
    from ZODB.POSException import ReadOnlyError
    path = tmp_copy('1.fs')
    before = os.path.getsize(path)
    srv = start(kind, zodbd_bin, tmp_path, fs('1', path, 'read-only true'))
    try:
        cs = ClientStorage(srv.addr, read_only_fallback=True, wait_timeout=10)
        assert cs.isReadOnly()
        with pytest.raises(ReadOnlyError):
            cs.new_oid()
        with pytest.raises(Exception):
            cs.pack(time.time(), None)
        cs.close()
    finally:
        srv.stop()
    assert os.path.getsize(path) == before
    assert not os.path.exists(path + '.old')
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith('1.fs')) == ['1.fs']


@pytest.mark.parametrize('kind', KINDS)
def test_transaction_timeout_zero(zodbd_bin, tmp_path, kind):
    """transaction-timeout 0: runzeo's TimeoutThread(0) times out every
    transaction as soon as it holds the commit lock (the connection is
    closed after the vote); zodbd read it as 'no timeout'. It refuses it
    now, saying why."""
    from ZEO.Exceptions import ClientDisconnected
    if kind == 'zodbd':
        rc, out = refused(kind, zodbd_bin, tmp_path, zconf('127.0.0.1:%d' % free_port(),
                                                          fs('1', tmp_path / 'Data.fs'), 'transaction-timeout 0'))
        assert rc not in (None, 0), out
        assert 'would time out every transaction' in out, out
        p = subprocess.run([zodbd_bin, 'serve', '-f', str(tmp_path / 'Data.fs'), '-t', '0'],
                           capture_output=True, text=True, timeout=15)
        assert p.returncode != 0 and 'would time out every transaction' in p.stderr, p.stderr
        return
    srv = start(kind, zodbd_bin, tmp_path, fs('1', tmp_path / 'Data.fs'), zeo='transaction-timeout 0')
    try:
        cs = ClientStorage(srv.addr, wait_timeout=10)
        t = TransactionMetaData()
        cs.tpc_begin(t)
        cs.store(cs.new_oid(), z64, b'x', '', t)
        failed = False
        try:
            cs.tpc_vote(t)
            time.sleep(0.5)
            cs.tpc_finish(t)
        except (ClientDisconnected, Exception):
            failed = True
        cs.close()
    finally:
        srv.stop()
    assert failed, 'the commit went through: transaction-timeout 0 read as no timeout'


@pytest.mark.parametrize('kind', KINDS)
def test_read_only_server_still_packs(zodbd_bin, tmp_path, kind):
    """<zeo> read-only true over a writable <filestorage>: ZEO's server
    refuses writes but packs ('Yes, you can pack a read-only server')."""
    import transaction
    import ZODB
    from persistent.mapping import PersistentMapping
    path = tmp_path / 'Data.fs'
    db = ZODB.DB(str(path))
    tm = transaction.TransactionManager()
    c = db.open(tm)
    c.root()['x'] = PersistentMapping()
    tm.commit()
    c.root()['x']['a'] = 1
    tm.commit()
    db.close()
    srv = start(kind, zodbd_bin, tmp_path, fs('1', path), zeo='read-only true')
    try:
        cs = ClientStorage(srv.addr, read_only=True, wait_timeout=10)
        time.sleep(0.05)
        cs.pack(time.time())
        cs.close()
    finally:
        srv.stop()
    assert os.path.exists(str(path) + '.old')


@pytest.mark.parametrize('kind', KINDS)
def test_two_storages_on_one_file_refused(zodbd_bin, tmp_path, kind):
    """Two storage sections with one path: the second cannot take the
    file's lock (runzeo: zc.lockfile), so the server does not start."""
    path = tmp_path / 'Data.fs'
    rc, out = refused(kind, zodbd_bin, tmp_path,
                      zconf('127.0.0.1:%d' % free_port(), fs('1', path) + fs('2', path)))
    assert rc not in (0, None), out


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('compress', ['', 'compress false'])
def test_zlibstorage_compress_key(zodbd_bin, tmp_path, kind, compress):
    """%import zc.zlibstorage, <zlibstorage> around <filestorage>: records
    stored compressed ('.z' prefix) unless compress false; loads give
    the plain data either way."""
    path = tmp_path / 'Data.fs'
    body = ('%%import zc.zlibstorage\n<zlibstorage 1>\n  %s\n' % compress
            + fs('inner', path) + '</zlibstorage>\n')
    data = b'abcdefgh' * 64
    srv = start(kind, zodbd_bin, tmp_path, body)
    try:
        cs = ClientStorage(srv.addr, wait_timeout=10)
        oid = cs.new_oid()
        commit(cs, oid, data)
        cs.close()
        cs = ClientStorage(srv.addr, wait_timeout=10)
        assert cs.load(oid)[0] == data
        cs.close()
    finally:
        srv.stop()
    raw = path.read_bytes()
    assert (b'.z' in raw) == (compress == ''), raw[-200:]
    assert (data in raw) == (compress != '')


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('zeo,extra', [
    ('transaction-timeout 1.5', ''),
    ('invalidation-queue-size many', ''),
    ('frobnicate 1', ''),
    ('read-only maybe', ''),
    ('', 'quota 1.5MB'),
    ('', 'create true\n  read-only true'),
    ('', 'pack-gc sometimes'),
])
def test_refused_by_both(zodbd_bin, tmp_path, kind, zeo, extra):
    """Values ZConfig (or FileStorage) refuses are refused by zodbd too."""
    path = tmp_path / 'Data.fs'
    rc, out = refused(kind, zodbd_bin, tmp_path, zconf('127.0.0.1:%d' % free_port(), fs('1', path, extra), zeo))
    assert rc not in (0, None), out
