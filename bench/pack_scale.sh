#!/usr/bin/env bash
# pack_scale.sh ROUNDS BIN_A BIN_B FILE:TID [FILE:TID ...] - `zodbd pack --tid`
# of copies of each FILE at its TID with two zodbd binaries (before and
# after a change), interleaved: in each round, every file with A then B
# (B then A in odd rounds). Each pack runs on a fresh copy (copied and
# synced before timing). Prints one line per pack: the binary, the file's
# size in MB, the pack's own phases (zodbd's summary), and /usr/bin/time's
# wall, user and system seconds, then the medians per binary and file.
# Make the files with
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
# median FIELD: the median of a numeric field of the lines on stdin.
median() { awk -v f="$1" '{print $f}' | tr -d 's)' | sort -n | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for r in $(seq "$rounds"); do
    for ft in "$@"; do
        f=${ft%%:*} t=${ft#*:}
        if (( r % 2 )); then one A "$a" "$f" "$t"; one B "$b" "$f" "$t"
        else one B "$b" "$f" "$t"; one A "$a" "$f" "$t"; fi
    done
done | tee "$log"
awk '{print $1, $2}' "$log" | sort -u -k2n -k1 | while read -r bin mb; do
    grep "^$bin *$mb MB" "$log" >"$log.k"
    printf 'median of %d: %s %5d MB  wall %s  user %s  sys %s  copy phase %s s\n' "$(wc -l <"$log.k")" "$bin" "$mb" \
        "$(median 12 <"$log.k")" "$(median 13 <"$log.k")" "$(median 14 <"$log.k")" "$(median 10 <"$log.k")"
    rm -f "$log.k"
done
