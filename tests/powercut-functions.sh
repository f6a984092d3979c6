# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Helpers for the power-cut tests: one nbdkit serving the test plugin
# tests/nbdkit-powercut-plugin.c ($POWERCUT_PLUGIN), whose exports are
# the disks of one machine with volatile write caches, and the client
# driver tests/powercut-io.py.  Source after functions.sh.
#
#   start_disks SOCK PLUGIN-ARGS...   the disks' nbdkit on SOCK
#   wait_cut REPORT                   wait until the plugin wrote REPORT
#   kill_disks SOCK                   SIGKILL it (the machine is off)
#   stop_disks SOCK                   SIGTERM, clean exit required
#   pcio ARGS...                      run tests/powercut-io.py
#
# snapfg is a client of the disks' nbdkit, which (nbdkit 1.32) does not
# exit on SIGTERM while a client is connected: stop snapfg first.

# shellcheck shell=bash

if [ -z "${POWERCUT_PLUGIN:-}" ]; then
    POWERCUT_PLUGIN=$(_find_first \
        "$PWD/tests/.libs/nbdkit-powercut-plugin.so" \
        "$_fn_dir/.libs/nbdkit-powercut-plugin.so") || true
fi

# require_powercut: the plugin, the driver's Python, nbdcopy.
require_powercut() {
    require_snapfg
    requires nbdcopy nbdinfo cmp
    [ -n "$POWERCUT_PLUGIN" ] && [ -f "$POWERCUT_PLUGIN" ] ||
        fail "power-cut plugin not found (POWERCUT_PLUGIN='${POWERCUT_PLUGIN:-}'): run 'make tests/nbdkit-powercut-plugin.la' first"
    [ -x "$PY" ] && "$PY" -c 'import nbd' 2>/dev/null ||
        skip "$PY with the libnbd 'nbd' module is needed"
}

pcio() { PYTHONPATH=$_fn_dir "$PY" "$_fn_dir/powercut-io.py" "$@"; }

declare -A _disks=()              # socket -> pid

start_disks() {
    local s=$1
    shift
    rm -f "$s"
    nbdkit -f -U "$s" "$POWERCUT_PLUGIN" "$@" 2>>"$s.log" &
    _disks[$s]=$!
    for _ in $(seq 300); do
        [ -S "$s" ] && return 0
        _proc_alive "${_disks[$s]}" ||
            { cat "$s.log" >&2; fail "the power-cut plugin exited at start-up: $*"; }
        sleep 0.1
    done
    fail "the power-cut plugin did not create $s within 30 s"
}

# wait_cut REPORT: the plugin writes REPORT once the cut is complete
# (the surviving sectors are in the image files).
wait_cut() {
    for _ in $(seq 300); do
        [ -f "$1" ] && return 0
        sleep 0.1
    done
    fail "no power cut within 30 s ($1 was not written)"
}

kill_disks() {
    local p=${_disks[$1]:-}
    [ -n "$p" ] || return 0
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
    unset "_disks[$1]"
    rm -f "$1"
}

stop_disks() {
    local s=$1 p=${_disks[$1]:-} st=0
    [ -n "$p" ] || fail "stop_disks: no disks on $s"
    kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 100); do _proc_alive "$p" || break; sleep 0.1; done
    if _proc_alive "$p"; then
        kill_disks "$s"
        fail "the power-cut plugin on $s did not exit within 10 s of SIGTERM"
    fi
    wait "$p" || st=$?
    unset "_disks[$s]"
    [ "$st" -eq 0 ] || { tail "$s.log" >&2; fail "the power-cut plugin on $s exited with status $st"; }
}

# On exit: snapfg first (functions.sh's cleanup runs after the hooks, so
# kill our nbdkits of snapfg here), then the disks.
_stop_powercut() {
    local pf s
    for pf in "${!_nbdkit_pids[@]}"; do
        kill -KILL "${_nbdkit_pids[$pf]}" 2>/dev/null
        wait "${_nbdkit_pids[$pf]}" 2>/dev/null
        unset "_nbdkit_pids[$pf]"
    done
    for s in "${!_disks[@]}"; do kill_disks "$s"; done
}
on_exit _stop_powercut
