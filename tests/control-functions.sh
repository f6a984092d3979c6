# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Helpers for the run-time control tests (test-control*.sh,
# test-merge.sh, test-block-size-change.sh), on top of functions.sh:
#
#   source "$(dirname "$0")/control-functions.sh"
#
# Provides $PY (a Python with the nbd module, /usr/bin/python3 unless
# SNAPFG_TEST_PYTHON says otherwise), $SNAPFGCTL, $CTL_IO (the NBD helper
# tests/control-io.py), $CTL_PROTO (the raw protocol client
# tests/control-proto.py), the Python helpers as commands (cio:
# control-io.py, failures_io: failures-io.py, ckio: checkpoint-io.py),
# and:
#
# The checking helpers record a failure with check_fail and return 0, so
# that a test under set -e carries on and reports every broken case.
#
#   ctl SOCK ARGS...          run snapfgctl -S SOCK ARGS; stdout in
#                             $tmpdir/ctl.out, stderr in $tmpdir/ctl.err;
#                             returns snapfgctl's exit status
#   ctl_ok WHAT SOCK ARGS...  the same; a non-zero exit is a check failure
#   ctl_refused WHAT MSG SOCK ARGS...
#                             must exit non-zero with MSG on stderr
#   json_ok WHAT FILE         FILE holds exactly one valid JSON object
#   jq_py FILE EXPR           print a Python expression of the JSON in FILE
#                             (the parsed object is "d")
#   origin_serves WHAT SOCK   a fresh connection reads the origin
#   listed SOCK NAME          nbdinfo --list shows export NAME
#   export_equals URI FILE WHAT, files_equal A B WHAT (functions.sh)
#   wait_nbdkit_death PIDFILE SECONDS, wait_until SECONDS COMMAND...
#   merge_under_io WHAT SOCK CTLSOCK NAME TIMEOUT VIEW MODEL SEED
#                             watch NAME's merge to its end while a client
#                             reads and writes the origin (see below)

# shellcheck shell=bash

_cfn_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=functions.sh
source "$_cfn_dir/functions.sh"

CTL_IO="$_cfn_dir/control-io.py"
CTL_PROTO="$_cfn_dir/control-proto.py"
FAILURES_IO="$_cfn_dir/failures-io.py"
CHECKPOINT_IO="$_cfn_dir/checkpoint-io.py"

# require_control_tools: nbdkit, the plugin, snapfgctl, nbdinfo, nbdcopy
# and a Python with the nbd module.
require_control_tools() {
    require_snapfg
    requires nbdinfo nbdcopy cmp
    [ -x "$PY" ] || skip "$PY not found"
    "$PY" -c 'import nbd' 2>/dev/null || skip "$PY has no nbd module"
    [ -n "$SNAPFGCTL" ] && [ -x "$SNAPFGCTL" ] ||
        fail "snapfgctl not found (SNAPFGCTL='${SNAPFGCTL:-}'): run 'make tools/snapfgctl/snapfgctl' first"
}

cio() { "$PY" "$CTL_IO" "$@"; }
failures_io() { "$PY" "$FAILURES_IO" "$@"; }
ckio() { "$PY" "$CHECKPOINT_IO" "$@"; }

ctl() {
    local sock=$1 st=0
    shift
    timeout 60 "$SNAPFGCTL" -S "$sock" "$@" >"$tmpdir/ctl.out" 2>"$tmpdir/ctl.err" || st=$?
    [ "$st" -ne 124 ] || echo "snapfgctl $* timed out (60 s)" >>"$tmpdir/ctl.err"
    return "$st"
}

ctl_ok() {
    local what=$1 st=0
    shift
    ctl "$@" || st=$?
    if [ "$st" -ne 0 ]; then
        cat "$tmpdir/ctl.out" "$tmpdir/ctl.err" >&2
        check_fail "$what: snapfgctl ${*:2} exited $st"
        return 0
    fi
    info "ok: $what"
}

