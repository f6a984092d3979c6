#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Power cuts of a backup host writing a directory repository.  The
# repository is on ext4 over a disk with a volatile write cache (the
# test plugin tests/nbdkit-powercut-plugin.c, seen as a file through
# nbdfuse, on a loop device): every fsync, fdatasync and syncfs reaches
# that disk as a flush, and whatever was not flushed when the power goes
# keeps, per 512-byte sector, its old contents or one of its unflushed
# versions (at random, from the printed seed).  The server backed up is
# on the test's own disk: only the backup host loses power.
#
# Each round: a new file system, a repository, two acknowledged runs of
# a 32 MiB disk (the origin changed between them), then the power goes
# at a random instant of one more operation:
#   - full:    a backup with --full (the whole disk read and stored);
#   - run:     an incremental backup;
#   - zstd:    a backup with --compress into an encrypted repository;
#   - gc:      gc --grace 0 after prune --keep-last 1 removed run 1.
# The next boot (e2fsck -p, as at boot, then the surviving image
# mounted) must find:
#   - every run the tool had reported done is listed (a run the cut
#     interrupted may be listed too: then it had committed);
#   - every listed run restores byte for byte as the origin was (which
#     reads and checks every chunk it names);
#   - a new run succeeds, and after gc --grace 0 (which removes what the
#     cut left: .tmp files, unreferenced chunks) verify --all passes (no
#     index names a chunk that is missing or damaged) and the new run
#     restores byte for byte.  A registration
#     of the cut run that survived without its contents counts as a
#     live writer until it is stale: the test then ages it and runs gc
#     once more.
# Needs root (a loop device, mount), nbdfuse and /dev/fuse.
#
# SNAPFG_TEST_SEED repeats a run; SNAPFG_POWERCUT_ROUNDS=N runs each
# kind of round N times, each with its own seed (default 1; 3 under
# make check-soak).
set -euo pipefail
source "$(dirname "$0")/repo-functions.sh"
source "$(dirname "$0")/powercut-functions.sh"
require_backup_tools
require_powercut
require_disk_files
[ "$(id -u)" -eq 0 ] || skip "needs root (a loop device and a mount of the repository's file system)"
requires losetup mkfs.ext4 e2fsck mount umount
[ -c /dev/loop-control ] || skip "no /dev/loop-control: the kernel has no loop devices"
test_seed

repeat=${SNAPFG_POWERCUT_ROUNDS:-$(soak_or 1 3)}
dsock="$tmpdir/disks.sock"
img="$tmpdir/repo-disk.img"
mnt="$tmpdir/mnt"
trig="$tmpdir/trigger"
rep="$tmpdir/report"
key="$tmpdir/key"
mkdir -p "$mnt"
printf 'powercut-repo-key' >"$key"
chmod 600 "$key"
nround=0
loopdev=

# Unmount the repository and free the loop device before the disks'
# nbdfuse and nbdkit are stopped (powercut-functions.sh's hook, which
# was registered first, so runs first: stop them here).
_stop_repo_disk() {
    mountpoint -q "$mnt" 2>/dev/null && { umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true; }
    [ -z "$loopdev" ] || losetup -d "$loopdev" 2>/dev/null || true
    loopdev=
}
_cleanup_hooks=(_stop_repo_disk "${_cleanup_hooks[@]}")

repo_server a $((32 * 1024 * 1024))

# boot_on_disks SEED: the repository's file system on the volatile disk.
boot_on_disks() {
    rm -f "$trig" "$rep"
    start_disks "$dsock" disk=repo:"$img" seed="$1" trigger="$trig" report="$rep"
    mount_disk_file "$tmpdir/disk-repo" "$(uri "$dsock" repo)"
    loopdev=$(losetup --find --show "$tmpdir/disk-repo/nbd") ||
        fail "losetup of $tmpdir/disk-repo/nbd failed"
    mount "$loopdev" "$mnt" || fail "mount of $loopdev (the volatile disk) failed"
}

# power_off: after the cut, take the dead file system down (its writes
# fail from the cut on; what reached the image is what survived).
power_off() {
    umount "$mnt" 2>/dev/null || umount -l "$mnt" ||
        fail "the dead file system on $mnt could not be unmounted"
    losetup -d "$loopdev" || fail "losetup -d $loopdev failed"
    loopdev=
    unmount_disk_files
    kill_disks "$dsock"
}

