"""NEO/py client oracle for neo/client/neopyoracle_test.go.
  neopy_oracle.py build MASTER CLUSTER SEED   -> builds a random history (stdout: json {"oids": [...]})
  neopy_oracle.py dump MASTER CLUSTER OIDS(json) -> every answer of NEO/py's client as json
"""
import sys, json, random, os, binascii
from neo.client.Storage import Storage
from neo.lib.util import p64, u64
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ConflictError, UndoError

h = lambda b: None if b is None else binascii.hexlify(b).decode()
t64 = lambda b: None if b is None else u64(b)

def open_(master, cluster):
    return Storage(master_nodes=master, name=cluster)

def commit(st, ops, user=b'', desc=b'', ext=None):
    txn = TransactionMetaData(user, desc, ext or {})
    st.tpc_begin(txn)
    try:
        ops(txn)
        st.tpc_vote(txn)
        return st.tpc_finish(txn)
    except BaseException:
        st.tpc_abort(txn)
        raise

def build(master, cluster, seed):
    rnd = random.Random(seed)
    st = open_(master, cluster)
    oids = [st.new_oid() for _ in range(6)]
    cur = {}
    tids = []
    log = []
    for i in range(30):
        k = rnd.random()
        user = rnd.choice([b'', b'alice', b'bob\xff'])
        desc = rnd.choice([b'', b'desc %d' % i, b'x' * 300])
        ext = rnd.choice([None, {'n': i}, {'big': 'y' * 200, 'u': u'\xe9'}])
        def data():
            r = rnd.random()
            if r < 0.1:
                return os.urandom(300000)
            if r < 0.2:
                return b'z' * 500000
            if r < 0.25:
                return b''
            return b'd%d-%d' % (i, rnd.randrange(1000))
        try:
            if k < 0.55 or not cur:
                chosen = rnd.sample(oids, rnd.randint(1, 3))
                vals = {o: data() for o in chosen}
                def ops(txn):
                    for o in chosen:
                        st.store(o, cur.get(o, p64(0)), vals[o], '', txn)
                tid = commit(st, ops, user, desc, ext)
                for o in chosen:
                    cur[o] = tid
                log.append(('store', i))
            elif k < 0.65:
                o = rnd.choice(sorted(cur))
                def ops(txn):
                    st.deleteObject(o, cur[o], txn)
                tid = commit(st, ops, user, desc, ext)
                del cur[o]
                log.append(('delete', i))
            elif k < 0.8 and tids:
                u = rnd.choice(tids)
                res = {}
                def ops(txn):
                    res['r'] = st.undo(u, txn)
                tid = commit(st, ops, user, desc, ext)
                # undone oids: reload serials
                for o in oids:
                    try:
                        cur[o] = st.load(o)[1]
                    except Exception:
                        cur.pop(o, None)
                log.append(('undo', i))
            elif k < 0.9 and len(cur) >= 2:
                a, b = rnd.sample(sorted(cur), 2)
                def ops(txn):
                    st.checkCurrentSerialInTransaction(a, cur[a], txn)
                    st.store(b, cur[b], b'ccs%d' % i, '', txn)
                tid = commit(st, ops, user, desc, ext)
                cur[b] = tid
                log.append(('ccs', i))
            else:
                o = rnd.choice(sorted(cur))
                def ops(txn):
                    st.store(o, p64(1), b'stale', '', txn)
                tid = commit(st, ops, user, desc, ext)
                log.append(('stale-ok?', i))
                cur[o] = tid
        except Exception as e:
            log.append((type(e).__name__, i))
            continue
        tids.append(tid)
    packed = None
    if seed % 2 and len(tids) > 4:
        packed = tids[len(tids) // 2]
        st.app.wait_for_pack = True
        st.app.pack(packed)
        # a few more commits after the pack
        for j in range(3):
            o = rnd.choice(oids)
            try:
                s = st.load(o)[1]
            except Exception:
                s = p64(0)
            try:
                commit(st, lambda txn: st.store(o, s, b'after-pack-%d' % j, '', txn))
            except Exception:
                pass
    st.close()
    json.dump({'oids': [u64(o) for o in oids], 'log': log, 'packed': packed and u64(packed)}, sys.stdout)

def dump(master, cluster, oids):
    st = open_(master, cluster)
    app = st.app
    st.sync()
    out = {}
    last = st.lastTransaction()
    out['last'] = u64(last)
    def exc(e):
        return {'err': type(e).__name__}
    # iterator
    def iterate(start, stop):
        res = []
        try:
            for txn in st.iterator(start and p64(start), stop and p64(stop)):
                info, ext = app._getTransactionInformation(txn.tid)
                recs = []
                for r in txn:
                    recs.append([u64(r.oid), h(r.data), t64(r.data_txn)])
                res.append({'tid': u64(txn.tid), 'status': txn.status, 'user': h(info['user_name']),
                            'desc': h(info['description']), 'ext': h(ext), 'recs': recs})
        except Exception as e:
            return exc(e)
        return {'ok': res}
    full = iterate(None, None)
    out['iter'] = {'0-0': full}
    tids = [t['tid'] for t in full['ok']]
    out['tids'] = tids
    n = len(tids)
    for a, b in [(3, 7), (5, None), (7, 3), (None, 4), (n - 1, None)]:
        start = tids[a] if a is not None and a < n else None
        stop = tids[b] if b is not None and b < n else None
        out['iter']['%d-%d' % (start or 0, stop or 0)] = iterate(start, stop)
    probes = sorted({0, 1} | {t + d for t in tids for d in (-1, 0, 1)})
    allo = oids + [max(oids) + 100]
    lb = {}
    ls = {}
    hist = {}
    for o in allo:
        for before in probes:
            if before == 0:
                continue
            try:
                data, serial, nxt, _ = app._loadFromStorage(p64(o), None, p64(before))
                r = {'ok': [h(data), u64(serial), t64(nxt)]}
            except Exception as e:
                r = exc(e)
            lb['%d@%d' % (o, before)] = r
        for t in tids + [tids[0] + 1]:
            try:
                data, serial, nxt, _ = app._loadFromStorage(p64(o), p64(t), None)
                r = {'ok': [h(data), u64(serial), t64(nxt)]}
            except Exception as e:
                r = exc(e)
            ls['%d@%d' % (o, t)] = r
        for size in (1, 3, 100):
            try:
                r = {'ok': [[u64(e['tid']), e['size'], h(e['user_name']), h(e['description'])] for e in st.history(p64(o), size)]}
            except Exception as e:
                r = exc(e)
            hist['%d/%d' % (o, size)] = r
    out['loadBefore'] = lb
    out['loadSerial'] = ls
    out['history'] = hist
    ul = {}
    for first, lst in [(0, 5), (0, 100), (2, 7), (0, -3), (5, -2), (100, 200)]:
        try:
            r = {'ok': [[u64(e['id']), h(e['user_name']), h(e['description'])] for e in st.undoLog(first, lst)]}
        except Exception as e:
            r = exc(e)
        ul['%d,%d' % (first, lst)] = r
    out['undoLog'] = ul
    st.close()
    json.dump(out, sys.stdout)

if __name__ == '__main__':
    mode, master, cluster = sys.argv[1:4]
    if mode == 'build':
        build(master, cluster, int(sys.argv[4]))
    elif mode in ('commit', 'historyloop', 'undotry', 'writetry'):
        pass
    else:
        dump(master, cluster, json.loads(sys.argv[4]))

def committer(master, cluster, oids, n, seed):
    """Commit n transactions, each changing 1-3 of oids (counter values)."""
    rnd = random.Random(seed)
    st = open_(master, cluster)
    for i in range(n):
        chosen = rnd.sample(oids, rnd.randint(1, min(3, len(oids))))
        def ops(txn):
            for o in chosen:
                try:
                    s = st.load(p64(o))[1]
                except Exception:
                    s = p64(0)
                st.store(p64(o), s, b'v%d-%d' % (seed, i), '', txn)
        try:
            commit(st, ops)
        except Exception as e:
            print('commit %d: %r' % (i, e), file=sys.stderr)
    st.close()
    print('done')

if __name__ == '__main__' and sys.argv[1] == 'commit':
    committer(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))

