#!/usr/bin/env python3
"""make_demo.py PATH - write a small demo ZODB FileStorage database at PATH.

The database is made with ZODB/py (the venv from requirements.txt) and is
deterministic: transaction ids come from a fixed clock (2024-06-01 00:00:00
UTC, one transaction a minute), not from the wall clock, so two runs give
byte-identical files.

Content: a root with a few PersistentMappings (people, config), an OOBTree
catalog that spans several buckets, and a handful of transactions with
user, description and extension set. `make run` uses it as data/demo/Data.fs.

The file is written in a temporary directory next to PATH and renamed into
place (with its .index), so an interrupted run leaves no half-written PATH.
"""

import calendar
import os
import shutil
import sys
import tempfile
import time

import transaction
import ZODB
from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping
from persistent.TimeStamp import TimeStamp
from ZODB.FileStorage import FileStorage

T0 = calendar.timegm((2024, 6, 1, 0, 0, 0))


class ClockedFileStorage(FileStorage):
    """FileStorage that takes its tids from a fixed clock."""

    def __init__(self, path, **kw):
        self._demo_t = float(T0)
        self._demo_last = None
        FileStorage.__init__(self, path, **kw)

    def tpc_begin(self, txn, tid=None, status=' '):
        if tid is None:
            self._demo_t += 60.0
            t = self._demo_t
            ts = TimeStamp(*(time.gmtime(t)[:5] + (t % 60,)))
            if self._demo_last is not None:
                ts = ts.laterThan(self._demo_last)
            self._demo_last = ts
            tid = ts.raw()
        return FileStorage.tpc_begin(self, txn, tid, status)


def commit(user, description, **ext):
    txn = transaction.get()
    txn.user = user
    txn.description = description
    for k, v in sorted(ext.items()):
        txn.setExtendedInfo(k, v)
    transaction.commit()


def populate(root):
    # T2: a few PersistentMappings
    people = root['people'] = PersistentMapping()
    for i, (name, age) in enumerate([('alice', 34), ('bob', 27),
                                     ('carol', 45), ('dave', 19)]):
        people[name] = PersistentMapping(
            {'name': name.title(), 'age': age, 'id': i})
    root['config'] = PersistentMapping(
        {'title': 'zodbd demo', 'version': 1, 'tags': ['demo', 'zodb']})
    commit('alice', 'create people and config', app='make_demo')

    # T3: an OOBTree with enough items to have several buckets
    catalog = root['catalog'] = OOBTree()
    for i in range(100):
        catalog['item-%03d' % i] = ('item %d' % i, i * i)
    commit('bob', 'add the catalog (100 items)')

    # T4: modify two objects
    people['alice']['age'] += 1
    root['config']['version'] = 2
    commit('alice', "alice's birthday; config v2", app='make_demo',
           reason='birthday')

    # T5: remove and add catalog items
    for i in range(0, 100, 10):
        del catalog['item-%03d' % i]
    for i in range(100, 120):
        catalog['item-%03d' % i] = ('item %d' % i, i * i)
    commit('carol', 'catalog: drop every tenth item, add 20')

    # T6: one more person
    people['erin'] = PersistentMapping({'name': 'Erin', 'age': 52, 'id': 4})
    commit('dave', 'add erin')


def make_demo(path):
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmpdir = tempfile.mkdtemp(prefix='.make_demo-', dir=parent)
    try:
        tmp = os.path.join(tmpdir, os.path.basename(path))
        db = ZODB.DB(ClockedFileStorage(tmp, create=True))  # T1: root
        conn = db.open()
        populate(conn.root())
        conn.close()
        db.close()  # writes tmp.index
        for suffix in ('.index', ''):  # Data.fs last: it marks completion
            if os.path.exists(tmp + suffix):
                os.replace(tmp + suffix, path + suffix)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def main(argv):
    if len(argv) != 1:
        print(__doc__.split('\n\n')[0], file=sys.stderr)
        return 2
    make_demo(argv[0])
    print('make_demo: wrote %s' % argv[0])
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
