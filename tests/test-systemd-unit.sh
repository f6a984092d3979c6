#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# contrib/systemd/snapfg@.service:
#  1. systemd-analyze verify accepts it without a warning (skipped when
#     systemd-analyze is not installed);
#  2. it has what a deployment relies on: Restart=on-failure, the
#     runtime directory for the sockets, the state directory holding the
#     catalogue (state=), the environment file of the instance;
#  3. its ExecStartPre and ExecStart lines, with the instance's
#     directories moved under $tmpdir and the example environment file
#     (ORIGIN= pointed at a test disk), start the built plugin; the
#     origin export serves the disk; after SIGKILL the same lines (what
#     Restart=on-failure runs) start it again over the stale socket and
#     the origin holds what was written, and a snapshot created through
#     the control socket without --cow (its store in the state directory)
#     comes back from the catalogue.  (Run only when the plugin knows
#     state=.)
#  4. A stop with a client connected and origin writes held by
#     write-back (the committer paused with SNAPFG_TEST_WRITEBACK_PAUSE
#     while they are written, then let go): the unit's ExecStop (a
#     control "flush"), then SIGTERM, which nbdkit does not act on while
#     the client is connected, then SIGKILL (what TimeoutStopSec ends
#     in, here at once): the disk holds every acknowledged write.
#     (Without ExecStop the writes are lost: the committer, let go just
#     before, has not applied them when the SIGKILL comes.)
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg

unit=$top_srcdir/contrib/systemd/snapfg@.service
conf=$top_srcdir/contrib/systemd/snapfg.conf.example
[ -f "$unit" ] || fail "$unit is missing"
[ -f "$conf" ] || fail "$conf is missing"

# --- 1. systemd-analyze verify -----------------------------------------
if have systemd-analyze; then
    # --man=no: the man pages named in Documentation= need not be
    # installed here.  A template is verified as instance "i".
    st=0
    systemd-analyze verify --man=no "$unit" >"$tmpdir/verify.out" 2>&1 || st=$?
    if [ "$st" -ne 0 ] || [ -s "$tmpdir/verify.out" ]; then
        cat "$tmpdir/verify.out" >&2
        check_fail "systemd-analyze verify $unit: status $st, output above"
    else
        info "ok: systemd-analyze verify accepts the unit ($(systemd-analyze --version | head -n 1))"
    fi
else
    skip_part "systemd-analyze verify: systemd-analyze is not installed (Debian package systemd)"
fi

# --- 2. what the unit must say -----------------------------------------
# unit_line KEY: the value of KEY= in [Service], continuation lines joined.
unit_value() {
    awk -v k="$1" '
        /^\[/ { sect = $0 }
        sect == "[Service]" && !cont && index($0, k "=") == 1 { v = substr($0, length(k) + 2); cont = /\\$/; sub(/\\$/, "", v); next }
        cont { line = $0; cont = /\\$/; sub(/\\$/, "", line); sub(/^[ \t]+/, " ", line); v = v line; next }
        END { print v }' "$unit"
}
for kv in Restart=on-failure RuntimeDirectory=snapfg/%i StateDirectory=snapfg/%i \
          EnvironmentFile=/etc/snapfg/%i.conf Type=simple; do
    k=${kv%%=*} want=${kv#*=}
    got=$(unit_value "$k")
    [ "$got" = "$want" ] && info "ok: $k=$got" || check_fail "unit: $k='$got', expected '$want'"
done
exec_start=$(unit_value ExecStart)
exec_pre=$(unit_value ExecStartPre)
exec_stop=$(unit_value ExecStop)
case $exec_stop in
    *" -S /run/snapfg/%i/control.sock "*flush)
        info "ok: ExecStop flushes through the control socket" ;;
    *) check_fail "ExecStop does not run 'snapfgctl -S /run/snapfg/%i/control.sock ... flush' (nbdkit does not exit on SIGTERM with clients connected, and the SIGKILL must find nothing held): '$exec_stop'" ;;
esac
case $exec_start in
    *" state=/var/lib/snapfg/%i/"*) info "ok: state= is in the state directory" ;;
    *) check_fail "ExecStart has no state= under /var/lib/snapfg/%i: $exec_start" ;;
esac
case $exec_start in
    *" -f "*) ;;
    *) check_fail "ExecStart lacks -f (Type=simple needs nbdkit in the foreground): $exec_start" ;;
esac

