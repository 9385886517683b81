"""Interoperability of zodbd's FileStorage writer with ZODB/py.

- `zodbd copy` of every fixture writes the same bytes as the fixture (which
  ZODB/py wrote), and ZODB/py reads the copy.
- A random workload with conflicts, deletions, read conflicts, undos and
  aborts, run by ZODB/py with explicit tids and replayed by zodbd
  (`zodbd debug-replay`), gives byte-identical Data.fs and .index files and
  the same outcome for every transaction.
- A random workload that zodbd runs itself (`zodbd debug-workload`, ~1000
  transactions): ZODB/py opens the file, fstest passes, and every
  iterator/history/loadBefore answer of ZODB/py equals zodbd's
  (`zodbd debug-answers`). Then ZODB/py writes to that file, zodbd reads it
  back and writes more, and ZODB/py reads that.
- Opening a damaged tail read-write: zodbd truncates exactly as ZODB/py does
  (and saves the same .tr0).
- The lock file excludes ZODB/py and zodbd from each other.
"""
import base64
import hashlib
import json
import logging
import os
import random
import struct
import time

import pytest
from ZODB.Connection import TransactionMetaData
from ZODB.FileStorage import FileStorage
from ZODB.POSException import (ConflictError, POSKeyError,
                               ReadConflictError, UndoError)
from ZODB.serialize import referencesf
from ZODB.utils import p64, u64

from testutil import fstest, read, zodbd

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTDATA = os.path.join(REPO, 'fs1', 'testdata')
VENV_PYTHON = os.path.join(REPO, '.venv', 'bin', 'python')
TIDMAX = (1 << 63) - 1


@pytest.fixture(scope='session')
def zodbd_bin(zodbd_test_bin):
    """This module's zodbd is the test build: it has the debug-* commands."""
    return zodbd_test_bin


def hx(tid):
    return tid.hex()


def sha1(b):
    return hashlib.sha1(b).hexdigest()


def py_answers(path):
    """What debug-answers prints, computed with ZODB/py's API."""
    st = FileStorage(path, read_only=True)
    try:
        a = {'last_tid': hx(st.lastTransaction()), 'len': len(st),
             'size': st.getSize(), 'txns': [], 'objects': {}}
        for t in st.iterator():
            recs = []
            for r in t:
                recs.append({
                    'oid': hx(r.oid), 'tid': hx(r.tid),
                    'data': None if r.data is None else sha1(r.data),
                    'data_txn': None if r.data_txn is None
                    else hx(r.data_txn),
                })
            a['txns'].append({
                'tid': hx(t.tid), 'status': t.status,
                'user': t.user.hex(), 'desc': t.description.hex(),
                'ext': t.extension_bytes.hex(), 'records': recs,
            })
        oids = sorted(st._index.keys())
        for oid in oids:
            hist = st.history(oid, size=1 << 30)
            o = {'history': [], 'load_before': {}}
            befores = [TIDMAX]
            for h in hist:
                o['history'].append({
                    'tid': hx(h['tid']), 'size': h['size'],
                    'user': h['user_name'].hex(),
                    'desc': h['description'].hex(),
                })
                befores += [u64(h['tid']), u64(h['tid']) + 1]
            for b in befores:
                key = '%016x' % b
                try:
                    r = st.loadBefore(oid, p64(b))
                except POSKeyError:
                    o['load_before'][key] = {'error': 'POSKeyError'}
                    continue
                if r is None:
                    o['load_before'][key] = None
                    continue
                data, serial, nxt = r
                ans = {'serial': hx(serial), 'data': sha1(data)}
                if nxt is not None:
                    ans['next'] = hx(nxt)
                o['load_before'][key] = ans
            a['objects'][hx(oid)] = o
        return a
    finally:
        st.close()


def go_answers(zodbd_bin, path):
    return json.loads(zodbd(zodbd_bin, 'debug-answers', path).stdout)


def check_same_answers(zodbd_bin, path):
    """Every answer of ZODB/py on path equals zodbd's."""
    py = py_answers(path)
    go = go_answers(zodbd_bin, path)
    # Compare piecewise for readable failures.
    for k in ('last_tid', 'len', 'size'):
        assert go[k] == py[k], k
    assert len(go['txns'] or []) == len(py['txns'])
    for g, p in zip(go['txns'] or [], py['txns']):
        assert g == p, 'transaction %s' % p['tid']
    assert sorted(go['objects']) == sorted(py['objects'])
    for oid in py['objects']:
        assert go['objects'][oid] == py['objects'][oid], 'oid ' + oid
    return py


