"""Workloads of tests/test_zeo_contention_oracle.py (ZEO under
contention, zodbd against runzeo as the oracle).

- Deterministic two-client conflicts (SCENARIOS): client B begins a
  transaction (its snapshot), client A changes objects and commits, then B
  changes objects in its old snapshot and commits: B's outcome (committed,
  or the exception's class, oid, serials and class_name, the tids named by
  labels) and the final state (unpickled, walked recursively) are reported
  as JSON-able data, to be compared between servers.
- Random multi-process contention (`python contention_oracle_worker.py
  random ADDR P SEED N`): each process commits N transactions on shared
  BTrees (IOBTree/OOBTree/LOBTree/OIBTree buckets that split and merge,
  TreeSets, an OOSet, a catalog of IITreeSets), Lengths, Counters and
  readCurrent, retrying on ConflictError; it prints its log (the effects of
  each successful commit, with its tid) as JSON.
"""
import json
import os
import random
import sys
import time

import transaction
import ZEO
from BTrees.IIBTree import IITreeSet
from BTrees.IOBTree import IOBTree
from BTrees.LOBTree import LOBTree
from BTrees.Length import Length
from BTrees.OIBTree import OIBTree
from BTrees.OOBTree import OOBTree, OOSet, OOTreeSet
from persistent.list import PersistentList
from persistent.mapping import PersistentMapping
from ZEO.Exceptions import ClientDisconnected
from ZODB.POSException import ConflictError
from ZODB.utils import u64

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from zeo_contention_app import Counter  # noqa: E402  (runzeo imports it too)


# -- state dumps ------------------------------------------------------------

def dump(obj, depth=0):
    """A JSON-able canonical form of obj's state, following persistent
    subobjects (BTrees by their items)."""
    if depth > 20:
        return '...'
    name = type(obj).__module__ + '.' + type(obj).__name__
    if isinstance(obj, Length):
        return [name, obj()]
    if isinstance(obj, Counter):
        return [name, obj.value]
    if hasattr(obj, 'items') and type(obj).__module__.startswith('BTrees.'):
        return [name, [[dump(k, depth + 1), dump(v, depth + 1)] for k, v in obj.items()]]
    if hasattr(obj, 'keys') and type(obj).__module__.startswith('BTrees.'):
        return [name, [dump(k, depth + 1) for k in obj.keys()]]
    if isinstance(obj, PersistentList):
        return [name, [dump(x, depth + 1) for x in obj]]
    if isinstance(obj, PersistentMapping):
        return [name, {str(k): dump(v, depth + 1) for k, v in sorted(obj.items())}]
    if isinstance(obj, str) and len(obj) > 1000:
        import hashlib
        return ['str', len(obj), hashlib.sha1(obj.encode()).hexdigest()]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, bytes):
        return ['bytes', obj.hex()]
    if isinstance(obj, (tuple, list)):
        return [dump(x, depth + 1) for x in obj]
    return [name, repr(obj)]


def check_trees(root):
    """BTrees.check.check of every tree under root (one level and the
    catalog's TreeSets); the problems found."""
    from BTrees.check import check
    out = []
    for k, v in sorted(root.items()):
        objs = [(k, v)]
        if k == 'cat':
            objs += [('cat/%s' % kk, vv) for kk, vv in v.items()]
        for name, o in objs:
            if type(o).__module__.startswith('BTrees.') and not isinstance(o, Length):
                try:
                    check(o)
                except AssertionError as e:
                    out.append('%s: %s' % (name, e))
    return out


# -- deterministic scenarios ------------------------------------------------

def build(root):
    root['oo'] = OOBTree({'k%02d' % i: 'v%d' % i for i in range(10)})
    root['big'] = IOBTree({i: 'x%d' % i for i in range(0, 400, 2)})
    root['lo'] = LOBTree({(1 << 40) + i: i for i in range(10)})
    root['oi'] = OIBTree({'k%02d' % i: i for i in range(10)})
    root['ts'] = OOTreeSet(['t%02d' % i for i in range(10)])
    root['set'] = OOSet(['s%02d' % i for i in range(10)])
    root['len'] = Length(10)
    root['ctr'] = Counter()
    root['pm'] = PersistentMapping(a=1)
    root['pm2'] = PersistentMapping(b=1)
    root['lens'] = PersistentList(Length(i) for i in range(100))
    root['trees'] = PersistentList(OOBTree({'k%d' % j: j for j in range(5)}) for i in range(100))
    cat = root['cat'] = OOBTree()
    for w in ('alpha', 'beta', 'gamma'):
        cat[w] = IITreeSet(range(5))


