# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Guest-VM harness for the snapfg interoperability tests (host side).
#
#   source "$(dirname "$0")/functions.sh"
#   source "$(dirname "$0")/guest/guest-lib.sh"
#   guest_require                       # skips (exit 77) when it cannot run
#   guest_nbd_port NAME SOCK            # a virtio-serial port dialled to SOCK
#   guest_disk SERIAL FILE [ro]         # FILE as a raw virtio disk
#   guest_nbd_disk SERIAL SOCK EXPORT [ro]   # QEMU's NBD client as a virtio disk
#   guest_nbd_uri_disk SERIAL SOCK EXPORT [OPT=V...]  # the same from an NBD URI,
#                                       # with nbd driver options (reconnect-delay=)
#   guest_file SRC NAME                 # ship SRC into the guest as /data/NAME
#   guest_set VAR VALUE                 # shell variable for the guest script
#   GUEST_CTL_HANDLER=func              # optional: host answers guest requests
#                                       # (needs socat on the host)
#   guest_run SCRIPT                    # boot, run SCRIPT in the guest, check
#   guest_val KEY                       # a value the guest reported
#
# The guest is a Debian cloud kernel with a busybox initramfs, booted by
# qemu-system-x86_64 (KVM when /dev/kvm can boot it, else TCG) with no
# network.  The kernel's nbd-client reaches host nbdkit sockets through
# virtio-serial ports (one port per NBD connection, dialled at start-up:
# a re-dialled port can lose nbdkit's greeting), relayed to a guest Unix
# socket by socat because the kernel NBD driver needs a socket fd.
#
# Everything the guest needs is fetched once with "apt-get download" and
# "dpkg-deb -x" and cached in $SNAPFG_GUEST_CACHE (default
# ~/.cache/snapfg-guest): the kernel (linux-image-cloud-amd64) and the
# modules it needs, busybox-static, nbd-client, socat, dmsetup,
# libdevmapper1.02.1 and util-linux (blkdiscard), plus any library package
# of theirs that the host lacks.  Later runs use the cache and need no network.
#
# Environment (all optional):
#   SNAPFG_GUEST_CACHE       cache directory
#   SNAPFG_GUEST_KERNEL_PKG  kernel metapackage (default linux-image-cloud-amd64)
#   SNAPFG_GUEST_REFRESH=1   re-resolve and re-fetch the packages
#   SNAPFG_GUEST_ACCEL       kvm | tcg (default: kvm if /dev/kvm boots the
#                            guest, probed once per machine, else tcg)
#   SNAPFG_GUEST_TIMEOUT     seconds a guest may run (default 300)
#   SNAPFG_GUEST_VERBOSE=1   print the whole guest console, not only SFG lines
#   SNAPFG_GUEST_SMP, SNAPFG_GUEST_MEM   guest CPUs (default 1) and MiB (256)
#   SNAPFG_GUEST_QEMU        the QEMU binary (default qemu-system-x86_64)
#
# Guest protocol (console lines, see guest-init.sh): "SFG: [uptime] text",
# "SFG-FAIL: text", "SFG-VAL key value", "SFG-RESULT: PASS|FAIL".
# Guest scripts run under Debian's busybox sh, which runs its applets
# before PATH: the fetched tools live in /usr/bin (blkdiscard is a
# function calling /usr/bin/blkdiscard).

# shellcheck shell=bash

_guest_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUEST_CACHE=${SNAPFG_GUEST_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/snapfg-guest}
GUEST_KERNEL_PKG=${SNAPFG_GUEST_KERNEL_PKG:-linux-image-cloud-amd64}
GUEST_TIMEOUT=${SNAPFG_GUEST_TIMEOUT:-300}
GUEST_SMP=${SNAPFG_GUEST_SMP:-1}
GUEST_MEM=${SNAPFG_GUEST_MEM:-256}
GUEST_CTL_HANDLER=${GUEST_CTL_HANDLER:-}
GUEST_QEMU=${SNAPFG_GUEST_QEMU:-qemu-system-x86_64}
# Bump when the cache layout or the initramfs contents change.
_GUEST_FORMAT=3

# Kernel modules the guest loads (dependencies are added from each
# module's depends= string, in load order).
_GUEST_MODULES=(virtio_pci virtio_blk virtio_console nbd dm_snapshot ext4)
# Userland packages fetched for the guest, and the binaries taken from them.
# (util-linux: its blkdiscard has -z, BLKZEROOUT; busybox's has not.)
_GUEST_PKGS=(busybox-static nbd-client socat dmsetup libdevmapper1.02.1 util-linux)
# Names only: Debian 12 ships them under /sbin and /usr/bin, Debian 13
# (merged /usr) under /usr/sbin and /usr/bin; _guest_bin finds them.
_GUEST_BINS=(nbd-client socat dmsetup blkdiscard)

_guest_qemu_args=()
_guest_nports=0
_guest_ndisks=0
_guest_files=()
_guest_vars=""
_guest_console=""
_guest_work=""
_guest_pids=()

