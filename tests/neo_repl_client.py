"""NEO/py client helper for tests/test_neo_replication_into.py (runs with NEO/py's
Python): `commit MASTER NAME N TAG` commits N transactions (small objects,
one of 100 KiB, an undo); `loop MASTER NAME STOPFILE` commits until
STOPFILE exists and prints how many it committed; `dump MASTER NAME OUT`
writes every transaction record (tid, oid, sha1 of the data, data_txn) and
the current data of each oid as JSON."""
import hashlib
import json
import os
import sys
import time

import transaction
import ZODB
from persistent.mapping import PersistentMapping
from neo.client.Storage import Storage


def open_db(master, name):
    st = Storage(master_nodes=master, name=name)
    return st, ZODB.DB(st)


def commit(master, name, n, tag):
    st, db = open_db(master, name)
    c = db.open()
    root = c.root()
    for i in range(n):
        m = root.setdefault('m_%s' % (i % 7), PersistentMapping())
        m['%s-%d' % (tag, i)] = os.urandom(64 if i % 10 else 100 << 10)
        transaction.get().note(('%s %d' % (tag, i)).encode() if bytes is str else '%s %d' % (tag, i))
        transaction.commit()
    # an undo of the last transaction
    info = db.undoLog(0, 1)
    db.undo(info[0]['id'])
    transaction.commit()
    c.close()
    db.close()


def loop(master, name, stopfile):
    st, db = open_db(master, name)
    c = db.open()
    root = c.root()
    n = 0
    while not os.path.exists(stopfile):
        m = root.setdefault('loop_%d' % (n % 5), PersistentMapping())
        m[n] = os.urandom(200)
        transaction.commit()
        n += 1
        time.sleep(0.01)
    c.close()
    db.close()
    print(n)


def dump(master, name, out):
    st, db = open_db(master, name)
    recs, oids = [], set()
    for t in st.iterator():
        for r in t:
            recs.append([r.tid.hex(), r.oid.hex(), hashlib.sha1(r.data or b'').hexdigest(),
                         (r.data_txn or b'').hex()])
            oids.add(r.oid)
    cur = {}
    for oid in sorted(oids):
        try:
            data, serial = st.load(oid)
            cur[oid.hex()] = [serial.hex(), hashlib.sha1(data).hexdigest()]
        except Exception as e:  # a deleted or undone-creation object
            cur[oid.hex()] = [type(e).__name__]
    json.dump({'records': recs, 'current': cur}, open(out, 'w'))
    db.close()


if __name__ == '__main__':
    cmd, master, name = sys.argv[1:4]
    if cmd == 'commit':
        commit(master, name, int(sys.argv[4]), sys.argv[5])
    elif cmd == 'loop':
        loop(master, name, sys.argv[4])
    elif cmd == 'dump':
        dump(master, name, sys.argv[4])
