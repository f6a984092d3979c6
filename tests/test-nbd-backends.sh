#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# NBD backends: origin= and cow= given as nbd+unix:// URIs of other NBD
# servers (the libnbd backend, src/device-nbd.c).
#  1. nbdkit backends (file and memory origins, memory and file COW
#     stores), persistent and transient stores: concurrent random origin
#     writes through snapfg; the snapshot equals the original and the
#     origin the expected data (nbdcopy + cmp), through snapfg and on the
#     backends themselves; a persistent store reopens from its export and
#     snapfgctl inspect reads it; a transient COW export reads as zero
#     after a clean exit; nbd-check semantics (trim, zero, fast zero,
#     extents) and concurrency over NBD backends; one connection only.
#  2. The same with qemu-nbd serving the origin file (skipped without
#     qemu-nbd).
#  3. Fault injection with nbdkit's error filter.  COW backend: an origin
#     write needing a copy-out still succeeds, the snapshot then fails
#     with EIO and is listed Invalid, the origin keeps working.  Origin
#     backend: write and copy-out read errors reach the client as EIO,
#     the snapshot stays valid and equal to the original (with 4 KiB
#     chunks and with 128 KiB ones, which take the large-chunk copy path).  Backend
#     servers killed under snapfg: the same, and snapfg still stops
#     cleanly.
#  4. Start-up errors naming the URI: no server on the socket, an export
#     name the server refuses, TCP connection refused, cow= the origin's
#     URI, a read-only COW export, a persistent store on a server that
#     cannot flush (a transient one is accepted).
#
# Stopping order matters: nbdkit 1.32 does not exit on SIGTERM while a
# client is connected, and snapfg is a client of the backend servers, so
# snapfg always stops first.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg
require_nbd_check
requires nbdkit nbdcopy nbdinfo cmp

PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] && "$PYTHON" -c 'import nbd' 2>/dev/null ||
    skip "$PYTHON with the libnbd 'nbd' module is needed"

# snapfgctl, next to the plugin in the build tree (optional).
snapfgctl=$(cd "$(dirname "$SNAPFG_PLUGIN")/../../.." 2>/dev/null && pwd)/tools/snapfgctl/snapfgctl
[ -x "$snapfgctl" ] || snapfgctl=

size=$((8 * 1024 * 1024 + 2560))      # the last chunk is partial
chunk=4096
sock="$tmpdir/snapfg.sock"
pid="$tmpdir/snapfg.pid"
orig="$tmpdir/original.img"
expected="$tmpdir/expected.img"

# --- a client helper (libnbd's Python binding) -----------------------

cat >"$tmpdir/nbdio.py" <<'EOF'
import errno, random, sys, threading
import nbd

from snapfg_test import connect, close as disconnect

def load(path):
    with open(path, "rb") as f:
        return bytearray(f.read())

def save(path, data):
    with open(path, "wb") as f:
        f.write(data)