_guest_log() { echo "$test_name: [guest] $*"; }

# ---------------------------------------------------------------------
# Requirements and the cache.

# guest_require: skip the test (exit 77) unless a guest can run here:
# qemu-system-x86_64 and the build tools are installed and the kernel,
# busybox and the guest tools are cached or can be fetched.
guest_require() {
    local c
    command -v "$GUEST_QEMU" >/dev/null 2>&1 && "$GUEST_QEMU" --version >/dev/null 2>&1 ||
        skip "$GUEST_QEMU not installed or not runnable (Debian package qemu-system-x86)"
    for c in cpio gzip flock ldd sha256sum setpriv timeout; do
        command -v "$c" >/dev/null 2>&1 || skip "'$c' not found (needed to build the guest)"
    done
    mkdir -p "$GUEST_CACHE" 2>/dev/null || skip "cannot create the guest cache $GUEST_CACHE"
    GUEST_CACHE=$(cd "$GUEST_CACHE" && pwd)
    local t0=$SECONDS st=0 lockfd
    exec {lockfd}>"$GUEST_CACHE/.lock"
    # Parallel tests share the cache: one builds, the others wait.
    flock -w 600 "$lockfd" || skip "guest cache $GUEST_CACHE is locked by another run for 10 minutes"
    # Not "( ... ) || st=$?": errexit would be off inside (see _guest_prepare).
    local had_errexit=0
    case $- in *e*) had_errexit=1 ;; esac
    set +e
    ( _guest_prepare ) >"$tmpdir/guest-prepare.log" 2>&1
    st=$?
    [ "$had_errexit" = 1 ] && set -e
    if [ "$st" -eq 0 ]; then
        GUEST_KDIR=$(readlink -f "$GUEST_CACHE/kernel-current")
        GUEST_INITRD=$(cat "$GUEST_CACHE/initramfs-current")
        _guest_pick_accel
    fi
    flock -u "$lockfd"
    exec {lockfd}>&-
    if [ "$st" -eq 77 ]; then
        cat "$tmpdir/guest-prepare.log"
        skip "cannot fetch the guest kernel/packages (no network or no Debian archive?) and they are not cached in $GUEST_CACHE"
    elif [ "$st" -ne 0 ]; then
        cat "$tmpdir/guest-prepare.log" >&2
        fail "building the guest image failed"
    fi
    grep -E '^(fetch|built)' "$tmpdir/guest-prepare.log" | sed "s/^/$test_name: [guest] /" || true
    _guest_log "kernel $(cat "$GUEST_KDIR/pkg") ($(cat "$GUEST_KDIR/kver")), initramfs ${GUEST_INITRD##*/}, ready in $((SECONDS - t0)) s"
}

# _guest_pick_accel: GUEST_ACCEL=kvm if /dev/kvm can boot the guest
# kernel, else tcg.  A /dev/kvm can exist and still not run guests (some
# nested set-ups hang in early boot), so the first run on a machine boots
# the kernel once with KVM (at most 12 s; KVM boots it in 1-2) and caches
# the verdict.
_guest_pick_accel() {
    GUEST_ACCEL=${SNAPFG_GUEST_ACCEL:-}
    [ -n "$GUEST_ACCEL" ] && return 0
    GUEST_ACCEL=tcg
    [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 0
    local id verdict log
    id=$( { cat /etc/machine-id 2>/dev/null; uname -r; "$GUEST_QEMU" --version | head -n1;
            cat "$GUEST_KDIR/pkg"; } | sha256sum | cut -c1-16)
    verdict=$GUEST_CACHE/kvm-verdict-$id
    if [ ! -s "$verdict" ]; then
        log=$tmpdir/kvm-probe.log
        # (in a subshell: its shell, not ours, reports the KILL)
        ( timeout -s KILL 12 "$GUEST_QEMU" -machine pc -accel kvm -m 128 -nodefaults \
            -no-user-config -display none -no-reboot -kernel "$GUEST_KDIR/vmlinuz" \
            -initrd "$GUEST_INITRD" -append "console=ttyS0 panic=-1 quiet sfg.probe=1" \
            -serial "file:$log" ) >/dev/null 2>&1 || true
        if grep -q SFG-PROBE-OK "$log" 2>/dev/null; then echo kvm >"$verdict"
        else echo tcg >"$verdict"; fi
        _guest_log "KVM probe: $(cat "$verdict") (cached in ${verdict##*/})"
    fi
    GUEST_ACCEL=$(cat "$verdict")
}

# The steps below run in a subshell with output to a log; exit 77 means
# "could not fetch", anything else non-zero is a real error.
_guest_apt_updated=0
_guest_nofetch() { echo "cannot fetch: $*"; exit 77; }

# _guest_download DIR PKG...: apt-get download into DIR (one apt update
# retry: the package lists may be missing or stale).
_guest_download() {
    local dir=$1
    shift
    command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 ||
        _guest_nofetch "apt-get/dpkg-deb not installed"
    mkdir -p "$dir"
    if (cd "$dir" && apt-get -o Acquire::Retries=0 download "$@") >"$dir/apt.log" 2>&1; then return 0; fi
    # Stale or missing package lists (not a network failure): update once.
    if [ "$_guest_apt_updated" = 0 ] &&
       grep -qE "Unable to locate|Can't select|404 +Not Found" "$dir/apt.log"; then
        _guest_apt_updated=1
        apt-get -o Acquire::Retries=0 update >/dev/null 2>&1 || true
        (cd "$dir" && apt-get -o Acquire::Retries=0 download "$@") >"$dir/apt.log" 2>&1 && return 0
    fi
    grep -E '^(E|Err):' "$dir/apt.log" | head -n 5
    _guest_nofetch "apt-get download $*"
}

_guest_resolve_kernel() {
    local dep
    dep=$(apt-cache depends "$GUEST_KERNEL_PKG" 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }')
    if [ -z "$dep" ] && [ "$_guest_apt_updated" = 0 ]; then
        _guest_apt_updated=1
        apt-get -o Acquire::Retries=0 update >/dev/null 2>&1 || true
        dep=$(apt-cache depends "$GUEST_KERNEL_PKG" 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }')
    fi
    [ -n "$dep" ] || _guest_nofetch "apt-cache cannot resolve $GUEST_KERNEL_PKG"
    echo "$dep"
}

_guest_ko_cat() {
    case $1 in
        *.ko.xz) xz -dc "$1" ;;
        *.ko.zst) zstd -qdc "$1" ;;
        *.ko.gz) gzip -dc "$1" ;;
        *) cat "$1" ;;
    esac
}

