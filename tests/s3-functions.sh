# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A real S3 endpoint for the tests: a throwaway single-node Ceph cluster
# (one monitor, one OSD, no manager) with a RADOS Gateway, listening on
# 127.0.0.1 only, everything (configuration, keys, data, logs, sockets)
# in one temporary directory.  Source it after functions.sh:
#
#   source "$top_srcdir/tests/functions.sh"
#   source "$top_srcdir/tests/s3-functions.sh"
#   s3_gateway_start             # skips (77) without Debian's Ceph packages
#   s3_make_bucket NAME          # a new, empty bucket
#   ... AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
#       AWS_REGION are exported ...
#
# The gateway is stopped when the test exits (and by a watchdog if the
# test is killed).  A script that runs several S3 tests can start one
# gateway and hand it to them: s3_gateway_start exports S3_GATEWAY_DIR,
# and a child that finds it set (with the AWS variables) uses that
# gateway instead of starting its own.
#
# Needs: ceph-mon ceph-osd radosgw ceph-common (Debian 12 and 13 use the
# same names; contrib/run.sh installs them), curl, python3.
# Start-up takes about 10 s on a 2-CPU machine.  What it does, and why:
#  - no msgr1 and only 127.0.0.1 addresses: one mon port, nothing outside;
#  - the OSD's id and cephx key are made with "osd new" before its mkfs,
#    since mkfs already authenticates to the mon; the OSD then reads its
#    own keyring ([osd] keyring = $osd_data/keyring), not the admin one;
#  - paxos propose interval 0.1 s: radosgw makes its pools one by one, and
#    the default 1 s batching made its start take 8 s;
#  - curl 7.88 signs the body's hash but does not send it: every signed
#    curl request carries x-amz-content-sha256 (the back end sends it too);
#  - radosgw may take 5-10 s to stop on SIGTERM (its lifecycle thread
#    sleeps), so daemons are stopped one by one, rgw first, with SIGKILL
#    after a short grace: all their data is thrown away anyway;
#  - unix socket paths must stay under 108 bytes: the directory is short.

# shellcheck shell=bash

S3_GATEWAY_TIMEOUT=${S3_GATEWAY_TIMEOUT:-120}

_s3_free_port() {
    /usr/bin/python3 - "$@" <<'EOF'
import random, socket, sys
avoid = {int(a) for a in sys.argv[1:]}
for _ in range(500):
    port = random.randrange(20000, 32000)  # below the ephemeral range
    if port in avoid:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    sys.exit(0)
sys.exit("no free port on 127.0.0.1")
EOF
}

_s3_random() {  # _s3_random LENGTH ALPHABET
    /usr/bin/python3 -c 'import secrets, sys
print("".join(secrets.choice(sys.argv[2]) for _ in range(int(sys.argv[1]))))' "$1" "$2"
}

# ceph CLI calls against our cluster, bounded in time.
_s3_ceph() {
    timeout 60 ceph -c "$S3_GATEWAY_DIR/ceph.conf" --connect-timeout 30 "$@"
}

_s3_daemon_pid() {  # _s3_daemon_pid NAME: its pid if it runs and is ours
    local f="$S3_GATEWAY_DIR/run/$1.pid" pid
    [ -s "$f" ] || return 1
    pid=$(cat "$f")
    _proc_alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null |
        grep -qF " $S3_GATEWAY_DIR/ceph.conf " || return 1
    echo "$pid"
}

_s3_spawn() {  # _s3_spawn NAME CMD...: in its own session, output to log/
    local name=$1
    shift
    setsid "$@" </dev/null >>"$S3_GATEWAY_DIR/log/$name.out" 2>&1 &
    echo $! >"$S3_GATEWAY_DIR/run/$name.pid"
}

# _s3_wait WHAT DAEMON CMD...: poll CMD until it succeeds, failing if
# DAEMON dies or the time runs out.
_s3_wait() {
    local what=$1 daemon=$2 t0=$SECONDS
    shift 2
    until "$@" >/dev/null 2>&1; do
        _s3_daemon_pid "$daemon" >/dev/null ||
            _s3_start_failed "$daemon exited while waiting for $what"
        [ $((SECONDS - t0)) -lt "$S3_GATEWAY_TIMEOUT" ] ||
            _s3_start_failed "no $what after ${S3_GATEWAY_TIMEOUT}s"
        sleep 0.2
    done
}

