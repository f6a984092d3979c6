#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Build and test snapfg in a Debian 13 (trixie) root on a Debian host:
# nbdkit 1.42, libnbd 1.22, QEMU 10, gcc 14, and a Debian 13 guest
# kernel and busybox for make check-guest.  .ci/run's second stage.
#
#   contrib/debian13.sh [RUN_SH_COMMAND]      (default: check)
#
# Steps:
#  1. The root: unpacked from the cache tarball if there is one (made
#     at most SNAPFG_D13_MAX_AGE days ago; brought up to date and saved
#     again when contrib/run.sh has changed since), else made with
#     "debootstrap --variant=minbase trixie" from the Debian archive this
#     machine's apt is configured with (read from
#     /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list),
#     its packages installed with "contrib/run.sh deps", and saved as the
#     cache tarball.
#  2. /proc, /sys, /dev, /dev/pts and /dev/shm are bind-mounted into it;
#     the guest tests' download cache is a host directory bind-mounted
#     as well, so that the Debian 13 kernel is fetched only once.
#  3. The source tree, as git sees it (tracked and untracked files that
#     are not ignored: no build products), is copied to /src in the root.
#  4. "contrib/run.sh check" (make check and make check-guest; any
#     run.sh command may be given) runs there as root.
# Everything is unmounted and the root removed on every exit path.
#
# Environment:
#   SNAPFG_D13_CACHE    cache directory (default /var/cache/snapfg)
#   SNAPFG_D13_WORK     where the root is unpacked (default /var/tmp)
#   SNAPFG_D13_MAX_AGE  days before the cached root is made again (7)
#   SNAPFG_D13_REFRESH=1  make the root again now
#   SNAPFG_D13_KEEP=1   leave the root in place (unmounted) after the run
#   SNAPFG_D13_MIRROR   Debian archive URI (default: the machine's own)

set -euo pipefail

suite=trixie
cmd=${1:-check}
top=$(cd "$(dirname "$0")/.." && pwd)
cache=${SNAPFG_D13_CACHE:-/var/cache/snapfg}
work=${SNAPFG_D13_WORK:-/var/tmp}
max_age=${SNAPFG_D13_MAX_AGE:-7}
tarball=$cache/debian13-root.tar.zst
# the cached root's packages are those of this run.sh: when it changes,
# the root gets the new packages and is saved again
stampfile=$cache/debian13-root.stamp
stamp=$(sha256sum "$top/contrib/run.sh" | cut -c1-16)
guest_cache=$cache/guest-debian13
export PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

say() { echo "=== debian13.sh: $*"; }
die() { echo "debian13.sh: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run this as root (debootstrap, chroot and mounts need it)"
for c in debootstrap chroot mount umount tar git zstd; do
    command -v "$c" >/dev/null 2>&1 ||
        die "'$c' not found: install it (contrib/run.sh deps installs debootstrap and git)"
done

# debian_mirror: the URI of the first Debian (not security) archive in the
# machine's apt configuration.
debian_mirror() {
    local f=/etc/apt/sources.list.d/debian.sources uri=""
    if [ -r "$f" ]; then
        # deb822 stanzas: the URIs of the first stanza whose Suites are
        # not -security ones.
        uri=$(awk '
            /^[[:space:]]*$/ { if (u != "" && !sec) { print u; exit } u = ""; sec = 0; next }
            /^URIs:/ { u = $2 }
            /^Suites:/ { if ($0 ~ /-security/) sec = 1 }
            END { if (u != "" && !sec) print u }' "$f" | head -n 1)
    fi
    if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" && $0 !~ /security/ {
                     for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { print $i; exit } }' \
                  /etc/apt/sources.list | head -n 1)
    fi
    [ -n "$uri" ] || die "no Debian archive found in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list (set SNAPFG_D13_MIRROR)"
    echo "$uri"
}

root=""
mounted=()
cleanup() {
    local rc=$? i
    set +e
    # unmount in reverse order; lazily if something still holds a mount
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}"
    done
    mounted=()
    if [ -n "$root" ] && [ -d "$root" ]; then
        if grep -q " $root/" /proc/self/mounts; then
            echo "debian13.sh: mounts left under $root; not removing it" >&2
        elif [ "${SNAPFG_D13_KEEP:-0}" = 1 ]; then
            say "keeping $root"
        else
            rm -rf --one-file-system "$root"
        fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bind() {
    mkdir -p "$root$2"
    mount --bind "$1" "$root$2"
    mounted+=("$root$2")
}
mount_all() {
    bind /proc /proc
    bind /sys /sys
    bind /dev /dev
    bind /dev/pts /dev/pts
    [ -d /dev/shm ] && bind /dev/shm /dev/shm
    mkdir -p "$guest_cache"
    bind "$guest_cache" /root/.cache/snapfg-guest
}
umount_all() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount "${mounted[i]}" || umount -l "${mounted[i]}"
    done
    mounted=()
}
# A clean environment, but for SNAPFG_S3_REPO_TESTS (.ci/run sets it:
# which repository tests run again on S3; empty means all).
in_root() {
    chroot "$root" /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" \
        PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        SNAPFG_S3_REPO_TESTS="${SNAPFG_S3_REPO_TESTS:-}" "$@"
}

