"""`zodbd backup` / `zodbd restore` at the edges, against ZODB's repozo.

Each test is a case an audit against repozo (ZODB 6.4) found wrong, fixed
and minimized; the oracle is repozo or the Data.fs as it was at the point
restored. (The random differential the audit ran, backups of random
histories by both tools compared file by file and restored at every
point, matched; tests/test_backup_repozo.py keeps the interoperability
checks.)
"""
import gzip
import os
import struct
import time

import pytest
import transaction
import ZODB
import ZODB.blob
import ZODB.FileStorage
from persistent.mapping import PersistentMapping


# A RAM file system for tmp_path, repozo, next_second: test_backup_repozo.py's.
from test_backup_repozo import next_second, repozo, tmp_path  # noqa: E402,F401


def commit(path, n, start=0, key=None, blob_dir=None):
    """n transactions through ZODB/py; returns their tids."""
    db = ZODB.DB(ZODB.FileStorage.FileStorage(str(path), blob_dir=blob_dir))
    tids = []
    try:
        conn = db.open()
        root = conn.root()
        for i in range(start, start + n):
            root[key or 'k%d' % (i % 3)] = PersistentMapping(v=i, pad=b'x' * (i * 37 % 300))
            transaction.commit()
            tids.append(conn._storage.lastTransaction())
        conn.close()
    finally:
        db.close()
    return tids


def pack_now(path, blob_dir=None):
    db = ZODB.DB(ZODB.FileStorage.FileStorage(str(path), blob_dir=blob_dir))
    try:
        time.sleep(0.05)
        db.pack(time.time())
    finally:
        db.close()


def read(path):
    with open(str(path), 'rb') as f:
        return f.read()


def cut_at(data, tid):
    """The bytes of the FileStorage data up to the end of the last
    transaction whose tid is <= tid (what `restore --to tid` promises)."""
    pos = 4
    while pos < len(data):
        t, tlen = struct.unpack('>8sQ', data[pos:pos + 16])
        if t > tid:
            break
        pos += tlen + 8
    return data[:pos]


def listing(repo, ext):
    return sorted(n for n in os.listdir(str(repo)) if n.endswith(ext))


# --- restore --to ----------------------------------------------------------

def test_to_point_in_set_ending_with_empty_incremental(run_zodbd, tmp_path):
    """repozo writes a 0-byte .deltafs when it runs while a commit is being
    voted (bytes after the last committed transaction, nothing new
    committed). `restore --to` read the last tid of a set ending with one as
    0 and skipped the set, then cut the newer, packed set at the point: it
    wrote a database without the state at the point (here an empty one) and
    exited 0. The last tid is now that of the set's last file holding a
    transaction."""
    fs = tmp_path / 'Data.fs'
    repo = tmp_path / 'repo'
    repo.mkdir()
    tids = commit(fs, 5, key='x')
    before = read(fs)
    repozo('-B', '-r', repo, '-f', fs)
    # A transaction being voted (status 'c') when repozo runs again.
    last = before[-8 - struct.unpack('>Q', before[-8:])[0]:]
    voting = bytearray(last)
    voting[0:8] = struct.pack('>Q', struct.unpack('>Q', tids[-1])[0] + 1)
    voting[16] = ord('c')
    with open(str(fs), 'ab') as f:
        f.write(bytes(voting))
    next_second()
    repozo('-B', '-r', repo, '-f', fs)
    empty = [n for n in listing(repo, '.deltafs') if os.path.getsize(str(repo / n)) == 0]
    assert empty, os.listdir(str(repo))
    # The vote was aborted; the database goes on, is packed, and the next
    # backup is a new set.
    with open(str(fs), 'r+b') as f:
        f.truncate(len(before))
    commit(fs, 3, start=5, key='x')
    pack_now(fs)
    next_second()
    run_zodbd('backup', '-q', '-r', repo, fs)
    assert len(listing(repo, '.dat')) == 2

    out = tmp_path / 'out.fs'
    run_zodbd('restore', '-q', '-r', repo, '--to', tids[2].hex(), '-o', out)
    assert read(out) == cut_at(before, tids[2]), os.path.getsize(str(out))


