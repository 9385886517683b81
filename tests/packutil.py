"""Helpers of the pack tests (test_pack_interop, test_pack_boundaries):
ZODB/py's side of a pack and what a FileStorage file holds."""
import time

from ZODB.FileStorage import FileStorage
from ZODB.POSException import POSKeyError
from ZODB.serialize import referencesf
from ZODB.TimeStamp import TimeStamp
from ZODB.utils import z64


def tids_of(path):
    st = FileStorage(path, read_only=True)
    try:
        return [t.tid for t in st.iterator()]
    finally:
        st.close()


def pack_time_between(tid1, tid2):
    """A float pack time between two tids, and the tid ZODB/py makes of it
    (FileStorage.pack's conversion)."""
    t = (TimeStamp(tid1).timeTime() + TimeStamp(tid2).timeTime()) / 2
    stop = TimeStamp(*time.gmtime(t)[:5] + (t % 60,)).raw()
    assert tid1 <= stop < tid2, (tid1.hex(), stop.hex(), tid2.hex())
    return t, stop


def py_pack(path, t, gc=True):
    """ZODB/py's pack of the file at path at time t."""
    st = FileStorage(path, pack_gc=gc)
    try:
        st.pack(t, referencesf)
    finally:
        st.close()


def reachable(path, at, missing_ok=False):
    """The oids reachable from the root in the state before `at`; with
    missing_ok, an object without a revision (POSKeyError) is counted and
    not followed."""
    st = FileStorage(path, read_only=True)
    try:
        seen, todo = set(), [z64]
        while todo:
            oid = todo.pop()
            if oid in seen:
                continue
            seen.add(oid)
            try:
                r = st.loadBefore(oid, at)
            except POSKeyError:
                if not missing_ok:
                    raise
                r = None
            if r:
                todo.extend(referencesf(r[0]))
        return seen
    finally:
        st.close()
