#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Reopening a persistent store with many exceptions: start-up time and
# resident memory per exception.
#
#   contrib/bench/startup.sh [EXCEPTIONS]      (default 1000000)
#
# Writes a dm-snapshot persistent store by hand (header and metadata
# areas only; the data chunks are holes, never read at start-up) for a
# sparse origin with one 4 KiB chunk per exception, then times
# "nbdkit ... --run true" (start, load every exception, stop) against an
# empty store, and compares nbdkit's peak RSS in the two cases.
set -euo pipefail
n=${1:-1000000}
top=$(cd "$(dirname "$0")/../.." && pwd)
plugin=${SNAPFG_PLUGIN:-$top/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

truncate -s $((n * 4096)) "$tmp/origin.img"
/usr/bin/python3 - "$tmp/full.cow" "$n" <<'PY'
import struct, sys
path, n = sys.argv[1], int(sys.argv[2])
chunk = 4096
ppa = chunk // 16
with open(path, "wb") as f:
    f.write(struct.pack("<4I", 0x70416e53, 1, 1, chunk // 512).ljust(chunk, b"\0"))
    area, old, new = 0, 0, 2
    while old < n:
        pairs = []
        for _ in range(min(ppa, n - old)):
            pairs.append(struct.pack("<QQ", old, new))
            old += 1
            new += 1
            if (new - 1) % (ppa + 1) == 0:    # skip the next metadata area
                new += 1
        f.seek((1 + (ppa + 1) * area) * chunk)
        f.write(b"".join(pairs).ljust(chunk, b"\0"))
        area += 1
    # the area after a full one is zero (the end of the table)
    f.seek((1 + (ppa + 1) * area) * chunk)
    f.write(b"\0" * chunk)
    f.truncate((1 + (ppa + 1) * (area + 1)) * chunk)
PY

measure() {   # COW -> "seconds maxrss_kb"
    /usr/bin/time -f '%e %M' -o "$tmp/time" \
        nbdkit -U - "$plugin" origin="$tmp/origin.img" cow="$1" --run true
    cat "$tmp/time"
}
"$top/tools/snapfgctl/snapfgctl" inspect "$tmp/full.cow" | grep -E '^(exceptions|status)'
read -r t_full rss_full < <(measure "$tmp/full.cow")
rm -f "$tmp/empty.cow"
read -r t_empty rss_empty < <(measure "$tmp/empty.cow")
echo "| store | start+stop (s) | peak RSS (KiB) |"
echo "|---|---|---|"
echo "| empty | $t_empty | $rss_empty |"
echo "| $n exceptions | $t_full | $rss_full |"
awk -v n="$n" -v a="$rss_full" -v b="$rss_empty" -v t="$t_full" -v t0="$t_empty" 'BEGIN {
    printf "reopen time for %d exceptions: %.2f s (%.2f s more than an empty store)\n", n, t, t - t0;
    printf "memory per exception: %.1f bytes (peak RSS difference / exceptions)\n", (a - b) * 1024 / n }'