def _set(k, v):
    def f(r):
        r['oo'][k] = v
    return f


def _many(*fs):
    def f(r, c=None):
        for g in fs:
            if g.__code__.co_argcount == 2:
                g(r, c)
            else:
                g(r)
    return f


def _readcurrent(key):
    def f(r, c):
        c.readCurrent(r[key])
    return f


def _split_big_low(r):
    for i in range(1, 200, 2):
        r['big'][i] = 'a%d' % i


SCENARIOS = {
    # one inline bucket (an OOBTree of 10 keys)
    'oo_insert_distinct': (_set('a', 1), _set('z', 2)),
    'oo_insert_same_key': (_set('m', 1), _set('m', 1)),
    'oo_change_same_key_differently': (_set('k03', 'x'), _set('k03', 'y')),
    'oo_change_same_key_same_value': (_set('k03', 'x'), _set('k03', 'x')),
    'oo_change_distinct_keys': (_set('k03', 'x'), _set('k07', 'y')),
    'oo_delete_first_key': (lambda r: r['oo'].__delitem__('k00'), _set('k05', 'y')),
    'oo_delete_first_key_new': (_set('k05', 'y'), lambda r: r['oo'].__delitem__('k00')),
    'oo_delete_same_key': (lambda r: r['oo'].__delitem__('k03'), lambda r: r['oo'].__delitem__('k03')),
    'oo_delete_distinct_keys': (lambda r: r['oo'].__delitem__('k03'), lambda r: r['oo'].__delitem__('k06')),
    'oo_delete_vs_change': (lambda r: r['oo'].__delitem__('k03'), _set('k03', 'y')),
    'oo_change_vs_delete': (_set('k03', 'y'), lambda r: r['oo'].__delitem__('k03')),
    'oo_delete_readd_other_value': (_set('k03', 'x'), lambda r: (r['oo'].__delitem__('k03'), r['oo'].__setitem__('k03', 'y'))),
    'oo_delete_readd_same_value': (_set('k04', 'q'), lambda r: (r['oo'].__delitem__('k03'), r['oo'].__setitem__('k03', 'v3'))),
    'oo_delete_tail_both': (lambda r: [r['oo'].__delitem__('k%02d' % i) for i in (7, 8, 9)],
                            lambda r: [r['oo'].__delitem__('k%02d' % i) for i in (8, 9)]),
    'oo_empty_vs_insert': (lambda r: r['oo'].clear(), _set('zz', 1)),
    'oo_all_deleted_between': (lambda r: [r['oo'].__delitem__('k%02d' % i) for i in range(1, 5)],
                               lambda r: [r['oo'].__delitem__('k%02d' % i) for i in range(5, 10)]),
    'oo_split_vs_insert': (lambda r: [r['oo'].__setitem__('n%03d' % i, i) for i in range(60)], _set('a', 1)),
    # a multi-bucket IOBTree: buckets, splits, readCurrent of the tree
    'big_same_bucket_distinct': (lambda r: r['big'].__setitem__(101, 'a'), lambda r: r['big'].__setitem__(103, 'b')),
    'big_same_bucket_same_key': (lambda r: r['big'].__setitem__(101, 'a'), lambda r: r['big'].__setitem__(101, 'a')),
    'big_split_vs_insert_same_bucket': (_split_big_low, lambda r: r['big'].__setitem__(3, 'b')),
    'big_split_vs_insert_other_bucket': (_split_big_low, lambda r: r['big'].__setitem__(397, 'b')),
    'big_delete_range_vs_insert': (lambda r: [r['big'].__delitem__(i) for i in range(0, 200, 2)],
                                   lambda r: r['big'].__setitem__(397, 'b')),
    # other families and sets
    'lo_insert_distinct': (lambda r: r['lo'].__setitem__(1, 1), lambda r: r['lo'].__setitem__(1 << 62, 2)),
    'oi_change_distinct': (lambda r: r['oi'].__setitem__('k01', 100), lambda r: r['oi'].__setitem__('k02', 200)),
    'oi_change_same': (lambda r: r['oi'].__setitem__('k01', 100), lambda r: r['oi'].__setitem__('k01', 200)),
    'ts_insert_distinct': (lambda r: r['ts'].add('a'), lambda r: r['ts'].add('z')),
    'ts_insert_same': (lambda r: r['ts'].add('m'), lambda r: r['ts'].add('m')),
    'ts_remove_distinct': (lambda r: r['ts'].remove('t03'), lambda r: r['ts'].remove('t05')),
    'set_insert_distinct': (lambda r: r['set'].add('a'), lambda r: r['set'].add('z')),
    'set_remove_same': (lambda r: r['set'].remove('s03'), lambda r: r['set'].remove('s03')),
    # Length, Counter (Python resolution), unresolvable objects
    'len_change': (lambda r: r['len'].change(1), lambda r: r['len'].change(5)),
    'len_set': (lambda r: r['len'].change(1), lambda r: r['len'].set(100)),
    'len_bigint': (lambda r: r['len'].change(1 << 70), lambda r: r['len'].change(-3)),
    'ctr_inc': (lambda r: r['ctr'].inc(), lambda r: r['ctr'].inc(3)),
    'pm_both': (lambda r: r['pm'].__setitem__('a', 2), lambda r: r['pm'].__setitem__('a', 3)),
    # several conflicts in one transaction: which one is reported
    'pm_then_tree_refused': (_many(lambda r: r['pm'].__setitem__('a', 2), _set('k03', 'x')),
                             _many(lambda r: r['pm'].__setitem__('a', 3), _set('k03', 'y'))),
    'pm_then_pm2': (_many(lambda r: r['pm'].__setitem__('a', 2), lambda r: r['pm2'].__setitem__('b', 2)),
                    _many(lambda r: r['pm'].__setitem__('a', 3), lambda r: r['pm2'].__setitem__('b', 3))),
    'ctr_then_tree_refused': (_many(lambda r: r['ctr'].inc(), _set('k03', 'x')),
                              _many(lambda r: r['ctr'].inc(), _set('k03', 'y'))),
    'tree_resolved_then_pm': (_many(_set('a', 1), lambda r: r['pm'].__setitem__('a', 2)),
                              _many(_set('z', 1), lambda r: r['pm'].__setitem__('a', 3))),
    'tree_and_ctr_resolved': (_many(_set('a', 1), lambda r: r['ctr'].inc(), lambda r: r['len'].change(1)),
                              _many(lambda r: r['ctr'].inc(3), _set('z', 1), lambda r: r['len'].change(2))),
    'ctr_and_pm2_new_then_tree': (_many(lambda r: r['ctr'].inc(), _set('a', 1)),
                                  _many(lambda r: r['ctr'].inc(3), lambda r: r['pm2'].__setitem__('n', PersistentMapping(x=1)),
                                        _set('z', 1))),
    # many objects resolved in one vote (past 64: the server's sets)
    'many_lengths': (lambda r: [x.change(1) for x in r['lens']], lambda r: [x.change(2) for x in r['lens']]),
    'many_trees': (lambda r: [t.__setitem__('a', 1) for t in r['trees']], lambda r: [t.__setitem__('z', 1) for t in r['trees']]),
    'many_trees_last_refused': (lambda r: [t.__setitem__('a', i) for i, t in enumerate(r['trees'])],
                                lambda r: [t.__setitem__('z' if i < 99 else 'a', 1) for i, t in enumerate(r['trees'])]),
    'many_lengths_and_ctr': (_many(lambda r: [x.change(1) for x in r['lens']], lambda r: r['ctr'].inc()),
                             _many(lambda r: [x.change(2) for x in r['lens']], lambda r: r['ctr'].inc())),
    # readCurrent
    'readcurrent_stale': (lambda r: r['pm'].__setitem__('a', 2),
                          _many(_readcurrent('pm'), _set('zz', 1))),
    'readcurrent_stale_with_ctr': (_many(lambda r: r['pm'].__setitem__('a', 2), lambda r: r['ctr'].inc()),
                                   _many(_readcurrent('pm'), lambda r: r['ctr'].inc())),
    'readcurrent_stale_with_tree_resolved': (_many(lambda r: r['pm'].__setitem__('a', 2), _set('a', 1)),
                                             _many(_readcurrent('pm'), _set('z', 1))),
    'readcurrent_stale_with_pm2': (_many(lambda r: r['pm'].__setitem__('a', 2), lambda r: r['pm2'].__setitem__('b', 2)),
                                   _many(_readcurrent('pm'), lambda r: r['pm2'].__setitem__('b', 3))),
    'readcurrent_only_stale': (lambda r: r['pm'].__setitem__('a', 2), _readcurrent('pm')),
    'readcurrent_only_current': (lambda r: r['pm2'].__setitem__('b', 2), _readcurrent('pm')),
    'readcurrent_bucket_of_big_tree': (lambda r: r['big'].__setitem__(101, 'a'),
                                       _many(lambda r, c: c.readCurrent(r['big']), lambda r: r['big'].__setitem__(397, 'b'))),
    'readcurrent_current': (lambda r: r['pm2'].__setitem__('b', 2),
                            _many(_readcurrent('pm'), _set('zz', 1))),
    'readcurrent_of_modified': (lambda r: r['pm'].__setitem__('a', 2),
                                _many(_readcurrent('pm'), lambda r: r['pm'].__setitem__('x', 1))),
    # a catalog: an OOBTree of IITreeSets
    # A commits twice, or packs, before B's conflicting commit
    'twice_len': ((lambda r: r['len'].change(1), lambda r: r['len'].change(2)), lambda r: r['len'].change(5)),
    'twice_oo': ((_set('a', 1), _set('b', 1)), _set('z', 1)),
    'twice_ctr': ((lambda r: r['ctr'].inc(), lambda r: r['ctr'].inc()), lambda r: r['ctr'].inc(3)),
    'pack_len': ((lambda r: r['len'].change(1), 'pack'), lambda r: r['len'].change(5)),
    'pack_oo': ((_set('a', 1), 'pack'), _set('z', 1)),
    'pack_ctr': ((lambda r: r['ctr'].inc(), 'pack'), lambda r: r['ctr'].inc(3)),
    # three clients: C's conflict meets B's resolved record
    'three_oo': (_set('a', 1), _set('z', 1), _set('m', 1)),
    'three_oo_c_refused': (_set('a', 1), _set('z', 1), _set('z', 2)),
    'three_len': (lambda r: r['len'].change(1), lambda r: r['len'].change(2), lambda r: r['len'].change(4)),
    'three_ctr': (lambda r: r['ctr'].inc(), lambda r: r['ctr'].inc(2), lambda r: r['ctr'].inc(4)),
    'three_cat': (lambda r: r['cat'].__setitem__('delta', IITreeSet([1])),
                  lambda r: r['cat'].__setitem__('omega', IITreeSet([2])),
                  lambda r: r['cat'].__setitem__('zeta', frozenset([3]))),
    'three_oo_python_value': (_set('a', 1), _set('z', 1), _set('m', frozenset([3]))),
    # savepoints; a transaction past the server's 8 MiB in memory
    'savepoint_oo': (_set('a', 1), _many(_set('z', 1), lambda r, c: c.transaction_manager.get().savepoint() and None, _set('y', 2))),
    'big_txn_tree_resolved': (_set('a', 1), _many(lambda r: r['pm2'].__setitem__('big', 'x' * (9 << 20)), _set('z', 1))),
    'big_txn_ctr_client_resolved': (_many(lambda r: r['ctr'].inc(), _set('a', 1)),
                                    _many(lambda r: r['pm2'].__setitem__('big', 'y' * (9 << 20)),
                                          lambda r: r['ctr'].inc(2), _set('z', 1))),
    # a catalog word deleted and re-added (a new TreeSet under the same key)
    'cat_readd_word_vs_docid': (lambda r: r['cat']['beta'].add(9),
                                lambda r: (r['cat'].__delitem__('beta'), r['cat'].__setitem__('beta', IITreeSet([7])))),
    'cat_readd_word_both': (lambda r: (r['cat'].__delitem__('beta'), r['cat'].__setitem__('beta', IITreeSet([8]))),
                            lambda r: (r['cat'].__delitem__('beta'), r['cat'].__setitem__('beta', IITreeSet([7])))),
    'cat_readd_word_vs_other_word': (lambda r: r['cat'].__setitem__('omega', IITreeSet([1])),
                                     lambda r: (r['cat'].__delitem__('beta'), r['cat'].__setitem__('beta', IITreeSet([7])))),
    'cat_add_docids_same_set': (lambda r: r['cat']['alpha'].add(100), lambda r: r['cat']['alpha'].add(200)),
    'cat_new_words_distinct': (lambda r: r['cat'].__setitem__('delta', IITreeSet([1])),
                               lambda r: r['cat'].__setitem__('omega', IITreeSet([2]))),
    'cat_new_word_same': (lambda r: r['cat'].__setitem__('delta', IITreeSet([1])),
                          lambda r: r['cat'].__setitem__('delta', IITreeSet([2]))),
    'cat_replace_set_vs_new_word': (lambda r: r['cat'].__setitem__('alpha', IITreeSet([9])),
                                    lambda r: r['cat'].__setitem__('omega', IITreeSet([2]))),
    'cat_delete_word_vs_new_word': (lambda r: r['cat'].__delitem__('beta'),
                                    lambda r: r['cat'].__setitem__('omega', IITreeSet([2]))),
}