def random_writes(uri, expected, seed, nthreads, nwrites):
    """Threads with their own connections write (and zero) random
    ranges of their own 64K slices, so that the final contents are
    known; expected is updated to match."""
    data = load(expected)
    slice_size = 65536
    nslices = len(data) // slice_size
    failures = []

    def worker(t):
        rng = random.Random(seed * 1000 + t)
        mine = [i for i in range(nslices) if i % nthreads == t]
        h = connect(uri)
        try:
            for k in range(nwrites):
                s = rng.choice(mine)
                off = s * slice_size + rng.randrange(slice_size // 512) * 512
                length = min(s * slice_size + slice_size - off,
                             rng.randrange(1, 33) * 512)
                if rng.random() < 0.1:
                    flags = nbd.CMD_FLAG_NO_HOLE if rng.random() < 0.5 else 0
                    h.zero(length, off, flags)
                    data[off:off + length] = bytes(length)
                else:
                    buf = rng.randbytes(length)
                    flags = nbd.CMD_FLAG_FUA if rng.random() < 0.1 else 0
                    h.pwrite(buf, off, flags)
                    data[off:off + length] = buf
                if k % 50 == 49:
                    h.flush()
        except nbd.Error as e:
            failures.append("thread %d: %s" % (t, e))
        finally:
            disconnect(h)

    threads = [threading.Thread(target=worker, args=(t,))
               for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if failures:
        sys.exit("random writes failed: " + "; ".join(failures))
    save(expected, data)

def expect_errno(what, fn, want):
    try:
        fn()
    except nbd.Error as e:
        if e.errnum != want:
            sys.exit("%s: failed with %s, expected %s" %
                     (what, e, errno.errorcode[want]))
        return
    sys.exit("%s: succeeded, expected %s" % (what, errno.errorcode[want]))

def main():
    cmd, uri = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    if cmd == "random-writes":
        random_writes(uri, args[0], int(args[1]), int(args[2]), int(args[3]))
        return
    h = connect(uri)
    try:
        off, length = int(args[0]), int(args[1])
        if cmd == "pwrite":
            # pwrite URI OFF LEN BYTE [EXPECTED]: write, read back, and
            # record in EXPECTED.
            buf = bytes([int(args[2], 0)]) * length
            h.pwrite(buf, off)
            if h.pread(length, off) != buf:
                sys.exit("pwrite: read back differs at %d" % off)
            if len(args) > 3:
                data = load(args[3])
                data[off:off + length] = buf
                save(args[3], data)
        elif cmd == "pwrite-fails":
            buf = bytes([int(args[2], 0)]) * length
            expect_errno("pwrite at %d" % off,
                         lambda: h.pwrite(buf, off), errno.EIO)
        elif cmd == "pread-fails":
            expect_errno("pread at %d" % off,
                         lambda: h.pread(length, off), errno.EIO)
        else:
            sys.exit("unknown command " + cmd)
    finally:
        disconnect(h)

main()
EOF

nbdio() { PYTHONPATH=$_fn_dir "$PYTHON" "$tmpdir/nbdio.py" "$@"; }

# --- backend servers --------------------------------------------------

declare -A _backends=()          # socket -> pid

# start_backend SOCK NBDKIT-ARGS...: an nbdkit backend on SOCK.
start_backend() {
    local s=$1
    shift
    rm -f "$s" "$s.pid"
    nbdkit -f -U "$s" -P "$s.pid" "$@" 2>"$s.log" &
    _backends[$s]=$!
    wait_backend "$s" "nbdkit $*"
}

# start_qemu_nbd SOCK FILE
start_qemu_nbd() {
    local s=$1
    rm -f "$s"
    qemu-nbd -k "$s" -f raw --persistent --shared=8 "$2" 2>"$s.log" &
    _backends[$s]=$!
    wait_backend "$s" "qemu-nbd $2"
}

wait_backend() {
    local s=$1 what=$2
    for _ in $(seq 300); do
        [ -S "$s" ] && return 0
        _proc_alive "${_backends[$s]}" || { cat "$s.log" >&2; fail "$what exited at start-up"; }
        sleep 0.1
    done
    fail "$what did not create $s within 30 s"
}

# stop_backend SOCK: stop it (snapfg must be gone first) and require a
# clean exit.
stop_backend() {
    local s=$1 p st=0
    p=${_backends[$s]}
    kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 100); do _proc_alive "$p" || break; sleep 0.1; done
    if _proc_alive "$p"; then
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
        unset "_backends[$s]"
        fail "backend on $s did not exit within 10 s of SIGTERM"
    fi
    wait "$p" || st=$?
    unset "_backends[$s]"
    # qemu-nbd reports SIGTERM as its exit status.
    [ "$st" -eq 0 ] || [ "$st" -eq 143 ] ||
        { tail "$s.log" >&2; fail "backend on $s exited with status $st"; }
}

# On any exit: snapfg first, then the backends.
_stop_all() {
    local pf p
    for pf in "${!_nbdkit_pids[@]}"; do
        p=${_nbdkit_pids[$pf]}
        kill -TERM "$p" 2>/dev/null
        for _ in $(seq 50); do _proc_alive "$p" || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
    done
    for pf in "${!_backends[@]}"; do
        p=${_backends[$pf]}
        kill -TERM "$p" 2>/dev/null
        for _ in $(seq 50); do _proc_alive "$p" || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
}
on_exit _stop_all

# export_is_zero URI BYTES LABEL
export_is_zero() {
    head -c "$2" /dev/zero >"$tmpdir/zero.img"
    export_equals "$1" "$tmpdir/zero.img" "$3"
}

# snapshot_description: the description nbdinfo --list prints for the
# snapshot.
snapshot_description() {
    nbdinfo --list "$(uri "$sock")" |
        awk '/^export=/ { cur = $0 }
             cur == "export=\"snapshot\":" && $1 == "description:" { sub(/^[ \t]*description: /, ""); print; exit }'
}

test_seed

# --- 1 and 2: data through NBD backends --------------------------------

# data_case NAME ORIGIN-KIND COW-KIND STORE [PARAMS...]
# ORIGIN-KIND: file (nbdkit file), memory (nbdkit memory, loaded with
# nbdcopy), qemu (qemu-nbd on the file).  COW-KIND: memory (16M) or
# file (nbdkit file on an allocated all-zero file).
data_case() {
    local name=$1 okind=$2 ckind=$3 store=$4 t0=$SECONDS
    local osock="$tmpdir/origin.sock" csock="$tmpdir/cow.sock"
    local ofile="$tmpdir/origin.img" cfile="$tmpdir/cow.img" desc
    shift 4
    info "=== $name"
    make_random_image "$ofile" "$size"
    cp "$ofile" "$orig"
    cp "$ofile" "$expected"
    case $okind in
        file) start_backend "$osock" file "$ofile" ;;
        memory) start_backend "$osock" memory "$size"
                nbdcopy "$ofile" "$(uri "$osock")" ;;
        qemu) start_qemu_nbd "$osock" "$ofile" ;;
    esac
    case $ckind in
        memory) start_backend "$csock" memory 16M ;;
        file) make_zero_image "$cfile" $((16 * 1024 * 1024))
              start_backend "$csock" file "$cfile" ;;
    esac
    start_snapfg "$sock" "$pid" origin="$(uri "$osock")" \
        cow="$(uri "$csock")" store="$store" chunk-size=$chunk "$@"

    nbdio random-writes "$(uri "$sock" origin)" "$expected" "$seed" 4 300 ||
        check_fail "$name: random writes through snapfg failed"
    export_equals "$(uri "$sock" snapshot)" "$orig" "$name: snapshot"
    export_equals "$(uri "$sock" origin)" "$expected" "$name: origin"
    desc=$(snapshot_description)
    case $desc in
        *Invalid*|*Overflow*) check_fail "$name: snapshot is '$desc'" ;;
    esac
    stop_nbdkit "$pid"

    # The data is on the backends themselves.
    export_equals "$(uri "$osock")" "$expected" "$name: origin backend"
    if [ "$store" = persistent ]; then
        # Reopen the store from the export: the same snapshot.
        start_snapfg "$sock" "$pid" origin="$(uri "$osock")" \
            cow="$(uri "$csock")" store=persistent chunk-size=$chunk "$@"
        export_equals "$(uri "$sock" snapshot)" "$orig" "$name: reopened snapshot"
        stop_nbdkit "$pid"
        if [ -n "$snapfgctl" ]; then
            "$snapfgctl" inspect "$(uri "$csock")" >"$tmpdir/inspect.out" 2>&1 ||
                { cat "$tmpdir/inspect.out" >&2; check_fail "$name: snapfgctl inspect of the COW export failed"; }
            grep -q "^valid: 1" "$tmpdir/inspect.out" ||
                { cat "$tmpdir/inspect.out" >&2; check_fail "$name: snapfgctl inspect does not say valid: 1"; }
        fi
    else
        # A transient COW export is given back: it reads as zero.
        export_is_zero "$(uri "$csock")" $((16 * 1024 * 1024)) "$name: transient COW after exit"
    fi
    stop_backend "$csock"
    stop_backend "$osock"
    [ "$okind" = memory ] || cmp "$ofile" "$expected" ||
        check_fail "$name: the origin file differs from the expected contents"
    info "$name: done in $((SECONDS - t0)) s"
}

