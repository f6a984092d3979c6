#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# state=: a kill -9 loop (issue 9).  Every round starts nbdkit with
# origin=, state= and control=, checks that exactly the persistent
# snapshots created before come back, each byte for byte as the origin
# was at its instant, that transient ones are gone, that an interrupted
# merge resumed by itself and finished, and that the origin holds every
# acknowledged write; then a writer runs on the origin while snapshots
# are created (in the state directory or with --cow, persistent and
# transient), dropped and merged, until nbdkit is killed with SIGKILL at a
# random moment.  The driver is tests/lifecycle-loop.py.
#
# The loop runs twice: with writeback=off, where every acknowledged
# write must survive the kill, and with writeback=on, where the writer
# flushes now and then and every flushed write must survive (each
# sector holds its flushed contents or a write made since).
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

loop_seed=${SNAPFG_LOOP_SEED:-$RANDOM}
info "loop seed $loop_seed (set SNAPFG_LOOP_SEED to repeat)"

for mode in off on; do
    info "=== the kill -9 loop with writeback=$mode"
    dir="$tmpdir/loop-$mode"
    mkdir "$dir"
    origin="$dir/origin.img"
    make_random_image "$origin" $((8 * 1024 * 1024))
    "$PY" "$_cfn_dir/lifecycle-loop.py" --dir "$dir" --plugin "$SNAPFG_PLUGIN" \
        --snapfgctl "$SNAPFGCTL" --origin "$origin" --state "$dir/catalogue.json" \
        --rounds "${SNAPFG_LOOP_ROUNDS:-$(soak_or 4 16)}" --seed "$loop_seed" --writeback "$mode" ||
        fail "the kill -9 loop with writeback=$mode failed (above; seed $loop_seed)"
    "$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["format"] == "snapfg-catalogue" and d["version"] == 1, d
kinds = {e["event"] for e in d["events"]}
print("catalogue events seen:", sorted(kinds))
' "$dir/catalogue.json" || check_fail "the catalogue after the loop is not as documented"
done
finish
