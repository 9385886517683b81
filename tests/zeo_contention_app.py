"""The application side of the contention tests and benchmark: workloads of
many client processes committing to the same objects through the stock
ZEO.ClientStorage and ZODB.DB, retrying on ConflictError as
transaction.manager.attempts() does.

Used by tests/test_zeo_contention.py and bench/zeo_contention.py. Each
client is a separate process (run_clients: forked by a multiprocessing
forkserver that imported ZODB and ZEO once); they connect, then all start
committing at once, and each reports what it saw. The classes must be
importable as `zeo_contention_app.X` by the clients and by runzeo, which
resolves conflicts on the server: run with this directory on sys.path
(PYTHONPATH).

Workloads (WORKLOADS):

- length   every commit does BTrees.Length.Length.change(1) on one shared
           Length: resolvable conflicts on every concurrent commit.
- catalog  an application's catalog: three trees (two OOBTrees, one
           OIBTree), a Length beside each counting its keys, and one
           small "document" object per process. Every commit inserts a
           distinct key into each tree and bumps its Length; some commits
           also set or delete one of a few shared keys (a set or delete of
           the same key by two transactions is a real conflict). Resolvable
           conflicts (Length, buckets) and unresolvable ones (same key,
           bucket splits) both happen.
- counter  a Counter (defined here, _p_resolveConflict in Python only):
           zodbd cannot resolve it on the server, so the client does.

With cfg['blob_dir'] (the catalog; the clients' blob caches go under it),
every catalog commit also stores a new Blob of blob_data(p, i) in its
document.

A client reports, for its fixed number of commits or its duration: the
successful commits (and for the catalog, each one's tid and what it did, so
that the final trees can be recomputed in commit order), the ConflictErrors
that reached the application (each one a retry), every other exception
(with its traceback), the errors logged by conflict resolution (ZODB logs
and hides, as a ConflictError, e.g. a POSKeyError of loadSerial), the
calls to the client's tryToResolveConflict, the objects whose conflicts
were resolved in successful votes (by the server or the client), and the
latency of each
successful commit (from its first attempt, and of its last tm.commit()).
"""
import logging
import os
import random
import sys
import time
import traceback

import persistent
import transaction
from BTrees.Length import Length
from BTrees.OIBTree import OIBTree
from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping
from ZEO.Exceptions import ClientDisconnected
from ZODB.POSException import ConflictError

WORKLOADS = ('length', 'catalog', 'counter')

# The catalog's trees: name -> class. Each has a Length 'n_' + name.
TREES = {'title': OOBTree, 'date': OIBTree, 'path': OOBTree}
SHARED_KEYS = ['shared-%02d' % i for i in range(8)]


class Counter(persistent.Persistent):
    """A counter whose conflicts only Python can resolve."""

    def __init__(self):
        self.value = 0

    def inc(self, n=1):
        self.value += n

    def _p_resolveConflict(self, old, committed, new):
        state = dict(committed)
        state['value'] = committed['value'] + new['value'] - old['value']
        return state


def tree_value(tree, p, i):
    """The value process p's commit i writes into tree."""
    if tree == 'date':
        return p * 1000000 + i
    return 'v%d.%d' % (p, i)


def setup(root, workload, nprocs):
    """Create the workload's objects in root (to be committed)."""
    if workload == 'length':
        root['len'] = Length()
    elif workload == 'counter':
        root['counter'] = Counter()
    elif workload == 'catalog':
        for name, cls in TREES.items():
            t = root['t_' + name] = cls()
            for k in SHARED_KEYS:
                t[k] = tree_value(name, 0, 0)
            root['n_' + name] = Length(len(SHARED_KEYS))
        for p in range(nprocs):
            root['doc-%d' % p] = PersistentMapping(i=-1)
    else:
        raise ValueError('unknown workload %r' % workload)


