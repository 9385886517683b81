#!/usr/bin/env bash
# zeo_contention.sh [BLOCK] [ROUNDS] - commits under contention, zodbd serve
# vs runzeo paired block by block (bench/zeo_contention.py): the Length and
# catalog workloads with 4 and 16 Python client processes, BLOCK seconds
# (default 5) per block, ROUNDS blocks (default 2) per server, with pickle
# then msgpack. Prints a table and Go benchmark lines per marshalling.
set -euo pipefail
block=${1:-5}
rounds=${2:-2}
py=${PYTHON:-.venv/bin/python}
zodbd=${ZODBD:-bin/zodbd}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
for m in "" --msgpack; do
    $py bench/zeo_contention.py --zodbd "$zodbd" --procs 4,16 --workloads length,catalog \
        --block "$block" --rounds "$rounds" $m
done