def run_scenario(addr, name):
    """Run SCENARIOS[name] on a fresh database at addr; return the report.

    A scenario is (a, b, c...): client A commits a (a function of the
    scenario's root, or of the root and the connection; a tuple: one
    commit each, 'pack' packs), then clients B, C... that all began their
    transaction (their snapshot) before A, commit b, c... in turn."""
    a_fn, late = SCENARIOS[name][0], SCENARIOS[name][1:]
    dba = ZEO.DB(addr, wait_timeout=30)
    dbs = [ZEO.DB(addr, wait_timeout=30) for _ in late]
    try:
        tma = transaction.TransactionManager()
        ca = dba.open(tma)
        ca.root()[name] = PersistentMapping()
        build(ca.root()[name])
        tma.get().note('setup')
        tma.commit()
        tids = {u64(dba.lastTransaction()): 'setup'}
        oids = {}
        ra = ca.root()[name]
        for k, v in ra.items():
            oids[u64(v._p_oid)] = k
            if k == 'cat':
                for kk, vv in v.items():
                    oids[u64(vv._p_oid)] = 'cat/' + kk
        oids[u64(ra._p_oid)] = 'root'

        clients = []
        for db in dbs:
            wait_tid(db, dba.lastTransaction())
            tm = transaction.TransactionManager()
            c = db.open(tm)
            tm.begin()
            r = c.root()[name]  # the snapshot: loads happen at setup's tid
            for v in r.values():  # reads everything now
                v._p_activate()
                if hasattr(v, 'items'):
                    list(v.items())
            # a second connection of the same client, its cache filled
            tm2 = transaction.TransactionManager()
            c2 = db.open(tm2)
            for v in c2.root()[name].values():
                v._p_activate()
                if hasattr(v, 'items'):
                    list(v.items())
            tm2.abort()
            clients.append((db, tm, c, r, tm2, c2))

        for j, fn in enumerate(a_fn if isinstance(a_fn, tuple) else (a_fn,)):
            if fn == 'pack':
                time.sleep(0.02)
                dba.pack()
                continue
            tma.begin()
            call(fn, ca.root()[name], ca)
            tma.commit()
            tids[u64(dba.lastTransaction())] = 'A' if j == 0 else 'A%d' % j

        outcomes = []
        for (db, tm, c, r, _, _), fn, label in zip(clients, late, 'BCDEF'):
            call(fn, r, c)
            try:
                tm.commit()
                outcomes.append(['committed'])
                tids[u64(db.lastTransaction())] = label
            except Exception as e:
                tm.abort()
                outcomes.append(describe(e, tids, oids))
        # the final state, seen by a new client and by all the others
        dbc = ZEO.DB(addr, wait_timeout=30)
        try:
            cc = dbc.open()
            final = {k: dump(v) for k, v in sorted(cc.root()[name].items())}
            problems = check_trees(cc.root()[name])
        finally:
            dbc.close()
        last = max([dba.lastTransaction()] + [db.lastTransaction() for db in dbs])
        views = {}
        for nm, db, tm, c in ([('A', dba, tma, ca)] + [(l, x[0], x[1], x[2]) for l, x in zip('BCDEF', clients)]
                              + [(l + "'", x[0], x[4], x[5]) for l, x in zip('BCDEF', clients)]):
            wait_tid(db, last)
            tm.begin()
            view = {k: dump(v) for k, v in sorted(c.root()[name].items())}
            if view != final:
                views[nm] = 'incoherent: ' + json.dumps(diff(view, final))
            tm.abort()
        return {'outcome': outcomes[0] if len(outcomes) == 1 else outcomes,
                'final': final, 'problems': problems, 'views': views}
    finally:
        dba.close()
        for db in dbs:
            db.close()


