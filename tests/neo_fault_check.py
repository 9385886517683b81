"""The check of tests/test_neo_writes.py's fault test, run with NEO/py's
Python: every acknowledged commit of every worker is readable (loadSerial
of the first object at the logged tid holds the logged counter), the two
objects of each worker agree, and the current state is at least the last
acknowledged commit. Prints a JSON summary (also compared across storages
by the test)."""
import hashlib
import json
import sys

from neo.client.Storage import Storage
from ZODB import DB
from ZODB.utils import p64

master, name = sys.argv[1:3]
logs = sys.argv[3:]
st = Storage(master_nodes=master, name=name, read_only=True)
db = DB(st)
conn = db.open()
root = conn.root()
out = {'workers': [], 'problems': []}
for i, path in enumerate(logs):
    key = 'w%d' % i
    acked = [line.split() for line in open(path) if line.strip()]
    a, b = root.get(key), root.get(key + 'b')
    if a is None or b is None:
        if acked:
            out['problems'].append('%s missing but %d commits were acknowledged' % (key, len(acked)))
        continue
    if a['k'] != b['k']:
        out['problems'].append('%s: partial transaction: %r vs %r' % (key, a['k'], b['k']))
    if acked and a['k'] < int(acked[-1][0]):
        out['problems'].append('%s: current %d < last acknowledged %s' % (key, a['k'], acked[-1][0]))
    oid = a._p_oid
    for k, tid in acked:
        data = st.loadSerial(oid, bytes.fromhex(tid))
        state = conn._reader.getState(data)
        if state.get('data', state).get('k') != int(k):
            out['problems'].append('%s: tid %s holds %r, acknowledged %s' % (key, tid, state, k))
    out['workers'].append({'key': key, 'acked': len(acked), 'current': a['k']})
# A fingerprint of what is served, to compare storages on the same DB.
h = hashlib.sha1()
for t in st.iterator():
    h.update(t.tid)
    for r in t:
        h.update(r.oid + (r.data or b''))
out['iter_sha1'] = h.hexdigest()
conn.close()
db.close()
print(json.dumps(out))