# --- zodbd copy ---------------------------------------------------------

@pytest.mark.parametrize('name', ['1', '1packed', 'empty', 'torn'])
def test_copy_fixture(tmp_path, zodbd_bin, name):
    src = os.path.join(TESTDATA, name + '.fs')
    dst = str(tmp_path / (name + '.fs'))
    p = zodbd(zodbd_bin, 'copy', src, dst)
    assert 'copied' in p.stdout
    want = read(src)
    if name == 'torn':
        ro = FileStorage(src, read_only=True)
        want = want[:ro.getSize()]
        ro.close()
    assert read(dst) == want, 'copy differs from the file ZODB/py wrote'
    # zodbd's index, saved on close, is the one ZODB/py writes.
    if name != 'empty':
        assert read(dst + '.index') == read(src + '.index')
    fstest(dst)
    check_same_answers(zodbd_bin, dst)


def test_copy_refuses_nonempty_destination(tmp_path, zodbd_bin):
    src = os.path.join(TESTDATA, '1.fs')
    dst = str(tmp_path / 'd.fs')
    zodbd(zodbd_bin, 'copy', src, dst)
    p = zodbd(zodbd_bin, 'copy', src, dst, check=False)
    assert p.returncode == 1 and 'must be empty' in p.stderr, p.stderr


# --- replay: ZODB/py and zodbd write the same bytes ------------------------

def pickled(n, rnd):
    """Some data that is not a usable pickle (so that ZODB/py's conflict
    resolution gives up), of varied sizes and sometimes repeated."""
    if rnd.random() < 0.2:
        return b'same %d' % rnd.randrange(3)
    return bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 400)))


def make_replay(path, ntxn, seed):
    """Run a random workload on a new ZODB/py FileStorage at path with
    explicit tids; return the script for debug-replay and the outcomes."""
    rnd = random.Random(seed)
    logging.getLogger('ZODB.ConflictResolution').setLevel(logging.CRITICAL)
    st = FileStorage(path, create=True)
    script, outcomes = [], []
    committed = []
    tid = 0x03f58e0004444444
    try:
        for i in range(ntxn):
            tid += rnd.randrange(1, 1 << 24)
            ext = {'n': i} if rnd.random() < 0.3 else {}
            meta = TransactionMetaData(b'user%d' % rnd.randrange(3),
                                       b'txn %d' % i, ext)
            ops = []
            kind = rnd.random()
            if committed and kind < 0.15:
                for _ in range(rnd.choice([1, 1, 2])):
                    ops.append(['undo', hx(rnd.choice(committed[-12:]))])
            else:
                for _ in range(rnd.randrange(1, 6)):
                    oid = rnd.randrange(40)
                    try:
                        serial = st.getTid(p64(oid))
                        exists = True
                    except POSKeyError:
                        exists = False
                        serial = p64(0)
                        if p64(oid) in st._index:
                            # deleted / creation undone: the serial of
                            # the record without data
                            h = st._read_data_header(st._index[p64(oid)])
                            serial = h.tid
                    if exists and rnd.random() < 0.07:
                        serial = p64(u64(serial) - 1)  # stale
                    r = rnd.random()
                    if exists and r < 0.08:
                        ops.append(['delete', '%016x' % oid, hx(serial)])
                    elif exists and r < 0.14:
                        ops.append(['check', '%016x' % oid, hx(serial)])
                    elif r < 0.16:
                        ops.append(['delete', '%016x' % (100 + oid),
                                    hx(p64(0))])  # unknown oid
                    else:
                        ops.append(['store', '%016x' % oid, hx(serial),
                                    pickled(oid, rnd).hex()])
            abort = rnd.random() < 0.05
            script.append({'tid': '%016x' % tid, 'user': meta.user.hex(),
                           'desc': meta.description.hex(),
                           'ext': meta.extension_bytes.hex(), 'ops': ops,
                           'abort_after_vote': abort})
            outcomes.append(run_py_txn(st, meta, p64(tid), ops, abort,
                                       committed))
    finally:
        st.close()
    return script, outcomes


