"""Writes through zodbd serve with the stock ZEO client: commits, BTrees,
invalidations between clients, conflicts, undo, pack, restart. Files
written are checked with ZODB/py afterwards (fstest and reads)."""
import os
import signal
import threading
import time

import pytest
import transaction
import ZEO
from BTrees.Length import Length
from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping
from ZODB.FileStorage import FileStorage
from ZODB.POSException import ConflictError, ReadOnlyError

from testutil import fstest
from zeoserver import Server


def test_commit_and_read_back(serve, tmp_path):
    path = str(tmp_path / 'Data.fs')
    srv = serve(path, extra=['--create'])
    db = ZEO.DB(srv.addr, wait_timeout=10)
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    root = conn.root()
    root['tree'] = t = OOBTree()
    for i in range(2000):
        t['k%05d' % i] = i
    root['m'] = PersistentMapping(x=1)
    tm.get().note('many keys')
    tm.commit()
    root['m']['x'] = 2
    tm.commit()
    conn.close()
    db.close()
    # A second client sees it all.
    db = ZEO.DB(srv.addr, wait_timeout=10)
    conn = db.open()
    root = conn.root()
    assert len(root['tree']) == 2000 and root['tree']['k01999'] == 1999
    assert root['m']['x'] == 2
    conn.close()
    db.close()
    assert srv.stop() == 0
    # ZODB/py reads and verifies what zodbd wrote.
    fstest(path)
    fs = FileStorage(path, read_only=True)
    import ZODB
    db = ZODB.DB(fs)
    conn = db.open()
    assert len(conn.root()['tree']) == 2000
    assert [t.description for t in fs.iterator()][-2] == b'many keys'
    db.close()


def test_invalidations_between_clients(serve, tmp_path):
    srv = serve(str(tmp_path / 'Data.fs'), extra=['--create'])
    db1 = ZEO.DB(srv.addr, wait_timeout=10)
    db2 = ZEO.DB(srv.addr, wait_timeout=10)
    tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
    c1, c2 = db1.open(tm1), db2.open(tm2)
    for i in range(1, 20):
        c1.root()['x'] = i
        tm1.commit()
        deadline = time.time() + 10
        while True:
            tm2.begin()  # sync: processes invalidations
            if c2.root().get('x') == i:
                break
            assert time.time() < deadline, 'invalidation not received'
            time.sleep(0.01)
    db1.close()
    db2.close()


def test_conflicts(serve, tmp_path):
    srv = serve(str(tmp_path / 'Data.fs'), extra=['--create'])
    db = ZEO.DB(srv.addr, wait_timeout=10)
    tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
    c1, c2 = db.open(tm1), db.open(tm2)
    c1.root()['m'] = PersistentMapping()
    c1.root()['len'] = Length()
    tm1.commit()
    tm2.begin()
    # Unresolvable: the same PersistentMapping changed twice.
    c1.root()['m']['a'] = 1
    c2.root()['m']['a'] = 2
    tm1.commit()
    with pytest.raises(ConflictError):
        tm2.commit()
    tm2.abort()
    # Resolvable (BTrees.Length): the client resolves and votes again.
    c1.root()['len'].change(1)
    c2.root()['len'].change(10)
    tm1.commit()
    tm2.commit()
    tm1.begin()
    assert c1.root()['len']() == 11
    db.close()


def test_concurrent_committers(serve, tmp_path):
    path = str(tmp_path / 'Data.fs')
    srv = serve(path, extra=['--create'])
    db = ZEO.DB(srv.addr, wait_timeout=10)
    tm = transaction.TransactionManager()
    c = db.open(tm)
    c.root()['len'] = Length()
    for i in range(8):
        c.root()['m%d' % i] = PersistentMapping()
    tm.commit()
    c.close()
    errors = []

    def worker(i):
        try:
            tm = transaction.TransactionManager()
            conn = db.open(tm)
            for j in range(25):
                for attempt in range(20):
                    try:
                        conn.root()['m%d' % i][j] = j
                        conn.root()['len'].change(1)
                        tm.commit()
                        break
                    except ConflictError:
                        tm.abort()
                else:
                    errors.append('too many conflicts')
            conn.close()
        except Exception as e:  # noqa: B902
            errors.append(repr(e))
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    tm.begin()
    c = db.open(tm)
    assert c.root()['len']() == 200
    assert all(len(c.root()['m%d' % i]) == 25 for i in range(8))
    db.close()
    srv.stop()
    fstest(path)