def wait_tid(db, tid, timeout=30):
    """Wait until db's client has heard of transaction tid."""
    deadline = time.time() + timeout
    while db.lastTransaction() < tid:
        if time.time() > deadline:
            raise AssertionError('client never heard of tid %s' % u64(tid))
        time.sleep(0.01)


def diff(a, b):
    return {k: [a.get(k), b.get(k)] for k in set(a) | set(b) if a.get(k) != b.get(k)}


def call(fn, root, conn):
    if fn.__code__.co_argcount == 2:
        fn(root, conn)
    else:
        fn(root)


def describe(e, tids, oids):
    """An exception as JSON-able data: its class, and for a ConflictError
    its oid, serials and class_name with tids and oids named."""
    out = [type(e).__module__ + '.' + type(e).__name__]
    if isinstance(e, ConflictError):
        oid = getattr(e, 'oid', None)
        out.append(oids.get(u64(oid), u64(oid)) if oid else None)
        serials = getattr(e, 'serials', None)
        out.append([tids.get(u64(s), 'tid?') for s in serials] if serials else None)
        out.append(getattr(e, 'class_name', None))
        out.append(getattr(e, 'message', None))
        out.append(sorted(k for k in vars(e) if k not in ('data',)))
    else:
        out.append(str(e))
    return out


