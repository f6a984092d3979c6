#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup -H: the whole job from a backup host over one ssh
# connection, against a real sshd on 127.0.0.1 (its own host key, port,
# configuration and a throwaway user key; known_hosts is the test's own,
# StrictHostKeyChecking=yes).
#
# - A wrong host key: refused (exit 4, ssh's message), nothing made on
#   the server or here.
# - A full and two incrementals, each restored byte for byte; the
#   control requests go through "snapfgctl --stdio" on the server, the
#   data through the forwarded NBD socket.
# - The ssh client killed mid-copy: the server drops the run's snapshot
#   by itself (snapfgctl --stdio --drop-on-hangup), the chain recorded
#   so far restores as before, the next run is a correct incremental.
# - Two disks (two servers) at one instant with -H: one ssh connection
#   (one login) carries both sessions; a wrong host key refuses the group
#   before any server is asked.

set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
require_backup_tools
requires ssh ssh-keygen jq
sshd=/usr/sbin/sshd
[ -x "$sshd" ] || skip "no $sshd (install openssh-server)"

backup_server $((32 * 1024 * 1024))

# --- sshd on a free port of 127.0.0.1 -------------------------------------
sd="$tmpdir/ssh"
mkdir -m 700 "$sd"
ssh-keygen -q -t ed25519 -N '' -f "$sd/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$sd/other_host_key"
ssh-keygen -q -t ed25519 -N '' -f "$sd/user_key"
cp "$sd/user_key.pub" "$sd/authorized_keys"
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
user=$(id -un)
cat >"$sd/sshd_config" <<EOF
ListenAddress 127.0.0.1:$port
HostKey $sd/host_key
PidFile $sd/sshd.pid
AuthorizedKeysFile $sd/authorized_keys
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowUsers $user
UsePAM no
StrictModes no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
LogLevel DEBUG1
EOF
# sshd as root needs its privilege separation directory.
[ "$(id -u)" -ne 0 ] || mkdir -p /run/sshd
"$sshd" -t -f "$sd/sshd_config" 2>"$sd/sshd.err" ||
    skip "sshd refuses its test configuration: $(cat "$sd/sshd.err")"
"$sshd" -D -e -f "$sd/sshd_config" 2>"$sd/sshd.log" &
sshd_pid=$!
on_exit "kill $sshd_pid 2>/dev/null || true"
up=no
for _ in $(seq 100); do
    if "$PY" -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "$port" 2>/dev/null; then
        up=yes; break
    fi
    kill -0 "$sshd_pid" 2>/dev/null || break
    sleep 0.1
done
[ "$up" = yes ] || { cat "$sd/sshd.log" >&2; fail "sshd did not start on 127.0.0.1:$port"; }
echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$sd/host_key.pub")" >"$sd/known_hosts"
echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$sd/other_host_key.pub")" >"$sd/wrong_known_hosts"

# rbk KNOWN_HOSTS ARGS...: snapfg-backup -H through the test's sshd.
rbk() {
    local kh=$1
    shift
    bk -H "$user@127.0.0.1:$port" \
        --ssh-option "IdentityFile=$sd/user_key" --ssh-option IdentitiesOnly=yes \
        --ssh-option "UserKnownHostsFile=$kh" --ssh-option GlobalKnownHostsFile=/dev/null \
        --ssh-option StrictHostKeyChecking=yes \
        --remote-snapfgctl "$SNAPFGCTL" -S "$ctl" -u "$origin" "$@"
}

# --- a wrong host key -------------------------------------------------
st=0; rbk "$sd/wrong_known_hosts" backup "$dir" || st=$?
if [ "$st" -eq 4 ] && grep -qi 'host key' "$tmpdir/bk.log"; then
    info "ok: a wrong host key is refused: $(grep -i 'host key' "$tmpdir/bk.log" | head -n 1)"
else
    check_fail "wrong host key: exit $st, expected 4: $(cat "$tmpdir/bk.log")"
fi
[ ! -e "$dir" ] || check_fail "a refused connection created $dir"
[ -z "$(our_snapshots "$ctl")$(our_checkpoints "$ctl")" ] ||
    check_fail "a refused connection left $(our_snapshots "$ctl") $(our_checkpoints "$ctl")"