def test_to_point_before_packed_set_is_refused(run_zodbd, tmp_path):
    """`restore --to` a point older than every transaction of the only set
    left (packed after the point, the older sets removed by -k) wrote an
    empty database (4 bytes, 'to tid 0000000000000000') and exited 0: the
    state at the point is not in the repository. A cut before a packed
    transaction (status 'p') is now refused."""
    fs = tmp_path / 'Data.fs'
    repo = tmp_path / 'repo'
    repo.mkdir()
    tids = commit(fs, 5, key='x')
    run_zodbd('backup', '-q', '-r', repo, fs)
    commit(fs, 3, start=5, key='x')
    pack_now(fs)
    next_second()
    run_zodbd('backup', '-q', '-k', '-r', repo, fs)
    assert len(listing(repo, '.dat')) == 1
    out = tmp_path / 'out.fs'
    p = run_zodbd('restore', '-r', repo, '--to', tids[2].hex(), '-o', out, check=False)
    assert p.returncode != 0, (p.stdout, os.path.getsize(str(out)))


def test_to_unaffected_by_older_set_with_unlisted_file(run_zodbd, tmp_path):
    """An older set whose last data file is not in its .dat (repozo killed
    between writing the file and appending its line; a plain restore of that
    set skips such a file) made every `restore --to` fail, even for a point
    in the newest set, which a plain restore restores."""
    fs = tmp_path / 'Data.fs'
    repo = tmp_path / 'repo'
    repo.mkdir()
    commit(fs, 3)
    repozo('-B', '-r', repo, '-f', fs)
    commit(fs, 3, start=3)
    next_second()
    repozo('-B', '-r', repo, '-f', fs)
    dat = repo / listing(repo, '.dat')[0]
    lines = read(dat).splitlines(True)
    with open(str(dat), 'wb') as f:
        f.write(lines[0])
    tids = commit(fs, 3, start=6)
    next_second()
    repozo('-B', '-F', '-r', repo, '-f', fs)
    out = tmp_path / 'out.fs'
    run_zodbd('restore', '-q', '-r', repo, '-o', out)
    assert read(out) == read(fs)
    run_zodbd('restore', '-q', '-r', repo, '--to', tids[1].hex(), '-o', out)
    assert read(out) == cut_at(read(fs), tids[1])


# --- a data file the .dat does not list -----------------------------------

def test_restore_skipping_unlisted_newest_file_says_so(run_zodbd, tmp_path):
    """The newest backup file, complete (both tools rename it into place
    after syncing it) but not yet in the .dat (killed before the .dat was
    written): repozo -R restores it; zodbd restore (with or without
    --verify) restores the state before it, verified, and exited 0 saying
    nothing unless -v: the operator got an older database without a word.
    It now warns, naming the file."""
    fs = tmp_path / 'Data.fs'
    repo = tmp_path / 'repo'
    repo.mkdir()
    commit(fs, 3)
    run_zodbd('backup', '-q', '-r', repo, fs)
    commit(fs, 3, start=3)
    next_second()
    run_zodbd('backup', '-q', '-r', repo, fs)
    dat = repo / listing(repo, '.dat')[0]
    lines = read(dat).splitlines(True)
    with open(str(dat), 'wb') as f:
        f.write(lines[0])
    skipped = listing(repo, '.deltafs')[0]
    repozo('-R', '-r', repo, '-o', tmp_path / 'py.fs')
    assert read(tmp_path / 'py.fs') == read(fs)
    for extra in ([], ['--verify']):
        out = tmp_path / 'out.fs'
        p = run_zodbd('restore', '-r', repo, '-o', out, *extra)
        if read(out) != read(fs):
            assert skipped in p.stdout + p.stderr, (extra, p.stdout, p.stderr)


# --- gzip -----------------------------------------------------------------

def test_gzip_file_with_trailing_zero_padding(run_zodbd, tmp_path):
    """gzip allows zero padding after the last member (gzip -d and Python's
    gzip module, hence repozo -R/-V, ignore it); zodbd restore and
    backup --verify rejected the file ('gzip: invalid header')."""
    fs = tmp_path / 'Data.fs'
    repo = tmp_path / 'repo'
    repo.mkdir()
    commit(fs, 3)
    run_zodbd('backup', '-q', '-r', repo, fs)
    commit(fs, 3, start=3)
    next_second()
    run_zodbd('backup', '-q', '-z', '-r', repo, fs)
    z = repo / listing(repo, '.deltafsz')[0]
    with open(str(z), 'ab') as f:
        f.write(b'\0' * 16)
    repozo('-V', '-r', repo)
    repozo('-R', '-r', repo, '-o', tmp_path / 'py.fs')
    assert read(tmp_path / 'py.fs') == read(fs)
    run_zodbd('backup', '--verify', '-q', '-r', repo)
    run_zodbd('restore', '-q', '-r', repo, '-o', tmp_path / 'out.fs')
    assert read(tmp_path / 'out.fs') == read(fs)


