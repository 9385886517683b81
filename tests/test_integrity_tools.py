"""zodbd refs / referrers / analyze against ZODB/py's fsrefs and analyze.py.

The reports must be byte-identical to the Python tools' on the conformance
fixtures, the benchmark datasets, and a database built here with every
kind of dangling reference fsrefs knows: a reference to an oid that was
never stored ("missing"), to an object whose creation was undone, and
(with a blob directory) blob bytes by class.
"""
import io
import os
import subprocess
import sys

import pytest

PY = sys.executable


def py_tool(*args):
    return subprocess.run([PY, *args], capture_output=True, timeout=300)


def fsrefs(path):
    return py_tool('-c', 'import sys; from ZODB.scripts.fsrefs import main; main(sys.argv[1])', path)


def analyze_py(path):
    return py_tool('-m', 'ZODB.scripts.analyze', path)


BUILD = r'''
import io, sys, transaction, ZODB, ZODB.FileStorage
import zodbpickle.pickle as zp
from persistent.mapping import PersistentMapping
from BTrees.OOBTree import OOBTree
from BTrees.Length import Length
from ZODB.blob import Blob
from ZODB.Connection import TransactionMetaData
from ZODB.utils import p64, z64

path, blobdir = sys.argv[1], sys.argv[2]
fs = ZODB.FileStorage.FileStorage(path, blob_dir=blobdir)
db = ZODB.DB(fs)
c = db.open()
r = c.root()
r['holder'] = PersistentMapping()
r['t'] = OOBTree(); r['t']['k'] = PersistentMapping()
r['len'] = Length(3)
r['blob'] = Blob(b'x' * 3000)
transaction.commit()
r['len'].change(1); transaction.commit()
with r['blob'].open('w') as f:
    f.write(b'y' * 5000)
transaction.commit()
# b's creation (with the root's change) is undone after holder refers to it.
b = PersistentMapping(q=1); r['b'] = b; transaction.commit()
create_b = db.undoLog(0, 1)[0]['id']
r['holder']['b'] = b; transaction.commit()
db.undo(create_b); transaction.commit()
# A record that refers to oids that were never stored.
buf = io.BytesIO()
p = zp.Pickler(buf, 3)
p.persistent_id = lambda o: {'REF': (p64(0x99), PersistentMapping), 'REF2': p64(0x9a)}.get(o) if isinstance(o, str) else None
p.dump((PersistentMapping, None))
p.dump({'data': {'r': 'REF', 's': 'REF2'}})
oid = fs.new_oid()
t = TransactionMetaData()
fs.tpc_begin(t); fs.store(oid, z64, buf.getvalue(), '', t); fs.tpc_vote(t); fs.tpc_finish(t)
c.sync()
r['d'] = c.get(oid); transaction.commit()
db.close()
'''


@pytest.fixture(scope='module')
def damaged(tmp_path_factory):
    d = tmp_path_factory.mktemp('refs')
    path, blobs = str(d / 'Data.fs'), str(d / 'blobs')
    subprocess.run([PY, '-c', BUILD, path, blobs], check=True, timeout=120)
    return path, blobs


def zodbd(zodbd_bin, *args):
    return subprocess.run([zodbd_bin, *args], capture_output=True, timeout=300)


def test_refs_dangling_matches_fsrefs(zodbd_bin, damaged):
    path, _ = damaged
    want = fsrefs(path)
    assert want.returncode == 0, want.stderr
    got = zodbd(zodbd_bin, 'refs', '--dangling', path)
    assert got.stdout.decode() == want.stdout.decode()
    # Both kinds are there, and the exit status says damage was found.
    assert b'missing' in got.stdout and b'object creation was undone' in got.stdout
    assert got.returncode == 1, got.stderr


@pytest.mark.parametrize('name', ['1.fs', '1packed.fs', 'prod1-1024', 'wczblk1-8'])
def test_reports_match_on_fixtures(zodbd_bin, fixtures_dir, dataset, name):
    path = os.path.join(fixtures_dir, name) if name.endswith('.fs') else dataset(name)
    want = fsrefs(path)
    got = zodbd(zodbd_bin, 'refs', '--dangling', path)
    assert (got.stdout, got.returncode) == (want.stdout, 0), got.stderr
    want = analyze_py(path)
    got = zodbd(zodbd_bin, 'analyze', path)
    assert want.returncode == 0, want.stderr
    assert got.stdout.decode() == want.stdout.decode()


