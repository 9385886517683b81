"""The servers' operational options, checked on running `zodbd serve` and
`zodbd neo-storage` processes: --debug-addr (profiles over HTTP,
net/http/pprof) and the scheduling knobs --cpus and --gomaxprocs."""
import os
import re
import subprocess
import time
import urllib.request

import pytest

from zeoserver import Server, free_port, read, wait_listening
from ZEO.ClientStorage import ClientStorage


def get(port, path):
    with urllib.request.urlopen('http://127.0.0.1:%d%s' % (port, path), timeout=20) as r:
        return r.status, r.read().decode('utf-8', 'replace')


def test_serve_debug_addr(zodbd_bin, tmp_copy, tmp_path):
    dport = free_port()
    srv = Server(zodbd_bin, tmp_copy('1.fs'), tmp_path,
                 extra=['-r', '--debug-addr', '127.0.0.1:%d' % dport]).start()
    try:
        cs = ClientStorage(srv.addr, read_only=True, wait_timeout=10)
        try:
            cs.lastTransaction()
            code, stacks = get(dport, '/debug/pprof/goroutine?debug=2')
            assert code == 200
            # The goroutine serving this client's connection is there.
            assert 'github.com/zodbd/zodbd/zeo.(*conn)' in stacks, stacks[:2000]
            code, heap = get(dport, '/debug/pprof/heap?debug=1')
            assert code == 200 and 'heap profile' in heap
        finally:
            cs.close()
        assert 'profiles on http://127.0.0.1:%d/debug/pprof/' % dport in srv.output()
    finally:
        assert srv.stop() == 0


