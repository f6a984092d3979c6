# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Helpers for the snapfg shell tests.  Source it from a test script:
#
#   source "$(dirname "$0")/functions.sh"
#
# It finds the plugin ($SNAPFG_PLUGIN) and the libnbd driver ($NBD_CHECK);
# "make check" exports both, and when a test is run by hand from the top of
# the build tree they default to plugins/snapfg/.libs/nbdkit-snapfg-plugin.so
# and tests/nbd-check.  It creates $tmpdir (removed on exit unless
# KEEP_TMP=1), and stops every nbdkit it started when the script exits.
#
# Exit codes follow automake: 0 pass, 1 fail, 77 skip.

# shellcheck shell=bash

_fn_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
test_name=$(basename "$0" .sh)
_test_start=$SECONDS

: "${top_srcdir:=$(cd "$_fn_dir/.." && pwd)}"

info() { echo "$test_name: $*"; }

# fail MESSAGE: print and exit 1 (the EXIT trap cleans up).
fail() {
    echo "$test_name: FAIL: $*" >&2
    exit 1
}

# check_fail MESSAGE: record a failure and carry on; finish() fails the
# test at the end.  Lets one run report every broken case.  Each failure
# is also a line in $tmpdir/check-failures, which finish() counts, so
# that one recorded in a subshell (a $(...), a pipeline, a background
# job) is not lost with the subshell's variables.
_check_failures=0
check_fail() {
    echo "$test_name: FAIL: $*" >&2
    _check_failures=$((_check_failures + 1))
    echo x >>"$tmpdir/check-failures"
}
finish() {
    local n=0 s=0
    [ ! -f "$tmpdir/check-failures" ] || n=$(wc -l <"$tmpdir/check-failures")
    [ "$n" -eq 0 ] || fail "$n check(s) failed (see above)"
    [ ! -f "$tmpdir/skipped-parts" ] || s=$(wc -l <"$tmpdir/skipped-parts")
    if [ "$s" -gt 0 ]; then
        # Not a plain PASS: what did not run is said once more at the
        # end, where contrib/run.sh's summary finds it.
        echo "$test_name: SKIP: $s part(s) of this test did not run:"
        sed "s/^/$test_name:   skipped part: /" "$tmpdir/skipped-parts"
        info "PASS of the other parts"
    else
        info PASS
    fi
}

skip() {
    echo "$test_name: SKIP: $*"
    exit 77
}

# soak_or QUICK SOAK: a round count: QUICK in make check, SOAK under
# make check-soak (SNAPFG_SOAK=1).  The rounds of a crash loop each try
# another random moment; make check runs enough of them to cover every
# configuration, the soak more of the same for the rare interleavings.
soak_or() {
    if [ "${SNAPFG_SOAK:-0}" = 1 ]; then echo "$2"; else echo "$1"; fi
}

# skip_part WHAT: a part of the test cannot run here (a tool missing, not
# root, a premise the machine did not give): say so on a "SKIP-PART:"
# line and go on with the rest.  finish() reports the test as passed
# with N parts skipped, never as a plain pass, and contrib/run.sh counts
# the SKIP-PART lines of every test log in its summary.  A line in
# $tmpdir/skipped-parts each, so that a part skipped in a subshell or in
# a Python helper (snapfg_test.skip_part, through $SNAPFG_SKIPPED_PARTS)
# is counted too.
skip_part() {
    echo "$test_name: SKIP-PART: $*"
    echo "$*" >>"$tmpdir/skipped-parts"
}

# requires CMD...: skip the test if a command is missing.
requires() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || skip "'$c' not found"
    done
}

# have CMD: true if the command exists.
have() { command -v "$1" >/dev/null 2>&1; }

_find_first() {
    local f
    for f in "$@"; do
        if [ -f "$f" ] && [ -x "$f" ]; then
            (cd "$(dirname "$f")" && echo "$(pwd)/$(basename "$f")")
            return 0
        fi
    done
    return 1
}

if [ -z "${SNAPFG_PLUGIN:-}" ]; then
    SNAPFG_PLUGIN=$(_find_first \
        "$PWD/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so" \
        "$PWD/../plugins/snapfg/.libs/nbdkit-snapfg-plugin.so" \
        "$_fn_dir/../plugins/snapfg/.libs/nbdkit-snapfg-plugin.so") || true
