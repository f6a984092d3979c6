#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Write-back's held file, left by a crash, that must not be replayed
# (docs/design.md section 5; the held-dir= paragraph of the man page):
# another boot, another or a replaced origin, a store it was bound to
# missing, damage (header, record and data checksums, a record out of
# sequence or past the end of the file), a symbolic link planted at its
# path, another owner, a mode that lets others read it.  Each is refused
# at start with a message that names the file and what is wrong; the
# origin and the held file are left exactly as they were.  Then the
# cases that are not damage: a torn last record ends the replay (that
# write was never acknowledged), and the untouched file replays every
# held write.
set -euo pipefail
source "$(dirname "$0")/persistent-functions.sh"
require_persistent_tools

persistent_test_files
HF="$top_srcdir/tests/held-file.py"
hf() { "$PY" "$HF" "$@"; }
size=$((8 * 1024 * 1024))
make_random_image "$origin" "$size"
cp "$origin" "$pristine"
nwrites=40

# Hold 40 writes of 4 KiB (the committer paused), then kill -9.
pausefile="$tmpdir/pause"
touch "$pausefile"
SNAPFG_TEST_WRITEBACK_PAUSE="$pausefile" start_snapfg "$sock" "$pid" \
    origin="$origin" cow="$cow"
"$PY" - "$(uri "$sock" origin)" "$nwrites" <<'EOF'
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for i in range(int(sys.argv[2])):
    h.pwrite(bytes([i + 1]) * 4096, i * 65536)
EOF
kill -KILL "$(nbdkit_pid "$pid")"
wait_nbdkit_death "$pid" 30
rm -f "$pausefile"
held=$(find "$held_dir" -maxdepth 1 -name 'snapfg-held-*')
[ -n "$held" ] && [ -f "$held" ] || fail "no held file in $held_dir after the crash"
info "held file: $(hf info "$held" | tr '\n' ' ')"
hf info "$held" | grep -qx "records $nwrites" ||
    fail "the held file does not hold the $nwrites writes"
cmp -s "$origin" "$pristine" ||
    fail "the origin changed while the committer was paused"
saved="$tmpdir/held.saved"
cp -p "$held" "$saved"
cp "$origin" "$tmpdir/origin.saved"
cp "$cow" "$tmpdir/cow.saved"

restore() {
    rm -f "$held"
    cp -p "$saved" "$held"
    cp "$tmpdir/origin.saved" "$origin"
    cp "$tmpdir/cow.saved" "$cow"
}

# refused WHAT TEXT [PARAMS...]: the start is refused, the message names
# the held file and says TEXT, and nothing was written.
refused() {
    local what=$1 text=$2 err="$tmpdir/err-$RANDOM" before
    shift 2
    before=$(sha256sum <"$held" 2>/dev/null || echo none)
    if try_start_failure "$err" origin="$origin" cow="$cow" "$@"; then
        if try_stderr "$err" "$held" "$text"; then
            info "ok: $what: refused: $(grep -m1 -o "held file .*" "$err" | cut -c1-160)"
        fi
    fi
    cmp -s "$origin" "$tmpdir/origin.saved" ||
        check_fail "$what: the origin was written although the start was refused"
    [ "$(sha256sum <"$held" 2>/dev/null || echo none)" = "$before" ] ||
        check_fail "$what: the held file was changed or removed"
    restore
}

SNAPFG_TEST_BOOT_ID=00000000-0000-0000-0000-000000000000 \
    refused "another boot (boot id)" "written during another boot"

# The origin replaced by another file of the same size at the same path.
mv "$origin" "$origin.old"
cp "$origin.old" "$origin"
refused "origin replaced" "the origin was replaced"
# The original file (and inode) back for the other cases.
rm -f "$origin"
mv "$origin.old" "$origin"

hf origin-path "$held" /some/other/disk.img
refused "another origin" "belongs to origin /some/other/disk.img"

# The store it was bound to is not attached.
err="$tmpdir/err-nostore"
if try_start_failure "$err" origin="$origin"; then
    try_stderr "$err" "$held" "which is not attached" &&
        info "ok: store missing: refused"
fi
cmp -s "$origin" "$tmpdir/origin.saved" ||
    check_fail "store missing: the origin was written"
restore

hf header-byte "$held" 200
refused "header damaged" "its header checksum is wrong"

hf record "$held" 5 crc 0x12345678
refused "a record's checksum, others after it" "follows it: the file was changed"

hf record "$held" 7 count 0xffff0000
refused "a record's length" "its data lies outside the file's data area"

hf record "$held" 3 seq 999
refused "a record out of sequence" "out of place"

hf data-byte "$held" 9
refused "data damaged" "fails its checksum"

chmod 0644 "$held"
refused "mode 0644" "its mode lets other users"

if id nobody >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    chown nobody "$held"
    refused "another owner" "owned by another user"
else
    # Counted as a skip, not a pass, where the suite can count one.
    if type skip_part >/dev/null 2>&1; then
        skip_part "another owner: needs root and a user nobody"
    else
        info "SKIP part: another owner: needs root and a user nobody"
    fi
fi

mv "$held" "$held.real"
ln -s "$held.real" "$held"
err="$tmpdir/err-link"
if try_start_failure "$err" origin="$origin" cow="$cow"; then
    try_stderr "$err" "$held" "symbolic link" && info "ok: a link at its path: refused"
