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
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

origin="$tmpdir/origin.img"
make_random_image "$origin" $((8 * 1024 * 1024))

"$PY" "$_cfn_dir/lifecycle-loop.py" --dir "$tmpdir" --plugin "$SNAPFG_PLUGIN" \
    --snapfgctl "$SNAPFGCTL" --origin "$origin" --state "$tmpdir/catalogue.json" \
    --rounds "${SNAPFG_LOOP_ROUNDS:-8}" --seed "${SNAPFG_LOOP_SEED:-$RANDOM}" ||
    fail "the kill -9 loop failed (above)"
"$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["format"] == "snapfg-catalogue" and d["version"] == 1, d
kinds = {e["event"] for e in d["events"]}
print("catalogue events seen:", sorted(kinds))
' "$tmpdir/catalogue.json" || check_fail "the catalogue after the loop is not as documented"
finish