def test_read_only_client(serve, tmp_path):
    srv = serve(str(tmp_path / 'Data.fs'), extra=['--create'])
    db = ZEO.DB(srv.addr, wait_timeout=10)
    db.close()
    db = ZEO.DB(srv.addr, read_only=True, wait_timeout=10)
    conn = db.open()
    conn.root()['x'] = 1
    with pytest.raises(ReadOnlyError):
        transaction.commit()
    transaction.abort()
    db.close()


def test_undo_through_client(serve, tmp_path):
    path = str(tmp_path / 'Data.fs')
    srv = serve(path, extra=['--create'])
    db = ZEO.DB(srv.addr, wait_timeout=10)
    tm = transaction.TransactionManager()
    c = db.open(tm)
    c.root()['m'] = m = PersistentMapping(v=1)
    tm.commit()
    m['v'] = 2
    tm.get().note('set v=2')
    tm.commit()
    log = db.undoLog(0, 10)
    assert log[0]['description'] == 'set v=2'
    db.undo(log[0]['id'], tm.get())
    tm.commit()
    tm.begin()
    assert c.root()['m']['v'] == 1
    db.close()
    srv.stop()
    fstest(path)


def test_pack_through_client(serve, tmp_path):
    path = str(tmp_path / 'Data.fs')
    srv = serve(path, extra=['--create'])
    db = ZEO.DB(srv.addr, wait_timeout=10)
    tm = transaction.TransactionManager()
    c = db.open(tm)
    c.root()['m'] = PersistentMapping(v=1)
    tm.commit()
    # Garbage, then pack: the garbage's records are gone, live data stays.
    c.root()['garbage'] = PersistentMapping(big='x' * 100000)
    tm.commit()
    del c.root()['garbage']
    tm.commit()
    size = db.storage.getSize()
    time.sleep(0.01)
    db.pack()
    tm.begin()
    assert c.root()['m']['v'] == 1
    assert db.storage.getSize() < size - 100000
    db.close()
    srv.stop()
    fstest(path)


def cached_client(addr, tmp_path):
    """A client with a persistent cache (client 'c1' in tmp_path/cache)
    that reconnects quickly: (db, transaction manager, connection)."""
    cache_dir = tmp_path / 'cache'
    cache_dir.mkdir()
    db = ZEO.DB(addr, client='c1', var=str(cache_dir), wait_timeout=20,
                min_disconnect_poll=0.1, max_disconnect_poll=0.5)
    tm = transaction.TransactionManager()
    return db, tm, db.open(tm)


def wait_reconnected(tm, cond):
    """Begins a transaction with tm until cond() holds (the client
    reconnected and saw the commits); fails after 20 s."""
    deadline = time.time() + 20
    while True:
        try:
            tm.begin()
            if cond():
                return
        except Exception:
            pass
        assert time.time() < deadline, 'client did not reconnect'
        time.sleep(0.1)


def test_client_survives_restart(serve, zodbd_bin, tmp_path, marshal):
    path = str(tmp_path / 'Data.fs')
    srv = serve(path, extra=['--create'])
    db, tm, c = cached_client(srv.addr, tmp_path)
    c.root()['x'] = 1
    tm.commit()
    srv.stop()
    srv2 = Server(zodbd_bin, path, tmp_path, msgpack=(marshal == 'M'), port=srv.port).start()
    try:
        # Another client commits after the restart.
        db2 = ZEO.DB(srv2.addr, wait_timeout=10)
        tm2 = transaction.TransactionManager()
        c2 = db2.open(tm2)
        c2.root()['x'] = 2
        tm2.commit()
        db2.close()
        # The first client reconnects, verifies its cache and sees x == 2.
        wait_reconnected(tm, lambda: c.root()['x'] == 2)
        db.close()
    finally:
        srv2.stop()


