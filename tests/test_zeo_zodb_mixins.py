"""ZODB's and ZEO's own storage test suites, run through the stock
ClientStorage against `zodbd serve`.

ZEO's test suite (ZEO.tests.testZEO) composes ZODB's generic storage test
mixins (BasicStorage, HistoryStorage, IteratorStorage, MTStorage,
PackableStorage, RevisionStorage, Synchronization,
TransactionalUndoStorage, ReadOnlyStorage, ConflictResolution, ...) with
ZEO's own (CommitLockTests, ThreadTests, IterationTests, ...) and starts a
server per test with ZEO.tests.forker.start_zeo_server. Here that function
is replaced by one that starts `zodbd serve -C zeo.conf` with the same
configuration text, so the very same test classes run against zodbd.

ZEO's concurrent-update tests (InvalidationTests, which ZEO runs beside
its connection tests) run here too, with ZEO's CommonSetupTearDown starting
the server through the same function. $ZODBD_REPEAT=N runs the tests of
concurrent commits and conflicts N times each (see CONCURRENT).

Each check method is one pytest test; SKIP lists the few that cannot pass,
and two of ZEO's that check nothing, with the reason.
"""
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

import pytest
import ZEO.tests.forker as forker
from ZEO.tests import ConnectionTests, InvalidationTests, testConnection, testZEO
from ZODB.POSException import POSKeyError

ZODBD = os.environ.get('ZODBD') or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'bin', 'zodbd')

MARSHAL = {'pickle': '', 'msgpack': '1'}


def start_zodbd(storage_conf=None, zeo_conf=None, port=None, keep=False,
                path='Data.fs', protocol=None, blob_dir=None, suicide=True,
                debug=False, threaded=False, start_timeout=33, name=None,
                log=None, show_config=False):
    """A stand-in for ZEO.tests.forker.start_zeo_server running zodbd."""
    if not storage_conf:
        storage_conf = '<filestorage>\npath %s\n</filestorage>' % path
    if blob_dir:
        storage_conf = ('<blobstorage>\nblob-dir %s\n%s\n</blobstorage>'
                        % (blob_dir, storage_conf))
    if zeo_conf is None or isinstance(zeo_conf, dict):
        addr = ('127.0.0.1', port or 0) if not isinstance(port, str) else port
        z = forker.ZEOConfig(addr)
        if zeo_conf:
            z.__dict__.update(zeo_conf)
        zeo_conf = z
    elif getattr(zeo_conf, 'log', None):
        # ZEO's connection tests ask for an <eventlog> (server.log): the
        # server's output goes to the log file below instead, where its
        # "listening on" line is looked for.
        z = forker.ZEOConfig(zeo_conf.address)
        z.__dict__.update({k: v for k, v in zeo_conf.__dict__.items() if k not in ('log', 'logpath')})
        zeo_conf = z
    text = str(zeo_conf) + '\n\n' + storage_conf
    fd, conf = tempfile.mkstemp('.conf', prefix='zodbd', dir=os.getcwd())
    with os.fdopen(fd, 'w') as f:
        f.write(text)
    # $ZODBD_SERVER_LOGS keeps the server logs (the test's directory is
    # removed at its end).
    logdir = os.environ.get('ZODBD_SERVER_LOGS') or os.path.dirname(conf)
    logpath = os.path.join(logdir, os.path.basename(conf) + '.log')
    logf = open(logpath, 'wb')
    proc = subprocess.Popen([ZODBD, 'serve', '-C', conf], stdout=logf,
                            stderr=subprocess.STDOUT)
    deadline = time.time() + start_timeout
    addr = None
    while time.time() < deadline:
        with open(logpath) as f:
            m = re.search(r'listening on (\S+)', f.read())
        if m:
            a = m.group(1)
            if a.startswith('/'):
                addr = a
            else:
                host, _, p = a.rpartition(':')
                addr = (host, int(p))
            break
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    if addr is None:
        proc.kill()
        with open(logpath) as f:
            raise RuntimeError('zodbd serve did not start:\n' + text + '\n' + f.read())

    def stop(stop_timeout=99):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        logf.close()

    return addr, stop


