"""Encode and decode ZEO messages the way the stock ZEO client does, for the
Go wire tests. Reads JSON commands on stdin, writes JSON answers on stdout.

Values are written in a tagged JSON form: {"t": kind, "v": ...}.
"""
import io
import json
import sys

import msgpack
import zodbpickle.pickle


def tag(v):
    if v is None:
        return {"t": "None"}
    if isinstance(v, bool):
        return {"t": "bool", "v": v}
    if isinstance(v, int):
        return {"t": "int", "v": str(v)}
    if isinstance(v, float):
        return {"t": "float", "v": v}
    if isinstance(v, bytes):
        return {"t": "bytes", "v": v.hex()}
    if isinstance(v, str):
        return {"t": "str", "v": v}
    if isinstance(v, tuple):
        return {"t": "tuple", "v": [tag(x) for x in v]}
    if isinstance(v, list):
        return {"t": "list", "v": [tag(x) for x in v]}
    if isinstance(v, dict):
        return {"t": "dict", "v": [[tag(k), tag(x)] for k, x in v.items()]}
    raise TypeError(type(v))


def untag(d):
    t = d["t"]
    if t == "None":
        return None
    if t in ("bool", "float", "str"):
        return d["v"]
    if t == "int":
        return int(d["v"])
    if t == "bytes":
        return bytes.fromhex(d["v"])
    if t == "tuple":
        return tuple(untag(x) for x in d["v"])
    if t == "list":
        return [untag(x) for x in d["v"]]
    if t == "dict":
        return {untag(k): untag(x) for k, x in d["v"]}
    raise ValueError(t)


def encode(m, v):
    # As ZEO/asyncio/marshal.py: pickle protocol 3 in fast mode, or msgpack
    # with use_bin_type.
    if m == "Z":
        f = io.BytesIO()
        p = zodbpickle.pickle.Pickler(f, 3)
        p.fast = 1
        p.dump(v)
        return f.getvalue()
    return msgpack.packb(v, use_bin_type=True)


def decode(m, b):
    if m == "Z":
        return zodbpickle.pickle.loads(b)
    return msgpack.unpackb(b, raw=False, use_list=False)


for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "encode":
        out = encode(cmd["m"], untag(cmd["v"])).hex()
    else:
        out = tag(decode(cmd["m"], bytes.fromhex(cmd["b"])))
    print(json.dumps(out, ensure_ascii=False), flush=True)
