"""zodbd's FileStorage tools against ZODB/py's scripts on random histories.

docs/tools.md and docs/operations.md claim byte-identical output for

    zodbd dump FILE            python -m ZODB.FileStorage.fsdump FILE
    zodbd dump -v FILE         ZODB.FileStorage.fsdump.Dumper(FILE).dump()
    zodbd tail [-n N] FILE     python -m ZODB.scripts.fstail [-n N] FILE
    zodbd verify [-v..] FILE   python -m ZODB.scripts.fstest [-v..] FILE
    zodbd refs --dangling FILE ZODB.scripts.fsrefs.main(FILE)
    zodbd analyze FILE         python -m ZODB.scripts.analyze FILE

Histories are made with ZODB/py (new objects, modifications, BTrees with many
buckets, big records, blobs, undo of creations, undoMultiple, binary and
unicode metadata and extensions, empty transactions, deleteObject, several
records of one oid in a transaction, cross-database and weak references, a
pack at a mid time), then damaged (truncated, bytes flipped). Each tool and
its Python script run on the same file; stdout (and, for fstest's FormatError,
stderr) and the exit status must match. Documented differences (Python
MemoryError/OverflowError, fsdump looping on a backpointer loop, fstest's
seek crash) are skipped.

The random sweep runs TOOLS_SEEDS seeds (default 30; ZODBD_STRESS=1: 300,
with 5 damaged copies of each history instead of 2). TOOLS_DAMAGED_REPORTS=1
also runs fsrefs/analyze on the damaged copies (no identity is claimed there:
zodbd's reader refuses some files that ZODB/py's FileStorage opens).

The single cases below were found by it, minimized. Fixed: analyze's
error lines (a zc.zlibstorage record's "bad pickle data") and its class of
a class pickle that is no tuple, tail -n read as Python's int(), verify's
messages naming a path that is not UTF-8. The og-rek cases are documented
differences (docs/tools.md), kept as strict xfails.
"""
import json
import os
import random
import struct
import subprocess
import sys

import pytest

import randhist

PY = sys.executable
STRESS = os.environ.get('ZODBD_STRESS') == '1'
NSEEDS = int(os.environ.get('TOOLS_SEEDS') or (300 if STRESS else 30))

# ---------------------------------------------------------------------------
# The oracle: ZODB/py's tools run in one Python process per batch of jobs,
# each with its stdout/stderr captured, a SystemExit or exception turned into
# an exit status, and an alarm against fsdump's endless backpointer loops.

ORACLE = r'''
import contextlib, io, json, signal, sys, traceback
jobs = json.load(open(sys.argv[1]))
resfile = sys.argv[2]
from ZODB.FileStorage.fsdump import fsdump, Dumper
from ZODB.scripts import fstail, fstest, fsrefs, analyze

class Timeout(Exception):
    pass

def alarm(*a):
    raise Timeout()

signal.signal(signal.SIGALRM, alarm)

def run(tool, args):
    if tool == 'fsdump':
        fsdump(args[0])
    elif tool == 'dumper':
        Dumper(args[0]).dump()
    elif tool == 'fstail':
        sys.argv = ['fstail'] + args
        fstail.Main()
    elif tool == 'fstest':
        fstest.VERBOSE = 0
        fstest.main(args)
    elif tool == 'fsrefs':
        fsrefs.main(args[0])
    elif tool == 'analyze':
        analyze.report(analyze.analyze(args[0]))

res = []
for tool, args in jobs:
    out, err = io.StringIO(), io.StringIO()
    rc, exc = 0, None
    signal.alarm(20)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            run(tool, args)
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):
            err.write(str(e.code) + '\n')
            rc, exc = 1, 'SystemExit'
        else:
            rc = e.code or 0
    except Timeout:
        rc, exc = 1, 'Timeout'
    except BaseException as e:
        rc, exc = 1, type(e).__name__
        err.write(traceback.format_exc())
    finally:
        signal.alarm(0)
    res.append(dict(out=out.getvalue(), err=err.getvalue(), rc=rc, exc=exc))
json.dump(res, open(resfile, 'w'))
'''