# Kernel: vmlinuz and the modules we load, in $GUEST_CACHE/kernel-<pkg>.
_guest_prepare_kernel() {
    local link=$GUEST_CACHE/kernel-current
    if [ "${SNAPFG_GUEST_REFRESH:-0}" != 1 ] && [ -f "$link/modules/load-order" ] &&
       [ "$(cat "$link/metapkg" 2>/dev/null)" = "$GUEST_KERNEL_PKG" ] &&
       [ "$(cat "$link/wanted" 2>/dev/null)" = "${_GUEST_MODULES[*]}" ]; then
        return 0
    fi
    local pkg kdir tmp deb kver mroot f n m
    pkg=$(_guest_resolve_kernel)
    kdir=$GUEST_CACHE/kernel-$pkg
    if [ ! -f "$kdir/modules/load-order" ] ||
       [ "$(cat "$kdir/wanted" 2>/dev/null)" != "${_GUEST_MODULES[*]}" ]; then
        echo "fetch: $pkg (for $GUEST_KERNEL_PKG)"
        tmp=$(mktemp -d "$GUEST_CACHE/.kernel.XXXXXX")
        _guest_download "$tmp" "$pkg"
        deb=$(ls "$tmp"/*.deb | head -n1)
        dpkg-deb -x "$deb" "$tmp/x"
        # /lib/modules on Debian 12, /usr/lib/modules on Debian 13
        local mdir
        for mdir in "$tmp/x/lib/modules" "$tmp/x/usr/lib/modules" ""; do
            [ -z "$mdir" ] || [ -d "$mdir" ] && break
        done
        [ -n "$mdir" ] || { echo "no lib/modules or usr/lib/modules in $deb"; return 1; }
        kver=$(ls "$mdir" | head -n1)
        mroot=$mdir/$kver
        [ -n "$kver" ] && [ -d "$mroot" ] || { echo "no kernel version directory in $mdir ($deb)"; return 1; }
        [ -f "$tmp/x/boot/vmlinuz-$kver" ] || { echo "no boot/vmlinuz-$kver in $deb"; return 1; }
        mkdir -p "$tmp/out/modules"
        cp "$tmp/x/boot/vmlinuz-$kver" "$tmp/out/vmlinuz"
        declare -A ko=()
        while IFS= read -r f; do
            n=${f##*/}; n=${n%%.ko*}; n=${n//-/_}; ko[$n]=$f
        done < <(find "$mroot" -name '*.ko*')
        local order=()
        _guest_add_mod() {
            local m=${1//-/_} deps d
            case " ${order[*]-} " in *" $m "*) return 0 ;; esac
            if [ -z "${ko[$m]:-}" ]; then
                # built into the kernel?
                grep -q "/${m//_/[-_]}\.ko" "$mroot/modules.builtin" 2>/dev/null && return 0
                echo "module $m is not in $pkg"; return 1
            fi
            deps=$(_guest_ko_cat "${ko[$m]}" | grep -a -o -m1 'depends=[A-Za-z0-9_,-]*' | head -n1 | cut -d= -f2 || true)
            for d in ${deps//,/ }; do _guest_add_mod "$d" || return 1; done
            order+=("$m")
            _guest_ko_cat "${ko[$m]}" >"$tmp/out/modules/$m.ko"
        }
        for m in "${_GUEST_MODULES[@]}"; do _guest_add_mod "$m" || return 1; done
        printf '%s\n' "${order[@]}" >"$tmp/out/modules/load-order"
        echo "$kver" >"$tmp/out/kver"
        echo "$pkg" >"$tmp/out/pkg"
        echo "${_GUEST_MODULES[*]}" >"$tmp/out/wanted"
        dpkg-deb -f "$deb" Version >"$tmp/out/version"
        rm -rf "$kdir"
        mv "$tmp/out" "$kdir"
        rm -rf "$tmp"
    fi
    echo "$GUEST_KERNEL_PKG" >"$kdir/metapkg.tmp"
    mv "$kdir/metapkg.tmp" "$kdir/metapkg"
    _guest_link "${kdir##*/}" "$link"
}

# _guest_lib_path ROOT: library directories of an unpacked package tree.
_guest_lib_path() {
    echo "$1/lib/x86_64-linux-gnu:$1/usr/lib/x86_64-linux-gnu:$1/lib:$1/usr/lib"
}

# _guest_bin ROOT NAME: the path of the binary NAME in an unpacked
# package tree, in whichever of the usual directories it is.
_guest_bin() {
    local d
    for d in usr/sbin usr/bin sbin bin; do
        [ -f "$1/$d/$2" ] && { echo "$1/$d/$2"; return 0; }
    done
    echo "$2 not found under $1/{usr/sbin,usr/bin,sbin,bin} (packages: ${_GUEST_PKGS[*]})" >&2
    return 1
}

# _guest_missing_libs ROOT: sonames the host's loader cannot resolve for
# the guest binaries, even with ROOT's libraries added.
_guest_missing_libs() {
    local b p
    for b in "${_GUEST_BINS[@]}"; do
        p=$(_guest_bin "$1" "$b") || { echo "MISSING-BINARY-$b"; continue; }
        LD_LIBRARY_PATH=$(_guest_lib_path "$1") ldd "$p" 2>/dev/null |
            awk '/not found/ { print $1 }'
    done | sort -u
}

# Userland: busybox, nbd-client, socat, dmsetup and their libraries, in a
# tree ready to be packed ($GUEST_CACHE/userland-<hash>).
_guest_prepare_userland() {
    local link=$GUEST_CACHE/userland-current
    local spec="format $_GUEST_FORMAT; packages ${_GUEST_PKGS[*]}; binaries ${_GUEST_BINS[*]}"
    if [ "${SNAPFG_GUEST_REFRESH:-0}" != 1 ] && [ -f "$link/stamp" ] &&
       [ "$(cat "$link/spec" 2>/dev/null)" = "$spec" ]; then
        return 0
    fi
    local tmp x d deb want missing p lib b out key
    tmp=$(mktemp -d "$GUEST_CACHE/.userland.XXXXXX")
    echo "fetch: ${_GUEST_PKGS[*]}"
    _guest_download "$tmp/debs" "${_GUEST_PKGS[@]}"
    x=$tmp/x
    for deb in "$tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$x"; done
    for b in busybox "${_GUEST_BINS[@]}"; do _guest_bin "$x" "$b" >/dev/null; done
    # Library packages the host lacks: follow the packages' Depends (lib*
    # only, never libc6) until every soname resolves, at most 4 rounds.
    for _ in 1 2 3 4; do
        missing=$(_guest_missing_libs "$x")
        [ -z "$missing" ] && break
        echo "fetch: libraries missing on the host:" $missing
        want=()
        for deb in "$tmp"/debs/*.deb; do
            for p in $(dpkg-deb -f "$deb" Depends Pre-Depends | sed 's/^[A-Za-z-]*://' | tr ',|' '\n\n' |
                       sed 's/(.*//; s/:any//; s/[[:space:]]//g' | grep '^lib' | sort -u); do
                case $p in libc6|libc-bin|libgcc-s1) continue ;; esac
                ls "$tmp"/debs/"${p}"_*.deb >/dev/null 2>&1 && continue
                case " ${want[*]-} " in *" $p "*) ;; *) want+=("$p") ;; esac
            done
        done
        [ "${#want[@]}" -gt 0 ] || break
        _guest_download "$tmp/debs" "${want[@]}"
        for p in "${want[@]}"; do dpkg-deb -x "$(ls "$tmp"/debs/"${p}"_*.deb | head -n1)" "$x"; done
    done
    missing=$(_guest_missing_libs "$x")
    [ -z "$missing" ] || { echo "cannot resolve libraries: $missing"; return 1; }

    out=$tmp/out
    # busybox in /bin (its applets are linked there at boot); the real
    # tools in /usr/bin, first in the guest's PATH, so that busybox's
    # applets of the same name (blkdiscard) do not shadow them.
    mkdir -p "$out/bin" "$out/usr/bin" "$out/lib64"
    p=$(_guest_bin "$x" busybox)
    cp "$p" "$out/bin/busybox"
    for b in "${_GUEST_BINS[@]}"; do
        p=$(_guest_bin "$x" "$b")
        cp "$p" "$out/usr/bin/"
        # the libraries exactly as the host's loader resolves them (the
        # unpacked ones first)
        while IFS= read -r lib; do
            [ -n "$lib" ] && [ -e "$lib" ] || continue
            d=$lib
            case $lib in "$x"/*) d=${lib#"$x"} ;; esac
            d=/lib/x86_64-linux-gnu/${d##*/}
            case $lib in /lib64/*) d=$lib ;; esac
            [ -e "$out$d" ] || { mkdir -p "$out${d%/*}"; cp -L "$lib" "$out$d"; }
        done < <(LD_LIBRARY_PATH=$(_guest_lib_path "$x") ldd "$p" |
                 awk '/=> \// { print $3 } /^[[:space:]]*\// { print $1 }')
    done
    for deb in "$tmp"/debs/*.deb; do
        echo "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)"
    done | sort >"$out/packages"
    echo "$spec" >"$out/spec"
    key=$( (cd "$out" && find . -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16)
    echo "$key" >"$out/stamp"
    rm -rf "$GUEST_CACHE/userland-$key"
    mv "$out" "$GUEST_CACHE/userland-$key"
    rm -rf "$tmp"
    _guest_link "userland-$key" "$link"
    # older userland trees (initramfs images are built from the current one)
    for d in "$GUEST_CACHE"/userland-*; do
        case ${d##*/} in
            userland-current|"userland-$key") ;;
            *) rm -rf "$d" ;;
        esac
    done
    echo "built: userland-$key ($(tr '\n' ' ' <"$GUEST_CACHE/userland-$key/packages"))"
}

