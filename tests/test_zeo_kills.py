"""The server killed under contention: 4 client processes (the stock
ZEO.ClientStorage and ZODB.DB) commit the catalog workload of
tests/zeo_contention_app.py through one server while the test SIGKILLs
the server at a random moment of their commits and starts it again on the
same file and port, ZODBD_ZEO_KILLS times (default 8).

A commit cut by the kill raises ClientDisconnected in the client, which
cannot know whether it committed (its tpc_finish may have reached the
server, the answer not): once reconnected, the client reads its own
document, which only that commit sets to its number, and counts the
commit as done or tries it again. Then, as in test_zeo_contention: no
other exception reached the application, nothing was logged as an error
but the transaction package's report of the cut tpc_finish, no
acknowledged commit is lost and no commit counted as failed is in the
file (the catalog's trees are exactly the replay of the counted commits
in tid order, its Lengths agree), every client reconnected each time
and kept its cache (ZEO's client refuses a server whose last transaction
is older than what it has seen, and drops its cache when the server
cannot list what changed since), and the file passes fstest.

The same run against runzeo (fewer kills: it starts slowly) shows that
the test itself is sound.
"""
import os
import random
import signal
import threading
import time

import pytest
import ZEO

import zeo_contention_app as app
from test_zeo_contention import summary
from testutil import fstest
from zeoserver import Server, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
NPROCS = 4
KILLS = int(os.environ.get('ZODBD_ZEO_KILLS', '8'))

# The server remembers every transaction of the run for getInvalidations
# (and finds them in the file when it restarts): a client that reconnects
# keeps its cache, and "dropping stale cache" is a failure.
QUEUE = '100000'
RUNZEO_CONF = '''
<zeo>
  address 127.0.0.1:%d
  invalidation-queue-size %s
</zeo>
<filestorage 1>
  path %s
</filestorage>
'''

# What a kill makes the clients log, and nothing else: the transaction
# package's report of a tpc_finish that raised (CRITICAL), and ZODB's of
# a load cut by the disconnection (ERROR, then raised).
EXPECTED_LOG = ('A storage error occurred during the second phase of the two-phase commit',
                "Couldn't load state for ")


def killer(srv, kills, rng, stop_file, failures):
    """Kill srv (SIGKILL) kills times, each at a random moment once the
    clients commit again after the previous restart, and start it again;
    then create stop_file."""
    try:
        for _ in range(kills):
            size = os.path.getsize(srv.path)
            deadline = time.time() + 30
            # Commits are going on: the file grew since the restart.
            while os.path.getsize(srv.path) <= size:
                if time.time() > deadline:
                    raise RuntimeError('no commit within 30 s of a restart')
                time.sleep(0.02)
            time.sleep(rng.uniform(0, 0.3))
            srv.stop(signal.SIGKILL)
            srv.start()
    except BaseException as e:
        failures.append(e)
    finally:
        open(stop_file, 'w').close()


def run(kind, zodbd_bin, tmp_path, monkeypatch, kills):
    monkeypatch.setenv('PYTHONPATH', HERE)  # runzeo imports the app's classes
    path = str(tmp_path / 'Data.fs')
    if kind == 'zodbd':
        srv = Server(zodbd_bin, path, tmp_path, extra=['--create', '--invalidation-queue-size', QUEUE])
        srv.start().extra = srv.extra[1:]  # restarts open the file as it is
    else:
        port = free_port()
        srv = Server(zodbd_bin, path, tmp_path, kind=kind, port=port, conf=RUNZEO_CONF % (port, QUEUE, path))
        srv.start()
    stop_file = str(tmp_path / 'stop')
    try:
        app.run_setup({'addr': srv.addr, 'workload': 'catalog', 'nprocs': NPROCS})
        failures = []
        t = threading.Thread(target=killer, args=(srv, kills, random.Random(kills), stop_file, failures))
        t.start()
        try:
            # A kill cycle takes 1-2 s (the stock client waits 1-2 s to
            # reconnect).
            reports = app.run_clients(srv.addr, 'catalog', NPROCS, ssl=False, timeout=30 + 5 * kills,
                                      extra={'stop_file': stop_file, 'restarts': True})
        except RuntimeError as e:
            # Clients stuck: what they logged at CRITICAL is in the
            # captured stderr.
            failures.append(e)
        finally:
            open(stop_file, 'w').close()
            t.join()
        assert not failures, '%s\nserver log:\n%s' % (failures, srv.output()[-3000:])
        for r in reports:
            r['logged'] = [e for e in r['logged'] if not e['msg'].startswith(EXPECTED_LOG)]
        db = ZEO.DB(srv.addr, wait_timeout=30)
        try:
            problems = app.problems(db.open().root(), 'catalog', reports)
        finally:
            db.close()
        ok = sum(r['ok'] for r in reports)
        if problems:
            pytest.fail('%s, %d kills, %d processes: %d ok, %d problems\n%s'
                        % (kind, kills, NPROCS, ok, len(problems), summary(problems)), pytrace=False)
        # The kills cut commits, and the clients committed between them.
        assert sum(r['disconnects'] for r in reports) >= kills
        assert ok >= kills
        rc = srv.stop()
        assert rc == 0, srv.output()[-4000:]
        assert 'panic:' not in srv.output(), srv.output()[-4000:]
        fstest(path)
        return reports
    finally:
        srv.stop()


def test_zodbd_killed_under_contention(zodbd_bin, tmp_path, monkeypatch):
    run('zodbd', zodbd_bin, tmp_path, monkeypatch, KILLS)


def test_runzeo_reference(zodbd_bin, tmp_path, monkeypatch):
    run('runzeo', zodbd_bin, tmp_path, monkeypatch, 2)