def oracle(tmp_path, jobs):
    jf, rf = str(tmp_path / 'jobs.json'), str(tmp_path / 'res.json')
    with open(jf, 'w') as f:
        json.dump(jobs, f)
    p = subprocess.run([PY, '-c', ORACLE, jf, rf], capture_output=True,
                       timeout=900, env=dict(os.environ, PYTHONIOENCODING='utf-8'))
    assert p.returncode == 0, p.stderr.decode()
    with open(rf) as f:
        return json.load(f)


ZODBD_ARGS = {
    'fsdump': lambda a: ['dump', a[0]],
    'dumper': lambda a: ['dump', '-v', a[0]],
    'fstail': lambda a: ['tail'] + a,
    'fstest': lambda a: ['verify'] + a,
    'fsrefs': lambda a: ['refs', '--dangling', a[0]],
    'analyze': lambda a: ['analyze', a[0]],
}

# Python failures that docs/tools.md lists as deliberate differences.
DOCUMENTED = {'MemoryError', 'OverflowError', 'Timeout'}


def zodbd_run(zodbd_bin, tool, args):
    p = subprocess.run([zodbd_bin] + ZODBD_ARGS[tool](args), capture_output=True,
                       timeout=120)
    return dict(out=p.stdout.decode('utf-8', 'surrogateescape'),
                err=p.stderr.decode('utf-8', 'surrogateescape'), rc=p.returncode)


def compare(tool, args, want, got):
    """A list of differences (empty if the same)."""
    if want['exc'] in DOCUMENTED:
        return []
    if tool == 'fstest' and want['exc'] in ('OSError', 'ValueError') and 'seek' in want['err']:
        return []
    if tool == 'fstail' and 'persistent id' in want['err']:
        return []  # documented: og-rek judges persistent references in extensions differently
    diffs = []
    if want['out'] != got['out']:
        diffs.append('stdout differs:\n--- py\n%s\n--- zodbd\n%s' % (
            _tailtxt(want['out'], got['out'])))
    wrc = want['rc']
    if tool == 'fsrefs':
        wrc = 1 if want['out'] and not want['exc'] else want['rc']
    if wrc != got['rc']:
        diffs.append('exit status py=%s (%s) zodbd=%s\npy stderr: %s\nzodbd stderr: %s' % (
            wrc, want['exc'], got['rc'], want['err'][-600:], got['err'][-600:]))
    if tool == 'fstest' and want['exc'] == 'SystemExit' and want['err'] != got['err']:
        diffs.append('stderr differs: py=%r zodbd=%r' % (want['err'], got['err']))
    return diffs


def _tailtxt(a, b):
    # Show the region around the first difference.
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    s = max(0, a.rfind('\n', 0, max(0, i - 300)))
    return a[s:i + 400], b[s:i + 400]


def check_all(zodbd_bin, tmp_path, jobs):
    res = oracle(tmp_path, jobs)
    failures = []
    for (tool, args), want in zip(jobs, res):
        got = zodbd_run(zodbd_bin, tool, args)
        d = compare(tool, args, want, got)
        if d:
            failures.append('%s %s:\n%s' % (tool, ' '.join(args), '\n'.join(d)))
    return failures


# ---------------------------------------------------------------------------
# Random histories: randhist.py.


def build(tmp_path, seed, steps=None, blobs=True, name=None):
    d = tmp_path / (name or ('s%d' % seed))
    d.mkdir()
    path, _, done = randhist.build(str(d), seed, steps, blobs)
    return path, done


def jobs_for(path, damaged=False, n=None):
    jobs = [('fsdump', [path]), ('dumper', [path]), ('fstail', [path]),
            ('fstail', ['-n', str(n or 3), path]), ('fstest', [path]),
            ('fstest', ['-v', path]), ('fstest', ['-v', '-v', path])]
    if not damaged or DAMAGED_REPORTS:
        jobs += [('fsrefs', [path]), ('analyze', [path])]
    return jobs


