#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup's runs managed: differential runs (--diff) and empty
# runs (nothing changed: no image), verify [--at N | --all], list
# (text and --json), prune --keep-last N (every point kept restores and
# verifies, the chain goes on, checkpoints no run needs are dropped);
# and the rough edges: restore DIR - writes standard output, restore
# shows progress on a terminal, --cow-dir is created, a run against an
# unreachable server leaves no directory.  Every restore is compared
# byte for byte with the origin saved at the run's instant.

set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
require_backup_tools

backup_server $((16 * 1024 * 1024)) make_compressible


# --- differential and empty runs ----------------------------------------------
d="$tmpdir/diff"
bk_run "$d" 1
write_random_blocks "$origin" 30 21 "$size"
bk_run "$d" 2 --diff
write_random_blocks "$origin" 30 22 "$size"
bk_run "$d" 3 --diff
[ "$(manifest_field "$d" 3 type)" = differential ] || check_fail "run 3 is not differential"
[ "$(qemu-img info --output=json "$d/0003-diff.qcow2" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["backing-filename"])')" = 0001-full.qcow2 ] ||
    check_fail "the differential's backing file is not the full image"
c2=$(manifest_field "$d" 2 ranges_bytes); c3=$(manifest_field "$d" 3 ranges_bytes)
[ "$c3" -gt "$c2" ] || check_fail "the second differential ($c3 bytes) is not a superset of the first ($c2)"
# Nothing written: an empty run, no image.
before=$(ls "$d" | wc -l)
bk_run "$d" 4
[ "$(manifest_field "$d" 4 empty)" = True ] || check_fail "an unchanged disk did not give an empty run"
grep -q 'nothing changed' "$tmpdir/bk.log" || check_fail "the empty run does not say so"
ls "$d" | grep -q '^0004' && check_fail "the empty run wrote $(ls "$d" | grep '^0004')"
cp "$tmpdir/expect-diff-3.img" "$tmpdir/expect-diff-4.img" 2>/dev/null || true
write_random_blocks "$origin" 30 23 "$size"
bk_run "$d" 5
for n in 1 2 3 4 5; do bk_restores "$d" $n; done

# --- verify and list -------------------------------------------------------------
bk verify "$d" --all || check_fail "verify --all: $(cat "$tmpdir/bk.log")"
[ "$(grep -c 'verified' "$tmpdir/bk.log")" -eq 5 ] || check_fail "verify --all did not verify 5 runs: $(cat "$tmpdir/bk.log")"
"$SNAPFG_BACKUP" list "$d" >"$tmpdir/list" 2>&1 || check_fail "list failed"
[ "$(wc -l <"$tmpdir/list")" -eq 6 ] && grep -q '^3 *differential *20[0-9-]*T[0-9:]*Z .* yes ' "$tmpdir/list" ||
    check_fail "list: $(cat "$tmpdir/list")"
"$SNAPFG_BACKUP" list "$d" --json >"$tmpdir/list.json" || check_fail "list --json failed"
"$PY" - "$tmpdir/list.json" "$d" <<'PYEOF' || check_fail "list --json: $(cat "$tmpdir/list.json")"
import json, os, sys
doc = json.load(open(sys.argv[1]))
runs = doc["runs"]
assert [r["seq"] for r in runs] == [1, 2, 3, 4, 5], runs
assert [r["type"] for r in runs] == ["full", "differential", "differential", "incremental", "incremental"]
assert runs[3]["empty"] and runs[3]["image_size"] == 0
assert runs[0]["image_size"] == os.stat(os.path.join(sys.argv[2], "0001-full.qcow2")).st_size
assert all(r["verified"] for r in runs)
assert all(r["checkpoint"].startswith("snapfg-backup-") for r in runs)
assert runs[0]["started"].endswith("Z") and runs[0]["duration"] >= 0 and runs[0]["bytes_copied"] > 0
PYEOF
bk verify "$d" --json --at 2 || check_fail "verify --json --at 2"
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] and d["runs"] == [{"seq": 2, "verified": True}], d' "$tmpdir/bk.log" ||
    check_fail "verify --json: $(cat "$tmpdir/bk.log")"