# --- a full and two incrementals ------------------------------------------
run_ok() {
    local n=$1 st=0
    save_origin "$origin" "$tmpdir/expect-$n.img"
    rbk "$sd/known_hosts" backup "$dir" || st=$?
    if [ "$st" -ne 0 ]; then
        cat "$tmpdir/bk.log" >&2
        fail "remote run $n: exit $st"
    fi
    info "run $n: $(tail -n 1 "$tmpdir/bk.log")"
    restore_equals "$dir" "$n" "$tmpdir/expect-$n.img" "remote run $n restores byte for byte"
}
run_ok 1
[ "$(manifest_field "$dir" 1 type)" = full ] || check_fail "run 1 is not full"
write_random_blocks "$origin" 60 1 "$size"
run_ok 2
write_random_blocks "$origin" 60 2 "$size"
run_ok 3
for n in 2 3; do
    [ "$(manifest_field "$dir" "$n" type)" = incremental ] || check_fail "run $n is not incremental"
done
restore_equals "$dir" 1 "$tmpdir/expect-1.img" "run 1 still restores after two incrementals"
[ -z "$(our_snapshots "$ctl")" ] || check_fail "remote runs left snapshots: $(our_snapshots "$ctl")"
[ "$(our_checkpoints "$ctl" | sort)" = "$(chain_checkpoints "$dir")" ] ||
    check_fail "checkpoints after run 3: $(our_checkpoints "$ctl" | tr '\n' ' ')"
# The control requests came through the bridge, the data through ssh.
grep -q 'Accepted publickey' "$sd/sshd.log" ||
    check_fail "sshd logged no session: $(tail -n 5 "$sd/sshd.log")"
grep -q 'direct-streamlocal\|streamlocal' "$sd/sshd.log" ||
    check_fail "sshd logged no forwarded Unix socket: $(grep -i 'forward\|channel' "$sd/sshd.log" | tail -n 3)"

# --- the ssh client killed mid-copy ---------------------------------------
write_random_blocks "$origin" 300 3 "$size"
SNAPFG_BACKUP_TEST_STOP_AFTER=$((1024 * 1024)) \
    "$SNAPFG_BACKUP" -H "$user@127.0.0.1:$port" \
    --ssh-option "IdentityFile=$sd/user_key" --ssh-option IdentitiesOnly=yes \
    --ssh-option "UserKnownHostsFile=$sd/known_hosts" --ssh-option StrictHostKeyChecking=yes \
    --remote-snapfgctl "$SNAPFGCTL" -S "$ctl" -u "$origin" backup "$dir" \
    >"$tmpdir/bk-drop.log" 2>&1 &
bpid=$!
stopped=no
for _ in $(seq 600); do
    if [ "$(awk '{print $3}' "/proc/$bpid/stat" 2>/dev/null)" = T ]; then
        stopped=yes; break
    fi
    sleep 0.1
done
[ "$stopped" = yes ] || { cat "$tmpdir/bk-drop.log" >&2; fail "the remote backup did not stop midway"; }
[ -n "$(our_snapshots "$ctl")" ] || check_fail "no snapshot while the remote run was stopped"
ssh_pid=$(pgrep -P "$bpid" -x ssh || true)
[ -n "$ssh_pid" ] || fail "no ssh child of snapfg-backup ($bpid)"
kill -KILL "$ssh_pid"
gone=no
for _ in $(seq 300); do
    [ -z "$(our_snapshots "$ctl")" ] && { gone=yes; break; }
    sleep 0.1
done
[ "$gone" = yes ] && info "ok: the server dropped the snapshot of the cut-off run" ||
    check_fail "the snapshot of the cut-off run is still there: $(our_snapshots "$ctl")"
kill -CONT "$bpid"
st=0; wait "$bpid" || st=$?
[ "$st" -ne 0 ] || check_fail "the cut-off run exited 0"
[ -z "$(manifest_field "$dir" 4 seq)" ] || check_fail "the cut-off run was recorded"
ls "$dir" | grep -q partial && check_fail "the cut-off run left $(ls "$dir")"
restore_equals "$dir" 3 "$tmpdir/expect-3.img" "run 3 restores after the cut-off run"
run_ok 4
[ "$(manifest_field "$dir" 4 type)" = incremental ] || check_fail "run 4 is not incremental"
[ "$(our_checkpoints "$ctl" | sort)" = "$(chain_checkpoints "$dir")" ] ||
    check_fail "checkpoints after run 4: $(our_checkpoints "$ctl" | tr '\n' ' ')"
pgrep -f -- "-p $port " >/dev/null && check_fail "an ssh of the runs is still running: $(pgrep -af -- "-p $port ")"