DAMAGED_REPORTS = os.environ.get('TOOLS_DAMAGED_REPORTS') == '1'


def records(data):
    """The positions of the transaction and data records of a good file."""
    txns, recs = [], []
    pos = 4
    while pos + 23 <= len(data):
        tl = struct.unpack('>Q', data[pos + 8:pos + 16])[0]
        ul, dl, el = struct.unpack('>HHH', data[pos + 17:pos + 23])
        txns.append((pos, tl))
        dpos = pos + 23 + ul + dl + el
        while dpos < pos + tl:
            plen = struct.unpack('>Q', data[dpos + 34:dpos + 42])[0]
            recs.append((dpos, plen))
            dpos += 42 + (plen or 8)
        pos += tl + 8
    return txns, recs


TXN_FIELDS = [(0, 8), (8, 8), (16, 1), (17, 2), (19, 2), (21, 2)]
DATA_FIELDS = [(0, 8), (8, 8), (16, 8), (24, 8), (32, 2), (34, 8)]


def field_value(rnd, old, n, size):
    k = rnd.randrange(6)
    if k == 0:
        v = old + rnd.choice([-1, 1]) * rnd.randint(1, 16)
    elif k == 1:
        v = rnd.randint(0, size + 64)
    elif k == 2:
        v = 0
    elif k == 3:
        v = (1 << (8 * n)) - 1
    elif k == 4:
        v = rnd.getrandbits(8 * n)
    else:
        v = old ^ (1 << rnd.randrange(8 * n))
    return v % (1 << (8 * n))


def damage(src, dst, rnd):
    data = bytearray(open(src, 'rb').read())
    kind = rnd.randrange(5)
    txns, recs = records(data)
    if kind >= 3 and txns:
        # A header field (or a redundant length, or a backpointer) set to
        # a nearby, random or extreme value.
        if kind == 3 or not recs:
            pos, tl = rnd.choice(txns)
            fields = TXN_FIELDS + [(tl, 8)]
        else:
            pos, plen = rnd.choice(recs)
            fields = DATA_FIELDS + ([(42, 8)] if plen == 0 else [])
        off, n = rnd.choice(fields)
        off += pos
        old = int.from_bytes(data[off:off + n], 'big')
        new = field_value(rnd, old, n, len(data))
        data[off:off + n] = new.to_bytes(n, 'big')
        what = 'field at %d (%d bytes) %d -> %d' % (off, n, old, new)
    elif kind == 0 and len(data) > 5:
        data = data[:rnd.randint(4, len(data) - 1)]
        what = 'truncated to %d' % len(data)
    else:
        offs = sorted(rnd.randrange(4, len(data)) for _ in range(rnd.randint(1, 2)))
        for o in offs:
            data[o] ^= 1 << rnd.randrange(8)
        what = 'flipped at %s' % offs
    with open(dst, 'wb') as f:
        f.write(data)
    return what


# ---------------------------------------------------------------------------
# The sweep.

def test_random_histories(zodbd_bin, tmp_path):
    failures = []
    jobs = []
    info = {}
    for seed in range(NSEEDS):
        path, steps = build(tmp_path, seed, blobs=(seed % 3 == 0))
        info[path] = 'seed %d steps %s' % (seed, steps)
        jobs += jobs_for(path, n=1 + seed % 4)
        rnd = random.Random(seed)
        for j in range(2 if not STRESS else 5):
            dpath = path + '.dmg%d' % j
            info[dpath] = 'seed %d steps %s, %s' % (seed, steps, damage(path, dpath, rnd))
            jobs += jobs_for(dpath, damaged=True, n=1 + seed % 4)
    res = oracle(tmp_path, jobs)
    for (tool, args), want in zip(jobs, res):
        got = zodbd_run(zodbd_bin, tool, args)
        d = compare(tool, args, want, got)
        if d:
            failures.append('%s %s [%s]:\n%s' % (tool, ' '.join(args), info[args[-1]], '\n'.join(d)))
    assert not failures, '%d divergences:\n\n%s' % (len(failures), '\n\n'.join(failures[:8]))


