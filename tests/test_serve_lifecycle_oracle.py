"""`zodbd serve`'s process lifecycle and files against runzeo and ZODB/py's
FileStorage: each test here failed before its fix (an audit; the
docstrings say what runzeo or ZODB/py does, what zodbd did, and what it
does now).

Checked by that audit and found to match (no test here, or in
test_serve_process.py / test_zeo_dropin.py): the lock file (its content,
a second server, runzeo or ZODB/py refused in every direction, a stale
lock after SIGKILL), random SIGKILLs at start-up and during commits and
online packs, SIGTERM during a pack or with transactions voted, SIGHUP and
SIGUSR2, Unix-socket leftovers, read-only mounts.
"""
import os
import signal
import subprocess

import pytest
from testutil import signal_while_starting
from zeoserver import Server, free_port, runzeo_cmd
from ZEO.ClientStorage import ClientStorage
from ZODB.Connection import TransactionMetaData
from ZODB.FileStorage import FileStorage
from ZODB.utils import z64


def commit(cs, oid, prev, data):
    t = TransactionMetaData()
    cs.tpc_begin(t)
    cs.store(oid, prev, data, '', t)
    cs.tpc_vote(t)
    return cs.tpc_finish(t)


# --- usage errors: exit status 2, nothing opened -------------------------

@pytest.mark.parametrize('flags', [
    ['--max-queued', '0'],
    ['--http-addr', 'bogus'],
    ['--invalidation-age', '-5'],
])
def test_refused_flag_value_is_usage_error(zodbd_bin, tmp_path, flags):
    """docs/zeo-server.md: "a value refused (`--timeout 0`, `--create`
    without `-f`, a malformed `--address`) are usage errors: one line and
    a pointer to `-h` on stderr, exit status 2, nothing opened or bound".
    `--timeout 0`, `--max-frame 0`, `--gomaxprocs -1` do that; but
    `--max-queued 0`, a malformed `--http-addr` and a negative
    `--invalidation-age` exited with status 1, without the pointer to -h,
    and `--max-queued 0` was checked only after the `--log` file was
    created. runzeo's usage errors (`-t abc`) exit with status 2; these
    are refused with the others now, before anything is made."""
    log = tmp_path / 'z.log'
    p = subprocess.run([zodbd_bin, 'serve', '-a', '127.0.0.1:%d' % free_port(), '-f', 'Data.fs',
                        '--log', str(log)] + flags,
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=30)
    assert (p.returncode, sorted(os.listdir(tmp_path))) == (2, []), (p.returncode, os.listdir(tmp_path), p.stderr)
    assert 'zodbd serve -h' in p.stderr, p.stderr


# --- a directory the server cannot create files in ------------------------