# --- an NBD socket missing on the remote host (issue 30, D9) -----------
# The message names the socket as the host sees it, not the local end of
# ssh's forward.
missing="$tmpdir/no-such-nbd.sock"
st=0; rbk "$sd/known_hosts" -u "nbd+unix:///?socket=$missing" backup "$dir" || st=$?
if [ "$st" -eq 4 ] && grep -q "$missing on $user@127.0.0.1" "$tmpdir/bk.log" &&
   ! grep -q 'snapfg-backup-[A-Za-z0-9]*/nbd.sock:' "$tmpdir/bk.log"; then
    info "ok: a missing remote NBD socket is named: $(grep -m1 "$missing" "$tmpdir/bk.log")"
else
    check_fail "missing remote NBD socket: exit $st, expected 4 naming $missing: $(cat "$tmpdir/bk.log")"
fi
[ -z "$(our_snapshots "$ctl")" ] || check_fail "the run without its NBD socket left $(our_snapshots "$ctl")"

# --- two disks at one instant over one ssh connection (issue 31) --------
# A second server; the group's sessions are channels of one ssh
# connection (one login in sshd's log), both disks restore byte for
# byte, and no ssh is left afterwards.  With a wrong host key the shared
# connection fails before either server is asked for anything.
make_random_image "$tmpdir/b.img" $((8 * 1024 * 1024))
start_snapfg "$tmpdir/b.sock" "$tmpdir/b.pid" origin="$tmpdir/b.img" \
    state="$tmpdir/b.state" control="$tmpdir/b.ctl"
gdir="$tmpdir/group"
group_bk() { # KNOWN_HOSTS ARGS...
    local kh=$1
    shift
    bk -H "$user@127.0.0.1:$port" \
        --ssh-option "IdentityFile=$sd/user_key" --ssh-option IdentitiesOnly=yes \
        --ssh-option "UserKnownHostsFile=$kh" --ssh-option GlobalKnownHostsFile=/dev/null \
        --ssh-option StrictHostKeyChecking=yes --remote-snapfgctl "$SNAPFGCTL" \
        backup "$gdir" --disk a -S "$ctl" -u "$origin" \
        --disk b -S "$tmpdir/b.ctl" -u "$(uri "$tmpdir/b.sock")" "$@"
}
st=0; group_bk "$sd/wrong_known_hosts" || st=$?
if [ "$st" -eq 4 ] && grep -qi 'host key' "$tmpdir/bk.log"; then
    info "ok: two disks, a wrong host key: refused before any server was asked: $(grep -m1 'connection the disks share' "$tmpdir/bk.log" | cut -c1-160)"
else
    check_fail "two disks, wrong host key: exit $st, expected 4: $(cat "$tmpdir/bk.log")"
fi
[ -z "$(our_snapshots "$ctl")$(our_snapshots "$tmpdir/b.ctl")" ] ||
    check_fail "the refused group left snapshots"
save_origin "$origin" "$tmpdir/group-a.img"
cp "$tmpdir/b.img" "$tmpdir/group-b.img"
logins=$(grep -c 'Accepted publickey' "$sd/sshd.log" || true)
st=0; group_bk "$sd/known_hosts" || st=$?
[ "$st" -eq 0 ] || { cat "$tmpdir/bk.log" >&2; fail "the group backup over -H: exit $st"; }
n=$(( $(grep -c 'Accepted publickey' "$sd/sshd.log" || true) - logins ))
[ "$n" -eq 1 ] && info "ok: two disks over -H: one ssh login for both sessions" ||
    check_fail "two disks over -H: $n ssh logins, expected 1 (one shared connection)"
grep -q "one ssh connection to" "$tmpdir/bk.log" ||
    check_fail "the group did not say it shares one ssh connection: $(cat "$tmpdir/bk.log")"
for d in a b; do
    bk restore "$gdir" "$tmpdir/group-r-$d.img" --disk "$d" --at 1 ||
        { cat "$tmpdir/bk.log" >&2; check_fail "restore of disk $d"; continue; }
    files_equal "$tmpdir/group-r-$d.img" "$tmpdir/group-$d.img" \
        "two disks over -H: disk $d restores byte for byte"
done
pgrep -f -- "-p $port " >/dev/null && check_fail "an ssh of the group is still running: $(pgrep -af -- "-p $port ")"
stop_nbdkit "$tmpdir/b.pid"

finish