# The base initramfs: /init (guest-init.sh), modules, userland.
_guest_prepare_initramfs() {
    local k u key root out
    k=$(readlink -f "$GUEST_CACHE/kernel-current")
    u=$(readlink -f "$GUEST_CACHE/userland-current")
    key=$( { echo "format $_GUEST_FORMAT"; cat "$_guest_dir/guest-init.sh" "$k/pkg" "$u/stamp"; } |
           sha256sum | cut -c1-16)
    out=$GUEST_CACHE/initramfs-$key.cpio.gz
    if [ ! -s "$out" ]; then
        root=$(mktemp -d "$GUEST_CACHE/.initramfs.XXXXXX")
        mkdir -p "$root"/{bin,sbin,dev,proc,sys,run,tmp,data,lib/modules}
        cp -a "$u"/. "$root"/
        rm -f "$root/stamp" "$root/packages" "$root/spec"
        cp "$k"/modules/*.ko "$k/modules/load-order" "$root/lib/modules/"
        cp "$_guest_dir/guest-init.sh" "$root/init"
        chmod 0755 "$root/init"
        (cd "$root" && find . -print0 | sort -z | cpio --null -o -H newc -R 0:0 --quiet) |
            gzip -1 >"$out.tmp"
        mv "$out.tmp" "$out"
        rm -rf "$root"
        echo "built: ${out##*/} ($(du -h "$out" | cut -f1))"
        # keep the four newest
        ls -t "$GUEST_CACHE"/initramfs-*.cpio.gz 2>/dev/null | tail -n +5 | xargs -r rm -f
    fi
    echo "$out" >"$GUEST_CACHE/initramfs-current.tmp"
    mv "$GUEST_CACHE/initramfs-current.tmp" "$GUEST_CACHE/initramfs-current"
}