# -- random multi-process contention ---------------------------------------

NKEYS = 600
HOT = int(os.environ.get('AUDITC_HOT', '0'))  # a smaller key range: more conflicts


def random_setup(addr):
    db = ZEO.DB(addr, wait_timeout=30)
    try:
        with db.transaction() as c:
            r = c.root()
            r['io'] = IOBTree()
            r['oo'] = OOBTree()
            r['lo'] = LOBTree()
            r['ts'] = OOTreeSet()
            r['set'] = OOSet()
            r['cat'] = OOBTree()
            for n in ('io', 'oo', 'lo', 'ts', 'set'):
                r['n_' + n] = Length()
            r['ctr'] = Counter()
            r['len'] = Length()
            r['guard'] = PersistentMapping(v=0)
    finally:
        db.close()


def random_op(rng, r, conn, p):
    """One random change; returns its description for the model."""
    ops = []
    n = rng.randint(1, 4)
    for _ in range(n):
        x = rng.random()
        if x < 0.45:
            name = rng.choice(['io', 'oo', 'lo', 'ts', 'set'])
            t = r[name]
            hot = HOT
            if name == 'set':
                k = 's%03d' % rng.randrange(60)
            elif name == 'io':
                k = rng.randrange(hot or 200)
            elif name == 'lo':
                k = (1 << 40) + rng.randrange(hot or 300)
            else:
                k = 'k%04d' % rng.randrange(hot or NKEYS)
            if rng.random() < 0.35 and k in t:
                t.remove(k) if name in ('ts', 'set') else t.__delitem__(k)
                r['n_' + name].change(-1)
                ops.append(['del', name, k])
            elif k not in t:
                if name in ('ts', 'set'):
                    t.add(k)
                else:
                    t[k] = p
                r['n_' + name].change(1)
                ops.append(['add', name, k])
        elif x < 0.6:
            w = 'w%02d' % rng.randrange(12)
            cat = r['cat']
            if w not in cat:
                cat[w] = IITreeSet()
                ops.append(['word', w])
            d = rng.randrange(200)
            if d not in cat[w]:
                cat[w].add(d)
                ops.append(['doc', w, d])
            elif rng.random() < 0.5:  # unindex
                cat[w].remove(d)
                ops.append(['undoc', w, d])
        elif x < 0.8:
            r['ctr'].inc()
            ops.append(['ctr'])
        elif x < 0.92:
            r['len'].change(1)
            ops.append(['len'])
        elif x < 0.96:
            v = r['guard']['v']  # (readCurrent of a ghost is a no-op in ZODB)
            conn.readCurrent(r['guard'])
            ops.append(['readcurrent', v])
        else:
            g = r['guard']
            ops.append(['guard', g['v']])
            g['v'] += 1
    return ops


