#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg demo: serve a disk and a snapshot of it, take a backup of the
# snapshot while the disk is being written, and show that the backup is
# the disk as it was when the snapshot was taken.
#
#   contrib/demo.sh            make a 256 MiB demo disk and use it
#   contrib/demo.sh ORIGIN     use your own file or block device (the demo
#                              then never writes to it: it backs up the
#                              snapshot and checks the backup)
#
# Needs nbdkit, the snapfg plugin (installed by "make install", or built
# in this tree), nbdinfo/nbdcopy (libnbd-bin), qemu-io (qemu-utils).
#
# On a terminal it leaves the server running at the end, until Ctrl-C,
# so you can try the printed commands; otherwise (stdin not a terminal,
# or SNAPFG_DEMO_INTERACTIVE=0) it stops the server and exits.
#
# Environment:
#   SNAPFG_PLUGIN         plugin to use (path or name; default: the one
#                         built in this tree, else the installed "snapfg")
#   SNAPFG_DEMO_DIR       where to put the socket, COW file and images
#                         (default: a new directory under /var/tmp)
#   SNAPFG_DEMO_SIZE      size of the demo disk (default 256M)
#   SNAPFG_DEMO_KEEP=1    keep the directory at the end
#   SNAPFG_DEMO_ARGS      extra plugin parameters, e.g. "store=transient";
#                         with control=SOCKET the demo adds
#                         state=DIR/catalogue.json (unless state= is given)

set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")

# Debian's python3 has the libnbd module (nbdsh); prefer it.
export PATH="/usr/bin:/bin:$PATH"

user_origin=${1:-}
size=${SNAPFG_DEMO_SIZE:-256M}

bold=
norm=
if [ -t 1 ]; then
    bold=$(printf '\033[1m')
    norm=$(printf '\033[0m')
fi
step() { printf '\n%s==> %s%s\n' "$bold" "$*" "$norm"; }
say() { printf '    %s\n' "$*"; }
die() { echo "demo: error: $*" >&2; exit 1; }

for c in nbdkit nbdinfo nbdcopy qemu-io sha256sum cmp; do
    command -v "$c" >/dev/null 2>&1 ||
        die "'$c' not found (apt-get install nbdkit libnbd-bin qemu-utils coreutils diffutils)"
done

# --- which plugin -----------------------------------------------------------
if [ -n "${SNAPFG_PLUGIN:-}" ]; then
    plugin=$SNAPFG_PLUGIN
elif [ -f "$top/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so" ]; then
    plugin=$top/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so
    # Installed and the same (contrib/run.sh installs it): use its name.
    plugindir=$(nbdkit --dump-config 2>/dev/null | sed -n 's/^plugindir=//p')
    if [ -n "$plugindir" ] && cmp -s "$plugin" "$plugindir/nbdkit-snapfg-plugin.so"; then
        plugin=snapfg
    fi
elif nbdkit snapfg --version >/dev/null 2>&1; then
    plugin=snapfg
else
    die "no snapfg plugin: build it (make) or install it (make install), or set SNAPFG_PLUGIN"
fi

# --- the run directory ------------------------------------------------------
if [ -n "${SNAPFG_DEMO_DIR:-}" ]; then
    dir=$SNAPFG_DEMO_DIR
    mkdir -p "$dir"
    made_dir=0
else
    dir=$(mktemp -d "${TMPDIR:-/var/tmp}/snapfg-demo.XXXXXX")
    made_dir=1
fi
dir=$(cd "$dir" && pwd)
sock=$dir/nbd.sock
pidfile=$dir/nbdkit.pid
log=$dir/nbdkit.log
cow=$dir/snapshot.cow
backup=$dir/backup.img
stopfile=$dir/stop-writer

nbdkit_pid=
writer_pid=