# _guest_link TARGET LINK: point the symlink LINK at TARGET atomically
# (a new link renamed over the old one).
_guest_link() {
    ln -sfn "$1" "$2.tmp"
    mv -T "$2.tmp" "$2"
}

# _guest_prepare: fetch and build what is missing from the cache.  Run
# it in a subshell that is not in a || or && list (bash ignores set -e
# there, even when the subshell sets it again): any failing step stops
# it.  Each cache entry is built in a temporary directory and renamed
# into place only when complete, so a failure leaves no broken entry.
_guest_prepare() {
    set -euo pipefail
    shopt -s inherit_errexit
    rm -rf "$GUEST_CACHE"/.kernel.* "$GUEST_CACHE"/.userland.* "$GUEST_CACHE"/.initramfs.*
    _guest_prepare_kernel
    _guest_prepare_userland
    _guest_prepare_initramfs
}

# ---------------------------------------------------------------------
# Describing the guest.

# guest_nbd_port NAME SOCK: a virtio-serial port "NAME" whose chardev
# dials the nbdkit socket SOCK when QEMU starts (one NBD connection:
# use one port per nbd-client connection, including re-attaches).
guest_nbd_port() {
    _guest_need_path "$2"
    _guest_nports=$((_guest_nports + 1))
    _guest_qemu_args+=(-chardev "socket,id=port$_guest_nports,path=$2"
                       -device "virtserialport,bus=vser0.0,chardev=port$_guest_nports,name=$1")
}

