#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Bad parameters stop nbdkit at start-up with an error naming the key or
# file; a COW file that is not new, empty or all-zero is refused and left
# byte-for-byte unchanged; cow= naming the origin is refused.  Valid
# parameters (positive controls) start.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg

origin="$tmpdir/origin.img"
make_random_image "$origin" $((1024 * 1024))
origin_sum=$(checksum "$origin")
err="$tmpdir/err"

# bad PARAMS... -- WORD...: refused, stderr names every WORD.
bad() {
    local params=() words=()
    while [ "$1" != -- ]; do params+=("$1"); shift; done
    shift
    words=("$@")
    if try_start_failure "$err" "${params[@]}" &&
       try_stderr "$err" "${words[@]}"; then
        info "refused as expected: ${params[*]}"
    else
        echo "$test_name:   reproduce: nbdkit -U - --run true $SNAPFG_PLUGIN ${params[*]}" >&2
    fi
}

# --- positive controls: these must start ---
expect_start_success origin="$origin"
expect_start_success origin="$origin" cow="$tmpdir/new-cow.img" store=transient
[ -f "$tmpdir/new-cow.img" ] || fail "cow= file was not created"
[ "$(file_size "$tmpdir/new-cow.img")" -eq 0 ] ||
    fail "new transient COW file not truncated to 0 on exit"
expect_start_success origin="$origin" cow="$tmpdir/new-cow.img" store=transient
for cs in 512 4K 64K 1M; do
    expect_start_success origin="$origin" cow="$tmpdir/c.img" store=transient chunk-size=$cs
done
for bs in 512 4096; do
    expect_start_success origin="$origin" cow="$tmpdir/c.img" store=transient block-size=$bs
done
for lk in striped global; do
    expect_start_success origin="$origin" cow="$tmpdir/c.img" store=transient locking=$lk
done
expect_start_success origin="$origin" cow="$tmpdir/c.img" store=transient chunk-size=4K cow-size=4K
# Empty, sparse all-zero and allocated all-zero COW files are accepted,
# and truncated to 0 on a clean exit.
: >"$tmpdir/empty.img"
expect_start_success origin="$origin" cow="$tmpdir/empty.img" store=transient
truncate -s 4M "$tmpdir/sparse-zero.img"
expect_start_success origin="$origin" cow="$tmpdir/sparse-zero.img" store=transient
[ "$(file_size "$tmpdir/sparse-zero.img")" -eq 0 ] ||
    fail "all-zero (sparse) COW file not truncated to 0 on exit"
make_zero_image "$tmpdir/zero.img" $((3 * 1024 * 1024 + 512))
expect_start_success origin="$origin" cow="$tmpdir/zero.img" store=transient
[ "$(file_size "$tmpdir/zero.img")" -eq 0 ] ||
    fail "all-zero COW file not truncated to 0 on exit"
[ "$(checksum "$origin")" = "$origin_sum" ] || fail "origin changed"
info "positive controls started"

# --- store= ---
bad origin="$origin" cow="$tmpdir/c.img" store=bogus -- store
bad origin="$origin" cow="$tmpdir/c.img" store= -- store
# The first version has only the transient store: store=persistent must
# be refused naming store.  Once the persistent store (docs/design.md section
# 5) exists it must start on a new file, and must still refuse a COW
# file that is neither all-zero nor a valid store, without writing it.
rm -f "$tmpdir/p-new.img"
if timeout 60 nbdkit -U - --run true "$SNAPFG_PLUGIN" origin="$origin" \
       cow="$tmpdir/p-new.img" store=persistent >/dev/null 2>"$err"; then
    info "store=persistent is supported by this build: checking it refuses a random COW file"
else
    try_stderr "$err" store &&
        info "refused as expected: store=persistent (not in this version)"
fi
make_random_image "$tmpdir/p-random.img" $((256 * 1024))
p_sum=$(checksum "$tmpdir/p-random.img")
try_start_failure "$err" origin="$origin" cow="$tmpdir/p-random.img" store=persistent || true
[ "$(checksum "$tmpdir/p-random.img")" = "$p_sum" ] ||
    check_fail "store=persistent modified a random COW file it should refuse"

# --- chunk-size= ---
for cs in 3000 256 2M 0 abc 1536 -4096; do
    bad origin="$origin" cow="$tmpdir/c.img" store=transient chunk-size="$cs" -- chunk-size
done

# --- block-size= ---
for bs in 1024 0 8192 4K1 abc 2048; do
    bad origin="$origin" cow="$tmpdir/c.img" store=transient block-size="$bs" -- block-size
done

# --- locking= ---
for lk in bogus STRIPED none ""; do
    bad origin="$origin" cow="$tmpdir/c.img" store=transient locking="$lk" -- locking
done

# --- unknown keys ---
bad origin="$origin" cow="$tmpdir/c.img" store=transient frobnicate=1 -- frobnicate
bad origin="$origin" chunksize=4K -- chunksize