def test_truncated_gzip_at_member_boundary_is_not_restored(run_zodbd, tmp_path):
    """A .deltafsz of several gzip members (zodbd writes such files),
    truncated where a member ends and a transaction ends: without --verify,
    zodbd restore wrote the older state and exited 0, though the .dat says
    how many bytes the file holds (docs: a restore fails when a listed file
    is of another size, rather than restoring an older state). The size was
    only checked for uncompressed files."""
    fs = tmp_path / 'Data.fs'
    repo = tmp_path / 'repo'
    repo.mkdir()
    commit(fs, 3)
    run_zodbd('backup', '-q', '-r', repo, fs)
    start = os.path.getsize(str(fs))
    commit(fs, 4, start=3)
    next_second()
    run_zodbd('backup', '-q', '-z', '-r', repo, fs)
    z = repo / listing(repo, '.deltafsz')[0]
    data = read(fs)
    # Members split at a transaction boundary inside the file.
    delta = data[start:]
    tlen = struct.unpack('>Q', delta[8:16])[0]
    split = tlen + 8
    with open(str(z), 'wb') as f:
        f.write(gzip.compress(delta[:split]) + gzip.compress(delta[split:]))
    run_zodbd('backup', '--verify', '-q', '-r', repo)  # a sound file
    with open(str(z), 'wb') as f:  # cut after the first member
        f.write(gzip.compress(delta[:split]))
    out = tmp_path / 'out.fs'
    p = run_zodbd('restore', '-q', '-r', repo, '-o', out, check=False)
    assert p.returncode != 0 or read(out) == data, (p.returncode, os.path.getsize(str(out)), len(data))


# --- blobs ----------------------------------------------------------------

def blob_files(d):
    out = set()
    for root, dirs, files in os.walk(str(d)):
        dirs[:] = [x for x in dirs if not (root == str(d) and x == 'tmp')]
        for f in files:
            if f.endswith('.blob'):
                out.add(os.path.relpath(os.path.join(root, f), str(d)))
    return out


def test_restored_blob_dir_lacks_packed_revisions(run_zodbd, tmp_path):
    """After a pack, `restore --blob-dir` of the newest (packed) set copied
    back the blob files of the revisions the pack removed (kept in
    REPO/blobs): the restored blob directory was not the one ZODB had at
    that point, and no later pack removes them (ZODB only removes the files
    of the records it drops). Only the blob files of the restored file's
    records are restored now."""
    fs = tmp_path / 'Data.fs'
    blobs = tmp_path / 'blobs'
    repo = tmp_path / 'repo'
    repo.mkdir()
    db = ZODB.DB(ZODB.FileStorage.FileStorage(str(fs), blob_dir=str(blobs)))
    try:
        root = db.open().root()
        root['b'] = ZODB.blob.Blob(b'rev1' * 1000)
        transaction.commit()
        with root['b'].open('w') as f:
            f.write(b'rev2' * 1000)
        transaction.commit()
    finally:
        db.close()
    run_zodbd('backup', '-q', '-r', repo, '--blob-dir', blobs, fs)
    pack_now(fs, blob_dir=str(blobs))
    next_second()
    run_zodbd('backup', '-q', '-r', repo, '--blob-dir', blobs, fs)
    live = blob_files(blobs)
    assert len(live) == 1
    rdir = tmp_path / 'restored'
    rdir.mkdir()
    run_zodbd('restore', '-q', '-r', repo, '-o', rdir / 'Data.fs', '--blob-dir', rdir / 'blobs')
    assert read(rdir / 'Data.fs') == read(fs)
    assert blob_files(rdir / 'blobs') == live


# --- options --------------------------------------------------------------