# A damaged image: verify fails, naming the run.
cp -a "$d" "$tmpdir/damaged"
"$PY" - "$tmpdir/damaged/0005-incr.qcow2" <<'PYEOF'
import nbd, sys
h = nbd.NBD()
h.connect_systemd_socket_activation(["qemu-nbd", "-f", "qcow2", sys.argv[1]])
h.pwrite(b"\x5a" * 4096, 7 << 20)
h.flush()
h.shutdown()
PYEOF
st=0; bk verify "$tmpdir/damaged" || st=$?
bk_expect_status 1 "verify of a damaged image" "differs from run 5" "$st"

# --- prune -------------------------------------------------------------------------
write_random_blocks "$origin" 30 24 "$size"
bk_run "$d" 6
write_random_blocks "$origin" 30 25 "$size"
bk_run "$d" 7 --diff
ck_before=$(our_checkpoints "$ctl" | wc -l)
bk -S "$ctl" prune "$d" --keep-last 3 --json || check_fail "prune --keep-last 3: $(cat "$tmpdir/bk.log")"
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] and d["removed_runs"] == [1, 2, 3, 4], d' "$tmpdir/bk.log" ||
    check_fail "prune --json: $(cat "$tmpdir/bk.log")"
[ "$("$PY" -c 'import json,sys; print([r["seq"] for r in json.load(open(sys.argv[1]+"/manifest.json"))["runs"]])' "$d")" = "[5, 6, 7]" ] ||
    check_fail "prune kept the wrong runs"
[ "$(manifest_field "$d" 5 type)" = full ] || check_fail "the oldest run kept is not a full run"
ls "$d" | grep -q '^000[234]' && check_fail "prune left files of the runs it removed: $(ls "$d")"
for n in 5 6 7; do bk_restores "$d" $n; done
bk verify "$d" --all || check_fail "verify --all after prune: $(cat "$tmpdir/bk.log")"
# The chain goes on, incremental and differential.
write_random_blocks "$origin" 30 26 "$size"
bk_run "$d" 8
write_random_blocks "$origin" 30 27 "$size"
bk_run "$d" 9 --diff
for n in 8 9; do bk_restores "$d" $n; done
# Checkpoints of a chain whose runs are gone: prune drops those no run needs.
"$SNAPFGCTL" -S "$ctl" create stray-snap --checkpoint "snapfg-backup-$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]+"/manifest.json"))["chain_id"])' "$d")-0099-dead" >/dev/null 2>&1 &&
    "$SNAPFGCTL" -S "$ctl" drop stray-snap >/dev/null 2>&1 || true
# A directory deleted by hand leaves its chain's checkpoint: prune of
# any chain drops it (and so does the next backup run of any chain:
# test-backup-defects.sh); one of a directory that is still there is
# kept.
bk_run "$tmpdir/other" 1
other_ck=$(manifest_field "$tmpdir/other" 1 checkpoint)
bk_run "$tmpdir/deleted" 1
gone_ck=$(manifest_field "$tmpdir/deleted" 1 checkpoint)
rm -rf "$tmpdir/deleted"
bk -S "$ctl" prune "$d" --keep-last 10 || check_fail "prune --keep-last 10: $(cat "$tmpdir/bk.log")"
our_checkpoints "$ctl" | grep -qx "$gone_ck" && check_fail "prune left $gone_ck, whose directory is gone"
our_checkpoints "$ctl" | grep -qx "$other_ck" || check_fail "prune dropped $other_ck, the checkpoint of another directory's chain"
grep -q "dropped checkpoint $gone_ck (no run needs it, made for .*deleted)" "$tmpdir/bk.log" ||
    check_fail "prune does not say it dropped $gone_ck: $(cat "$tmpdir/bk.log")"
our_checkpoints "$ctl" | grep -q 0099-dead && check_fail "prune left a checkpoint no run needs"
[ "$(our_checkpoints "$ctl" | grep -c "$(manifest_field "$d" 9 checkpoint)")" -eq 1 ] ||
    check_fail "prune dropped the last run's checkpoint: $(our_checkpoints "$ctl")"
