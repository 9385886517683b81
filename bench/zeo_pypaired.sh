#!/usr/bin/env bash
# zeo_pypaired.sh DATASET [RUNS] [LOADS] - the stock Python client on runzeo
# and on zodbd serve -r at once (each on its own copy of DATASET, a .fs
# file), paired block by block in one Python process (bench/zeo_pypaired.py),
# with pickle, then with msgpack: RUNS runs of LOADS loads per side each.
# Prints Go benchmark lines; a-x-b is runzeo's time over zodbd's.
set -euo pipefail
ds=$1
runs=${2:-5}
loads=${3:-20000}
py=${PYTHON:-.venv/bin/python}
zodbd=${ZODBD:-bin/zodbd}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
name=$(basename "$ds" .fs)
. "$(dirname "${BASH_SOURCE[0]}")/servers.sh"
for m in Z M; do
    cp "$ds" "$tmp/runzeo.fs"
    cp "$ds" "$tmp/zodbd.fs"
    pr=$(port)
    pz=$(port)
    if [ $m = M ]; then
        ZEO_MSGPACK=1 "$(dirname "$py")/runzeo" -a 127.0.0.1:$pr -f "$tmp/runzeo.fs" >"$tmp/runzeo.log" 2>&1 &
        rpid=$!
        "$zodbd" serve -r --msgpack -a 127.0.0.1:$pz -f "$tmp/zodbd.fs" 2>"$tmp/zodbd.log" &
        zpid=$!
    else
        env -u ZEO_MSGPACK "$(dirname "$py")/runzeo" -a 127.0.0.1:$pr -f "$tmp/runzeo.fs" >"$tmp/runzeo.log" 2>&1 &
        rpid=$!
        "$zodbd" serve -r -a 127.0.0.1:$pz -f "$tmp/zodbd.fs" 2>"$tmp/zodbd.log" &
        zpid=$!
    fi
    wait_port $pr
    wait_port $pz
    for r in $(seq "$runs"); do
        $py bench/zeo_pypaired.py 127.0.0.1:$pr 127.0.0.1:$pz "$name/runzeo-$m-vs-zodbd-$m" --loads "$loads"
    done
    kill $rpid $zpid
    wait $rpid $zpid 2>/dev/null || true
    rm -f "$tmp"/*.fs*
done