data_case "nbdkit file origin, memory COW, persistent" file memory persistent
data_case "nbdkit memory origin, memory COW, transient, global locking" \
    memory memory transient locking=global
SNAPFG_NBD_CONNECTIONS=1 \
    data_case "one connection: memory origin, file COW (allocated zeroes), transient" \
    memory file transient
if have qemu-nbd; then
    data_case "qemu-nbd origin, memory COW, persistent" qemu memory persistent
    data_case "qemu-nbd origin, memory COW, transient" qemu memory transient
else
    skip_part "the qemu-nbd origin cases: qemu-nbd is not installed"
fi

# nbd-check semantics and concurrency with both disks over NBD.  The
# origin is an nbdkit memory export: it can fast-zero, as nbd-check
# expects of the origin.
driver_case() {
    local osock="$tmpdir/origin.sock" csock="$tmpdir/cow.sock" t0=$SECONDS
    info "=== nbd-check semantics and concurrency over NBD backends"
    make_random_image "$orig" "$size"
    start_backend "$osock" memory "$size"
    start_backend "$csock" memory 16M
    nbdcopy "$orig" "$(uri "$osock")"
    start_snapfg "$sock" "$pid" origin="$(uri "$osock")" \
        cow="$(uri "$csock")" store=transient chunk-size=$chunk
    "$NBD_CHECK" semantics --chunk $chunk --min 512 --pref $chunk \
        --expect-origin "$expected" \
        "$(uri "$sock" origin)" "$(uri "$sock" snapshot)" "$orig" "$seed" ||
        check_fail "nbd-check semantics over NBD backends failed (seed $seed)"
    stop_nbdkit "$pid"
    export_equals "$(uri "$osock")" "$expected" "semantics: origin backend"
    export_is_zero "$(uri "$csock")" $((16 * 1024 * 1024)) "semantics: transient COW after exit"

    # The origin as it is now, a new snapshot of it, and many clients.
    cp "$expected" "$orig"
    start_snapfg "$sock" "$pid" origin="$(uri "$osock")" \
        cow="$(uri "$csock")" store=persistent chunk-size=$chunk
    "$NBD_CHECK" concurrency "$(uri "$sock" origin)" "$(uri "$sock" snapshot)" \
        "$orig" 3 4 4 ||
        check_fail "nbd-check concurrency over NBD backends failed"
    stop_nbdkit "$pid"
    stop_backend "$csock"
    stop_backend "$osock"
    info "driver case: done in $((SECONDS - t0)) s"
}
driver_case