# next_boot: what a boot does with the surviving image: e2fsck -p (the
# journal replayed), then mount.  e2fsck's exit 1 is "errors corrected",
# which a journal replay alone reports; 4 and up are damage.
next_boot() {
    local st=0
    e2fsck -p "$img" >"$tmpdir/fsck.log" 2>&1 || st=$?
    [ "$st" -le 1 ] || { cat "$tmpdir/fsck.log" >&2; fail "e2fsck -p of the surviving image: exit $st"; }
    loopdev=$(losetup --find --show "$img") || fail "losetup of $img failed"
    mount "$loopdev" "$mnt" || fail "mount of the surviving image failed"
}

shutdown_clean() {
    umount "$mnt" || fail "umount $mnt failed"
    losetup -d "$loopdev" || fail "losetup -d $loopdev failed"
    loopdev=
}

# The repository's checkpoints on the server: drop them between rounds
# (each round's repository is new; a hand-deleted repository's
# checkpoints are not this test's subject).
drop_repo_checkpoints() {
    local c
    for c in $(repo_checkpoints "$ctl_a"); do
        "$SNAPFGCTL" -S "$ctl_a" checkpoint drop "$c" >/dev/null || true
    done
}

# change_chunks SEED [N]: 4 KiB writes into N (2) of the disk's 4 MiB
# chunks, so that an incremental reads a part of the disk, as it does in
# life; with N = 8 (all of them) a full stores every chunk anew.
change_chunks() {
    "$PY" - "$origin_a" "$1" "$size" "${2:-2}" <<'EOF'
import nbd, os, random, sys
uri, seed, size, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
h = nbd.NBD()
h.connect_uri(uri)
for c in rng.sample(range(size >> 22), n):
    for _ in range(8):
        h.pwrite(os.urandom(4096), (c << 22) + rng.randrange(1024) * 4096)
h.shutdown()
EOF
}

ms_now() { local t; t=$(date +%s%N); echo $((t / 1000000)); }

