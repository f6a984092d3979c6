#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# An encrypted repository: runs with zstd and AES-256-GCM restored byte
# for byte; the data cannot be found in the repository without the key
# (a plain pattern of the disk is there in an unencrypted repository and
# not in the encrypted one); a wrong key is refused before the server is
# asked anything (no snapshot, no checkpoint, no request); a missing key
# is a usage error; equal data under two keys has different chunk ids.

set -euo pipefail
source "$(dirname "$0")/repo-functions.sh"
require_backup_tools

repo_server a $((64 * 1024 * 1024)) make_compressible
repo=$(repo_loc enc)
plain=$(repo_loc plain)
head -c 32 /dev/urandom >"$tmpdir/key"
head -c 32 /dev/urandom >"$tmpdir/other-key"
chmod 600 "$tmpdir/key" "$tmpdir/other-key"

st=0; rb init "$repo" --encrypt || st=$?
rb_expect 2 "init --encrypt without a key is a usage error" "key-file" "$st"
rb init "$repo" --encrypt --key-file "$tmpdir/key" || fail "init: $(cat "$tmpdir/rb.log")"
rb init "$plain" || fail "init plain: $(cat "$tmpdir/rb.log")"

rb_run "$repo" d1 a 1 --compress --key-file "$tmpdir/key"
rb_run "$plain" p1 a 1
write_random_blocks "$origin_a" 30 5 "$size"
rb_run "$repo" d1 a 2 --key-file "$tmpdir/key" --compress
rb_restores "$repo" d1 1 --key-file "$tmpdir/key"
rb_restores "$repo" d1 2 --key-file "$tmpdir/key"
rb verify "$repo" --all --key-file "$tmpdir/key" || check_fail "verify: $(cat "$tmpdir/rb.log")"

# zstd made it smaller: 8 MiB of the disk are a repeated pattern.
[ "$(run_field d1 1 bytes_added)" -lt $((size - 6 * 1024 * 1024)) ] ||
    check_fail "compressed full run stored $(run_field d1 1 bytes_added) bytes of $size"

# The pattern is in the plain repository, and nowhere in the encrypted one.
if repo_is_dir; then
    pattern='snapfg-backup compresses this.'
    grep -rqa "$pattern" "$plain" || check_fail "the pattern is not in the plain repository: the check below proves nothing"
    if grep -rqa "$pattern" "$repo"; then
        check_fail "the plain data is readable in the encrypted repository"
    else
        info "ok: the plain data is not in the encrypted repository"
    fi
    # Nor a chunk's plain digest: ids are keyed.
    for f in $(repo_chunk_files "$plain" | head -n 3); do
        [ ! -e "$repo/chunks/$(basename "$(dirname "$f")")/$(basename "$f")" ] ||
            check_fail "an encrypted chunk has the plain data's digest for its id"
    done
fi

# --- keys ------------------------------------------------------------------------
creates() { grep -c ': create: ' "$tmpdir/nbdkit-a.pid.log" || true; }
requests() { grep -c 'control: pid' "$tmpdir/nbdkit-a.pid.log" || true; }
before=$(requests)
st=0; rb -S "$ctl_a" -u "$origin_a" backup "$repo" --disk d1 --key-file "$tmpdir/other-key" || st=$?
rb_expect 1 "backup with a wrong key is refused" "wrong key" "$st"
[ "$(requests)" -eq "$before" ] ||
    check_fail "a backup with a wrong key sent $(( $(requests) - before )) requests to the server"
[ -z "$(repo_snapshots "$ctl_a")" ] || check_fail "a wrong key left a snapshot"
st=0; rb -S "$ctl_a" -u "$origin_a" backup "$repo" --disk d1 || st=$?
rb_expect 2 "backup without the key is a usage error" "encrypted: give its key" "$st"
[ "$(requests)" -eq "$before" ] || check_fail "a backup without the key talked to the server"
st=0; rb restore "$repo" "$tmpdir/out.img" --disk d1 --key-file "$tmpdir/other-key" || st=$?
rb_expect 1 "restore with a wrong key is refused" "wrong key" "$st"
[ ! -e "$tmpdir/out.img" ] || check_fail "a refused restore left its output"
st=0; rb restore "$repo" "$tmpdir/out.img" --disk d1 || st=$?
rb_expect 2 "restore without the key is a usage error" "encrypted" "$st"
st=0; rb verify "$repo" || st=$?
rb_expect 2 "verify without the key is a usage error" "encrypted" "$st"
st=0; rb restore "$plain" "$tmpdir/out.img" --disk p1 --key-file "$tmpdir/key" || st=$?
rb_expect 1 "a key for an unencrypted repository is refused" "not encrypted" "$st"
# list and prune need no key.
rb list "$repo" || check_fail "list without a key: $(cat "$tmpdir/rb.log")"
# A key file others can read is used, with a warning.
chmod 644 "$tmpdir/key"
rb restore "$repo" "$tmpdir/w.img" --disk d1 --key-file "$tmpdir/key" &&
    grep -q 'can be read by others' "$tmpdir/rb.log" || check_fail "no warning for a world-readable key file"
chmod 600 "$tmpdir/key"

# --- the same data under another key: other ids -------------------------------
repo2=$(repo_loc enc2)
rb init "$repo2" --encrypt --key-file "$tmpdir/other-key" || fail "init enc2"
rb_run "$repo2" e2 a 1 --key-file "$tmpdir/other-key"
if repo_is_dir; then
    common=$(comm -12 <(repo_chunk_files "$repo" | xargs -n1 basename | sort) \
                      <(repo_chunk_files "$repo2" | xargs -n1 basename | sort) | wc -l)
    [ "$common" -eq 0 ] || check_fail "$common chunk ids are the same under two keys"
fi
rb_restores "$repo2" e2 1 --key-file "$tmpdir/other-key"

finish