_s3_osd_up() {
    _s3_ceph osd stat -f json | /usr/bin/python3 -c 'import json, sys
j = json.load(sys.stdin)
j = j.get("osdmap", j)
sys.exit(0 if j.get("num_up_osds") == 1 and j.get("num_in_osds") == 1 else 1)'
}

_s3_rgw_answers() {
    [ "$(curl -s -o /dev/null -m 5 -w '%{http_code}' "$AWS_ENDPOINT_URL/")" = 200 ]
}

# s3_curl ARGS...: a signed S3 request with curl (path-style URLs).
s3_curl() {
    curl -sS -m 120 --aws-sigv4 "aws:amz:$AWS_REGION:s3" \
        --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
        -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "$@"
}

# s3_make_bucket NAME: create it (3-63 characters of a-z 0-9 . -).
s3_make_bucket() {
    local code
    code=$(s3_curl -o "$tmpdir/s3-make-bucket.out" -w '%{http_code}' \
        -X PUT "$AWS_ENDPOINT_URL/$1") || fail "creating bucket $1: curl failed"
    [ "$code" = 200 ] ||
        fail "creating bucket $1: HTTP $code: $(cat "$tmpdir/s3-make-bucket.out")"
}

# The OSD's object classes (rgw needs cls_version and others): Debian
# 13's Ceph 18 builds in a relative default (lib/<triplet>/rados-classes,
# so "could not stat class" and radosgw's "Couldn't init storage
# provider" unless the daemon's directory is /), so the path is made
# absolute here.
_s3_class_dir() {
    local d
    d=$(ceph-osd --show-config-value osd_class_dir 2>/dev/null) || d=
    case $d in
        /*) echo "$d" ;;
        ?*) echo "/usr/$d" ;;
        *) echo "/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)/rados-classes" ;;
    esac
}

_s3_write_conf() {
    cat >"$S3_GATEWAY_DIR/ceph.conf" <<EOF
# A throwaway test cluster made by snapfg's tests/s3-functions.sh.
[global]
fsid = $1
mon host = [v2:127.0.0.1:$2]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
public network = 127.0.0.0/8
ms bind msgr1 = false
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
keyring = $S3_GATEWAY_DIR/keyring
run dir = $S3_GATEWAY_DIR/run
crash dir = $S3_GATEWAY_DIR/crash
log file = $S3_GATEWAY_DIR/log/\$name.log
log to stderr = false
mon cluster log file = $S3_GATEWAY_DIR/log/cluster.log
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon max pg per osd = 1000
mon data avail warn = 2
mon data avail crit = 1
paxos propose interval = 0.1

[mon]
mon data = $S3_GATEWAY_DIR/mon/\$cluster-\$id
admin socket = $S3_GATEWAY_DIR/run/\$name.asok

[osd]
osd data = $S3_GATEWAY_DIR/osd/\$cluster-\$id
keyring = \$osd_data/keyring
admin socket = $S3_GATEWAY_DIR/run/\$name.asok
osd objectstore = $S3_GATEWAY_STORE
osd class dir = $(_s3_class_dir)
osd memory target = 1G
bluestore block create = true
bluestore block size = 8G
bluestore fsck on mkfs = false
bluestore fsck on mount = false
memstore device bytes = 4G

[client]
admin socket =
log file = $S3_GATEWAY_DIR/log/\$name.log

[client.rgw.gw]
admin socket = $S3_GATEWAY_DIR/run/\$name.asok
rgw data = $S3_GATEWAY_DIR/rgw
rgw frontends = beast endpoint=127.0.0.1:$3
rgw thread pool size = 64
rgw enable usage log = false
EOF
}

_s3_start_failed() {
    local f
    echo "$test_name: the S3 gateway did not start: $*" >&2
    for f in "$S3_GATEWAY_DIR"/log/*; do
        [ -s "$f" ] || continue
        echo "--- last lines of $f ---" >&2
        tail -n 15 "$f" >&2
    done
    s3_gateway_stop
    # The packages are installed, so not starting is a failure, not a
    # reason to skip: CI must run these tests.
    fail "the S3 gateway (Ceph radosgw) did not start: $*"
}

# s3_gateway_start: start the gateway (or use the one a parent started)
# and export AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
# AWS_REGION, S3_GATEWAY_DIR.  Skips the test without the packages.
s3_gateway_start() {
    local b missing=() t0=$SECONDS fsid mon_port rgw_port uuid key id kr
    if [ -n "${S3_GATEWAY_DIR:-}" ] && [ -n "${AWS_ENDPOINT_URL:-}" ] &&
        [ -f "$S3_GATEWAY_DIR/ceph.conf" ]; then
        info "using the S3 gateway at $AWS_ENDPOINT_URL ($S3_GATEWAY_DIR)"
        return 0
    fi
    for b in ceph ceph-mon ceph-osd ceph-authtool monmaptool radosgw \
        radosgw-admin curl; do
        command -v "$b" >/dev/null 2>&1 || missing+=("$b")
    done
    [ ${#missing[@]} -eq 0 ] ||
        skip "no S3 gateway: ${missing[*]} not installed (apt-get install ceph-mon ceph-osd radosgw ceph-common curl, or contrib/run.sh deps)"

    # Short: the daemons' unix sockets live under it.
    S3_GATEWAY_DIR=$(mktemp -d /tmp/snapfg-s3.XXXXXX)
    export S3_GATEWAY_DIR
    on_exit s3_gateway_stop
    mkdir -p "$S3_GATEWAY_DIR"/{mon,osd/ceph-0,log,run,crash,rgw}
    # The OSD keeps its objects in memory (memstore): the tests exercise
    # the gateway's S3 (radosgw is the same either way), not the OSD's
    # disk format, and bluestore cost a test 45 % more CPU (44 s against
    # 30 s for test-repo-s3, which CI runs on two releases at once).
    # S3_GATEWAY_STORE=bluestore puts them in an 8G file instead; its
    # O_DIRECT needs a /tmp that allows it (tmpfs before Linux 6.6 does
    # not: memstore then).
    S3_GATEWAY_STORE=${S3_GATEWAY_STORE:-memstore}
    if [ "$S3_GATEWAY_STORE" = bluestore ] &&
        ! dd if=/dev/zero of="$S3_GATEWAY_DIR/odirect-probe" bs=4096 count=1 \
            oflag=direct 2>/dev/null; then
        S3_GATEWAY_STORE=memstore
    fi
    rm -f "$S3_GATEWAY_DIR/odirect-probe"

    fsid=$(cat /proc/sys/kernel/random/uuid)
    mon_port=$(_s3_free_port) || fail "no free port for the Ceph monitor"
    rgw_port=$(_s3_free_port "$mon_port") || fail "no free port for radosgw"
    _s3_write_conf "$fsid" "$mon_port" "$rgw_port"

    # One keyring with the monitor's, the admin's and the gateway's keys;
    # the monitor imports them, with their capabilities, at mkfs.
    kr=$S3_GATEWAY_DIR/keyring
    ceph-authtool --create-keyring --gen-key -n mon. --cap mon 'allow *' \
        "$kr" >/dev/null &&
    ceph-authtool --gen-key -n client.admin --cap mon 'allow *' \
        --cap osd 'allow *' --cap mgr 'allow *' "$kr" >/dev/null &&
    ceph-authtool --gen-key -n client.rgw.gw --cap mon 'allow rw' \
        --cap osd 'allow rwx' "$kr" >/dev/null ||
        _s3_start_failed "ceph-authtool"
    chmod 600 "$kr"

    monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" \
        "$S3_GATEWAY_DIR/monmap" >/dev/null || _s3_start_failed "monmaptool"
    ceph-mon -c "$S3_GATEWAY_DIR/ceph.conf" -i a --mkfs \
        --monmap "$S3_GATEWAY_DIR/monmap" --keyring "$kr" \
        >>"$S3_GATEWAY_DIR/log/mkfs.out" 2>&1 || _s3_start_failed "ceph-mon --mkfs"
    _s3_spawn mon ceph-mon -c "$S3_GATEWAY_DIR/ceph.conf" -i a -f
    _s3_watchdog
    _s3_wait "monitor quorum" mon _s3_ceph mon stat

    uuid=$(cat /proc/sys/kernel/random/uuid)
    key=$(ceph-authtool --gen-print-key)
    printf '{"cephx_secret": "%s"}\n' "$key" >"$S3_GATEWAY_DIR/osd/new.json"
    id=$(_s3_ceph osd new "$uuid" -i "$S3_GATEWAY_DIR/osd/new.json" \
        2>>"$S3_GATEWAY_DIR/log/mkfs.out") || _s3_start_failed "ceph osd new"
    rm -f "$S3_GATEWAY_DIR/osd/new.json"
    [ "$id" = 0 ] || _s3_start_failed "ceph osd new gave id '$id', not 0"
    printf '[osd.0]\n\tkey = %s\n' "$key" >"$S3_GATEWAY_DIR/osd/ceph-0/keyring"
    ceph-osd -c "$S3_GATEWAY_DIR/ceph.conf" -i 0 --mkfs --key "$key" \
        --osd-uuid "$uuid" >>"$S3_GATEWAY_DIR/log/mkfs.out" 2>&1 ||
        _s3_start_failed "ceph-osd --mkfs"
    _s3_spawn osd ceph-osd -c "$S3_GATEWAY_DIR/ceph.conf" -i 0 -f
    _s3_wait "OSD up and in" osd _s3_osd_up

    export AWS_ENDPOINT_URL="http://127.0.0.1:$rgw_port"
    export AWS_REGION=us-east-1
    _s3_spawn rgw radosgw -c "$S3_GATEWAY_DIR/ceph.conf" -n client.rgw.gw -f
    _s3_wait "answer from radosgw" rgw _s3_rgw_answers

    AWS_ACCESS_KEY_ID=$(_s3_random 20 ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789)
    AWS_SECRET_ACCESS_KEY=$(_s3_random 40 ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789)
    export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    unset AWS_DEFAULT_REGION AWS_PROFILE AWS_SESSION_TOKEN AWS_ENDPOINT_URL_S3
    timeout 120 radosgw-admin -c "$S3_GATEWAY_DIR/ceph.conf" user create \
        --uid=snapfg-test --display-name=snapfg-test \
        --access-key="$AWS_ACCESS_KEY_ID" --secret-key="$AWS_SECRET_ACCESS_KEY" \
        >"$S3_GATEWAY_DIR/user.json" 2>>"$S3_GATEWAY_DIR/log/radosgw-admin.out" ||
        _s3_start_failed "radosgw-admin user create"
    grep -qF "\"$AWS_ACCESS_KEY_ID\"" "$S3_GATEWAY_DIR/user.json" ||
        _s3_start_failed "the S3 user did not get the access key asked for"

    # radosgw makes its bucket pools on the first bucket and object: do
    # that now, so that a test's first request is not the slow one.
    s3_make_bucket "warmup-$rgw_port"
    printf x >"$S3_GATEWAY_DIR/run/warmup"
    s3_curl -f -T "$S3_GATEWAY_DIR/run/warmup" "$AWS_ENDPOINT_URL/warmup-$rgw_port/x" ||
        _s3_start_failed "the first PUT failed"
    s3_curl -f -X DELETE "$AWS_ENDPOINT_URL/warmup-$rgw_port/x" &&
    s3_curl -f -X DELETE "$AWS_ENDPOINT_URL/warmup-$rgw_port" ||
        _s3_start_failed "the first DELETE failed"
    S3_GATEWAY_STARTUP=$((SECONDS - t0))
    info "S3 gateway ($S3_GATEWAY_STORE) ready at $AWS_ENDPOINT_URL after ${S3_GATEWAY_STARTUP} s"
}

# If the test is killed (SIGKILL: no EXIT trap), stop the daemons anyway.
_s3_watchdog() {
    local test_pid=$$
    (
        # In its own session, holding none of the test's output open.
        while kill -0 "$test_pid" 2>/dev/null; do sleep 2; done
        [ -f "$S3_GATEWAY_DIR/ceph.conf" ] && s3_gateway_stop
    ) </dev/null >/dev/null 2>&1 &
    disown 2>/dev/null || true
}

# s3_gateway_stop: stop our daemons (by their recorded pids only: rgw,
# then the OSD, then the monitor) and remove the directory.
s3_gateway_stop() {
    local n pid t grace
    [ -n "${S3_GATEWAY_DIR:-}" ] && [ -d "$S3_GATEWAY_DIR" ] || return 0
    for n in rgw osd mon; do
        if pid=$(_s3_daemon_pid $n); then
            grace=50
            [ $n = rgw ] && grace=20
            kill -TERM "$pid" 2>/dev/null
            for ((t = 0; t < grace; t++)); do
                _proc_alive "$pid" || break
                sleep 0.1
            done
            if _proc_alive "$pid"; then
                kill -KILL "$pid" 2>/dev/null
                for ((t = 0; t < 50; t++)); do
                    _proc_alive "$pid" || break
                    sleep 0.1
                done
            fi
        fi
        rm -f "$S3_GATEWAY_DIR/run/$n.pid"
    done
    case $S3_GATEWAY_DIR in
        /tmp/snapfg-s3.*) rm -rf "$S3_GATEWAY_DIR" ;;
    esac
}
