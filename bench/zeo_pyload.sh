#!/usr/bin/env bash
# zeo_pyload.sh DATASET [ROUNDS] - Python client loadBefore loop against
# zodbd serve (pickle and msgpack) and runzeo, interleaved A B A B, each on
# its own copy of DATASET (a .fs file). Prints Go benchmark lines.
set -euo pipefail
ds=$1
rounds=${2:-3}
py=${PYTHON:-.venv/bin/python}
zodbd=${ZODBD:-bin/zodbd}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
name=$(basename "$ds" .fs)
. "$(dirname "${BASH_SOURCE[0]}")/servers.sh"
run_one() { # kind
    local kind=$1 p; p=$(port)
    cp "$ds" "$tmp/$kind.fs"
    case $kind in
    zodbd-Z) "$zodbd" serve -r -a 127.0.0.1:$p -f "$tmp/$kind.fs" 2>"$tmp/$kind.log" & ;;
    zodbd-M) "$zodbd" serve -r --msgpack -a 127.0.0.1:$p -f "$tmp/$kind.fs" 2>"$tmp/$kind.log" & ;;
    runzeo-Z) env -u ZEO_MSGPACK "$(dirname "$py")/runzeo" -a 127.0.0.1:$p -f "$tmp/$kind.fs" >"$tmp/$kind.log" 2>&1 & ;;
    runzeo-M) ZEO_MSGPACK=1 "$(dirname "$py")/runzeo" -a 127.0.0.1:$p -f "$tmp/$kind.fs" >"$tmp/$kind.log" 2>&1 & ;;
    esac
    local pid=$!
    wait_port $p
    $py bench/zeo_pyload.py 127.0.0.1:$p "$name/$kind" 1 | tail -1
    kill $pid; wait $pid 2>/dev/null || true
    rm -f "$tmp/$kind".fs*
}
for r in $(seq "$rounds"); do
    for kind in runzeo-Z zodbd-Z runzeo-M zodbd-M; do
        run_one $kind
    done
done
