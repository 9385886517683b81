#!/usr/bin/env python3
"""gen_dataset.py - the benchmark datasets, made by ZODB/py, and their
reference hashes.

    gen_dataset.py prod1   OUT [NTXN] [--seed=S]   NTXN transactions (1024)
    gen_dataset.py wczblk1 OUT [MB]   [--seed=S]   an MB-megabyte array (8)
    gen_dataset.py hash    SRC [--crc32|--sha1]    the reference hash of SRC

The output is a function of the arguments and of the versions of ZODB,
persistent, BTrees and zodbpickle (requirements.txt): transaction ids come
from a fixed clock starting at 2024-01-01 00:00:00 UTC, every random choice
from random.Random(seed). testdata/datasets/SHA256SUMS holds the sha256 of
prod1-1024.fs and wczblk1-8.fs as made with the pinned versions, and
testdata/datasets/NAME.hash the output of `hash` on them.

prod1 follows the PROD1 statistics NEO published for a 43.5 GB ERP5
production Data.fs: record sizes lognormal (mu 6.04237779991, sigma
1.55811487853), objects per transaction lognormal (mu 1.04108991045, sigma
0.906703192546), 81.0080409164 % of the records new objects, the rest
revisions of random older objects. Each record is a PersistentMapping
{'payload': bytes} sized to the draw (never under the smallest such
record), its bytes taken in turn from a 1 MiB pool whose skewed byte
distribution zlib -6 compresses to about 28.6 %. Nothing references
anything: do not pack it with garbage collection and expect objects to stay.

wczblk1 is laid out like a wendelin.core ZBigArray of uint8: root['A'] ->
ZBigArray -> ZBigFile (2 MiB blocks) -> blktab LOBTree -> one ZBlk1 per
block -> its IOBTree of 4 KiB ZData chunks. The classes are stand-ins
defined here and registered under wendelin.core's module names, so the
class pickles name wendelin.core's globals (wendelin.core itself is not
needed). One transaction creates the array, then one per block; the bytes
take 16 distinct values.

hash loads, for oid 0, 1, 2, ... until the first POSKeyError, the latest
revision of each object (loadBefore(oid, last tid + 1)) and folds the data
into one crc32 (zlib.crc32 chained) or sha1; SRC is a Data.fs (opened
read-only), zeo://HOST:PORT or zeo:///SOCKET/PATH (through the stock ZEO
ClientStorage):

    crc32:XXXXXXXX ; oid=0..N nread=BYTES t=SECONDSs (X.X µs / object)

It is the reference that `zodbd hash` and the benchmarks check against.
"""

import calendar
import hashlib
import math
import os
import random
import sys
import time
import types
import zlib

import transaction
import ZODB
import ZODB.FileStorage.FileStorage as fsmodule
from BTrees.IOBTree import IOBTree
from BTrees.LOBTree import LOBTree
from persistent import Persistent
from persistent.mapping import PersistentMapping
from persistent.TimeStamp import TimeStamp
from ZODB.Connection import TransactionMetaData
from ZODB.FileStorage import FileStorage
from ZODB.POSException import POSKeyError
from ZODB.serialize import ObjectWriter
from ZODB.utils import p64, u64, z64

EPOCH = calendar.timegm((2024, 1, 1, 0, 0, 0))


# ------------------------------------------------------------ storage

class FixedClock:
    """Transaction ids from a fixed start time, advanced by step() seconds
    per transaction, strictly increasing (TimeStamp.laterThan where two
    times fall in the same tick)."""

    def __init__(self, step):
        self.now = float(EPOCH)
        self.step = step
        self.prev = None

    def tid(self):
        self.now += self.step()
        t = self.now
        ts = TimeStamp(*(time.gmtime(t)[:5] + (t % 60,)))
        if self.prev is not None:
            ts = ts.laterThan(self.prev)
        self.prev = ts
        return ts.raw()


class DatasetStorage(FileStorage):
    """A FileStorage whose transactions without a given tid take the
    clock's next one."""

    def __init__(self, path, clock):
        self.clock = clock
        FileStorage.__init__(self, path, create=True)

    def tpc_begin(self, txn, tid=None, status=' '):
        return FileStorage.tpc_begin(self, txn, tid or self.clock.tid(), status)


