"""`zodbd pack` against ZODB/py's FileStorage.pack.

A database is built with ZODB/py: many revisions of many objects, a BTree
big enough to have several buckets, objects that become garbage, undo (which
writes backpointers, chains of them, and an undone creation), a
deleteObject, and undos after the pack time of transactions before it (so
that revisions that are not current at the pack time must be kept). Copies
are packed at the same pack time by ZODB/py (`FileStorage.pack(t,
referencesf)`, pack-gc true and false) and by `zodbd pack --tid/--time`.

- The two packed files are byte-identical, and so are their .index files.
- Both pass fstest; ZODB/py opens both and finds the same objects, the same
  current data and the same loadBefore answers at every tid after the pack
  time.
- ZODB/py commits to zodbd's packed file and reads it back.
- The benchmark datasets too: same bytes as ZODB/py's pack.

Where ZODB/py's pack is wrong or fails, zodbd deliberately differs
(docs/tools.md): a revision kept for a backpointer after the pack time keeps
what it refers to, and pack-gc false handles backpointers to revisions that
were not current at the pack time.
"""
import base64
import os
import shutil

import pytest
import transaction
from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping
from ZODB import DB
from ZODB.Connection import TransactionMetaData
from ZODB.FileStorage import FileStorage
from ZODB.POSException import POSKeyError
from ZODB.utils import p64, u64

from packutil import pack_time_between, py_pack, reachable, tids_of
from testutil import fstest, read, zodbd

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Scenario:
    """Builds a database with ZODB/py; `mark` names the last transaction
    before the pack time."""

    def __init__(self, path):
        self.path = path
        self.storage = FileStorage(path)
        self.db = DB(self.storage)
        self.tm = transaction.TransactionManager()
        self.conn = self.db.open(self.tm)
        self.root = self.conn.root()
        self.marks = {}

    def commit(self, note):
        self.tm.get().note(note)
        self.tm.commit()
        return self.storage.lastTransaction()

    def undo(self, tid, note):
        # FileStorage's undo ids are the base64 of the tid (undoLog's 'id').
        self.db.undo(base64.encodebytes(tid)[:-1], self.tm.get())
        return self.commit(note)

    def delete(self, oid):
        """deleteObject: a record without data (IExternalGC)."""
        st = self.storage
        _, serial = st.load(oid)
        t = TransactionMetaData(description='deleteObject %s' % u64(oid))
        st.tpc_begin(t)
        st.deleteObject(oid, serial, t)
        st.tpc_vote(t)
        st.tpc_finish(t)
        return st.lastTransaction()

    def close(self):
        self.conn.close()
        self.db.close()


def build_main(path):
    s = Scenario(path)
    root = s.root
    root['tree'] = OOBTree()
    root['m'] = PersistentMapping()
    root['w'] = PersistentMapping(v=0)
    s.commit('init')
    tree = root['tree']
    for i in range(80):
        tree['k%03d' % i] = PersistentMapping(v=i, blob=b'x' * (i * 13))
    s.commit('80 objects in a BTree (several buckets)')
    for r in range(25):
        for i in range(r, 80, 7):
            tree['k%03d' % i]['v'] = (r, i)
        root['m']['r%d' % (r % 5)] = r
        s.commit('revision %d' % r)
    # Garbage: a chain of objects that the root stops referring to.
    root['g'] = PersistentMapping(child=PersistentMapping(n=1))
    root['g']['child']['grand'] = PersistentMapping(n=2)
    s.commit('garbage to be')
    del root['g']
    s.commit('garbage')
    # Undo of a change, and an undo of that undo (a backpointer chain).
    root['m']['undone'] = 1
    t_change = s.commit('change of m, undone next')
    t_undo = s.undo(t_change, 'undo: m back to its previous revision')
    s.undo(t_undo, 'undo the undo: m forward again (chain)')
    # Undo of an object's creation: a record without data.
    root['u'] = PersistentMapping(x=1)
    t_create = s.commit('create u')
    s.undo(t_create, 'undo the creation of u')
    # A deleted object (deleteObject) that nothing refers to.
    root['d'] = PersistentMapping(x=1)
    s.commit('create d')
    d_oid = root['d']._p_oid
    del root['d']
    s.commit('drop d')
    s.delete(d_oid)
    # w is changed before the pack time and that change is undone after it.
    root['w']['v'] = 1
    root['w']['ref'] = PersistentMapping(only_in_old_w=True)
    s.commit('w changed (revision kept only for the undo below)')
    root['w']['v'] = 2
    del root['w']['ref']
    t_w = s.commit('w changed again, to be undone after the pack time')
    s.marks['pack'] = s.storage.lastTransaction()
    # After the pack time: more history, undos into the packed part.
    for r in range(10):
        tree['k%03d' % (r * 3)]['v'] = ('after', r)
        s.commit('after the pack time %d' % r)
    s.undo(t_w, 'undo, after the pack time, of a change before it')
    root['late'] = PersistentMapping(x=PersistentMapping())
    s.commit('new objects after the pack time')
    for i in range(0, 80, 2):
        del tree['k%03d' % i]
    s.commit('half the tree removed')
    s.close()
    return s.marks['pack']