ctl_refused() {
    local what=$1 msg=$2 st=0
    shift 2
    ctl "$@" || st=$?
    if [ "$st" -eq 0 ]; then
        cat "$tmpdir/ctl.out" >&2
        check_fail "$what: snapfgctl ${*:2} succeeded; expected an error"
        return 0
    fi
    if [ "$st" -ge 124 ]; then
        cat "$tmpdir/ctl.err" >&2
        check_fail "$what: snapfgctl ${*:2} exited $st (crash or hang?)"
        return 0
    fi
    if ! grep -qF -- "$msg" "$tmpdir/ctl.err"; then
        echo "--- stderr was: ---" >&2
        cat "$tmpdir/ctl.err" >&2
        check_fail "$what: error message lacks '$msg'"
        return 0
    fi
    info "ok: $what: refused (exit $st): $(head -n1 "$tmpdir/ctl.err")"
}

json_ok() {
    if ! "$PY" -c '
import json, sys
text = open(sys.argv[1]).read()
if not text.endswith("\n") or text.count("\n") != 1:
    sys.exit("not exactly one line: %r" % text[:200])
d = json.loads(text)
if not isinstance(d, dict):
    sys.exit("not a JSON object")
' "$2" 2>"$tmpdir/json.err"; then
        check_fail "$1: invalid JSON output: $(head -c 300 "$tmpdir/json.err"): $(head -c 300 "$2")"
    fi
}

jq_py() {
    "$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
v = eval(sys.argv[2])
print(json.dumps(v) if isinstance(v, (dict, list, bool)) or v is None else v)
' "$1" "$2"
}

origin_serves() {
    local what=$1 sock=$2 out
    if out=$(cio read "$(uri "$sock" origin)" 0 4096 2>&1) && [ "$out" = ok ]; then
        info "ok: $what: the origin still serves reads"
    else
        check_fail "$what: reading the origin failed: $out"
    fi
}

listed() {
    nbdinfo --list --json "$(uri "$1")" 2>"$tmpdir/list.err" |
        "$PY" -c '
import json, sys
d = json.load(sys.stdin)
sys.exit(0 if any(e["export-name"] == sys.argv[1] for e in d["exports"]) else 1)
' "$2"
}

# wait_until SECONDS COMMAND...: poll (every 0.1 s) until COMMAND
# succeeds; returns 1 on timeout.
wait_until() {
    local n=$(($1 * 10))
    shift
    while [ "$n" -gt 0 ]; do
        "$@" && return 0
        sleep 0.1
        n=$((n - 1))
    done
    return 1
}

# merge_under_io WHAT SOCK CTLSOCK NAME TIMEOUT VIEW MODEL SEED: watch
# snapshot NAME's merge (control-proto.py watch, up to TIMEOUT seconds)
# until it is gone, while control-io.py io-loop reads and writes the
# origin (seed SEED, at least 200 requests) and checks every read
# against MODEL, which starts as a copy of VIEW (the snapshot's view)
# and gets the client's writes.  Both must succeed (check_fail if not);
# the caller then compares the origin with MODEL.
merge_under_io() {
    local what=$1 sock=$2 ctlsock=$3 name=$4 timeout=$5 view=$6 model=$7 seed=$8
    local watch_pid io_pid st stop="$tmpdir/merge-under-io.stop"
    rm -f "$stop"
    "$PY" "$CTL_PROTO" watch "$ctlsock" "$name" --timeout "$timeout" >"$tmpdir/watch.out" 2>&1 &
    watch_pid=$!
    cp "$view" "$model"
    "$PY" "$CTL_IO" io-loop "$(uri "$sock" origin)" --seed "$seed" --model "$model" \
        --stop-file "$stop" --min-ops 200 >"$tmpdir/io.out" 2>&1 &
    io_pid=$!
    st=0; wait "$watch_pid" || st=$?
    cat "$tmpdir/watch.out"
    [ "$st" -eq 0 ] && info "ok: $what: the merge of $name finished" ||
        check_fail "$what: the merge of $name did not finish cleanly (above)"
    touch "$stop"
    st=0; wait "$io_pid" || st=$?
    cat "$tmpdir/io.out"
    [ "$st" -eq 0 ] && info "ok: $what: origin I/O during the merge saw $name's view plus the client's own writes" ||
        check_fail "$what: origin I/O during the merge went wrong (above)"
}