def create_storage(path, clock):
    """A new, empty DatasetStorage at path (removing what was there)."""
    for ext in ('', '.index', '.lock', '.tmp', '.old', '.pack'):
        if os.path.exists(path + ext):
            os.remove(path + ext)
    # No fsync per transaction: the bytes are the same, made faster.
    fsmodule.fsync = None
    return DatasetStorage(path, clock)


def remove_leftovers(path):
    for ext in ('.lock', '.tmp'):
        if os.path.exists(path + ext):
            os.remove(path + ext)


class Progress:
    """Progress on stderr: one updated line on a terminal, else a line per
    tenth of the work."""

    def __init__(self, what, total):
        self.what, self.total = what, total
        self.tty = sys.stderr.isatty()
        self.shown = -1
        self.start = time.time()

    def step(self, done):
        pct = 100 * done // self.total if self.total else 100
        if self.tty:
            if pct != self.shown or done == self.total:
                sys.stderr.write('\r%s: %d/%d (%d%%)' % (self.what, done, self.total, pct))
        elif pct // 10 != self.shown // 10 or done == self.total:
            sys.stderr.write('%s: %d/%d (%d%%)\n' % (self.what, done, self.total, pct))
        sys.stderr.flush()
        self.shown = pct

    def end(self):
        if self.tty:
            sys.stderr.write('  %.1fs\n' % (time.time() - self.start))
            sys.stderr.flush()


def round_half_up(x):
    return int(x + 0.5)


def lognormal_fit(values):
    logs = [math.log(v) for v in values if v > 0]
    mu = sum(logs) / len(logs)
    return mu, math.sqrt(sum((x - mu) ** 2 for x in logs) / len(logs))


# ------------------------------------------------------------ prod1

SIZE_MU, SIZE_SIGMA = 6.04237779991, 1.55811487853
COUNT_MU, COUNT_SIGMA = 1.04108991045, 0.906703192546
NEW_FRACTION = 0.810080409164
# Byte value k makes up WEIGHTS[k]/256 of the pool.
WEIGHTS = [145, 63, 27, 12, 5, 2, 1, 1]
POOL_BYTES = 1 << 20


class BytePool:
    """A byte string read in turn, from the start again at its end."""

    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, n):
        parts = []
        while n > 0:
            part = self.data[self.at:self.at + n]
            parts.append(part)
            n -= len(part)
            self.at += len(part)
            if self.at >= len(self.data):
                self.at = 0
        return b''.join(parts)


def mapping_record(payload):
    """The ZODB record of a PersistentMapping {'payload': payload}."""
    m = PersistentMapping()
    m['payload'] = payload
    return ObjectWriter().serialize(m)


def payload_length(size):
    """The payload length for a record of size bytes: n = size - (the
    record's overhead), corrected up to four times by the difference
    between size and the length of the record it makes (the pickle's length
    prefix grows at 256 bytes, so some sizes are out of reach and the
    correction can swing), then grown until the record is at least size
    bytes."""
    n = max(0, size - len(mapping_record(b'')))
    for _ in range(4):
        got = len(mapping_record(bytes(n)))
        if got == size:
            break
        fixed = max(0, n + size - got)
        if fixed == n:
            break
        n = fixed
    while len(mapping_record(bytes(n))) < size:
        n += 1
    return n