fi
if [ -z "${NBD_CHECK:-}" ]; then
    NBD_CHECK=$(_find_first \
        "$PWD/tests/nbd-check" \
        "$PWD/nbd-check" \
        "$_fn_dir/nbd-check") || true
fi
if [ -z "${SNAPFGCTL:-}" ]; then
    SNAPFGCTL=$(_find_first \
        "$PWD/tools/snapfgctl/snapfgctl" \
        "$PWD/../tools/snapfgctl/snapfgctl" \
        "$_fn_dir/../tools/snapfgctl/snapfgctl") || true
fi
# Python test helpers need the nbd module, which Debian installs for the
# system Python only.
PY=${SNAPFG_TEST_PYTHON:-/usr/bin/python3}

# require_snapfg: nbdkit, the built plugin and (optionally) the driver.
require_snapfg() {
    requires nbdkit
    [ -n "$SNAPFG_PLUGIN" ] && [ -f "$SNAPFG_PLUGIN" ] ||
        fail "plugin not found (SNAPFG_PLUGIN='${SNAPFG_PLUGIN:-}'): build it first, or run from the top of the build tree"
}
require_nbd_check() {
    [ -n "$NBD_CHECK" ] && [ -x "$NBD_CHECK" ] ||
        fail "driver nbd-check not found (NBD_CHECK='${NBD_CHECK:-}'): run 'make tests/nbd-check' first"
}

# --- temporary directory and cleanup ---------------------------------

tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/snapfg-${test_name}.XXXXXX")
# Write-back's held files (held-dir=) go where systemd's RuntimeDirectory=
# would put them: a directory of this test's own on tmpfs, removed with
# $tmpdir, so that a test that kills nbdkit leaves nothing in /run and
# no two tests share one.  ($held_dir for the tests that look into it.)
held_dir=$(mktemp -d /dev/shm/snapfg-${test_name}.XXXXXX)
export RUNTIME_DIRECTORY=$held_dir
# lose_tmpfs: what a crash of the system or a power cut does to tmpfs:
# write-back's held files are gone (the writes no flush covered are lost,
# as the NBD contract allows).  A test that plays a reboot calls it.
lose_tmpfs() { rm -f "$held_dir"/snapfg-held-*; }
export SNAPFG_SKIPPED_PARTS="$tmpdir/skipped-parts"
declare -A _nbdkit_pids=()     # pidfile -> pid of the nbdkit we started
declare -A _nbdkit_logs=()     # pidfile -> its stderr log
_cleanup_hooks=()

# on_exit COMMAND: run COMMAND (eval) during cleanup.
on_exit() { _cleanup_hooks+=("$1"); }

