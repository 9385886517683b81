"""Live interoperability of `zodbd neo-storage` with NEO/py (opt-in).

NEO/py cannot be installed from PyPI in a current version, so these tests
run only when a NEO/py source tree and a Python that can import it are
given (see docs/neo.md, "Checking against NEO/py"):

    NEOPY_SRC=/path/to/neoppod NEOPY_PYTHON=/path/to/venv/bin/python \
        .venv/bin/python -m pytest tests/test_neo_interop.py

A real NEO/py master (`neomaster`), admin (`neoadmin`) and `neoctl` run
the cluster; zodbd's node is its only storage; NEO/py's client
(`neo.client.Storage`) reads through it, and what it reads must equal
ZODB/py's FileStorage (FileStorage backend) or what NEO/py's own storage
served on the same SQLite database (the recorded client results)."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

import neocluster

SRC = os.environ.get('NEOPY_SRC')
PY = os.environ.get('NEOPY_PYTHON')
pytestmark = pytest.mark.skipif(not (SRC and PY), reason='NEOPY_SRC and NEOPY_PYTHON not set (opt-in)')

READER = r'''
import hashlib, json, sys
from ZODB.utils import p64
kind, where, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
tls = dict(zip(('ca', 'cert', 'key'), sys.argv[4:7]))
if kind == 'fs':
    from ZODB.FileStorage import FileStorage
    st = FileStorage(where, read_only=True)
elif kind == 'zfs':  # the project's Python: zc.zlibstorage is not in NEO/py's venv
    from ZODB.FileStorage import FileStorage
    from zc.zlibstorage import ZlibStorage
    st = ZlibStorage(FileStorage(where, read_only=True))
else:
    from neo.client.Storage import Storage
    st = Storage(master_nodes=where, name='vectors', read_only=True, **tls)
out = {'loads': [], 'history': [], 'iter': 0, 'records': []}
for oid in range(n):
    data, serial = st.load(p64(oid))
    out['loads'].append([serial.hex(), hashlib.sha1(data).hexdigest(), len(data)])
    out['history'].append([[h['tid'].hex(), h['size']] for h in st.history(p64(oid), size=100)])
from ZODB.utils import u64
for t in st.iterator():
    for r in t:
        out['iter'] += 1
        out['records'].append([t.tid.hex(), u64(r.oid), None if r.data is None else hashlib.sha1(r.data).hexdigest()])
from ZODB.POSException import POSKeyError
if kind != 'neo':
    def alive(oid):
        try:
            st.load(oid)
            return True
        except POSKeyError:
            return False
    out['oids'] = [u64(o) for o in sorted(st._index.keys()) if alive(o)]
else:
    out['oids'] = [u64(o) for o in st.app.oids()]  # AskOIDsFrom on every partition
st.close()
print(json.dumps(out))
'''


def neopy_tls():
    """NEO/py's test certificates (one CA, one certificate for every node
    and client): (ca, cert, key)."""
    d = os.path.join(SRC, 'neo', 'tests')
    return tuple(os.path.join(d, f) for f in ('ca.crt', 'node.crt', 'node.key'))


def cluster(tmp_path, zodbd_bin, kind='zodbd-fs', **kw):
    """A one-node cluster named 'vectors' (the scripts' name), with
    an admin for neoctl, in tmp_path: node 0's database is Data.fs
    (zodbd-fs), neo.sqlite (zodbd-sqlite, neopy)."""
    kw.setdefault('read_write', False)
    return neocluster.Cluster(kind, str(tmp_path), SRC, PY, zodbd=zodbd_bin, name='vectors', admin=True, **kw)


def read(c, kind, where, n):
    """READER's output: kind 'neo' reads through c's masters (where),
    'fs' and 'zfs' the FileStorage where."""
    tls = c.tls[1::2] if kind == 'neo' else []
    py = sys.executable if kind == 'zfs' else PY
    p = subprocess.run([py, '-c', READER, kind, where, str(n), *tls], env=c.env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def test_neopy_reads_filestorage(tmp_path, zodbd_bin):
    src = os.path.join(os.path.dirname(__file__), '..', 'fs1', 'testdata', '1.fs')
    path = str(tmp_path / 'Data.fs')
    shutil.copyfile(src, path)
    c = cluster(tmp_path, zodbd_bin)
    try:
        c.start().wait_running()
        n = 10
        got = read(c, 'neo', c.master, n)
    finally:
        rc = c.stop(clean=True)
    assert rc == 0  # the node exits cleanly when the master stops the cluster
    want = read(c, 'fs', path, n)
    assert got['loads'] == want['loads']
    assert got['iter'] == want['iter']
    assert got['oids'] == want['oids'] and got['oids']
    # NEO's history sizes are the stored lengths; FileStorage's the
    # record's own data (0 for a backpointer): compare the tids.
    assert [[h[0] for h in x] for x in got['history']] == [[h[0] for h in x] for x in want['history']]


ZWRITER = r'''
import random
import sys
import transaction
from persistent.mapping import PersistentMapping
from ZODB import DB
from ZODB.FileStorage import FileStorage
from zc.zlibstorage import ZlibStorage
db = DB(ZlibStorage(FileStorage(sys.argv[1])))
conn = db.open()
root = conn.root()
for i in range(5):
    root['m%d' % i] = PersistentMapping({'n': i, 'text': ('object %d, a long compressible string. ' % i) * 200})
    transaction.commit()
for i in (0, 2, 4):  # second revisions
    root['m%d' % i]['text'] += 'changed ' * 300
    transaction.commit()
root['m1']['text'] = random.Random(0).randbytes(4000)  # stored as is: zlib would make it longer
transaction.commit()
db.undo(db.undoLog(0, 1)[0]['id'])  # m1 back to its compressed revision: a backpointer
transaction.commit()
db.close()
'''


def test_neopy_reads_zlib_filestorage(tmp_path, zodbd_bin):
    """A FileStorage written by ZODB/py through zc.zlibstorage (records
    stored as b'.z' + zlib data): our node serves such a record as NEO's
    compression 1 with the zlib data, so NEO/py's client (not wrapped in
    ZlibStorage) reads the plain pickles, those ZODB/py reads through
    ZlibStorage(FileStorage)."""
    path = str(tmp_path / 'Data.fs')
    w = subprocess.run([sys.executable, '-c', ZWRITER, path], capture_output=True, text=True, timeout=120)
    assert w.returncode == 0, w.stderr
    from ZODB.FileStorage import FileStorage
    fs = FileStorage(path, read_only=True)
    try:
        raw = [r.data for t in fs.iterator() for r in t if r.data is not None]
    finally:
        fs.close()
    assert sum(1 for d in raw if d[:2] == b'.z') >= 8  # 5 first and 3 second revisions
    assert any(d[:2] != b'.z' for d in raw)  # the random bytes: stored as is
    c = cluster(tmp_path, zodbd_bin)
    try:
        c.start().wait_running()
        n = 6  # the root and five mappings
        got = read(c, 'neo', c.master, n)
    finally:
        rc = c.stop(clean=True)
    assert rc == 0
    want = read(c, 'zfs', path, n)
    assert want['oids'] == list(range(n))
    assert got['loads'] == want['loads']
    assert got['oids'] == want['oids']
    assert got['iter'] == want['iter']
    assert got['records'] == want['records']  # every revision's data, the backpointer's included
    assert [[h[0] for h in x] for x in got['history']] == [[h[0] for h in x] for x in want['history']]


def test_neopy_reads_neopy_sqlite(tmp_path, zodbd_bin, neo_testdata):
    c = cluster(tmp_path, zodbd_bin, 'zodbd-sqlite')
    shutil.copyfile(os.path.join(neo_testdata, 'storage.sqlite'), c.db)
    try:
        c.start().wait_running()  # the partition table is in the DB
        got = read(c, 'neo', c.master, 5)
    finally:
        assert c.stop(clean=True) == 0
    # What NEO/py's client got from NEO/py's own storage on this DB.
    rec = json.load(open(os.path.join(neo_testdata, 'client-results', 'p1-read.json')))
    loads = [[e['serial'], e['sha1'], e['len']] for e in rec['events'] if e['op'] == 'load']
    hist = [[[h['tid'], h['size']] for h in e['result']] for e in rec['events'] if e['op'] == 'history']
    niter = [sum(len(t['records']) for t in e['transactions']) for e in rec['events'] if e['op'] == 'iterator']
    assert got['loads'] == loads[:5]
    assert got['history'] == hist[:5]
    assert got['iter'] == niter[0]


def test_neopy_tls(tmp_path, zodbd_bin):
    """The whole cluster with NEO/py's TLS (mutual, its test certificates):
    NEO/py's master, admin, neoctl and client, zodbd's node; then zodbd's
    own client (neos://) through NEO/py's master."""
    src = os.path.join(os.path.dirname(__file__), '..', 'fs1', 'testdata', '1.fs')
    path = str(tmp_path / 'Data.fs')
    shutil.copyfile(src, path)
    c = cluster(tmp_path, zodbd_bin, tls=neopy_tls())
    try:
        c.start().wait_running()
        n = 10
        got = read(c, 'neo', c.master, n)
        ca, cert, key = c.tls[1::2]
        url = 'neos://vectors@%s?ca=%s&cert=%s&key=%s' % (c.master, ca, cert, key)
        gohash = subprocess.run([zodbd_bin, 'hash', '--sha1', url], capture_output=True, text=True, timeout=120)
        nottls = subprocess.run([zodbd_bin, 'hash', 'neo://vectors@' + c.master], capture_output=True,
                                text=True, timeout=120)
    finally:
        rc = c.stop(clean=True)
    assert rc == 0
    want = read(c, 'fs', path, n)
    assert got['loads'] == want['loads']
    assert got['iter'] == want['iter']
    assert gohash.returncode == 0, gohash.stderr
    fshash = subprocess.run([zodbd_bin, 'hash', '--sha1', path], capture_output=True, text=True, timeout=120)
    assert gohash.stdout.split()[0] == fshash.stdout.split()[0]
    # Without TLS, the master does not let the client in.
    assert nottls.returncode != 0


def test_neopy_two_masters(tmp_path, zodbd_bin):
    """Two NEO/py masters: our node finds the primary among them (given in
    any order), NEO/py's client and ours read through the list; when the
    primary dies, our node identifies to the new primary and serves again
    once the cluster is started (a FileStorage backend keeps no partition
    table, so the new primary makes one, as at a first start)."""
    src = os.path.join(os.path.dirname(__file__), '..', 'fs1', 'testdata', '1.fs')
    path = str(tmp_path / 'Data.fs')
    shutil.copyfile(src, path)
    fshash = subprocess.run([zodbd_bin, 'hash', '--sha1', path], capture_output=True, text=True, timeout=120)
    c = cluster(tmp_path, zodbd_bin, masters=2)
    log = tmp_path / 'storage.log'

    def primary():
        for _ in range(200):
            found = re.findall(r'identified by master (\S+) as node', log.read_text())
            if found:
                return found[-1]
            time.sleep(0.05)
        raise AssertionError('node not identified: ' + log.read_text())

    def gohash():
        url = 'neo://vectors@' + ','.join(c.masters)
        p = subprocess.run([zodbd_bin, 'hash', '--sha1', url], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stdout.split()[0]

    try:
        c.start().wait_running()
        got = read(c, 'neo', c.master, 10)
        before = gohash()
        first = primary()
        c.mprocs[first].kill()
        for _ in range(200):
            if primary() != first:
                break
            time.sleep(0.1)
        second = primary()
        c.wait_running()
        after = gohash()
    finally:
        rc = c.stop(clean=True)
    assert rc == 0
    assert second != first and second in c.masters
    want = read(c, 'fs', path, 10)
    assert got['loads'] == want['loads']
    assert before == after == fshash.stdout.split()[0]


COMMITTER = r"""
import json, sys, transaction
from BTrees.Length import Length
from persistent.mapping import PersistentMapping
from ZODB import DB
from ZODB.POSException import ConflictError
from neo.client.Storage import Storage
master = sys.argv[1]
def open_db():
    return DB(Storage(master_nodes=master, name='vectors'))
out = {}
db1, db2 = open_db(), open_db()   # two NEO/py client nodes
tm1, tm2 = transaction.TransactionManager(), transaction.TransactionManager()
c1, c2 = db1.open(tm1), db2.open(tm2)
r1 = c1.root()
r1['len'] = Length(0)
r1['m'] = PersistentMapping({'n': 0})
r1['note'] = PersistentMapping({'text': 'x' * 5000})   # compressed by the client
tm1.commit()
tm2.begin(); c2.sync()
r2 = c2.root()
# The same Length changed by both clients: the second commit gets the
# first one's serial as a conflict and resolves it (BTrees.Length).
r1['len'].change(1)
r2['len'].change(10)
tm1.commit()
tm2.commit()
tm1.begin(); c1.sync()
out['len'] = r1['len'].value
# The same PersistentMapping: no resolution, the conflict reaches the app.
r1['m']['a'] = 1
tm2.begin(); c2.sync()
r2['m']['b'] = 2
tm1.commit()
try:
    tm2.commit()
    out['mapping_conflict'] = False
except ConflictError:
    tm2.abort()
    out['mapping_conflict'] = True
# readCurrent of an object another client changes in between.
tm2.begin(); c2.sync()
r2['note']._p_activate()   # a ghost's serial is not recorded
c2.readCurrent(r2['note'])
r2['m']['c'] = 3
r1['note']['text'] = 'y' * 10
tm1.commit()
try:
    tm2.commit()
    out['read_current_conflict'] = False
except ConflictError:
    tm2.abort()
    out['read_current_conflict'] = True
# An undo of the last change of 'note'.
tm1.begin(); c1.sync()
last = db1.undoLog(0, 1)[0]
db1.undo(last['id'], txn=tm1.get())
tm1.commit()
tm1.begin(); c1.sync()
out['note_after_undo'] = len(r1['note']['text'])
out['m'] = dict(r1['m'])
out['undo_log'] = [d['description'] if isinstance(d['description'], str) else d['description'].decode() for d in db1.undoLog(0, 20)]
# A pack now: the revisions of 'note' before its current one go (the
# node packs in the background; the client does not wait).
import time
note = r1['note']
old = [h['tid'] for h in db1.storage.history(note._p_oid, size=10)][1:]
out['note_revisions_before_pack'] = len(old) + 1
time.sleep(0.01)
db1.pack()
st = db1.storage
gone = False
for _ in range(300):  # history asks the node (loadSerial may hit the client's cache)
    if len(st.history(note._p_oid, size=10)) == 1:
        gone = True
        break
    time.sleep(0.05)
out['packed'] = gone
out['note_revisions_after_pack'] = len(st.history(note._p_oid, size=10))
for c, db in ((c1, db1), (c2, db2)):
    c.close(); db.close()
print(json.dumps(out))
"""


@pytest.mark.parametrize('backend', ['fs', 'sqlite'])
def test_neopy_commits(tmp_path, zodbd_bin, neo_testdata, backend):
    """NEO/py's client commits through our node (--read-write) under NEO/py's
    master: two client nodes on the same objects (a conflict resolved by
    BTrees.Length, one on a PersistentMapping and one on readCurrent that
    reach the application), an undo. What NEO/py's client reads back through
    our node must equal, on a FileStorage, what ZODB/py reads from the
    Data.fs afterwards (through zc.zlibstorage: NEO's compressed records are
    written as zlibstorage's); on NEO/py's SQLite schema (the p1 database,
    committed on top of), what NEO/py's own storage node then serves from
    the database our node wrote."""
    c = cluster(tmp_path, zodbd_bin, 'zodbd-' + backend, read_write=True)
    if backend == 'fs':
        n = 4  # a new database: the root and 3 objects
    else:
        n = 8  # p1's 5 objects and 3 new ones
        shutil.copyfile(os.path.join(neo_testdata, 'storage.sqlite'), c.db)
    try:
        c.start().wait_running()  # p1's partition table is in its database
        p = subprocess.run([PY, '-c', COMMITTER, c.master], env=c.env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout)
        got = read(c, 'neo', c.master, n)
    finally:
        rc = c.stop(clean=True)
    assert rc == 0
    assert out['len'] == 11
    assert out['mapping_conflict'] is True
    assert out['read_current_conflict'] is True
    assert out['note_after_undo'] == 5000
    assert out['m'] == {'n': 0, 'a': 1}
    assert len(out['undo_log']) >= 5
    assert out['note_revisions_before_pack'] == 3  # created, changed, undone
    assert out['packed'] is True
    assert out['note_revisions_after_pack'] == 1
    if backend == 'fs':
        want = read(c, 'zfs', c.db, n)
    else:
        d = tmp_path / 'neopy'
        d.mkdir()
        c2 = cluster(d, zodbd_bin, 'neopy')
        c2.db = c.db
        try:
            c2.start().wait_running()
            want = read(c2, 'neo', c2.master, n)
        finally:
            c2.stop()
    assert got['loads'] == want['loads']
    assert got['iter'] == want['iter']
    assert got['records'] == want['records']
    assert [[h[0] for h in x] for x in got['history']] == [[h[0] for h in x] for x in want['history']]


CONCURRENT = r"""
import json, random, sys, threading, transaction
from BTrees.Length import Length
from ZODB import DB
from ZODB.POSException import ConflictError
from neo.client.Storage import Storage
master, nthreads, ncommits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
K = 6  # counters
dbs = [DB(Storage(master_nodes=master, name='vectors')) for _ in range(2)]  # two client nodes
tm = transaction.TransactionManager()
c = dbs[0].open(tm)
for k in range(K):
    c.root()['c%d' % k] = Length(0)
tm.commit()
c.close()
done = [0] * (nthreads * 2)
retries = [0]
errors = []

def work(i):
    rnd = random.Random(i)
    tm = transaction.TransactionManager()
    conn = dbs[i % 2].open(tm)
    try:
        for _ in range(ncommits):
            while True:
                tm.begin()
                conn.sync()
                ks = rnd.sample(range(K), 3)   # random order: stores in that order
                for k in ks:
                    conn.root()['c%d' % k].change(1)
                try:
                    tm.commit()
                    done[i] += 3
                    break
                except ConflictError:
                    tm.abort()
                    retries[0] += 1
    except Exception as e:
        errors.append(repr(e))
    finally:
        conn.close()

ts = [threading.Thread(target=work, args=(i,)) for i in range(nthreads * 2)]
for t in ts: t.start()
for t in ts: t.join(240)
alive = sum(t.is_alive() for t in ts)
tm = transaction.TransactionManager()
c = dbs[1].open(tm)
tm.begin(); c.sync()
total = sum(c.root()['c%d' % k].value for k in range(K))
print(json.dumps({'total': total, 'done': sum(done), 'alive': alive, 'errors': errors, 'retries': retries[0]}))
sys.stdout.flush()
import os
os._exit(0)  # threads that hang (a deadlock) must not keep the process
"""


def test_neopy_concurrent_commits(tmp_path, zodbd_bin):
    """Six threads over two NEO/py client nodes commit to the same six
    BTrees.Length counters, three at a time in random order (so that
    stores meet in both orders: lock waits, conflicts resolved, deadlock
    avoidance): no thread hangs, and every increment is counted once."""
    c = cluster(tmp_path, zodbd_bin, read_write=True)
    try:
        c.start().wait_running()
        p = subprocess.run([PY, '-c', CONCURRENT, c.master, '3', '30'], env=c.env, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout)
    finally:
        rc = c.stop(clean=True)
    assert rc == 0
    assert out['alive'] == 0 and out['errors'] == [], out
    assert out['done'] == 6 * 30 * 3
    assert out['total'] == out['done']


KILL_COMMITTER = r"""
import json, sys, time, transaction
from persistent.mapping import PersistentMapping
from ZODB import DB
from neo.client.Storage import Storage
master, seconds = sys.argv[1], float(sys.argv[2])
db = DB(Storage(master_nodes=master, name='vectors'))
tm = transaction.TransactionManager()
conn = db.open(tm)
root = conn.root()
for k in range(7):
    root['k%d' % k] = PersistentMapping({'i': 0})
tm.commit()
done, failed, i = [], 0, 0
end = time.time() + seconds
while time.time() < end:
    i += 1
    try:
        tm.begin()
        root = conn.root()
        root['k%d' % (i % 7)]['i'] = i
        tm.commit()
        ob = root['k%d' % (i % 7)]
        # NEO/py's client empties the cache when it reconnects (ZODB then
        # ghosts every object, whose _p_serial reads as z64): load it. This
        # client is the only writer, so its serial is this commit's.
        ob._p_activate()
        done.append([i % 7, i, ob._p_serial.hex()])
    except Exception as e:
        failed += 1
        try:
            tm.abort()
        except Exception:
            pass
        time.sleep(0.1)
print(json.dumps({'done': done, 'failed': failed}))
sys.stdout.flush()
import os
os._exit(0)  # NEO/py's client may fail to close after its storage died
"""

KILL_CHECKER = r"""
import json, sys
from ZODB import DB
from ZODB.utils import p64
from neo.client.Storage import Storage
master, done = sys.argv[1], json.load(open(sys.argv[2]))
db = DB(Storage(master_nodes=master, name='vectors'))
conn = db.open()
root = conn.root()
bad = []
last = {}
for k, i, serial in done:
    last[k] = (i, serial)
for k, (i, serial) in last.items():
    ob = root['k%d' % k]
    if ob['i'] != i or ob._p_serial.hex() != serial:
        bad.append(['latest', k, i, ob['i'], serial, ob._p_serial.hex()])
st = db.storage
for k, i, serial in done:  # every acknowledged revision is there
    oid = root['k%d' % k]._p_oid
    try:
        st.loadSerial(oid, bytes.fromhex(serial))
    except Exception as e:
        bad.append(['missing', k, i, serial, repr(e)])
conn.close(); db.close()
print(json.dumps(bad))
"""


def test_neopy_node_killed(tmp_path, zodbd_bin, neo_testdata):
    """A NEO/py client commits in a loop while our node (SQLite backend,
    whose database keeps the node id and the partition table, so that
    the master takes it back) is SIGKILLed and restarted 3 times: every
    commit that returned is there afterwards, each oid at its last
    acknowledged revision (locked transactions finished by the master's
    ValidateTransaction, voted ones dropped). NEO_KILLS=N kills N times."""
    c = cluster(tmp_path, zodbd_bin, 'zodbd-sqlite', read_write=True)
    shutil.copyfile(os.path.join(neo_testdata, 'storage.sqlite'), c.db)
    try:
        c.start().wait_running()
        out = open(str(tmp_path / 'committer.json'), 'w')
        kills = int(os.environ.get('NEO_KILLS', '3'))
        committer = subprocess.Popen([PY, '-c', KILL_COMMITTER, c.master, str(3 + 3 * kills)], env=c.env,
                                     stdout=out, stderr=subprocess.PIPE, text=True)
        for n in range(kills):
            time.sleep(2)
            c.kill_storage()
            c.start_storage()
            c.wait_running()
        _, err = committer.communicate(timeout=120)
        assert committer.returncode == 0, err[-3000:]
        out.close()
        res = json.load(open(str(tmp_path / 'committer.json')))
        json.dump(res['done'], open(str(tmp_path / 'done.json'), 'w'))
        p = subprocess.run([PY, '-c', KILL_CHECKER, c.master, str(tmp_path / 'done.json')], env=c.env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        bad = json.loads(p.stdout)
    finally:
        rc = c.stop(clean=True)
    assert rc == 0
    assert len(res['done']) > 20, res
    assert bad == []
