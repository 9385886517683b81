"""Blobs and the offline tools: `zodbd pack --blob-dir` and `zodbd copy`
with blob directories, against ZODB/py.

Blobs are committed through `zodbd serve` with the stock ZEO client
(revisions replaced before the pack time, an object that becomes
unreachable, one never reachable, an undo after the pack time); then the
server stops and the same Data.fs and blob directory are packed twice, by
`zodbd pack --blob-dir` and by ZODB/py's FileStorage(blob_dir=...).pack,
at the same time. Both must leave the same blob files, with the same
content, and ZODB/py reads every remaining blob from the zodbd-packed
copy. `zodbd copy` of the blob directory is read back by ZODB/py.
"""
import os
import shutil
import time

import transaction
import ZEO
import ZODB
import ZODB.blob
import ZODB.FileStorage
import ZODB.utils
from ZODB.serialize import referencesf

from zeoserver import Server, free_port


def blob_files(blob_dir):
    """{relative path: content} of every .blob file under blob_dir."""
    out = {}
    for path, _, files in os.walk(blob_dir):
        for f in files:
            if f.endswith('.blob'):
                p = os.path.join(path, f)
                with open(p, 'rb') as fp:
                    out[os.path.relpath(p, blob_dir)] = fp.read()
    return out


def write(blob, data):
    with blob.open('w') as f:
        f.write(data)


def read(blob):
    with blob.open('r') as f:
        return f.read()


def commit_scenario(zodbd_bin, tmp, marshal='Z'):
    """Commit through zodbd serve; return the pack time."""
    port = free_port()
    conf = ('<zeo>\naddress 127.0.0.1:%d\n</zeo>\n'
            '<filestorage 1>\npath %s\nblob-dir %s\n</filestorage>\n'
            % (port, os.path.join(tmp, 'Data.fs'), os.path.join(tmp, 'blobs')))
    srv = Server(zodbd_bin, None, tmp, msgpack=(marshal == 'M'), conf=conf, port=port).start()
    try:
        db = ZEO.DB(srv.addr, blob_dir=os.path.join(tmp, 'cache'))
        conn = db.open()
        root = conn.root()
        root['keep'] = ZODB.blob.Blob(b'k1')
        root['gone'] = ZODB.blob.Blob(b'g1')
        root['undo'] = ZODB.blob.Blob(b'u1')
        transaction.commit()
        # Never reachable: stored under a new oid nothing refers to.
        orphan = ZODB.blob.Blob(b'o1')
        conn.add(orphan)
        transaction.commit()
        write(root['keep'], b'k2')
        transaction.commit()
        write(root['undo'], b'u2')
        transaction.get().note(u'undo me')
        transaction.commit()
        del root['gone']
        transaction.commit()
        time.sleep(0.05)
        pack_time = time.time()
        time.sleep(0.05)
        write(root['keep'], b'k3')
        transaction.commit()
        undo_id = [e['id'] for e in db.undoLog(0, 10) if e['description'] == 'undo me'][0]
        db.undo(undo_id)
        transaction.commit()
        conn.sync()
        assert read(root['undo']) == b'u1'
        db.close()
    finally:
        assert srv.stop() == 0
    return pack_time


def test_pack_blobs_as_zodbpy(zodbd_bin, run_zodbd, tmp_path, marshal):
    tmp = str(tmp_path)
    pack_time = commit_scenario(zodbd_bin, tmp, marshal)
    before = blob_files(os.path.join(tmp, 'blobs'))
    assert len(before) == 8, sorted(before)
    zd, py = os.path.join(tmp, 'zd'), os.path.join(tmp, 'py')
    for d in (zd, py):
        os.mkdir(d)
        shutil.copyfile(os.path.join(tmp, 'Data.fs'), os.path.join(d, 'Data.fs'))
        shutil.copytree(os.path.join(tmp, 'blobs'), os.path.join(d, 'blobs'))

    run_zodbd('pack', '-q', '--time', repr(pack_time), '--blob-dir',
              os.path.join(zd, 'blobs'), os.path.join(zd, 'Data.fs'))

    fs = ZODB.FileStorage.FileStorage(os.path.join(py, 'Data.fs'),
                                      blob_dir=os.path.join(py, 'blobs'))
    fs.pack(pack_time, referencesf)
    fs.close()

    got = blob_files(os.path.join(zd, 'blobs'))
    want = blob_files(os.path.join(py, 'blobs'))
    assert sorted(got) == sorted(want)
    assert got == want
    assert len(got) < len(before)  # the pack removed something

    # ZODB/py reads every remaining blob from zodbd's packed copy.
    fs = ZODB.FileStorage.FileStorage(os.path.join(zd, 'Data.fs'),
                                      blob_dir=os.path.join(zd, 'blobs'), read_only=True)
    try:
        records = {(r.oid, t.tid) for t in fs.iterator() for r in t}
        for rel in got:
            parts = rel.split(os.sep)
            oid = ZODB.utils.p64(int(''.join(p[2:] for p in parts[:-1]), 16))
            tid = ZODB.utils.p64(int(parts[-1][:-len('.blob')], 16))
            assert (oid, tid) in records  # each file is a kept record's blob
            with open(fs.loadBlob(oid, tid), 'rb') as f:
                assert f.read() == got[rel]
        db = ZODB.DB(fs)
        root = db.open().root()
        assert read(root['keep']) == b'k3'
        assert read(root['undo']) == b'u1'
        assert 'gone' not in root
        db.close()
    finally:
        fs.close()


def test_copy_blobs_read_by_zodbpy(zodbd_bin, run_zodbd, tmp_path):
    tmp = str(tmp_path)
    commit_scenario(zodbd_bin, tmp)
    dst = os.path.join(tmp, 'dst')
    run_zodbd('copy', '-q', '--src-blob-dir', os.path.join(tmp, 'blobs'),
              '--dst-blob-dir', os.path.join(dst, 'blobs'),
              os.path.join(tmp, 'Data.fs'), os.path.join(dst, 'Data.fs'))
    assert blob_files(os.path.join(dst, 'blobs')) == blob_files(os.path.join(tmp, 'blobs'))
    fs = ZODB.FileStorage.FileStorage(os.path.join(dst, 'Data.fs'),
                                      blob_dir=os.path.join(dst, 'blobs'), read_only=True)
    db = ZODB.DB(fs)
    try:
        root = db.open().root()
        assert read(root['keep']) == b'k3'
        assert read(root['undo']) == b'u1'
    finally:
        db.close()