fi
cmp -s "$origin" "$tmpdir/origin.saved" || check_fail "link: the origin was written"
rm -f "$held" "$held.real"
restore

# Not damage: a torn last record ends the replay there.
hf record "$held" $((nwrites - 1)) crc 0x12345678
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
grep -q "replayed $((nwrites - 1)) held writes" "$pid.log" ||
    check_fail "torn last record: expected $((nwrites - 1)) writes replayed: $(grep -o 'replayed.*' "$pid.log")"
grep -q "was being written when the server stopped" "$pid.log" ||
    check_fail "torn last record: the log does not say so"
export_equals "$(uri "$sock" snapshot)" "$pristine" "torn last record: snapshot == original"
stop_nbdkit "$pid"
"$PY" - "$origin" "$pristine" "$nwrites" <<'EOF' || check_fail "torn last record: the origin is not the first writes over the original"
import sys
a = open(sys.argv[1], "rb").read()
b = open(sys.argv[2], "rb").read()
n = int(sys.argv[3])
for i in range(n):
    want = bytes([i + 1]) * 4096 if i < n - 1 else b[i * 65536:i * 65536 + 4096]
    if a[i * 65536:i * 65536 + 4096] != want:
        sys.exit("write %d is wrong on the origin" % i)
EOF
[ ! -e "$held" ] || check_fail "torn last record: the held file is left after the replay"
restore

# The untouched file: every write replayed.
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
grep -q "replayed $nwrites held writes ($((nwrites * 4096)) bytes)" "$pid.log" ||
    check_fail "intact file: expected $nwrites writes replayed: $(grep -o 'replayed.*' "$pid.log")"
export_equals "$(uri "$sock" snapshot)" "$pristine" "intact file: snapshot == original"
stop_nbdkit "$pid"
"$PY" - "$origin" "$nwrites" <<'EOF' || check_fail "intact file: the held writes are not all on the origin"
import sys
a = open(sys.argv[1], "rb").read()
for i in range(int(sys.argv[2])):
    if a[i * 65536:i * 65536 + 4096] != bytes([i + 1]) * 4096:
        sys.exit("write %d is missing from the origin" % i)
EOF
info "ok: intact file: all $nwrites held writes on the origin after the replay"

# A held file with nothing to apply binds nothing: a server killed with
# no write held starts again without the store it had (a temporary
# snapshot's is dropped at that start, say).
rm -f "$cow"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
kill -KILL "$(nbdkit_pid "$pid")"
wait_nbdkit_death "$pid" 30
[ -n "$(find "$held_dir" -maxdepth 1 -name 'snapfg-held-*')" ] ||
    check_fail "nothing held: no held file after the kill"
start_snapfg "$sock" "$pid" origin="$origin"
grep -q "with no write to replay: removed" "$pid.log" &&
    info "ok: nothing held: the start without its store removes the file and goes on" ||
    check_fail "nothing held: $(grep -o 'held file.*' "$pid.log")"
stop_nbdkit "$pid"

# Nor does it bind the boot or the origin's inode: a start refused after
# the file was made (a catalogue that finds its origin replaced), or a
# kill with nothing held, must not block the next start of the disk put
# back, nor one after a reboot.
start_snapfg "$sock" "$pid" origin="$origin"
kill -KILL "$(nbdkit_pid "$pid")"
wait_nbdkit_death "$pid" 30
cp "$origin" "$origin.copy"
mv "$origin" "$origin.old"
mv "$origin.copy" "$origin"
SNAPFG_TEST_BOOT_ID=00000000-0000-0000-0000-000000000000 \
    start_snapfg "$sock" "$pid" origin="$origin"
grep -q "with no write to replay: removed" "$pid.log" &&
    info "ok: nothing held, origin replaced, another boot: removed, the start goes on" ||
    check_fail "nothing held, origin replaced: $(grep -o 'held file.*' "$pid.log")"
stop_nbdkit "$pid"
rm -f "$origin"
mv "$origin.old" "$origin"

# The default held directory: without $RUNTIME_DIRECTORY and
# $XDG_RUNTIME_DIR the first of /run/snapfg and /dev/shm/snapfg-UID that
# is on a memory file system (/run is a disk directory on some systems:
# a start must not fail for it); held-dir= on a disk is refused.
rm -f "$cow"
err="$tmpdir/err-default"
if env -u RUNTIME_DIRECTORY -u XDG_RUNTIME_DIR timeout 60 nbdkit -U - --run true \
       "$SNAPFG_PLUGIN" origin="$origin" cow="$cow" >"$err.out" 2>"$err"; then
    info "ok: the default held directory works here"
else
    cat "$err" >&2
    check_fail "a start with the default held directory failed"
fi
mkdir -p "$tmpdir/on-disk"
err="$tmpdir/err-on-disk"
if try_start_failure "$err" origin="$origin" cow="$cow" held-dir="$tmpdir/on-disk"; then
    try_stderr "$err" "not on a memory file system" && info "ok: held-dir= on a disk: refused"
fi
expect_start_success origin="$origin" cow="$cow" held-dir="$tmpdir/on-disk" held-dir-on-disk=true
info "ok: held-dir-on-disk=true: accepted"

finish
