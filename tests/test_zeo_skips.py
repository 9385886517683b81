"""The checks behind the skips of the ZEO test files: each runs what a
skip leaves out, against zodbd without the skip (and against runzeo,
ZEO/py's server, as the reference where it matters), so that a skip whose
reason no longer holds fails here.

- SKIP of test_zeo_zodb_mixins.py (testUndoConflictResolution and its two
  variants): against zodbd each fails with UndoError only (no other
  error, the server keeps serving), exactly as runzeo does with
  `client-conflict-resolution true`; runzeo's default (Python
  _p_resolveConflict in the server) passes. Documented divergence
  (docs/zeo-server.md, Conflict resolution).
- test_zeo_blobs.py skips blob_transaction.txt as root: run as root
  without CAP_DAC_OVERRIDE (setpriv), the doctest passes against zodbd
  and runzeo, with the client's blob cache and a shared blob directory.
- test_index_interop.py skips the torn fixture of
  test_zodbd_writes_zodbpy_bytes (ZODB/py truncates the file it opens):
  the index bytes ZODB/py writes for the truncated file are those of
  `zodbd reindex` on the torn one. Only the "file unchanged" assertion
  needs the skip.
- ZEO's GenericTests.checkWriteMethods (dead body under ZODB >= 6) and
  FullGenericTests.testPackUndoLog (`pass`) check nothing:
  test_zeo_zodb_mixins.py skips them; covered by testWriteMethods and
  checkPackUndoLog.

test_undecodable_call_closes_connection: a call whose pickle holds an
instance of a class the server does not unpickle was answered with a
ValueError and the connection kept (zeo/conn.go undecodable, which meant
that answer for calls over the decoding limits only); runzeo closes the
connection (ZEO's ConnectionTests.checkBadMessage2, which
test_zeo_zodb_mixins.py runs now, failed against zodbd).
"""
import os
import shutil
import subprocess
import sys
import textwrap
import unittest

import pytest
import ZEO.tests.forker as forker
from ZEO.tests import testZEO

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_zeo_zodb_mixins  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

UNDO_TESTS = ['testUndoConflictResolution', 'testUndoMultipleConflictResolution',
              'testUndoMultipleConflictResolutionReversed']


def client_resolution_tests():
    """ZEO's FileStorageTests against runzeo with client-conflict-resolution
    (made here: a TestCase at module level would be collected)."""
    class ClientResolutionFileStorageTests(testZEO.FileStorageTests):
        def getZEOConfig(self):
            return forker.ZEOConfig(('127.0.0.1', 0), client_conflict_resolution=True)
    return ClientResolutionFileStorageTests


def run_case(case):
    result = unittest.TestResult()
    case.run(result)
    assert result.testsRun == 1
    return [tb for _, tb in result.errors + result.failures], result.skipped


def only_undo_errors(problems):
    """Each traceback ends in an UndoError (and nothing else went wrong)."""
    return problems and all(
        tb.strip().splitlines()[-1].startswith(('ZODB.POSException.UndoError',
                                                'ZODB.POSException.MultipleUndoErrors'))
        for tb in problems)


@pytest.mark.parametrize('name', UNDO_TESTS)
def test_undo_conflict_resolution_zodbd_is_an_undo_error(name, tmp_path, monkeypatch):
    """The SKIP of test_zeo_zodb_mixins.py: zodbd answers UndoError."""
    monkeypatch.setattr(forker, 'start_zeo_server', test_zeo_zodb_mixins.start_zodbd)
    monkeypatch.chdir(tmp_path)
    problems, skipped = run_case(testZEO.FileStorageTests(name))
    assert not skipped
    assert only_undo_errors(problems), '\n'.join(problems) or 'passed: the SKIP is stale'


@pytest.mark.parametrize('server', ['runzeo', 'runzeo-client-conflict-resolution'])
def test_undo_conflict_resolution_runzeo(server, tmp_path, monkeypatch):
    """The reference: runzeo passes by default, and fails as zodbd does
    with client-conflict-resolution true."""
    monkeypatch.chdir(tmp_path)
    cls = testZEO.FileStorageTests if server == 'runzeo' else client_resolution_tests()
    problems, skipped = run_case(cls('testUndoConflictResolution'))
    assert not skipped
    if server == 'runzeo':
        assert problems == []
    else:
        assert only_undo_errors(problems), '\n'.join(problems)


BLOB_TX = textwrap.dedent('''
    import os, sys, tempfile, unittest
    sys.path.insert(0, %(here)r)
    import ZEO.tests.forker as forker
    import test_zeo_blobs, test_zeo_zodb_mixins
    if sys.argv[1] == 'zodbd':
        forker.start_zeo_server = test_zeo_zodb_mixins.start_zodbd
    bad = 0
    for name, case in test_zeo_blobs.REUSABLE:
        if 'blob_transaction' not in case.id():
            continue
        os.chdir(tempfile.mkdtemp(dir=sys.argv[2]))
        r = unittest.TestResult()
        case.run(r)
        for _, tb in r.errors + r.failures:
            print(name, tb)
            bad += 1
        print(name, 'ran', r.testsRun, 'skipped', len(r.skipped))
    sys.exit(1 if bad else 0)
''')