@pytest.fixture(scope='module')
def main_db(tmp_path_factory):
    d = tmp_path_factory.mktemp('main')
    path = str(d / 'Data.fs')
    last_before = build_main(path)
    tids = tids_of(path)
    after = tids[tids.index(last_before) + 1]
    return path, last_before, after, tids


def copy(src, dst):
    shutil.copyfile(src, dst)
    return dst


def answers(path, tids_after):
    """What ZODB/py reads from a file: every oid's current data and serial
    (or POSKeyError), and its loadBefore answer at every tid in tids_after."""
    st = FileStorage(path, read_only=True)
    try:
        oids = set()
        for t in st.iterator():
            for r in t:
                oids.add(r.oid)
        out = {}
        for oid in sorted(oids):
            try:
                cur = st.load(oid)
            except POSKeyError:
                cur = 'POSKeyError'
            lb = []
            for tid in tids_after:
                try:
                    lb.append(st.loadBefore(oid, p64(u64(tid) + 1)))
                except POSKeyError:
                    lb.append('POSKeyError')
            out[oid] = (cur, lb)
        return len(st), out
    finally:
        st.close()


@pytest.mark.parametrize('how', ['tid', 'time'])
def test_pack_same_bytes_as_zodbpy(tmp_path, zodbd_bin, main_db, how):
    src, last_before, after, tids = main_db
    t, stop = pack_time_between(last_before, after)
    ours = copy(src, str(tmp_path / 'ours.fs'))
    theirs = copy(src, str(tmp_path / 'theirs.fs'))
    py_pack(theirs, t)
    if how == 'tid':
        zodbd(zodbd_bin, 'pack', '--tid', stop.hex(), ours)
    else:
        zodbd(zodbd_bin, 'pack', '--time', repr(t), ours)
    assert read(ours + '.old') == read(src)
    assert len(read(ours)) < len(read(src))
    assert read(ours) == read(theirs)
    assert read(ours + '.index') == read(theirs + '.index')
    fstest(ours)


