#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Run snapfg's tests (by default the whole suite) under a sanitizer, in
# a build tree of its own.
#
#   tests/run-sanitizers.sh SRCDIR thread|address
#
# "make check-sanitizers" runs it for both.  It needs gcc's sanitizer
# runtimes (Debian: libtsan2, libasan8, libubsan1, pulled in by gcc).
#
#   thread   CFLAGS=-fsanitize=thread                       (ThreadSanitizer)
#   address  CFLAGS=-fsanitize=address,undefined            (AddressSanitizer
#            -fno-sanitize-recover=undefined                 + UBSan)
#
# The build tree is ./build-tsan or ./build-asan under the current
# directory (the top build directory when make runs it); set
# SNAPFG_SANITIZER_BUILDDIR to put it elsewhere.  Inside it:
#
#   tree/    the configured build (a VPATH build of SRCDIR, or an in-tree
#            build of a clean copy of SRCDIR when SRCDIR itself has been
#            configured in-tree: configure refuses VPATH builds then)
#   bin/     an "nbdkit" wrapper put first in PATH for the tests
#   reports/ sanitizer reports (log_path), one file per process
#
# The plugin is a shared object loaded by a nbdkit that was not built with
# the sanitizer, so the sanitizer runtime must be preloaded into nbdkit.
# The wrapper in bin/, first in PATH, does that for every nbdkit the tests
# start, however they start it (directly, through timeout, ...): it runs
# the real nbdkit through the dynamic loader with --preload, so that the
# commands nbdkit runs (--run) do not inherit the runtime.  So tests must
# run "nbdkit" from PATH and must not set LD_PRELOAD for it themselves.
# SNAPFG_SANITIZER=thread|address is exported for tests that want longer
# timeouts.  Leak checking is off for nbdkit (nbdkit itself does not free
# everything at exit) and on for the test programs.
#
# SNAPFG_SANITIZER_TESTS="tests/a.sh tests/b.sh" runs only those tests
# ("make check-sanitizers" gives each sanitizer its list from Makefile.am;
# "make check-sanitizers-all" none: the whole suite).  They run
# SNAPFG_SANITIZER_CHECK_JOBS (else SNAPFG_CHECK_JOBS, else 1) at a time;
# the build uses SNAPFG_SANITIZER_JOBS (2) jobs.
#
# Any sanitizer finding fails: the process stops at the first report
# (halt_on_error=1, exit status 66), and after the suite every report
# file is printed and makes this script fail even if no test noticed.

set -euo pipefail

usage() {
    echo "usage: $0 SRCDIR thread|address" >&2
    exit 2
}
[ $# -eq 2 ] || usage
srcdir=$(cd "$1" && pwd) || usage
kind=$2

case $kind in
    thread)
        short=tsan
        san_flags="-fsanitize=thread"
        runtimes="libtsan.so"
        ;;
    address)
        short=asan
        san_flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
        runtimes="libasan.so libubsan.so"
        ;;
    *) usage ;;
esac

say() { echo "run-sanitizers ($kind): $*"; }
die() { echo "run-sanitizers ($kind): error: $*" >&2; exit 1; }

CC=${CC:-gcc}
MAKE=${MAKE:-make}
top=${SNAPFG_SANITIZER_BUILDDIR:-$PWD/build-$short}
mkdir -p "$top"
top=$(cd "$top" && pwd)
tree=$top/tree
reports=$top/reports
bindir=$top/bin

[ -x "$srcdir/configure" ] ||
    die "$srcdir/configure not found: run 'autoreconf -fi' in $srcdir first"
real_nbdkit=$(command -v nbdkit) ||
    die "nbdkit not found: install the nbdkit package"

# --- the sanitizer runtimes to preload into nbdkit ---------------------
preload=
for r in $runtimes; do
    p=$($CC -print-file-name="$r")
    # gcc prints the bare name back when it has no such file.
    [ "$p" != "$r" ] && [ -e "$p" ] ||
        die "$CC has no $r: install gcc's sanitizer runtimes (Debian: libtsan2 libasan8 libubsan1)"
    p=$(readlink -f "$p")
    preload=${preload:+$preload:}$p
