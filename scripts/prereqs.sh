#!/usr/bin/env bash
# prereqs.sh - check what `make` needs before it starts, and say plainly
# what is missing: the go command at the version go.mod names (or one that
# may download it), python3 >= 3.11 with the venv module (only while the
# venv is still to be made), sha256sum; and say whether go test gets -race
# (it needs cgo and a C compiler; without them the tests run without it).
#
# Environment: GO, PYTHON, VENV (as in the Makefile), RACE ("-race" or "").
set -uo pipefail

: "${GO:=go}" "${PYTHON:=python3}" "${VENV:=.venv}" "${RACE:=}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fail=0
missing() { echo "prereqs: $*" >&2; fail=1; }

# Go: the toolchain itself, without letting it switch to another one.
want=$(awk '$1 == "go" { print $2; exit }' go.mod)
if ! have=$(GOTOOLCHAIN=local "$GO" env GOVERSION 2>/dev/null); then
    missing "no Go toolchain ($GO): install Go >= $want (https://go.dev/dl/)"
    have=
fi
if [ -n "$have" ]; then
    have=${have#go}
    if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" != "$want" ]; then
        policy=${GOTOOLCHAIN:-$(cd / && GOTOOLCHAIN=local "$GO" env GOTOOLCHAIN)}
        if [ "${policy%%+*}" = local ]; then
            missing "go $have, go.mod needs go >= $want (and GOTOOLCHAIN=$policy forbids fetching it): install Go >= $want"
        else
            echo "prereqs: go $have < $want: the go command will download go $want (network needed once)"
        fi
    fi
fi

# Python: the one that makes the venv, or the venv's.
if [ -x "$VENV/bin/python" ]; then
    py=$VENV/bin/python
else
    py=$PYTHON
fi
if ! pyver=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null); then
    missing "no Python ($py): install Python >= 3.11 (Debian/Ubuntu: apt-get install python3 python3-venv)"
elif ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    missing "$py is Python $pyver; the tests need Python >= 3.11 (make PYTHON=python3.11 ...)"
elif [ "$py" = "$PYTHON" ] && ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
    missing "$py (Python $pyver) lacks the venv module or ensurepip (Debian/Ubuntu: apt-get install python3-venv)"
fi

command -v sha256sum >/dev/null || missing "no sha256sum (coreutils): the datasets are checked with it"

if [ $fail = 0 ]; then
    if [ -n "$RACE" ]; then race="go test -race"; else race="no cgo or C compiler: go test runs without -race"; fi
    echo "prereqs: go ${have:-?}, python $pyver ($py), $race"
fi
exit $fail
