"""Commits a history with undo records through NEO/py's client, packs,
and prints the tids of the storage's iterator as JSON (run with NEO/py's
Python by tests/test_neo_writes.py).

Usage: neo_pack_check.py MASTER NAME commit|pack|list

commit: 20 transactions (objects replaced, an undo, an object unlinked).
pack: db.pack() now.
Each prints {"tids": [...], "records": N, "counts": [...]} from the
storage's iterator (counts: the records of each transaction; list: only
that)."""
import json
import sys
import time

import transaction
from neo.client.Storage import Storage
from persistent.mapping import PersistentMapping
from ZODB import DB

master, name, what = sys.argv[1:4]
db = DB(Storage(master_nodes=master, name=name))
st = db.storage


def listing():
    tids, counts = [], []
    for txn in st.iterator():
        tids.append(txn.tid.hex())
        counts.append(sum(1 for _ in txn))
    return tids, counts


try:
    if what == 'commit':
        conn = db.open()
        root = conn.root()
        for i in range(10):
            root['m%d' % (i % 3)] = PersistentMapping(n=i)
            transaction.commit()
            time.sleep(0.01)  # distinct pack times
        root['m0']['n'] = 'changed'
        transaction.commit()
        undo_id = db.undoLog(0, 1)[0]['id']
        db.undo(undo_id)
        transaction.commit()
        del root['m1']  # unreachable from now on (no GC in NEO's pack)
        transaction.commit()
        for i in range(7):
            root['m2']['n'] = i
            transaction.commit()
        conn.close()
    elif what == 'pack':
        db.pack(time.time())
    tids, counts = listing()
    print(json.dumps({'tids': tids, 'records': sum(counts), 'counts': counts}))
finally:
    db.close()