# guest_disk SERIAL FILE [ro]: FILE as a raw virtio-blk disk; the guest
# finds it with disk_by_serial SERIAL.  QEMU takes no image locks on it
# (file.locking=off): the tests hand the same files to snapfg on the
# host while the VM runs (the guest does not use them meanwhile), and
# snapfg locks its origin and COW files.
guest_disk() {
    local ro=off
    [ "${3:-}" = ro ] && ro=on
    _guest_need_path "$2"
    _guest_ndisks=$((_guest_ndisks + 1))
    _guest_qemu_args+=(-drive "if=none,id=disk$_guest_ndisks,file=$2,format=raw,cache=none,aio=threads,readonly=$ro,file.locking=off"
                       -device "virtio-blk-pci,drive=disk$_guest_ndisks,serial=$1,event_idx=off")
}

# guest_nbd_disk SERIAL SOCK EXPORT [ro]: QEMU's own NBD client serves
# EXPORT from SOCK as a virtio-blk disk (legacy "nbd:unix:SOCK" syntax,
# cache=none, discard=unmap so the guest's discards reach the server).
guest_nbd_disk() {
    local ro=off
    [ "${4:-}" = ro ] && ro=on
    _guest_need_path "$2"
    _guest_ndisks=$((_guest_ndisks + 1))
    local file="nbd:unix:$2"
    [ -z "$3" ] || file+=":exportname=$3"     # none: the default export ""
    _guest_qemu_args+=(-drive "if=none,id=disk$_guest_ndisks,file=$file,format=raw,cache=none,discard=unmap,readonly=$ro"
                       -device "virtio-blk-pci,drive=disk$_guest_ndisks,serial=$1,event_idx=off")
}

# guest_nbd_uri_disk SERIAL SOCK EXPORT [NBD-OPTION...]: like
# guest_nbd_disk, but QEMU opens an NBD URI
# (file=nbd+unix:///EXPORT?socket=SOCK) and takes options of its nbd
# driver, e.g. reconnect-delay=60: requests wait up to 60 s for the
# server to come back instead of failing.
guest_nbd_uri_disk() {
    local serial=$1 sock=$2 exp=$3 o opts=""
    shift 3
    _guest_need_path "$sock"
    for o in "$@"; do opts+=",file.$o"; done
    _guest_ndisks=$((_guest_ndisks + 1))
    _guest_qemu_args+=(-drive "if=none,id=disk$_guest_ndisks,file=nbd+unix:///$exp?socket=$sock$opts,format=raw,cache=none,discard=unmap"
                       -device "virtio-blk-pci,drive=disk$_guest_ndisks,serial=$serial,event_idx=off")
}

# QEMU's option syntax splits on ',' and the nbd: syntax on ':'.
_guest_need_path() {
    case $1 in *[,:]*) fail "path '$1' must not contain ',' or ':' (QEMU option syntax)" ;; esac
}

# guest_file SRC NAME: the guest sees SRC as /data/NAME.
guest_file() { _guest_files+=("$1" "$2"); }

# guest_set VAR VALUE: VAR=VALUE in the guest script's environment.
guest_set() {
    case $1 in *[!A-Za-z0-9_]*|"") fail "guest_set: bad name '$1'" ;; esac
    _guest_vars+="$1=$(printf '%q' "$2")"$'\n'
}

# guest_val KEY: the last "SFG-VAL KEY VALUE" the guest printed.
guest_val() {
    printf '%s\n' "$_guest_console" | awk -v k="$1" '$1 == "SFG-VAL" && $2 == k { v = $3 } END { print v }'
}

# ---------------------------------------------------------------------
# Running it.

_guest_kill() {
    local pid
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 50); do
        local alive=0
        for pid in "$@"; do _proc_alive "$pid" && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in "$@"; do
        _proc_alive "$pid" && kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null || true
    done
}
_guest_cleanup() {
    [ "${#_guest_pids[@]}" -gt 0 ] && _guest_kill "${_guest_pids[@]}"
    _guest_pids=()
}
on_exit _guest_cleanup

_guest_forget() {
    local keep=() p
    for p in "${_guest_pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    _guest_pids=("${keep[@]}")
}