def test_analyze_matches_and_counts_blobs(zodbd_bin, damaged):
    path, blobs = damaged
    want = analyze_py(path)
    got = zodbd(zodbd_bin, 'analyze', path)
    assert got.returncode == 0, got.stderr
    assert got.stdout.decode() == want.stdout.decode()
    import json
    got = zodbd(zodbd_bin, 'analyze', '--json', '--blob-dir', blobs, path)
    assert got.returncode == 0, got.stderr
    a = json.loads(got.stdout)
    # Two revisions of one blob: 3000 and 5000 bytes.
    assert a['classes']['ZODB.blob.Blob']['blob_files'] == 2
    assert a['classes']['ZODB.blob.Blob']['blob_bytes'] == 8000
    assert a['blob_bytes'] == 8000 and a.get('missing_blobs', 0) == 0
    assert a['records'] > 0 and a['current_objects'] > 0


def test_referrers(zodbd_bin, damaged):
    path, _ = damaged
    # Who refers to the never-stored 0x99? The crafted record, once.
    got = zodbd(zodbd_bin, 'referrers', path, '99')
    assert got.returncode == 0, got.stderr
    lines = got.stdout.decode().splitlines()
    assert len(lines) == 1 and lines[0].endswith('-> 0000000000000099'), lines
    assert 'persistent.mapping.PersistentMapping' in lines[0]
    # The full listing holds that line too, and the root's references.
    every = zodbd(zodbd_bin, 'refs', path).stdout.decode().splitlines()
    assert lines[0] in every
    assert any(l.startswith('0000000000000000 ') for l in every)
    # Nobody refers to an oid that is not referred to.
    assert zodbd(zodbd_bin, 'referrers', path, 'ffff').returncode == 1


def test_pack_dry_run(zodbd_bin, damaged, tmp_path):
    import hashlib
    import re
    import shutil
    src, _ = damaged
    path = str(tmp_path / 'Data.fs')
    shutil.copyfile(src, path)
    digest = hashlib.sha1(open(path, 'rb').read()).hexdigest()
    # The two never-stored oids and the undone one dangle: exit status 1,
    # and nothing changed.
    got = zodbd(zodbd_bin, 'pack', '--dry-run', '-q', path)
    out = got.stdout.decode()
    assert got.returncode == 1, (out, got.stderr)
    assert '3 references of reachable objects' in out
    assert hashlib.sha1(open(path, 'rb').read()).hexdigest() == digest
    assert sorted(os.listdir(tmp_path)) == ['Data.fs']
    m = re.search(r'(\d+) of (\d+) bytes, (\d+) of (\d+) transactions', out)
    removed, before = int(m.group(1)), int(m.group(2))
    # The real pack at the same time removes exactly that much.
    tid = re.search(r'\(tid ([0-9a-f]{16})\)', out).group(1)
    real = zodbd(zodbd_bin, 'pack', '-q', '--tid', tid, path)
    assert real.returncode == 0, real.stderr
    assert os.path.getsize(path) == before - removed


def test_over_zeo(zodbd_bin, damaged, tmp_path):
    """The same reports over zeo:// (the tools iterate the server's
    transactions to list its objects) as fsrefs and analyze.py give on the
    file."""
    import shutil
    from zeoserver import Server
    src, _ = damaged
    path = str(tmp_path / 'Data.fs')
    shutil.copyfile(src, path)
    want_refs = fsrefs(path).stdout.decode()
    want_an = analyze_py(path).stdout.decode()
    srv = Server(zodbd_bin, path, tmp_path).start()
    try:
        url = 'zeo://127.0.0.1:%d' % srv.port
        got = zodbd(zodbd_bin, 'refs', '--dangling', url)
        assert got.returncode == 1, got.stderr
        assert got.stdout.decode() == want_refs
        got = zodbd(zodbd_bin, 'analyze', url)
        assert got.returncode == 0, got.stderr
        assert got.stdout.decode() == want_an
        got = zodbd(zodbd_bin, 'referrers', url, '99')
        assert got.returncode == 0 and got.stdout.decode().endswith('-> 0000000000000099\n'), got
    finally:
        srv.stop()