def catalog_plan(rng):
    """The shared-key operation of one catalog commit: None or
    (op, tree, key), op being 'set' or 'del'."""
    r = rng.random()
    if r >= 0.3:
        return None
    return ('del' if r < 0.08 else 'set', rng.choice(list(TREES)), rng.choice(SHARED_KEYS))


def catalog_apply(root, p, i, plan, run=0):
    """Do catalog commit i of process p in root; return its operations as
    a list of [op, tree, key, value]. The keys it inserts are distinct for
    each (run, p, i)."""
    ops = []
    key = 'p%02d-%d-%07d' % (p, run, i)
    for name in TREES:
        root['t_' + name][key] = tree_value(name, p, i)
        root['n_' + name].change(1)
        ops.append(['set', name, key, tree_value(name, p, i)])
    if plan is not None:
        op, name, k = plan
        t, n = root['t_' + name], root['n_' + name]
        present = k in t
        if op == 'set':
            if not present:
                n.change(1)
            t[k] = tree_value(name, p, i)
            ops.append(['set', name, k, tree_value(name, p, i)])
        elif present:
            del t[k]
            n.change(-1)
            ops.append(['del', name, k, None])
    root['doc-%d' % p]['i'] = i  # only p writes it: its serial is the tid
    return ops


def catalog_model(nprocs, commits):
    """The catalog trees as dicts after commits, a list of (tid, ops) in
    any order: each commit's operations replayed in tid order. Returns
    (model, anomalies): a delete of an absent key is an anomaly (that
    commit read a state that is not the one it committed on)."""
    model = {name: {k: tree_value(name, 0, 0) for k in SHARED_KEYS} for name in TREES}
    anomalies = []
    for tid, ops in sorted(commits):
        for op, name, key, value in ops:
            if op == 'set':
                model[name][key] = value
            elif model[name].pop(key, None) is None:
                anomalies.append('tid %s deleted %s[%r], absent' % (tid, name, key))
    return model, anomalies


def problems(root, workload, reports):
    """What is wrong with a run, as a list of lines (empty when nothing
    is): exceptions other than ConflictError that reached the
    application, conflict resolution that failed with an error (logged by
    ZODB and turned into a ConflictError: a POSKeyError of loadSerial is
    one), any other error a client logged, commits given up after too many conflicts, and a final state in
    root that is not exactly that of the successful commits."""
    out = []
    for r in reports:
        for e in r['errors']:
            out.append('client %d, commit %d, attempt %d: %s\n%s'
                       % (r['proc'], e['commit'], e['attempt'], e['repr'], e['traceback']))
        for e in r['resolution_errors']:
            out.append('client %d: conflict resolution: %s: %s %s'
                       % (r['proc'], e['level'], e['msg'], e['exc']))
        for e in r.get('logged', ()):
            if e['level'] in ('ERROR', 'CRITICAL'):
                out.append('client %d: logged %s (%s): %s %s'
                           % (r['proc'], e['level'], e['logger'], e['msg'], e['exc']))
        if r['gaveup']:
            out.append('client %d gave up %d commits after too many ConflictErrors'
                       % (r['proc'], r['gaveup']))
    ok = sum(r['ok'] for r in reports)
    if workload == 'length':
        if root['len']() != ok:
            out.append('Length is %d, %d successful increments' % (root['len'](), ok))
    elif workload == 'counter':
        if root['counter'].value != ok:
            out.append('Counter is %d, %d successful increments' % (root['counter'].value, ok))
    else:
        from BTrees.check import check
        commits = [tuple(c) for r in reports for c in r['log']]
        tids = [tid for tid, _ in commits]
        if len(set(tids)) != len(tids):
            out.append('%d successful commits have only %d distinct tids' % (len(tids), len(set(tids))))
        model, anomalies = catalog_model(len(reports), commits)
        out.extend(anomalies)
        for name in TREES:
            t, n = root['t_' + name], root['n_' + name]
            try:
                t._check()
                check(t)
            except AssertionError as e:
                out.append('tree %s is corrupt: %s' % (name, e))
            got, want = dict(t.items()), model[name]
            if got != want:
                missing = sorted(set(want) - set(got))
                extra = sorted(set(got) - set(want))
                wrong = sorted(k for k in set(got) & set(want) if got[k] != want[k])
                out.append('tree %s: %d keys, the commits make %d: missing %s, extra %s, wrong values %s'
                           % (name, len(got), len(want), missing[:10], extra[:10], wrong[:10]))
            if n() != len(t):
                out.append('Length n_%s is %d, tree %s has %d keys' % (name, n(), name, len(t)))
    return out


