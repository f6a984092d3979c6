#!/bin/busybox sh
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# /init of the snapfg test guest (busybox sh, PID 1).  It mounts the
# pseudo file systems, loads the modules, defines the helpers below,
# sources /params.sh and the test's /test.sh (both from the per-run
# archive guest_run appends) and powers off.  Console protocol:
#   SFG: [uptime] text   progress
#   SFG-FAIL: text       a failed check (the host fails the test)
#   SFG-VAL key value    a value for the host (guest_val key)
#   SFG-RESULT: PASS|FAIL
/bin/busybox --install -s /bin
export PATH=/usr/bin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /run /tmp
exec </dev/console >/dev/console 2>&1
# guest_require's KVM probe: only "does this accelerator boot at all?"
case " $(cat /proc/cmdline) " in
    *" sfg.probe=1 "*) echo "SFG-PROBE-OK"; poweroff -f ;;
esac
MIB=1048576
FAILS=0
. /params.sh

say()  { echo "SFG: [$(cut -d' ' -f1 /proc/uptime)] $*"; }
fail() { echo "SFG-FAIL: $(echo "$*" | tr '\n' ' ')"; FAILS=$((FAILS + 1)); }
val()  { echo "SFG-VAL $1 $2"; }
step() { echo "$*" >/tmp/step; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }

# wait_for PATH TENTHS: wait until PATH exists.
wait_for() {
    i=0
    while [ ! -e "$1" ] && [ "$i" -lt "$2" ]; do usleep 100000; i=$((i + 1)); done
    [ -e "$1" ]
}

# md5_dev DEV [BS COUNT SKIP]: md5 of a device (or a range, in BS units),
# read with O_DIRECT so it comes from the server, not the page cache.
md5_dev() {
    if [ $# -gt 1 ]; then
        timeout 120 dd if="$1" bs="$2" count="$3" skip="$4" iflag=direct 2>/tmp/dd.err
    else
        timeout 120 dd if="$1" bs=$MIB iflag=direct 2>/tmp/dd.err
    fi | md5sum | cut -d' ' -f1
}
md5_file() { md5sum "$1" | cut -d' ' -f1; }

# expect_md5 WHAT GOT WANT: record a check.
expect_md5() {
    if [ "$2" = "$3" ]; then say "ok: $1 (md5 $2)"
    else fail "$1: md5 $2, expected $3 $(cat /tmp/dd.err 2>/dev/null | grep -v records | head -n 2)"; fi
}

# write_at DEV FILE BS SEEK: dd FILE onto DEV at SEEK (BS units), O_DIRECT.
write_at() {
    if timeout 120 dd if="$2" of="$1" bs="$3" seek="$4" oflag=direct conv=notrunc 2>/tmp/dd.err; then
        say "wrote ${2##*/} to $1 at $(($3 * $4)) ($(wc -c <"$2") bytes, bs $3, O_DIRECT)"
    else
        fail "write ${2##*/} to $1 at $(($3 * $4)): $(cat /tmp/dd.err)"
        return 1
    fi
}

# disk_by_serial SERIAL: /dev/vdX of the virtio disk with that serial.
disk_by_serial() {
    for d in /sys/block/vd*; do
        [ "$(cat "$d/serial" 2>/dev/null)" = "$1" ] && { echo "/dev/${d##*/}"; return 0; }
    done
    return 1
}

# vport NAME: /dev/vportNpM of the virtio-serial port with that name
# (numbering depends on probe order; there is no udev).
vport() {
    for p in /sys/class/virtio-ports/*; do
        [ "$(cat "$p/name" 2>/dev/null)" = "$1" ] && { echo "/dev/${p##*/}"; return 0; }
    done
    return 1
}

# Each accepted connection of a relay claims the next free port.
cat >/bin/sfg-claim <<'EOF'
#!/bin/sh
for p in "$@"; do
    if mkdir "/run/claimed-${p##*/}" 2>/dev/null; then exec socat STDIO "OPEN:$p"; fi
done
echo "sfg-claim: no free port among $*" >&2
exit 1
EOF
chmod 0755 /bin/sfg-claim

