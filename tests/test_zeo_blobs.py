"""Blobs through `zodbd serve`, with the stock ZEO client and ZODB/py.

- A blob directory written by zodbd (stores, new revisions, undo) is read
  back by ZODB/py's own FileStorage(blob_dir=...) on the same directory,
  and one written by ZODB/py is served by zodbd.
- Pack removes the blob files of the revisions it removed.
- ZODB's generic blob test suite (ZODB.tests.testblob
  storage_reusable_suite: blob doctests and BlobUndoTests) runs through a
  ClientStorage against zodbd, with the client's own blob cache and with a
  blob directory shared by client and server, as ZEO's own test suite does.
"""
import os
import stat
import subprocess
import sys
import time
import unittest

import pytest
import transaction
import ZEO
import ZODB
import ZODB.blob
import ZODB.FileStorage
import ZODB.tests.testblob
import ZEO.tests.forker as forker
from ZEO.tests import testZEO

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zeoserver import Server, free_port  # noqa: E402
import test_zeo_zodb_mixins  # noqa: E402


def conf(port, tmp, blob_dir='blobs', extra=''):
    return ('<zeo>\naddress 127.0.0.1:%d\n</zeo>\n'
            '<filestorage 1>\npath %s\nblob-dir %s\n%s\n</filestorage>\n'
            % (port, os.path.join(tmp, 'Data.fs'), os.path.join(tmp, blob_dir), extra))


def start(zodbd_bin, tmp_path, marshal, **kw):
    port = free_port()
    return Server(zodbd_bin, None, tmp_path, msgpack=(marshal == 'M'),
                  conf=conf(port, str(tmp_path), **kw), port=port).start()


def read_blob(blob):
    with blob.open('r') as f:
        return f.read()


def test_zodbpy_reads_what_zodbd_wrote(zodbd_bin, tmp_path, marshal):
    srv = start(zodbd_bin, tmp_path, marshal)
    big = os.urandom(300000)  # several 59000-byte chunks
    try:
        db = ZEO.DB(srv.addr, blob_dir=str(tmp_path / 'cache'))
        conn = db.open()
        root = conn.root()
        root['a'] = ZODB.blob.Blob(b'a v1')
        transaction.commit()
        with root['a'].open('w') as f:
            f.write(b'a v2')
        root['b'] = ZODB.blob.Blob(big)
        transaction.commit()
        with root['a'].open('w') as f:
            f.write(b'a v3')
        transaction.commit()
        # Undo the last transaction: a's blob is v2 again, under the
        # undo's tid.
        db.undo(db.undoLog(0, 1)[0]['id'])
        transaction.commit()
        conn.sync()
        assert read_blob(root['a']) == b'a v2'
        oid_a, oid_b = root['a']._p_oid, root['b']._p_oid
        hist = [h['tid'] for h in db.history(oid_a, size=10)]
        assert len(hist) == 4
        db.close()
    finally:
        assert srv.stop() == 0

    blobs = str(tmp_path / 'blobs')
    with open(os.path.join(blobs, '.layout')) as f:
        assert f.read().strip() == 'bushy'
    fs = ZODB.FileStorage.FileStorage(str(tmp_path / 'Data.fs'),
                                      blob_dir=blobs, read_only=True)
    db = ZODB.DB(fs)
    try:
        root = db.open().root()
        assert read_blob(root['a']) == b'a v2'
        assert read_blob(root['b']) == big
        # Every revision of a has its blob file, where ZODB/py looks.
        want = [b'a v2', b'a v3', b'a v2', b'a v1']  # newest first
        for tid, data in zip(hist, want):
            path = fs.loadBlob(oid_a, tid)
            assert path == fs.fshelper.getBlobFilename(oid_a, tid)
            with open(path, 'rb') as f:
                assert f.read() == data
            assert not os.stat(path).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        assert os.path.exists(fs.fshelper.getPathForOID(oid_b))
        # Nothing left over in the temporary directory.
        assert os.listdir(os.path.join(blobs, 'tmp')) == []
    finally:
        db.close()