# --- 3: fault injection ------------------------------------------------

fault_cow() {
    local osock="$tmpdir/origin.sock" csock="$tmpdir/cow.sock"
    local ofile="$tmpdir/origin.img" trigger="$tmpdir/cow-errors" desc
    info "=== I/O errors on the COW backend"
    make_random_image "$ofile" "$size"
    cp "$ofile" "$orig"
    cp "$ofile" "$expected"
    rm -f "$trigger"
    start_backend "$osock" file "$ofile"
    start_backend "$csock" --filter=error memory 16M \
        error-pwrite=EIO error-pwrite-rate=100% error-pwrite-file="$trigger"
    start_snapfg "$sock" "$pid" origin="$(uri "$osock")" \
        cow="$(uri "$csock")" store=persistent chunk-size=$chunk
    nbdio pwrite "$(uri "$sock" origin)" 0 8192 0x11 "$expected" ||
        check_fail "COW errors: origin write before the errors failed"
    export_equals "$(uri "$sock" snapshot)" "$orig" "COW errors: snapshot before the errors"

    touch "$trigger"
    nbdio pwrite "$(uri "$sock" origin)" 1048576 8192 0x22 "$expected" ||
        check_fail "COW errors: an origin write needing a copy-out must succeed"
    nbdio pread-fails "$(uri "$sock" snapshot)" 0 4096 ||
        check_fail "COW errors: the snapshot must fail with EIO"
    nbdio pread-fails "$(uri "$sock" snapshot)" 2097152 4096 ||
        check_fail "COW errors: the snapshot must fail with EIO everywhere"
    desc=$(snapshot_description)
    info "COW errors: snapshot description '$desc'"
    case $desc in
        *Invalid*) ;;
        *) check_fail "COW errors: snapshot description '$desc' does not say Invalid" ;;
    esac
    # The origin keeps working, with or without the COW errors.
    nbdio pwrite "$(uri "$sock" origin)" 3145728 65536 0x33 "$expected" ||
        check_fail "COW errors: origin write after invalidation failed"
    rm -f "$trigger"
    nbdio pwrite "$(uri "$sock" origin)" 4194304 4096 0x44 "$expected" ||
        check_fail "COW errors: origin write after the errors stopped failed"
    export_equals "$(uri "$sock" origin)" "$expected" "COW errors: origin"
    nbdio pread-fails "$(uri "$sock" snapshot)" 0 4096 ||
        check_fail "COW errors: the snapshot must stay Invalid"
    stop_nbdkit "$pid"
    stop_backend "$csock"
    stop_backend "$osock"
    cmp "$ofile" "$expected" ||
        check_fail "COW errors: the origin file differs from the expected contents"
}
fault_cow

