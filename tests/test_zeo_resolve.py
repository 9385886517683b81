"""Conflict resolution in the server, with the stock client.

zodbd resolves conflicts of BTrees.Length and of the BTrees buckets in the
server (zodb/resolve), as runzeo does by calling _p_resolveConflict: the
client then never resolves them itself. Undo of a transaction whose objects
were changed later is resolved the same way. `client-conflict-resolution
true` leaves every conflict to the client, as runzeo does with it.

Each test runs against zodbd and, as the reference, runzeo.
"""
import pytest
import transaction
import ZEO
import ZEO.ClientStorage
import ZODB.ConflictResolution
from BTrees.Length import Length
from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping
from ZODB.POSException import UndoError

from zeoserver import Server

KINDS = ['zodbd', 'runzeo']


def start(zodbd_bin, tmp_path, kind, client_resolution=False):
    port = None
    conf = None
    if client_resolution:
        from zeoserver import free_port
        port = free_port()
        conf = ('<zeo>\n  address 127.0.0.1:%d\n  client-conflict-resolution true\n</zeo>\n'
                '<filestorage>\n  path %s\n</filestorage>\n' % (port, tmp_path / 'Data.fs'))
    return Server(zodbd_bin, str(tmp_path / 'Data.fs'), tmp_path, kind=kind,
                  conf=conf, port=port).start()


@pytest.fixture
def client_resolutions(monkeypatch):
    """Counts the conflicts this process's clients resolve themselves."""
    calls = []
    orig = ZODB.ConflictResolution.tryToResolveConflict

    def counting(self, *args, **kw):
        calls.append(args[0])
        return orig(self, *args, **kw)
    monkeypatch.setattr(ZEO.ClientStorage.ClientStorage, 'tryToResolveConflict', counting)
    return calls


def conflicting_commits(db):
    """Two connections change the same Length and OOBTree bucket from the
    same state; both commits go through."""
    tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
    c1, c2 = db.open(tm1), db.open(tm2)
    r1, r2 = c1.root(), c2.root()
    r1['len'].change(1)
    r1['tree']['a'] = 1
    r2['len'].change(10)
    r2['tree']['b'] = 2
    tm1.commit()
    tm2.commit()  # conflicts on both objects: resolved
    c1.close()
    c2.close()


def setup_db(db):
    with db.transaction() as c:
        c.root()['len'] = Length()
        # Not empty: BTrees resolves only trees of one bucket, and an
        # empty tree has none; nor does it resolve a delete of the first
        # key of a bucket, so undo changes values.
        c.root()['tree'] = OOBTree({'a': 0, 'b': 0, 'z': 0})
        c.root()['map'] = PersistentMapping()


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('client_resolution,resolved_by_client',
                         [(False, 0), (True, 2)], ids=['server', 'client'])
def test_conflicts_resolved(zodbd_bin, tmp_path, kind, client_resolution,
                            resolved_by_client, client_resolutions):
    """By default the server resolves both conflicts (the client never has
    to); with client-conflict-resolution true the client resolves both."""
    srv = start(zodbd_bin, tmp_path, kind, client_resolution=client_resolution)
    try:
        db = ZEO.DB(srv.addr)
        setup_db(db)
        conflicting_commits(db)
        with db.transaction() as c:
            assert c.root()['len']() == 11
            assert dict(c.root()['tree']) == {'a': 1, 'b': 2, 'z': 0}
        db.close()
    finally:
        srv.stop()
    assert len(client_resolutions) == resolved_by_client


def undo_id(db, note):
    log = db.undoLog(0, 10)
    ids = [d['id'] for d in log if d['description'] in (note, note.encode())]
    assert len(ids) == 1, log
    return ids[0]


def undo(db, tid):
    try:
        db.undo(tid)
        transaction.commit()
    except BaseException:
        transaction.abort()
        raise


@pytest.mark.parametrize('kind', KINDS)
def test_undo_resolved(zodbd_bin, tmp_path, kind):
    """Undo of a transaction whose Length and tree were changed later."""
    srv = start(zodbd_bin, tmp_path, kind)
    try:
        db = ZEO.DB(srv.addr)
        setup_db(db)
        with db.transaction('first') as c:
            c.root()['len'].change(5)
            c.root()['tree']['a'] = 1
        with db.transaction('second') as c:
            c.root()['len'].change(10)
            c.root()['tree']['b'] = 2
        first = undo_id(db, 'first')
        undo(db, first)
        with db.transaction() as c:
            assert c.root()['len']() == 10
            assert dict(c.root()['tree']) == {'a': 0, 'b': 2, 'z': 0}
        db.close()
    finally:
        srv.stop()


@pytest.mark.parametrize('kind', KINDS)
def test_undo_unresolvable(zodbd_bin, tmp_path, kind):
    """A PersistentMapping has no conflict resolution: undoing a change
    that was changed again later is an UndoError, and nothing changes."""
    srv = start(zodbd_bin, tmp_path, kind)
    try:
        db = ZEO.DB(srv.addr)
        setup_db(db)
        with db.transaction('first') as c:
            c.root()['map']['x'] = 1
            c.root()['len'].change(5)
        with db.transaction('second') as c:
            c.root()['map']['x'] = 2
            c.root()['len'].change(10)
        first = undo_id(db, 'first')
        with pytest.raises(UndoError):
            undo(db, first)
        with db.transaction() as c:
            assert c.root()['len']() == 15
            assert dict(c.root()['map']) == {'x': 2}
        db.close()
    finally:
        srv.stop()


@pytest.mark.parametrize('kind', KINDS)
def test_undo_with_client_resolution(zodbd_bin, tmp_path, kind):
    """With client-conflict-resolution the server resolves nothing: an
    undo of a Length changed later is an UndoError (runzeo's too)."""
    srv = start(zodbd_bin, tmp_path, kind, client_resolution=True)
    try:
        db = ZEO.DB(srv.addr)
        setup_db(db)
        with db.transaction('first') as c:
            c.root()['len'].change(5)
        with db.transaction('second') as c:
            c.root()['len'].change(10)
        first = undo_id(db, 'first')
        with pytest.raises(UndoError):
            undo(db, first)
        db.close()
    finally:
        srv.stop()