def test_verify_quick_as_repozo(run_zodbd, tmp_path):
    """repozo -V -Q verifies the sizes only; docs/operations.md lists -Q
    among the options with repozo's names, but `zodbd backup --verify -Q`
    was a usage error (exit 2)."""
    fs = tmp_path / 'Data.fs'
    repo = tmp_path / 'repo'
    repo.mkdir()
    commit(fs, 3)
    run_zodbd('backup', '-q', '-r', repo, fs)
    repozo('-V', '-Q', '-r', repo)
    run_zodbd('backup', '--verify', '-Q', '-r', repo)


def a_changed_once(tmp_path):
    """Data.fs where root['a'] (v 5, then 100) has two records, then
    root['b'] is made; returns its path, an empty repository and a's oid."""
    fs = tmp_path / 'Data.fs'
    repo = tmp_path / 'repo'
    repo.mkdir()
    db = ZODB.DB(ZODB.FileStorage.FileStorage(str(fs)))
    try:
        conn = db.open()
        root = conn.root()
        root['a'] = PersistentMapping(v=5)
        transaction.commit()
        root['a']['v'] = 100
        transaction.commit()
        root['b'] = PersistentMapping(v=1)
        transaction.commit()
        return fs, repo, root['a']._p_oid
    finally:
        db.close()


def point_at_first_record(fs, index, oid):
    """Damages the index file: oid points at its first record in fs."""
    import ZODB.fsIndex
    st = ZODB.FileStorage.FileStorage(str(fs), read_only=True)
    first = [r.pos for t in st.iterator() for r in t if r.oid == oid][0]
    st.close()
    d = ZODB.fsIndex.fsIndex.load(str(index))
    assert d['index'][oid] != first
    d['index'][oid] = first
    d['index'].save(d['pos'], str(index))


# --- the .index of an incremental backup ----------------------------------

def test_incremental_index_not_inherited_from_damaged_repo_index(run_zodbd, tmp_path):
    """An incremental backup's .index was built from the repository's
    previous .index (when it passes ZODB/py's sanity check, which looks at
    the last transaction only), not from the live file's as repozo's is. A
    damaged one (here an oid pointing at its older record) was carried into
    every later .index, which a plain restore installs: the restored
    database served the older revision (a.v == 5, not 100) without an
    error. repozo's next backup writes the right index (Data.fs.index), as
    zodbd's now does when Data.fs.index passes the sanity check."""
    fs, repo, oid = a_changed_once(tmp_path)
    run_zodbd('backup', '-q', '-r', repo, fs)
    point_at_first_record(fs, repo / listing(repo, '.index')[0], oid)
    assert run_zodbd('backup', '--verify', '-q', '-r', repo, check=False).returncode == 1
    commit(fs, 1, key='c')  # ZODB/py writes Data.fs.index at close
    next_second()
    out = run_zodbd('backup', '-r', repo, fs).stdout
    assert 'incremental' in out, out
    newest = repo / listing(repo, '.index')[-1]
    r = tmp_path / 'r.fs'
    run_zodbd('restore', '-q', '-r', repo, '-o', r)
    db = ZODB.DB(ZODB.FileStorage.FileStorage(str(r), read_only=True))
    try:
        got = db.open().root()['a']['v']
    finally:
        db.close()
    assert (got, read(newest) == read(str(fs) + '.index')) == (100, True)


# --- verify --date ----------------------------------------------------------

def test_verify_date_checks_the_index_restore_date_installs(run_zodbd, tmp_path):
    """`backup --verify --date D` is to verify what `restore --date D`
    reads; the restore installs D's .index, but verify checked only the
    .index of the set's last file: a damaged D.index passed, and the
    restore (without --verify) installed it (the restored database served
    an older revision)."""
    fs, repo, oid = a_changed_once(tmp_path)
    run_zodbd('backup', '-q', '-r', repo, fs)
    commit(fs, 1, key='c')
    next_second()
    run_zodbd('backup', '-q', '-r', repo, fs)
    commit(fs, 1, key='d')
    next_second()
    run_zodbd('backup', '-q', '-r', repo, fs)
    middle = listing(repo, '.index')[1]
    stamp = middle[:-len('.index')]
    point_at_first_record(fs, repo / middle, oid)
    p = run_zodbd('backup', '--verify', '-q', '-r', repo, '--date', stamp, check=False)
    assert p.returncode == 1, 'verify --date passed; restore --date installs the damaged %s' % middle