def run_py_txn(st, meta, tid, ops, abort, committed):
    st.tpc_begin(meta, tid)
    undone = []
    try:
        for op in ops:
            name = op[0]
            if name == 'store':
                st.store(bytes.fromhex(op[1]), bytes.fromhex(op[2]),
                         bytes.fromhex(op[3]), '', meta)
            elif name == 'delete':
                st.deleteObject(bytes.fromhex(op[1]), bytes.fromhex(op[2]),
                                meta)
            elif name == 'check':
                try:
                    st.checkCurrentSerialInTransaction(
                        bytes.fromhex(op[1]), bytes.fromhex(op[2]), meta)
                except POSKeyError:
                    raise ReadConflictError()
            elif name == 'undo':
                tid_b64 = base64.encodebytes(bytes.fromhex(op[1])).rstrip()
                _, oids = st.undo(tid_b64, meta)
                undone += [hx(o) for o in oids if hx(o) not in undone]
        st.tpc_vote(meta)
    except ReadConflictError:
        st.tpc_abort(meta)
        return {'result': 'readconflict'}
    except ConflictError:
        st.tpc_abort(meta)
        return {'result': 'conflict'}
    except UndoError:
        st.tpc_abort(meta)
        return {'result': 'undoerror'}
    except POSKeyError:
        st.tpc_abort(meta)
        return {'result': 'poskeyerror'}
    if abort:
        st.tpc_abort(meta)
        return {'result': 'aborted'}
    st.tpc_finish(meta)
    committed.append(tid)
    res = {'tid': hx(tid), 'result': 'ok'}
    if undone:
        res['undone'] = undone
    return res


def test_replay_is_byte_identical(tmp_path, zodbd_bin):
    py_path = str(tmp_path / 'py.fs')
    go_path = str(tmp_path / 'go.fs')
    script, outcomes = make_replay(py_path, 400, seed=7)
    kinds = {o['result'] for o in outcomes}
    assert {'ok', 'conflict', 'readconflict', 'undoerror', 'poskeyerror',
            'aborted'} <= kinds, kinds
    assert sum('undone' in o for o in outcomes) > 10
    spath = str(tmp_path / 'script.json')
    with open(spath, 'w') as f:
        json.dump({'txns': script}, f)
    got = json.loads(zodbd(zodbd_bin, 'debug-replay', spath, go_path).stdout)
    for i, (g, w) in enumerate(zip(got, outcomes)):
        if 'undone' in g:
            g['undone'] = sorted(g['undone'])
        if 'undone' in w:
            w['undone'] = sorted(w['undone'])
        assert g == w, 'transaction %d (%s)' % (i, script[i])
    assert len(got) == len(outcomes)
    assert read(go_path) == read(py_path)
    assert read(go_path + '.index') == read(py_path + '.index')
    fstest(go_path)


# --- a zodbd workload, read and extended by ZODB/py ------------------------

def py_commit_some(path, n, seed):
    """ZODB/py commits n transactions to path (new and changed objects and
    an undo of the last zodbd transaction)."""
    rnd = random.Random(seed)
    st = FileStorage(path)
    try:
        last = st.lastTransaction()
        new = u64(st.new_oid())
        for i in range(n):
            t = TransactionMetaData(b'py', b'py txn %d' % i)
            st.tpc_begin(t)
            for _ in range(rnd.randrange(1, 4)):
                if rnd.random() < 0.5:
                    oid = p64(new)
                    new += 1
                    serial = p64(0)
                else:
                    oid = p64(rnd.randrange(200))
                    try:
                        serial = st.getTid(oid)
                    except POSKeyError:
                        continue
                st.store(oid, serial, b'python data %d' % rnd.randrange(10**6),
                         '', t)
            st.tpc_vote(t)
            st.tpc_finish(t)
        # Undo the last zodbd transaction if possible.
        t = TransactionMetaData(b'py', b'undo')
        st.tpc_begin(t)
        try:
            st.undo(base64.encodebytes(last).rstrip(), t)
            st.tpc_vote(t)
            st.tpc_finish(t)
        except UndoError:
            st.tpc_abort(t)
    finally:
        st.close()