# round KIND
round() {
    local kind=$1 rseed=$((seed + nround * 7919)) i n st=0 pid dur=100 t0
    local init=() bk=() acked=() listed cut_run=0 delay
    nround=$((nround + 1))
    local what="round $nround ($kind; seed $rseed)"
    info "=== $what"
    RANDOM=$rseed
    case $kind in
        zstd) init=(--encrypt --key-file "$key"); bk=(--compress --key-file "$key") ;;
    esac
    rm -f "$img"
    truncate -s 160M "$img"
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$img" ||
        fail "$what: mkfs.ext4 failed"
    boot_on_disks "$rseed"
    local repo="$mnt/repo"
    rb init "$repo" "${init[@]}" || fail "$what: init: $(cat "$tmpdir/rb.log")"

    for i in 1 2; do
        change_chunks $((rseed + i))
        rb_run "$repo" d1 a "$i" "${bk[@]}"
        acked+=("$i")
    done
    # How long the operation takes here, from the last run (or a dry run
    # of gc), process start and exit included.
    case $kind in
        gc) t0=$(ms_now); rb gc "$repo" --grace 0 --dry-run || true; dur=$(( $(ms_now) - t0 )) ;;
        full) dur=$(awk -v s="$(run_field d1 1 seconds)" 'BEGIN { printf "%d", s * 1000 + 20 }') ;;
        *) dur=$(awk -v s="$(run_field d1 2 seconds)" 'BEGIN { printf "%d", s * 1000 + 20 }') ;;
    esac

    # The cut, at a random instant of the operation (up to a fifth
    # after its expected end: some cuts come after it ended).
    delay=$((RANDOM % (dur + dur / 5 + 1)))
    case $kind in
        run | zstd | full)
            change_chunks $((rseed + 4)) "$([ "$kind" = full ] && echo $((size >> 22)) || echo 2)"
            save_origin "$origin_a" "$tmpdir/expect-d1-3.img"
            timeout 120 "$SNAPFG_BACKUP" -S "$ctl_a" -u "$origin_a" --json backup "$repo" \
                --disk d1 "${bk[@]}" $([ "$kind" != full ] || echo --full) >"$tmpdir/cut.log" 2>&1 &
            pid=$!
            cut_run=3
            ;;
        gc)
            rb prune "$repo" --disk d1 --keep-last 1 ||
                fail "$what: prune: $(cat "$tmpdir/rb.log")"
            acked=(2)
            # gc keeps what is younger than its cutoff (a run's start):
            # the chunks age, as they would between nightly runs, so
            # that this gc removes the pruned runs' chunks.
            find "$repo/chunks" -type f -exec touch -d '-1 hour' {} +
            timeout 120 "$SNAPFG_BACKUP" --json gc "$repo" --grace 0 >"$tmpdir/cut.log" 2>&1 &
            pid=$!
            ;;
    esac
    sleep "$(awk -v d="$delay" 'BEGIN { printf "%.3f", d / 1000 }')"
    touch "$trig"
    wait_cut "$rep"
    wait "$pid" || st=$?
    info "$kind cut after ${delay} ms: the operation exited $st; $(tr '\n' ' ' <"$rep")"
    [ "$st" -ne 0 ] || info "its output: $(tail -n 1 "$tmpdir/cut.log")"
    [ "$st" -ne 124 ] || check_fail "$what: the operation hung after the power cut"
    if [ "$st" -eq 0 ] && [ "$cut_run" -gt 0 ]; then
        acked+=("$cut_run")
    fi
    power_off
    # A run the cut ended may have left its snapshot on the server (the
    # next run drops it) and its checkpoint (dropped with the round's).

    next_boot
    rb --json list "$repo" --disk d1 || fail "$what: list after the cut: $(cat "$tmpdir/rb.log")"
    listed=$("$PY" -c 'import json, sys
j = json.load(open(sys.argv[1]))
print(" ".join(str(r["run"]) for d in j["disks"] for r in d["runs"]))' "$tmpdir/rb.log")
    info "after the boot: runs $listed listed (acknowledged: ${acked[*]}); $(find "$repo/chunks" -type f ! -name '.tmp.*' | wc -l) chunks, $(find "$repo" -name '.tmp.*' | wc -l) .tmp files"
    for n in "${acked[@]}"; do
        [[ " $listed " == *" $n "* ]] ||
            check_fail "$what: run $n was reported done before the cut and is gone"
    done
    if [ "$kind" = gc ]; then
        [[ " $listed " != *" 1 "* ]] ||
            check_fail "$what: the run the acknowledged prune removed is back: $listed"
    fi
    for n in $listed; do
        rb_restores "$repo" d1 "$n" "${bk[@]:1}"
    done

    # Life goes on: a new run, gc, everything still there.
    change_chunks $((rseed + 5))
    n=$(( $(printf '%s\n' $listed | sort -n | tail -n 1) + 1 ))
    rb_run "$repo" d1 a "$n" "${bk[@]}"
    [ "$(run_field d1 "$n" run)" -eq "$n" ] ||
        check_fail "$what: the run after the boot is run $(run_field d1 "$n" run), expected $n"
    rb --json gc "$repo" --grace 0 || check_fail "$what: gc after the boot: $(cat "$tmpdir/rb.log")"
    info "gc after the boot: $(cat "$tmpdir/rb.log")"
    if [ "$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["live_writers"])' "$tmpdir/rb.log")" -gt 0 ]; then
        # The cut run's registration survived without its contents (it
        # is not synced: docs/repository.md), and one that cannot be
        # read counts as a live writer until it is stale, the safe side;
        # gc keeps what is younger than such a writer could be.  It must
        # be the cut run's, not a readable one of a process still here.
        "$PY" - "$repo/writers" <<'EOF' || check_fail "$what: a live writer after the boot"
import json, os, sys
for name in os.listdir(sys.argv[1]):
    try:
        j = json.load(open(os.path.join(sys.argv[1], name)))
    except ValueError:
        print("registration %s: unreadable (%d bytes), counted live until stale"
              % (name, os.path.getsize(os.path.join(sys.argv[1], name))))
        continue
    assert j.get("host") != os.uname().nodename or not os.path.exists("/proc/%d" % j["pid"]), j
EOF
        # Ten minutes later it is stale: gc then takes what the cut left.
        find "$repo/writers" -type f -exec touch -d '-11 min' {} +
        rb --json gc "$repo" --grace 0 || check_fail "$what: gc after the boot: $(cat "$tmpdir/rb.log")"
        info "gc with the cut run's registration stale: $(cat "$tmpdir/rb.log")"
    fi
    if find "$repo" -name '.tmp.*' | grep -q .; then
        check_fail "$what: gc left .tmp files (path, size, mtime; now $(date +%s)): $(find "$repo" -name '.tmp.*' -printf '%p %s %T@\n' | head -n 3)"
    fi
    rb verify "$repo" --all "${bk[@]:1}" ||
        check_fail "$what: verify --all after gc: $(cat "$tmpdir/rb.log")"
    rb_restores "$repo" d1 "$n" "${bk[@]:1}"
    shutdown_clean
    drop_repo_checkpoints
    [ -z "$(repo_snapshots "$ctl_a")" ] ||
        check_fail "$what: snapshots left on the server: $(repo_snapshots "$ctl_a")"
}

for _ in $(seq "$repeat"); do
    for kind in full run zstd gc; do
        round "$kind"
    done
done
finish