# --- 3. the command lines, run -------------------------------------------
# (The help is read whole first: under pipefail, a grep -q that stops
# reading early could make the pipeline fail and skip the test.)
plugin_help=$(nbdkit "$SNAPFG_PLUGIN" --help 2>/dev/null || true)
if ! grep -q 'state=' <<<"$plugin_help"; then
    skip_part "3, the unit's command lines: the plugin has no state= parameter in this tree"
    finish
    exit 0
fi
requires nbdcopy nbdinfo cmp
run=$tmpdir/run/snapfg/t1 state=$tmpdir/state/snapfg/t1
mkdir -p "$run" "$state"
chmod 0700 "$state"
size=$((4 * 1024 * 1024))
make_random_image "$tmpdir/disk.img" "$size"
cp "$tmpdir/disk.img" "$tmpdir/disk-orig.img"
# The environment file as systemd reads it (KEY=value lines), ORIGIN=
# pointed at the test disk.
declare -A env=()
while IFS= read -r line; do
    case $line in ''|'#'*) continue ;; esac
    env[${line%%=*}]=${line#*=}
done <"$conf"
[ -n "${env[ORIGIN]:-}" ] || check_fail "$conf sets no ORIGIN="
env[ORIGIN]=$tmpdir/disk.img

# expand LINE: systemd's substitutions for instance t1 in our directories.
expand() {
    local s=$1 k
    s=${s//\/run\/snapfg\/%i/$run}
    s=${s//\/var\/lib\/snapfg\/%i/$state}
    s=${s//%i/t1}
    for k in "${!env[@]}"; do
        s=${s//\$\{$k\}/${env[$k]}}
        s=${s//\$$k/${env[$k]}}
    done
    echo "$s"
}
read -r -a pre <<<"$(expand "$exec_pre")"
read -r -a cmd <<<"$(expand "$exec_start")"
# the plugin by path (not installed here), nbdkit from PATH
for i in "${!cmd[@]}"; do
    [ "${cmd[i]}" = snapfg ] && cmd[i]=$SNAPFG_PLUGIN
done
cmd[0]=nbdkit
sock=$run/nbd.sock
info "ExecStartPre: ${pre[*]}"
info "ExecStart: ${cmd[*]}"

svc_pid=
start_unit() {
    "${pre[@]}" || fail "ExecStartPre failed: ${pre[*]}"
    "${cmd[@]}" 2>>"$tmpdir/unit.log" &
    svc_pid=$!
    for _ in $(seq 300); do
        [ -S "$sock" ] && nbdinfo --size "$(uri "$sock" origin)" >/dev/null 2>&1 && return 0
        _proc_alive "$svc_pid" || { cat "$tmpdir/unit.log" >&2; fail "the unit's nbdkit exited during start-up"; }
        sleep 0.1
    done
    fail "the unit's nbdkit did not serve $sock within 30 s"
}
stop_unit() {
    kill -"$1" "$svc_pid" 2>/dev/null || true
    wait "$svc_pid" 2>/dev/null || true
    svc_pid=
}
on_exit '[ -n "$svc_pid" ] && stop_unit KILL'

start_unit
nbdcopy "$(uri "$sock" origin)" "$tmpdir/got.img"
cmp "$tmpdir/got.img" "$tmpdir/disk.img" && info "ok: the unit's server serves ORIGIN" ||
    check_fail "the unit's server does not serve ORIGIN byte for byte"
# a snapshot in the state directory (create without --cow, via state=)
ctl=$run/control.sock
[ -S "$ctl" ] || check_fail "no control socket at $ctl"
"$SNAPFGCTL" -S "$ctl" create nightly >"$tmpdir/create.out" 2>&1 ||
    check_fail "snapfgctl create nightly (no --cow) failed: $(cat "$tmpdir/create.out")"
ls "$state"/*.d/nightly.cow >/dev/null 2>&1 &&
    info "ok: the snapshot's store is in the state directory: $(cd "$state" && ls -d ./*.d/nightly.cow)" ||
    check_fail "no nightly.cow under $state: $(cd "$state" && find . | tr '\n' ' ')"
head -c 65536 /dev/urandom >"$tmpdir/w.bin"
"$PY" - "$(uri "$sock" origin)" "$tmpdir/w.bin" <<'EOF'
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(open(sys.argv[2], 'rb').read(), 65536)
h.flush()
h.shutdown()
EOF
cp "$tmpdir/disk-orig.img" "$tmpdir/expect.img"
dd if="$tmpdir/w.bin" of="$tmpdir/expect.img" bs=65536 seek=1 conv=notrunc status=none

# what Restart=on-failure does after a crash: the same lines again
stop_unit KILL
[ -S "$sock" ] && info "the killed server left $sock behind"
start_unit
nbdcopy "$(uri "$sock" origin)" "$tmpdir/got2.img"
cmp "$tmpdir/got2.img" "$tmpdir/expect.img" &&
    info "ok: restarted by the unit's command lines over the stale socket; the origin holds the write" ||
    check_fail "after the restart the origin differs from what was written"
"$SNAPFGCTL" -S "$ctl" list >"$tmpdir/list.out" 2>&1 || true
grep -q nightly "$tmpdir/list.out" && info "ok: the catalogue in the state directory brought snapshot nightly back" ||
    check_fail "after the restart snapshot nightly is gone: $(cat "$tmpdir/list.out")"
nbdcopy "$(uri "$sock" nightly)" "$tmpdir/nightly.img" 2>"$tmpdir/nightly.err" ||
    check_fail "nbdcopy of nightly failed: $(cat "$tmpdir/nightly.err")"
cmp -s "$tmpdir/nightly.img" "$tmpdir/disk-orig.img" && info "ok: nightly = the disk as it was at create" ||
    check_fail "nightly differs from the disk at create"
stop_unit TERM

# --- 4. a stop with a client connected and writes held -------------------
stop_cmd=()
if [ -n "$exec_stop" ]; then
    read -r -a stop_cmd <<<"$(expand "$exec_stop")"
    stop_cmd[0]=${stop_cmd[0]#-}        # "-": failure ignored by systemd
    [ "$(basename "${stop_cmd[0]}")" != snapfgctl ] || stop_cmd[0]=$SNAPFGCTL
    info "ExecStop: ${stop_cmd[*]}"
fi
pause=$tmpdir/pause
touch "$pause"
export SNAPFG_TEST_WRITEBACK_PAUSE=$pause
start_unit
unset SNAPFG_TEST_WRITEBACK_PAUSE
cp "$tmpdir/expect.img" "$tmpdir/expect2.img"
# The client (a VM, say): 24 first writes of 64 KiB after the snapshot,
# no flush, and it stays connected until it is killed.
"$PY" - "$(uri "$sock" origin)" "$tmpdir/expect2.img" "$tmpdir/client.written" <<'EOF' &
import nbd, os, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
with open(sys.argv[2], "r+b") as m:
    for i in range(24):
        data = os.urandom(65536)
        off = (2 + 2 * i) * 65536
        h.pwrite(data, off)
        m.seek(off)
        m.write(data)
with open(sys.argv[3], "w") as f:
    f.write("written\n")
while True:
    time.sleep(60)
EOF
client_pid=$!
on_exit 'kill -KILL $client_pid 2>/dev/null'
for _ in $(seq 600); do
    if [ -f "$tmpdir/client.written" ] || ! _proc_alive "$client_pid"; then
        break
    fi
    sleep 0.1
done
[ -f "$tmpdir/client.written" ] || fail "the client's writes did not complete"
held=$("$SNAPFGCTL" -S "$ctl" stats --json |
       "$PY" -c 'import json,sys; print([x for x in json.load(sys.stdin)["exports"] if x["export"] == "origin"][0].get("writeback_held_writes", 0))')
[ "$held" -gt 0 ] && info "ok: $held writes held, the client connected" ||
    check_fail "no write is held: the stop test tests nothing"
rm -f "$pause"
if [ -n "$exec_stop" ]; then
    "${stop_cmd[@]}" >"$tmpdir/stop.out" 2>&1 ||
        check_fail "ExecStop failed: $(cat "$tmpdir/stop.out")"
fi
# SIGTERM, and at once the SIGKILL that ends TimeoutStopSec (nbdkit does
# not exit on SIGTERM with the client connected): at once, so that the
# committer, let go a moment ago, has not applied the writes on its own
# meanwhile: the disk has them only if ExecStop made sure of it.
kill -TERM "$svc_pid"
stop_unit KILL
kill -KILL "$client_pid" 2>/dev/null || true
wait "$client_pid" 2>/dev/null || true
cmp "$tmpdir/disk.img" "$tmpdir/expect2.img" >"$tmpdir/cmp.out" 2>&1 &&
    info "ok: after ExecStop, SIGTERM and SIGKILL the disk holds every acknowledged write" ||
    check_fail "after the unit's stop (ExecStop, SIGTERM, SIGKILL) acknowledged writes are lost: $(cat "$tmpdir/cmp.out")"
finish