# ---------------------------------------------------------------------------
# Minimized divergences. Each builds the smallest file that shows it, with the
# storage API of ZODB/py (or by hand where the record is not one ZODB writes),
# and runs the real scripts (python -m ...) against zodbd.

def _py(*args):
    return subprocess.run([PY, *args], capture_output=True, timeout=120,
                          env=dict(os.environ, PYTHONIOENCODING='utf-8'))


def _zodbd(zodbd_bin, *args):
    return subprocess.run([zodbd_bin, *args], capture_output=True, timeout=120)


def _fsfile(path, txns):
    """Write a FileStorage file by hand: txns is a list of (ext, records),
    records a list of (oid, data); tids increase from a fixed one."""
    out = bytearray(b'FS30')
    tid = 0x040d4dc17a011488
    for ext, recs in txns:
        tid += 1
        tpos = len(out)
        body = bytearray()
        dpos = tpos + 23 + len(ext)
        for oid, data in recs:
            body += struct.pack('>QQQQHQ', oid, tid, 0, tpos, 0, len(data)) + data
            dpos += 42 + len(data)
        tl = 23 + len(ext) + len(body)
        out += struct.pack('>QQcHHH', tid, tl, b' ', 0, 0, len(ext)) + ext + body
        out += struct.pack('>Q', tl)
    with open(path, 'wb') as f:
        f.write(out)
    return path


PM = b'\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.\x80\x03}q\x01.'


def _fstail(path, *opts):
    return _py('-m', 'ZODB.scripts.fstail', *opts, path)


def _pickle3(v):
    from ZODB._compat import dumps
    return dumps(v, 3)


# 1. tail: extensions zodbpickle reads but og-rek refuses (zodbd tail fails
#    on a file fstail prints). The first is what ZODB/py writes for
#    setExtendedInfo('x', 2**1100): LONG1 with more than 127 bytes (og-rek
#    reads the length as signed) and LONG4 (og-rek has no such opcode).
@pytest.mark.parametrize('ext', [
    _pickle3({'x': 2 ** 1100}),
    _pickle3({'x': -2 ** 2100}),
    b'(dp0\nVu\np1\nV\\udc80\np2\ns.',
    b'(dp0\nVa\np1\nI 1\ns.',
    b'(dp0\nVa\np1\nL12\ns.',
    b'}q\x00(X\x01\x00\x00\x00kq\x01]q\x02(q]q\x03}q\x04)eu.',
], ids=['long1_128_bytes', 'long4', 'p0_lone_surrogate', 'p0_int_with_space',
        'p0_long_without_L', 'binput_after_mark'])
@pytest.mark.xfail(strict=True, reason='og-rek, not zodbpickle: documented in docs/tools.md')
def test_tail_extension_python_reads(zodbd_bin, tmp_path, ext):
    path = _fsfile(str(tmp_path / 'Data.fs'), [(ext, [(1, PM)])])
    want = _fstail(path)
    assert want.returncode == 0, want.stderr.decode()
    got = _zodbd(zodbd_bin, 'tail', path)
    assert (got.stdout, got.returncode) == (want.stdout, 0), got.stderr.decode()