# --- origin= ---
bad cow="$tmpdir/c.img" store=transient -- origin
bad chunk-size=4K -- origin
bad origin="$tmpdir/does-not-exist.img" cow="$tmpdir/c.img" store=transient -- "$tmpdir/does-not-exist.img"
mkdir "$tmpdir/a-directory"
bad origin="$tmpdir/a-directory" cow="$tmpdir/c.img" store=transient -- "$tmpdir/a-directory"
if [ "$(id -u)" -ne 0 ]; then
    cp "$origin" "$tmpdir/unreadable.img"
    chmod 000 "$tmpdir/unreadable.img"
    bad origin="$tmpdir/unreadable.img" -- "$tmpdir/unreadable.img"
else
    skip_part "the mode-000 origin case: running as root, who may read it"
fi

# --- cow-size= ---
bad origin="$origin" cow="$tmpdir/c.img" store=transient chunk-size=4K cow-size=2K -- cow-size
bad origin="$origin" cow="$tmpdir/c.img" store=transient chunk-size=64K cow-size=32K -- cow-size
bad origin="$origin" cow="$tmpdir/c.img" store=transient cow-size=0 -- cow-size
bad origin="$origin" cow="$tmpdir/c.img" store=transient cow-size=junk -- cow-size

# --- COW files that are neither new, empty nor all-zero ---
# refused_cow FILE: refused, error names the COW file, file unchanged.
refused_cow() {
    local f=$1 before size
    before=$(checksum "$f")
    size=$(file_size "$f")
    expect_start_failure "$err" origin="$origin" cow="$f" store=transient
    if ! grep -qF -- "$f" "$err" && ! grep -qiw cow "$err"; then
        cat "$err" >&2
        fail "error for a refused COW file names neither the file nor 'cow'"
    fi
    [ "$(checksum "$f")" = "$before" ] && [ "$(file_size "$f")" -eq "$size" ] ||
        fail "refused COW file $f was modified"
    info "refused non-zero COW file $(basename "$f") and left it unchanged"
}
make_random_image "$tmpdir/random-cow.img" $((1024 * 1024))
refused_cow "$tmpdir/random-cow.img"
# Zero except for one byte at the very end.
make_zero_image "$tmpdir/tail-cow.img" $((4 * 1024 * 1024 - 1))
printf '\001' >>"$tmpdir/tail-cow.img"
refused_cow "$tmpdir/tail-cow.img"
# Zero except for one byte in the middle, past the first chunks.
make_zero_image "$tmpdir/mid-cow.img" $((2 * 1024 * 1024))
printf '\377' | dd of="$tmpdir/mid-cow.img" bs=1 seek=$((1024 * 1024 + 777)) conv=notrunc status=none
refused_cow "$tmpdir/mid-cow.img"
# A small non-zero file (shorter than a chunk).
printf 'x' >"$tmpdir/tiny-cow.img"
refused_cow "$tmpdir/tiny-cow.img"
# Something that looks like a dm persistent store header ("SnAp").
make_zero_image "$tmpdir/pstore.img" 65536
printf 'SnAp\001\000\000\000\001\000\000\000\010\000\000\000' |
    dd of="$tmpdir/pstore.img" conv=notrunc status=none
refused_cow "$tmpdir/pstore.img"

# --- cow= naming the origin ---
# With an all-zero origin the COW content check alone would accept the
# file, so only the same-file check can refuse it.  A wrongly accepted
# start would truncate the "COW" (the origin) on exit.
zorigin="$tmpdir/zero-origin.img"
make_zero_image "$zorigin" $((1024 * 1024))
zsum=$(checksum "$zorigin")
expect_start_failure "$err" origin="$zorigin" cow="$zorigin" store=transient
[ "$(checksum "$zorigin")" = "$zsum" ] || fail "cow=origin modified the origin"
info "refused cow= equal to origin="
ln -s "$zorigin" "$tmpdir/zero-origin-link.img"
expect_start_failure "$err" origin="$zorigin" cow="$tmpdir/zero-origin-link.img" store=transient
[ "$(checksum "$zorigin")" = "$zsum" ] || fail "cow=symlink-to-origin modified the origin"
info "refused cow= being a symlink to the origin"
ln "$zorigin" "$tmpdir/zero-origin-hardlink.img"
expect_start_failure "$err" origin="$zorigin" cow="$tmpdir/zero-origin-hardlink.img" store=transient
[ "$(checksum "$zorigin")" = "$zsum" ] || fail "cow=hardlink-to-origin modified the origin"
info "refused cow= being a hard link to the origin"
# The random origin as its own COW: refused and unchanged.
expect_start_failure "$err" origin="$origin" cow="$origin" store=transient
[ "$(checksum "$origin")" = "$origin_sum" ] || fail "cow=origin modified the origin"

[ "$(checksum "$origin")" = "$origin_sum" ] || fail "origin changed during the test"
finish
