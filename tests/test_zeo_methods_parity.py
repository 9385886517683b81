"""The ZEO methods beyond load/store/commit, as the stock ClientStorage
sees them: each case runs the same calls against runzeo and against
`zodbd serve`, on copies of one Data.fs, and expects the same answers
(each failed on a divergence, now fixed, that its docstring names)."""
import os
import pickle
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zeoserver import Server, runzeo_cmd  # noqa: E402

import transaction  # noqa: E402
import ZODB  # noqa: E402
from ZODB.Connection import TransactionMetaData  # noqa: E402
from ZODB.FileStorage import FileStorage  # noqa: E402
from ZODB.TimeStamp import TimeStamp  # noqa: E402
from ZODB.utils import p64, z64  # noqa: E402
from ZEO.ClientStorage import ClientStorage  # noqa: E402
from persistent.mapping import PersistentMapping  # noqa: E402

pytestmark = pytest.mark.skipif(not runzeo_cmd(), reason='no runzeo in this python')


def make_source(path):
    """A Data.fs of 7 transactions: users alternate, each has the
    extension keys n (its number) and flag (1); transaction 3 also has an
    extension key 'size'."""
    db = ZODB.DB(FileStorage(path))
    c = db.open()
    r = c.root()
    for i in range(6):
        t = transaction.get()
        t.user = 'alice' if i % 2 else 'bob'
        t.description = 'txn %d' % i
        t.setExtendedInfo('n', i)
        t.setExtendedInfo('flag', 1)
        if i == 3:
            t.setExtendedInfo('size', 7)
        r['k%d' % i] = PersistentMapping({'i': i})
        t.commit()
    c.close()
    db.close()


@pytest.fixture
def both(zodbd_bin, tmp_path):
    """both(fn): fn(ClientStorage) against runzeo and zodbd, each on its
    own copy of the source file; returns (runzeo's, zodbd's) results."""
    src = str(tmp_path / 'src.fs')
    make_source(src)

    def run(fn, source=True, make=None):
        """source False: an empty storage; make(path): a source file of
        its own."""
        out = []
        if make is not None:
            own = str(tmp_path / 'own.fs')
            make(own)
        for kind in ('runzeo', 'zodbd'):
            d = tmp_path / kind
            d.mkdir(exist_ok=True)
            p = str(d / 'Data.fs')
            if make is not None:
                shutil.copyfile(own, p)
            elif source:
                shutil.copyfile(src, p)
            else:
                FileStorage(p, create=True).close()
            srv = Server(zodbd_bin, p, d, kind=kind).start()
            try:
                cs = ClientStorage(srv.addr, wait_timeout=20)
                try:
                    out.append(fn(cs))
                finally:
                    cs.close()
            finally:
                srv.stop()
        return tuple(out)
    return run


def outcome(f):
    try:
        return ('ok', f())
    except Exception as e:
        return ('raised', '%s.%s' % (type(e).__module__, type(e).__name__), e.args, str(e))


@pytest.mark.parametrize('spec', [
    {'n': True},                # Python equality: True == 1
    {'flag': True},
    {'missing': None},          # desc.get(k, None) != v: an absent key matches None
    'id', 'time',               # the description's own keys match too
], ids=['int-vs-bool', 'flag-bool', 'absent-none', 'id', 'time'])
def test_undoinfo_specification(both, spec):
    """FileStorage.undoInfo filters with `desc.get(k, None) != v` on the
    whole description dict (id, time, user_name, description, size and the
    extension), with Python's equality."""
    def fn(cs):
        s = spec
        if isinstance(s, str):
            entry = cs.undoLog(0, 20)[2]
            s = {s: entry[s]}
        return outcome(lambda: [e['description'] for e in cs.undoInfo(0, 20, s)])
    runzeo, zodbd = both(fn)
    assert zodbd == runzeo


@pytest.mark.parametrize('size', [0, -1])
def test_history_size_not_positive(both, size):
    """FileStorage.history(oid, size) returns [] for size <= 0."""
    runzeo, zodbd = both(lambda cs: len(cs.history(z64, size)))
    assert zodbd == runzeo


def test_history_keys_override_extension(both):
    """FileStorage.history updates the extension dict with its own keys:
    an extension key 'size' (transaction 3) does not replace the record's
    size."""
    runzeo, zodbd = both(lambda cs: [h['size'] for h in cs.history(z64, 100)])
    assert zodbd == runzeo


