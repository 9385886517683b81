"""zc.zlibstorage with `zodbd serve`, against the package itself (PyPI
zc.zlibstorage, the wrappers plone.recipe.zeoserver's `zlib-storage =
active | passive` configures):

- <zlibstorage> (active): the server compresses what plain clients store
  and decompresses what they load; ZODB/py reads the file through
  zc.zlibstorage's ZlibStorage, and the server serves plain what ZODB/py
  wrote through it.
- <serverzlibstorage> (passive): clients wrap ClientStorage in ZlibStorage;
  records pass through the server as they are, and a pack through the
  server collects garbage (the references are read from the compressed
  records), as ZODB/py's pack through ServerZlibStorage does: `zodbd pack`
  of such a file gives the same bytes as ZODB/py's.
"""
import os
import shutil
import time

import transaction
import ZEO
import ZODB.blob
from persistent.mapping import PersistentMapping
from ZEO.ClientStorage import ClientStorage
from ZODB import DB
from ZODB.FileStorage import FileStorage
from ZODB.POSException import POSKeyError
from ZODB.serialize import referencesf
from zc.zlibstorage import ZlibStorage

from testutil import fstest, read, zodbd
from zeoserver import free_port

TEXT = 'ZODB object state compresses well. ' * 20


def conf(port, path, section='zlibstorage', compress=None, zeo=''):
    """zeo.conf of a <section> (zlibstorage or serverzlibstorage, with
    its compress key unless None) around a <filestorage>; zeo: more
    <zeo> lines."""
    key = '' if compress is None else '  compress %s\n' % ('true' if compress else 'false')
    return '''
%%import zc.zlibstorage
<zeo>
  address 127.0.0.1:%d
  %s
</zeo>
<%s 1>
%s  <filestorage 1>
    path %s
  </filestorage>
</%s>
''' % (port, zeo, section, key, path, section)


def records(path):
    """Every data record of a FileStorage, raw: [(oid, data)]."""
    st = FileStorage(path, read_only=True)
    try:
        return [(r.oid, r.data) for t in st.iterator() for r in t]
    finally:
        st.close()


def fill(db):
    """root['a'], root['b'] (a chain a -> c), and garbage: an object that
    was referenced from the root, then dropped. Returns the garbage's oid."""
    conn = db.open()
    root = conn.root()
    root['a'] = PersistentMapping({'text': TEXT, 'n': 1})
    root['b'] = PersistentMapping({'text': TEXT + 'b'})
    root['b']['c'] = PersistentMapping({'text': TEXT + 'c'})
    root['junk'] = PersistentMapping({'text': TEXT + 'junk'})
    transaction.commit()
    junk = root['junk']._p_oid
    del root['junk']
    root['a']['n'] = 2
    transaction.commit()
    conn.close()
    return junk


def check(root, n=2):
    assert root['a']['text'] == TEXT and root['a']['n'] == n
    assert root['b']['c']['text'] == TEXT + 'c'



def zlib_blob_conf(port, path, blobs):
    """zeo.conf of a <zlibstorage> around a <blobstorage> around a
    <filestorage> (plone.recipe.zeoserver's zlib-storage with blobs)."""
    return '''
%%import zc.zlibstorage
<zeo>
  address 127.0.0.1:%d
</zeo>
<zlibstorage 1>
  <blobstorage 1>
    blob-dir %s
    <filestorage 1>
      path %s
    </filestorage>
  </blobstorage>
</zlibstorage>
''' % (port, blobs, path)