def test_pack_answers_like_zodbpy(tmp_path, zodbd_bin, main_db):
    """Compared through ZODB/py's API rather than bytes, and then ZODB/py
    writes to zodbd's packed file."""
    src, last_before, after, tids = main_db
    t, stop = pack_time_between(last_before, after)
    ours = copy(src, str(tmp_path / 'ours.fs'))
    theirs = copy(src, str(tmp_path / 'theirs.fs'))
    py_pack(theirs, t)
    zodbd(zodbd_bin, 'pack', '--tid', stop.hex(), ours)
    fstest(ours)
    fstest(theirs)
    tids_after = [stop] + [x for x in tids if x > stop]
    assert answers(ours, tids_after) == answers(theirs, tids_after)
    # The packed file answers like the original after the pack time for
    # the objects reachable then.
    n, orig = answers(src, tids_after)
    _, packed = answers(ours, tids_after)
    for oid in reachable(src, p64(u64(tids[-1]))):
        assert packed[oid] == orig[oid]

    # ZODB/py writes to it.
    st = FileStorage(ours)
    db = DB(st)
    with db.transaction() as conn:
        conn.root()['after_pack'] = PersistentMapping(ok=True)
        conn.root()['tree']['k001']['v'] = 'written by ZODB/py'
    db.close()
    fstest(ours)
    st = FileStorage(ours, read_only=True)
    db = DB(st)
    with db.transaction() as conn:
        assert conn.root()['after_pack']['ok'] is True
        assert conn.root()['tree']['k001']['v'] == 'written by ZODB/py'
        assert conn.root()['w']['v'] == 1
        assert conn.root()['w']['ref']['only_in_old_w'] is True
    db.close()


def present(ans):
    """answers() less the objects that have no data in any state asked."""
    return {oid: a for oid, a in ans.items()
            if a[0] != 'POSKeyError' or any(x not in (None, 'POSKeyError')
                                             for x in a[1])}


def test_pack_times(tmp_path, zodbd_bin, main_db):
    """Every 9th transaction boundary: same bytes as ZODB/py, or both leave
    the file as it is."""
    src, _, _, tids = main_db
    packs_alike(tmp_path, zodbd_bin, src, tids, 9)


def packs_alike(tmp_path, zodbd_bin, src, tids, step):
    """Packs copies of src at every step-th boundary between the
    transactions tids, with ZODB/py and with zodbd: the same bytes, or
    both leave the file as it is."""
    for i in range(0, len(tids) - 1, step):
        t, stop = pack_time_between(tids[i], tids[i + 1])
        ours = copy(src, str(tmp_path / ('ours%d.fs' % i)))
        theirs = copy(src, str(tmp_path / ('theirs%d.fs' % i)))
        py_pack(theirs, t)
        zodbd(zodbd_bin, 'pack', '--tid', stop.hex(), ours)
        assert read(ours) == read(theirs), 'pack at %s' % stop.hex()
        assert os.path.exists(ours + '.old') == os.path.exists(theirs + '.old')


def test_repack_is_noop(tmp_path, zodbd_bin, main_db):
    src, last_before, after, tids = main_db
    t, stop = pack_time_between(last_before, after)
    ours = copy(src, str(tmp_path / 'ours.fs'))
    zodbd(zodbd_bin, 'pack', '--tid', stop.hex(), ours)
    packed = read(ours)
    os.remove(ours + '.old')
    p = zodbd(zodbd_bin, 'pack', '--tid', stop.hex(), ours)
    assert 'not packed' in p.stdout
    assert read(ours) == packed
    assert not os.path.exists(ours + '.old')
    # ZODB/py agrees that there is nothing to do.
    py_pack(ours, t)
    assert read(ours) == packed


def test_pack_packed_file(tmp_path, zodbd_bin, main_db):
    """A file packed by ZODB/py, packed again at earlier times (a redundant
    pack: both leave it alone) and at later ones: the same bytes."""
    src, last_before, after, tids = main_db
    t, stop = pack_time_between(last_before, after)
    packed = copy(src, str(tmp_path / 'packed.fs'))
    py_pack(packed, t)
    packs_alike(tmp_path, zodbd_bin, packed, tids_of(packed), 5)