def random_view(conn):
    """What a client sees of the random workload's objects."""
    r = conn.root()
    out = {}
    for n in ('io', 'oo', 'lo', 'ts', 'set'):
        out[n] = sorted(r[n].keys())
        out['n_' + n] = r['n_' + n]()
    out['cat'] = {w: sorted(v.keys()) for w, v in r['cat'].items()}
    out['ctr'] = r['ctr'].value
    out['len'] = r['len']()
    out['guard'] = r['guard']['v']
    return out


_finished = []


def _record_finish():
    """Record the tid each tpc_finish of this process's ClientStorages
    returns (the tid of the commit, as acknowledged)."""
    import ZEO.ClientStorage
    orig = ZEO.ClientStorage.ClientStorage.tpc_finish
    if getattr(orig, 'audited', False):
        return

    def tpc_finish(self, *a, **kw):
        tid = orig(self, *a, **kw)
        _finished.append(tid)
        return tid
    tpc_finish.audited = True
    ZEO.ClientStorage.ClientStorage.tpc_finish = tpc_finish


def safe_abort(tm):
    try:
        tm.abort()
    except Exception:
        pass


def random_worker(addr, p, seed, n, deadline, sync_dir=None):
    import faulthandler
    import signal
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    _record_finish()
    rng = random.Random(seed * 1000 + p)
    kw = {}
    if os.environ.get('AUDITC_CACHE'):  # a persistent client cache
        kw = dict(client='p%d' % p, var=os.environ['AUDITC_CACHE'], cache_size=1 << 20)
    db = ZEO.DB(tuple(addr) if isinstance(addr, list) else addr, wait_timeout=60, **kw)
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    log, conflicts, errors, disconnects = [], 0, [], 0
    kinds = {}
    i = 0
    while i < n and time.time() < deadline:
        state = rng.getstate()
        ops, committing = None, False
        try:
            tm.begin()
            ops = random_op(rng, conn.root(), conn, p)
            tm.get().note('p%d-%d' % (p, i))
            del _finished[:]
            committing = True
            tm.commit()
            assert len(_finished) <= 1, _finished
            if _finished:  # (else nothing was written: no transaction)
                log.append([u64(_finished[0]), ops, p, i])
            i += 1
        except ConflictError as e:
            safe_abort(tm)
            conflicts += 1
            kind = '%s %s' % (type(e).__name__, getattr(e, 'class_name', None))
            kinds[kind] = kinds.get(kind, 0) + 1
            rng.setstate(state)
            rng.random()  # a different plan on retry
        except Exception as e:
            safe_abort(tm)
            if not isinstance(e, ClientDisconnected):
                errors.append(repr(e))
                if len(errors) > 5:
                    break
            else:
                disconnects += 1
                time.sleep(0.2)
            if committing:
                # the commit's fate is unknown: looked up by its note later
                log.append([None, ops, p, i])
                i += 1
    report = {'p': p, 'log': log, 'conflicts': conflicts, 'errors': errors, 'disconnects': disconnects,
              'conflict_kinds': kinds}
    if sync_dir:
        # Tell the parent we are done, wait for the last tid of the run,
        # then report what this client sees once it has heard of it.
        with open(os.path.join(sync_dir, 'log-%d.json' % p), 'w') as f:
            json.dump(report, f)
        fin = os.path.join(sync_dir, 'final')
        while not os.path.exists(fin):
            time.sleep(0.05)
        with open(fin) as f:
            last = bytes.fromhex(f.read().strip())
        try:
            wait_tid(db, last, timeout=60)
            tm.begin()
            report['view'] = random_view(conn)
            tm.abort()
        except Exception as e:
            report['view'] = repr(e)
    db.close()
    return report


