#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Lock microbenchmark: timing table, then callgrind instruction counts
# per read acquire+release (repeatable, unlike times on a shared machine).
set -euo pipefail
bin=${1:-contrib/bench/lock-bench}
seconds=${LOCK_BENCH_SECONDS:-1}

echo "## Read-side acquire+release, ns per op per thread ($(nproc) CPUs)"
"$bin" "$seconds"

if command -v valgrind >/dev/null; then
    echo
    echo "## Instructions per read lock+unlock pair (callgrind, 1 thread)"
    echo "| lock | instructions/op |"
    echo "|---|---|"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # Two runs with different iteration counts; the difference divided
    # by the difference in iterations removes start-up costs.  The
    # binary runs all three locks, so count per function.
    for iters in 100000 200000; do
        LOCK_BENCH_ITERS=$iters valgrind --tool=callgrind \
            --callgrind-out-file="$tmp/cg.$iters" "$bin" 0 1 >/dev/null 2>&1
    done
    # Report the inclusive cost of each lock entry point.  ("|| true":
    # awk stops reading early, which pipefail would count as a failure.)
    for fnpat in 'percpu_rwlock_read_lock' 'percpu_rwlock_read_unlock' \
                 'pthread_rwlock_rdlock' 'pthread_rwlock_unlock' \
                 'pthread_mutex_lock' 'pthread_mutex_unlock' ; do
        a=$(callgrind_annotate --inclusive=yes "$tmp/cg.100000" 2>/dev/null |
            awk -v f="$fnpat" '$0 ~ f"[^_a-z]" || $0 ~ f"$" {gsub(",","",$1); print $1; exit}' || true)
        b=$(callgrind_annotate --inclusive=yes "$tmp/cg.200000" 2>/dev/null |
            awk -v f="$fnpat" '$0 ~ f"[^_a-z]" || $0 ~ f"$" {gsub(",","",$1); print $1; exit}' || true)
        if [ -n "$a" ] && [ -n "$b" ]; then
            echo "| $fnpat | $(( (b - a) / 100000 )) |"
        fi
    done
fi
