"""ZODB's storage test mixins through NEO/py's client (neo.client.Storage)
against a NEO cluster of tests/neocluster.py: one storage node, zodbd's
(or, as the reference, NEO/py's own), or a layout of several, replicated. Run with NEO/py's Python (it imports neo and
ZODB's test mixins); tests/test_neo_writes.py runs it (docs/neo.md).

    NEOPY_SRC=... PYTHONPATH=$NEOPY_SRC:tests python tests/neo_mixins.py \
        KIND ZODBD [-k SUBSTRING] [--json FILE]

KIND is one of neocluster.KINDS or a layout ('zodbd-sqlite+neopy/p2/r1',
neocluster.layout). Every test gets a fresh cluster on an
empty database. The client is set up as NEO/py's own ZODB tests set it up
(neo/tests/zodb: pack waits until done, undoLog hides NEO's pack
transactions), and the tests NEO/py marks as expected failures of NEO
itself are expected to fail here too (EXPECTED_FAILURES; SPREAD_FAILURES
on layouts with partitions spread over more nodes than replicas+1)."""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import unittest

from neo.client.app import Application, TXN_PACK_DESC
from neo.client.Storage import Storage
from ZODB.tests import (BasicStorage, ConflictResolution, HistoryStorage, IteratorStorage, MTStorage,
                        PackableStorage, PersistentStorage, ReadOnlyStorage, RevisionStorage,
                        StorageTestBase, Synchronization, TransactionalUndoStorage)

import neocluster

# Expected failures of NEO/py itself (its neo/tests/zodb marks them so):
# NEO's pack keeps what these tests expect gone, and keeps undo information
# ZODB's FileStorage drops.
EXPECTED_FAILURES = {
    'testPackAllRevisions', 'testPackUndoLog', 'testTransactionalUndoAfterPack',
}
# NEO/py's client computes undoLog(first, last) / undoInfo as the union
# of each storage node's [first, last) slice of its own tids: right when
# every node holds every partition, wrong when the partitions are spread
# over more nodes than replicas+1 (NEO/py marks its undoLog "broken"; an
# all-NEO/py cluster of the same layout fails these two the same way).
# On such layouts they may fail (xfail) or, by the luck of the tids'
# partitions, pass.
SPREAD_FAILURES = {'testIndicesInUndoInfo', 'testIndicesInUndoLog'}
SPREAD = False  # set by main() for such layouts
# Not applicable (NEO/py skips it too): it expects lastTransaction() to
# block while tpc_finish's callback runs, which ZODB 5.6 no longer requires.
# ZODB's race tests that need _new_storage_client (a second client) skip
# themselves, as in NEO/py's own runs of these mixins.
SKIP = {'test_tid_ordering_w_commit'}

KIND = ZODBD = None
_orig_undoLog = Application.undoLog


def _undoLog(self, *args, **kw):
    return [t for t in _orig_undoLog(self, *args, **kw) if t['description'] != TXN_PACK_DESC]


class NEOTest(StorageTestBase.StorageTestBase):
    """Starts a cluster per test; _storage is NEO/py's client."""

    def setUp(self):
        StorageTestBase.StorageTestBase.setUp(self)
        self._dir = tempfile.mkdtemp(prefix='neo-mixins-')
        self._cluster = neocluster.Cluster(KIND, self._dir, os.environ['NEOPY_SRC'], sys.executable,
                                           zodbd=ZODBD).start()
        Application.undoLog = _undoLog
        Application.wait_for_pack = True
        self.open()

    def open(self, read_only=False):
        """(Re)opens _storage, as ZODB's tests expect of open()."""
        if getattr(self, '_storage', None) is not None:
            self._storage.close()
        self._storage = Storage(master_nodes=self._cluster.master, name=self._cluster.name,
                                read_only=read_only)

    def tearDown(self):
        try:
            self._storage.close()
        finally:
            Application.undoLog = _orig_undoLog
            Application.wait_for_pack = False
            self._cluster.stop()
            if os.environ.get('NEO_MIXINS_KEEP'):
                print('kept', self._dir, file=sys.stderr)
            else:
                shutil.rmtree(self._dir, ignore_errors=True)
        StorageTestBase.StorageTestBase.tearDown(self)


class ReadOnlyMixin(ReadOnlyStorage.ReadOnlyStorage):
    def _make_readonly(self):
        self.open(read_only=True)