# guest_run SCRIPT: boot the guest, run SCRIPT (busybox sh, sourced by
# /init after the modules are loaded, with the helpers of guest-init.sh)
# and power off.  Each SFG-FAIL line and each harness problem (timeout,
# no PASS, QEMU error) is recorded with check_fail.  Returns 0 if the
# guest reported PASS.
guest_run() {
    local script=$1 w stage nonce accel watchdog t0 qpid rc=0 timed_out=0
    w=$(mktemp -d "$tmpdir/guest.XXXXXX")
    _guest_work=$w
    stage=$w/stage
    mkdir -p "$stage/data"
    nonce=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
    watchdog=$((GUEST_TIMEOUT > 60 ? GUEST_TIMEOUT - 20 : GUEST_TIMEOUT * 2 / 3))
    {
        echo "SFG_NONCE=$nonce"
        echo "SFG_WATCHDOG=$watchdog"
        printf '%s' "$_guest_vars"
    } >"$stage/params.sh"
    cp "$script" "$stage/test.sh"
    local i
    for ((i = 0; i < ${#_guest_files[@]}; i += 2)); do
        cp "${_guest_files[i]}" "$stage/data/${_guest_files[i + 1]}"
    done
    # The base initramfs (cached) followed by this run's small archive:
    # the kernel unpacks concatenated archives in order.
    (cd "$stage" && find . -print0 | sort -z | cpio --null -o -H newc -R 0:0 --quiet) |
        gzip -1 >"$w/run.cpio.gz"
    cat "$GUEST_INITRD" "$w/run.cpio.gz" >"$w/initrd"

    accel=$GUEST_ACCEL
    local accel_args=(-accel "$accel")
    local ctl_args=()
    if [ -n "$GUEST_CTL_HANDLER" ]; then
        ctl_args=(-chardev "socket,id=ctl,path=$w/ctl.sock,server=on,wait=off"
                  -device "virtserialport,bus=vser0.0,chardev=ctl,name=sfg.ctl")
    fi
    # shellcheck disable=SC2054 # commas are QEMU option syntax
    local qemu=("$GUEST_QEMU" -machine pc "${accel_args[@]}" -smp "$GUEST_SMP" -m "$GUEST_MEM"
        -nodefaults -no-user-config -display none -no-reboot
        -kernel "$GUEST_KDIR/vmlinuz" -initrd "$w/initrd"
        -append "console=ttyS0 panic=-1 quiet loglevel=4"
        -chardev "file,id=con0,path=$w/console.log" -serial chardev:con0
        -device virtio-serial-pci,id=vser0
        "${ctl_args[@]}" "${_guest_qemu_args[@]}")
    _guest_log "booting ($accel, smp $GUEST_SMP, ${GUEST_MEM}M, $_guest_ndisks disk(s), $_guest_nports NBD port(s), timeout ${GUEST_TIMEOUT}s)"
    printf '%q ' "${qemu[@]}" >"$w/qemu.cmd"
    t0=$SECONDS
    # --pdeathsig: QEMU dies with this shell even if the shell is SIGKILLed.
    setpriv --pdeathsig KILL -- "${qemu[@]}" >"$w/qemu.log" 2>&1 &
    qpid=$!
    _guest_pids+=("$qpid")

    local deadline=$((SECONDS + GUEST_TIMEOUT)) cpid="" cin="" cout="" line r part=""
    while _proc_alive "$qpid"; do
        if [ "$timed_out" = 0 ] && [ "$SECONDS" -ge "$deadline" ]; then
            _guest_log "guest still running after ${GUEST_TIMEOUT}s: stopping QEMU"
            timed_out=1
            kill -TERM "$qpid" 2>/dev/null || true
            deadline=$((SECONDS + 10))
        elif [ "$timed_out" = 1 ] && [ "$SECONDS" -ge "$deadline" ]; then
            # QEMU drains its NBD disks on SIGTERM: a hung server hangs it
            kill -KILL "$qpid" 2>/dev/null || true
            timed_out=2
        fi
        if [ -n "$GUEST_CTL_HANDLER" ] && [ -z "$cpid" ] && [ -S "$w/ctl.sock" ]; then
            # connect to the guest's control port; the guest waits for HELLO
            mkfifo "$w/ctl.in" "$w/ctl.out"
            socat STDIO "UNIX-CONNECT:$w/ctl.sock" <"$w/ctl.in" >"$w/ctl.out" 2>"$w/ctl.err" &
            cpid=$!
            _guest_pids+=("$cpid")
            exec {cin}>"$w/ctl.in" {cout}<"$w/ctl.out"
            # (writes in a subshell: a dead socat's SIGPIPE must not kill us)
            (echo "SFG-CTL-HELLO" >&"$cin") 2>/dev/null || true
        fi
        if [ -n "$cout" ]; then
            r=0
            IFS= read -r -t 0.2 line <&"$cout" || r=$?
            if [ "$r" -gt 128 ]; then
                part+=$line     # a timed-out read keeps what it read so far
            elif [ "$r" = 0 ]; then
                line=$part$line part=""
                GUEST_CTL_REPLY="ERROR no reply"
                # shellcheck disable=SC2086 # the request is word-split
                "$GUEST_CTL_HANDLER" $line
                (echo "$GUEST_CTL_REPLY" >&"$cin") 2>/dev/null || true
            else
                exec {cout}<&- {cin}>&-
                cout="" cin=""
            fi
        else
            sleep 0.2
        fi
    done
    wait "$qpid" || rc=$?
    _guest_forget "$qpid"
    if [ -n "$cpid" ]; then
        [ -n "$cout" ] && exec {cout}<&- {cin}>&-
        _guest_kill "$cpid"
        _guest_forget "$cpid"
    fi
    _guest_console=$(tr -d '\r' <"$w/console.log" 2>/dev/null || true)
    if [ "${SNAPFG_GUEST_VERBOSE:-0}" = 1 ]; then
        printf '%s\n' "$_guest_console" | sed 's/^/  guest| /'
    else
        printf '%s\n' "$_guest_console" | grep -E '^SFG(:|-FAIL|-RESULT)' | sed 's/^/  guest| /' || true
    fi
    local boot end ok=1
    boot=$(printf '%s\n' "$_guest_console" | sed -n 's/^SFG: init start uptime=\([0-9.]*\).*/\1/p' | head -n1)
    end=$(printf '%s\n' "$_guest_console" | sed -n 's/^SFG: end uptime=\([0-9.]*\).*/\1/p' | head -n1)
    _guest_log "QEMU exited with status $rc after $((SECONDS - t0)) s (guest: init at ${boot:-?} s, end at ${end:-?} s)"
    if [ "$timed_out" != 0 ]; then
        check_fail "guest timed out after ${GUEST_TIMEOUT}s (SNAPFG_GUEST_TIMEOUT)"; ok=0
    fi
    if [ "$rc" -ne 0 ]; then
        check_fail "QEMU exited with status $rc: $(tail -n 5 "$w/qemu.log" | tr '\n' ' ')"; ok=0
    fi
    # Here-strings, not printf | grep -q: under pipefail a grep -q that
    # matches early makes printf's later writes fail with SIGPIPE, and the
    # pipeline with them (a passing guest was once reported as not started).
    if ! grep -q "^SFG: init start .*nonce=$nonce" <<<"$_guest_console"; then
        check_fail "the guest's init did not start (nonce $nonce not on the console)"; ok=0
    fi
    while IFS= read -r line; do
        check_fail "guest: ${line#SFG-FAIL: }"; ok=0
    done < <(printf '%s\n' "$_guest_console" | grep '^SFG-FAIL: ' || true)
    if ! grep -qx 'SFG-RESULT: PASS' <<<"$_guest_console"; then
        [ "$ok" = 0 ] || check_fail "the guest did not report PASS"
        ok=0
    fi
    if [ "$ok" = 0 ]; then
        echo "----- guest console (last 60 lines) -----" >&2
        printf '%s\n' "$_guest_console" | tail -n 60 >&2
        if [ -s "$w/qemu.log" ]; then
            echo "----- qemu log -----" >&2
            tail -n 20 "$w/qemu.log" >&2
        fi
        # A guest that did not run to its end leaves nothing for the
        # host's checks to compare: stop here.
        grep -q '^SFG: end uptime=' <<<"$_guest_console" ||
            fail "the guest did not run to its end"
        return 1
    fi
    return 0
}

# ---------------------------------------------------------------------
# Host-side checks shared by the guest tests.

# require_snapfgctl: set SNAPFGCTL ($SNAPFGCTL, else tools/snapfgctl/snapfgctl of the
# plugin's build tree, else ./tools/snapfgctl/snapfgctl) or fail.
require_snapfgctl() {
    local c
    for c in "${SNAPFGCTL:-}" \
             "$(cd "$(dirname "$SNAPFG_PLUGIN")/../../.." 2>/dev/null && pwd)/tools/snapfgctl/snapfgctl" \
             "$PWD/tools/snapfgctl/snapfgctl"; do
        if [ -n "$c" ] && [ -x "$c" ]; then SNAPFGCTL=$c; return 0; fi
    done
    fail "snapfgctl not found (SNAPFGCTL='${SNAPFGCTL:-}'): make tools/snapfgctl/snapfgctl"
}

# md5_of FILE: md5 of a file.
md5_of() { md5sum <"$1" | cut -d' ' -f1; }

# copy_export_to URI FILE: nbdcopy the whole export into FILE (60 s max).
copy_export_to() {
    rm -f "$2"
    timeout 60 nbdcopy -- "$1" "$2" 2>"$tmpdir/nbdcopy.err"
}

# check_export URI FILE WHAT: the export equals FILE byte for byte.
check_export() {
    if ! copy_export_to "$1" "$tmpdir/export.img"; then
        check_fail "$3: nbdcopy $1 failed: $(head -c 300 "$tmpdir/nbdcopy.err")"
        return 0
    fi
    check_files "$tmpdir/export.img" "$2" "$3"
}

# check_files A B WHAT: cmp A B.
check_files() {
    if cmp "$1" "$2" >"$tmpdir/cmp.out" 2>&1; then
        info "ok: $3"
    else
        check_fail "$3: $(head -c 300 "$tmpdir/cmp.out")"
    fi
}

# check_md5 WHAT GOT WANT
check_md5() {
    if [ -n "$2" ] && [ "$2" = "$3" ]; then
        info "ok: $1 (md5 $2)"
    else
        check_fail "$1: md5 '$2', expected '$3'"
    fi
}

# patch_file FILE OFFSET SRC: write SRC into FILE at byte OFFSET.
patch_file() {
    dd if="$3" of="$1" bs=512 seek="$(($2 / 512))" conv=notrunc status=none
}

# zero_file FILE OFFSET LENGTH: zero a byte range (multiples of 512).
zero_file() {
    dd if=/dev/zero of="$1" bs=512 seek="$(($2 / 512))" count="$(($3 / 512))" conv=notrunc status=none
}