# 2. tail: a damaged extension (one bit: BINPUT 'q' -> PUT 'p') that
#    zodbpickle refuses (the memo key of PUT/GET must be a decimal integer)
#    and og-rek takes (any line is a memo key): fstail fails, zodbd tail
#    prints the transaction and exits 0.
@pytest.mark.parametrize('ext', [
    b'\x80\x03}pxyz\nX\x01\x00\x00\x00aK\x01s.',   # PUT 'xyz'
    b'\x80\x03}p\nX\x01\x00\x00\x00aK\x01s.',      # PUT ''
    b'(dp0\nVa\npxyz\ngxyz\ns.',                   # GET 'xyz'
], ids=['put_text', 'put_empty', 'get_text'])
@pytest.mark.xfail(strict=True, reason='og-rek, not zodbpickle: documented in docs/tools.md')
def test_tail_extension_lax_memo_key(zodbd_bin, tmp_path, ext):
    path = _fsfile(str(tmp_path / 'Data.fs'), [(ext, [(1, PM)])])
    want = _fstail(path)
    assert want.returncode == 1 and not want.stdout, want
    got = _zodbd(zodbd_bin, 'tail', path)
    assert (got.stdout, got.returncode) == (want.stdout, 1), got.stdout.decode()


# 3. dump and analyze: the same og-rek laxness in a class pickle that is not
#    a GLOBAL: get_pickle_metadata fails to unpickle it ("class=.") and
#    analyze.py prints the error; zodbd decodes ('mod', 'name').
LAX_CLASS = b'\x80\x03(X\x03\x00\x00\x00modpxyz\nX\x04\x00\x00\x00namet.\x80\x03}q\x01.'


# The second record makes zodbd dump fail ("class pickle: tuple of 1
# items") where fsdump prints "class=." and goes on.
@pytest.mark.parametrize('rec', [
    LAX_CLASS,
    b'(Vmod\np0\x8aVname\np1\ntp2\n.\x80\x03}q\x01.',
], ids=['wrong_class', 'dump_aborts'])
@pytest.mark.xfail(strict=True, reason='og-rek, not zodbpickle: documented in docs/tools.md')
def test_dump_class_pickle_lax_memo_key(zodbd_bin, tmp_path, rec):
    path = _fsfile(str(tmp_path / 'Data.fs'), [(b'', [(1, rec), (2, PM)])])
    want = _py('-m', 'ZODB.FileStorage.fsdump', path)
    assert want.returncode == 0 and b'class=.\n' in want.stdout, want
    got = _zodbd(zodbd_bin, 'dump', path)
    assert (got.stdout.decode(), got.returncode) == (want.stdout.decode(), 0), got.stderr.decode()


# 3b. dump: get_pickle_metadata drops the 2 bytes of a PROTO opcode
#     (data[2:]) and unpickles the rest, whatever the protocol number says
#     (its unpickler reads protocol 3's opcodes, not protocol 4's); zodbd
#     refuses the pickle by its header, so a class pickle b'\x80\x04' +
#     (protocol-3 opcodes) shows "class=." where fsdump shows
#     "class=mod.name" (og-rek would take protocol 4's opcodes too).
@pytest.mark.xfail(strict=True, reason='og-rek reads protocol 4 opcodes, zodbpickle does not: documented in docs/tools.md')
def test_dump_class_pickle_proto_stripped(zodbd_bin, tmp_path):
    rec = b'\x80\x04X\x03\x00\x00\x00modX\x04\x00\x00\x00name\x86.\x80\x03}q\x01.'
    path = _fsfile(str(tmp_path / 'Data.fs'), [(b'', [(1, rec)])])
    want = _py('-m', 'ZODB.FileStorage.fsdump', path)
    assert want.returncode == 0 and b'class=mod.name\n' in want.stdout, want
    got = _zodbd(zodbd_bin, 'dump', path)
    assert (got.stdout.decode(), got.returncode) == (want.stdout.decode(), 0), got.stderr.decode()


@pytest.mark.xfail(strict=True, reason='og-rek, not zodbpickle: documented in docs/tools.md')
def test_analyze_class_pickle_lax_memo_key(zodbd_bin, tmp_path):
    path = _fsfile(str(tmp_path / 'Data.fs'), [(b'', [(1, LAX_CLASS), (2, PM)])])
    want = _py('-m', 'ZODB.scripts.analyze', path)
    assert want.returncode == 0, want.stderr.decode()
    got = _zodbd(zodbd_bin, 'analyze', path)
    assert (got.stdout.decode(), got.returncode) == (want.stdout.decode(), 0)


