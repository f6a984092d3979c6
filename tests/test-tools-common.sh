#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# What snapfgctl and snapfg-backup share (tools/common/):
#
# - one table of exit statuses: an unreachable server is 4 in both (not
#   3, snapfg-backup's "incremental impossible"); a socket that accepts
#   but never answers is 5 in both, after --timeout seconds; a --timeout
#   out of range (snapfgctl 0 to 86400, snapfg-backup 1 to 86400) is a
#   usage error (2) that names the value;
# - -V and --version in both;
# - --json: one JSON object on stdout, also when the command failed
#   (with "exit_status" and "error"); a backup run's object has its
#   duration and rate;
# - every backup run ends with a line with its duration and rate;
#   --progress=always prints progress lines without a terminal,
#   --progress=never none;
# - checkpoint list: the creation time in ISO 8601 and which backup
#   directory made each checkpoint (HOST:DIR);
# - snapfgctl --stdio bridges stdin/stdout to the control socket, and
#   with --drop-on-hangup drops at EOF the snapshots created through it;
# - snapfgctl does not link libnbd, GnuTLS or libxml2.

set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
require_backup_tools
requires jq

backup_server $((16 * 1024 * 1024))

# expect_status WHAT WANT CMD...: CMD exits WANT; its output in $tmpdir/out.
expect_status() {
    local what=$1 want=$2 st=0
    shift 2
    timeout 120 "$@" >"$tmpdir/out" 2>"$tmpdir/err" || st=$?
    if [ "$st" -eq "$want" ]; then
        info "ok: $what: exit $st: $(head -n 1 "$tmpdir/err")"
    else
        check_fail "$what: exit $st, expected $want: $(cat "$tmpdir/err")"
    fi
}
# json_field FILE FILTER: jq -r FILTER of the one JSON line in FILE.
json_field() {
    [ "$(wc -l <"$1")" -eq 1 ] || { echo "(not one line)"; return; }
    jq -r "$2" <"$1" 2>/dev/null || echo "(not JSON)"
}

# --- -V / --version -------------------------------------------------------
for tool in "$SNAPFGCTL" "$SNAPFG_BACKUP"; do
    for v in -V --version; do
        expect_status "$(basename "$tool") $v" 0 "$tool" "$v"
        grep -qx "$(basename "$tool") [0-9][0-9.]*" "$tmpdir/out" ||
            check_fail "$(basename "$tool") $v printed '$(cat "$tmpdir/out")'"
    done
done

# --- unreachable: the same status in both -------------------------------
nosock="$tmpdir/no-such.sock"
expect_status "snapfgctl, no server" 4 "$SNAPFGCTL" -S "$nosock" status
expect_status "snapfg-backup, no server" 4 \
    "$SNAPFG_BACKUP" -S "$nosock" -u "$origin" backup "$tmpdir/unreached"
[ ! -e "$tmpdir/unreached" ] || check_fail "a run against no server created its backup directory"
expect_status "snapfgctl --json, no server" 4 "$SNAPFGCTL" --json -S "$nosock" status
[ "$(json_field "$tmpdir/out" '.ok, .exit_status' | tr '\n' ' ')" = "false 4 " ] ||
    check_fail "snapfgctl --json without a server printed '$(cat "$tmpdir/out")'"
expect_status "snapfg-backup --json, no server" 4 \
    "$SNAPFG_BACKUP" --json -S "$nosock" -u "$origin" backup "$tmpdir/unreached"
[ "$(json_field "$tmpdir/out" '.ok, .exit_status' | tr '\n' ' ')" = "false 4 " ] &&
    json_field "$tmpdir/out" .error | grep -q "$nosock" ||
    check_fail "snapfg-backup --json without a server printed '$(cat "$tmpdir/out")'"

expect_status "snapfg-backup, no NBD server" 4 \
    "$SNAPFG_BACKUP" -S "$ctl" -u "$(uri "$nosock")" backup "$tmpdir/nonbd"
[ -z "$(our_snapshots "$ctl")$(our_checkpoints "$ctl")" ] ||
    check_fail "a run without its NBD server left $(our_snapshots "$ctl") $(our_checkpoints "$ctl")"

# --- --timeout values out of range: a usage error (2) naming the value ---
for v in x -1 86401 2s; do
    expect_status "snapfgctl --timeout=$v" 2 "$SNAPFGCTL" --timeout="$v" -S "$ctl" status
    grep -qF "snapfgctl: --timeout: not a number of seconds (0 for none, at most 86400): $v" "$tmpdir/err" ||
        check_fail "snapfgctl --timeout=$v: $(cat "$tmpdir/err")"
