#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Set up a Debian 12 or Debian 13 machine for snapfg, build and install
# it, then run the demo or the test suite.
#
#   contrib/run.sh demo [ORIGIN]   build, install, run contrib/demo.sh
#   contrib/run.sh test            build, install, make check and
#                                  make check-guest, with make
#                                  check-sanitizers alongside (every
#                                  test once: make check leaves out
#                                  those a sanitizer tree runs)
#   contrib/run.sh check           build, install, make check (every
#                                  test) and make check-guest
#                                  (.ci/run's Debian 13 stage)
#   contrib/run.sh deps            only install the packages
#
# Run it as root (or as a user with sudo) from a clone of the repository.
# It installs only the Debian packages that are missing.

set -euo pipefail

usage() {
    echo "usage: $0 demo [ORIGIN] | test | check | deps" >&2
    exit 2
}
[ $# -ge 1 ] || usage
cmd=$1
shift
case $cmd in
    demo) [ $# -le 1 ] || usage ;;
    test|check|deps) [ $# -eq 0 ] || usage ;;
    *) usage ;;
esac

top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

say() { echo "=== run.sh: $*"; }

# Use the system's tools first: python3-libnbd (nbdsh) is installed for
# Debian's /usr/bin/python3, not for another python3 earlier in PATH.
export PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
else
    echo "run.sh: run this as root (or install sudo)" >&2
    exit 1
fi

# --- packages -------------------------------------------------------------
# Required packages: the same names on Debian 12 (bookworm) and Debian 13
# (trixie); installed in one apt-get call, which fails if one is missing.
required=(
    # build
    build-essential autoconf automake libtool pkg-config perl
    nbdkit nbdkit-plugin-dev libnbd-dev libev-dev libjansson-dev
    # snapfg-backup's checksums and the repository's encryption (GnuTLS),
    # the repository's compression (zstd)
    libgnutls28-dev libzstd-dev
    # the backup repository's S3 back end: libcurl (GnuTLS flavour, like
    # the rest of the stack; AWS Signature V4) and libxml2 for its replies
    libcurl4-gnutls-dev libxml2-dev
    # gcc's sanitizer runtimes (make check-sanitizers)
    libtsan2 libasan8 libubsan1
    # tests, demo and benchmark
    libnbd-bin python3 python3-libnbd qemu-utils fio jq
    coreutils diffutils util-linux mount procps socat strace
    # tests/test-powercut-repo.sh: a repository on ext4 on a loop device
    e2fsprogs
    # TLS tests (psktool), systemd-analyze verify of the service unit
    gnutls-bin systemd
    # the S3 tests' gateway (tests/s3-functions.sh): a throwaway Ceph
    # cluster with a RADOS Gateway on 127.0.0.1, and curl to drive it
    ceph-mon ceph-osd radosgw ceph-common curl
    # snapfg-backup -H (tests/test-backup-remote.sh starts its own sshd)
    openssh-client openssh-server
    # guest tests (make check-guest): QEMU, cpio for the initramfs, the
    # module decompressors (Debian 12 kernels ship .ko, 13 ones .ko.xz)
    qemu-system-x86 cpio xz-utils zstd
    # the benchmark's QEMU fleecing peer (qemu-storage-daemon)
    qemu-system-common
    # .ci/run's Debian 13 stage (contrib/debian13.sh)
    debootstrap git tar
)
# Optional packages: tests that need them skip without them.  Each is
# installed on its own, so that a name one release lacks never stops the
# others.  The libFuzzer runtime's name carries clang's major version
# (libclang-rt-14-dev on Debian 12, libclang-rt-19-dev on Debian 13): it
# is chosen after clang is installed.
optional=(gnuplot-nox valgrind clang)

installed() {
    dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed$'
}
apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
        apt_updated=1
    fi
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "$@"
}
# install_optional PKG: install PKG if the archive has it; say so if not.
install_optional() {
    installed "$1" && return 0
    say "installing optional package $1"
    apt_install "$1" ||
        say "optional package $1 is not available here: the tests that need it will be skipped"
}

missing=()
for p in "${required[@]}"; do
    installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt_install "${missing[@]}"
else
    say "all required packages are installed"
fi
for p in "${optional[@]}"; do
    install_optional "$p"
done
if command -v clang >/dev/null 2>&1; then
    clang_major=$(clang -dumpversion | cut -d. -f1)
    install_optional "libclang-rt-$clang_major-dev"
fi
# nbdfuse (tests/test-powercut-files.sh): part of libnbd-bin on Debian
# 12, a package of its own where the archive splits it out.
command -v nbdfuse >/dev/null 2>&1 || install_optional nbdfuse
[ "$cmd" = deps ] && { say "packages ready"; exit 0; }