# fault_origin CHUNK: with chunks over 64 KiB a copy-out takes the
# large-chunk path (device_copy first; an NBD origin cannot copy in the
# kernel, so the chunk goes through a buffer): a read error there must
# still be the origin's (EIO to the client), not the COW store's (which
# would make the snapshot Invalid).
fault_origin() {
    local chunk=$1
    local osock="$tmpdir/origin.sock" csock="$tmpdir/cow.sock"
    local ofile="$tmpdir/origin.img" desc
    local wtrigger="$tmpdir/origin-write-errors" rtrigger="$tmpdir/origin-read-errors"
    info "=== I/O errors on the origin backend (chunk size $chunk)"
    make_random_image "$ofile" "$size"
    cp "$ofile" "$orig"
    cp "$ofile" "$expected"
    rm -f "$wtrigger" "$rtrigger"
    start_backend "$osock" --filter=error file "$ofile" \
        error-pwrite=EIO error-pwrite-rate=100% error-pwrite-file="$wtrigger" \
        error-pread=EIO error-pread-rate=100% error-pread-file="$rtrigger"
    start_backend "$csock" memory 16M
    # writeback=off: the origin's write error reaches the client itself
    # (test-writeback.sh covers it after a write-back acknowledgement).
    start_snapfg "$sock" "$pid" origin="$(uri "$osock")" \
        cow="$(uri "$csock")" store=persistent chunk-size=$chunk writeback=off
    nbdio pwrite "$(uri "$sock" origin)" 0 8192 0x11 "$expected" ||
        check_fail "origin errors: origin write before the errors failed"

    # A write error: the copy-out is done, the origin write fails.
    touch "$wtrigger"
    nbdio pwrite-fails "$(uri "$sock" origin)" 1048576 8192 0x22 ||
        check_fail "origin errors: the origin write must fail with EIO"
    rm -f "$wtrigger"
    # A read error during a copy-out: the write fails, nothing changes.
    touch "$rtrigger"
    nbdio pwrite-fails "$(uri "$sock" origin)" 2097152 8192 0x33 ||
        check_fail "origin errors: an origin write whose copy-out cannot read must fail with EIO"
    nbdio pread-fails "$(uri "$sock" snapshot)" 5242880 4096 ||
        check_fail "origin errors: a snapshot read sent to the origin must fail with EIO"
    rm -f "$rtrigger"

    desc=$(snapshot_description)
    case $desc in
        *Invalid*|*Overflow*) check_fail "origin errors: snapshot is '$desc'" ;;
    esac
    export_equals "$(uri "$sock" snapshot)" "$orig" "origin errors: snapshot"
    nbdio pwrite "$(uri "$sock" origin)" 2097152 8192 0x44 "$expected" ||
        check_fail "origin errors: origin write after the errors stopped failed"
    export_equals "$(uri "$sock" origin)" "$expected" "origin errors: origin"
    export_equals "$(uri "$sock" snapshot)" "$orig" "origin errors: snapshot at the end"
    stop_nbdkit "$pid"
    stop_backend "$csock"
    stop_backend "$osock"
    cmp "$ofile" "$expected" ||
        check_fail "origin errors: the origin file differs from the expected contents"
}
fault_origin 4096
fault_origin 131072

# kill_backend SOCK: the server dies (SIGKILL) under snapfg.
kill_backend() {
    local p=${_backends[$1]}
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
    unset "_backends[$1]"
}