def test_time_is_timestamp_time(both):
    """'time' of history and undoLog is TimeStamp(tid).timeTime(), to the
    last bit, as runzeo gives it."""
    def fn(cs):
        bad = []
        for h in cs.history(z64, 100):
            if h['time'] != TimeStamp(h['tid']).timeTime():
                bad.append(('history', h['tid'], h['time'], TimeStamp(h['tid']).timeTime()))
        return bad
    runzeo, zodbd = both(fn)
    assert runzeo == []
    assert zodbd == runzeo


@pytest.mark.parametrize('window', [(0, -2**63), (0.0, 5.0), (0.5, 3.5)],
                         ids=['most-negative-last', 'floats', 'fractions'])
def test_undolog_window_edges(both, window):
    """undoLog(first, last) with Python numbers runzeo takes as they are:
    -2**63 (`last = first - last` is a Python int; zodbd's overflowed and
    gave nothing), floats and fractions (zodbd: TypeError). (An int past 64
    bits is still refused: zodbd's messages hold ints of 64 bits.)"""
    runzeo, zodbd = both(lambda cs: outcome(lambda: len(cs._call('undoLog', *window)))[:2])
    assert zodbd == runzeo


def commit(cs, stores=(), undos=()):
    t = TransactionMetaData()
    cs.tpc_begin(t)
    for oid, serial, data in stores:
        cs.store(oid, serial, data, '', t)
    for u in undos:
        cs.undo(u, t)
    try:
        cs.tpc_vote(t)
    except BaseException:
        cs.tpc_abort(t)
        raise
    return cs.tpc_finish(t)


MAPPING = (pickle.dumps((PersistentMapping, None), 3)
           + pickle.dumps({'data': {}}, 3))


def test_record_iternext_sees_new_objects(both):
    """record_iternext reads the storage's current index at each call
    (FileStorage.record_iternext): an object created after an iteration
    started is found when the iteration gets to it."""
    def fn(cs):
        oid, tid, data, nxt = cs.record_iternext(None)
        seen = [oid]
        new = cs.new_oid()
        commit(cs, [(new, z64, b'new')])
        while nxt is not None:
            oid, tid, data, nxt = cs.record_iternext(nxt)
            seen.append(oid)
        return new in seen, len(seen)
    runzeo, zodbd = both(fn)
    assert runzeo[0]
    assert zodbd == runzeo


def test_get_invalidations_empty_storage(both):
    """getInvalidations on a storage without transactions: runzeo's
    invalidation queue is empty (FileStorage.lastInvalidations gives
    nothing), so it answers None."""
    runzeo, zodbd = both(lambda cs: [cs._call('getInvalidations', t) for t in (z64, p64(1))],
                         source=False)
    assert zodbd == runzeo


def test_check_current_serial_missing_oid(both):
    """checkCurrentSerialInTransaction of an oid the storage does not have:
    FileStorage's checkCurrentSerialInTransaction loads it and raises
    POSKeyError(oid); zodbd answered a ReadConflictError, which
    transaction managers retry (a TransientError) instead of failing."""
    def fn(cs):
        t1 = commit(cs, [(p64(1), z64, MAPPING)])
        t = TransactionMetaData()
        cs.tpc_begin(t)
        cs.store(p64(1), t1, MAPPING, '', t)
        cs.checkCurrentSerialInTransaction(p64(9), t1, t)
        try:
            cs.tpc_vote(t)
        except Exception as e:
            cs.tpc_abort(t)
            return type(e).__name__, e.args
        cs.tpc_abort(t)
        return 'voted'
    runzeo, zodbd = both(fn, source=False)
    assert zodbd == runzeo


# Extensions as Python 2's ZODB pickled them (Data.fs files of Zope 2 /
# Plone 4 sites): str as SHORT_BINSTRING / BINSTRING (protocol 1) and as a
# quoted STRING (protocol 0), one of them not ASCII.
PY2_EXTENSIONS = [
    b'}q\x00U\x03fooq\x01U\x03barq\x02s.',
    b"(dp0\nS'user'\np1\nS'x\\xe9y'\np2\ns.",
    b'}q\x00(U\x01aK\x01U\x01bT\x04\x00\x00\x00abcdu.',
]


