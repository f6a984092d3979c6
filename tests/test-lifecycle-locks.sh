#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Locks (issue 9 item 1): while a server uses them, the origin, every COW
# store and the catalogue are locked (OFD locks on the whole file).
#
# A first server runs with origin=A, cow=C and state=S.  A second server
# must refuse to start on the same COW (another origin), on the same
# origin (another COW), and on the same catalogue (another origin), each
# time naming the file and saying it is in use, and leaving the files
# unchanged; a run-time create on a COW that another server holds is
# refused the same way.  snapfgctl inspect still reads a locked store.
# After a kill -9 of the first server the kernel has dropped its locks:
# a new server starts on the same files.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

MiB=$((1024 * 1024))
A="$tmpdir/a.img"; B="$tmpdir/b.img"
make_random_image "$A" $((4 * MiB))
make_random_image "$B" $((4 * MiB))
C="$tmpdir/c.cow"; S="$tmpdir/state.json"
test_files

start_snapfg "$sock" "$pid" origin="$A" cow="$C" state="$S" control="$ctlsock"
# --flush: with write-back the data may still be held when nbdcopy
# exits; the checksums below must see the files as they stay.
nbdcopy --flush -- <(head -c $MiB /dev/urandom) "$(uri "$sock" origin)" ||
    fail "writing the origin failed"
sumA=$(checksum "$A"); sumC=$(checksum "$C"); sumS=$(checksum "$S")

# refused WHAT FILE PARAMS...: a second server must refuse, naming FILE.
refused() {
    local what=$1 file=$2
    shift 2
    if try_start_failure "$tmpdir/start.err" "$@"; then
        try_stderr "$tmpdir/start.err" "$file" "in use" &&
            info "ok: $what: refused: $(grep -m1 'in use' "$tmpdir/start.err")"
    fi
}
refused "a second server on the same COW" "$C" origin="$B" cow="$C"
refused "a second server on the same origin" "$A" origin="$A" cow="$tmpdir/other.cow"
[ ! -e "$tmpdir/other.cow" ] && info "ok: the refused server left no COW file behind" ||
    check_fail "the refused server created $tmpdir/other.cow"
refused "a second server on the same catalogue" "$S" origin="$B" state="$S"
refused "a second server on the same origin and catalogue" "$A" origin="$A" state="$S"
[ "$(checksum "$A")" = "$sumA" ] && [ "$(checksum "$C")" = "$sumC" ] &&
    [ "$(checksum "$S")" = "$sumS" ] &&
    info "ok: origin, COW and catalogue unchanged by the refused servers" ||
    check_fail "a refused server changed the origin, the COW or the catalogue"

# A server on B holding D; the first server may not take D at run time.
D="$tmpdir/d.cow"
start_snapfg "$tmpdir/sock2" "$tmpdir/nbdkit2.pid" origin="$B" cow="$D"
sumD=$(checksum "$D")
ctl_refused "run-time create on a COW another server holds" "in use" "$ctlsock" create s2 --cow "$D"
grep -qF "$D" "$tmpdir/ctl.err" || check_fail "the refusal does not name $D: $(cat "$tmpdir/ctl.err")"
[ "$(checksum "$D")" = "$sumD" ] && info "ok: the other server's COW is unchanged" ||
    check_fail "the refused create changed $D"
stop_nbdkit "$tmpdir/nbdkit2.pid"

# inspect takes no lock and writes nothing.
"$SNAPFGCTL" inspect "$C" >"$tmpdir/inspect.out" 2>&1 &&
    grep -q '^valid: 1$' "$tmpdir/inspect.out" &&
    info "ok: snapfgctl inspect reads the locked store" ||
    check_fail "snapfgctl inspect on a locked store: $(cat "$tmpdir/inspect.out")"
[ "$(checksum "$C")" = "$sumC" ] || check_fail "inspect changed the store"

# kill -9: the kernel releases OFD locks with the process.
kill -KILL "$(nbdkit_pid "$pid")"
wait_nbdkit_death "$pid" 30
rm -f "$sock" "$ctlsock"
start_snapfg "$sock" "$pid" origin="$A" cow="$C" state="$S" control="$ctlsock"
ctl_ok "after a kill -9 a new server starts on the same files" "$ctlsock" status snapshot
stop_nbdkit "$pid"

# A read-only origin (here: a file nobody may not write) takes a shared
# lock: several read-only servers may serve it (each with its own COW),
# a writable one may not, as with a shared activation in LVM.
if [ "$(id -u)" != 0 ] || ! have setpriv; then
    skip_part "read-only origin: needs root and setpriv"
else
    chmod 755 "$tmpdir"
    ro="$tmpdir/ro"; mkdir "$ro"; chown 65534:65534 "$ro"
    cp "$A" "$ro/origin.img"; chown 0:0 "$ro/origin.img"; chmod 644 "$ro/origin.img"
    # setpriv itself in the background (it execs nbdkit, so $! is the
    # server), registered for stop_nbdkit and the cleanup: through a
    # shell function $! was a subshell, and killing it left the server
    # running after the test.
    start_ro() {
        setpriv --reuid=65534 --regid=65534 --clear-groups \
            nbdkit -f -U "$ro/$1.sock" "$SNAPFG_PLUGIN" origin="$ro/origin.img" \
            cow="$ro/$1.cow" 2>"$ro/$1.log" &
        _nbdkit_pids[$ro/$1]=$!
        wait_until 30 test -S "$ro/$1.sock" || { cat "$ro/$1.log" >&2; fail "read-only server $1 did not start"; }
    }
    start_ro r1
    start_ro r2
    info "ok: two servers share a read-only origin (shared locks)"
    refused "a writable server on an origin read-only servers hold" "$ro/origin.img"         origin="$ro/origin.img" cow="$ro/w.cow"
    stop_nbdkit "$ro/r1"
    stop_nbdkit "$ro/r2"
fi
finish