def gen_prod1(path, ntxn, seed=0):
    rng = random.Random(seed)
    table = b''.join(bytes([value]) * count for value, count in enumerate(WEIGHTS))
    pool = BytePool(rng.randbytes(POOL_BYTES).translate(table))
    gaps = random.Random(seed + 1)
    stor = create_storage(path, FixedClock(lambda: gaps.lognormvariate(2.0, 1.5)))

    noids = 0           # oids 0 .. noids-1 exist
    last = {}           # oid -> tid of its latest revision
    sizes, counts = [], []
    progress = Progress('prod1', ntxn)
    for i in range(ntxn):
        want = max(1, round_half_up(rng.lognormvariate(COUNT_MU, COUNT_SIGMA)))
        records = []
        revised = set()  # older oids this transaction already revises
        fresh = noids
        for _ in range(want):
            # A new object when every older one is revised already (the
            # first transaction creates the root, oid 0), or by the draw.
            if len(revised) >= noids or rng.random() < NEW_FRACTION:
                oid, fresh = fresh, fresh + 1
            else:
                oid = rng.randrange(noids)
                while oid in revised:
                    oid = rng.randrange(noids)
                revised.add(oid)
            size = max(1, round_half_up(rng.lognormvariate(SIZE_MU, SIZE_SIGMA)))
            records.append((oid, mapping_record(pool.take(payload_length(size)))))

        meta = TransactionMetaData()
        stor.tpc_begin(meta)
        for oid, data in records:
            stor.store(p64(oid), last.get(oid, z64), data, '', meta)
            sizes.append(len(data))
        stor.tpc_vote(meta)
        tid = stor.tpc_finish(meta)
        for oid, _ in records:
            last[oid] = tid
        counts.append(len(records))
        noids = fresh
        progress.step(i + 1)
    progress.end()
    stor.close()
    remove_leftovers(path)

    fsize = os.path.getsize(path)
    with open(path, 'rb') as f:
        zsize = len(zlib.compress(f.read(), 6))
    print('prod1: %s: %d transactions, %d data records, %d objects (oid 0..%d), '
          '%d bytes of object data, file size %d bytes'
          % (path, ntxn, len(sizes), noids, noids - 1, sum(sizes), fsize))
    print('prod1: fitted: object size mu=%.3f sigma=%.3f; objects/txn mu=%.3f sigma=%.3f; '
          'new ratio=%.3f; zlib -6 of file: %.1f %%'
          % (lognormal_fit(sizes) + lognormal_fit(counts) + (noids / len(sizes), 100.0 * zsize / fsize)))


# ------------------------------------------------------------ wczblk1

class ZData(Persistent):
    """A chunk of a block; its state is the bytes."""
    __module__ = 'wendelin.bigfile.file_zodb'

    def __init__(self, data=b''):
        self.data = data

    def __getstate__(self):
        return self.data

    def __setstate__(self, state):
        self.data = state


class ZBlk1(Persistent):
    """A block; its state is its IOBTree {offset in the block: ZData}."""
    __module__ = 'wendelin.bigfile.file_zodb'

    def __init__(self):
        self.chunktab = IOBTree()

    def __getstate__(self):
        return self.chunktab

    def __setstate__(self, state):
        self.chunktab = state


class ZBigFile(Persistent):
    """The file; its state is (block size, LOBTree {block number: ZBlk1})."""
    __module__ = 'wendelin.bigfile.file_zodb'

    def __init__(self, blksize):
        self.blksize = blksize
        self.blktab = LOBTree()

    def __getstate__(self):
        return (self.blksize, self.blktab)

    def __setstate__(self, state):
        self.blksize, self.blktab = state


class ZBigArray(Persistent):
    """The array; its state is its __dict__, in this insertion order."""
    __module__ = 'wendelin.bigarray.array_zodb'

    def __init__(self, shape, dtype, zfile):
        self.zfile = zfile
        self._shape = shape
        self._dtype = dtype
        self._order = 'C'


def register_module(name):
    """sys.modules[name], made (with its parents) when missing."""
    mod = sys.modules.get(name)
    if mod is None:
        mod = sys.modules[name] = types.ModuleType(name)
        parent, _, attr = name.rpartition('.')
        if parent:
            setattr(register_module(parent), attr, mod)
    return mod


def register_wendelin():
    file_zodb = register_module('wendelin.bigfile.file_zodb')
    for cls in (ZData, ZBlk1, ZBigFile):
        setattr(file_zodb, cls.__name__, cls)
    register_module('wendelin.bigarray.array_zodb').ZBigArray = ZBigArray


BLOCK = 2 * 1024 * 1024
CHUNK = 4096
# 16 distinct values, each as likely: about 57 % under zlib -6.
WCZ_TABLE = bytes((i % 16) * 16 + 3 for i in range(256))


