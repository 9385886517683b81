#!/usr/bin/env bash
# pack_scale.sh ROUNDS BIN_A BIN_B FILE:TID [FILE:TID ...] - `zodbd pack --tid`
# of copies of each FILE at its TID with two zodbd binaries (before and
# after a change), interleaved: in each round, every file with A then B
# (B then A in odd rounds). Each pack runs on a fresh copy (copied and
# synced before timing). Prints one line per pack: the binary, the file's
# size in MB, the pack's own phases (zodbd's summary), and /usr/bin/time's
# wall, user and system seconds. Make the files with
#   ZODBD_BENCH_MB=640 ZODBD_PACK_SYNTH=/tmp/s640.fs go test ./fs1 -run TestWritePackSynthetic -v
# (it prints the pack tid). The copies go beside each FILE.
set -euo pipefail
rounds=$1 a=$2 b=$3
shift 3
one() { # one LABEL BIN FILE TID
    local w
    w=$(dirname "$3")/pack-scale-work.fs
    rm -f "$w" "$w".*
    cp "$3" "$w"
    sync
    local out
    out=$( { /usr/bin/time -f "TIME %e %U %S" "$2" pack --tid "$4" "$w"; } 2>&1 )
    printf '%s %5d MB  %s  wall/user/sys %s\n' "$1" $(( $(stat -c %s "$3") / 1000000 )) \
        "$(echo "$out" | grep -o '[0-9.]*s (scan[^)]*)')" "$(echo "$out" | grep '^TIME' | cut -d' ' -f2-)"
    rm -f "$w" "$w".*
}
for r in $(seq "$rounds"); do
    for ft in "$@"; do
        f=${ft%%:*} t=${ft#*:}
        if (( r % 2 )); then one A "$a" "$f" "$t"; one B "$b" "$f" "$t"
        else one B "$b" "$f" "$t"; one A "$a" "$f" "$t"; fi
    done
done