# 4. analyze: a record whose class pickle analyze.py cannot read. analyze.py
#    prints the error on stdout, one line per record, before the report
#    (docs/operations.md: "same report"); zodbd printed one summary line on
#    stderr instead. Records of zc.zlibstorage (b'.z' + zlib data) are such
#    records: analyze.py prints "bad pickle data" for each.
def test_analyze_unreadable_class_pickle_lines(zodbd_bin, tmp_path):
    import zlib
    path = _fsfile(str(tmp_path / 'Data.fs'),
                   [(b'', [(1, b'.z' + zlib.compress(PM)), (2, PM)])])
    want = _py('-m', 'ZODB.scripts.analyze', path)
    assert want.returncode == 0 and want.stdout.startswith(b'bad pickle data\n'), want
    got = _zodbd(zodbd_bin, 'analyze', path)
    assert (got.stdout.decode(), got.returncode) == (want.stdout.decode(), 0)


# 5. analyze: a class pickle that is not a tuple (here the str 'abc'):
#    analyze.py's get_type takes its first item ('a') as the class and counts
#    the object; zodbd counted it as unreadable, left it out of the classes
#    and the current objects, and (no current object left) failed with
#    "nothing to analyze (analyze.py divides by zero here)", which analyze.py
#    does not.
def test_analyze_non_tuple_class_pickle(zodbd_bin, tmp_path):
    rec = b'\x80\x03X\x03\x00\x00\x00abcq\x00.\x80\x03}q\x01.'
    path = _fsfile(str(tmp_path / 'Data.fs'), [(b'', [(1, rec)])])
    want = _py('-m', 'ZODB.scripts.analyze', path)
    assert want.returncode == 0 and b'\na    ' in want.stdout, want
    got = _zodbd(zodbd_bin, 'analyze', path)
    assert (got.stdout.decode(), got.returncode) == (want.stdout.decode(), 0), got.stderr.decode()


# 6. tail -n: fstail reads N with Python's int() (decimal; spaces and
#    underscores allowed), zodbd with Go's flag.Int (base prefixes: 010 was
#    octal 8, 0x10 16; " 3" refused).
@pytest.mark.parametrize('n', ['010', ' 3'], ids=['octal', 'space'])
def test_tail_n_parsed_as_python_int(zodbd_bin, tmp_path, n):
    path = _fsfile(str(tmp_path / 'Data.fs'), [(b'', [(1, PM)])] * 12)
    want = _fstail(path, '-n', n)
    assert want.returncode == 0, want.stderr.decode()
    got = _zodbd(zodbd_bin, 'tail', '-n', n, path)
    assert (got.stdout.decode(), got.returncode) == (want.stdout.decode(), 0), got.stderr.decode()


# 7. verify: fstest's messages hold the path as Python prints a str on
#    stderr (an undecodable byte of the name, surrogate-escaped, comes out
#    backslash-escaped: "\udcff"); zodbd verify wrote the raw byte.
def test_verify_message_non_utf8_path(zodbd_bin, tmp_path):
    good = _fsfile(str(tmp_path / 'good.fs'), [(b'', [(1, PM)])])
    data = open(good, 'rb').read()
    path = os.path.join(os.fsencode(str(tmp_path)), b'd\xff.fs')
    with open(path, 'wb') as f:
        f.write(data[:-3])  # torn: fstest names the path in its message
    want = subprocess.run([PY, '-m', 'ZODB.scripts.fstest', path], capture_output=True, timeout=120)
    assert want.returncode == 1 and b'd\\udcff.fs truncated' in want.stderr, want
    got = subprocess.run([zodbd_bin, 'verify', path], capture_output=True, timeout=120)
    assert (got.stderr, got.returncode) == (want.stderr, 1)