# --- build and install ----------------------------------------------------
# Every step's time goes to stage-times.txt, a "NAME<TAB>SECONDS<TAB>
# RESULT<TAB>CPU" line each, which .ci/run prints at its end: where the
# time went.  CPU is the user + system seconds the step's processes used:
# on a machine shared with other work the wall-clock time grows with the
# load, the CPU time much less.
rm -f "$top/stage-times.txt"
record_time() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$top/stage-times.txt"; }
# cpu_children: set $cpu to the CPU seconds of the children waited for so
# far (bash's times, run in this shell: in a $(...) it would count the
# subshell's children only).
cpu_file=$(mktemp "${TMPDIR:-/tmp}/snapfg-run-times.XXXXXX")
trap 'rm -f "$cpu_file"' EXIT
cpu_children() {
    times >"$cpu_file"
    cpu=$(tail -n 1 "$cpu_file" | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } printf "%d\n", s + 0.5 }')
}
cpu_children
cpu0=$cpu
t0=$SECONDS
say "building in $top"
mkdir -p m4            # AC_CONFIG_MACRO_DIR; git does not keep empty directories
autoreconf -fi
./configure
make -j2
say "installing the plugin into nbdkit's plugindir ($(pkg-config --variable=plugindir nbdkit))"
"${SUDO[@]}" make install
nbdkit snapfg --version >/dev/null ||
    { echo "run.sh: 'nbdkit snapfg' does not find the installed plugin" >&2; exit 1; }
cpu_children
record_time "build and install" $((SECONDS - t0)) PASS $((cpu - cpu0))

# --- the job --------------------------------------------------------------
case $cmd in
    demo)
        say "running contrib/demo.sh $*"
        rm -f "$cpu_file"
        exec "$top/contrib/demo.sh" "$@"
        ;;
esac

# Sum the automake test-suite.log headers of the trees given.
count() {
    local key=$1 f n total=0
    shift
    for f in "$@"; do
        [ -f "$f" ] || continue
        n=$(sed -n "s/^# $key: *\([0-9]*\).*/\1/p" "$f" | head -n 1)
        total=$((total + ${n:-0}))
    done
    echo "$total"
}

# stage NAME COMMAND...: run a make target, record its status and time.
status=0
declare -A stage_st=() stage_time=()
stages=()
stage_done() {  # NAME STATUS SECONDS [CPU-SECONDS]
    stage_st[$1]=$2
    stage_time[$1]=$3
    stages+=("$1")
    [ "$2" -eq 0 ] || status=1
    record_time "$1" "$3" "$([ "$2" -eq 0 ] && echo PASS || echo "FAIL($2)")" "${4:-}"
    say "$1: $([ "$2" -eq 0 ] && echo PASS || echo "FAIL (status $2)") in $3 s${4:+ (CPU $4 s)}"
}
stage() {
    local name=$1 t0=$SECONDS st=0 c0
    shift
    say "$name"
    cpu_children
    c0=$cpu
    "$@" || st=$?
    cpu_children
    stage_done "$name" "$st" $((SECONDS - t0)) $((cpu - c0))
}

# The tests spend most of their time waiting on servers, clients and
# sleeps, so two at a time (SNAPFG_CHECK_JOBS) roughly halve the suite's
# time on a 2-core machine; each test keeps its own directory and sockets.
check_jobs=${SNAPFG_CHECK_JOBS:-2}
export SNAPFG_CHECK_JOBS=$check_jobs

# make check-sanitizers runs side by side with make check and make
# check-guest (SNAPFG_SANITIZERS_ALONGSIDE=0: after them): its two
# builds run in the CPU the waiting tests leave, and
# its tests are a short list (Makefile.am SANITIZER_*_TESTS), one at a
# time in each of its two trees (SNAPFG_SANITIZER_CHECK_JOBS).  Its
# output goes to ci-sanitizers.log, printed when it ends.
san_pid=
run_sanitizers() {
    SNAPFG_SANITIZER_CHECK_JOBS=${SNAPFG_SANITIZER_CHECK_JOBS:-1} \
        make check-sanitizers VERBOSE=1
}
if [ "$cmd" = test ] && [ "${SNAPFG_SANITIZERS_ALONGSIDE:-1}" = 1 ]; then
    say "make check-sanitizers: started alongside (output in ci-sanitizers.log, printed when it ends)"
    san_t0=$SECONDS
    run_sanitizers >"$top/ci-sanitizers.log" 2>&1 &
    san_pid=$!
fi
# With make check-sanitizers in the same run, make check leaves out the
# end-to-end tests a sanitizer tree runs (Makefile.am
# check-beside-sanitizers): they run once, instrumented, with every
# check of theirs.  contrib/run.sh check (and CI's Debian 13 stage) runs
# every test uninstrumented.
if [ "$cmd" = test ]; then
    stage "make check" make -j"$check_jobs" check-beside-sanitizers VERBOSE=1
else
    stage "make check" make -j"$check_jobs" check VERBOSE=1