mkdir -p "$cache" "$work"
root=$(mktemp -d "$work/snapfg-debian13.XXXXXX")
t_all=$SECONDS
# Each step's time, as contrib/run.sh records its own (stage-times.txt),
# for .ci/run to print at its end; run.sh's lines from inside the root
# are added after these.
times=$top/debian13-stage-times.txt
rm -f "$times"
record_time() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$times"; }

# --- 1. the root -----------------------------------------------------------
t0=$SECONDS
fresh=0
if [ "${SNAPFG_D13_REFRESH:-0}" != 1 ] && [ -s "$tarball" ] &&
   [ -z "$(find "$tarball" -mtime +"$max_age" 2>/dev/null)" ]; then
    say "unpacking the cached root $tarball ($(du -h "$tarball" | cut -f1), $(date -r "$tarball" '+%F %R'))"
    tar -I 'zstd -d -T0' -xf "$tarball" -C "$root" --numeric-owner
    how="cached tarball unpacked"
    if [ "$(cat "$stampfile" 2>/dev/null)" != "$stamp" ]; then
        say "contrib/run.sh changed since the root was cached: updating its packages"
        fresh=1
    fi
else
    mirror=${SNAPFG_D13_MIRROR:-$(debian_mirror)}
    say "debootstrap --variant=minbase $suite from $mirror"
    debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$work/debootstrap-$$.log" 2>&1 || {
        tail -n 30 "$work/debootstrap-$$.log" >&2
        die "debootstrap failed (log above)"
    }
    rm -f "$work/debootstrap-$$.log"
    how=debootstrap
    fresh=1
fi
# mktemp made it 0700 (and the tarball's "." kept that): the root's / must
# be 0755, or no user but root can run anything in it (tests run as nobody)
chmod 0755 "$root"
grep -q '^VERSION_ID="13"' "$root/etc/os-release" ||
    die "the root is not Debian 13: $(grep PRETTY_NAME "$root/etc/os-release")"
# resolv.conf for apt inside the root
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
say "root ready in $((SECONDS - t0)) s"
record_time "root ($how)" $((SECONDS - t0)) ""

# --- 2./3. mounts and the source tree --------------------------------------
mount_all
t0=$SECONDS
mkdir -p "$root/src"
if git -C "$top" rev-parse --git-dir >/dev/null 2>&1; then
    # tracked and untracked files, not the ignored ones (build products);
    # files deleted from the work tree are left out
    (cd "$top" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf -) | tar -xf - -C "$root/src"
else
    die "$top is not a git work tree: copy a clean tree (no build products) by hand"
fi
say "copied the source tree to $root/src ($(du -sh "$root/src" | cut -f1)) in $((SECONDS - t0)) s"

if [ "$fresh" = 1 ]; then
    t0=$SECONDS
    say "installing the packages in the root (contrib/run.sh deps)"
    in_root bash -c 'cd /src && contrib/run.sh deps'
    in_root apt-get clean
    # save it without the mounts and the source tree
    umount_all
    say "saving the root as $tarball"
    # zstd: several times faster than gzip both ways, for about the same size
    tar -I 'zstd -3 -T0' -cf "$tarball.tmp" -C "$root" --numeric-owner --one-file-system \
        --exclude=./src --exclude=./root/.cache/snapfg-guest .
    mv "$tarball.tmp" "$tarball"
    echo "$stamp" >"$stampfile"
    mount_all
    say "packages installed and root cached in $((SECONDS - t0)) s"
    record_time "root's packages, cached" $((SECONDS - t0)) ""
fi

# --- 4. the tests ----------------------------------------------------------
say "versions: $(in_root dpkg-query -W -f='${Package} ${Version}, ' nbdkit libnbd0 qemu-system-x86 gcc busybox-static 2>/dev/null || true)"
t0=$SECONDS
st=0
in_root bash -c "cd /src && contrib/run.sh $cmd" || st=$?
say "contrib/run.sh $cmd in Debian 13: status $st, $((SECONDS - t0)) s (whole stage $((SECONDS - t_all)) s)"
[ ! -f "$root/src/stage-times.txt" ] || cat "$root/src/stage-times.txt" >>"$times"
[ ! -f "$root/src/skipped-parts.txt" ] || cp "$root/src/skipped-parts.txt" "$top/debian13-skipped-parts.txt"
[ ! -f "$root/src/test-times.txt" ] || cp "$root/src/test-times.txt" "$top/debian13-test-times.txt"
if [ "$st" -ne 0 ]; then
    for f in test-suite.log guest-suite.log failures.txt; do
        [ -f "$root/src/$f" ] && cp "$root/src/$f" "$top/debian13-$f"
    done
    say "the failing runs' logs are in $top/debian13-*.log"
fi
exit "$st"