done
for v in x 0 86401; do
    expect_status "snapfg-backup --timeout=$v" 2 \
        "$SNAPFG_BACKUP" --timeout="$v" -S "$ctl" -u "$origin" backup "$tmpdir/badtimeout"
    grep -qF "snapfg-backup: --timeout: not a number of seconds (1 to 86400): $v" "$tmpdir/err" ||
        check_fail "snapfg-backup --timeout=$v: $(cat "$tmpdir/err")"
done
[ ! -e "$tmpdir/badtimeout" ] || check_fail "a refused --timeout created the backup directory"

# --- a socket that accepts but never answers: --timeout, status 5 -------
mute="$tmpdir/mute.sock"
"$PY" - "$mute" <<'EOF' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
held = []
end = time.time() + 120
s.settimeout(1)
while time.time() < end:
    try:
        held.append(s.accept()[0])      # read nothing, answer nothing
    except socket.timeout:
        pass
EOF
mute_pid=$!
on_exit "kill $mute_pid 2>/dev/null || true"
for _ in $(seq 100); do [ -S "$mute" ] && break; sleep 0.1; done
expect_status "snapfgctl --timeout 2, silent server" 5 \
    "$SNAPFGCTL" --timeout 2 -S "$mute" status
grep -q "no reply within 2 s" "$tmpdir/err" || check_fail "snapfgctl's timeout message: $(cat "$tmpdir/err")"
expect_status "snapfgctl merge --wait --timeout 2, silent server" 5 \
    "$SNAPFGCTL" --timeout 2 -S "$mute" merge x --wait
expect_status "snapfg-backup --timeout 2, silent server" 5 \
    "$SNAPFG_BACKUP" --timeout 2 -S "$mute" -u "$origin" backup "$tmpdir/muted"
[ ! -e "$tmpdir/muted" ] || check_fail "a run against a silent server created its backup directory"
kill "$mute_pid" 2>/dev/null || true

# --- a backup run: the last line, --json, --progress ----------------------
expect_status "backup --progress=always --json" 0 \
    "$SNAPFG_BACKUP" -S "$ctl" -u "$origin" backup "$dir" --progress=always --json
grep -q '^full backup: [0-9]* of 16 MiB' "$tmpdir/err" ||
    check_fail "--progress=always without a terminal printed no progress line: $(cat "$tmpdir/err")"
tail -n 1 "$tmpdir/err" | grep -q '^snapfg-backup: run 1: full backup .* in [0-9.]* s ([0-9.]* MiB/s)$' ||
    check_fail "the run's last line: $(tail -n 1 "$tmpdir/err")"
[ "$(json_field "$tmpdir/out" '.ok, .command, .seq, .type' | tr '\n' ' ')" = "true backup 1 full " ] ||
    check_fail "backup --json printed '$(cat "$tmpdir/out")'"
[ "$(json_field "$tmpdir/out" '(.duration_s >= 0) and (.rate_bytes_per_s >= 0)')" = true ] ||
    check_fail "backup --json: no duration or rate: $(cat "$tmpdir/out")"
write_random_blocks "$origin" 20 1 "$size"
expect_status "backup --progress=never" 0 \
    "$SNAPFG_BACKUP" -S "$ctl" -u "$origin" --progress=never backup "$dir"
grep -q ' of [0-9]* MiB (' "$tmpdir/err" && check_fail "--progress=never printed progress"
tail -n 1 "$tmpdir/err" | grep -q 'run 2: incremental backup .* MiB/s)$' ||
    check_fail "the incremental's last line: $(tail -n 1 "$tmpdir/err")"
[ ! -s "$tmpdir/out" ] || check_fail "without --json stdout has '$(cat "$tmpdir/out")'"
expect_status "restore --json" 0 "$SNAPFG_BACKUP" --json restore "$dir" "$tmpdir/r.img"
[ "$(json_field "$tmpdir/out" '.ok')" = true ] || check_fail "restore --json printed '$(cat "$tmpdir/out")'"
expect_status "--progress=sometimes" 2 "$SNAPFG_BACKUP" --progress=sometimes restore "$dir" x

# --- checkpoint list: ISO 8601 and the backup directory -------------------
expect_status "checkpoint list" 0 "$SNAPFGCTL" -S "$ctl" checkpoint list
ckpt=$(manifest_field "$dir" 2 checkpoint)
line=$(grep "^$ckpt	" "$tmpdir/out" || true)
today=$(date -u +%Y-%m-%d)
case $line in
    *"created ${today}T"[0-9][0-9]:[0-9][0-9]:[0-9][0-9]Z*) info "ok: checkpoint list: ISO 8601 time" ;;
    *) check_fail "checkpoint list: no ISO 8601 time in '$line'" ;;
