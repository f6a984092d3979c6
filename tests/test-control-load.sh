#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Snapshots taken at run time (snapfgctl create) while writers hammer the
# origin: each snapshot must hold the origin's contents at one instant.
#
# Four writer connections each own interleaved blocks of the origin and
# write sequence-numbered blocks to them in a fixed cyclic order, one
# write in flight each, logging when every write was issued and
# acknowledged (tests/control-io.py load).  While they run, snap1 and,
# a while later, snap2 are created.  Each snapshot is read under load
# and again after the writers stop, and must show, for every writer,
# exactly a prefix of its writes (all writes up to a cut, none after),
# with the cuts consistent with real time: writes acknowledged before
# "create" was sent are in it, writes issued after it returned are not,
# and no write is in it while a write acknowledged before it was issued
# is missing.  snap1 must still show the same cut at the end.
#
# Two configurations: whole-chunk writes with striped locking (snap1
# persistent 4K chunks, snap2 transient 64K chunks), and sub-chunk
# 512-byte writes with global locking and slowed copy-outs
# (SNAPFG_TEST_DELAY_US) so that copy-outs are in progress while the
# snapshot is taken (snap1 transient 4K, snap2 persistent 16K).
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

size=$((4 * 1024 * 1024))
orig="$tmpdir/original.img"
make_random_image "$orig" "$size"

# run_load LABEL BLOCKSIZE NBDKIT-PARAMS... -- SNAPSPECS...
run_load() {
    local label=$1 bs=$2 params=() snaps=() sock pid ctlsock origin region
    shift 2
    while [ "$1" != -- ]; do params+=("$1"); shift; done
    shift
    for s in "$@"; do snaps+=(--snap "$s"); done
    sock="$tmpdir/$label.sock"
    pid="$tmpdir/$label.pid"
    ctlsock="$tmpdir/$label.ctl"
    origin="$tmpdir/$label-origin.img"
    mkdir -p "$tmpdir/$label-logs"
    cp "$orig" "$origin"
    info "--- $label: ${params[*]}"
    start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock" "${params[@]}"
    if ! timeout 120 "$PY" "$CTL_IO" load --sock "$sock" --ctl "$SNAPFGCTL" \
            --ctl-sock "$ctlsock" --original "$orig" --writers 4 --blocks 64 \
            --block-size "$bs" --gap 1.5 --log-dir "$tmpdir/$label-logs" \
            "${snaps[@]}"; then
        check_fail "$label: a snapshot taken under load is not one instant of the origin (writer logs kept in $tmpdir/$label-logs with KEEP_TMP=1)"
    else
        info "ok: $label: every snapshot is a consistent cut of the writers' sequences at its own instant"
    fi
    # Every block of the writers' region was written after each snapshot
    # was taken, so "changed" reports the region as one extent.
    region=$((4 * 64 * bs))
    for s in "$@"; do
        local name=${s%%,*} chunk=${s##*,} want
        want="0 $(( (region + chunk - 1) / chunk * chunk ))"
        ctl "$ctlsock" changed "$name" || true
        if [ "$(head -n1 "$tmpdir/ctl.out")" = "$want" ] &&
           [ "$(grep -vc '^#' "$tmpdir/ctl.out")" -eq 1 ]; then
            info "ok: $label: changed $name: one extent '$want' (the writers' region)"
        else
            check_fail "$label: changed $name: expected the single extent '$want', got: $(tr '\n' '|' <"$tmpdir/ctl.out")"
        fi
        ctl "$ctlsock" --json status "$name" || true
        local state
        state=$(jq_py "$tmpdir/ctl.out" 'd["snapshots"][0]["state"]' 2>/dev/null || echo '?')
        [ "$state" = valid ] || check_fail "$label: $name is '$state' after the load, expected valid"
    done
    stop_nbdkit "$pid"
}

run_load striped 4096 -- \
    "snap1,$tmpdir/striped-snap1.cow,persistent,4096" \
    "snap2,$tmpdir/striped-snap2.cow,transient,65536"

SNAPFG_TEST_DELAY_US=300 run_load global 512 locking=global -- \
    "snap1,$tmpdir/global-snap1.cow,transient,4096" \
    "snap2,$tmpdir/global-snap2.cow,persistent,16384"

finish
