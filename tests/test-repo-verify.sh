#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# verify on a repository: a damaged chunk (a flipped byte) and a missing
# one are found, the result is recorded (list shows it), and the next
# backup stores those chunks again instead of referencing them, after
# which verify passes and every point restores.  Directory back end only
# (the test changes the chunk files).

set -euo pipefail
source "$(dirname "$0")/repo-functions.sh"
require_backup_tools
repo_is_dir || skip "damages chunk files: a directory repository only"

repo_server a $((32 * 1024 * 1024))
repo=$(repo_loc verify)
rb init "$repo" || fail "init: $(cat "$tmpdir/rb.log")"
rb_run "$repo" d1 a 1 --compress
rb verify "$repo" || check_fail "verify of a sound repository: $(cat "$tmpdir/rb.log")"
grep -q 'run 1: ok' "$tmpdir/rb.log" || check_fail "verify said: $(cat "$tmpdir/rb.log")"

# Damage one chunk (a byte in its middle) and remove another.
mapfile -t chunks < <(repo_chunk_files "$repo")
[ "${#chunks[@]}" -ge 2 ] || fail "only ${#chunks[@]} chunks"
damaged=${chunks[0]} missing=${chunks[1]}
"$PY" - "$damaged" <<'PYEOF'
import os, sys
p = sys.argv[1]
with open(p, "r+b") as f:
    f.seek(os.path.getsize(p) // 2)
    b = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([b[0] ^ 0x55]))
PYEOF
rm "$missing"
st=0; rb verify "$repo" --disk d1 --all || st=$?
rb_expect 1 "verify finds the damaged chunk" "$(basename "$damaged").*damaged" "$st"
grep -q "$(basename "$missing").*missing" "$tmpdir/rb.log" ||
    check_fail "verify did not name the missing chunk: $(cat "$tmpdir/rb.log")"
[ "$(repo_json "$repo" 'j["disks"][0]["runs"][0]["verified"]')" = DAMAGED ] ||
    check_fail "list does not show run 1 as damaged"
st=0; rb restore "$repo" "$tmpdir/bad.img" --disk d1 || st=$?
rb_expect 1 "restore of a damaged point fails, naming the chunk" "chunks/" "$st"

# Nothing changed on the disk: the next run reads the damaged chunks
# again and stores them.
rb_run "$repo" d1 a 2
[ "$(run_field d1 2 chunks_added)" -eq 2 ] ||
    check_fail "the run after a failed verify stored $(run_field d1 2 chunks_added) chunks, expected the 2 damaged"
rb verify "$repo" --all || check_fail "verify after the repair run: $(cat "$tmpdir/rb.log")"
rb_restores "$repo" d1 2
# Run 1 references the same chunks: repaired too.
cp "$tmpdir/expect-d1-2.img" "$tmpdir/expect-d1-1.img"
rb_restores "$repo" d1 1
[ "$(repo_json "$repo" 'j["disks"][0]["runs"][0]["verified"]')" = ok ] ||
    check_fail "list still shows run 1 as damaged after verify passed"
[ -z "$(ls "$repo/damaged" 2>/dev/null)" ] || check_fail "damaged records left: $(ls "$repo/damaged")"

finish