@pytest.mark.parametrize('age', [0, 3600])
def test_reconnect_older_than_queue(serve, zodbd_bin, tmp_path, marshal, age):
    """A client reconnects after more commits than the invalidation queue
    holds: without invalidation-age the server answers getInvalidations
    with None and the client drops its cache; with it, the server iterates
    the transactions since and the client keeps the rest of its cache."""
    path = str(tmp_path / 'Data.fs')
    srv = serve(path, extra=['--create'])
    db, tm, c = cached_client(srv.addr, tmp_path)
    root = c.root()
    root['x'] = PersistentMapping({'v': 1})
    root['z'] = PersistentMapping({'v': 'unchanged'})
    tm.commit()
    z_oid = root['z']._p_oid
    assert root['z']['v'] == 'unchanged'  # z is in the client cache
    assert db.storage._cache.load(z_oid) is not None
    srv.stop()
    extra = ['--invalidation-queue-size', '1', '--invalidation-age', str(age)]
    srv2 = Server(zodbd_bin, path, tmp_path, msgpack=(marshal == 'M'), port=srv.port, extra=extra).start()
    try:
        db2 = ZEO.DB(srv2.addr, wait_timeout=10)
        tm2 = transaction.TransactionManager()
        c2 = db2.open(tm2)
        for i in range(2, 5):  # three commits: the queue of 1 keeps the last
            c2.root()['x']['v'] = i
            tm2.commit()
        db2.close()
        wait_reconnected(tm, lambda: c.root()['x']['v'] == 4)
        kept = db.storage._cache.load(z_oid) is not None
        assert kept == bool(age), 'cache %s' % ('kept' if kept else 'dropped')
        assert c.root()['z']['v'] == 'unchanged'
        db.close()
    finally:
        srv2.stop()


def test_reconnect_to_seeded_queue(serve, zodbd_bin, tmp_path, marshal):
    """A client reconnects to a restarted server after commits it did not
    see, made through another server on the same file: the restarted
    server's invalidation queue holds them as seeded entries (tids only,
    their oids read when getInvalidations asks), and the client invalidates
    exactly what they changed and keeps the rest of its cache."""
    path = str(tmp_path / 'Data.fs')
    srv = serve(path, extra=['--create'])
    db, tm, c = cached_client(srv.addr, tmp_path)
    root = c.root()
    root['x'] = PersistentMapping({'v': 1})
    root['z'] = PersistentMapping({'v': 'unchanged'})
    tm.commit()
    x_oid, z_oid = root['x']._p_oid, root['z']._p_oid
    assert root['z']['v'] == 'unchanged'
    srv.stop()
    # Commits the client does not see: through a server on another port.
    other = Server(zodbd_bin, path, tmp_path, msgpack=(marshal == 'M')).start()
    try:
        db2 = ZEO.DB(other.addr, wait_timeout=10)
        tm2 = transaction.TransactionManager()
        c2 = db2.open(tm2)
        for i in range(2, 5):
            c2.root()['x']['v'] = i
            tm2.commit()
        db2.close()
    finally:
        other.stop()
    srv2 = Server(zodbd_bin, path, tmp_path, msgpack=(marshal == 'M'), port=srv.port).start()
    try:
        wait_reconnected(tm, lambda: c.root()['x']['v'] == 4)
        assert db.storage._cache.load(z_oid) is not None, 'cache dropped'
        assert c.root()['z']['v'] == 'unchanged'
        assert x_oid != z_oid
        db.close()
    finally:
        srv2.stop()


def test_delete_with_stale_serial_is_a_conflict(serve, tmp_path):
    # deleteObject (IExternalGC) with a stale serial fails the vote with a
    # ConflictError, as with runzeo: the client cannot resolve a delete.
    from ZODB.Connection import TransactionMetaData
    path = str(tmp_path / 'Data.fs')
    srv = serve(path, extra=['--create'])
    db = ZEO.DB(srv.addr, wait_timeout=10)
    tm = transaction.TransactionManager()
    c = db.open(tm)
    c.root()['x'] = PersistentMapping()
    tm.commit()
    oid, stale = c.root()['x']._p_oid, c.root()['x']._p_serial
    c.root()['x']['k'] = 1
    tm.commit()
    st = db.storage
    t = TransactionMetaData()
    st.tpc_begin(t)
    st.deleteObject(oid, stale, t)
    with pytest.raises(ConflictError):
        st.tpc_vote(t)
    st.tpc_abort(t)
    # The current serial works.
    t = TransactionMetaData()
    st.tpc_begin(t)
    st.deleteObject(oid, c.root()['x']._p_serial, t)
    st.tpc_vote(t)
    st.tpc_finish(t)
    db.close()
    srv.stop()
    fstest(path)


