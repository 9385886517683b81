"""Apply a scenario of NEO write operations to a NEO/py SQLite storage
database with NEO/py's own database manager (SQLiteDatabaseManager), the
way NEO/py's storage node drives it (neo/storage/transactions.py and
handlers), then dump the tables.

Usage: PYTHONPATH=NEOPY_SRC python neopy_writes.py DB SCENARIO.json OUT.json

The Go test (write_test.go) runs the same scenario through neosqlite's
writer on another copy of the database and compares the dumps and the
answers (undo serials, locked transactions).
"""
import json
import sqlite3
import sys
from hashlib import sha1

from neo.lib.util import p64, u64
from neo.storage.database.sqlite import SQLiteDatabaseManager


def open_dm(path):
    dm = SQLiteDatabaseManager(path)
    dm.setup()
    dm._readable_set  # computes np, the readable set, the data ids
    return dm


def dump(path):
    """Every row of NEO's tables, sorted; BLOBs as "x:HEX"."""
    c = sqlite3.connect(path)
    out = {}
    for t in ('config', 'pt', 'pack', 'trans', 'obj', 'data', 'ttrans', 'tobj'):
        rows = []
        for r in c.execute('SELECT * FROM ' + t):
            rows.append([('x:' + bytes(v).hex()) if isinstance(v, (bytes, memoryview)) else v for v in r])
        rows.sort(key=lambda r: json.dumps(r))
        out[t] = rows
    out['journal_mode'] = c.execute('PRAGMA journal_mode').fetchone()[0]
    c.close()
    return out


def main(path, scenario, outpath):
    with open(scenario) as f:
        ops = json.load(f)
    dm = open_dm(path)
    txns = {}  # ttid -> (has_meta, store_dict, pack)
    answers = []
    for op in ops:
        kind = op['op']
        if kind == 'vote':
            ttid = op['ttid']
            store = {}
            for o in op['objects']:
                oid = p64(o['oid'])
                data = bytes.fromhex(o.get('data', ''))
                serial = o.get('data_serial') or 0
                if o.get('nodata'):
                    checksum = None
                else:
                    checksum = sha1(data).digest()
                data_id = dm.holdData(checksum, oid, data, o.get('compression', 0),
                                      p64(serial) if serial else None)
                store[oid] = oid, data_id, p64(serial) if serial else None
            meta = op.get('meta')
            info = None
            pack = None
            if meta is not None:
                info = ([p64(x) for x in meta['oids']], bytes.fromhex(meta['user']),
                        bytes.fromhex(meta['description']), bytes.fromhex(meta['extension']),
                        False, p64(ttid))
                pack = meta.get('pack')
            dm.storeTransaction(p64(ttid), store.values(), info)
            if pack:
                oids = pack['oids']
                oids = None if oids is None else [p64(x) for x in oids]
                dm.storePackOrder(p64(ttid), None, bool(oids), oids, p64(pack['pack_tid']))
            dm.commit()
            txns[ttid] = (meta is not None, store, bool(pack))
        elif kind == 'lock':
            has_meta = txns[op['ttid']][0] if op['ttid'] in txns else True
            if has_meta:
                dm.lockTransaction(p64(op['tid']), p64(op['ttid']), op.get('pack', False))
        elif kind == 'unlock':
            ttid = op['ttid']
            if ttid in txns:
                has_meta, store, pack = txns.pop(ttid)
                dm.unlockTransaction(p64(op['tid']), p64(ttid), has_meta, store, pack)
            else:
                # After a restart: the master's ValidateTransaction.
                dm.unlockTransaction(p64(op['tid']), p64(ttid), True, True, True)
            dm.commit()
        elif kind == 'abort':
            ttid = op['ttid']
            has_meta, store, pack = txns.pop(ttid)
            dm.abortTransaction(p64(ttid))
            dm.releaseData([x[1] for x in store.values()], True)
            dm.commit()
        elif kind == 'drop_unlocked':
            dm.dropUnfinishedData()
            txns.clear()
        elif kind == 'pack':
            tid = op['tid']
            oids = op.get('oids')
            for offset in sorted(dm._readable_set):
                if oids is not None:
                    dm._pack(offset, [x for x in oids if x % dm.np == offset], tid)
                else:
                    oid = -1
                    while True:
                        oid, _ = dm._pack(offset, oid + 1, tid, 500)
                        if oid is None:
                            break
                if op.get('pack_id'):
                    dm._setPartitionPacked(offset, op['pack_id'])
                dm.commit()
        elif kind == 'undo_serial':
            r = dm.findUndoTID(p64(op['oid']), p64(op['ltid']) if op.get('ltid') else None,
                               p64(op['undo_tid']),
                               p64(op['current']) if op.get('current') else None)
            if r is None:
                answers.append(None)
            else:
                cur, undo, is_current = r
                answers.append([u64(cur) if cur else 0, u64(undo) if undo else 0, bool(is_current)])
        elif kind == 'locked':
            d = dm.getUnfinishedTIDDict()
            answers.append(sorted([u64(k), u64(v) if v else 0] for k, v in d.items()))
        elif kind == 'set_name':
            dm.setName(op['name'])
        elif kind == 'set_nid':
            dm.setUUID(op['nid'])
        elif kind == 'reopen':
            dm.close()
            dm = open_dm(path)
            txns.clear()
        else:
            raise ValueError(kind)
    dm.close()
    out = dump(path)
    out['answers'] = answers
    with open(outpath, 'w') as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write('\n')


if __name__ == '__main__':
    main(*sys.argv[1:])
