#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Bad input to the repository commands, each refused with a message that
# names what is wrong, and nothing lost: a location that is no
# repository, a damaged or moved index, a config changed by hand (also
# one made to look unencrypted), an unknown run or disk, an S3 location
# without an S3 back end or endpoint.  Directory back end (the test
# changes the repository's files).

set -euo pipefail
source "$(dirname "$0")/repo-functions.sh"
require_backup_tools
repo_is_dir || skip "changes the repository's files: a directory repository only"

repo_server a $((16 * 1024 * 1024))
repo=$(repo_loc bad)
rb init "$repo" || fail "init: $(cat "$tmpdir/rb.log")"
rb_run "$repo" d1 a 1
write_random_blocks "$origin_a" 10 1 "$size"
rb_run "$repo" d1 a 2

# --- no repository --------------------------------------------------------------
mkdir "$tmpdir/empty"
for cmd in "list $tmpdir/empty --disk d1" "restore $tmpdir/nowhere $tmpdir/o.img --disk d1" \
           "verify $tmpdir/empty --disk d1" "gc $tmpdir/empty" "gc $tmpdir/nowhere"; do
    st=0
    # shellcheck disable=SC2086
    rb $cmd || st=$?
    rb_expect 1 "$cmd" "not a repository\|No such file" "$st"
done
[ ! -e "$tmpdir/o.img" ] || check_fail "a refused restore made its output"
[ -z "$(ls "$tmpdir/empty")" ] || check_fail "a command wrote into a directory that is no repository"
# init into a directory holding something else: only the config is
# added, nothing there is touched.
mkdir "$tmpdir/other"; echo keep >"$tmpdir/other/notes.txt"
st=0; rb restore "$repo" "$tmpdir/other/notes.txt" --disk d1 || st=$?
rb_expect 1 "restore over an existing file" "never overwrites" "$st"
[ "$(cat "$tmpdir/other/notes.txt")" = keep ] || check_fail "restore overwrote a file"

# --- unknown disk, unknown run ------------------------------------------------------
st=0; rb restore "$repo" "$tmpdir/o.img" --disk nosuch || st=$?
rb_expect 1 "an unknown disk" "no run of disk nosuch" "$st"
st=0; rb restore "$repo" "$tmpdir/o.img" --disk d1 --at 9 || st=$?
rb_expect 1 "an unknown run" "has no run 9" "$st"

# --- a damaged index ----------------------------------------------------------------
cp "$repo/index/d1/00000001.idx" "$tmpdir/idx1"
"$PY" - "$repo/index/d1/00000001.idx" <<'PYEOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) - 40] ^= 1
open(p, "wb").write(bytes(b))
PYEOF
st=0; rb restore "$repo" "$tmpdir/o.img" --disk d1 --at 1 || st=$?
rb_expect 1 "restore from a damaged index" "00000001.idx: its checksum does not match" "$st"
st=0; rb verify "$repo" --all || st=$?
rb_expect 1 "verify --all with a damaged index" "00000001.idx" "$st"
st=0; rb gc "$repo" --grace 0 || st=$?
rb_expect 1 "gc stops at a damaged index" "gc removed nothing" "$st"
rb_restores "$repo" d1 2                    # the other point is fine
rb list "$repo" || check_fail "list with one damaged index: $(cat "$tmpdir/rb.log")"
grep -q '^  2 ' "$tmpdir/rb.log" || check_fail "list does not show run 2"
# Truncated.
head -c 100 "$tmpdir/idx1" >"$repo/index/d1/00000001.idx"
st=0; rb restore "$repo" "$tmpdir/o.img" --disk d1 --at 1 || st=$?
rb_expect 1 "restore from a truncated index" "damaged or not an index" "$st"
# Moved: run 1's index under run 3's name.
cp "$tmpdir/idx1" "$repo/index/d1/00000001.idx"
cp "$tmpdir/idx1" "$repo/index/d1/00000003.idx"
st=0; rb restore "$repo" "$tmpdir/o.img" --disk d1 --at 3 || st=$?
rb_expect 1 "an index under another run's name" "not where it belongs" "$st"
rm "$repo/index/d1/00000003.idx"
rb_restores "$repo" d1 1

# --- a config changed by hand ---------------------------------------------------------
cp "$repo/config" "$tmpdir/config"
sed -i 's/"chunk_size": 4194304/"chunk_size": 8388608/' "$repo/config"
cmp -s "$repo/config" "$tmpdir/config" && fail "the config edit did nothing"
st=0; rb list "$repo" --disk d1 || st=$?
rb_expect 1 "a changed config" "checksum does not match" "$st"
echo 'not json' >"$repo/config"
st=0; rb list "$repo" --disk d1 || st=$?
rb_expect 1 "a config that is not JSON" "not JSON" "$st"
cp "$tmpdir/config" "$repo/config"
rb list "$repo" || check_fail "the restored config: $(cat "$tmpdir/rb.log")"

# An encrypted repository whose config was made to look unencrypted
# (checksum recomputed): the key's owner is told, nothing is written.
enc=$(repo_loc enc)
head -c 32 /dev/urandom >"$tmpdir/key"; chmod 600 "$tmpdir/key"
rb init "$enc" --encrypt --key-file "$tmpdir/key" || fail "init enc"
"$PY" - "$enc/config" <<'PYEOF'
import hashlib, json, sys
p = sys.argv[1]
c = json.load(open(p))
del c["encryption"]
body = {k: v for k, v in c.items() if k not in ("checksum", "mac")}
c["checksum"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
open(p, "w").write(json.dumps(c))
PYEOF
st=0; rb -S "$ctl_a" -u "$origin_a" backup "$enc" --disk d1 --key-file "$tmpdir/key" || st=$?
rb_expect 1 "a config stripped of its encryption" "tampered\|not encrypted" "$st"
[ ! -e "$enc/index" ] && [ ! -e "$enc/chunks" ] || check_fail "a backup wrote into a tampered repository"

# --- S3 without a back end or endpoint -----------------------------------------------
st=0; rb list s3://bucket/prefix || st=$?
[ "$st" -eq 1 ] && grep -qi 's3' "$tmpdir/rb.log" ||
    check_fail "list s3://...: exit $st: $(cat "$tmpdir/rb.log")"

finish
