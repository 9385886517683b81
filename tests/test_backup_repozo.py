"""`zodbd backup` / `zodbd restore` against ZODB's repozo, both ways.

- repozo (-R, -V) restores and verifies the sets zodbd writes (full,
  incremental, gzip), and zodbd restores and verifies repozo's; a set that
  both wrote to in turn restores with either. The .index files are
  byte-identical to ZODB/py's.
- zodbd restore --to TID stops at any transaction; ZODB/py opens the result.
- zodbd backup while `zodbd serve` commits (blobs included): every backup
  taken under load restores (repozo) to a file ZODB/py opens, and the last
  one to the server's Data.fs exactly; the blobs come back with --blob-dir.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import transaction
import ZEO
import ZODB
import ZODB.blob
import ZODB.FileStorage
from persistent.mapping import PersistentMapping

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zeoserver import Server, free_port  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def tmp_path(tmp_path):
    """A scratch directory on a RAM file system where there is one (ZODB/py
    and the backups sync at every step; the checks need no disk)."""
    if not os.path.isdir('/dev/shm'):
        yield tmp_path
        return
    d = tempfile.mkdtemp(prefix='zodbd-backup-test-', dir='/dev/shm')
    try:
        yield pathlib.Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def repozo(*args, check=True):
    exe = os.path.join(os.path.dirname(sys.executable), 'repozo')
    cmd = [exe] + list(map(str, args)) if os.path.exists(exe) else \
        [sys.executable, '-m', 'ZODB.scripts.repozo'] + list(map(str, args))
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        pytest.fail('repozo %s: exit %d\n%s%s' % (' '.join(map(str, args)), p.returncode, p.stdout, p.stderr),
                    pytrace=False)
    return p


def next_second():
    """Wait for the next second: repozo names its files by the second and
    refuses to overwrite one."""
    time.sleep(1.02 - time.time() % 1)


def commit(path, n, start=0):
    """Commit n transactions to the FileStorage at path (ZODB/py) and
    return the tids."""
    db = ZODB.DB(ZODB.FileStorage.FileStorage(path))
    tids = []
    try:
        conn = db.open()
        root = conn.root()
        for i in range(start, start + n):
            root['k%d' % (i % 7)] = PersistentMapping(v=i, pad=b'x' * (i * 37 % 900))
            transaction.get().note('txn %d' % i)
            transaction.commit()
            tids.append(conn._storage.lastTransaction())
        conn.close()
    finally:
        db.close()
    return tids


def read(path):
    with open(path, 'rb') as f:
        return f.read()


def stamps(repo, ext):
    return sorted(f[:-len(ext)] for f in os.listdir(repo) if f.endswith(ext))


def test_repozo_restores_zodbd_sets(run_zodbd, tmp_path):
    fs = str(tmp_path / 'Data.fs')
    repo = tmp_path / 'repo'
    repo.mkdir()
    sizes = []
    for k, extra in enumerate([[], [], ['--gzip']]):
        commit(fs, 5, start=5 * k)
        sizes.append(os.path.getsize(fs))
        out = run_zodbd('backup', '-r', repo, *extra, fs).stdout
        assert ('full' if k == 0 else 'incremental') in out, out
    names = sorted(os.listdir(repo))
    assert [n.split('.', 1)[1] for n in names if not n.endswith(('.index', '.dat'))] == \
        ['fs', 'deltafs', 'deltafsz'], names
    # ZODB/py wrote Data.fs.index at close: the last backup's is the same.
    last = stamps(str(repo), '.index')[-1]
    assert read(str(repo / (last + '.index'))) == read(fs + '.index')

    repozo('-V', '-r', repo)
    repozo('-R', '-r', repo, '-o', tmp_path / 'r.fs')
    assert read(str(tmp_path / 'r.fs')) == read(fs)
    assert read(str(tmp_path / 'r.fs.index')) == read(fs + '.index')
    # repozo -D: each backup's state.
    for st, size in zip(stamps(str(repo), '.index'), sizes):
        repozo('-R', '-r', repo, '-D', st, '-o', tmp_path / 'd.fs')
        assert read(str(tmp_path / 'd.fs')) == read(fs)[:size]

    # A damaged set: repozo -V and zodbd backup --verify both fail on it.
    delta = str(repo / [n for n in names if n.endswith('.deltafs')][0])
    b = bytearray(read(delta))
    b[len(b) // 2] ^= 1
    with open(delta, 'wb') as f:
        f.write(b)
    assert repozo('-V', '-r', repo, check=False).returncode != 0
    p = run_zodbd('backup', '--verify', '-r', repo, check=False)
    assert p.returncode == 1 and os.path.basename(delta) in p.stderr, p.stderr


def test_zodbd_restores_repozo_sets(run_zodbd, tmp_path):
    fs = str(tmp_path / 'Data.fs')
    repo = tmp_path / 'repo'
    repo.mkdir()
    tids = []
    for k, extra in enumerate([[], [], ['-z']]):
        tids += commit(fs, 5, start=5 * k)
        next_second()
        repozo('-B', '-r', repo, '-f', fs, *extra)
    run_zodbd('backup', '--verify', '-r', repo)
    out = tmp_path / 'r.fs'
    run_zodbd('restore', '-r', repo, '-o', out, '--verify')
    assert read(str(out)) == read(fs)
    assert read(str(out) + '.index') == read(fs + '.index')

    # Point in time: any transaction, not only a backup's end.
    for i in (0, 3, 7, 12):
        run_zodbd('restore', '-r', repo, '-o', out, '--to', tids[i].hex())
        st = ZODB.FileStorage.FileStorage(str(out), read_only=True)
        try:
            assert st.lastTransaction() == tids[i]
            assert st.getSize() == os.path.getsize(str(out))
        finally:
            st.close()

    # One set written by both in turn (zodbd gzip after repozo's, then
    # repozo after zodbd's): both restore it.
    tids += commit(fs, 3, start=15)
    p = run_zodbd('backup', '-r', repo, '-z', fs)
    assert 'incremental' in p.stdout, p.stdout
    tids += commit(fs, 3, start=18)
    next_second()
    repozo('-B', '-r', repo, '-f', fs)
    assert len(stamps(str(repo), '.dat')) == 1, os.listdir(repo)
    repozo('-V', '-r', repo)
    repozo('-R', '-r', repo, '-o', tmp_path / 'py.fs')
    run_zodbd('restore', '-r', repo, '-o', out, '--verify')
    assert read(str(out)) == read(fs) == read(str(tmp_path / 'py.fs'))


def test_backup_while_serving(zodbd_bin, run_zodbd, tmp_path):
    fs = str(tmp_path / 'Data.fs')
    blobs = str(tmp_path / 'blobs')
    repo = tmp_path / 'repo'
    repo.mkdir()
    port = free_port()
    conf = ('<zeo>\naddress 127.0.0.1:%d\n</zeo>\n<filestorage 1>\npath %s\nblob-dir %s\n</filestorage>\n'
            % (port, fs, blobs))
    srv = Server(zodbd_bin, None, tmp_path, conf=conf, port=port).start()
    stop = threading.Event()
    errors = []
    committed = []

    def load():
        try:
            db = ZEO.DB(srv.addr, blob_dir=str(tmp_path / 'cache'))
            conn = db.open()
            root = conn.root()
            i = 0
            while not stop.is_set() and i < 5000:
                root['m%d' % (i % 13)] = PersistentMapping(v=i, pad=os.urandom(i % 500))
                if i % 10 == 0:
                    root['b%d' % (i % 3)] = ZODB.blob.Blob(b'blob %d ' % i * 50)
                transaction.commit()
                committed.append(i)
                i += 1
            conn.close()
            db.close()
        except Exception as e:  # reported by the test
            errors.append(e)

    th = threading.Thread(target=load)
    th.start()
    try:
        deadline = time.time() + 20
        while len(committed) < 20 and time.time() < deadline:
            time.sleep(0.01)
        for k in range(3):
            run_zodbd('backup', '-r', repo, '--blob-dir', blobs, fs)
            time.sleep(0.2)
    finally:
        stop.set()
        th.join(30)
        srv.stop()
    assert not errors, errors
    assert len(committed) > 20
    # Every backup taken under load restores to a file ZODB/py opens
    # (zodbd restore --date is repozo -R -D).
    datstamp = stamps(str(repo), '.dat')[0]
    for st in stamps(str(repo), '.index'):
        out = tmp_path / ('u-%s.fs' % st)
        run_zodbd('restore', '-r', repo, '--date', st, '-o', out)
        s = ZODB.FileStorage.FileStorage(str(out), read_only=True)
        s.close()
    assert datstamp  # one set
    run_zodbd('backup', '-r', repo, '--blob-dir', blobs, fs)
    repozo('-V', '-r', repo)
    repozo('-R', '-r', repo, '-o', tmp_path / 'r.fs')
    assert read(str(tmp_path / 'r.fs')) == read(fs)
    # The blobs come back and ZODB/py reads them.
    rdir = tmp_path / 'restored'
    rdir.mkdir()
    run_zodbd('restore', '-r', repo, '-o', rdir / 'Data.fs', '--blob-dir', rdir / 'blobs')
    db = ZODB.DB(ZODB.FileStorage.FileStorage(str(rdir / 'Data.fs'), blob_dir=str(rdir / 'blobs'), read_only=True))
    try:
        root = db.open().root()
        n = 0
        for k in ('b0', 'b1', 'b2'):
            if k in root:
                with root[k].open('r') as f:
                    assert f.read().startswith(b'blob ')
                n += 1
        assert n > 0
    finally:
        db.close()