done

# A preloaded runtime initialises itself late: at the first malloc, which
# in nbdkit comes from libp11-kit's constructor (through gnutls) inside
# newlocale(), while glibc holds its locale lock.  The runtime's start-up
# then calls dlerror(), which takes and releases that same lock, and
# leaves it broken: nbdkit hangs in exit() whenever it has printed an
# errno message (%m).  This shim's newlocale() calls malloc first, so
# that the runtime starts outside the lock, then calls the real one.
shim_dir=$top/shim
mkdir -p "$shim_dir"
cat >"$shim_dir/snapfg-sanitizer-shim.c" <<'EOF'
/* Written by tests/run-sanitizers.sh; see the comment there. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <locale.h>
#include <stdlib.h>

typedef locale_t (*newlocale_fn) (int, const char *, locale_t);

locale_t
newlocale (int mask, const char *locale, locale_t base)
{
  static newlocale_fn real;

  if (real == NULL) {
    void *volatile p = malloc (1);  /* start the sanitizer runtime now */
    free (p);
    real = (newlocale_fn) dlsym (RTLD_NEXT, "newlocale");
  }
  return real (mask, locale, base);
}
EOF
$CC -shared -fPIC -O0 -o "$shim_dir/snapfg-sanitizer-shim.so" \
    "$shim_dir/snapfg-sanitizer-shim.c" -ldl ||
    die "cannot build the newlocale shim"
preload=$preload:$shim_dir/snapfg-sanitizer-shim.so
say "preloaded into nbdkit: $preload"

# --- can this machine run sanitized programs? --------------------------
# ThreadSanitizer (gcc 12) fails on kernels with a large mmap ASLR range
# ("unexpected memory mapping"); running without ASLR fixes that.
runner=()
probe_dir=$(mktemp -d "${TMPDIR:-/tmp}/snapfg-sanprobe.XXXXXX")
cat >"$probe_dir/probe.c" <<'EOF'
#include <pthread.h>
static int x;
static void *f (void *p) { __atomic_fetch_add (&x, 1, __ATOMIC_SEQ_CST); return p; }
int main (void) { pthread_t t; pthread_create (&t, 0, f, 0); pthread_join (t, 0); return x != 1; }
EOF
# shellcheck disable=SC2086
$CC $san_flags -g -o "$probe_dir/probe" "$probe_dir/probe.c" -pthread ||
    die "$CC cannot build with $san_flags"
if ! "$probe_dir/probe" >"$probe_dir/out" 2>&1; then
    if setarch "$(uname -m)" -R "$probe_dir/probe" >/dev/null 2>&1; then
        say "sanitized programs need ASLR off here: running the suite under setarch -R"
        runner=(setarch "$(uname -m)" -R)
    else
        cat "$probe_dir/out" >&2
        rm -rf "$probe_dir"
        die "a program built with $san_flags does not run on this machine"
    fi
fi
rm -rf "$probe_dir"

# --- the build tree -----------------------------------------------------
rm -rf "$tree" "$reports" "$bindir"
mkdir -p "$tree" "$reports" "$bindir"