class PackMixin(PackableStorage.PackableStorageWithOptionalGC):
    def testPackAllRevisionsNoGC(self):
        # NEO's pack has no gc option (it never collects garbage): the
        # test's pack(..., gc=False) is NEO's pack, as NEO/py's own
        # tests run it.
        pack = self._storage.pack
        self._storage.pack = lambda t, referencesf, gc: pack(t, referencesf)
        PackableStorage.PackableStorageWithOptionalGC.testPackAllRevisionsNoGC(self)


class UndoMixin(TransactionalUndoStorage.TransactionalUndoStorage,
                ConflictResolution.ConflictResolvingTransUndoStorage):
    """One class, as NEO/py's tests compose them (the conflict-resolving
    undo tests use the undo mixin's helpers)."""


CLASSES = [
    ('Basic', BasicStorage.BasicStorage),
    ('Conflict', ConflictResolution.ConflictResolvingStorage),
    ('History', HistoryStorage.HistoryStorage),
    ('Iterator', IteratorStorage.IteratorStorage),
    ('ExtendedIterator', IteratorStorage.ExtendedIteratorStorage),
    ('MT', MTStorage.MTStorage),
    ('Pack', PackMixin),
    ('PackUndo', PackableStorage.PackableUndoStorage),
    ('Persistent', PersistentStorage.PersistentStorage),
    ('ReadOnly', ReadOnlyMixin),
    ('Revision', RevisionStorage.RevisionStorage),
    ('Synchronization', Synchronization.SynchronizedStorage),
    ('Undo', UndoMixin),
]


def suite(pattern):
    """Each test method once, under the first class that has it (the
    mixins inherit from each other: ExtendedIteratorStorage has
    IteratorStorage's tests, and so on)."""
    s = unittest.TestSuite()
    seen = set()
    for name, mixin in CLASSES:
        cls = type(name + 'Tests', (NEOTest, mixin), {})
        for t in unittest.TestLoader().getTestCaseNames(cls):
            fn = getattr(cls, t)
            if t in SKIP or fn in seen:
                continue
            seen.add(fn)
            if pattern and not any(p in '%s.%s' % (name, t) for p in pattern):
                continue
            s.addTest(cls(t))
    return s


class Result(unittest.TextTestResult):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcomes = {}
        self._t0 = {}

    def _id(self, test):
        return '%s.%s' % (type(test).__name__[:-5], test._testMethodName)

    def startTest(self, test):
        self._t0[self._id(test)] = time.monotonic()
        super().startTest(test)

    def _put(self, test, outcome, detail=''):
        i = self._id(test)
        if i in EXPECTED_FAILURES_BY_ID(i):
            outcome = {'failure': 'xfail', 'error': 'xfail', 'success': 'xpass'}.get(outcome, outcome)
        elif SPREAD and i.split('.', 1)[1] in SPREAD_FAILURES:
            outcome = {'failure': 'xfail', 'error': 'xfail'}.get(outcome, outcome)
        self.outcomes[i] = {'outcome': outcome, 'detail': detail[-3000:],
                            'seconds': round(time.monotonic() - self._t0.get(i, time.monotonic()), 2)}
        if outcome in ('failure', 'error') and hasattr(test, '_cluster'):
            self.outcomes[i]['logs'] = test._cluster.logs(1500)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._put(test, 'success')

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._put(test, 'failure', self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._put(test, 'error', self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._put(test, 'skip', reason)


def EXPECTED_FAILURES_BY_ID(i):
    return {i} if i.split('.', 1)[1] in EXPECTED_FAILURES else set()


def main():
    global KIND, ZODBD, SPREAD
    ap = argparse.ArgumentParser()
    ap.add_argument('kind', help='a kind of neocluster.KINDS or a layout (neocluster.layout)')
    ap.add_argument('zodbd')
    ap.add_argument('-k', action='append', default=[], help='run the tests whose id contains this')
    ap.add_argument('--json')
    a = ap.parse_args()
    kinds, _, replicas = neocluster.layout(a.kind)
    SPREAD = len(kinds) > replicas + 1
    KIND, ZODBD = a.kind, a.zodbd
    r = unittest.TextTestRunner(resultclass=Result, verbosity=2, stream=sys.stderr).run(suite(a.k))
    if a.json:
        with open(a.json, 'w') as f:
            json.dump(r.outcomes, f, indent=1)
    bad = [i for i, o in r.outcomes.items() if o['outcome'] in ('failure', 'error', 'xpass')]
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
