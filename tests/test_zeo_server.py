"""zodbd serve with the stock ZEO client (PyPI ZEO), read side and bad input.

Every test runs with both marshallings: pickle (Z5) and msgpack (M5).
"""
import json
import os
import socket
import struct
import time

import pytest
from zeoserver import free_port, recv_frame, send_frame, ssl_conf
import ZEO
from ZEO.ClientStorage import ClientStorage
from ZODB.FileStorage import FileStorage
from ZODB.POSException import POSKeyError, ReadOnlyError
from ZODB.utils import maxtid, p64, u64, z64



def norm(x):
    """Tuples as lists: msgpack has no tuples, the client decodes every
    array as a tuple (with runzeo too)."""
    if isinstance(x, (list, tuple)):
        return [norm(i) for i in x]
    if isinstance(x, dict):
        return {k: norm(v) for k, v in x.items()}
    return x


def client(srv, **kw):
    kw.setdefault('wait_timeout', 10)
    return ClientStorage(srv.addr, **kw)


def test_loads_match_filestorage(serve, tmp_copy):
    path = tmp_copy('1.fs')
    ref = FileStorage(path, read_only=True)
    srv = serve(path, extra=['-r'])
    cs = client(srv, read_only=True)
    try:
        assert cs.lastTransaction() == ref.lastTransaction()
        assert len(cs) == len(ref)
        assert cs.getSize() == ref.getSize()
        tids = [t.tid for t in ref.iterator()]
        n = 0
        for oid in sorted(ref._index.keys()):
            for before in tids + [p64(u64(tids[-1]) + 1), maxtid]:
                try:
                    want = ref.loadBefore(oid, before)
                except POSKeyError:
                    want = 'POSKeyError'
                try:
                    got = cs._call('loadBefore', oid, before)
                except POSKeyError:
                    got = 'POSKeyError'
                assert got == want, (oid, before)
                n += 1
            assert norm(cs.history(oid, 100)) == norm(ref.history(oid, 100))
        assert n > 100
        # An oid never stored.
        with pytest.raises(POSKeyError):
            cs.load(p64(0x7777))
    finally:
        cs.close()
        ref.close()


def test_iterator_matches_filestorage(serve, tmp_copy):
    path = tmp_copy('1.fs')
    ref = FileStorage(path, read_only=True)
    srv = serve(path, extra=['-r'])
    cs = client(srv, read_only=True)
    try:
        got = [(t.tid, t.status, t.user, t.description, norm(t.extension),
                [(r.oid, r.tid, r.data, r.data_txn) for r in t])
               for t in cs.iterator()]
        want = [(t.tid, t.status, t.user, t.description, norm(t.extension),
                 [(r.oid, r.tid, r.data, r.data_txn) for r in t])
                for t in ref.iterator()]
        assert got == want
        # A sub-range.
        tids = [t[0] for t in want]
        got = [t.tid for t in cs.iterator(tids[2], tids[5])]
        assert got == tids[2:6]
    finally:
        cs.close()
        ref.close()


def test_records_outlive_transaction_iterator(serve, tmp_copy):
    """A transaction's records, read lazily by the stock client (one
    iterator_record_next each), are all returned when the transaction
    iterator moved on meanwhile: runzeo's iter(txn_info) does not depend
    on the transaction iterator (zodbd's records ended early)."""
    path = tmp_copy('1.fs')
    ref = FileStorage(path, read_only=True)
    srv = serve(path, extra=['-r'])
    cs = client(srv, read_only=True)
    try:
        want = {t.tid: [r.oid for r in t] for t in ref.iterator()}
        tid = next(tid for tid, oids in want.items() if len(oids) >= 3)
        it = cs.iterator(tid, None)
        txn = next(it)
        assert txn.tid == tid
        recs = iter(txn)
        first = next(recs)
        next(it)  # the next transaction, before the records are all read
        assert [first.oid] + [r.oid for r in recs] == want[tid]
    finally:
        cs.close()
        ref.close()


def test_db_reads(serve, tmp_copy):
    srv = serve(tmp_copy('1.fs'), extra=['-r'])
    db = ZEO.DB(srv.addr, read_only=True, wait_timeout=10)
    try:
        conn = db.open()
        root = conn.root()
        assert sorted(root.keys()) == ['a', 'b', 'big', 'len', 'many', 'n',
                                       'sizes', 'tree', 'undo_area']
        assert len(list(root['tree'].items())) > 0
        conn.close()
    finally:
        db.close()


def test_read_only_server_refuses_writes(serve, tmp_copy):
    srv = serve(tmp_copy('1.fs'), extra=['-r'])
    # A writable registration is refused; with read_only_fallback the
    # client falls back to read-only.
    cs = client(srv, read_only_fallback=True)
    try:
        assert cs.isReadOnly()
        with pytest.raises(ReadOnlyError):
            cs.new_oid()
    finally:
        cs.close()


def test_server_status_and_ruok(serve, tmp_copy):
    srv = serve(tmp_copy('1.fs'), extra=['-r'])
    cs = client(srv, read_only=True)
    try:
        cs.load(z64)
        st = cs.server_status()
        assert set(st) == {'start', 'loads', 'stores', 'commits', 'aborts',
                           'active_txns', 'conflicts', 'conflicts_resolved',
                           'connections', 'waiting', 'lock_time',
                           'timeout-thread-is-alive', 'last-transaction'}
        assert st['connections'] == 1 and st['loads'] >= 1
        assert st['last-transaction'] == cs.lastTransaction().hex()
    finally:
        cs.close()
    # ruok: the nagios probe.
    s = socket.create_connection(srv.addr)
    try:
        announce = recv_frame(s)
        assert announce in (b'Z5', b'M5')
        send_frame(s, b'ruok')
        status = json.loads(recv_frame(s))
        assert '1' in status and 'last-transaction' in status['1']
    finally:
        s.close()