if [ -f "$srcdir/config.status" ]; then
    # SRCDIR was configured in-tree, so configure would refuse a VPATH
    # build from it.  Build in a copy without the build products.
    say "copying $srcdir (configured in-tree) to $tree"
    # Leave out our own build trees (./build-tsan, ./build-asan, or
    # wherever SNAPFG_SANITIZER_BUILDDIR points inside SRCDIR).
    skip=(--exclude=./build-tsan --exclude=./build-asan)
    case $top/ in
        "$srcdir"/*) skip+=(--exclude="./${top#"$srcdir"/}") ;;
    esac
    # make check may be running in SRCDIR meanwhile (.ci/run builds the
    # sanitizer trees beside it), so a directory can change as tar reads
    # it: tar then exits 1 ("file changed as we read it").  Nothing this
    # copy needs changes (the sources and the configure script do not;
    # build products are left out or rebuilt), so that is not an error;
    # anything worse (2) is.
    rc=0
    (cd "$srcdir" && tar -cf - --warning=no-file-changed "${skip[@]}" --exclude=./.git \
        --exclude='*.o' --exclude='*.lo' --exclude='*.la' --exclude='*.so' \
        --exclude=.libs --exclude=.deps --exclude=.dirstamp \
        --exclude='*.log' --exclude='*.trs' --exclude=autom4te.cache \
        --exclude=./config.status --exclude=./config.h --exclude=./stamp-h1 \
        --exclude=./libtool --exclude=./Makefile \
        . || exit $(($? == 1 ? 0 : $?))) | (cd "$tree" && tar -xf -) || rc=$?
    [ "$rc" -eq 0 ] || die "copying $srcdir to $tree failed (status $rc)"
    configure=./configure
else
    configure=$srcdir/configure
fi

cflags="$san_flags -g -O1 -fno-omit-frame-pointer"
say "configuring in $tree with CFLAGS='$cflags'"
(cd "$tree" && "${runner[@]}" "$configure" --quiet CC="$CC" CFLAGS="$cflags" LDFLAGS="$san_flags") ||
    die "configure failed (see $tree/config.log)"

# .ci/run builds the sanitizer trees while make check runs, whose tests
# wait on servers and sleeps most of the time, so the builds mostly use
# the CPU the tests leave.  SNAPFG_SANITIZER_BUILD_NICE (default 0) can
# lower their priority on a machine of its own; on one shared with other
# work a niced build starves (measured at a load average of 25-40 on 2
# CPUs: 35-39 min for the two builds at nice 10).
say "building"
t_build=$SECONDS
(cd "$tree" && nice -n "${SNAPFG_SANITIZER_BUILD_NICE:-0}" \
     "${runner[@]}" "$MAKE" -j"${SNAPFG_SANITIZER_JOBS:-2}") || die "build failed"
say "built in $((SECONDS - t_build)) s"

# --- the nbdkit wrapper -------------------------------------------------
# The runtime is preloaded with the dynamic loader's --preload option, not
# with LD_PRELOAD: nbdkit passes its environment on to the commands it
# runs (--run), and /bin/sh (dash) crashes with ThreadSanitizer preloaded.
interp=$(readelf -l "$real_nbdkit" 2>/dev/null |
         sed -n 's/.*program interpreter: \(.*\)\]$/\1/p')
[ -n "$interp" ] && [ -x "$interp" ] || interp=/lib64/ld-linux-x86-64.so.2
interp_help=$("$interp" --help 2>/dev/null || true)
grep -q -- --preload <<<"$interp_help" ||
    die "$interp has no --preload option (glibc 2.30 or later is needed)"
# nbdkit --run forks: the parent runs the command, the child serves, and
# the parent sends the child one SIGTERM when the command ends.  Under
# ThreadSanitizer a signal that reaches the child while it is still
# starting up after fork() is sometimes lost (the runtime defers it and
# never delivers it): the child then serves forever and the parent waits
# for it (seen as "nbdkit --run true" hanging in about 1 run in 30 under
# load; never without the runtime, never when the command takes longer).
# So, under ThreadSanitizer only, the wrapper makes every --run command
# first wait until the serving child's main thread sleeps in poll(),
# where the runtime delivers signals at once.
cat >"$bindir/wait-server-ready" <<'READY'
#!/bin/bash
# Written by tests/run-sanitizers.sh: wait-server-ready NBDKIT_PID SELF_PID
# waits (at most 30 s) until the child of NBDKIT_PID that is not
# SELF_PID (the captive nbdkit server) blocks in poll() or ppoll().
parent=$1 self=$2
for _ in $(seq 600); do
    children=$(cat "/proc/$parent/task/$parent/children" 2>/dev/null) ||
        exit 0                  # no such /proc file: do not wait
    for p in $children; do
        [ "$p" = "$self" ] && continue
        read -r nr _ <"/proc/$p/syscall" 2>/dev/null || continue
        case $nr in 7|271) exit 0 ;; esac   # x86_64 poll, ppoll
    done
    sleep 0.05
done
exit 0
READY
chmod +x "$bindir/wait-server-ready"
if [ "$kind" = thread ]; then
    run_prefix="\"$bindir/wait-server-ready\" \$PPID \$\$; "
else
    run_prefix=
fi
cat >"$bindir/nbdkit" <<WRAPPER
#!/bin/bash
# Written by tests/run-sanitizers.sh: runs the real nbdkit with the
# $kind sanitizer runtime preloaded, so that the sanitized plugin loads.
# Leak checking is off for nbdkit itself (it does not free everything).
ASAN_OPTIONS="\${ASAN_OPTIONS:-} detect_leaks=0"
export ASAN_OPTIONS
run_prefix='$run_prefix'
args=()
while [ \$# -gt 0 ]; do
    case \$1 in
        --run) [ \$# -ge 2 ] || break
               args+=(--run "\$run_prefix\$2"); shift 2 ;;
        --run=*) args+=(--run "\$run_prefix\${1#--run=}"); shift ;;
        *) args+=("\$1"); shift ;;
    esac
done
exec "$interp" --preload "$preload" "$real_nbdkit" "\${args[@]}" "\$@"
WRAPPER
chmod +x "$bindir/nbdkit"
"${runner[@]}" "$bindir/nbdkit" --version >/dev/null ||
    die "nbdkit does not start with $preload preloaded"

# --- the suite ----------------------------------------------------------
# Tests may scale their timeouts by this (sanitized code runs slower).
export SNAPFG_SANITIZER=$kind
export PATH="$bindir:$PATH"
common="halt_on_error=1 exitcode=66"
case $kind in
    thread)
        export TSAN_OPTIONS="$common second_deadlock_stack=1 log_exe_name=1 log_path=$reports/tsan ${TSAN_OPTIONS:-}"
        ;;
    address)
        export ASAN_OPTIONS="$common detect_leaks=1 log_exe_name=1 log_path=$reports/asan ${ASAN_OPTIONS:-}"
        # UBSan prints its reports on stderr (it ignores log_path when it
        # runs beside ASan) and stops the process (-fno-sanitize-recover).
        export UBSAN_OPTIONS="$common print_stacktrace=1 ${UBSAN_OPTIONS:-}"
        ;;
esac

say "running make check (TSAN_OPTIONS='${TSAN_OPTIONS:-}' ASAN_OPTIONS='${ASAN_OPTIONS:-}' UBSAN_OPTIONS='${UBSAN_OPTIONS:-}')"
st=0
t_check=$SECONDS
(cd "$tree" && "${runner[@]}" "$MAKE" -j"${SNAPFG_SANITIZER_CHECK_JOBS:-${SNAPFG_CHECK_JOBS:-1}}" check VERBOSE=1 \
     ${SNAPFG_SANITIZER_TESTS:+TESTS="$SNAPFG_SANITIZER_TESTS"}) || st=$?

say "tests ran in $((SECONDS - t_check)) s (status $st)"
found=0
for f in "$reports"/*; do
    [ -e "$f" ] || continue
    found=$((found + 1))
    echo "=== sanitizer report $f ===" >&2
    cat "$f" >&2
done

if [ "$st" -ne 0 ]; then
    die "make check failed under -fsanitize=$kind (test logs: $tree/tests/*.log)"
fi
if [ "$found" -ne 0 ]; then
    die "$found sanitizer report(s) written (printed above), although every test passed"
fi
say "PASS: ${SNAPFG_SANITIZER_TESTS:+the chosen tests of }the test suite passed under $san_flags"
