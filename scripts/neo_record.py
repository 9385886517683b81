#!/usr/bin/env python3
"""Record NEO connections through a TCP proxy, in the format of testdata/neo/decoded.

A recording proxy replaces tcpdump (no root needed): it listens on one port,
forwards every accepted connection to a target address, and keeps both byte
streams with the time each chunk arrived. When the proxy stops, each
connection is written as

    <out>/<run>-cNN-<initiator>-<acceptor>.json   (packet list, decoded)
    <out>/<run>-cNN-<initiator>-<acceptor>.c2s.bin / .s2c.bin

where c2s is initiator to acceptor, `initiator` is the node type of the
first RequestIdentification the initiator sends (`ctl` when none) and
`acceptor` is the role given to the proxy. The JSON follows
testdata/neo/README.md ("JSON conventions"); a packet's `t` is the arrival
time at the proxy of the chunk holding its first byte.

Used as a library by scripts/neo_record_conflict.py; needs msgpack only.
"""

import hashlib
import json
import os
import socket
import threading
import time

import msgpack

HANDSHAKE = msgpack.packb(('NEO', 5), use_bin_type=True)

# Enum ext types of protocol 5, numbered in the order the enums are defined;
# only used to name values in the JSON, never to decide anything.
ENUMS = {
    0: ('CellStates', ['OUT_OF_DATE', 'UP_TO_DATE', 'FEEDING', 'CORRUPTED', 'DISCARDED']),
    1: ('ClusterStates', ['RECOVERING', 'VERIFYING', 'RUNNING', 'STOPPING', 'STARTING_BACKUP',
                          'BACKINGUP', 'STOPPING_BACKUP']),
    2: ('ErrorCodes', ['ACK', 'DENIED', 'NOT_READY', 'OID_NOT_FOUND', 'TID_NOT_FOUND',
                       'OID_DOES_NOT_EXIST', 'PROTOCOL_ERROR', 'REPLICATION_ERROR',
                       'CHECKING_ERROR', 'BACKEND_NOT_IMPLEMENTED', 'NON_READABLE_CELL',
                       'READ_ONLY_ACCESS', 'INCOMPLETE_TRANSACTION', 'UNDO_PACK_ERROR']),
    3: ('NodeStates', ['UNKNOWN', 'DOWN', 'RUNNING', 'PENDING']),
    4: ('NodeTypes', ['MASTER', 'STORAGE', 'CLIENT', 'ADMIN']),
}


def _codes():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, '..', 'testdata', 'neo', 'packet-codes.json')) as f:
        return {c['code']: c for c in json.load(f)}


CODES = _codes()


def _ext_hook(code, data):
    v = msgpack.unpackb(data)
    e = {'ext': code, 'value': v}
    if code in ENUMS and isinstance(v, int) and 0 <= v < len(ENUMS[code][1]):
        e['name'] = '%s.%s' % (ENUMS[code][0], ENUMS[code][1][v])
    return e


def _jsonable(v):
    if isinstance(v, (bytes, bytearray)):
        v = bytes(v)
        if len(v) > 1024:
            return {'bin_len': len(v), 'sha1': hashlib.sha1(v).hexdigest(), 'head': v[:32].hex()}
        d = {'bin': v.hex()}
        if v and all(32 <= b < 127 for b in v):
            d['ascii'] = v.decode('ascii')
        return d
    if isinstance(v, dict):
        if 'ext' in v and len(v) <= 3 and set(v) <= {'ext', 'value', 'name'}:
            return v
        return {'map': [[_jsonable(k), _jsonable(x)] for k, x in v.items()]}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def decode_stream(data, chunks, direction):
    """Split one direction's stream into packet records.

    chunks is [(offset, t), ...]: the stream offset at which each received
    chunk starts and its arrival time."""
    out = []
    u = msgpack.Unpacker(raw=False, ext_hook=_ext_hook, strict_map_key=False,
                         max_buffer_size=len(data) + 1)
    u.feed(data)
    off = 0

    def t_at(o):
        t = None
        for co, ct in chunks:
            if co > o:
                break
            t = ct
        return t

    first = True
    while off < len(data):
        try:
            obj = u.unpack()
        except msgpack.OutOfData:
            break
        end = u.tell()
        rec = {'dir': direction, 'offset': off, 'size': end - off, 't': t_at(off)}
        if first:
            rec['kind'] = 'handshake'
            rec['value'] = obj
            first = False
        else:
            msg_id, code, args = obj
            c = CODES.get(code, {})
            rec.update(msg_id=msg_id, code=code, code_hex='0x%04x' % code,
                       name=c.get('name', '?'), kind=c.get('kind', '?'), args=_jsonable(args))
        out.append(rec)
        off = end
    return out