stop_server() {
    # nbdkit 1.32 does not exit on SIGTERM while clients are connected:
    # every client of ours has finished by the time this runs.
    local pid=$nbdkit_pid
    [ -n "$pid" ] || return 0
    nbdkit_pid=
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "demo: nbdkit still has clients connected after 10 s; killing it" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    set +e
    if [ -n "$writer_pid" ]; then
        touch "$stopfile"
        wait "$writer_pid" 2>/dev/null
    fi
    stop_server
    if [ "$made_dir" = 1 ] && [ "${SNAPFG_DEMO_KEEP:-0}" != 1 ]; then
        rm -rf "$dir"
    else
        echo "demo: files kept in $dir"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'echo; exit 130' INT
trap 'exit 143' TERM

# --- the origin -------------------------------------------------------------
if [ -n "$user_origin" ]; then
    [ -e "$user_origin" ] || die "$user_origin: no such file or device"
    origin=$(readlink -f "$user_origin")
    step "Using your origin $origin (the demo will not write to it)"
else
    origin=$dir/disk.img
    step "Making a $size demo disk: $origin"
    # A recognisable pattern (each 8 bytes hold their own offset), with a
    # label at the start.
    nbdkit -U - pattern size="$size" --run "nbdcopy \"\$uri\" '$origin'"
    printf 'snapfg demo disk, made %s\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" |
        dd of="$origin" conv=notrunc status=none
    say "$(head -c 48 "$origin" | head -n 1)"
    cp --sparse=never "$origin" "$dir/disk-at-start.img"
fi
origin_sum_at_start=
if [ -z "$user_origin" ]; then
    origin_sum_at_start=$(sha256sum <"$origin" | cut -d' ' -f1)
    say "sha256 of the disk now: $origin_sum_at_start"
fi

# --- start the server -------------------------------------------------------
rm -f "$cow" "$sock" "$pidfile"
# shellcheck disable=SC2206
extra=(${SNAPFG_DEMO_ARGS:-})
# A server with a control socket creates snapshots at run time: give it
# the origin's catalogue too, so that they survive a restart.
case " ${extra[*]} " in
    *" control="*)
        case " ${extra[*]} " in
            *" state="*) ;;
            *) extra+=("state=$dir/catalogue.json") ;;
        esac ;;
esac
step "Starting nbdkit with the snapfg plugin"
say "nbdkit -f -U $sock $plugin origin=$origin cow=$cow ${extra[*]}"
nbdkit -f --exit-with-parent -U "$sock" -P "$pidfile" \
    "$plugin" origin="$origin" cow="$cow" "${extra[@]}" 2>"$log" &
nbdkit_pid=$!
for _ in $(seq 300); do
    [ -S "$sock" ] && [ -s "$pidfile" ] && break
    if ! kill -0 "$nbdkit_pid" 2>/dev/null; then
        nbdkit_pid=
        cat "$log" >&2
        die "nbdkit did not start (its messages are above)"
    fi
    sleep 0.1
done
[ -S "$sock" ] || die "nbdkit did not create $sock within 30 s"
say "pid $nbdkit_pid, messages in $log"

origin_uri="nbd+unix:///origin?socket=$sock"
snap_uri="nbd+unix:///snapshot?socket=$sock"

print_uris() {
    step "NBD URIs"
    say "origin   : $origin_uri"
    say "snapshot : $snap_uri"
    step "nbdinfo --list 'nbd+unix:///?socket=$sock'"
    nbdinfo --list "nbd+unix:///?socket=$sock" | sed 's/^/    /'
    step "Ready-to-paste commands"
    say "# back up the snapshot (raw):"
    say "nbdcopy --progress '$snap_uri' backup.img"
    say "# back up the snapshot (qcow2):"
    say "qemu-img convert -p -f raw -O qcow2 '$snap_uri' backup.qcow2"
    say "# run a VM on the origin:"
    say "qemu-system-x86_64 -m 2048 -drive 'file=$origin_uri,format=raw,if=virtio,cache=none'"
    say "# look at the exports and the snapshot's status:"
    say "nbdinfo --list 'nbd+unix:///?socket=$sock'"
    say "# write to the origin / read from the snapshot:"
    say "qemu-io -f raw '$origin_uri' -c 'write -P 0x55 0 64k'"
    say "qemu-io -r -f raw '$snap_uri' -c 'read -v 0 64'"
}
print_uris

snapshot_status() {
    nbdinfo "$snap_uri" | sed -n 's/^[[:space:]]*description: .*: \([^:]*\)$/\1/p'
}

# --- the demo: back up the snapshot while the origin is being written -------
if [ -z "$user_origin" ]; then
    step "Writing 1 MiB of 0xab at offset 0 of the origin (qemu-io)"
    qemu-io -f raw "$origin_uri" -c 'write -P 0xab 0 1M' | sed 's/^/    /'
    say "origin, first 32 bytes:"
    qemu-io -r -f raw "$origin_uri" -c 'read -v 0 32' | sed -n 's/^0/    0/p'
    say "snapshot, first 32 bytes (still the label):"
    qemu-io -r -f raw "$snap_uri" -c 'read -v 0 32' | sed -n 's/^0/    0/p'

    step "Writing to the origin in the background while nbdcopy backs up the snapshot"
    disk_bytes=$(stat -c %s "$origin")
    rm -f "$stopfile" "$dir/writer-count"
    if nbdsh --version >/dev/null 2>&1; then
        say "writer: nbdsh, 64 KiB writes at random offsets, each with its own byte"
        nbdsh -u "$origin_uri" -c "
import os, random, time
n = 0
slots = h.get_size() // 65536
end = time.time() + 60
while not os.path.exists('$stopfile') and time.time() < end:
    h.pwrite(bytes([n % 255 + 1]) * 65536, random.randrange(slots) * 65536)
    n += 1
    with open('$dir/writer-count.new', 'w') as f:
        f.write(str(n))
    os.rename('$dir/writer-count.new', '$dir/writer-count')