def test_zlibstorage_active(serve, tmp_path):
    path = str(tmp_path / 'Data.fs')
    port = free_port()
    srv = serve(path, conf=conf(port, path, 'zlibstorage'), port=port)
    db = DB(ClientStorage(srv.addr, wait_timeout=10))
    try:
        fill(db)
        conn = db.open()
        check(conn.root())
        conn.close()
    finally:
        db.close()
    srv.stop()
    fstest(path)
    # In the file, the mappings' records are compressed...
    raw = records(path)
    assert sum(d.startswith(b'.z') for _, d in raw) >= 5, raw
    # ...and ZODB/py reads them through ZlibStorage.
    db = DB(ZlibStorage(FileStorage(path)))
    try:
        conn = db.open()
        check(conn.root())
        # ZODB/py writes through ZlibStorage; the server serves it plain.
        conn.root()['a']['n'] = 3
        transaction.commit()
        conn.close()
    finally:
        db.close()
    srv.start()
    cs = ClientStorage(srv.addr, wait_timeout=10, read_only=True)
    db = DB(cs)
    try:
        conn = db.open()
        check(conn.root(), n=3)
        data, _ = cs.load(conn.root()['a']._p_oid)
        assert not data.startswith(b'.z') and b'compresses well' in data
        conn.close()
    finally:
        db.close()


def test_serverzlibstorage_passive_pack(serve, tmp_path, zodbd_bin):
    path = str(tmp_path / 'Data.fs')
    port = free_port()
    srv = serve(path, conf=conf(port, path, 'serverzlibstorage'), port=port)
    cs = ClientStorage(srv.addr, wait_timeout=10)
    db = DB(ZlibStorage(cs))
    try:
        junk = fill(db)
        # The server stores what the client compressed.
        data, _ = cs.load(db.open().root()['a']._p_oid)
        assert data.startswith(b'.z')
        time.sleep(0.01)
        before_pack = str(tmp_path / 'before-pack.fs')
        shutil.copyfile(path, before_pack)
        db.pack()  # through the server: it must read compressed references
        conn = db.open()
        check(conn.root())
        conn.close()
    finally:
        db.close()
    srv.stop()
    fstest(path)
    st = ZlibStorage(FileStorage(path, read_only=True))
    try:
        try:
            st.load(junk)
        except POSKeyError:
            pass
        else:
            raise AssertionError('the garbage object survived the pack')
    finally:
        st.close()

    # Offline: zodbd pack and ZODB/py's pack through ServerZlibStorage's
    # references give the same bytes.
    ours = str(tmp_path / 'ours.fs')
    theirs = str(tmp_path / 'theirs.fs')
    shutil.copyfile(before_pack, ours)
    shutil.copyfile(before_pack, theirs)
    t = time.time()
    st = ZlibStorage(FileStorage(theirs))
    try:
        st.pack(t, referencesf)
    finally:
        st.close()
    zodbd(zodbd_bin, 'pack', '--time', repr(t), ours)
    assert read(ours) == read(theirs)
    assert len(read(ours)) < len(read(before_pack))


def test_zlibstorage_with_blobs(serve, tmp_path):
    """<zlibstorage> around a <blobstorage> (plone.recipe.zeoserver's
    zlib-storage with blob-storage): blobs go to the blob directory as
    usual, object records are compressed; a second client reads both."""
    path = str(tmp_path / 'Data.fs')
    blobs = str(tmp_path / 'blobs')
    port = free_port()
    text = zlib_blob_conf(port, path, blobs)
    srv = serve(path, conf=text, port=port)
    big = os.urandom(300000)
    db = ZEO.DB(srv.addr, blob_dir=str(tmp_path / 'cache1'), wait_timeout=10)
    try:
        conn = db.open()
        root = conn.root()
        root['doc'] = PersistentMapping({'text': TEXT})
        root['file'] = ZODB.blob.Blob(big)
        transaction.commit()
        conn.close()
    finally:
        db.close()
    db = ZEO.DB(srv.addr, blob_dir=str(tmp_path / 'cache2'), wait_timeout=10)
    try:
        conn = db.open()
        root = conn.root()
        assert root['doc']['text'] == TEXT
        with root['file'].open() as f:
            assert f.read() == big
        conn.close()
    finally:
        db.close()
    srv.stop()
    assert any(d.startswith(b'.z') for _, d in records(path))
    blob_files = [f for _, _, fs in os.walk(blobs) for f in fs if f.endswith('.blob')]
    assert len(blob_files) == 1