def historyloop(master, cluster, oids, secs):
    import time
    st = open_(master, cluster)
    end = time.time() + secs
    n = errs = 0
    last = None
    while time.time() < end:
        for o in oids:
            n += 1
            try:
                st.history(p64(o), 1)
            except Exception as e:
                errs += 1
                last = repr(e)
    st.close()
    print(json.dumps({'n': n, 'errs': errs, 'last': last}))

if __name__ == '__main__' and sys.argv[1] == 'historyloop':
    historyloop(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), float(sys.argv[5]))

def undotry(master, cluster):
    """For every transaction: undo it in a transaction that is voted, then
    aborted; the oids undone or the exception class."""
    st = open_(master, cluster)
    st.sync()
    tids = [t.tid for t in st.iterator()]
    out = {}
    for tid in tids:
        txn = TransactionMetaData()
        st.tpc_begin(txn)
        try:
            r = st.undo(tid, txn)
            st.tpc_vote(txn)
            out[str(u64(tid))] = {'ok': sorted(u64(o) for o in r[1])}
        except Exception as e:
            out[str(u64(tid))] = {'err': type(e).__name__}
        finally:
            st.tpc_abort(txn)
    st.close()
    json.dump(out, sys.stdout)

if __name__ == '__main__' and sys.argv[1] == 'undotry':
    undotry(sys.argv[2], sys.argv[3])

def writetry(master, cluster, scen):
    """Each scenario: a list of [op, oid, serial, data] (op: store, delete,
    ccs, undo (serial = the tid)); voted, then aborted. The exception class
    or ok."""
    st = open_(master, cluster)
    st.sync()
    out = []
    for ops in scen:
        txn = TransactionMetaData()
        st.tpc_begin(txn)
        try:
            for op, oid, serial, data in ops:
                o, s = p64(oid), p64(serial)
                if op == 'store':
                    st.store(o, s, data.encode(), '', txn)
                elif op == 'delete':
                    st.deleteObject(o, s, txn)
                elif op == 'ccs':
                    st.checkCurrentSerialInTransaction(o, s, txn)
                elif op == 'undo':
                    st.undo(s, txn)
            st.tpc_vote(txn)
            out.append({'ok': 'voted'})
        except Exception as e:
            out.append({'err': type(e).__name__})
        finally:
            try:
                st.tpc_abort(txn)
            except Exception:
                pass
    st.close()
    json.dump(out, sys.stdout)

if __name__ == '__main__' and sys.argv[1] == 'writetry':
    writetry(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