def random_model(logs, txns):
    """Replay the successful commits (txns: (tid, note) in file order) on
    a model; return (model, problems)."""
    byid = {}
    problems = []
    for rep in logs:
        for tid, ops, p, i in rep['log']:
            byid['p%d-%d' % (p, i)] = (tid, ops)
    seen = set()
    m = {n: set() for n in ('io', 'oo', 'lo', 'ts', 'set')}
    cat, ctr, ln, guard = {}, 0, 0, 0
    for tid, note in txns:
        if not note.startswith('p'):
            continue
        if note in seen:
            problems.append('transaction %s committed twice' % note)
        seen.add(note)
        if note not in byid:
            problems.append('committed transaction %s not in any log' % note)
            continue
        logged_tid, ops = byid[note]
        if logged_tid is not None and logged_tid != tid:
            problems.append('%s acknowledged as tid %x, stored as %x' % (note, logged_tid, tid))
        for op in ops:
            if op[0] == 'add':
                k = op[2]
                if k in m[op[1]]:
                    problems.append('%s: add of %s %r already there' % (note, op[1], k))
                m[op[1]].add(k)
            elif op[0] == 'del':
                if op[2] not in m[op[1]]:
                    problems.append('%s: del of %s %r not there' % (note, op[1], op[2]))
                m[op[1]].discard(op[2])
            elif op[0] == 'word':
                if op[1] in cat:
                    problems.append('%s: word %s created twice' % (note, op[1]))
                cat[op[1]] = set()
            elif op[0] == 'undoc':
                if op[2] not in cat.get(op[1], ()):
                    problems.append('%s: doc %s removed from %s, not there' % (note, op[2], op[1]))
                cat.get(op[1], set()).discard(op[2])
            elif op[0] == 'doc':
                cat.setdefault(op[1], set())
                if op[2] in cat[op[1]]:
                    problems.append('%s: doc %s added twice to %s' % (note, op[2], op[1]))
                cat[op[1]].add(op[2])
            elif op[0] in ('readcurrent', 'guard'):
                if op[1] != guard:
                    problems.append('%s: %s read guard %s, committed after it became %s'
                                    % (note, op[0], op[1], guard))
                if op[0] == 'guard':
                    guard += 1
            elif op[0] == 'ctr':
                ctr += 1
            elif op[0] == 'len':
                ln += 1
    for note, (tid, ops) in byid.items():
        if tid is not None and note not in seen:
            problems.append('acknowledged commit %s (tid %x) lost' % (note, tid))
    model = {n: sorted(v) for n, v in m.items()}
    for n in m:
        model['n_' + n] = len(m[n])
    model['cat'] = {w: sorted(v) for w, v in cat.items()}
    model['ctr'] = ctr
    model['len'] = ln
    model['guard'] = guard
    return model, problems