# Raw protocol: bad input closes that connection only.

def closed_by_peer(s):
    s.settimeout(10)
    try:
        while True:
            if not s.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def raw(srv):
    s = socket.create_connection(srv.addr)
    proto = recv_frame(s)
    send_frame(s, proto)
    return s, proto


def encode(proto, msg):
    if proto[:1] == b'M':
        import msgpack
        return msgpack.packb(msg, use_bin_type=True)
    import zodbpickle.pickle
    return zodbpickle.pickle.dumps(msg, 3)


BAD_INPUTS = {
    'garbage': lambda proto: b'\x80\x03garbage',
    'not a tuple': lambda proto: encode(proto, [1, 2]),
    'unknown method': lambda proto: encode(proto, (1, False, 'no_such_method', ())),
    'before register': lambda proto: encode(proto, (1, False, 'lastTransaction', ())),
}


@pytest.mark.parametrize('bad', sorted(BAD_INPUTS))
def test_bad_input_closes_only_that_connection(serve, tmp_copy, bad):
    srv = serve(tmp_copy('1.fs'), extra=['-r'])
    good = client(srv, read_only=True)
    try:
        good.load(z64)
        s, proto = raw(srv)
        send_frame(s, BAD_INPUTS[bad](proto))
        assert closed_by_peer(s), 'connection not closed after ' + bad
        s.close()
        # The server and the other client carry on.
        good.load(z64)
        cs2 = client(srv, read_only=True)
        cs2.load(z64)
        cs2.close()
    finally:
        good.close()
    assert 'closing' in srv.output()


def test_oversized_and_truncated_frames(serve, tmp_copy):
    srv = serve(tmp_copy('1.fs'), extra=['-r', '--max-frame', '1000'])
    s, proto = raw(srv)
    s.sendall(struct.pack('>I', 10 ** 6))
    assert closed_by_peer(s)
    s.close()
    s, proto = raw(srv)
    s.sendall(struct.pack('>I', 100) + b'x' * 10)
    s.close()
    cs = client(srv, read_only=True)
    cs.load(z64)
    cs.close()
    assert 'exceeds the limit' in srv.output()


def test_wrong_argument_type_gets_type_error(serve, tmp_copy):
    srv = serve(tmp_copy('1.fs'), extra=['-r'])
    s, proto = raw(srv)
    try:
        send_frame(s, encode(proto, (1, False, 'register', ('1', True))))
        msgid, flags, name, ret = decode(proto, recv_frame(s))
        assert (msgid, flags, name) == (1, 0, '.reply')
        send_frame(s, encode(proto, (2, False, 'loadBefore', (b'short', maxtid))))
        msgid, flags, name, ret = decode(proto, recv_frame(s))
        assert (msgid, flags) == (2, 2)
        assert ret[0] == 'builtins.TypeError'
        # Pipelined loads, msgid echoed verbatim.
        for i in range(3):
            send_frame(s, encode(proto, ((z64, maxtid), False, 'loadBefore', (z64, maxtid))))
        for i in range(3):
            msgid, flags, name, ret = decode(proto, recv_frame(s))
            assert tuple(msgid) == (z64, maxtid) and flags == 0
            assert ret[2] is None
    finally:
        s.close()


def decode(proto, b):
    if proto[:1] == b'M':
        import msgpack
        return msgpack.unpackb(b, raw=False, use_list=False)
    import zodbpickle.pickle
    return zodbpickle.pickle.loads(b)


def test_tls(serve, tmp_copy, tmp_path):
    from ZEO.tests import testssl
    path = tmp_copy('1.fs')
    port = free_port()
    conf = ssl_conf(port, path, testssl)
    srv = serve(path, conf=conf, port=port)
    cs = ClientStorage(srv.addr, read_only=True, wait_timeout=10,
                       ssl=testssl.client_ssl())
    try:
        data, serial = cs.load(z64)
        assert data.startswith(b'\x80') and serial <= cs.lastTransaction()
    finally:
        cs.close()
    # A client without a certificate is refused.
    import ssl
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=testssl.server_cert)
    ctx.check_hostname = False
    raw = socket.create_connection(srv.addr)
    with pytest.raises((ssl.SSLError, ConnectionError, EOFError)):
        s = ctx.wrap_socket(raw)
        recv_frame(s)
    raw.close()
    assert 'TLS handshake' in srv.output()


def test_signals(serve, tmp_copy, tmp_path):
    import signal
    log = str(tmp_path / 'zeo.log')
    srv = serve(tmp_copy('1.fs'), extra=['-r', '--log', log])
    # logrotate: move the log away, SIGHUP (or SIGUSR2) reopens it.
    os.rename(log, log + '.1')
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 10
    while not os.path.exists(log):
        assert time.time() < deadline, 'log not reopened after SIGHUP'
        time.sleep(0.02)
    cs = client(srv, read_only=True)
    cs.load(z64)
    cs.close()
    # SIGTERM: clean exit 0.
    assert srv.stop(signal.SIGTERM) == 0
    with open(log) as f:
        assert 'log reopened' in f.read()
    with open(log + '.1') as f:
        assert 'listening on' in f.read()