" &
    else
        say "writer: qemu-io (nbdsh not usable), batches of 16 writes of 64 KiB"
        (
            n=0
            end=$((SECONDS + 60))
            slots=$((disk_bytes / 65536))
            while [ ! -e "$stopfile" ] && [ "$SECONDS" -lt "$end" ]; do
                cmds=()
                for _ in $(seq 16); do
                    off=$(( ( (RANDOM << 15 | RANDOM) % slots) * 65536 ))
                    cmds+=(-c "write -P $((n % 255 + 1)) $off 64k")
                    n=$((n + 1))
                done
                qemu-io -f raw "$origin_uri" "${cmds[@]}" >/dev/null || exit 1
                echo "$n" >"$dir/writer-count.new"
                mv "$dir/writer-count.new" "$dir/writer-count"
            done
        ) &
    fi
    writer_pid=$!
    writes() { cat "$dir/writer-count" 2>/dev/null || echo 0; }
    # Let the writer get going before the backup starts.
    for _ in $(seq 200); do
        [ "$(writes)" -gt 0 ] && break
        kill -0 "$writer_pid" 2>/dev/null || break
        sleep 0.05
    done
    w0=$(writes)
    t0=$(date +%s.%N)
    nbdcopy "$snap_uri" "$backup"
    t1=$(date +%s.%N)
    w1=$(writes)
    # Keep writing a little after the backup, then stop the writer.
    sleep 1
    touch "$stopfile"
    wait_st=0
    wait "$writer_pid" || wait_st=$?
    writer_pid=
    [ "$wait_st" -eq 0 ] || die "the background writer failed (status $wait_st)"
    say "nbdcopy of the snapshot took $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s;" \
        "$((w1 - w0)) writes of 64 KiB went to the origin meanwhile ($(writes) in all)"

    step "Checking"
    backup_sum=$(sha256sum <"$backup" | cut -d' ' -f1)
    snap_sum=$(nbdcopy "$snap_uri" - | sha256sum | cut -d' ' -f1)
    origin_sum_now=$(nbdcopy "$origin_uri" - | sha256sum | cut -d' ' -f1)
    say "sha256 of the disk at start : $origin_sum_at_start"
    say "sha256 of the backup        : $backup_sum"
    say "sha256 of the snapshot now  : $snap_sum"
    say "sha256 of the origin now    : $origin_sum_now"
    ok=1
    if [ "$backup_sum" = "$origin_sum_at_start" ] && cmp -s "$backup" "$dir/disk-at-start.img"; then
        say "OK: the backup is byte for byte the disk as it was at the start (cmp)"
    else
        say "WRONG: the backup differs from the disk at the start"
        cmp "$backup" "$dir/disk-at-start.img" | sed 's/^/    /' || true
        ok=0
    fi
    if [ "$origin_sum_now" != "$origin_sum_at_start" ]; then
        first=$(cmp "$origin" "$dir/disk-at-start.img" | sed -n 's/.*differ: byte \([0-9]*\).*/\1/p' || true)
        say "OK: the origin has changed meanwhile (first difference at byte ${first:-?})"
    else
        say "WRONG: the origin did not change"
        ok=0
    fi
    say "snapshot status (allocated/total metadata sectors of the COW store): $(snapshot_status)"
    [ "$ok" = 1 ] || die "the demo's checks failed"
else
    step "Backing up the snapshot of $origin with nbdcopy"
    nbdcopy "$snap_uri" "$backup"
    backup_sum=$(sha256sum <"$backup" | cut -d' ' -f1)
    snap_sum=$(nbdcopy "$snap_uri" - | sha256sum | cut -d' ' -f1)
    say "sha256 of the backup        : $backup_sum"
    say "sha256 of the snapshot now  : $snap_sum"
    [ "$backup_sum" = "$snap_sum" ] || die "the backup differs from the snapshot"
    say "OK: the backup equals the snapshot"
    say "snapshot status: $(snapshot_status)"
fi

# --- interactive: leave the server running ----------------------------------
interactive=0
if [ -t 0 ] && [ "${SNAPFG_DEMO_INTERACTIVE:-1}" != 0 ]; then
    interactive=1
fi
if [ "$interactive" = 1 ]; then
    print_uris
    step "The server is running. Try the commands above; press Ctrl-C to stop it."
    say "(disconnect your clients first: nbdkit waits for them before it exits)"
    # Ctrl-C reaches the INT trap, and cleanup stops nbdkit.
    wait "$nbdkit_pid" || true
    nbdkit_pid=
    echo "demo: nbdkit exited"
else
    step "Stopping the server"
    stop_server
    say "done"
fi