def test_go_committers(serve, tmp_path, zodbd_bin, marshal):
    """`zodbd wrk --commit` (the Go client's commit path) against zodbd
    serve: no failed commit, and ZODB/py reads every object it wrote."""
    import json
    import subprocess
    import ZODB
    path = str(tmp_path / 'Data.fs')
    srv = serve(path, extra=['--create'])
    db = ZEO.DB(srv.addr, wait_timeout=10)  # creates the root
    db.close()
    url = 'zeo://%s:%d' % srv.addr
    p = subprocess.run([zodbd_bin, 'wrk', '--commit', '-c', '4', '-d', '0.5s', '--objects', '5',
                        '--size', '64', '--json', url], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r['workload'] == 'commits' and r['errors'] == 0 and r['ops'] > 0, r
    assert r['benchfmt'].startswith('BenchmarkZwrkCommit/zeo/c=4\t')
    assert srv.stop() == 0
    fstest(path)
    fs = FileStorage(path, read_only=True)
    db = ZODB.DB(fs)
    try:
        conn = db.open()
        written, txns = set(), 0
        for i, t in enumerate(fs.iterator()):
            if i == 0:
                continue  # the root's creation
            txns += 1
            for rec in t:
                written.add(rec.oid)
        assert txns == 4 + r['ops']  # one setup transaction per committer
        assert len(written) == 4 * 5
        for oid in written:
            m = conn.get(oid)
            assert isinstance(m, PersistentMapping) and len(m['v']) == 64
    finally:
        db.close()


def test_killed_during_big_vote(zodbd_bin, tmp_path):
    """SIGKILL while the vote of a 128 MiB transaction is writing its
    record in parts: the restarted server cuts the partial record off
    (saved in Data.fs.tr0, as ZODB/py does), keeps every transaction
    committed before, and commits again; ZODB/py's fstest accepts the
    file. Tried until the kill lands inside the vote (the record's parts
    are written within a few hundred milliseconds)."""
    for attempt in range(5):
        d = tmp_path / ('try%d' % attempt)
        d.mkdir()
        path = str(d / 'Data.fs')
        srv = Server(zodbd_bin, path, d, extra=['--create']).start()
        try:
            db = ZEO.DB(srv.addr, wait_timeout=10)
            tm = transaction.TransactionManager()
            c = db.open(tm)
            c.root()['x'] = 1
            tm.commit()
            db.close()
            size0 = os.path.getsize(path)
            big = [os.urandom(4 << 20) for _ in range(4)]

            def commit_big():
                try:
                    db = ZEO.DB(srv.addr, wait_timeout=10)
                    tm = transaction.TransactionManager()
                    c = db.open(tm)
                    for i in range(32):
                        c.root()['big%d' % i] = PersistentMapping(d=big[i % 4])
                    tm.commit()
                except Exception:
                    pass  # the server is killed under it
            t = threading.Thread(target=commit_big, daemon=True)
            t.start()
            deadline = time.time() + 60
            while os.path.getsize(path) < size0 + (8 << 20) and time.time() < deadline and t.is_alive():
                pass
            os.kill(srv.proc.pid, signal.SIGKILL)
            at_kill = os.path.getsize(path)
            srv.proc.wait()
            t.join(30)
        finally:
            srv.stop()
        if not size0 + (8 << 20) <= at_kill < size0 + (128 << 20):
            continue  # the kill missed the vote: again
        srv = Server(zodbd_bin, path, d).start()
        try:
            db = ZEO.DB(srv.addr, wait_timeout=10)
            tm = transaction.TransactionManager()
            c = db.open(tm)
            assert c.root()['x'] == 1
            assert 'big0' not in c.root()
            c.root()['x'] = 2
            tm.commit()
            db.close()
        finally:
            srv.stop()
        # The partial record went to Data.fs.tr0: what the kill left of it.
        assert at_kill - size0 >= os.path.getsize(path + '.tr0') >= 8 << 20
        print('killed in the vote at try %d, %d MiB of the record written' % (attempt, (at_kill - size0) >> 20))
        fs = FileStorage(path, read_only=True)
        fs.close()
        fstest(path)
        return
    pytest.fail('the kill never landed inside the vote in 5 tries')
