"""Oids prefetched by a stock ZEO client stay unique across a server crash.

ClientStorage keeps the oids it got with new_oids across a reconnect. A
server that starts again above the largest stored oid (runzeo: ZODB/py's
FileStorage) hands them out again to another client, and the two clients
create different objects with one oid. zodbd serve keeps an oid mark beside
the file (Data.fs.oid), fsynced before it hands out oids past it.
"""
import signal
import time

import pytest
import transaction
import ZEO
from persistent.mapping import PersistentMapping
from ZODB.utils import u64

from testutil import fstest
from zeoserver import Server

N = 20


def wait_connected(db, timeout=20):
    deadline = time.time() + timeout
    while not db.storage.is_connected():
        assert time.time() < deadline, 'client did not reconnect'
        time.sleep(0.05)


@pytest.mark.parametrize('kind', [
    'zodbd',
    pytest.param('runzeo', marks=pytest.mark.xfail(
        strict=True, reason='runzeo hands prefetched oids out again')),
])
def test_prefetched_oids_survive_server_kill(zodbd_bin, tmp_path, marshal, kind):
    path = str(tmp_path / 'Data.fs')
    msgpack = marshal == 'M'
    extra = ['--create'] if kind == 'zodbd' else []
    srv = Server(zodbd_bin, path, tmp_path, kind=kind, msgpack=msgpack,
                 extra=extra).start()
    srv2 = None
    db1 = db2 = db3 = None
    try:
        # Client 1 creates its container: its first new_oid prefetches a
        # batch of oids, of which it keeps the rest.
        db1 = ZEO.DB(srv.addr, wait_timeout=20, min_disconnect_poll=0.1,
                     max_disconnect_poll=0.5)
        tm1 = transaction.TransactionManager()
        c1 = db1.open(tm1)
        c1.root()['c1'] = PersistentMapping()
        tm1.commit()
        held = list(db1.storage._oids)
        assert len(held) >= N, 'the client prefetched no oids'

        # The server dies with those oids handed out but not stored.
        srv.stop(signal.SIGKILL)
        srv2 = Server(zodbd_bin, path, tmp_path, kind=kind, msgpack=msgpack,
                      port=srv.port).start()

        # Client 2 connects to the restarted server and creates objects.
        db2 = ZEO.DB(srv2.addr, wait_timeout=20)
        tm2 = transaction.TransactionManager()
        c2 = db2.open(tm2)
        objs2 = [PersistentMapping(data='c2-%d' % i) for i in range(N)]
        c2.root()['c2'] = PersistentMapping(
            {'%d' % i: o for i, o in enumerate(objs2)})
        tm2.commit()
        oids2 = {o._p_oid for o in objs2}

        # Client 1 reconnects and creates objects with the oids it held.
        wait_connected(db1)
        tm1.begin()
        objs1 = [PersistentMapping(data='c1-%d' % i) for i in range(N)]
        for i, o in enumerate(objs1):
            c1.root()['c1']['%d' % i] = o
        tm1.commit()
        oids1 = {o._p_oid for o in objs1}
        assert oids1 <= set(held), 'client 1 did not use its prefetched oids'
        assert not oids1 & oids2, sorted(u64(o) for o in oids1 & oids2)

        # A third client reads every object with its own data.
        db3 = ZEO.DB(srv2.addr, wait_timeout=20)
        root = db3.open().root()
        for who in ('c1', 'c2'):
            for i in range(N):
                assert root[who]['%d' % i]['data'] == '%s-%d' % (who, i)
    finally:
        for db in (db3, db2, db1):
            if db is not None:
                db.close()
        if srv2 is not None:
            assert srv2.stop() == 0, srv2.output()
        srv.stop()
    fstest(path)