def test_serve_debug_addr_taken(zodbd_bin, tmp_copy, tmp_path):
    """An address that cannot be listened on stops the server at start."""
    dport = free_port()
    srv = Server(zodbd_bin, tmp_copy('1.fs'), tmp_path,
                 extra=['-r', '--debug-addr', '127.0.0.1:%d' % dport]).start()
    try:
        p = subprocess.run([zodbd_bin, 'serve', '-r', '-a', '127.0.0.1:%d' % free_port(),
                            '-f', tmp_copy('1.fs'), '--debug-addr', '127.0.0.1:%d' % dport],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode != 0
        assert '--debug-addr' in p.stderr and 'address already in use' in p.stderr, p.stderr
    finally:
        srv.stop()


def test_neo_storage_debug_addr(zodbd_test_bin, tmp_copy, tmp_path):
    mport, dport = free_port(), free_port()
    log = os.path.join(str(tmp_path), 'neo.log')
    with open(log, 'wb') as logf:
        proc = subprocess.Popen([zodbd_test_bin, 'neo-storage', '--cluster', 'dbg',
                                 '--with-master', '127.0.0.1:%d' % mport,
                                 '--debug-addr', '127.0.0.1:%d' % dport, tmp_copy('1.fs')],
                                stdout=logf, stderr=subprocess.STDOUT)
    try:
        wait_listening(('127.0.0.1', dport), proc, log)
        deadline = time.time() + 20
        while True:
            code, stacks = get(dport, '/debug/pprof/goroutine?debug=2')
            assert code == 200
            if 'github.com/zodbd/zodbd/neo/storage.' in stacks:
                break
            assert time.time() < deadline, stacks[:2000]
            time.sleep(0.1)
        assert 'profiles on http://127.0.0.1:%d/debug/pprof/' % dport in read(log)
    finally:
        proc.terminate()
        assert proc.wait(20) == 0, read(log)


def allowed_cpus(pid):
    """The Cpus_allowed_list of every thread of process pid."""
    lists = set()
    for tid in os.listdir('/proc/%d/task' % pid):
        with open('/proc/%d/task/%s/status' % (pid, tid)) as f:
            lists.add(re.search(r'^Cpus_allowed_list:\s*(\S+)', f.read(), re.M).group(1))
    return lists


@pytest.mark.skipif(not os.path.exists('/proc/self/task'), reason='needs Linux /proc')
@pytest.mark.parametrize('cmd', ['serve', 'neo-storage'])
def test_cpus_and_gomaxprocs(zodbd_bin, zodbd_test_bin, tmp_copy, tmp_path, cmd):
    """--cpus 0 binds every thread (the ones started later too) to CPU 0."""
    if len(os.sched_getaffinity(0)) < 2 or 0 not in os.sched_getaffinity(0):
        pytest.skip('needs CPU 0 and another one')
    port = free_port()
    log = os.path.join(str(tmp_path), cmd + '.log')
    path = tmp_copy('1.fs')

    def argv(*opts):  # neo-storage's options come before its BACKEND
        if cmd == 'serve':
            return [zodbd_bin, 'serve', '-r', '-a', '127.0.0.1:%d' % port, '-f', path] + list(opts)
        return [zodbd_test_bin, 'neo-storage', '--cluster', 'sched', '--with-master',
                '127.0.0.1:%d' % port] + list(opts) + [path]
    with open(log, 'wb') as logf:
        proc = subprocess.Popen(argv('--cpus', '0', '--gomaxprocs', '1'),
                                stdout=logf, stderr=subprocess.STDOUT)
    try:
        wait_listening(('127.0.0.1', port), proc, log)
        if cmd == 'serve':
            cs = ClientStorage(('127.0.0.1', port), read_only=True, wait_timeout=10)
            cs.lastTransaction()  # the server has served a connection
            cs.close()
            assert 'GOMAXPROCS=1' in read(log)
        assert allowed_cpus(proc.pid) == {'0'}
    finally:
        proc.terminate()
        assert proc.wait(20) == 0, read(log)
    # Without --cpus, the threads may run anywhere this process may.
    with open(log, 'wb') as logf:
        proc = subprocess.Popen(argv(), stdout=logf, stderr=subprocess.STDOUT)
    try:
        wait_listening(('127.0.0.1', port), proc, log)
        assert allowed_cpus(proc.pid) != {'0'}
    finally:
        proc.terminate()
        assert proc.wait(20) == 0, read(log)


def test_neo_storage_max_txn_bytes(zodbd_bin, zodbd_test_bin, tmp_path):
    """--max-txn-bytes bounds the data a client connection's transactions
    hold until their vote: `zodbd copy` of a transaction of 3 MiB into a
    node started with --max-txn-bytes 2MiB fails (the node closes the
    connection and says why), and succeeds with the default (no bound)."""
    import transaction as txn_mod
    from persistent.mapping import PersistentMapping
    from ZODB import DB
    from ZODB.FileStorage import FileStorage
    src = str(tmp_path / 'src.fs')
    db = DB(FileStorage(src, create=True))
    tm = txn_mod.TransactionManager()
    conn = db.open(tm)
    for i in range(3):
        conn.root()['big%d' % i] = PersistentMapping(d=os.urandom(1 << 20))
    tm.commit()
    db.close()
    for opts, ok in ((['--max-txn-bytes', '2MiB'], False), ([], True)):
        dst = str(tmp_path / ('dst-%s.fs' % ok))
        FileStorage(dst, create=True).close()
        mport = free_port()
        log = str(tmp_path / ('neo-%s.log' % ok))
        with open(log, 'wb') as logf:
            proc = subprocess.Popen([zodbd_test_bin, 'neo-storage', '--cluster', 'big', '--read-write',
                                     '--with-master', '127.0.0.1:%d' % mport] + opts + [dst],
                                    stdout=logf, stderr=subprocess.STDOUT)
        try:
            wait_listening(('127.0.0.1', mport), proc, log)
            p = subprocess.run([zodbd_bin, 'copy', '-q', src, 'neo://big@127.0.0.1:%d' % mport],
                               capture_output=True, text=True, timeout=60)
            if ok:
                assert p.returncode == 0, p.stderr
            else:
                assert p.returncode != 0, 'copy of 3 MiB into a node of --max-txn-bytes 2MiB succeeded'
                assert 'hold over 2097152 bytes' in p.stderr, p.stderr  # the node's reason, to the client
                deadline = time.time() + 10
                while 'hold over 2097152 bytes' not in read(log):
                    assert time.time() < deadline, read(log)[-2000:]
                    time.sleep(0.1)
        finally:
            proc.terminate()
            assert proc.wait(20) == 0, read(log)
