"""Drive NEO/py's SQLite database manager the way its storage node does at
its first start and when the master identifies it and sends partition
tables, then print what it stored or reads (JSON on stdout).

Usage: PYTHONPATH=NEOPY_SRC python neopy_pt.py create DB NAME DEDUP
       PYTHONPATH=NEOPY_SRC python neopy_pt.py apply DB OPS.json
       PYTHONPATH=NEOPY_SRC python neopy_pt.py read DB

create: a new database as neostorage's first start makes it (setup, then
  the cluster name unless NAME is "").
apply: OPS is a list of {"op": "nid", "nid": N} (setUUID at
  identification) and {"op": "pt", "ptid", "replicas", "cells": [[p, nid,
  state], ...], "reset", "last_pack_id"} (changePartitionTable, reset for
  SendPartitionTable, then commit); prints the config and pt tables after
  each operation.
read: what a restarted node reads: name, nid, ptid, replicas, the table
  (getPartitionTable), the number of partitions and the readable ones
  (0 and [] for an empty table).
"""
import json
import sqlite3
import sys

from neo.lib.util import p64
from neo.storage.database.sqlite import SQLiteDatabaseManager


class App(object):
    """The attributes of the storage application changePartitionTable
    reads. Dropping the data of discarded partitions is left out."""
    disable_drop_partitions = True

    def __init__(self, last_pack_id):
        self.last_pack_id = p64(last_pack_id)


def dump(path):
    c = sqlite3.connect(path)
    out = {
        'master': [list(r) for r in c.execute(
            'SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid')],
        'config': sorted([list(r) for r in c.execute('SELECT * FROM config')]),
        'pt': sorted([list(r) for r in c.execute('SELECT * FROM pt')]),
        'journal_mode': c.execute('PRAGMA journal_mode').fetchone()[0],
    }
    c.close()
    return out


def main(cmd, path, *args):
    if cmd == 'create':
        name, dedup = args
        dm = SQLiteDatabaseManager(path)
        dm.setup(dedup=dedup == '1')
        if name:
            dm.setName(name)  # commits
        else:
            dm.commit()
        dm.close()
        out = dump(path)
    elif cmd == 'apply':
        with open(args[0]) as f:
            ops = json.load(f)
        dm = SQLiteDatabaseManager(path)
        dm.setup()
        out = []
        for op in ops:
            if op['op'] == 'nid':
                dm.setUUID(op['nid'])
            elif op['op'] == 'pt':
                dm.changePartitionTable(
                    App(op.get('last_pack_id', 0)), op['ptid'], op['replicas'],
                    [tuple(c) for c in op['cells']], reset=op['reset'])
                dm.commit()
            else:
                raise ValueError(op)
            d = dump(path)
            out.append({'config': d['config'], 'pt': d['pt']})
        dm.close()
    elif cmd == 'read':
        dm = SQLiteDatabaseManager(path)
        dm.setup()
        np, readable = 0, []
        if dm._getMaxPartition() is not None:
            readable = sorted(dm._readable_set)  # computes np
            np = dm.np
        out = {
            'name': dm.getName(),
            'nid': dm.getUUID(),
            'ptid': dm.getPTID(),
            'replicas': dm.getNumReplicas(),
            'pt': sorted([list(c) for c in dm.getPartitionTable()]),
            'np': np,
            'readable': readable,
        }
        dm.close()
    else:
        raise ValueError(cmd)
    json.dump(out, sys.stdout, sort_keys=True)


if __name__ == '__main__':
    main(*sys.argv[1:])