esac
case $line in
    *"	by $(hostname):$dir") info "ok: checkpoint list shows the backup directory" ;;
    *) check_fail "checkpoint list: not 'by $(hostname):$dir' in '$line'" ;;
esac
"$SNAPFGCTL" -S "$ctl" --json checkpoint list >"$tmpdir/out"
[ "$(jq -r --arg n "$ckpt" '.checkpoints[] | select(.name == $n) | .owner' <"$tmpdir/out")" = "$(hostname):$dir" ] ||
    check_fail "checkpoint list --json: owner $(cat "$tmpdir/out")"

# --- snapfgctl --stdio ----------------------------------------------------
printf '%s\n' '{"cmd":"list"}' 'not json' '{"cmd":"create","name":"kept","checkpoint":"ck1"}' |
    timeout 60 "$SNAPFGCTL" --stdio -S "$ctl" >"$tmpdir/out" 2>"$tmpdir/err" ||
    check_fail "snapfgctl --stdio: $(cat "$tmpdir/err")"
[ "$(jq -r .ok <"$tmpdir/out" | tr '\n' ' ')" = "true false true " ] ||
    check_fail "snapfgctl --stdio replied '$(cat "$tmpdir/out")'"
"$SNAPFGCTL" -S "$ctl" status kept >/dev/null 2>&1 ||
    check_fail "without --drop-on-hangup the bridge dropped its snapshot"
"$SNAPFGCTL" -S "$ctl" drop kept >/dev/null
"$SNAPFGCTL" -S "$ctl" checkpoint drop ck1 >/dev/null
printf '%s\n' '{"cmd":"create","name":"held"}' '{"cmd":"create","name":"gone"}' '{"cmd":"drop","name":"gone"}' |
    timeout 60 "$SNAPFGCTL" --stdio --drop-on-hangup -S "$ctl" >"$tmpdir/out" 2>"$tmpdir/err" ||
    check_fail "snapfgctl --stdio --drop-on-hangup: $(cat "$tmpdir/err")"
grep -q "dropped snapshot held" "$tmpdir/err" || check_fail "--drop-on-hangup said: $(cat "$tmpdir/err")"
st=0; "$SNAPFGCTL" -S "$ctl" status held >/dev/null 2>&1 || st=$?
[ "$st" -eq 1 ] || check_fail "--drop-on-hangup left snapshot 'held' (status exit $st)"
expect_status "snapfgctl --stdio, no server" 4 "$SNAPFGCTL" --stdio -S "$nosock"
expect_status "snapfgctl --stdio with a command" 2 "$SNAPFGCTL" --stdio -S "$ctl" status

# --- snapfgctl merge --wait --progress=always: lines without a terminal --
msock="$tmpdir/msock"; mctl="$tmpdir/mctl"; mpid="$tmpdir/m.pid"
make_random_image "$tmpdir/m-origin.img" $((4 * 1024 * 1024))
# 32 exceptions, merged 16 at a time with 1 s per batch: about 2 s.
SNAPFG_TEST_MERGE_DELAY_US=1000000 \
    start_snapfg "$msock" "$mpid" origin="$tmpdir/m-origin.img" control="$mctl"
"$SNAPFGCTL" -S "$mctl" create m --cow "$tmpdir/m.cow" --chunk-size 4096 >/dev/null ||
    fail "create m failed"
failures_io write "$(uri "$msock" origin)" 0 $((32 * 4096)) --seed 7 >/dev/null ||
    fail "origin write of 32 chunks failed"
expect_status "merge --wait --progress=always" 0 \
    "$SNAPFGCTL" -S "$mctl" merge m --wait --progress=always
grep -q '^merging m: [0-9]* of [0-9]* chunks' "$tmpdir/err" ||
    check_fail "merge --wait --progress=always printed no progress line: $(cat "$tmpdir/err")"
expect_status "snapfgctl --progress=sometimes" 2 "$SNAPFGCTL" -S "$mctl" status --progress=sometimes
stop_nbdkit "$mpid"

# --- snapfgctl links only what it uses (issue 32) ------------------------
# libnbd (and with it GnuTLS and libxml2) is loaded only for inspect of
# an NBD URI, which test-nbd-backends.sh runs.
if have ldd; then
    linked=$(ldd "$SNAPFGCTL" | grep -E 'libnbd|libgnutls|libxml2' || true)
    [ -z "$linked" ] || check_fail "snapfgctl links $(echo "$linked" | awk '{print $1}' | tr '\n' ' ')"
else
    check_fail "no ldd to check what snapfgctl links"
fi

finish