@pytest.mark.parametrize('shared', [False, True], ids=['cache', 'shared'])
def test_zodbd_serves_what_zodbpy_wrote(zodbd_bin, tmp_path, marshal, shared):
    blobs = str(tmp_path / 'blobs')
    fs = ZODB.FileStorage.FileStorage(str(tmp_path / 'Data.fs'), blob_dir=blobs)
    db = ZODB.DB(fs)
    conn = db.open()
    big = os.urandom(200000)
    conn.root()['x'] = ZODB.blob.Blob(big)
    conn.root()['y'] = ZODB.blob.Blob(b'small')
    transaction.commit()
    db.close()

    srv = start(zodbd_bin, tmp_path, marshal)
    try:
        if shared:
            db = ZEO.DB(srv.addr, blob_dir=blobs, shared_blob_dir=True)
        else:
            db = ZEO.DB(srv.addr, blob_dir=str(tmp_path / 'cache'))
        conn = db.open()
        root = conn.root()
        assert read_blob(root['x']) == big
        assert read_blob(root['y']) == b'small'
        # And a new revision through zodbd lands beside ZODB/py's.
        with root['y'].open('w') as f:
            f.write(b'small v2')
        transaction.commit()
        conn.cacheMinimize()
        assert read_blob(root['y']) == b'small v2'
        db.close()
    finally:
        assert srv.stop() == 0
    fs = ZODB.FileStorage.FileStorage(str(tmp_path / 'Data.fs'), blob_dir=blobs,
                                      read_only=True)
    db = ZODB.DB(fs)
    try:
        assert read_blob(db.open().root()['y']) == b'small v2'
    finally:
        db.close()


def test_missing_blob_is_poskeyerror(zodbd_bin, tmp_path, marshal):
    srv = start(zodbd_bin, tmp_path, marshal)
    try:
        cs = ZEO.client(srv.addr, blob_dir=str(tmp_path / 'cache'))
        try:
            with pytest.raises(ZODB.POSException.POSKeyError):
                cs.loadBlob(b'\0' * 7 + b'\x09', b'\x03' + b'\0' * 7)
        finally:
            cs.close()
    finally:
        assert srv.stop() == 0


def test_pack_removes_blob_files(zodbd_bin, tmp_path, marshal):
    srv = start(zodbd_bin, tmp_path, marshal)
    try:
        db = ZEO.DB(srv.addr, blob_dir=str(tmp_path / 'cache'))
        conn = db.open()
        root = conn.root()
        root['keep'] = ZODB.blob.Blob(b'k1')
        root['gone'] = ZODB.blob.Blob(b'g1')
        transaction.commit()
        oid_keep, oid_gone = root['keep']._p_oid, root['gone']._p_oid
        for v in (b'k2', b'k3'):
            with root['keep'].open('w') as f:
                f.write(v)
            transaction.commit()
        del root['gone']
        transaction.commit()
        time.sleep(0.01)
        db.pack(time.time() + 1)
        db.close()
    finally:
        assert srv.stop() == 0
    blobs = str(tmp_path / 'blobs')
    helper = ZODB.blob.FilesystemHelper(blobs)
    keep_files = os.listdir(helper.getPathForOID(oid_keep))
    assert len(keep_files) == 1 and keep_files[0].endswith('.blob'), keep_files
    assert not os.path.exists(helper.getPathForOID(oid_gone))
    fs = ZODB.FileStorage.FileStorage(str(tmp_path / 'Data.fs'), blob_dir=blobs,
                                      read_only=True)
    db = ZODB.DB(fs)
    try:
        assert read_blob(db.open().root()['keep']) == b'k3'
    finally:
        db.close()


