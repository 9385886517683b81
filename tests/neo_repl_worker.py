"""The client side of tests/test_neo_replication.py, run with NEO/py's
Python: `commit MASTER NAME` writes the workload (many transactions, one
of many objects, raw, zlib-compressible and incompressible data, several
revisions, an undo, the undo of a creation: a record without data);
`more MASTER NAME` commits a few more transactions (new objects and new
revisions); `dump MASTER NAME` prints, as JSON, everything a client reads back: every
transaction of the iterator with its records (data sha1, data_txn), the
current revision of every oid and the undo log."""
import hashlib
import json
import os
import sys

import transaction
from neo.client.Storage import Storage
from persistent.mapping import PersistentMapping
from ZODB import DB, POSException
from ZODB.utils import p64, u64

mode, master, name = sys.argv[1:4]


class Blob(PersistentMapping):
    pass


def commit():
    db = DB(Storage(master_nodes=master, name=name))
    conn = db.open()
    root = conn.root()
    root['big'] = os.urandom(100 << 10)  # incompressible: stored raw
    root['text'] = 'replicate me ' * 5000  # compressible: stored zlib
    transaction.commit()
    # More transactions than one AskFetchTransactions fetches (1000).
    for i in range(1100):
        root['counter'] = i
        transaction.get().note(u'tick %d' % i)
        transaction.commit()
    # More object records in one transaction than one AskFetchObjects.
    many = root['many'] = PersistentMapping()
    for i in range(2500):
        many[i] = PersistentMapping({'i': i})
    transaction.commit()
    root['counter'] = 'before undo'
    transaction.commit()
    db.undo(db.undoLog(0, 1)[0]['id'])  # undo: a backpointer to the previous revision
    transaction.commit()
    root['gone'] = PersistentMapping({'x': 1})
    transaction.commit()
    db.undo(db.undoLog(0, 1)[0]['id'])  # undo of a creation: a record without data
    transaction.commit()
    db.close()


def more():
    db = DB(Storage(master_nodes=master, name=name))
    conn = db.open()
    root = conn.root()
    for i in range(20):
        root['counter'] = 'more %d' % i
        root['more'] = PersistentMapping({'i': i, 'pad': os.urandom(1000)})
        transaction.commit()
    db.close()


def dump():
    st = Storage(master_nodes=master, name=name, read_only=True)
    out = {'txns': [], 'current': {}, 'undo': []}
    oids = set()
    for t in st.iterator():
        recs = []
        for r in t:
            oids.add(r.oid)
            recs.append([u64(r.oid), None if r.data is None else hashlib.sha1(r.data).hexdigest(),
                         None if r.data_txn is None else u64(r.data_txn)])
        out['txns'].append([u64(t.tid), t.user.decode('latin-1'), t.description.decode('latin-1'),
                            hashlib.sha1(t.extension_bytes if hasattr(t, 'extension_bytes') else
                                         repr(sorted(t.extension.items())).encode()).hexdigest(), recs])
    for oid in sorted(oids):
        try:
            data, serial = st.load(oid)
            out['current'][u64(oid)] = [hashlib.sha1(data).hexdigest(), u64(serial)]
        except POSException.POSKeyError:
            out['current'][u64(oid)] = None
    out['undo'] = [[d['description'].decode('latin-1') if isinstance(d['description'], bytes) else d['description'],
                    d['id'].hex()] for d in st.undoLog(0, 50)]
    st.close()
    json.dump(out, sys.stdout)


{'commit': commit, 'more': more, 'dump': dump}[mode]()