# ZEO's FileStorage classes. Not included: FileStorageLoadDelayedTests
# and FileStorageHexTests (they %import Python storage wrappers). The blob
# classes serve a <blobstorage> (blob-dir around a filestorage):
# BlobAdaptedFileStorageTests with the client's own blob cache (blobs go
# over the connection), BlobWritableCacheTests with a blob directory shared
# by client and server (storeBlobShared).
class FileStorageInvalidationTests(testConnection.FileStorageConfig,
                                   ConnectionTests.CommonSetupTearDown,
                                   InvalidationTests.InvalidationTests):
    """ZEO's concurrent-update tests (InvalidationTests: threads in 1,
    2, 19 client storages appending to one OOBTree, with conflicts
    resolved by BTrees and retried on ConflictError), which ZEO runs in
    testConnection.FileStorageConnectionTests beside its connection tests.

    Each check lets its threads run MINTIME seconds at least: ZEO's 10,
    unless $ZODBD_INVALIDATION_MINTIME says (3 by default here, to keep the
    suite short; the repeat mode below uses ZEO's 10 unless told)."""

    MINTIME = float(os.environ.get('ZODBD_INVALIDATION_MINTIME')
                    or (10 if os.environ.get('ZODBD_REPEAT') else 3))


class FileStorageConnectionOnlyTests(testConnection.FileStorageConfig,
                                     ConnectionTests.ConnectionTests):
    """ZEO's connection tests (reconnection, read-only fallback, bad
    messages, ...), which ZEO runs with InvalidationTests
    (testConnection.FileStorageConnectionTests): those run above."""


class FileStorageClientConflictResolutionTests(testZEO.ClientConflictResolutionTests):
    """ZEO's tests of client-conflict-resolution true, on a FileStorage
    (ZEO serves them a MappingStorage)."""

    def getConfig(self):
        return '<filestorage 1>\npath Data.fs\n</filestorage>\n'


CLASSES = [
    testZEO.FileStorageTests,
    testZEO.FileStorageRecoveryTests,
    testZEO.FileStorageSSLTests,
    testZEO.BlobAdaptedFileStorageTests,
    testZEO.BlobWritableCacheTests,
    FileStorageInvalidationTests,
    FileStorageConnectionOnlyTests,
    testConnection.FileStorageReconnectionTests,
    testConnection.FileStorageInvqTests,
    FileStorageClientConflictResolutionTests,
]

# The tests of concurrent commits and conflicts between clients (threads in
# one or several client storages) of REPEATED: with $ZODBD_REPEAT=N each
# runs N times in a row (test ids ...-roundK), to catch what fails only now
# and then:
#
#   ZODBD_REPEAT=20 ZODBD=$PWD/bin/zodbd .venv/bin/python -m pytest \
#       tests/test_zeo_zodb_mixins.py -k 'round and pickle'
#
# (-k round selects the repeated tests only; in this mode InvalidationTests
# run 10 s each, as in ZEO, unless $ZODBD_INVALIDATION_MINTIME says.)
# ZODB's racetest checks (test_race_*) are not repeated: they repeat
# themselves, for a minute or more each.
CONCURRENT = re.compile(r'Concurrent|ZODBThreads|StorageThreads|ExtStorageThread|MTStores'
                        r'|CommitLock|Conflict|tid_ordering')
REPEATED = (testZEO.FileStorageTests, FileStorageInvalidationTests)
REPEAT = int(os.environ.get('ZODBD_REPEAT') or 1)

# check methods that cannot pass against zodbd, with the reason.
SKIP = {
    # Undoing a transaction whose objects were changed later needs the
    # objects' _p_resolveConflict: the reference runs it on the server.
    # zodbd resolves undos natively for BTrees.Length and the BTrees
    # buckets (tests/test_zeo_contention.py) and reports an UndoError for
    # other classes, such as these tests' PCounter, as runzeo with
    # client-conflict-resolution does.
    'testUndoConflictResolution': 'undo of PCounter needs its Python _p_resolveConflict on the server',
    'testUndoMultipleConflictResolution': 'undo of PCounter needs its Python _p_resolveConflict on the server',
    'testUndoMultipleConflictResolutionReversed': 'undo of PCounter needs its Python _p_resolveConflict on the server',
    # ZEO's tests that check nothing (they would pass whatever the server
    # did): skipped, so as not to count as passed.
    'checkWriteMethods': "ZEO's body runs only if ZODB.__version__ exists (not in ZODB 6); testWriteMethods checks it",
    'testPackUndoLog': "ZEO's override is empty (pass); checkPackUndoLog checks it",
}