def test_workload_interop(tmp_path, zodbd_bin, caplog):
    path = str(tmp_path / 'Data.fs')
    summary = json.loads(zodbd(zodbd_bin, 'debug-workload', '-n', 1000,
                               '-seed', 3, path).stdout)
    for k in ('commits', 'conflicts', 'read_conflicts', 'undos',
              'undo_errors', 'deletes', 'aborts'):
        assert summary[k] > 0, summary
    fstest(path)
    # ZODB/py uses the index zodbd saved on close.
    caplog.set_level(logging.DEBUG, logger='ZODB.FileStorage')
    st = FileStorage(path, read_only=True)
    assert st._used_index == 1
    st.close()
    assert not [r for r in caplog.records if 'ndex' in r.getMessage()]
    a = check_same_answers(zodbd_bin, path)
    assert len(a['txns']) == summary['commits']

    # ZODB/py writes to the file zodbd wrote; zodbd reads it back.
    py_commit_some(path, 30, seed=1)
    fstest(path)
    check_same_answers(zodbd_bin, path)

    # zodbd writes more (using ZODB/py's index), ZODB/py reads it.
    zodbd(zodbd_bin, 'debug-workload', '-n', 200, '-seed', 4, path)
    fstest(path)
    check_same_answers(zodbd_bin, path)
    zodbd(zodbd_bin, 'reindex', '--verify', path)


def test_workload_with_online_packs(tmp_path, zodbd_bin):
    # Online packs run alongside the commits of the workload; ZODB/py
    # reads the result as zodbd does and can pack it further.
    path = str(tmp_path / 'Data.fs')
    summary = json.loads(zodbd(zodbd_bin, 'debug-workload', '-n', 1000,
                               '-seed', 5, '-pack-every', 150, path).stdout)
    assert summary['packs'] >= 3, summary
    assert summary['undos'] > 0 and summary['commits'] > 500, summary
    fstest(path)
    check_same_answers(zodbd_bin, path)
    st = FileStorage(path, pack_gc=False)  # the data are not pickles
    try:
        st.pack(time.time(), referencesf)
    finally:
        st.close()
    fstest(path)


# --- torn tails ----------------------------------------------------------

def tail_cases():
    one = read(os.path.join(TESTDATA, '1.fs'))
    # The last transaction of 1.fs in the checkpoint state.
    tl = struct.unpack('>Q', one[-8:])[0]
    last = len(one) - 8 - tl
    ckpt = bytearray(one)
    ckpt[last + 16] = ord('c')
    return {
        'torn': read(os.path.join(TESTDATA, 'torn.fs')),
        'checkpoint': bytes(ckpt),
        'partial-header': one + b'0123456789',
        'garbage': one + b'\0' * 100,
    }


@pytest.mark.parametrize('case', ['torn', 'checkpoint', 'partial-header',
                                  'garbage'])
def test_recovery_like_zodbpy(tmp_path, zodbd_bin, case):
    content = tail_cases()[case]
    (tmp_path / 'py').mkdir()
    (tmp_path / 'go').mkdir()
    py_path = str(tmp_path / 'py' / 'Data.fs')
    go_path = str(tmp_path / 'go' / 'Data.fs')
    for p in (py_path, go_path):
        with open(p, 'wb') as f:
            f.write(content)
    FileStorage(py_path).close()
    # A read-write open and close, committing nothing.
    zodbd(zodbd_bin, 'debug-workload', '-n', 0, go_path)
    assert read(go_path) == read(py_path)
    assert len(read(go_path)) < len(content)
    for tr in ('.tr0', '.tr1'):
        assert os.path.exists(go_path + tr) == os.path.exists(py_path + tr)
        if os.path.exists(py_path + tr):
            assert read(go_path + tr) == read(py_path + tr)
    assert read(go_path + '.index') == read(py_path + '.index')
    fstest(go_path)


# --- lock file -----------------------------------------------------------

def test_lock_excludes_zodbpy(tmp_path, zodbd_bin):
    path = str(tmp_path / 'Data.fs')
    zodbd(zodbd_bin, 'debug-workload', '-n', 5, path)
    st = FileStorage(path)  # holds Data.fs.lock
    try:
        p = zodbd(zodbd_bin, 'debug-workload', '-n', 1, path, check=False)
        assert p.returncode == 1
        assert 'locked by another process (pid %d)' % os.getpid() in p.stderr
        # Readers are not excluded.
        zodbd(zodbd_bin, 'info', path)
    finally:
        st.close()
    zodbd(zodbd_bin, 'debug-workload', '-n', 1, path)
    with open(path + '.lock') as f:
        content = f.read()
    assert content.strip().isdigit() and content.startswith(' ')