# -- a client slow in its _p_resolveConflict --------------------------------

import persistent  # noqa: E402


class SlowCounter(persistent.Persistent):
    """A counter resolved by Python; with $AUDITC_SLOW_RESOLVE set (only in
    the client process that is to be slow), its resolution writes the file
    it names, then takes 30 s (a client paused, swapping, in a long GC)."""

    value = 0

    def _p_resolveConflict(self, old, committed, new):
        marker = os.environ.get('AUDITC_SLOW_RESOLVE')
        if marker:
            with open(marker, 'w') as f:
                f.write('resolving')
            time.sleep(30)
        state = dict(committed)
        state['value'] = committed.get('value', 0) + new.get('value', 0) - old.get('value', 0)
        return state


def slow_client(addr):
    """Client B: snapshot, wait for 'go' on stdin, bump 'slow', commit."""
    db = ZEO.DB(addr, wait_timeout=30)
    tm = transaction.TransactionManager()
    c = db.open(tm)
    tm.begin()
    c.root()['slow']._p_activate()
    print('ready', flush=True)
    sys.stdin.readline()
    c.root()['slow'].value += 1
    tm.commit()
    print('committed', flush=True)
    db.close()


if __name__ == '__main__':
    if sys.argv[1] == 'random':
        host, port = sys.argv[2].rsplit(':', 1)
        addr = (host, int(port))
        p, seed, n = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        dl = time.time() + float(sys.argv[6])
        sync_dir = sys.argv[7] if len(sys.argv) > 7 else None
        print(json.dumps(random_worker(addr, p, seed, n, dl, sync_dir)))
    elif sys.argv[1] == 'slow':
        host, port = sys.argv[2].rsplit(':', 1)
        slow_client((host, int(port)))
    elif sys.argv[1] == 'scenario':
        host, port = sys.argv[2].rsplit(':', 1)
        print(json.dumps(run_scenario((host, int(port)), sys.argv[3])))
