#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Fuzz the control protocol's request parser (control_parse_request and
# jansson under it) with libFuzzer for ~20 s:
# tests/fuzz-control-protocol.c, built here from the sources with
#
#   clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
#     ... src/control/control-protocol.c src/control/control-commands.c -ljansson
#
# from a small seed corpus of valid requests (every command, generated
# from the command table by tests/fuzz-control-dict.c) and a few near
# misses, with a dictionary of the protocol's tokens generated from the
# same table.  The seeds are
# first run once as a regression check.  A crash, leak, sanitizer report,
# broken promise (see the .c file) or timeout fails the test and prints
# the input that caused it (base64).  Skips (77) if clang or its libFuzzer
# runtime is missing.  SNAPFG_FUZZ_SECONDS overrides the 20 s.
set -euo pipefail
source "$(dirname "$0")/functions.sh"

have clang || skip "clang not found (needed for libFuzzer)"
srcdir=$top_srcdir
: "${top_builddir:=}"
if [ -z "$top_builddir" ]; then
    for d in "$PWD" "$PWD/.." "$srcdir"; do
        if [ -f "$d/config.h" ]; then top_builddir=$(cd "$d" && pwd); break; fi
    done
fi
[ -n "$top_builddir" ] && [ -f "$top_builddir/config.h" ] ||
    fail "config.h not found: run configure first (or set top_builddir)"
seconds=${SNAPFG_FUZZ_SECONDS:-20}

# Is the libFuzzer runtime there?
cat >"$tmpdir/probe.c" <<'EOF'
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput (const uint8_t *d, size_t n) { return 0; }
EOF
clang -fsanitize=fuzzer,address,undefined -o "$tmpdir/probe" "$tmpdir/probe.c" \
    >"$tmpdir/probe.err" 2>&1 ||
    { cat "$tmpdir/probe.err"; skip "clang cannot link -fsanitize=fuzzer,address,undefined (libFuzzer/sanitizer runtime missing)"; }

fuzzer="$tmpdir/fuzz-control-protocol"
info "building $fuzzer"
clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -I"$srcdir/src/control" -I"$srcdir/src/store" -I"$srcdir/common" -I"$top_builddir" \
    -o "$fuzzer" "$srcdir/tests/fuzz-control-protocol.c" \
    "$srcdir/src/control/control-protocol.c" "$srcdir/src/control/control-commands.c" \
    $(pkg-config --cflags --libs jansson) \
    >"$tmpdir/build.err" 2>&1 || { cat "$tmpdir/build.err"; fail "could not build the fuzz target"; }

# The dictionary and the seeds of every command come from the command
# table (every command and key), so that a new command is fuzzed too.
info "generating the dictionary from the command table"
clang -g -I"$srcdir/src/control" -I"$srcdir/src/store" -I"$srcdir/common" -I"$top_builddir" -o "$tmpdir/fuzz-control-dict" \
    "$srcdir/tests/fuzz-control-dict.c" "$srcdir/src/control/control-commands.c" \
    "$srcdir/src/control/control-protocol.c" $(pkg-config --cflags --libs jansson) \
    >"$tmpdir/dict-build.err" 2>&1 || { cat "$tmpdir/dict-build.err"; fail "could not build the dictionary generator"; }
"$tmpdir/fuzz-control-dict" >"$tmpdir/dict" || fail "the dictionary generator failed"
grep -qx '"\\"create\\""' "$tmpdir/dict" && grep -qx '"\\"chunk_size\\""' "$tmpdir/dict" ||
    fail "the generated dictionary lacks create or chunk_size: $(tr '\n' ' ' <"$tmpdir/dict")"
info "$(wc -l <"$tmpdir/dict") dictionary entries"

# The seed corpus: one file per request (no newline: the server strips
# it): a valid request per command with its required keys and one with
# all its keys (generated), then requests written by hand: odd values,
# odd JSON and near misses.
seeds="$tmpdir/seeds"
mkdir "$seeds"
"$tmpdir/fuzz-control-dict" seeds "$seeds" || fail "the seed generator failed"
[ -s "$seeds/cmd-create-all" ] && grep -q '"chunk_size":' "$seeds/cmd-create-all" ||
    fail "the generated seeds lack create with chunk_size: $(cat "$seeds/cmd-create-all" 2>&1)"
info "$(ls "$seeds" | wc -l) seeds generated from the command table"
i=0
while IFS= read -r line; do
    i=$((i + 1))
    printf '%s' "$line" >"$seeds/seed-$i"
done <<'EOF'
{"cmd":"create","name":"s2","cow":"/tmp/s2.cow","store":"transient","chunk_size":65536,"cow_size":1073741824}
{"cmd":"create","name":"s\u00e9\n\"x","cow":"/tmp/a b\\c","store":"persistent","chunk_size":4096}
{"cmd":"set-block-size","block_size":512}
 { "cmd" : "status" , "name" : "x" } 
{"cmd":"status","name":"nosuch"}
{"cmd":"list","x":[1,2.5e3,-0,true,false,null,{"a":{}}]}
{"cmd":"set-block-size","block_size":18446744073709551616}
{"cmd":"create","name":"a","cow":"rel","chunk_size":-1}
[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
{"cmd":"status","cmd":"list"}
"\ud83d\ude00\u0000"
EOF
printf '{"cmd":"status"}\0{"cmd":"list"}' >"$seeds/seed-nul"
printf '{"cmd":"list"}%4082s' "" >"$seeds/seed-4096"    # exactly the limit
printf '{"cmd":"list"}%4083s' "" >"$seeds/seed-4097"    # one over
info "$(ls "$seeds" | wc -l) seed inputs"

# report_crash: show what failed and the input, so it can be replayed
# with: base64 -d > crash && ./fuzz-control-protocol crash
report_crash() {
    local f
    for f in "$tmpdir"/crash-* "$tmpdir"/leak-* "$tmpdir"/timeout-* "$tmpdir"/oom-*; do
        [ -f "$f" ] || continue
        echo "--- $(basename "$f") ($(file_size "$f") bytes), base64:" >&2
        base64 -w 76 "$f" >&2
        echo "--- as text (first 300 bytes):" >&2
        head -c 300 "$f" | cat -v >&2
        echo >&2
    done
}

info "running the seeds once"
if ! "$fuzzer" -artifact_prefix="$tmpdir/" "$seeds"/* >"$tmpdir/seeds.log" 2>&1; then
    tail -n 40 "$tmpdir/seeds.log" >&2
    report_crash
    fail "a seed input already fails"
fi
info "ok: every seed parses or is refused cleanly"

info "fuzzing for $seconds s"
corpus="$tmpdir/corpus"
mkdir "$corpus"
st=0
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=4200 -dict="$tmpdir/dict" -artifact_prefix="$tmpdir/" \
    -print_final_stats=1 "$corpus" "$seeds" >"$tmpdir/fuzz.log" 2>&1 || st=$?
grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added)' \
    "$tmpdir/fuzz.log" || true
if [ "$st" -ne 0 ]; then
    grep -B5 -A40 -E 'ERROR|broken promise|SUMMARY|runtime error' "$tmpdir/fuzz.log" | head -n 80 >&2 ||
        tail -n 60 "$tmpdir/fuzz.log" >&2
    report_crash
    fail "the fuzzer found a problem (exit status $st)"
fi
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmpdir/fuzz.log")
[ "${runs:-0}" -gt 1000 ] || fail "the fuzzer ran only '${runs:-?}' inputs"
info "ok: $runs inputs in $seconds s, no crash, leak, sanitizer report or broken promise; corpus grew to $(ls "$corpus" | wc -l) inputs"
info PASS