backends_die() {
    local osock="$tmpdir/origin.sock" csock="$tmpdir/cow.sock"
    local ofile="$tmpdir/origin.img" desc
    info "=== the backend servers die"
    make_random_image "$ofile" "$size"
    cp "$ofile" "$orig"
    cp "$ofile" "$expected"
    start_backend "$osock" file "$ofile"
    start_backend "$csock" memory 16M
    start_snapfg "$sock" "$pid" origin="$(uri "$osock")" \
        cow="$(uri "$csock")" store=persistent chunk-size=$chunk
    nbdio pwrite "$(uri "$sock" origin)" 0 8192 0x11 "$expected" ||
        check_fail "dead backends: origin write before failed"

    kill_backend "$csock"
    # Every connection of the pool finds out: several writes in turn.
    for off in 1048576 2097152 3145728 4194304 5242880 6291456; do
        nbdio pwrite "$(uri "$sock" origin)" $off 4096 0x22 "$expected" ||
            check_fail "dead COW backend: origin write at $off must succeed"
    done
    nbdio pread-fails "$(uri "$sock" snapshot)" 0 4096 ||
        check_fail "dead COW backend: the snapshot must fail with EIO"
    desc=$(snapshot_description)
    case $desc in
        *Invalid*) ;;
        *) check_fail "dead COW backend: snapshot description '$desc' does not say Invalid" ;;
    esac
    export_equals "$(uri "$sock" origin)" "$expected" "dead COW backend: origin"

    kill_backend "$osock"
    for _ in 1 2 3 4 5 6; do
        nbdio pwrite-fails "$(uri "$sock" origin)" 1048576 4096 0x33 ||
            check_fail "dead origin backend: origin writes must fail with EIO"
    done
    # snapfg still stops cleanly.
    stop_nbdkit "$pid"
    cmp "$ofile" "$expected" ||
        check_fail "dead backends: the origin file differs from the expected contents"
}
backends_die

# --- 4: start-up errors ------------------------------------------------

startup_errors() {
    local osock="$tmpdir/origin.sock" csock="$tmpdir/cow.sock"
    local ofile="$tmpdir/origin.img" err="$tmpdir/start.err" u
    local nfile="$tmpdir/noflush.img"
    info "=== start-up errors"
    make_random_image "$ofile" $((1024 * 1024))

    u=$(uri "$tmpdir/no-such.sock")
    try_start_failure "$err" origin="$u" && try_stderr "$err" "origin=$u" "cannot"
    try_start_failure "$err" origin="$ofile" cow="$u" && try_stderr "$err" "cow=$u" "cannot"

    u="nbd://127.0.0.1:1/"
    try_start_failure "$err" origin="$u" && try_stderr "$err" "origin=$u" "cannot"

    start_backend "$osock" --filter=exportname memory 1M \
        exportname=good exportname-strict=true
    u=$(uri "$osock" bad)
    try_start_failure "$err" origin="$u" && try_stderr "$err" "origin=$u" "cannot"
    try_start_failure "$err" origin="$ofile" cow="$u" && try_stderr "$err" "cow=$u" "cannot"
    # The export it does serve works.
    expect_start_success origin="$(uri "$osock" good)"
    stop_backend "$osock"

    start_backend "$osock" memory 1M
    u=$(uri "$osock")
    try_start_failure "$err" origin="$u" cow="$u" &&
        try_stderr "$err" "cow=$u" "origin itself"

    start_backend "$csock" -r memory 16M
    try_start_failure "$err" origin="$u" cow="$(uri "$csock")" &&
        try_stderr "$err" "cow=$(uri "$csock")" "read-only"
    stop_backend "$csock"

    # A server that cannot flush: no persistent store on it.
    truncate -s 16M "$nfile"
    start_backend "$csock" eval get_size='echo 16777216' \
        pread="dd if=$nfile skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none" \
        pwrite="dd of=$nfile seek=\$4 conv=notrunc oflag=seek_bytes status=none" \
        can_write='exit 0' can_flush='exit 3'
    try_start_failure "$err" origin="$u" cow="$(uri "$csock")" store=persistent &&
        try_stderr "$err" "cow=$(uri "$csock")" "flush"
    expect_start_success origin="$u" cow="$(uri "$csock")" store=transient
    stop_backend "$csock"
    stop_backend "$osock"
}
startup_errors

finish