def test_no_gc(tmp_path, zodbd_bin, main_db):
    """pack-gc false. The main scenario undoes, after the pack time, a
    change made before it: ZODB/py's pack then fails (it keeps only the
    current revisions before the pack time, and cannot copy the
    backpointer). zodbd keeps the revision the backpointer needs. Packed at
    a time before that change, both give the same bytes."""
    src, last_before, after, tids = main_db
    t, stop = pack_time_between(last_before, after)
    ours = copy(src, str(tmp_path / 'ours.fs'))
    theirs = copy(src, str(tmp_path / 'theirs.fs'))
    with pytest.raises(Exception):
        py_pack(theirs, t, gc=False)
    zodbd(zodbd_bin, 'pack', '--no-gc', '--tid', stop.hex(), ours)
    fstest(ours)
    tids_after = [stop] + [x for x in tids if x > stop]
    _, orig = answers(src, tids_after)
    _, packed = answers(ours, tids_after)
    # Without GC every object answers the same (objects without data at
    # and after the pack time are gone: they answer POSKeyError).
    assert present(packed) == present(orig)

    i = len(tids) // 3
    t, stop = pack_time_between(tids[i], tids[i + 1])
    ours = copy(src, str(tmp_path / 'ours2.fs'))
    theirs = copy(src, str(tmp_path / 'theirs2.fs'))
    py_pack(theirs, t, gc=False)
    zodbd(zodbd_bin, 'pack', '--no-gc', '--tid', stop.hex(), ours)
    assert read(ours) == read(theirs)
    assert read(ours + '.index') == read(theirs + '.index')


def test_zodbpy_loses_what_an_undone_revision_refers_to(tmp_path, zodbd_bin):
    """A revision kept only because a backpointer after the pack time
    points to it, of an object that is not reachable at the pack time: ZODB/py
    keeps the revision but not the objects it refers to, so that after the
    pack the database refers to an object that is gone. zodbd keeps them."""
    path = str(tmp_path / 'Data.fs')
    s = Scenario(path)
    s.root['a'] = PersistentMapping(b=PersistentMapping(n=1))
    s.commit('a -> b')
    del s.root['a']['b']
    t2 = s.commit('a drops b')
    del s.root['a']
    t3 = s.commit('root drops a')
    s.undo(t2, 'undo: a -> b again (backpointer to a before the pack time)')
    s.undo(t3, 'undo: root -> a again')
    s.close()
    tids = tids_of(path)
    t, stop = pack_time_between(t3, tids[tids.index(t3) + 1])
    ours = copy(path, str(tmp_path / 'ours.fs'))
    theirs = copy(path, str(tmp_path / 'theirs.fs'))
    py_pack(theirs, t)
    zodbd(zodbd_bin, 'pack', '--tid', stop.hex(), ours)
    fstest(ours)
    fstest(theirs)

    def b_value(p):
        st = FileStorage(p, read_only=True)
        db = DB(st)
        try:
            with db.transaction() as conn:
                return conn.root()['a']['b']['n']
        finally:
            db.close()
    assert b_value(path) == 1
    assert b_value(ours) == 1
    with pytest.raises(POSKeyError):
        b_value(theirs)


@pytest.mark.parametrize('gc', [True, False])
def test_datasets_same_bytes(tmp_path, zodbd_bin, gc, dataset):
    for src in map(dataset, ('prod1-1024', 'wczblk1-8')):
        tids = tids_of(src)
        i = len(tids) // 2
        t, stop = pack_time_between(tids[i], tids[i + 1])
        ours = copy(src, str(tmp_path / 'ours.fs'))
        theirs = copy(src, str(tmp_path / 'theirs.fs'))
        py_pack(theirs, t, gc=gc)
        args = ['pack', '--tid', stop.hex(), ours]
        if not gc:
            args.insert(1, '--no-gc')
        zodbd(zodbd_bin, *args)
        assert read(ours) == read(theirs), src
        assert read(ours + '.index') == read(theirs + '.index'), src
        for p in (ours, theirs):
            for ext in ('', '.index', '.old', '.lock'):
                if os.path.exists(p + ext):
                    os.remove(p + ext)


def test_locked(tmp_path, zodbd_bin, main_db):
    """A storage open for writing (by ZODB/py here) is not packed."""
    src = main_db[0]
    path = copy(src, str(tmp_path / 'Data.fs'))
    st = FileStorage(path)
    try:
        p = zodbd(zodbd_bin, 'pack', path, check=False)
        assert p.returncode == 1
        assert 'locked' in p.stderr
    finally:
        st.close()
    assert read(path) == read(src)
    assert not os.path.exists(path + '.pack')