class _LogCapture(logging.Handler):
    def __init__(self):
        logging.Handler.__init__(self, logging.WARNING)
        self.records = []

    def emit(self, record):
        exc = ''
        if record.exc_info and record.exc_info[0] is not None:
            exc = '%s: %s' % (record.exc_info[0].__name__, record.exc_info[1])
        self.records.append({'logger': record.name, 'level': record.levelname,
                             'msg': record.getMessage(), 'exc': exc})


def open_db(cfg):
    """A ZEO.DB on cfg['addr'] (with TLS, and a client blob cache under
    cfg['blob_dir'], as cfg says)."""
    import ZEO
    kw = {}
    if cfg.get('ssl'):
        from ZEO.tests import testssl
        kw['ssl'] = testssl.client_ssl()
    if cfg.get('blob_dir'):
        kw['blob_dir'] = os.path.join(cfg['blob_dir'], 'client-%s' % cfg.get('proc', 'setup'))
    return ZEO.DB(tuple(cfg['addr']), wait_timeout=30, **kw)


def blob_data(p, i):
    """The blob catalog commit i of process p stores (with
    cfg['blob_dir']): 30 kB that say which."""
    return b'%d.%d ' % (p, i) * (30000 // len(b'%d.%d ' % (p, i)))


def run_setup(cfg):
    """Connect and create the workload's objects."""
    db = open_db(cfg)
    try:
        tm = transaction.TransactionManager()
        conn = db.open(tm)
        setup(conn.root(), cfg['workload'], cfg['nprocs'])
        tm.commit()
    finally:
        db.close()


def worker(cfg, ready=None, wait_go=None):
    """One client: commit cfg['commits'] times (or for cfg['duration']
    seconds, or until the file cfg['stop_file'] exists), return the report
    (a dict, see the module's doc). With cfg['restarts'] (the catalog
    workload only), a ClientDisconnected is the server being killed and
    restarted: the client finds out whether the commit it cut is in the
    database (counted as done, in 'unknown_committed') or tries it again;
    'disconnects' counts them."""
    from ZEO.ClientStorage import ClientStorage
    capture = _LogCapture()
    logging.getLogger().addHandler(capture)
    if cfg.get('restarts'):
        # A client that cannot reconnect hangs (the stock client waits for
        # a server it accepts): what it logs must reach the test's output.
        loud = logging.StreamHandler(sys.stderr)
        loud.setLevel(logging.CRITICAL)
        logging.getLogger().addHandler(loud)
    resolves, resolved = [0], [0]
    orig, orig_vote = ClientStorage.tryToResolveConflict, ClientStorage.tpc_vote

    def counting(self, *a, **kw):
        resolves[0] += 1
        return orig(self, *a, **kw)

    def vote(self, *a, **kw):
        # The oids whose conflicts were resolved, by the server or here.
        oids = orig_vote(self, *a, **kw)
        resolved[0] += len(oids or ())
        return oids
    ClientStorage.tryToResolveConflict = counting
    ClientStorage.tpc_vote = vote

    p, workload = cfg['proc'], cfg['workload']
    max_attempts = cfg.get('max_attempts', 1000)
    rng = random.Random(cfg.get('seed', 0) * 1000 + p)
    db = open_db(cfg)
    tm = transaction.TransactionManager()
    conn = db.open(tm)
    tm.begin()
    conn.root()  # loaded before the clock starts
    if ready:
        ready()
    if wait_go:
        wait_go()
    ok = conflicts = gaveup = 0
    errors, latencies, commit_latencies, log = [], [], [], []
    commits, duration = cfg.get('commits'), cfg.get('duration')
    stop_file, restarts = cfg.get('stop_file'), cfg.get('restarts', False)
    disconnects = unknown = 0
    t0 = time.perf_counter()
    deadline = t0 + duration if duration else None
    i = 0
    while ((i < commits) if commits is not None
           else (time.perf_counter() < deadline) if deadline is not None
           else not os.path.exists(stop_file)):
        plan = catalog_plan(rng) if workload == 'catalog' else None
        start = time.perf_counter()
        for attempt in range(max_attempts):
            try:
                tm.begin()
                root = conn.root()
                if workload == 'length':
                    root['len'].change(1)
                elif workload == 'counter':
                    root['counter'].inc()
                else:
                    ops = catalog_apply(root, p, i, plan, cfg.get('seed', 0))
                    if cfg.get('blob_dir'):
                        import ZODB.blob
                        root['doc-%d' % p]['blob'] = ZODB.blob.Blob(blob_data(p, i))
                c0 = time.perf_counter()
                tm.commit()
            except ConflictError:
                tm.abort()
                conflicts += 1
                continue
            except ClientDisconnected:
                if not restarts:
                    raise
                # The server was killed: this attempt may have committed
                # (its tpc_finish reached the server, the answer did not).
                # Only this process writes doc-p, and only commit i sets it
                # to i: what the restarted server has says which.
                disconnects += 1
                serial = committed(tm, conn, p, i)
                if serial is None:
                    continue
                unknown += 1
                ok += 1
                log.append([serial.hex(), ops])
                break
            except Exception as e:
                errors.append({'commit': i, 'attempt': attempt, 'type': type(e).__name__,
                               'repr': repr(e), 'traceback': traceback.format_exc()})
                tm.abort()
                break
            now = time.perf_counter()
            latencies.append(now - start)
            commit_latencies.append(now - c0)
            ok += 1
            if workload == 'catalog':
                if restarts:
                    # Read back, through further kills: a reconnection may
                    # have reset the connection's cache, leaving doc-p a
                    # ghost (serial 0).
                    serial = committed(tm, conn, p, i)
                    if serial is None:
                        errors.append({'commit': i, 'attempt': attempt, 'type': 'Lost',
                                       'repr': 'commit %d returned but is not in the database' % i,
                                       'traceback': ''})
                        break
                else:
                    serial = conn.root()['doc-%d' % p]._p_serial
                log.append([serial.hex(), ops])
            break
        else:
            gaveup += 1
        i += 1
    elapsed = time.perf_counter() - t0
    conn.close()
    db.close()
    ClientStorage.tryToResolveConflict, ClientStorage.tpc_vote = orig, orig_vote
    logging.getLogger().removeHandler(capture)
    resolution = [r for r in capture.records if r['logger'] == 'ZODB.ConflictResolution']
    return {'proc': p, 'tried': i, 'ok': ok, 'conflicts': conflicts, 'gaveup': gaveup,
            'disconnects': disconnects, 'unknown_committed': unknown,
            'errors': errors, 'resolution_errors': resolution,
            'logged': [r for r in capture.records if r not in resolution],
            'client_resolves': resolves[0], 'resolved': resolved[0], 'elapsed': elapsed,
            'latencies': latencies, 'commit_latencies': commit_latencies, 'log': log}


def committed(tm, conn, p, i):
    """Whether catalog commit i of process p is in the database, after
    it returned or was cut by a disconnection: the serial of doc-p if
    doc-p's i is i, else None. Waits for the client to reconnect (to the
    restarted server), through further disconnections."""
    t0 = time.time()
    while True:
        abort(tm)
        try:
            tm.begin()
            doc = conn.root()['doc-%d' % p]
            return doc._p_serial if doc['i'] == i else None
        except ClientDisconnected as e:
            if time.time() > t0 + RECONNECT_TIMEOUT:
                raise Unreachable('no answer from the server for %.0f s after commit %d: %r'
                                  % (time.time() - t0, i, e))
            time.sleep(0.1)


# How long a client waits for the restarted server to answer.
RECONNECT_TIMEOUT = 60


class Unreachable(Exception):
    """The client could not reconnect (ZEO's client refuses a server
    whose last transaction is older than its cache's, for one): the
    client process ends with it, and run_clients raises."""


def abort(tm):
    """tm.abort(), which may meet the disconnection again."""
    try:
        tm.abort()
    except ClientDisconnected:
        pass


def _client(cfg, ready, go, results):
    """The body of a client process (run_clients)."""
    try:
        report = worker(cfg, ready.release, lambda: go.wait(120) or sys.exit('no go'))
    except BaseException:
        results.put({'proc': cfg['proc'], 'crash': traceback.format_exc()})
        raise
    results.put(report)


_CTX = None


def _context():
    # Clients are forked from a forkserver that imported ZODB, ZEO and this
    # module once: a fresh process each, without the cost of the imports.
    global _CTX
    if _CTX is None:
        import multiprocessing
        _CTX = multiprocessing.get_context('forkserver')
        _CTX.set_forkserver_preload(['zeo_contention_app', 'ZEO.ClientStorage', 'ZODB.DB',
                                     'BTrees.OOBTree', 'BTrees.OIBTree'])
    return _CTX


def run_clients(addr, workload, nprocs, commits=None, duration=None, ssl=False,
                seed=0, timeout=300, extra=None):
    """Run nprocs client processes against addr, all starting to commit at
    once; return their reports (sorted by process). The workload's objects
    must exist (run_setup). Raises RuntimeError when a client crashes or
    does not report within timeout seconds. extra: more of worker's
    keys (stop_file, restarts).

    The forkserver imports the caller's main module (as __mp_main__), as
    multiprocessing does: a script calling this must guard its own work
    with `if __name__ == '__main__'`."""
    import queue
    ctx = _context()
    ready, go, results = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = []
    try:
        for p in range(nprocs):
            cfg = {'addr': list(addr), 'workload': workload, 'nprocs': nprocs, 'proc': p,
                   'commits': commits, 'duration': duration, 'ssl': ssl, 'seed': seed}
            cfg.update(extra or {})
            pr = ctx.Process(target=_client, args=(cfg, ready, go, results), daemon=True)
            pr.start()
            procs.append(pr)
        deadline = time.time() + timeout
        for p in range(nprocs):
            while not ready.acquire(timeout=1):
                dead = [pr for pr in procs if pr.exitcode is not None]
                if dead or time.time() > deadline:
                    try:
                        rep = results.get(timeout=1)
                    except queue.Empty:
                        rep = {}
                    raise RuntimeError('client did not start (exit %s): %s'
                                       % ([pr.exitcode for pr in dead], rep.get('crash')))
        go.set()
        reports = []
        for p in range(nprocs):
            try:
                rep = results.get(timeout=max(1, deadline - time.time()))
            except queue.Empty:
                raise RuntimeError('%d of %d clients did not report in %ss'
                                   % (nprocs - len(reports), nprocs, timeout))
            if 'crash' in rep:
                raise RuntimeError('client %d crashed:\n%s' % (rep['proc'], rep['crash']))
            reports.append(rep)
        for pr in procs:
            pr.join(30)
        return sorted(reports, key=lambda r: r['proc'])
    finally:
        for pr in procs:
            if pr.is_alive():
                pr.kill()
                pr.join()