@pytest.mark.parametrize('server', ['zodbd', 'runzeo'])
def test_blob_transaction_without_dac_override(server, tmp_path):
    """test_zeo_blobs.py's root skip: without CAP_DAC_OVERRIDE, root
    cannot open the committed (read-only) blob file for writing, and
    blob_transaction.txt passes."""
    setpriv = shutil.which('setpriv')
    if os.geteuid() != 0 or not setpriv:
        pytest.skip('only meaningful as root, with setpriv (test_zeo_blobs runs it otherwise)')
    script = tmp_path / 'blob_tx.py'
    script.write_text(BLOB_TX % {'here': HERE})
    env = dict(os.environ, ZODBD=test_zeo_zodb_mixins.ZODBD)
    p = subprocess.run([setpriv, '--bounding-set=-dac_override,-dac_read_search', '--',
                        sys.executable, str(script), server, str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert p.stdout.count(' ran 1 skipped 0') == 2, p.stdout


def test_torn_fixture_index_bytes(tmp_path):
    """test_index_interop.py's torn skip: ZODB/py truncates torn.fs
    when it opens it read-write (so 'file unchanged' cannot hold), but the
    index it writes is byte for byte `zodbd reindex`'s of the torn file."""
    from ZODB.FileStorage import FileStorage
    zodbd = test_zeo_zodb_mixins.ZODBD
    src = os.path.join(REPO, 'fs1', 'testdata', 'torn.fs')
    (tmp_path / 'py').mkdir()
    (tmp_path / 'go').mkdir()
    py, go = str(tmp_path / 'py' / 'torn.fs'), str(tmp_path / 'go' / 'torn.fs')
    shutil.copyfile(src, py)
    shutil.copyfile(src, go)
    st = FileStorage(py)
    assert st._used_index == 0
    st.close()
    assert os.path.getsize(py) < os.path.getsize(src)  # what the skip is about
    p = subprocess.run([zodbd, 'reindex', '--verify', py], capture_output=True, text=True)
    assert p.returncode == 0 and 'OK' in p.stdout, p.stdout + p.stderr
    p = subprocess.run([zodbd, 'reindex', go], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert os.path.getsize(go) == os.path.getsize(src)  # zodbd reindex leaves the file
    with open(py + '.index', 'rb') as f, open(go + '.index', 'rb') as g:
        assert f.read() == g.read()


def test_zeo_tests_that_cannot_fail():
    """Two of ZEO's checks that test_zeo_zodb_mixins.py skips can never
    fail: GenericTests.checkWriteMethods calls the ZODB method
    only `if hasattr(ZODB, "__version__")`, which ZODB 6 lacks (and the
    method it would call, ReadOnlyStorage.checkWriteMethods, no longer
    exists: it is testWriteMethods now); FullGenericTests.testPackUndoLog
    is `pass`. Both are covered by tests that run (testWriteMethods,
    checkPackUndoLog)."""
    import inspect

    import ZODB
    from ZODB.tests import ReadOnlyStorage
    assert not hasattr(ZODB, '__version__')
    assert not hasattr(ReadOnlyStorage.ReadOnlyStorage, 'checkWriteMethods')
    assert 'hasattr(ZODB, "__version__")' in inspect.getsource(testZEO.GenericTests.checkWriteMethods)
    body = [ln.strip() for ln in inspect.getsource(testZEO.FullGenericTests.testPackUndoLog).splitlines()[1:]
            if ln.strip() and not ln.strip().startswith('#')]
    assert body == ['pass']
    ids = {c[3] for c in test_zeo_zodb_mixins.cases()}
    assert 'FileStorageTests.testWriteMethods' in ids and 'FileStorageTests.checkPackUndoLog' in ids


class Hack:
    """An instance of a class outside the modules a ZEO server unpickles."""


@pytest.mark.parametrize('server', ['zodbd', 'runzeo'])
@pytest.mark.parametrize('method', ['foo', 'lastTransaction'])
def test_undecodable_call_closes_connection(server, method, tmp_path):
    """After register, a call (msgid 2, not one-way) whose argument is a
    pickled class instance. runzeo logs "Can't deserialize message" and
    closes the connection; zodbd replied builtins.ValueError
    ("undecodable message: ... opcode 0x81 not allowed in a ZEO message")
    and kept it open."""
    import socket

    from ZEO.asyncio.marshal import encoder
    from zeoserver import Server, recv_frame, send_frame
    path = str(tmp_path / 'Data.fs')
    srv = Server(test_zeo_zodb_mixins.ZODBD, path, tmp_path, kind=server,
                 extra=['--create'] if server == 'zodbd' else []).start()
    try:
        s = socket.create_connection(srv.addr)
        s.settimeout(10)
        proto = recv_frame(s)
        send_frame(s, proto)
        enc = encoder(proto)
        send_frame(s, enc(1, False, 'register', ('1', False)))
        recv_frame(s)
        send_frame(s, enc(2, 0, method, (Hack(),)))
        try:
            reply = recv_frame(s)
        except (EOFError, ConnectionResetError):
            reply = None
        s.close()
        assert reply is None, 'connection kept, reply: %r' % reply[:200]
    finally:
        srv.stop()