_proc_alive() {
    # A zombie still answers kill -0; look at the state in /proc.  Read
    # by the shell itself: the wait loops call this every 0.1 s, and an
    # awk for each call cost about 9 ms of CPU on a 2-CPU VM.  The
    # state follows the last ") ": the command name may hold spaces.
    local line st
    { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
    st=${line##*) }
    st=${st%% *}
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

_cleanup() {
    local rc=$? pf pid h _n
    set +e
    for h in "${_cleanup_hooks[@]}"; do eval "$h"; done
    for pf in "${!_nbdkit_pids[@]}"; do
        pid=${_nbdkit_pids[$pf]}
        if _proc_alive "$pid"; then
            kill -TERM "$pid" 2>/dev/null
            for ((_n = 0; _n < 50; _n++)); do _proc_alive "$pid" || break; sleep 0.1; done
            _proc_alive "$pid" && kill -KILL "$pid" 2>/dev/null
        fi
        wait "$pid" 2>/dev/null
    done
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
        for pf in "${!_nbdkit_logs[@]}"; do
            if [ -s "${_nbdkit_logs[$pf]}" ]; then
                echo "--- last lines of nbdkit log ${_nbdkit_logs[$pf]} ---" >&2
                tail -n 30 "${_nbdkit_logs[$pf]}" >&2
            fi
        done
    fi
    if [ "${KEEP_TMP:-0}" = 1 ]; then
        echo "$test_name: keeping $tmpdir and $held_dir" >&2
    else
        rm -rf "$tmpdir" "$held_dir"
    fi
    _children_cpu
    echo "$test_name: exit status $rc after $((SECONDS - _test_start)) s (CPU $_cpu s)"
    exit "$rc"
}
# _children_cpu: sets _cpu to the user + system seconds of the processes
# this test waited for (the servers, clients and tools it ran), whole
# seconds: what a test costs on a shared machine, where its wall time
# depends on the others.  Called in the test's own shell, never in $(...):
# a subshell has no children of its own.
_children_cpu() {
    local tf u s
    _cpu=-
    tf=$(mktemp) || return 0
    times >"$tf"
    { read -r _ _; read -r u s; } <"$tf"
    _cpu=$(awk -v u="$u" -v s="$s" 'function sec(t,  m) {
        m = t; sub(/m.*/, "", m); sub(/^[0-9]*m/, "", t); sub(/s$/, "", t)
        return m * 60 + t }
        BEGIN { printf "%d", sec(u) + sec(s) + 0.5 }')
    rm -f "$tf"
}
trap _cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- images ----------------------------------------------------------

# make_random_image FILE BYTES
make_random_image() {
    head -c "$2" /dev/urandom >"$1"
    [ "$(file_size "$1")" -eq "$2" ] || fail "could not create $1"
}

# make_sparse_image FILE MIB: random data in every other MiB (0, 2, ...),
# holes between
make_sparse_image() {
    local mib
    rm -f "$1"
    truncate -s $(($2 * 1048576)) "$1"
    for mib in $(seq 0 2 $(($2 - 1))); do
        head -c 1048576 /dev/urandom |
            dd of="$1" bs=1M seek="$mib" conv=notrunc status=none
    done
}

# make_zero_image FILE BYTES (allocated zeroes, not sparse)
make_zero_image() {
    head -c "$2" /dev/zero >"$1"
}

file_size() { stat -c %s "$1"; }

checksum() { sha256sum <"$1" | cut -d' ' -f1; }

# uri SOCK [EXPORT]
uri() { echo "nbd+unix:///${2:-}?socket=$1"; }

# test_files [SIZE]: set the names most tests use, all in $tmpdir:
# $origin (origin.img), $orig (original.img: the origin as it was made),
# $cow (cow.img), $expected (expected-origin.img), $sock, $pid
# (nbdkit.pid) and $ctlsock (ctl.sock).  With SIZE, also write SIZE
# random bytes to $origin and copy them to $orig.  A test that wants
# other names sets them after the call.
test_files() {
    origin="$tmpdir/origin.img"
    orig="$tmpdir/original.img"
    cow="$tmpdir/cow.img"
    expected="$tmpdir/expected-origin.img"
    sock="$tmpdir/sock"
    pid="$tmpdir/nbdkit.pid"
    ctlsock="$tmpdir/ctl.sock"
    if [ $# -gt 0 ]; then
        make_random_image "$origin" "$1"
        cp "$origin" "$orig"
    fi
}

# test_seed: set $seed from SNAPFG_TEST_SEED, or pick one, and say which,
# so that a failing run can be repeated.  Also seeds $RANDOM with it.
test_seed() {
    seed=${SNAPFG_TEST_SEED:-$(( (RANDOM << 15) | RANDOM ))}
    info "seed $seed (set SNAPFG_TEST_SEED to repeat)"
    RANDOM=$seed
}

# --- reading and writing exports with the standard clients -----------

# copy_export URI FILE: nbdcopy the whole export into FILE (a new file).
copy_export() {
    rm -f "$2"
    nbdcopy -- "$1" "$2"
}

# files_equal A B WHAT: the files are the same, byte for byte.
# export_equals URI FILE [WHAT]: the export, read with nbdcopy, is FILE
# byte for byte, size included.
# Both record a difference with check_fail and return 0, so that a test
# goes on and reports every broken case (finish fails it).
files_equal() {
    if ! cmp "$1" "$2" >"$tmpdir/cmp.out" 2>&1; then
        check_fail "$3: $(head -c 300 "$tmpdir/cmp.out")"
        return 0
    fi
    info "ok: $3"
}
# export_equals streams the export into cmp rather than through a
# file: a copy written out and read back cost twice the CPU, and the
# crash tests compare a 32 MiB export after every round.  cmp stops at
# the first difference (nbdcopy then fails on the closed pipe: the
# difference is what is reported); a short read from nbdcopy shows as
# "EOF on -", reported as nbdcopy's failure when nbdcopy failed.
export_equals() {
    local u=$1 f=$2 what=${3:-$1} st nst cst
    # (PIPESTATUS read first thing in either branch: under set -e too.)
    if nbdcopy -- "$u" - 2>"$tmpdir/nbdcopy.err" |
        cmp - "$f" >"$tmpdir/cmp.out" 2>&1; then
        st=("${PIPESTATUS[@]}")
    else
        st=("${PIPESTATUS[@]}")
    fi
    nst=${st[0]} cst=${st[1]}
    if [ "$nst" -ne 0 ] && { [ "$cst" -eq 0 ] || grep -q 'EOF on -' "$tmpdir/cmp.out"; }; then
        cat "$tmpdir/nbdcopy.err" >&2
        check_fail "$what: nbdcopy of $u failed"
        return 0
    fi
    if [ "$cst" -ne 0 ]; then
        check_fail "$what: $(head -c 300 "$tmpdir/cmp.out")"
        return 0
    fi
    info "ok: $what"
}

# fill_export URI OFFSET LENGTH BYTE: write LENGTH bytes of BYTE (a
# number: 0xab, 92) at OFFSET with nbdsh, then flush.  nbdsh is run as
# "$PY -m nbd": the nbdsh script's own "env python3" may find a Python
# without the nbd module.
fill_export() {
    "$PY" -m nbd -u "$1" -c "h.pwrite(bytes([$4]) * $3, $2)" -c 'h.flush()' ||
        fail "nbdsh: writing $3 bytes of $4 at $2 to $1 failed"
}

# export_description SOCK EXPORT: EXPORT's description as nbdinfo
# --list gives it; fails if EXPORT is not listed.
export_description() {
    nbdinfo --list --json "$(uri "$1")" | "$PY" -c '
import json, sys
for e in json.load(sys.stdin)["exports"]:
    if e["export-name"] == sys.argv[1]:
        print(e.get("description", ""))
        break
else:
    sys.exit("export %s is not listed" % sys.argv[1])' "$2" ||
        fail "nbdinfo --list on $1: no export $2"
}

# --- nbdkit ----------------------------------------------------------

# start_snapfg SOCK PIDFILE PARAMS...
# Starts nbdkit -f in the background serving the plugin with PARAMS and
# waits until it accepts connections.  Environment variables set on the
# call (e.g. SNAPFG_TEST_DELAY_US=200 start_snapfg ...) reach nbdkit.
# Extra nbdkit options go in $NBDKIT_OPTS (word-split).
start_snapfg() {
    local sock=$1 pidfile=$2 pid st n
    shift 2
    local log="$pidfile.log"
    rm -f "$sock" "$pidfile"
    # shellcheck disable=SC2086
    nbdkit -f --exit-with-parent ${NBDKIT_OPTS:-} -U "$sock" -P "$pidfile" \
        "$SNAPFG_PLUGIN" "$@" 2>"$log" &
    pid=$!
    _nbdkit_pids[$pidfile]=$pid
    _nbdkit_logs[$pidfile]=$log
    for ((n = 0; n < 300; n++)); do
        if [ -S "$sock" ] && [ -s "$pidfile" ]; then
            return 0
        fi
        if ! _proc_alive "$pid"; then
            st=0; wait "$pid" || st=$?
            unset "_nbdkit_pids[$pidfile]"
            cat "$log" >&2
            fail "nbdkit exited with status $st during start-up: nbdkit $SNAPFG_PLUGIN $*"
        fi
        sleep 0.1
    done
    fail "nbdkit did not create $sock within 30 s: nbdkit $SNAPFG_PLUGIN $*"
}

# stop_nbdkit PIDFILE: SIGTERM, wait for the exit, and require a clean
# exit status (a crash at shutdown fails the test).  Disconnect every
# client first: nbdkit 1.32 does not exit while clients are connected.
stop_nbdkit() {
    local pidfile=$1 pid st=0 i
    pid=${_nbdkit_pids[$pidfile]:-}
    [ -n "$pid" ] || fail "stop_nbdkit: no nbdkit started with $pidfile"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 1; i <= 300; i++)); do
        _proc_alive "$pid" || break
        # Under ThreadSanitizer a SIGTERM that reaches nbdkit before its
        # main loop sleeps in poll() can be lost by the runtime (see
        # tests/run-sanitizers.sh): repeat it there, every 2 s.  nbdkit
        # treats a second SIGTERM like the first.
        if [ "${SNAPFG_SANITIZER:-}" = thread ] && [ $((i % 20)) = 0 ]; then
            kill -TERM "$pid" 2>/dev/null || true
        fi
        sleep 0.1
    done
    if _proc_alive "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        unset "_nbdkit_pids[$pidfile]"
        fail "nbdkit (pid $pid) did not exit within 30 s of SIGTERM"
    fi
    wait "$pid" || st=$?
    unset "_nbdkit_pids[$pidfile]"
    if [ "$st" -ne 0 ]; then
        tail -n 30 "$pidfile.log" >&2 || true
        fail "nbdkit exited with status $st (crash at shutdown?)"
    fi
}

# nbdkit_pid PIDFILE: the pid of an nbdkit started with start_snapfg.
nbdkit_pid() { echo "${_nbdkit_pids[$1]:-}"; }

# wait_nbdkit_death PIDFILE SECONDS: wait for an nbdkit started with
# start_snapfg to exit on its own; sets nbdkit_status to its exit status
# (128+signal), or to "alive" if it still runs after SECONDS.  (Not in a
# $(...): only the shell that started it can collect its status.)
nbdkit_status=
wait_nbdkit_death() {
    local pidfile=$1 pid=${_nbdkit_pids[$1]:-} st=0 n
    [ -n "$pid" ] || fail "wait_nbdkit_death: no nbdkit started with $1"
    for ((n = 0; n < $2 * 10; n++)); do
        _proc_alive "$pid" || break
        sleep 0.1
    done
    if _proc_alive "$pid"; then
        nbdkit_status=alive
        return 0
    fi
    { wait "$pid" || st=$?; } 2>/dev/null
    unset "_nbdkit_pids[$pidfile]"
    nbdkit_status=$st
}

# expect_start_failure ERRFILE PARAMS...: nbdkit with PARAMS must refuse
# to start (non-zero exit, no crash, no hang).  Its stderr goes to
# ERRFILE.  --run true makes a successful start exit at once, so a
# plugin that wrongly accepts the parameters is caught (and cleans up).
expect_start_failure() { _start_refused "$@" || fail "$_why"; }

# try_start_failure ERRFILE PARAMS...: the same, but records the failure
# with check_fail and returns 1 instead of exiting.
try_start_failure() {
    _start_refused "$@" && return 0
    check_fail "$_why"
    return 1
}

# _start_refused ERRFILE PARAMS...: the check of the two above; on
# failure, what is wrong in $_why.
_why=
_start_refused() {
    local errfile=$1 st=0
    shift
    timeout 60 nbdkit -U - --run true "$SNAPFG_PLUGIN" "$@" \
        >"$errfile.out" 2>"$errfile" || st=$?
    case $st in
        1) return 0 ;;
        0) _why="nbdkit started but must refuse: $*" ;;
        124) _why="nbdkit hung (60 s) instead of refusing: $*" ;;
        *) cat "$errfile" >&2
           _why="nbdkit exited with status $st (crash?) instead of a clean error: $*" ;;
    esac
    return 1
}

