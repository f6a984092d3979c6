# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Helpers for the persistent COW store tests (test-persistent-*.sh), on
# top of functions.sh:
#
#   source "$(dirname "$0")/persistent-functions.sh"
#
# Provides $PY (a Python with the nbd module), $PIO (tests/persistent-io.py
# run by it), $MAKE_COW (tests/make-cow.py), $SNAPFGCTL, and the helpers
# below.

# shellcheck shell=bash

_pfn_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=functions.sh
source "$_pfn_dir/functions.sh"

PIO="$_pfn_dir/persistent-io.py"
MAKE_COW="$_pfn_dir/make-cow.py"

# require_persistent_tools: nbdkit, the plugin, snapfgctl, nbdcopy,
# nbdinfo and a Python with the nbd module.
require_persistent_tools() {
    require_snapfg
    requires nbdcopy nbdinfo cmp sha256sum
    [ -x "$PY" ] || skip "$PY not found"
    "$PY" -c 'import nbd' 2>/dev/null || skip "$PY has no nbd module"
    [ -n "$SNAPFGCTL" ] && [ -x "$SNAPFGCTL" ] ||
        fail "snapfgctl not found (SNAPFGCTL='${SNAPFGCTL:-}'): run 'make tools/snapfgctl/snapfgctl' first"
}

pio() { "$PY" "$PIO" "$@"; }
make_cow() { "$PY" "$MAKE_COW" "$@"; }

# persistent_test_files: the names of test_files (functions.sh) plus
# $pristine (the origin as the snapshot saw it), $origin_model and
# $snap_model (what the origin and the snapshot must read), $chunks (the
# chunks written), all in $tmpdir; and $seed (test_seed).
persistent_test_files() {
    test_files
    pristine="$tmpdir/pristine.img"
    origin_model="$tmpdir/origin-model.img"
    snap_model="$tmpdir/snapshot-model.img"
    chunks="$tmpdir/chunks.txt"
    test_seed
}

# Writers a test runs in the background (writer_pids+=($!)): kill_writers
# kills them (SIGKILL: they are clients of an nbdkit being crashed) and
# waits for them; it also runs on exit.
writer_pids=()
kill_writers() {
    local p
    for p in "${writer_pids[@]}"; do
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    writer_pids=()
}
on_exit kill_writers

# snapshot_is_invalid WHAT SOCK READ-OFFSET READ-LEN WRITE-OFFSET: the
# snapshot export of the server on SOCK acts Invalid: reads at 0 and at
# READ-OFFSET and a 4 KiB write at WRITE-OFFSET fail with EIO, nbdcopy
# of it fails, and nbdinfo --list describes it as Invalid.
snapshot_is_invalid() {
    local what=$1 u r st
    u=$(uri "$2" snapshot)
    r=$(pio read "$u" 0 4096)
    [ "$r" = "errno EIO" ] || check_fail "$what: snapshot read returned '$r', expected EIO"
    r=$(pio read "$u" "$3" "$4")
    [ "$r" = "errno EIO" ] || check_fail "$what: snapshot read at $3 returned '$r', expected EIO"
    r=$(pio pwrite "$u" "$5" 4096)
    [ "$r" = "errno EIO" ] || check_fail "$what: snapshot write returned '$r', expected EIO"
    if copy_export "$u" "$tmpdir/x.img" 2>/dev/null; then
        check_fail "$what: nbdcopy of the snapshot succeeded"
    fi
    st=$(snapshot_status "$2")
    [ "$st" = Invalid ] || check_fail "$what: nbdinfo --list describes the snapshot as '$st', expected Invalid"
    info "$what: snapshot reads and writes fail with EIO; status $st"
}

# nbdinfo_field SOCK EXPORT FIELD: a field of nbdinfo --json for EXPORT.
nbdinfo_field() {
    nbdinfo --json "$(uri "$1" "$2")" |
        "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(d["exports"][0][sys.argv[1]])' "$3"
}

# list_description SOCK EXPORT: EXPORT's description in nbdinfo --list.
list_description() {
    nbdinfo --list --json "$(uri "$1")" |
        "$PY" -c '
import json, sys
d = json.load(sys.stdin)
for e in d["exports"]:
    if e["export-name"] == sys.argv[1]:
        print(e.get("description", ""))
        break
else:
    sys.exit("export %s not listed" % sys.argv[1])
' "$2"
}

# snapshot_status SOCK [EXPORT]: the status part of the snapshot's
# description (what follows the last ": ").
snapshot_status() {
    local d
    d=$(list_description "$1" "${2:-snapshot}") || return 1
    echo "${d##*: }"
}

# inspect COW OUTFILE: run snapfgctl inspect; stdout+stderr in OUTFILE;
# returns its exit status.
inspect() {
    local st=0
    "$SNAPFGCTL" inspect "$1" >"$2" 2>&1 || st=$?
    return "$st"
}

# inspect_value OUTFILE KEY: the value after "KEY: " in inspect output.
inspect_value() {
    sed -n "s/^$2: //p" "$1" | head -n1
}

# check_inspect COW EXPECTED-EXCEPTIONS WHAT: inspect exits 0, prints a
# dm status line, and counts the expected exceptions.
check_inspect() {
    local cow=$1 want=$2 what=$3 out="$tmpdir/inspect.out" st=0 n status
    inspect "$cow" "$out" || st=$?
    if [ "$st" -ne 0 ]; then
        cat "$out" >&2
        check_fail "$what: snapfgctl inspect exited $st"
        return 0
    fi
    status=$(inspect_value "$out" status)
    if ! [[ "$status" =~ ^[0-9]+/[0-9]+\ [0-9]+$ ]]; then
        cat "$out" >&2
        check_fail "$what: snapfgctl inspect printed no dm status line (got '$status')"
        return 0
    fi
    n=$(inspect_value "$out" exceptions)
    if [ "$n" != "$want" ]; then
        cat "$out" >&2
        check_fail "$what: snapfgctl inspect counts '$n' exceptions, expected $want"
        return 0
    fi
    info "ok: $what: inspect: $n exceptions, status $status"
}

# header_le32 FILE OFFSET: the little-endian 32-bit word at OFFSET.
header_le32() {
    od -An -t u4 --endian=little -j "$2" -N 4 "$1" | tr -d ' '
}

# count_lines FILE: distinct lines of FILE (0 if it does not exist).
count_distinct() {
    if [ -f "$1" ]; then sort -un "$1" | wc -l; else echo 0; fi
}

# kill9_nbdkit PIDFILE: SIGKILL the nbdkit and reap it.
kill9_nbdkit() {
    local pid=${_nbdkit_pids[$1]:-}
    [ -n "$pid" ] || fail "kill9_nbdkit: no nbdkit started with $1"
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    unset "_nbdkit_pids[$1]"
}