def gen_wczblk1(path, mb, seed=0):
    register_wendelin()
    size = mb * 1024 * 1024
    nblocks = (size + BLOCK - 1) // BLOCK
    rng = random.Random(seed)
    stor = create_storage(path, FixedClock(lambda: 1.0))
    db = ZODB.DB(stor, cache_size=1000)  # commits the root
    tm = transaction.TransactionManager()
    conn = db.open(transaction_manager=tm)

    tm.begin().description = 'wczblk1: create %d MB array' % mb
    zfile = ZBigFile(BLOCK)
    conn.root()['A'] = ZBigArray((size,), 'uint8', zfile)
    tm.commit()

    progress = Progress('wczblk1', nblocks)
    for blk in range(nblocks):
        tm.begin().description = 'wczblk1: block %d' % blk
        n = min(BLOCK, size - blk * BLOCK)
        data = rng.randbytes(n).translate(WCZ_TABLE)
        zblk = ZBlk1()
        for off in range(0, n, CHUNK):
            zblk.chunktab[off] = ZData(data[off:off + CHUNK])
        zfile.blktab[blk] = zblk
        tm.commit()
        conn.cacheMinimize()
        progress.step(blk + 1)
    progress.end()

    ntxn = sum(1 for _ in stor.iterator())
    nobj = len(stor)
    conn.close()
    db.close()
    remove_leftovers(path)
    print('wczblk1: %s: %d MB array, %d blocks x %d chunks; %d transactions, '
          '%d objects (oid 0..%d), file size %d bytes'
          % (path, mb, nblocks, BLOCK // CHUNK, ntxn, nobj, nobj - 1, os.path.getsize(path)))


# ------------------------------------------------------------ hash

class Crc32:
    name = 'crc32'

    def __init__(self):
        self.value = zlib.crc32(b'')

    def update(self, data):
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self):
        return '%08x' % (self.value & 0xffffffff)


def open_source(src):
    if src.startswith('zeo://'):
        from ZEO.ClientStorage import ClientStorage
        rest = src[len('zeo://'):]
        if rest.startswith('/'):  # a Unix socket path
            return ClientStorage(rest, read_only=True, wait_timeout=30)
        host, _, port = rest.rstrip('/').rpartition(':')
        return ClientStorage((host, int(port)), read_only=True, wait_timeout=30)
    return FileStorage(src, read_only=True)


def zhash(src, algo='crc32'):
    h = Crc32() if algo == 'crc32' else hashlib.new(algo)
    stor = open_source(src)
    try:
        before = p64(u64(stor.lastTransaction()) + 1)
        start = time.time()
        oid = nread = 0
        while True:
            try:
                data = stor.loadBefore(p64(oid), before)[0]
            except POSKeyError:
                break
            h.update(data)
            nread += len(data)
            oid += 1
        took = time.time() - start
    finally:
        stor.close()
    print('%s:%s ; oid=0..%d nread=%d t=%.3fs (%.1f µs / object)'
          % (h.name, h.hexdigest(), oid - 1, nread, took, took * 1e6 / max(oid, 1)))


# ------------------------------------------------------------ main

def usage(out):
    doc = __doc__
    print(doc[doc.index('    gen_dataset.py'):doc.index('\nThe output')].rstrip(), file=out)


def main(argv):
    args = [a for a in argv if not a.startswith('-')]
    seed, algo = 0, 'crc32'
    for opt in (a for a in argv if a.startswith('-')):
        if opt.startswith('--seed='):
            seed = int(opt[len('--seed='):])
        elif opt in ('--crc32', '--sha1'):
            algo = opt[2:]
        elif opt in ('-h', '--help'):
            print(__doc__)
            return 0
        else:
            print('gen_dataset.py: unknown option %s' % opt, file=sys.stderr)
            usage(sys.stderr)
            return 2
    if len(args) == 2 and args[0] == 'hash':
        zhash(args[1], algo)
    elif 2 <= len(args) <= 3 and args[0] == 'prod1':
        gen_prod1(args[1], int(args[2]) if len(args) == 3 else 1024, seed)
    elif 2 <= len(args) <= 3 and args[0] == 'wczblk1':
        gen_wczblk1(args[1], int(args[2]) if len(args) == 3 else 8, seed)
    else:
        usage(sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