def test_python2_extension_strings(both):
    """ZODB/py reads a stored extension with encoding='ASCII',
    errors='bytes' (ZODB._compat.loads): a Python 2 str is a str when it is
    ASCII, else bytes. runzeo's history, undoLog and iterator give the
    client {'foo': 'bar'}; zodbd gave {b'foo': b'bar'} (bytes keys: the
    client's entry['foo'] fails, and a copyTransactionsFrom through ZEO
    rewrites the extension with bytes keys), and dropped the whole
    extension of the protocol-0 one ({})."""
    def make(path):
        fs = FileStorage(path, create=True)
        for i, ext in enumerate(PY2_EXTENSIONS):
            t = TransactionMetaData(b'u', b'd%d' % i, ext)
            fs.tpc_begin(t)
            fs.store(p64(i), z64, b'x', '', t)
            fs.tpc_vote(t)
            fs.tpc_finish(t)
        fs.close()
    std = ('id', 'time', 'size', 'user_name', 'description', 'tid')

    def fn(cs):
        return ([{k: v for k, v in cs.history(p64(i))[0].items() if k not in std}
                 for i in range(len(PY2_EXTENSIONS))],
                [{k: v for k, v in e.items() if k not in std} for e in cs.undoLog(0, 20)],
                [t.extension for t in cs.iterator()])
    runzeo, zodbd = both(fn, make=make)
    assert runzeo[2] == [{'foo': 'bar'}, {'user': b'x\xe9y'}, {'a': 1, 'b': 'abcd'}]
    assert zodbd == runzeo


def test_multiple_undo_errors(both):
    """An undo that fails for several objects lists every one of them in
    MultipleUndoErrors._errs, as runzeo does (zodbd listed the first)."""
    def fn(cs):
        oids = [p64(1), p64(2)]

        def rev(n):
            return (pickle.dumps((PersistentMapping, None), 3)
                    + pickle.dumps({'data': {'n': n}}, 3))
        first = commit(cs, [(oid, z64, rev(1)) for oid in oids])
        again = commit(cs, [(oid, first, rev(2)) for oid in oids])
        commit(cs, [(oid, again, rev(3)) for oid in oids])
        from ZODB.POSException import MultipleUndoErrors
        try:
            commit(cs, undos=[cs.undoLog(0, 3)[1]['id']])
        except MultipleUndoErrors as e:
            return sorted(oid for oid, _ in e._errs)
        return None
    runzeo, zodbd = both(fn, source=False)
    assert runzeo == [p64(1), p64(2)]
    assert zodbd == runzeo


def test_server_status_counters(both):
    """server_status's stores count deleteObject (and restorea) as runzeo's
    do, and active_txns the transactions in progress (it was always 0)."""
    def fn(cs):
        t = TransactionMetaData()
        cs.tpc_begin(t)
        cs.store(p64(1), z64, MAPPING, '', t)
        during = cs.server_status()['active_txns']
        cs.tpc_vote(t)
        tid = cs.tpc_finish(t)
        t = TransactionMetaData()
        cs.tpc_begin(t)
        cs.deleteObject(p64(1), tid, t)
        cs.tpc_vote(t)
        cs.tpc_finish(t)
        st = cs.server_status()
        return during, st['active_txns'], st['stores']
    runzeo, zodbd = both(fn, source=False)
    assert runzeo == (1, 0, 2)
    assert zodbd == runzeo


def test_iterator_errors(both):
    """An unknown iterator, and a record iterator asked of a transaction
    iterator that returned nothing yet, raise KeyError(iid) as runzeo's do
    (zodbd: KeyError('no such iterator'), ValueError)."""
    def fn(cs):
        out = []

        def call(*args):
            try:
                cs._call(*args)
                out.append('ok')
            except Exception as e:
                out.append((type(e).__name__, e.args))
        call('iterator_next', 999)
        call('iterator_record_next', 999)
        iid = cs._call('iterator_start', None, None)
        call('iterator_record_start', iid, z64)
        out.append(iid)
        return out
    runzeo, zodbd = both(fn)
    assert runzeo[0] == ('KeyError', (999,))
    assert zodbd == runzeo


def test_storage_transaction_error_args(both):
    """A store or a vote naming another transaction than the connection's
    raises StorageTransactionError(current id or None, id given), as
    runzeo's (zodbd's args were a message)."""
    def fn(cs):
        out = []
        for args in (('vote', 5), ('storea', z64, z64, b'x', 5)):
            try:
                cs._call(*args)  # (as a call: the error comes back)
                out.append('ok')
            except Exception as e:
                out.append((type(e).__name__, e.args))
        return out
    runzeo, zodbd = both(fn)
    assert runzeo[0] == ('StorageTransactionError', (None, 5))
    assert zodbd == runzeo
