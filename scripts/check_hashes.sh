#!/usr/bin/env bash
# check_hashes.sh ZODBD REFDIR DSDIR NAME... - run `zodbd hash --crc32` and
# `--sha1` on DSDIR/NAME.fs and compare the first field of the output
# (e.g. "crc32:565d9a85") with the line for that hash in REFDIR/NAME.hash,
# the reference that ZODB/py computed. The rest of the line (timings) is
# not compared.
set -uo pipefail

zodbd=$1 refdir=$2 dsdir=$3
shift 3
fail=0
for name in "$@"; do
    for algo in crc32 sha1; do
        want=$(grep "^$algo:" "$refdir/$name.hash" | head -n1 | cut -d' ' -f1)
        if [ -z "$want" ]; then
            echo "FAIL $name $algo: no $algo line in $refdir/$name.hash"
            fail=1
            continue
        fi
        if ! line=$("$zodbd" hash "--$algo" "$dsdir/$name.fs"); then
            echo "FAIL $name $algo: zodbd hash --$algo $dsdir/$name.fs failed"
            fail=1
            continue
        fi
        got=${line%% *}
        if [ "$got" = "$want" ]; then
            echo "ok   $name $line"
        else
            echo "FAIL $name: got $got, want $want"
            fail=1
        fi
    done
done
exit $fail