drop_our_checkpoints

# A prune killed midway (after the marks, after the commit and rebase):
# the runs kept still restore, the ones going are refused, a backup
# waits for the prune, and prune run again finishes.
for point in prune-marked prune-rebased; do
    p="$tmpdir/pr-$point"
    for n in 1 2 3 4; do
        bk_run "$p" $n
        write_random_blocks "$origin" 30 $((40 + n)) "$size"
    done
    rm -f "$tmpdir/resume"
    SNAPFG_BACKUP_TEST_PAUSE=$point SNAPFG_BACKUP_TEST_RESUME="$tmpdir/resume" \
        "$SNAPFG_BACKUP" prune "$p" --keep-last 2 >"$tmpdir/prune.log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do
        grep -q '"pruning": true' "$p/manifest.json" && break
        sleep 0.1
    done
    sleep 1
    kill -KILL "$pid"; wait "$pid" 2>/dev/null || true
    grep -q '"pruning": true' "$p/manifest.json" || check_fail "$point: the prune did not mark the runs"
    for n in 3 4; do bk_restores "$p" $n; done
    st=0; bk restore "$p" "$tmpdir/gone.img" --at 1 || st=$?
    bk_expect_status 1 "$point: a run being pruned is not restored" 'being pruned' "$st"
    st=0; bk -S "$ctl" -u "$origin" backup "$p" || st=$?
    bk_expect_status 1 "$point: a backup after an interrupted prune" 'prune again' "$st"
    bk prune "$p" --keep-last 2 || check_fail "$point: prune again: $(cat "$tmpdir/bk.log")"
    for n in 3 4; do bk_restores "$p" $n; done
    bk verify "$p" --all || check_fail "$point: verify --all after the prune finished: $(cat "$tmpdir/bk.log")"
    drop_our_checkpoints
done

# --- the rough edges -------------------------------------------------------------
# restore DIR - : the disk on standard output.
bk restore "$d" - --at 8 >/dev/null 2>&1 || true
"$SNAPFG_BACKUP" restore "$d" - --at 8 >"$tmpdir/stdout.img" 2>"$tmpdir/bk.log" ||
    check_fail "restore DIR -: $(cat "$tmpdir/bk.log")"
cmp "$tmpdir/stdout.img" "$tmpdir/expect-diff-8.img" || check_fail "restore DIR - differs from run 8"
ls "$tmpdir" | grep -q '^-' && check_fail "restore DIR - wrote a file named -"
# Progress while restoring, on a terminal.
if have script; then
    script -qec "$SNAPFG_BACKUP restore $d $tmpdir/tty.img --at 9" /dev/null >"$tmpdir/tty.log" 2>&1 || true
    grep -q 'restore: .* MiB (100%), .* MiB/s' "$tmpdir/tty.log" ||
        check_fail "no progress line while restoring on a terminal: $(tr '\r' '\n' <"$tmpdir/tty.log" | tail -n 3)"
    cmp "$tmpdir/tty.img" "$tmpdir/expect-diff-9.img" || check_fail "restore on a terminal differs"
fi
# --cow-dir that does not exist yet is created.
bk_run "$tmpdir/cow-run" 1 --cow-dir "$tmpdir/cows-new"
[ -d "$tmpdir/cows-new" ] || check_fail "--cow-dir was not created"
[ -z "$(ls -A "$tmpdir/cows-new")" ] || check_fail "--cow-dir keeps $(ls "$tmpdir/cows-new")"
bk_restores "$tmpdir/cow-run" 1
drop_our_checkpoints
# An unreachable server leaves no backup directory.
st=0; bk -S "$tmpdir/no-such-sock" -u "nbd+unix:///?socket=$tmpdir/no-such" backup "$tmpdir/unreached" || st=$?
[ "$st" -ne 0 ] && [ ! -e "$tmpdir/unreached" ] ||
    check_fail "a run against an unreachable server: exit $st, left $(ls -a "$tmpdir/unreached" 2>&1)"

stop_nbdkit "$pidf"
finish
