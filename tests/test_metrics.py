"""zodbd serve --http-addr with the stock ZEO client: after loads, commits
and a conflict made through ZEO.ClientStorage, /metrics (Prometheus text
format) counts them, by method, storage, client label and class."""
import re
import time
import urllib.error
import urllib.request

import pytest
import transaction
import ZEO
from persistent.mapping import PersistentMapping
from ZODB.POSException import ConflictError

from zeoserver import free_port

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(addr):
    """{(name, frozenset of (label, value)): value} of one scrape."""
    with urllib.request.urlopen('http://%s/metrics' % addr, timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith('#'):
            continue
        m = LINE.match(line)
        assert m, line
        labels = frozenset(LABEL.findall(m.group(3) or ''))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def value(metrics, name, **labels):
    """The value of the one sample of name whose labels include labels;
    0 when there is none."""
    want = set(labels.items())
    found = [v for (n, ls), v in metrics.items() if n == name and want <= ls]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else 0


def test_metrics_stock_client(serve, tmp_path, marshal):
    http = '127.0.0.1:%d' % free_port()
    srv = serve(str(tmp_path / 'Data.fs'), extra=['--create', '--http-addr', http])
    # The ZEO socket is bound before the storages are open: /ready says
    # 503 until they are and the server accepts.
    for _ in range(200):
        try:
            with urllib.request.urlopen('http://%s/ready' % http, timeout=10) as r:
                assert r.status == 200
                break
        except urllib.error.HTTPError as e:
            assert e.code == 503
            time.sleep(0.05)
    else:
        pytest.fail('/ready never 200')

    db = ZEO.DB(srv.addr, wait_timeout=10, client_label='pytest-app')
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    root = conn.root()
    for i in range(10):
        root['k%d' % i] = PersistentMapping(n=i)
    tm.commit()

    # A fresh client (empty cache) loads every object once.
    db2 = ZEO.DB(srv.addr, wait_timeout=10)
    tm2 = transaction.TransactionManager()
    conn2 = db2.open(tm2)
    root2 = conn2.root()
    assert [root2['k%d' % i]['n'] for i in range(10)] == list(range(10))

    # A conflict on a PersistentMapping (no _p_resolveConflict): the
    # second committer gets ConflictError.
    root['k0']['n'] = 100
    root2['k0']['n'] = 200
    tm.commit()
    with pytest.raises(ConflictError):
        tm2.commit()
    tm2.abort()
    m = scrape(http)
    conn.close()
    conn2.close()
    db.close()
    db2.close()

    zeo = dict(protocol='zeo')
    # Three commits: the root (ZODB.DB makes it), the ten mappings, k0.
    assert value(m, 'zodbd_commits_total', storage='1', **zeo) == 3
    assert value(m, 'zodbd_conflicts_total', storage='1',
                 **{'class': 'persistent.mapping.PersistentMapping'}, **zeo) == 1
    loads = value(m, 'zodbd_loads_total', storage='1', **zeo)
    assert loads >= 11  # the root and its ten children, by the second client
    assert value(m, 'zodbd_request_duration_seconds_count', method='loadBefore', **zeo) == loads
    assert value(m, 'zodbd_request_duration_seconds_count', method='tpc_finish', **zeo) == 3
    assert value(m, 'zodbd_request_duration_seconds_count', method='vote', **zeo) == 4
    assert value(m, 'zodbd_request_duration_seconds_bucket', method='vote', le='+Inf', **zeo) == 4
    assert value(m, 'zodbd_connections', label='pytest-app', **zeo) == 1
    assert value(m, 'zodbd_connections', label='', **zeo) == 1
    assert value(m, 'zodbd_storage_objects', storage='1') == 11
    assert value(m, 'zodbd_fsync_group_transactions_sum', storage='1') == 3
    assert value(m, 'zodbd_commit_lock_hold_seconds_count', storage='1') >= 3
    assert value(m, 'zodbd_received_bytes_total', **zeo) > 0
    assert value(m, 'zodbd_sent_bytes_total', **zeo) > 0
    assert value(m, 'zodbd_ready') == 1
    assert value(m, 'go_goroutines') > 0
    assert srv.stop() == 0
