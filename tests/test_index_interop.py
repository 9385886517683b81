"""Interoperability of the FileStorage index file (Data.fs.index) between
zodbd and ZODB/py.

- ZODB/py opens a file with the index `zodbd reindex` wrote, without
  ignoring it (no "Ignoring index" / "loading index" log) and without
  rebuilding it, and serves the same data as from a scan.
- zodbd reads the index ZODB/py writes (`zodbd reindex --verify` compares
  it with a scan), and writes byte-identical index files.
"""
import hashlib
import json
import logging
import os
import shutil
import subprocess

import pytest
import transaction
import ZODB
from ZODB.FileStorage import FileStorage
from ZODB.POSException import POSKeyError
from ZODB.utils import p64


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTDATA = os.path.join(REPO, 'fs1', 'testdata')
FIXTURES = ['1', '1packed', 'torn']


def expect(name):
    with open(os.path.join(TESTDATA, name + '.expect.json')) as f:
        return json.load(f)


def copy_fixture(tmp_path, name):
    """Copy NAME.fs (without its .index) into tmp_path."""
    dst = tmp_path / (name + '.fs')
    shutil.copyfile(os.path.join(TESTDATA, name + '.fs'), dst)
    return str(dst)


def zodbd(zodbd_bin, *args, check=True):
    p = subprocess.run([zodbd_bin, *args], capture_output=True, text=True)
    if check:
        assert p.returncode == 0, (
            'zodbd %s: exit %d\nstdout: %s\nstderr: %s'
            % (' '.join(args), p.returncode, p.stdout, p.stderr))
    return p


@pytest.fixture
def fslog(caplog):
    """Capture ZODB.FileStorage's log records."""
    caplog.set_level(logging.DEBUG, logger='ZODB.FileStorage')
    return caplog


def index_complaints(caplog):
    return [r.getMessage() for r in caplog.records
            if 'index' in r.getMessage().lower()]


def check_storage_content(st, name):
    """The storage serves what ZODB/py served from the fixture."""
    e = expect(name)
    assert len(st) == e['len']
    assert st.lastTransaction().hex() == e['lastTransaction']
    assert st.getSize() == e['getSize']
    for oid_hex, obj in e['objects'].items():
        oid = p64(int(oid_hex, 16))
        want = obj['load']
        if 'error' in want:
            with pytest.raises(POSKeyError):
                st.load(oid)
            continue
        data, serial = st.load(oid)
        assert serial.hex() == want['serial'], oid_hex
        assert hashlib.sha1(data).hexdigest() == want['data_sha1'], oid_hex


@pytest.mark.parametrize('name', FIXTURES)
def test_zodbpy_uses_zodbd_index(tmp_path, zodbd_bin, fslog, name):
    path = copy_fixture(tmp_path, name)
    zodbd(zodbd_bin, 'reindex', path)
    assert os.path.exists(path + '.index')
    # No temporary file is left next to it (the lock file stays, as a
    # FileStorage opened for writing leaves it: reindex holds it).
    assert sorted(os.listdir(tmp_path)) == sorted(
        [name + '.fs', name + '.fs.index', name + '.fs.lock'])

    st = FileStorage(path, read_only=True)
    try:
        assert index_complaints(fslog) == []
        # FileStorage's marker for testing: 1 when it used the saved index.
        assert st._used_index == 1
        check_storage_content(st, name)
    finally:
        st.close()