def test_upload_left_by_a_killed_server(zodbd_bin, tmp_path, marshal):
    """The server SIGKILLed while it receives a blob: the restarted server
    removes the upload it left in the blob directory's tmp (and says so),
    leaves the other files there alone (a shared directory's clients keep
    their uncommitted blobs in it), and the client commits the blob again."""
    import signal
    import threading
    srv = start(zodbd_bin, tmp_path, marshal)
    tmp = str(tmp_path / 'blobs' / 'tmp')
    with open(os.path.join(tmp, 'tmpclient.tmp'), 'wb') as f:
        f.write(b'a shared client\'s uncommitted blob')
    big = os.urandom(64 << 20)
    try:
        # A store to a dead server waits that long for it to come back.
        db = ZEO.DB(srv.addr, blob_dir=str(tmp_path / 'cache'), wait_timeout=2)
        tm = transaction.TransactionManager()
        root = db.open(tm).root()
        failed = []

        def commit():
            try:
                root['b'] = ZODB.blob.Blob(big)
                tm.commit()
            except Exception as e:
                failed.append(e)
                tm.abort()
        t = threading.Thread(target=commit)
        t.start()
        deadline = time.time() + 30
        while not [n for n in os.listdir(tmp) if n.startswith('zodbd-')
                   and os.path.getsize(os.path.join(tmp, n)) > 0]:
            assert time.time() < deadline and t.is_alive(), 'no upload seen in %s' % tmp
            time.sleep(0.002)
        srv.stop(signal.SIGKILL)
        t.join()
        assert failed, 'the commit survived the kill'
        left = [n for n in os.listdir(tmp) if n.startswith('zodbd-')]
        assert len(left) == 1, left
        srv.start()
        # The server listens before it opens its storage: the uploads
        # are removed once it has (a loaded machine showed the file
        # still there right after the start).
        deadline = time.time() + 30
        while 'removed 1 uploads' not in srv.output() and time.time() < deadline:
            time.sleep(0.01)
        assert 'removed 1 uploads' in srv.output(), srv.output()[-2000:]
        # (The client may already be uploading again, to a new file.)
        now = os.listdir(tmp)
        assert left[0] not in now and 'tmpclient.tmp' in now, now
        for _ in range(100):
            try:
                root['b'] = ZODB.blob.Blob(big)
                tm.commit()
                break
            except ZEO.Exceptions.ClientDisconnected:
                tm.abort()
                time.sleep(0.1)
        assert read_blob(root['b']) == big
        db.close()
    finally:
        assert srv.stop() == 0


def reusable_cases():
    suites = [
        ('cache', ZODB.tests.testblob.storage_reusable_suite(
            'ClientStorageNonSharedBlobs', testZEO.ServerManagingClientStorage)),
        ('shared', ZODB.tests.testblob.storage_reusable_suite(
            'ClientStorageSharedBlobs', testZEO.create_storage_shared)),
    ]

    def flatten(s):
        for t in s:
            if isinstance(t, unittest.TestSuite):
                yield from flatten(t)
            else:
                yield t
    for kind, suite in suites:
        for t in flatten(suite):
            yield '%s-%s' % (kind, t.id().rsplit('/', 1)[-1]), t


REUSABLE = list(reusable_cases())


@pytest.mark.parametrize('case', [t for _, t in REUSABLE], ids=[n for n, _ in REUSABLE])
def test_zodb_blob_suite(case, tmp_path, monkeypatch):
    if 'blob_transaction' in case.id() and os.geteuid() == 0:
        # It checks that a committed blob file cannot be opened for
        # writing; root can, and then truncates it for the rest of the
        # test.
        pytest.skip('blob_transaction.txt checks file permissions, which root bypasses')
    monkeypatch.setattr(forker, 'start_zeo_server', test_zeo_zodb_mixins.start_zodbd)
    monkeypatch.chdir(tmp_path)
    result = unittest.TestResult()
    case.run(result)
    for _, reason in result.skipped:
        pytest.skip(reason)
    problems = result.errors + result.failures
    if problems:
        pytest.fail('\n'.join(tb for _, tb in problems), pytrace=False)