# nbd_attach DEV EXPORT "PORT..." [nbd-client options]: attach EXPORT to
# DEV with the kernel's nbd-client (netlink), one NBD connection per
# port (-C N needs N ports).  A socat relay listens on a guest Unix
# socket and hands each connection to a port.
nbd_attach() {
    dev=$1 exp=$2 names=$3
    shift 3
    ports=""
    for n in $names; do
        p=$(vport "$n") && wait_for "$p" 50 || { fail "virtio-serial port $n not found"; return 1; }
        ports="$ports $p"
    done
    sock=/run/relay-${dev##*/}.sock
    rm -f "$sock"
    step "nbd_attach $dev $exp via$ports"
    if [ "$(echo $ports | wc -w)" = 1 ]; then
        # one connection: one relay process (TCG CPU time is precious)
        socat "UNIX-LISTEN:$sock" "OPEN:${ports# }" 2>/tmp/relay-${dev##*/}.err &
    else
        socat "UNIX-LISTEN:$sock,fork" "EXEC:/bin/sfg-claim$ports" 2>/tmp/relay-${dev##*/}.err &
    fi
    eval "relay_${dev##*/}=$!"
    wait_for "$sock" 50 || { fail "socat relay for $dev did not start"; return 1; }
    if timeout 120 /usr/bin/nbd-client -N "$exp" -t 120 "$@" -unix "$sock" "$dev" >/tmp/nbdc.out 2>&1; then
        say "attached export '$exp' to $dev ($*) via$ports: $(grep -E 'size|Connected' /tmp/nbdc.out | tr '\n' ' ')"
        return 0
    fi
    fail "nbd-client -N $exp $* $dev: $(cat /tmp/nbdc.out /tmp/relay-${dev##*/}.err | tr '\n' ' ')"
    nbd_relay_stop "$dev"
    return 1
}

nbd_relay_stop() {
    eval "rp=\${relay_${1##*/}:-}"
    [ -n "$rp" ] && { kill "$rp" 2>/dev/null; wait "$rp" 2>/dev/null; }
    eval "relay_${1##*/}="
    rm -f "/run/relay-${1##*/}.sock"
}

# nbd_detach DEV: nbd-client -d (NBD_CMD_DISC), then wait until the
# kernel dropped the device and stop its relay.
nbd_detach() {
    step "nbd_detach $1"
    if timeout 60 /usr/bin/nbd-client -d "$1" >/tmp/nbdd.out 2>&1; then
        say "detached $1"
    else
        fail "nbd-client -d $1: $(cat /tmp/nbdd.out)"
    fi
    i=0
    while [ "$(cat "/sys/block/${1##*/}/size" 2>/dev/null)" != 0 ] && [ $i -lt 100 ]; do
        usleep 100000; i=$((i + 1))
    done
    # the relay's children end when the kernel closes its sockets
    usleep 300000
    nbd_relay_stop "$1"
}

# ctl REQUEST...: send a request to the host (GUEST_CTL_HANDLER) over the
# sfg.ctl port and print its one-line reply.
ctl() {
    if [ -z "${ctl_open:-}" ]; then
        p=$(vport sfg.ctl) || { echo "ERROR no control port"; return 1; }
        exec 8<>"$p"
        read -r -t 120 hello <&8
        [ "$hello" = SFG-CTL-HELLO ] || { echo "ERROR no hello from the host: '$hello'"; return 1; }
        ctl_open=1
    fi
    echo "$*" >&8
    read -r -t 300 reply <&8 || reply="ERROR no reply from the host"
    echo "$reply"
}

# Debian's busybox sh runs its own applets before PATH (standalone
# shell), and so does its timeout: the real tools are named in full.
# util-linux's blkdiscard has -z; busybox 1.37 (Debian 13) has an
# nbd-client applet of its own, without netlink, -N or -C.
blkdiscard() { /usr/bin/blkdiscard "$@"; }
nbd_client() { /usr/bin/nbd-client "$@"; }

# dmc ARGS: dmsetup without udev.
dmc() { DM_DISABLE_UDEV=1 /usr/bin/dmsetup --noudevsync "$@"; }

finish() {
    step finish
    sync
    if [ "$FAILS" = 0 ]; then echo "SFG-RESULT: PASS"
    else
        echo "----- guest dmesg (tail) -----"; dmesg | tail -n 30
        echo "SFG-RESULT: FAIL ($FAILS failed checks)"
    fi
    echo "SFG: end uptime=$(uptime_s)"
    poweroff -f
    sleep 10
    echo o >/proc/sysrq-trigger
}

echo "SFG: init start uptime=$(uptime_s) nonce=$SFG_NONCE kernel=$(uname -r) cpus=$(grep -c ^processor /proc/cpuinfo)"
# Watchdog: whatever hangs, the host gets a FAIL line naming the step.
(
    sleep "$SFG_WATCHDOG"
    echo "SFG-FAIL: guest watchdog after ${SFG_WATCHDOG}s, during: $(cat /tmp/step)"
    echo "----- guest dmesg (tail) -----"; dmesg | tail -n 30
    echo "SFG-RESULT: FAIL (watchdog)"
    poweroff -f
) &
step "loading modules"
for m in $(cat /lib/modules/load-order); do
    insmod "/lib/modules/$m.ko" || fail "insmod $m"
done
step "running /test.sh"
. /test.sh
finish