def chattr(flag, path):
    try:
        subprocess.run(['chattr', flag, str(path)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip('chattr %s not possible here: %s' % (flag, e))


def test_directory_without_new_files_runzeo_database(zodbd_bin, tmp_path):
    """A database runzeo served, in a directory where the server can write
    its files but create none (here `chattr +i`; in production a directory
    owned by root with the files owned by the server's user): runzeo starts
    on it, serves and commits (the lock file, Data.fs.tmp and Data.fs.index
    exist; the index save at close fails and is logged). zodbd, said to be
    a drop-in ("stop runzeo, start zodbd serve on the same Data.fs"),
    refuses to start: it must create the oid mark Data.fs.oid
    (fs1/oidmark.go, through Data.fs.oid.tmp) and a failure to create it
    is fatal ("oid mark: open .../Data.fs.oid.tmp: operation not
    permitted"), where a missing mark is otherwise the largest stored oid,
    runzeo's behaviour. It warns now that no mark is kept and serves, as
    runzeo (new oids above the largest stored one after a restart)."""
    d = tmp_path / 'db'
    d.mkdir()
    path = str(d / 'Data.fs')
    fs = FileStorage(path)  # leaves Data.fs, .index, .lock and .tmp, as runzeo
    t = TransactionMetaData()
    fs.tpc_begin(t)
    oid = fs.new_oid()
    fs.store(oid, z64, b'x' * 300, '', t)
    fs.tpc_vote(t)
    fs.tpc_finish(t)
    fs.close()
    chattr('+i', d)
    try:
        for kind in ['runzeo', 'zodbd']:
            if kind == 'runzeo' and not runzeo_cmd():
                continue
            try:
                srv = Server(zodbd_bin, path, tmp_path, kind=kind).start()
            except RuntimeError as e:
                pytest.fail('%s refused to start: %s' % (kind, str(e)[-400:]))
            try:
                cs = ClientStorage(srv.addr, wait_timeout=10)
                assert cs.load(oid)[0] == b'x' * 300
                commit(cs, cs.new_oid(), z64, b'y' * 10)
                cs.close()
            finally:
                srv.stop()
    finally:
        subprocess.run(['chattr', '-i', str(d)])


def test_directory_without_new_files_big_transaction(zodbd_bin, tmp_path):
    """The same directory (files writable, no new file can be made in it),
    with a database zodbd itself served before (so that Data.fs.oid
    exists and zodbd starts): a transaction of more than 8 MiB fails its
    vote with "spool: open .../zodbd-txn-NNN: operation not permitted",
    because the FileStorage spools a big transaction into a new unlinked
    file made in the Data.fs's directory (spool.Spool{Dir:
    filepath.Dir(fs.path)} in fs1/writer.go's Begin). runzeo commits it:
    ZODB/py's FileStorage writes it into Data.fs.tmp, opened once at
    start (docs/operations.md says the spool is beside the Data.fs "as
    runzeo and ZODB/py's FileStorage do"). The spool goes to $TMPDIR now
    where the directory refuses a new file."""
    for kind in ['runzeo', 'zodbd']:
        if kind == 'runzeo' and not runzeo_cmd():
            continue
        d = tmp_path / kind
        d.mkdir()
        path = str(d / 'Data.fs')
        srv = Server(zodbd_bin, path, tmp_path, kind=kind).start()
        cs = ClientStorage(srv.addr, wait_timeout=10)
        commit(cs, cs.new_oid(), z64, b'x' * 300)
        cs.close()
        assert srv.stop() == 0
        chattr('+i', d)
        try:
            srv = Server(zodbd_bin, path, tmp_path, kind=kind).start()
            try:
                cs = ClientStorage(srv.addr, wait_timeout=10)
                try:
                    commit(cs, cs.new_oid(), z64, b'y' * (9 << 20))
                finally:
                    cs.close()
            finally:
                srv.stop()
        finally:
            subprocess.run(['chattr', '-i', str(d)])


# --- create: a new file, not the old one truncated --------------------------

def test_create_makes_a_new_file(zodbd_bin, tmp_path):
    """`--create` (`create true`) on an existing Data.fs: ZODB/py's
    FileStorage(create=True), which runzeo uses, removes the file and
    makes a new one (os.remove, then open 'w+b'), so another name of the
    old file (a hard link: Data.fs.old of a pack killed between its link
    and its rename, a hard-link snapshot) keeps the old database, and a
    reader that has it open (a read-only server, a backup) goes on reading
    the old database. zodbd truncated the file in place (os.O_TRUNC): the
    old database was lost under every name (here keep.fs went from the
    database to 4 bytes), and an open reader read the new database's
    records through its old index. It removes the file first now."""
    path = str(tmp_path / 'Data.fs')
    fs = FileStorage(path)
    t = TransactionMetaData()
    fs.tpc_begin(t)
    fs.store(fs.new_oid(), z64, b'old database' * 10, '', t)
    fs.tpc_vote(t)
    fs.tpc_finish(t)
    fs.close()
    keep = str(tmp_path / 'keep.fs')
    os.link(path, keep)
    size = os.path.getsize(keep)
    srv = Server(zodbd_bin, path, tmp_path, extra=['--create']).start()
    assert srv.stop() == 0
    assert os.path.getsize(path) == 4
    assert os.path.getsize(keep) == size, 'the other name of the old file was truncated too'


# --- zeo.conf paths: ZConfig's existing-dirpath expands ~ -------------------

def test_tilde_in_storage_and_pid_paths(zodbd_bin, tmp_path, monkeypatch):
    """zeo.conf with `path ~/Data.fs` and `pid-filename ~/zeo.pid`: the
    `path` of <filestorage> (ZODB's component.xml) and `pid-filename`
    (ZEO's server.xml), like `blob-dir` and the <ssl> files, have ZConfig's
    datatype existing-dirpath, which applies os.path.expanduser: runzeo
    serves $HOME/Data.fs and writes $HOME/zeo.pid. zodbd took the value
    as it was and refused to start ("lock file: open ~/Data.fs.lock: no
    such file or directory"); in a directory with a `~` subdirectory it
    would have served another file than runzeo. It expands them now
    (zeo/config_test.go: which keys)."""
    home = tmp_path / 'home'
    home.mkdir()
    run = tmp_path / 'run'
    run.mkdir()
    monkeypatch.setenv('HOME', str(home))
    monkeypatch.chdir(run)
    for kind in ['runzeo', 'zodbd']:
        if kind == 'runzeo' and not runzeo_cmd():
            continue
        port = free_port()
        conf = ('<zeo>\n  address 127.0.0.1:%d\n  pid-filename ~/zeo.pid\n</zeo>\n'
                '<filestorage 1>\n  path ~/Data.fs\n</filestorage>\n' % port)
        try:
            srv = Server(zodbd_bin, None, run, kind=kind, conf=conf, port=port).start()
        except RuntimeError as e:
            pytest.fail('%s refused to start: %s' % (kind, str(e)[-300:]))
        try:
            assert (home / 'Data.fs').exists(), kind
            assert (home / 'zeo.pid').exists(), kind
        finally:
            srv.stop()
        for f in os.listdir(home):
            os.remove(home / f)


def test_create_under_a_read_only_server(zodbd_bin, tmp_path):
    """A read-only server (`<filestorage> read-only true`, no lock, as
    runzeo's) serves Data.fs; a writer is started on the same file with
    `--create` and commits a new root. With runzeo as the writer
    (`create true`), the read-only server goes on serving the database it
    opened (root b'A...', its own tid): FileStorage(create=True) unlinks
    the file and makes a new one. With zodbd as the writer, the file was
    truncated in place, and the read-only server, through its index,
    served the other database's root (b'B...') with a serial newer than
    its own lastTransaction; so does zodbd now."""
    path = str(tmp_path / 'Data.fs')
    fs = FileStorage(path)
    t = TransactionMetaData()
    fs.tpc_begin(t)
    fs.store(z64, z64, b'A' * 50, '', t)
    fs.tpc_vote(t)
    told = fs.tpc_finish(t)
    fs.close()
    port = free_port()
    ro = Server(zodbd_bin, None, tmp_path, port=port, conf=(
        '<zeo>\n  address 127.0.0.1:%d\n  read-only true\n</zeo>\n'
        '<filestorage 1>\n  path %s\n  read-only true\n</filestorage>\n' % (port, path))).start()
    try:
        w = Server(zodbd_bin, path, tmp_path, extra=['--create']).start()
        try:
            cs = ClientStorage(w.addr, wait_timeout=10)
            commit(cs, z64, z64, b'B' * 50)
            cs.close()
        finally:
            w.stop()
        cs = ClientStorage(ro.addr, read_only=True, wait_timeout=10)
        try:
            assert cs.load(z64) == (b'A' * 50, told)
        finally:
            cs.close()
    finally:
        ro.stop()


# --- signals while the storages open ----------------------------------------

def test_sigterm_while_opening_storages(zodbd_bin, tmp_path):
    """SIGTERM (or SIGINT) while the storages are being opened: here the
    open cannot finish (Data.fs.index is a FIFO nobody writes, standing in
    for an index read or a full scan that takes minutes, or a hung
    filesystem). runzeo stops at once (it sets its signal handlers only
    after open_storages, so SIGTERM ends it). zodbd catches SIGTERM, SIGINT
    and SIGHUP before it binds its socket (cmd/zodbd/serve.go:
    signal.Notify before listen) but read the channel only once serving:
    it ignored SIGTERM and SIGINT for as long as the open lasted (here for
    ever; `systemctl stop` waits for its timeout and SIGKILLs it), while
    its socket accepted connections that were never answered. Until the
    server is made, SIGTERM and SIGINT stop the start now: with status 0
    once the storages are open, by the signal (as runzeo) when they take
    more than 2 s (test_pack_edges.py's kill test stops a server whose
    storages open at once: status 0)."""
    path = tmp_path / 'Data.fs'
    fs = FileStorage(str(path))
    t = TransactionMetaData()
    fs.tpc_begin(t)
    fs.store(fs.new_oid(), z64, b'x' * 300, '', t)
    fs.tpc_vote(t)
    fs.tpc_finish(t)
    fs.close()
    os.remove(str(path) + '.index')
    os.mkfifo(str(path) + '.index')
    rc = signal_while_starting([zodbd_bin, 'serve', '-a', '127.0.0.1:%d' % free_port(), '-f', str(path)],
                               signal.SIGTERM, 'opening its storage')
    assert rc == -signal.SIGTERM, rc