@pytest.mark.parametrize('name', FIXTURES)
def test_zodbd_writes_zodbpy_bytes(tmp_path, zodbd_bin, name):
    """ZODB/py rebuilding the index (read-write open with no index) writes
    the same bytes as `zodbd reindex`, and zodbd verifies ZODB/py's file."""
    if name == 'torn':
        pytest.skip('ZODB/py truncates a torn file when it opens it read-write')
    py_dir = tmp_path / 'py'
    go_dir = tmp_path / 'go'
    py_dir.mkdir()
    go_dir.mkdir()
    py_path = copy_fixture(py_dir, name)
    go_path = copy_fixture(go_dir, name)

    st = FileStorage(py_path)  # scans, then saves the index
    assert st._used_index == 0
    st.close()
    with open(py_path, 'rb') as f, open(os.path.join(TESTDATA, name + '.fs'), 'rb') as g:
        assert f.read() == g.read(), 'ZODB/py modified the data file'

    p = zodbd(zodbd_bin, 'reindex', '--verify', py_path)
    assert 'OK' in p.stdout

    zodbd(zodbd_bin, 'reindex', go_path)
    with open(py_path + '.index', 'rb') as f, open(go_path + '.index', 'rb') as g:
        assert f.read() == g.read()


def test_zodbpy_commits_on_zodbd_index(tmp_path, zodbd_bin, fslog):
    """ZODB/py opens read-write with zodbd's index, commits, and saves its
    index on close; zodbd verifies the result."""
    path = copy_fixture(tmp_path, '1')
    zodbd(zodbd_bin, 'reindex', path)

    st = FileStorage(path)
    assert st._used_index == 1
    db = ZODB.DB(st)
    try:
        conn = db.open()
        root = conn.root()
        root['index_interop'] = 'x' * 1000
        transaction.commit()
        conn.close()
    finally:
        db.close()
    assert index_complaints(fslog) == []

    p = zodbd(zodbd_bin, 'reindex', '--verify', path)
    assert 'OK' in p.stdout
    assert 'covers %d of %d bytes' % (os.path.getsize(path),
                                      os.path.getsize(path)) in p.stdout

    # And ZODB/py accepts its own index after that, of course, and the
    # zodbd-rebuilt one is byte-identical to it.
    with open(path + '.index', 'rb') as f:
        py_index = f.read()
    zodbd(zodbd_bin, 'reindex', path)
    with open(path + '.index', 'rb') as f:
        assert f.read() == py_index


def test_verify_detects_stale_index(tmp_path, zodbd_bin, fslog):
    """An index that does not match the file: --verify fails, and ZODB/py
    ignores it too."""
    path = copy_fixture(tmp_path, '1')
    # The index of 1packed.fs is a valid index, but of another file.
    shutil.copyfile(os.path.join(TESTDATA, '1packed.fs.index'),
                    path + '.index')
    p = zodbd(zodbd_bin, 'reindex', '--verify', path, check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    assert 'not usable' in p.stderr

    st = FileStorage(path, read_only=True)
    try:
        assert st._used_index == 0
        # (This also shows that the log capture the other tests rely on
        # sees ZODB/py's complaint.)
        assert any('Ignoring index' in m for m in index_complaints(fslog))
    finally:
        st.close()


def test_verify_detects_wrong_positions(tmp_path, zodbd_bin):
    """An index that passes the sanity check but is wrong elsewhere:
    --verify compares it with a scan."""
    path = copy_fixture(tmp_path, '1')
    zodbd(zodbd_bin, 'reindex', path)
    from ZODB.fsIndex import fsIndex
    info = fsIndex.load(path + '.index')
    index = info['index']
    # Oid 0x10 is not in the last transaction, which the sanity check reads.
    oid = p64(0x10)
    index[oid] = index[oid] - 1
    index.save(info['pos'], path + '.index')

    p = zodbd(zodbd_bin, 'reindex', '--verify', path, check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    assert 'oid 0000000000000010' in p.stderr


def test_reindex_rejects_non_filestorage(tmp_path, zodbd_bin):
    path = tmp_path / 'x.fs'
    path.write_bytes(b'NOTAFILESTORAGE')
    p = zodbd(zodbd_bin, 'reindex', str(path), check=False)
    assert p.returncode == 1
    assert 'magic' in p.stderr
    assert not os.path.exists(str(path) + '.index')
