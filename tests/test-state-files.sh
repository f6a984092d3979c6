#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The files of the state directory and the catalogue at run time (issue
# 19 rows 4 and 8):
#   - a symbolic link planted as STATE.d/NAME.cow (to a file that does
#     not exist, or to a precious one) makes "create NAME" fail: nothing
#     is created or written through it, the link is left as it is;
#   - a file already at STATE.d/NAME.cow that no snapshot uses is never
#     reused or overwritten;
#   - --cow naming a file the server writes itself is refused: the
#     catalogue, its temporary file STATE.tmp, a file in STATE.d (another
#     snapshot's store, a checkpoint bitmap, a new name), a link to one
#     of them; afterwards the catalogue is rewritten (create, drop) and a
#     restart works;
#   - a state directory of another user, or one or a catalogue's
#     directory writable by others, refuses the start, naming the path
#     and saying how to fix it; nothing is changed;
#   - state= naming what is not a regular file (/dev/null, a FIFO, a
#     directory) is refused as such (issue 29 item 7).
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

MiB=$((1024 * 1024))
test_files $MiB
st="$tmpdir/st"
mkdir -m 0700 "$st"
state="$st/cat.json"
sd="$state.d"
start() { rm -f "$ctlsock"; start_snapfg "$sock" "$pid" origin="$origin" state="$state" control="$ctlsock"; }

start
ctl_ok "create a0 (state directory)" "$ctlsock" create a0
ctl_ok "checkpoint c1" "$ctlsock" checkpoint create c1

info "=== planted links and files in the state directory"
ln -s "$tmpdir/victim.img" "$sd/evil.cow"
ctl_refused "create evil through a dangling link" "a symbolic link of that name" "$ctlsock" create evil
[ ! -e "$tmpdir/victim.img" ] && info "ok: nothing created where the link points" ||
    check_fail "create evil created $tmpdir/victim.img through the link"
[ -L "$sd/evil.cow" ] || check_fail "the planted link is gone"
# All zeros: a file that run-time create would take as a new store.
make_zero_image "$tmpdir/precious" $MiB
sum=$(checksum "$tmpdir/precious")
ln -s "$tmpdir/precious" "$sd/evil2.cow"
ctl_refused "create evil2 through a link to a file" "a symbolic link of that name" "$ctlsock" create evil2
[ "$(checksum "$tmpdir/precious")" = "$sum" ] && info "ok: the link's target is unchanged" ||
    check_fail "create evil2 wrote through the link into $tmpdir/precious"
echo "left here" >"$sd/left.cow"
sum=$(checksum "$sd/left.cow")
ctl_refused "create left over a file already there" "already in the state directory" "$ctlsock" create left
[ "$(checksum "$sd/left.cow")" = "$sum" ] && info "ok: the file already there is unchanged" ||
    check_fail "create left changed $sd/left.cow"
rm -f "$sd/evil.cow" "$sd/evil2.cow" "$sd/left.cow"

info "=== --cow naming the server's own files"
ctl_refused "--cow the catalogue's temporary file" "temporary file" "$ctlsock" create s1 --cow "$state.tmp"
[ ! -e "$state.tmp" ] || check_fail "$state.tmp was created"
ctl_refused "--cow the catalogue" "is the catalogue" "$ctlsock" create s2 --cow "$state"
ctl_refused "--cow a new name in the state directory" "in the state directory" "$ctlsock" create s3 --cow "$sd/new.cow"
[ ! -e "$sd/new.cow" ] || check_fail "$sd/new.cow was created"
ctl_refused "--cow a checkpoint bitmap" "in the state directory" "$ctlsock" create s4 --cow "$sd/c1.cbt"
ctl_refused "--cow another snapshot's store" "a0" "$ctlsock" create s5 --cow "$sd/a0.cow"
ln -s "$state.tmp" "$tmpdir/link-to-tmp"
ctl_refused "--cow a link to the temporary file" "symbolic link" "$ctlsock" create s6 --cow "$tmpdir/link-to-tmp"
[ ! -e "$state.tmp" ] || check_fail "$state.tmp was created through a link"
ln -s "$state" "$tmpdir/link-to-catalogue"
ctl_refused "--cow a link to the catalogue" "is the catalogue" "$ctlsock" create s7 --cow "$tmpdir/link-to-catalogue"
ctl_ok "create b1 --cow elsewhere (the catalogue is rewritten)" "$ctlsock" create b1 --cow "$tmpdir/b1.cow"
ctl_ok "drop b1" "$ctlsock" drop b1
stop_nbdkit "$pid"
start
listed "$sock" a0 && info "ok: a restart works and brings a0 back" || check_fail "a0 is not back"
stop_nbdkit "$pid"

info "=== owners and modes"
# refused_start WHAT MSG...: the start fails saying MSG, nothing changes.
listing() { (cd "$tmpdir" && find st -printf '%p %y %m %U %s\n' | sort && find st -type f -exec sha256sum {} + | sort); }
refused_start() {
    local what=$1
    shift
    listing >"$tmpdir/before.txt"
    if try_start_failure "$tmpdir/start.err" origin="$origin" state="$state"; then
        try_stderr "$tmpdir/start.err" "$@" &&
            info "ok: $what: refused: $(grep -m1 -F "$1" "$tmpdir/start.err" | cut -c1-200)"
    fi
    listing >"$tmpdir/after.txt"
    cmp -s "$tmpdir/before.txt" "$tmpdir/after.txt" || check_fail "$what: the files changed"
}
chmod 0777 "$st"
refused_start "the catalogue's directory writable by every user" "$st" "chmod go-w"
chmod 0700 "$st"
chmod 0770 "$sd"
refused_start "the state directory writable by its group" "$sd" "chmod go-w"
chmod 0700 "$sd"
if [ "$(id -u)" = 0 ]; then
    chown 65534 "$sd"
    refused_start "the state directory of another user" "$sd" "chown 0"
    chown 0 "$sd"
    chown 65534 "$state"
    refused_start "the catalogue of another user" "$state" "chown 0"
    chown 0 "$state"
else
    skip_part "the owner cases: not running as root"
fi
start
listed "$sock" a0 && info "ok: with owners and modes put right the server starts" || check_fail "a0 is not back"
stop_nbdkit "$pid"

info "=== a state= path that is not a regular file"
# Refused for what it is, not with the owner and mode advice of a file
# (issue 29 item 7); nothing is made beside it (no PATH.d).
# not_regular WHAT PATH KIND: the start with state=PATH fails saying so.
not_regular() {
    local what=$1 path=$2 kind=$3
    if try_start_failure "$tmpdir/notreg.err" origin="$origin" state="$path"; then
        try_stderr "$tmpdir/notreg.err" "state=$path: not a regular file" "$kind" &&
            info "ok: $what: refused: $(grep -m1 -F "not a regular file" "$tmpdir/notreg.err" | cut -c1-200)"
        ! grep -qF "chmod" "$tmpdir/notreg.err" || check_fail "$what: the message gives the chmod advice of a file"
    fi
    [ ! -e "$path.d" ] || check_fail "$what: $path.d was created"
}
not_regular "state=/dev/null" /dev/null "a character device"
mkfifo -m 0600 "$st/fifo.json"
not_regular "a FIFO" "$st/fifo.json" "a FIFO"
mkdir -m 0700 "$st/dir.json"
not_regular "a directory" "$st/dir.json" "a directory"
finish
