# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Helpers for the repository tests (test-repo-*.sh), on top of
# backup-functions.sh:
#
#   source "$(dirname "$0")/repo-functions.sh"
#
# The repositories live under $SNAPFG_TEST_REPO_BASE when it is set (a
# directory, or s3://BUCKET/PREFIX with the AWS_* variables set, so that
# the same tests run against an object store), else under $tmpdir:
#
#   repo_loc NAME             the location of repository NAME
#   repo_server TAG SIZE [PREPARE]
#                             a random origin served with a state file
#                             and a control socket; sets ctl_TAG,
#                             origin_TAG, disk_TAG (and size)
#   rb ARGS...                snapfg-backup ARGS (timeout 600 s); output
#                             in $tmpdir/rb.log; returns its exit status
#   rb_run REPO DISK TAG N [ARGS]
#                             save origin TAG as expect-DISK-N, then back
#                             it up as disk DISK; fails the test if the
#                             run fails
#   rb_restores REPO DISK N [ARGS]
#                             restore run N and cmp with expect-DISK-N
#   rb_expect STATUS WHAT PATTERN ST
#                             ST is STATUS and rb.log holds PATTERN
#   repo_json REPO EXPR ARGS  a value of list --json (Python EXPR on j)
#   repo_snapshots CTL        the server's snapfg-repo- snapshots

# shellcheck shell=bash
_rfn_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=backup-functions.sh
source "$_rfn_dir/backup-functions.sh"

REPO_BASE=${SNAPFG_TEST_REPO_BASE:-$tmpdir/repos}
case "$REPO_BASE" in
    s3://*) REPO_BASE="$REPO_BASE/$test_name-$$" ;;
    *) mkdir -p "$REPO_BASE" ;;
esac
repo_is_dir() { case "$REPO_BASE" in s3://*) return 1 ;; esac; }
repo_loc() { echo "$REPO_BASE/$1"; }

repo_server() {
    local tag=$1 sz=$2 d="$tmpdir/disk-$1.img"
    size=$sz
    make_random_image "$d" "$sz"
    [ -z "${3:-}" ] || "$3" "$d"
    start_snapfg "$tmpdir/sock-$tag" "$tmpdir/nbdkit-$tag.pid" origin="$d" \
        state="$tmpdir/state-$tag" control="$tmpdir/ctl-$tag"
    require_checkpoints "$tmpdir/ctl-$tag"
    printf -v "ctl_$tag" '%s' "$tmpdir/ctl-$tag"
    printf -v "origin_$tag" '%s' "$(uri "$tmpdir/sock-$tag")"
    printf -v "disk_$tag" '%s' "$d"
}

rb() {
    local st=0
    timeout 600 "$SNAPFG_BACKUP" "$@" >"$tmpdir/rb.log" 2>&1 || st=$?
    [ "$st" -ne 124 ] || echo "snapfg-backup $* timed out (600 s)" >>"$tmpdir/rb.log"
    return "$st"
}

rb_run() {
    local repo=$1 disk=$2 tag=$3 n=$4 c o
    shift 4
    c="ctl_$tag"; o="origin_$tag"
    save_origin "${!o}" "$tmpdir/expect-$disk-$n.img"
    rb -S "${!c}" -u "${!o}" --json backup "$repo" --disk "$disk" "$@" ||
        { cat "$tmpdir/rb.log" >&2; fail "backup of $disk run $n ($*) failed"; }
    cp "$tmpdir/rb.log" "$tmpdir/run-$disk-$n.json"
    info "$disk run $n: $(tail -n 1 "$tmpdir/rb.log")"
}

# A field of a run's --json result (rb_run keeps them).
run_field() {
    "$PY" -c 'import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(j[sys.argv[2]])' "$tmpdir/run-$1-$2.json" "$3"
}

rb_restores() {
    local repo=$1 disk=$2 n=$3 out="$tmpdir/r-$RANDOM.img"
    shift 3
    if rb restore "$repo" "$out" --disk "$disk" --at "$n" "$@" &&
       cmp "$out" "$tmpdir/expect-$disk-$n.img"; then
        info "ok: $disk run $n restores exactly"
    else
        check_fail "restore of $disk run $n: $(cat "$tmpdir/rb.log")"
    fi
    rm -f "$out"
}

rb_expect() {
    local want=$1 what=$2 pat=$3 st=$4
    if [ "$st" -eq "$want" ] && grep -q -- "$pat" "$tmpdir/rb.log"; then
        info "ok: $what"
    else
        check_fail "$what: exit $st (expected $want, '$pat'): $(cat "$tmpdir/rb.log")"
    fi
}

repo_json() {
    local repo=$1 expr=$2
    shift 2
    "$SNAPFG_BACKUP" --json list "$repo" "$@" 2>/dev/null |
        "$PY" -c 'import json, sys
j = json.load(sys.stdin)
print(eval(sys.argv[1]))' "$expr"
}

# The server's snapshots and checkpoints of repository runs, one a line
# (written at once: tests pipe them into grep -q; backup-functions.sh).
repo_snapshots() { _names_with_prefix snapfg-repo- "$1" snapshots list; }
repo_checkpoints() { _names_with_prefix snapfg-repo- "$1" checkpoints checkpoint list; }

# The chunk objects of a directory repository, one path a line.
repo_chunk_files() { find "$1/chunks" -type f ! -name '.tmp.*' | sort; }
