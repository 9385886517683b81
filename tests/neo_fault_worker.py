"""One committer of tests/test_neo_writes.py's fault test, run with NEO/py's
Python: commits to its own two objects (the same counter in both, so a
partial transaction shows) until the stop file appears, retrying through
the storage's deaths, and appends "k tid" to its log after every commit
that returned (acknowledged). With a sixth argument "big", every third
commit also writes ~180 KB (tests/test_neo_sqlite_swap.py's crashes)."""
import faulthandler
import os
import signal
import sys
import time

import transaction
from neo.client.Storage import Storage
from ZODB import DB
from persistent.mapping import PersistentMapping

master, name, i, logpath, stopfile = sys.argv[1:6]
big = sys.argv[6:7] == ['big']
faulthandler.register(signal.SIGUSR1)  # the test dumps a stuck worker's stacks
i = int(i)


def connect():
    """A new client (DB, transaction manager, connection), retried while
    the cluster is down; the workers start together: creating the root may
    conflict."""
    deadline = time.monotonic() + 120
    while True:
        try:
            db = DB(Storage(master_nodes=master, name=name))
            tm = transaction.TransactionManager()
            return db, tm, db.open(tm)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def close(db):
    try:
        db.close()
    except Exception:
        pass


db, tm, conn = connect()
key = 'w%d' % i
k = 0
errors = failed = 0  # failed: errors in a row
with open(logpath, 'a') as log:
    while not os.path.exists(stopfile):
        try:
            root = conn.root()
            if key not in root:
                root[key] = PersistentMapping(k=0)
                root[key + 'b'] = PersistentMapping(k=0)
                tm.commit()
                continue
            a, b = root[key], root[key + 'b']
            if a['k'] != b['k']:
                sys.exit('partial transaction visible: %s %r %r' % (key, a['k'], b['k']))
            k = a['k'] + 1
            a['k'] = k
            b['k'] = k
            a['pad'] = os.urandom(64)
            if big and k % 3 == 0:
                a['blob'] = ('%d-' % k) * 50000
                b['rnd'] = os.urandom(30000)
            tm.commit()
            log.write('%d %s\n' % (k, a._p_serial.hex()))
            log.flush()
            failed = 0
        except Exception:  # the storage died: retry once the cluster runs again
            errors += 1
            failed += 1
            try:
                tm.abort()
            except Exception:
                pass
            if failed % 50 == 0:
                # NEO/py's client can be left unusable by a storage that
                # died in the middle of a commit: start a new one, as an
                # application would.
                close(db)
                db, tm, conn = connect()
            time.sleep(0.05)
close(db)
print('worker %d: %d commits, %d errors' % (i, k, errors))
