"""Time ZODB/py's FileStorage.pack on a copy of a file, for BENCHMARKS.md.

    zodbpy_pack.py FILE TID [--no-gc]

Copies FILE to FILE.zodbpy, opens it (building its index, not timed),
packs it at the time of TID (hex) with ZODB.serialize.referencesf and
prints the pack tid that time gives (pack converts the time back to a tid,
with float rounding: give that tid to `zodbd pack --tid`), the seconds the
pack took and the size before and after. The copy is removed.
"""
import os
import shutil
import sys
import time

from ZODB.FileStorage import FileStorage
from ZODB.serialize import referencesf
from ZODB.TimeStamp import TimeStamp


def main():
    src, tid = sys.argv[1], bytes.fromhex(sys.argv[2])
    gc = '--no-gc' not in sys.argv
    path = src + '.zodbpy'
    shutil.copyfile(src, path)
    try:
        st = FileStorage(path, pack_gc=gc, pack_keep_old=False)
        t = TimeStamp(tid).timeTime()
        stop = TimeStamp(*time.gmtime(t)[:5] + (t % 60,)).raw()
        before = os.path.getsize(path)
        t0 = time.perf_counter()
        st.pack(t, referencesf)
        dt = time.perf_counter() - t0
        st.close()
        after = os.path.getsize(path)
        print('zodbpy pack at tid %s: %.3f s, %.1f MB/s, %d -> %d bytes'
              % (stop.hex(), dt, before / 1e6 / dt, before, after))
    finally:
        for ext in ('', '.index', '.lock', '.tmp', '.old', '.pack'):
            if os.path.exists(path + ext):
                os.remove(path + ext)


if __name__ == '__main__':
    main()