# ZODB's race test with disconnects (64 client threads each opening and
# closing a client storage 12 times: ~50 s a run on the 2-vCPU CI VM) runs
# on the plain transport with both marshals and on TLS with pickle; the
# same race on the blob classes (a blob cache beside it) and on TLS with
# msgpack runs with ZODBD_STRESS=1.
STRESS = os.environ.get('ZODBD_STRESS') == '1'
SLOW_RACE = 'test_race_external_invalidate_vs_disconnect'
SLOW_RACE_RUNS = {('FileStorageTests', 'pickle'), ('FileStorageTests', 'msgpack'),
                  ('FileStorageSSLTests', 'pickle')}


def cases():
    """(class, method name, repetition, test id) of every test."""
    for cls in CLASSES:
        # ZEO's suite loads both prefixes: ZEO's tests say check*, ZODB 6's
        # mixins test*.
        for prefix in ('check', 'test'):
            loader = unittest.TestLoader()
            loader.testMethodPrefix = prefix
            for name in loader.getTestCaseNames(cls):
                tid = '%s.%s' % (cls.__name__, name)
                if REPEAT > 1 and cls in REPEATED and CONCURRENT.search(name) and name not in SKIP:
                    for rep in range(REPEAT):
                        yield cls, name, rep, '%s-round%02d' % (tid, rep)
                else:
                    yield cls, name, 0, tid


@pytest.fixture(params=sorted(MARSHAL))
def marshal(request, monkeypatch):
    if MARSHAL[request.param]:
        monkeypatch.setenv('ZEO_MSGPACK', MARSHAL[request.param])
    else:
        monkeypatch.delenv('ZEO_MSGPACK', raising=False)
    return request.param


@pytest.mark.parametrize('cls,name,rep', [c[:3] for c in cases()], ids=[c[3] for c in cases()])
def test_zeo_suite(cls, name, rep, marshal, tmp_path, monkeypatch):
    key = '%s.%s' % (cls.__name__, name)
    if key in SKIP or name in SKIP:
        pytest.skip(SKIP.get(key) or SKIP[name])
    if name == SLOW_RACE and not STRESS and (cls.__name__, marshal) not in SLOW_RACE_RUNS:
        pytest.skip('%s runs on %s (ZODBD_STRESS=1: on every class and marshal)'
                    % (SLOW_RACE, ', '.join('%s/%s' % r for r in sorted(SLOW_RACE_RUNS))))
    monkeypatch.setattr(forker, 'start_zeo_server', start_zodbd)
    monkeypatch.chdir(tmp_path)
    result = unittest.TestResult()
    # ZODB hides an error of the client's conflict resolution as a
    # ConflictError (which these tests retry) and logs it: a POSKeyError
    # there is a server that reported a committed serial it cannot load.
    resolution = ResolutionErrors()
    logging.getLogger('ZODB.ConflictResolution').addHandler(resolution)
    try:
        cls(name).run(result)
    finally:
        logging.getLogger('ZODB.ConflictResolution').removeHandler(resolution)
    for test, reason in result.skipped:
        pytest.skip(reason)
    problems = [tb for _, tb in result.errors + result.failures]
    if resolution.errors:
        problems.append('conflict resolution failed %d times: %s'
                        % (len(resolution.errors), '; '.join(sorted(set(resolution.errors)))))
    if problems:
        pytest.fail('\n'.join(problems), pytrace=False)


class ResolutionErrors(logging.Handler):
    """Collects the POSKeyErrors that ZODB's conflict resolution logs."""

    def __init__(self):
        logging.Handler.__init__(self, logging.ERROR)
        self.errors = []

    def emit(self, record):
        exc = record.exc_info and record.exc_info[1]
        if isinstance(exc, POSKeyError):
            self.errors.append('%s: %s' % (type(exc).__name__, exc))
