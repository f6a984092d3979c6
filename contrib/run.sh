#!/bin/bash
# Set up a Debian 12 machine for snapfg, build and install it, then run
# the demo or the whole test suite.
#
#   contrib/run.sh demo [ORIGIN]   build, install, run contrib/demo.sh
#   contrib/run.sh test            build, install, make check and
#                                  make check-sanitizers (what .ci/run does)
#
# Run it as root (or as a user with sudo) from a clone of the repository.
# It installs only the Debian packages that are missing.

set -euo pipefail

usage() {
    echo "usage: $0 demo [ORIGIN] | test" >&2
    exit 2
}
[ $# -ge 1 ] || usage
cmd=$1
shift
case $cmd in
    demo) [ $# -le 1 ] || usage ;;
    test) [ $# -eq 0 ] || usage ;;
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
packages=(
    # build
    build-essential autoconf automake libtool pkg-config perl
    nbdkit nbdkit-plugin-dev libnbd-dev libev-dev
    # gcc's sanitizer runtimes (make check-sanitizers)
    libtsan2 libasan8 libubsan1
    # tests, demo and benchmark
    libnbd-bin python3 python3-libnbd qemu-utils fio jq gnuplot-nox
    coreutils diffutils util-linux procps socat strace
    # optional tests: control socket under valgrind, libFuzzer target
    valgrind clang libclang-rt-14-dev
    # guest tests (make check-guest): QEMU, and cpio for the initramfs
    qemu-system-x86 cpio
    # the benchmark's QEMU fleecing peer (qemu-storage-daemon)
    qemu-system-common
)
missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "${missing[@]}"
else
    say "all needed packages are installed"
fi

# --- build and install ----------------------------------------------------
say "building in $top"
mkdir -p m4            # AC_CONFIG_MACRO_DIR; git does not keep empty directories
autoreconf -fi
./configure
make -j2
say "installing the plugin into nbdkit's plugindir ($(pkg-config --variable=plugindir nbdkit))"
"${SUDO[@]}" make install
nbdkit snapfg --version >/dev/null ||
    { echo "run.sh: 'nbdkit snapfg' does not find the installed plugin" >&2; exit 1; }

# --- the job --------------------------------------------------------------
case $cmd in
    demo)
        say "running contrib/demo.sh $*"
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

status=0
say "make check"
check_st=0
make check VERBOSE=1 || check_st=$?
[ "$check_st" -eq 0 ] || status=1

say "make check-sanitizers"
san_st=0
make check-sanitizers VERBOSE=1 || san_st=$?
[ "$san_st" -eq 0 ] || status=1

say "make check-guest"
guest_st=0
make check-guest VERBOSE=1 || guest_st=$?
[ "$guest_st" -eq 0 ] || status=1

logs=(test-suite.log guest-suite.log build-tsan/tree/test-suite.log build-asan/tree/test-suite.log)
passed=$(count PASS "${logs[@]}")
failed=$(( $(count FAIL "${logs[@]}") + $(count ERROR "${logs[@]}") + $(count XPASS "${logs[@]}") ))
skipped=$(count SKIP "${logs[@]}")
say "make check: $([ $check_st -eq 0 ] && echo PASS || echo "FAIL (status $check_st)")"
say "make check-sanitizers: $([ $san_st -eq 0 ] && echo PASS || echo "FAIL (status $san_st)")"
say "make check-guest: $([ $guest_st -eq 0 ] && echo PASS || echo "FAIL (status $guest_st)")"
# A build or harness failure counts even when no test result says so.
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1
fi
echo "snapfg: $passed passed, $failed failed, $skipped skipped"
exit "$status"
