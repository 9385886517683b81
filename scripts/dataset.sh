#!/usr/bin/env bash
# dataset.sh NAME OUT - put benchmark dataset NAME (e.g. prod1-1024) at OUT.
#
# Takes $SHARED/testdata/datasets/NAME.fs.gz when present (gunzip), else
# generates it with $SHARED/tools/gen_dataset.py KIND OUT ARG, where NAME is
# KIND-ARG, using $PYTHON (the venv's python: the generator needs ZODB).
# Either way the result is checked against testdata/datasets/SHA256SUMS.
set -euo pipefail

name=$1
out=$2
: "${SHARED:=../shared}"
: "${PYTHON:=.venv/bin/python}"
sums=testdata/datasets/SHA256SUMS

gz=$SHARED/testdata/datasets/$name.fs.gz
gen=$SHARED/tools/gen_dataset.py
tmpdir=$(mktemp -d "$(dirname "$out")/.tmp-$name.XXXXXX")
trap 'rm -rf "$tmpdir"' EXIT

if [ -f "$gz" ]; then
    echo "dataset $name: gunzip $gz"
    gunzip -c "$gz" >"$tmpdir/$name.fs"
elif [ -f "$gen" ]; then
    kind=${name%-*}
    arg=${name##*-}
    echo "dataset $name: $gz not found; generating: gen_dataset.py $kind $arg"
    "$PYTHON" "$gen" "$kind" "$tmpdir/$name.fs" "$arg"
else
    echo "dataset $name: neither $gz nor $gen exists (SHARED=$SHARED)" >&2
    exit 1
fi

want=$(awk -v f="$name.fs" '$2 == f { print $1 }' "$sums")
got=$(sha256sum "$tmpdir/$name.fs" | cut -d' ' -f1)
if [ -z "$want" ]; then
    echo "dataset $name: no sha256 for $name.fs in $sums" >&2
    exit 1
fi
if [ "$got" != "$want" ]; then
    echo "dataset $name: sha256 $got, want $want" >&2
    echo "  (a generated file differs when ZODB/zodbpickle differ from requirements.txt)" >&2
    exit 1
fi
mv "$tmpdir/$name.fs" "$out"
echo "dataset $name: $out ok (sha256 $got)"
