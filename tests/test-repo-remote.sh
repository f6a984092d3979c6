#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup -H into a repository: a backup host's job, the control
# requests and the data over one ssh connection to the server host (a
# real sshd on 127.0.0.1, its own host key and known_hosts,
# StrictHostKeyChecking=yes), the repository on the backup host.
#
# - A full and an incremental run of a disk, each restored byte for
#   byte; the incremental reads only what changed.
# - The server has no snapshot left and only the last run's checkpoint.
# - Two disks at one instant into the repository over -H: both sessions
#   are channels of one ssh connection (one login), both disks restore
#   byte for byte, list shows them in one group, no ssh is left.

set -euo pipefail
source "$(dirname "$0")/repo-functions.sh"
require_backup_tools
requires ssh ssh-keygen
sshd=/usr/sbin/sshd
[ -x "$sshd" ] || skip "no $sshd (install openssh-server)"

repo_server a $((32 * 1024 * 1024))
repo=$(repo_loc remote)
ctl=$ctl_a
origin=$origin_a

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

# rrb ARGS...: snapfg-backup -H through the test's sshd.
rrb() {
    rb -H "$user@127.0.0.1:$port" \
        --ssh-option "IdentityFile=$sd/user_key" --ssh-option IdentitiesOnly=yes \
        --ssh-option "UserKnownHostsFile=$sd/known_hosts" --ssh-option GlobalKnownHostsFile=/dev/null \
        --ssh-option StrictHostKeyChecking=yes \
        --remote-snapfgctl "$SNAPFGCTL" -S "$ctl" -u "$origin" "$@"
}
remote_run() {   # N
    local n=$1 st=0
    save_origin "$origin" "$tmpdir/expect-d-$n.img"
    rrb --json backup "$repo" --disk d || st=$?
    [ "$st" -eq 0 ] || { cat "$tmpdir/rb.log" >&2; fail "remote run $n: exit $st"; }
    cp "$tmpdir/rb.log" "$tmpdir/run-d-$n.json"
    info "remote run $n: $(tail -n 1 "$tmpdir/rb.log")"
    rb_restores "$repo" d "$n"
}

rb init "$repo" || fail "init: $(cat "$tmpdir/rb.log")"
remote_run 1
[ "$(run_field d 1 type)" = full ] || check_fail "remote run 1 is not full"
# One chunk's worth of changes: the incremental reads that chunk only.
write_random_blocks "$origin" 8 1 $((4 * 1024 * 1024))
remote_run 2
[ "$(run_field d 2 type)" = incremental ] || check_fail "remote run 2 is not incremental"
read2=$(run_field d 2 bytes_read)
[ "$read2" -le $((4 * 1024 * 1024)) ] ||
    check_fail "remote run 2 read $read2 bytes for changes within one chunk"
rb_restores "$repo" d 1
grep -q 'Accepted publickey' "$sd/sshd.log" ||
    check_fail "sshd logged no session: $(tail -n 5 "$sd/sshd.log")"
grep -q 'streamlocal' "$sd/sshd.log" ||
    check_fail "sshd logged no forwarded Unix socket"
[ -z "$(repo_snapshots "$ctl")" ] || check_fail "remote runs left snapshots: $(repo_snapshots "$ctl")"
[ "$(repo_checkpoints "$ctl" | wc -l)" -eq 1 ] ||
    check_fail "checkpoints after the remote runs: $(repo_checkpoints "$ctl" | tr '\n' ' ')"

# --- two disks at one instant over one ssh connection (issue 31) --------
make_random_image "$tmpdir/b.img" $((8 * 1024 * 1024))
start_snapfg "$tmpdir/b.sock" "$tmpdir/b.pid" origin="$tmpdir/b.img" \
    state="$tmpdir/b.state" control="$tmpdir/b.ctl"
save_origin "$origin" "$tmpdir/expect-d-3.img"
cp "$tmpdir/b.img" "$tmpdir/expect-e-1.img"
logins=$(grep -c 'Accepted publickey' "$sd/sshd.log" || true)
st=0
rb -H "$user@127.0.0.1:$port" \
    --ssh-option "IdentityFile=$sd/user_key" --ssh-option IdentitiesOnly=yes \
    --ssh-option "UserKnownHostsFile=$sd/known_hosts" --ssh-option GlobalKnownHostsFile=/dev/null \
    --ssh-option StrictHostKeyChecking=yes --remote-snapfgctl "$SNAPFGCTL" --json \
    backup "$repo" --disk d -S "$ctl" -u "$origin" \
    --disk e -S "$tmpdir/b.ctl" -u "$(uri "$tmpdir/b.sock")" || st=$?
[ "$st" -eq 0 ] || { cat "$tmpdir/rb.log" >&2; fail "two disks over -H into the repository: exit $st"; }
n=$(( $(grep -c 'Accepted publickey' "$sd/sshd.log" || true) - logins ))
[ "$n" -eq 1 ] && info "ok: two disks over -H: one ssh login for both sessions" ||
    check_fail "two disks over -H: $n ssh logins, expected 1 (one shared connection)"
grep -q "one ssh connection to" "$tmpdir/rb.log" ||
    check_fail "the group did not say it shares one ssh connection: $(cat "$tmpdir/rb.log")"
rb_restores "$repo" d 3
rb_restores "$repo" e 1
[ "$(repo_json "$repo" 'j["disks"][0]["runs"][-1]["group"]' --disk d)" = \
  "$(repo_json "$repo" 'j["disks"][0]["runs"][-1]["group"]' --disk e)" ] &&
    info "ok: list shows both disks' runs in one group" ||
    check_fail "the two disks' runs are not in one group"
pgrep -f -- "-p $port " >/dev/null && check_fail "an ssh of the group is still running: $(pgrep -af -- "-p $port ")"
[ -z "$(repo_snapshots "$ctl")$(repo_snapshots "$tmpdir/b.ctl")" ] ||
    check_fail "the group over -H left snapshots"
stop_nbdkit "$tmpdir/b.pid"

finish
