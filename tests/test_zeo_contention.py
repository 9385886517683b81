"""Contention: several client processes (the stock ZEO.ClientStorage and
ZODB.DB, separate processes) commit to the same objects through one
server at once, retrying on ConflictError (tests/zeo_contention_app.py has
the workloads: a shared BTrees.Length, a catalog of OOBTrees/OIBTrees with
Lengths, a Counter only Python can resolve).

Each run must show: no exception but ConflictError reached the
application, conflict resolution never failed with an error (ZODB logs
such an error, a POSKeyError of loadSerial for instance, and turns it into
a ConflictError), no commit gave up, and the final state is exactly that of
the successful commits (the catalog's trees are recomputed from each
commit's operations in tid order). The file then passes fstest.

The same runs against runzeo (default configuration: it resolves conflicts
on the server, importing zeo_contention_app) show that the test itself is
sound: runzeo passes them.
"""
import collections
import os
import re

import pytest
import ZEO

import zeo_contention_app as app
from testutil import fstest
from zeoserver import Server, free_port, ssl_conf

HERE = os.path.dirname(os.path.abspath(__file__))

NPROCS = 4
COMMITS = 40  # per process

# transport id -> (msgpack, tls)
TRANSPORTS = {'pickle': (False, False), 'msgpack': (True, False),
              'pickle-tls': (False, True), 'msgpack-tls': (True, True)}


def summary(problems):
    """problems grouped by kind (their first line, numbers blanked), each
    kind's count and first example."""
    kinds = collections.OrderedDict()
    for p in problems:
        k = re.sub(r'0x[0-9a-f]+|\d+', 'N', p.split('\n')[0])
        kinds.setdefault(k, []).append(p)
    return '\n'.join('%dx %s\n  first: %s' % (len(v), k, v[0].strip().replace('\n', '\n  '))
                     for k, v in kinds.items())


def start(kind, zodbd_bin, tmp_path, transport):
    msgpack, tls = TRANSPORTS[transport]
    path = str(tmp_path / 'Data.fs')
    if tls:
        from ZEO.tests import testssl
        port = free_port()
        return Server(zodbd_bin, path, tmp_path, kind=kind, msgpack=msgpack, port=port,
                      conf=ssl_conf(port, path, testssl, read_only=False)).start()
    extra = ['--create'] if kind == 'zodbd' else []
    return Server(zodbd_bin, path, tmp_path, kind=kind, msgpack=msgpack, extra=extra).start()


def contend(kind, zodbd_bin, tmp_path, monkeypatch, workload, transport):
    # runzeo resolves on the server: it imports zeo_contention_app.Counter.
    monkeypatch.setenv('PYTHONPATH', HERE)
    tls = TRANSPORTS[transport][1]
    srv = start(kind, zodbd_bin, tmp_path, transport)
    try:
        cfg = {'addr': srv.addr, 'workload': workload, 'nprocs': NPROCS, 'ssl': tls}
        app.run_setup(cfg)
        reports = app.run_clients(srv.addr, workload, NPROCS, commits=COMMITS, ssl=tls, timeout=120)
        kw = {}
        if tls:
            from ZEO.tests import testssl
            kw['ssl'] = testssl.client_ssl()
        db = ZEO.DB(srv.addr, wait_timeout=30, **kw)
        try:
            problems = app.problems(db.open().root(), workload, reports)
        finally:
            db.close()
        # There was contention: conflicts resolved (by the server or the
        # clients), or ConflictErrors.
        assert sum(r['resolved'] + r['client_resolves'] + r['conflicts'] for r in reports) > 0
        # Every commit was tried once at least.
        assert all(r['tried'] == COMMITS for r in reports), [r['tried'] for r in reports]
        assert sum(r['ok'] for r in reports) > 0
        if problems:
            pytest.fail('%s, %s, %d processes x %d commits: %d ok, %d problems\n%s'
                        % (kind, workload, NPROCS, COMMITS, sum(r['ok'] for r in reports),
                           len(problems), summary(problems)), pytrace=False)
        rc = srv.stop()
        assert rc == 0, srv.output()[-4000:]
        out = srv.output()
        for bad in ('panic:', 'Unexpected error while trying to resolve conflict', 'POSKeyError'):
            assert bad not in out, out[-4000:]
        fstest(srv.path)
        return reports
    finally:
        srv.stop()


@pytest.mark.parametrize('transport', ['pickle', 'msgpack', 'msgpack-tls'])
@pytest.mark.parametrize('workload', app.WORKLOADS)
def test_zodbd_contention(zodbd_bin, tmp_path, monkeypatch, workload, transport):
    contend('zodbd', zodbd_bin, tmp_path, monkeypatch, workload, transport)


@pytest.mark.parametrize('workload,transport', [(w, 'pickle') for w in app.WORKLOADS] + [('length', 'msgpack-tls')])
def test_runzeo_reference(zodbd_bin, tmp_path, monkeypatch, workload, transport):
    """The same runs against runzeo pass: the test is sound."""
    reports = contend('runzeo', zodbd_bin, tmp_path, monkeypatch, workload, transport)
    # runzeo resolves on the server: the clients never had to.
    assert sum(r['client_resolves'] for r in reports) == 0


def test_catalog_model_catches_a_lost_update():
    """problems() is not vacuous: a final state missing one committed
    key, or a Length off by one, is reported."""
    from BTrees.Length import Length
    root = {}
    app.setup(root, 'catalog', 1)
    ops = app.catalog_apply(root, 0, 0, ('del', 'title', 'shared-00'))
    report = {'proc': 0, 'ok': 1, 'gaveup': 0, 'errors': [], 'resolution_errors': [],
              'log': [['00' * 8, ops]]}
    assert app.problems(root, 'catalog', [report]) == []
    del root['t_date']['p00-0-0000000']
    root['n_date'].change(-1)
    assert any('tree date' in p for p in app.problems(root, 'catalog', [report]))
    root['t_date']['p00-0-0000000'] = app.tree_value('date', 0, 0)
    root['n_date'].change(1)
    assert app.problems(root, 'catalog', [report]) == []
    root['n_path'].change(1)
    assert app.problems(root, 'catalog', [report]) == ['Length n_path is 10, tree path has 9 keys']
    root['n_path'].change(-1)
    root['len'] = Length(3)
    assert app.problems(root, 'length', [dict(report, ok=2)]) == ['Length is 3, 2 successful increments']
    # An error that reached the application, or a failed resolution, is one.
    report['errors'] = [{'commit': 0, 'attempt': 0, 'repr': 'AssertionError()', 'traceback': ''}]
    report['resolution_errors'] = [{'level': 'ERROR', 'msg': 'Unexpected error', 'exc': 'POSKeyError: 0x01'}]
    assert len(app.problems(root, 'length', [dict(report, ok=3)])) == 2