# expect_start_success PARAMS...: nbdkit with PARAMS starts and exits
# cleanly.
expect_start_success() {
    local errfile="$tmpdir/start-success.err" st=0
    timeout 60 nbdkit -U - --run true "$SNAPFG_PLUGIN" "$@" \
        >/dev/null 2>"$errfile" || st=$?
    if [ "$st" -ne 0 ]; then
        cat "$errfile" >&2
        fail "nbdkit failed to start (status $st) with valid parameters: $*"
    fi
}

# expect_stderr ERRFILE STRING...: ERRFILE must contain every STRING.
expect_stderr() { _stderr_has "$@" || fail "$_why"; }

# try_stderr ERRFILE STRING...: the same, but records the failure with
# check_fail and returns 1.
try_stderr() {
    _stderr_has "$@" && return 0
    check_fail "$_why"
    return 1
}

_stderr_has() {
    local f=$1 s
    shift
    for s in "$@"; do
        if ! grep -qF -- "$s" "$f"; then
            echo "--- stderr was: ---" >&2
            cat "$f" >&2
            _why="error message does not mention '$s'"
            return 1
        fi
    done
}

# time_it LABEL COMMAND...: run COMMAND and report how long it took.
time_it() {
    local label=$1 t0=$SECONDS
    shift
    "$@"
    info "$label: $((SECONDS - t0)) s"
}
