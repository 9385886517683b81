#!/usr/bin/env bash
# dataset.sh NAME OUT - make benchmark dataset NAME (e.g. prod1-1024) at OUT
# with scripts/gen_dataset.py KIND OUT ARG, where NAME is KIND-ARG, run by
# $PYTHON (the venv's python: the generator needs ZODB/py), and check it
# against testdata/datasets/SHA256SUMS. OUT appears only once checked.
set -euo pipefail

name=$1
out=$2
: "${PYTHON:=.venv/bin/python}"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sums=$here/../testdata/datasets/SHA256SUMS
gen=$here/gen_dataset.py

want=$(awk -v f="$name.fs" '$2 == f { print $1 }' "$sums")
if [ -z "$want" ]; then
    echo "dataset $name: no sha256 for $name.fs in $sums" >&2
    exit 1
fi

mkdir -p "$(dirname "$out")"
tmpdir=$(mktemp -d "$(dirname "$out")/.tmp-$name.XXXXXX")
trap 'rm -rf "$tmpdir"' EXIT

kind=${name%-*}
arg=${name##*-}
echo "dataset $name: generating with scripts/gen_dataset.py $kind $arg (a few seconds)"
"$PYTHON" "$gen" "$kind" "$tmpdir/$name.fs" "$arg"

got=$(sha256sum "$tmpdir/$name.fs" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
    echo "dataset $name: sha256 $got, want $want" >&2
    echo "  (a generated file differs when ZODB/zodbpickle differ from requirements.txt)" >&2
    exit 1
fi
mv "$tmpdir/$name.fs" "$out"
echo "dataset $name: $out ok (sha256 $got)"
