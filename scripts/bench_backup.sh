#!/usr/bin/env bash
# bench_backup.sh FILE [ROUNDS] - backup, restore and verify MB/s of
# `zodbd backup`/`zodbd restore` against ZODB's repozo on the same
# FileStorage FILE (and its FILE.index, if any), page cache warm. Each step
# runs ROUNDS times (default 3), alternating the tools; the best time of
# each is reported. The scratch repositories go into a directory beside
# FILE (space: about 3x FILE), removed at the end.
#
#   full       full backup (repozo -B -F / zodbd backup --full)
#   full-gz    the same, gzip (-z); repozo only with GZ_REPOZO=1
#   incr       incremental backup of 1% more transactions (default modes:
#              repozo compares md5s of the whole file and repository)
#   restore    restore of the full backup (repozo -R / zodbd restore)
#   verify     verify the set (repozo -V / zodbd backup --verify)
#
# STEPS="restore incr" runs only those steps (default: all).
set -euo pipefail

file=$1
rounds=${2:-3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${ZODBD:=$here/bin/zodbd}"
: "${PYTHON:=$here/.venv/bin/python}"
repozo="$PYTHON -m ZODB.scripts.repozo"
work=$(mktemp -d "$(dirname "$file")/.bench-backup.XXXXXX")
trap 'rm -rf "$work"' EXIT
size=$(stat -c %s "$file")

now() { date +%s.%N; }
# best "WALL CPU" seconds (CPU: user+sys of the command and its children)
# of running "$@" ROUNDS times, each after PREP (a command string, untimed)
best() {
    local prep=$1; shift
    local b= c=
    for _ in $(seq "$rounds"); do
        eval "$prep"
        /usr/bin/time -o "$work/time" -f '%e %U %S' "$@" >/dev/null 2>&1
        local d u s; read -r d u s < "$work/time"
        if [ -z "$b" ] || [ "$(echo "$d < $b" | bc -l)" = 1 ]; then b=$d; c=$(echo "$u + $s" | bc -l); fi
    done
    echo "$b $c"
}
report() { # STEP BYTES "PYWALL PYCPU" "GOWALL GOCPU"
    local pw pc gw gc
    read -r pw pc <<< "$3"; read -r gw gc <<< "$4"
    printf '%-11s %7.1f MB  repozo %6.2fs %7.1f MB/s (cpu %6.2fs)  zodbd %6.2fs %7.1f MB/s (cpu %5.2fs)  %5.1fx\n' \
        "$1" "$(echo "$2/1000000" | bc -l)" "$pw" "$(echo "$2/1000000/$pw" | bc -l)" "$pc" \
        "$gw" "$(echo "$2/1000000/$gw" | bc -l)" "$gc" "$(echo "$pw/$gw" | bc -l)"
}
next_second() { sleep "$(echo "1.02 - $(date +%s.%N) % 1" | bc -l)"; }

steps=" ${STEPS:-full full-gz restore verify incr} "
want() { [[ $steps == *" $1 "* ]]; }
echo "file $file: $size bytes; $(nproc) cores; $(uname -r); best of $rounds"
mkdir -p "$work/py" "$work/go"
fresh() { rm -rf "$work/$1"; mkdir -p "$work/$1"; next_second; }

if want full; then
py=$(best 'fresh py' $repozo -B -F -r "$work/py" -f "$file")
go=$(best 'fresh go' "$ZODBD" backup -q --full -r "$work/go" "$file")
report full "$size" "$py" "$go"
fi

# repozo compresses at zlib level 9 (Python's gzip.open default): on
# incompressible-ish data that is well under 1 MB/s, so it is measured only
# with GZ_REPOZO=1.
if want full-gz; then
go=$(best 'fresh go' "$ZODBD" backup -q --full -z -r "$work/go" "$file")
if [ "${GZ_REPOZO:-0}" = 1 ]; then
    py=$(best 'fresh py' $repozo -B -F -z -r "$work/py" -f "$file")
    report full-gz "$size" "$py" "$go"
else
    read -r gw gc <<< "$go"
    printf '%-11s %7.1f MB  zodbd %6.2fs %7.1f MB/s (cpu %5.2fs), compressed to %s bytes; repozo with GZ_REPOZO=1\n' full-gz \
        "$(echo "$size/1000000" | bc -l)" "$gw" "$(echo "$size/1000000/$gw" | bc -l)" "$gc" "$(du -b "$work"/go/*.fsz | cut -f1)"
fi
fi

# Restore and verify a plain full backup.
if want restore || want verify; then
fresh py; $repozo -B -F -r "$work/py" -f "$file"
fresh go; "$ZODBD" backup -q --full -r "$work/go" "$file"
# zodbd restore syncs the file it wrote (then renames it); repozo does not:
# "restore+sync" adds a sync of repozo's output, for the same durability.
sync
if want restore; then
py=$(best 'rm -f $work/r.fs*' $repozo -R -r "$work/py" -o "$work/r.fs")
go=$(best 'rm -f $work/r.fs*' "$ZODBD" restore -q -r "$work/go" -o "$work/r.fs")
report restore "$size" "$py" "$go"
py=$(best 'rm -f $work/r.fs*' sh -c "$repozo -R -r '$work/py' -o '$work/r.fs' && sync '$work/r.fs'")
report restore+sync "$size" "$py" "$go"
fi
if want verify; then
py=$(best : $repozo -V -r "$work/py")
go=$(best : "$ZODBD" backup -q --verify -r "$work/go")
report verify "$size" "$py" "$go"
fi
fi
want incr || exit 0

# Incremental: 1% more transactions on a copy.
cp "$file" "$work/live.fs"
[ -f "$file.index" ] && cp "$file.index" "$work/live.fs.index"
grow=$((size / 100))
"$PYTHON" - "$work/live.fs" "$grow" <<'EOF'
import sys, os, transaction, ZODB, ZODB.FileStorage
from persistent.mapping import PersistentMapping
path, grow = sys.argv[1], int(sys.argv[2])
db = ZODB.DB(ZODB.FileStorage.FileStorage(path))
conn = db.open(); root = conn.root(); start = os.path.getsize(path); i = 0
while os.path.getsize(path) - start < grow:
    root['bench%d' % (i % 100)] = PersistentMapping(pad=os.urandom(4000)); i += 1
    transaction.commit()
db.close()
EOF
live_size=$(stat -c %s "$work/live.fs")
base=$size
# (synced after the copy: ext4's fsync in the timed backup would otherwise
# also write the copy's dirty pages)
prep_py='rm -rf $work/py; mkdir $work/py; cp $work/go-base/* $work/py/; sync; next_second'
rm -rf "$work/go-base"; mkdir "$work/go-base"
# A base set of the original file, made by repozo (both tools read it).
$repozo -B -F -r "$work/go-base" -f "$file"
sync
prep_go='rm -rf $work/go; mkdir $work/go; cp $work/go-base/* $work/go/; sync'
py=$(best "$prep_py" $repozo -B -r "$work/py" -f "$work/live.fs")
go=$(best "$prep_go" "$ZODBD" backup -q -r "$work/go" "$work/live.fs")
report incr "$((live_size - base))" "$py" "$go"
echo "(incr: MB/s of the increment; both read the whole file to check it against the set)"