class Conn(object):
    def __init__(self, n, open_t, initiator_addr, acceptor_addr):
        self.n, self.open_t = n, open_t
        self.addrs = (initiator_addr, acceptor_addr)
        self.data = {'c2s': bytearray(), 's2c': bytearray()}
        self.chunks = {'c2s': [], 's2c': []}
        self.close_events = []
        self.lock = threading.Lock()


class RecordingProxy(object):
    """Listens on listen_addr, forwards to target_addr, records everything."""

    def __init__(self, listen_addr, target_addr, acceptor_role, counter):
        self.target, self.role = target_addr, acceptor_role
        self.counter = counter  # shared [next connection number, lock]
        self.conns = []
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(listen_addr)
        self.ls.listen(16)
        self.addr = self.ls.getsockname()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, peer = self.ls.accept()
            except OSError:
                return
            b = socket.create_connection(self.target)
            for s in a, b:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.counter[1]:
                n = self.counter[0]
                self.counter[0] += 1
            c = Conn(n, time.time(), '%s:%d' % peer, '%s:%d' % self.target)
            self.conns.append(c)
            threading.Thread(target=self._pump, args=(c, a, b, 'c2s'), daemon=True).start()
            threading.Thread(target=self._pump, args=(c, b, a, 's2c'), daemon=True).start()

    def _pump(self, c, src, dst, d):
        while True:
            try:
                buf = src.recv(1 << 16)
            except OSError:
                buf = b''
            t = time.time()
            if not buf:
                with c.lock:
                    c.close_events.append({'t': t, 'flag': 'FIN', 'dir': d})
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            with c.lock:
                c.chunks[d].append((len(c.data[d]), t))
                c.data[d] += buf
            try:
                dst.sendall(buf)
            except OSError:
                return

    def close(self):
        self.ls.close()


def initiator_role(c2s_packets):
    for p in c2s_packets:
        if p.get('name') == 'RequestIdentification':
            return p['args'][0]['name'].split('.')[1].lower()
    return 'ctl'


def dump_conn(j, f):
    """Writes a connection's JSON compactly: one line per top-level key and
    one line per packet."""
    f.write('{\n')
    keys = [k for k in j if k != 'packets']
    for k in keys:
        f.write(' %s: %s,\n' % (json.dumps(k), json.dumps(j[k])))
    f.write(' "packets": [\n')
    pk = j['packets']
    for i, p in enumerate(pk):
        f.write('  %s%s\n' % (json.dumps(p), ',' if i < len(pk) - 1 else ''))
    f.write(' ]\n}\n')


def write_run(out, run, proxies):
    """Writes every connection of every proxy, numbered in opening order."""
    os.makedirs(out, exist_ok=True)
    conns = sorted(((c, p.role) for p in proxies for c in p.conns), key=lambda x: x[0].n)
    index = []
    for i, (c, role) in enumerate(conns):
        with c.lock:
            data = {d: bytes(v) for d, v in c.data.items()}
            pk = decode_stream(data['c2s'], c.chunks['c2s'], 'c2s') + \
                decode_stream(data['s2c'], c.chunks['s2c'], 's2c')
            close = list(c.close_events)
        pk.sort(key=lambda p: (p['t'], p['dir'] == 'c2s', p['offset']))
        ini = initiator_role([p for p in pk if p['dir'] == 'c2s'])
        name = '%s-c%02d-%s-%s' % (run, i, ini, role)
        j = {'connection': i,
             'initiator': {'role': ini, 'addr': c.addrs[0]},
             'acceptor': {'role': role, 'addr': c.addrs[1]},
             'open_t': c.open_t, 'tcp_close_events': close,
             'c2s_bytes': len(data['c2s']), 's2c_bytes': len(data['s2c']),
             'c2s_sha1': hashlib.sha1(data['c2s']).hexdigest(),
             's2c_sha1': hashlib.sha1(data['s2c']).hexdigest(),
             'packets': pk}
        with open(os.path.join(out, name + '.json'), 'w') as f:
            dump_conn(j, f)
        for d in 'c2s', 's2c':
            with open(os.path.join(out, '%s.%s.bin' % (name, d)), 'wb') as f:
                f.write(data[d])
        index.append({'file': name + '.json', 'initiator': ini, 'acceptor': role,
                      'initiator_addr': c.addrs[0], 'acceptor_addr': c.addrs[1],
                      'packets': len(pk), 'c2s_bytes': len(data['c2s']),
                      's2c_bytes': len(data['s2c']),
                      'names': sorted({p['name'] for p in pk if 'name' in p})})
    with open(os.path.join(out, run + '-connections.json'), 'w') as f:
        json.dump(index, f, indent=1)
    return index
