"""zodbd serve --busy-poll (and zeo.conf's busy-poll, and neo-storage's):
the stock client reads and commits through a busy-polling server, the
setting is logged, a bad value is refused with a clear error. What it buys
is measured by `make bench` (the zodbd-Z-bp server), not here."""
import os
import subprocess

import pytest
import transaction
import ZEO

from zeoserver import Server


def roundtrip(addr, n=200):
    db = ZEO.DB(addr, wait_timeout=30)
    try:
        conn = db.open()
        root = conn.root()
        root['n'] = 0
        transaction.commit()
        for i in range(n):
            root['n'] += 1
            transaction.commit()
        conn.close()
        conn = db.open()
        assert conn.root()['n'] == n
        conn.close()
    finally:
        db.close()


@pytest.mark.parametrize('how', ['flag-on', 'flag-duration', 'conf'])
def test_busy_poll_serves(tmp_path, zodbd_bin, how):
    path = str(tmp_path / 'Data.fs')
    if how == 'conf':
        port_srv = Server(zodbd_bin, path, tmp_path)
        conf = ('<zeo>\n  address 127.0.0.1:%d\n  busy-poll 20us\n</zeo>\n'
                '<filestorage 1>\n  path %s\n</filestorage>\n' % (port_srv.port, path))
        srv = Server(zodbd_bin, path, tmp_path, conf=conf, port=port_srv.port)
        want = '20µs'
    else:
        arg = 'on' if how == 'flag-on' else '30us'
        srv = Server(zodbd_bin, path, tmp_path, extra=['--create', '--busy-poll', arg])
        want = '50µs' if how == 'flag-on' else '30µs'
    srv.start()
    try:
        roundtrip(srv.addr)
    finally:
        srv.stop()
    out = srv.output()
    assert 'busy-polling: a connection\'s reader spins up to %s' % want in out, out


@pytest.mark.parametrize('value', ['sometimes', '1s', '-5us'])
def test_busy_poll_bad_value_refused(tmp_path, zodbd_bin, value):
    path = str(tmp_path / 'Data.fs')
    p = subprocess.run([zodbd_bin, 'serve', '--create', '-f', path, '-a', '127.0.0.1:0', '--busy-poll', value],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert 'busy-poll' in p.stderr and value in p.stderr, p.stderr
    conf = tmp_path / 'zeo.conf'
    conf.write_text('<zeo>\n  address 127.0.0.1:0\n  busy-poll %s\n</zeo>\n'
                    '<filestorage 1>\n  path %s\n</filestorage>\n' % (value, path))
    p = subprocess.run([zodbd_bin, 'serve', '-C', str(conf)], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and '<zeo> busy-poll' in p.stderr and value in p.stderr, (p.returncode, p.stderr)
    assert not os.path.exists(path)  # refused before anything was created