fi
stage "make check-guest" make check-guest VERBOSE=1
if [ -n "$san_pid" ]; then
    say "make check-sanitizers: waiting for it"
    san_st=0
    cpu_children
    c0=$cpu
    wait "$san_pid" || san_st=$?
    cpu_children
    say "make check-sanitizers: its output:"
    cat "$top/ci-sanitizers.log"
    stage_done "make check-sanitizers (alongside)" "$san_st" $((SECONDS - san_t0)) $((cpu - c0))
elif [ "$cmd" = test ]; then
    stage "make check-sanitizers" run_sanitizers
fi
# The sanitizer passes' own split (run-sanitizers.sh prints them).
for k in tsan asan; do
    [ -f "$top/build-$k.log" ] || continue
    b=$(sed -n 's/.*: built in \([0-9]*\) s$/\1/p' "$top/build-$k.log" | tail -n 1)
    c=$(sed -n 's/.*: tests ran in \([0-9]*\) s .*/\1/p' "$top/build-$k.log" | tail -n 1)
    [ -z "$b" ] || record_time "  $k build" "$b" ""
    [ -z "$c" ] || record_time "  $k tests" "$c" ""
done

logs=(test-suite.log guest-suite.log build-tsan/tree/test-suite.log build-asan/tree/test-suite.log)
passed=$(count PASS "${logs[@]}")
failed=$(( $(count FAIL "${logs[@]}") + $(count ERROR "${logs[@]}") + $(count XPASS "${logs[@]}") ))
skipped=$(count SKIP "${logs[@]}")
for n in "${stages[@]}"; do
    say "$n: $([ "${stage_st[$n]}" -eq 0 ] && echo PASS || echo "FAIL (status ${stage_st[$n]})") (${stage_time[$n]} s)"
done
# A build or harness failure counts even when no test result says so.
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1
fi
# Tests that passed with parts of them skipped (tests/functions.sh
# skip_part: a tool missing, not root, a premise not met): each
# SKIP-PART line of a test's log, counted and listed, so that no such
# part hides in a pass.
find . -name '*.trs' -newer configure 2>/dev/null | sort | while IFS= read -r trs; do
    grep -q '^:test-result: PASS' "$trs" || continue
    grep -H ': SKIP-PART: ' "${trs%.trs}.log" 2>/dev/null || true
done | sed 's|^\./||' >skipped-parts.txt
# Where the time went, per test: the "exit status N after S s" line
# tests/functions.sh ends every shell test's log with, slowest first
# (the sanitizer trees' tests included), in test-times.txt.
find . -name '*.trs' -newer configure 2>/dev/null | while IFS= read -r trs; do
    t=$(sed -n 's/.*: exit status [0-9]* after \([0-9]*\) s.*$/\1/p' "${trs%.trs}.log" 2>/dev/null | tail -n 1)
    c=$(sed -n 's/.*: exit status [0-9]* after [0-9]* s (CPU \([0-9]*\) s)$/\1/p' "${trs%.trs}.log" 2>/dev/null | tail -n 1)
    [ -z "$t" ] || printf '%s\t%s\t%s\n' "$t" "${c:--}" "${trs#./}"
done | sed 's/\.trs$//' | sort -rn >test-times.txt
say "the slowest tests (wall seconds, CPU seconds of what they ran; all in test-times.txt):"
head -n 12 test-times.txt
nparts=$(wc -l <skipped-parts.txt)
ntests=$(cut -d: -f1 skipped-parts.txt | sort -u | wc -l)
echo "snapfg: $passed passed, $failed failed, $skipped skipped; $nparts part(s) of $ntests passed test(s) skipped"
if [ "$nparts" -gt 0 ]; then
    say "parts skipped (in skipped-parts.txt):"
    cut -c1-300 skipped-parts.txt
fi

# A digest of what failed, last, so that the end of a long CI log says
# which check it was (the suite logs come first and get cut): for every
# failed test, its lines that name a failure and its last lines.  Kept
# in failures.txt for .ci/run to print again at its own end.
digest() {
    local trs log
    while IFS= read -r trs; do
        grep -Eq '^:test-result: (FAIL|ERROR|XPASS)' "$trs" || continue
        log=${trs%.trs}.log
        echo "--- ${log#"$top"/}"
        grep -E 'FAIL|not ok|[Ee]rror|Assertion|Sanitizer' "$log" 2>/dev/null |
            grep -v '^PASS' | head -n 15 | cut -c1-600
        echo "  (last lines)"
        tail -n 3 "$log" 2>/dev/null | cut -c1-600
    done < <(find "$top" -name '*.trs' -newer "$top/configure" 2>/dev/null | sort)
}
rm -f "$top/failures.txt"
if [ "$status" -ne 0 ]; then
    digest >"$top/failures.txt" || true
    if [ -s "$top/failures.txt" ]; then
        say "what failed:"
        cat "$top/failures.txt"
    fi
fi
exit "$status"