def create_conf(port, tmp):
    return ('<zeo>\naddress 127.0.0.1:%d\n</zeo>\n'
            '<filestorage 1>\npath %s\nblob-dir %s\ncreate true\n</filestorage>\n'
            % (port, os.path.join(tmp, 'Data.fs'), os.path.join(tmp, 'blobs')))


def test_second_serve_with_create_keeps_running_servers_blobs(zodbd_bin, tmp_path):
    """A second `zodbd serve` of the same `create true` configuration
    fails on the FileStorage's lock, held by the running server, and leaves
    that server's blob directory alone (it emptied it before it took the
    lock; ZODB/py's FileStorage takes the lock first)."""
    tmp = str(tmp_path)
    port = free_port()
    srv = Server(zodbd_bin, None, tmp_path, conf=create_conf(port, tmp), port=port).start()
    try:
        db = ZEO.DB(srv.addr, blob_dir=os.path.join(tmp, 'cache'))
        try:
            conn = db.open()
            b = ZODB.blob.Blob()
            with b.open('w') as f:
                f.write(b'precious')
            conn.root()['b'] = b
            transaction.commit()
            conn.close()
        finally:
            db.close()
        # The same configuration started again (another port): refused.
        port2 = free_port()
        cpath = os.path.join(tmp, 'zeo2.conf')
        with open(cpath, 'w') as f:
            f.write(create_conf(port2, tmp))
        p = subprocess.run([zodbd_bin, 'serve', '-C', cpath], capture_output=True, timeout=30)
        assert p.returncode != 0, 'a second server on a locked FileStorage started'
        assert b'locked' in p.stdout + p.stderr
        db = ZEO.DB(srv.addr, blob_dir=os.path.join(tmp, 'cache2'))
        try:
            conn = db.open()
            with conn.root()['b'].open() as f:
                assert f.read() == b'precious'
            conn.close()
        finally:
            db.close()
    finally:
        srv.stop()


def test_copy_with_the_same_blob_dir_keeps_the_source_blobs(zodbd_bin, tmp_path):
    """`zodbd copy --src-blob-dir B --dst-blob-dir B SRC DST` (DST sharing
    SRC's blob directory: every revision's file is already in place) copies
    and leaves SRC's blob files alone (it removed each before linking it
    to itself, and failed), as ZODB/py's copyTransactionsFrom does."""
    tmp = str(tmp_path)
    blobs = os.path.join(tmp, 'blobs')
    st = ZODB.FileStorage.FileStorage(os.path.join(tmp, 'src.fs'), blob_dir=blobs)
    db = ZODB.DB(st)
    conn = db.open()
    for i in range(3):
        b = ZODB.blob.Blob()
        with b.open('w') as f:
            f.write(b'content %d' % i)
        conn.root()['b%d' % i] = b
        transaction.commit()
    db.close()

    def files():
        out = {}
        for d, _, names in os.walk(blobs):
            for n in names:
                if n.endswith('.blob'):
                    with open(os.path.join(d, n), 'rb') as f:
                        out[os.path.relpath(os.path.join(d, n), blobs)] = f.read()
        return out
    before = files()
    assert len(before) == 3
    p = subprocess.run([zodbd_bin, 'copy', '--src-blob-dir', blobs, '--dst-blob-dir', blobs,
                        os.path.join(tmp, 'src.fs'), os.path.join(tmp, 'dst.fs')],
                       capture_output=True, timeout=60)
    after = files()
    assert after == before, 'copy (rc %d: %s) changed the source blob files: %d of %d left' % (
        p.returncode, (p.stdout + p.stderr).decode().strip(), len(after), len(before))
    assert p.returncode == 0, (p.stdout + p.stderr).decode()
    db = ZODB.DB(ZODB.FileStorage.FileStorage(os.path.join(tmp, 'dst.fs'), blob_dir=blobs))
    try:
        conn = db.open()
        for i in range(3):
            with conn.root()['b%d' % i].open() as f:
                assert f.read() == b'content %d' % i
    finally:
        db.close()
