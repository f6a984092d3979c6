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
# kill our nbdkits of snapfg here), then the files over the disks
# (nbdfuse is a client of the disks), then the disks.
_stop_powercut() {
    local pf s
    for pf in "${!_nbdkit_pids[@]}"; do
        kill -KILL "${_nbdkit_pids[$pf]}" 2>/dev/null
        wait "${_nbdkit_pids[$pf]}" 2>/dev/null
        unset "_nbdkit_pids[$pf]"
    done
    unmount_disk_files
    for s in "${!_disks[@]}"; do kill_disks "$s"; done
}
on_exit _stop_powercut

# The disks as files: nbdfuse shows an export of the disks' nbdkit as
# one regular file, so that snapfg opens it with its file backend
# (pwrite, fdatasync, O_DIRECT) as it would a file on a disk with a
# volatile write cache.  nbdfuse writes through to the export (no
# write-back cache of the kernel's in between), and every fsync or
# fdatasync of the file is a flush of that export.
#
#   require_disk_files             skip unless nbdfuse and /dev/fuse work
#   mount_disk_file DIR URI        the export at URI as DIR/nbd
#   unmount_disk_files             unmount every one of them

declare -A _fuse=()               # mount point -> nbdfuse's pid

require_disk_files() {
    requires nbdfuse
    [ -c /dev/fuse ] && [ -w /dev/fuse ] || skip "/dev/fuse is missing or not writable (nbdfuse needs it)"
}

mount_disk_file() {
    local d=$1 u=$2
    mkdir -p "$d"
    rm -f "$d.pid"
    nbdfuse -P "$d.pid" "$d" "$u" 2>>"$d.log" &
    _fuse[$d]=$!
    for _ in $(seq 300); do
        [ -s "$d.pid" ] && [ -f "$d/nbd" ] && return 0
        _proc_alive "${_fuse[$d]}" ||
            { cat "$d.log" >&2; fail "nbdfuse could not mount $u on $d"; }
        sleep 0.1
    done
    fail "nbdfuse did not mount $u on $d within 30 s"
}

unmount_disk_files() {
    local d p
    for d in "${!_fuse[@]}"; do
        p=${_fuse[$d]}
        umount "$d" 2>/dev/null || umount -l "$d" 2>/dev/null || true
        for _ in $(seq 100); do _proc_alive "$p" || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
        unset "_fuse[$d]"
    done
}
