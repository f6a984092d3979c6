#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup over TCP with TLS (pre-shared key, psktool): a full and
# an incremental backup through an nbds:// URI with tls-psk-file=, each
# restored byte for byte; a plain nbd:// URI to the same TLS-only server
# fails cleanly (exit 1, nothing recorded, no snapshot left).

set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
require_backup_tools
requires psktool

size=$((16 * 1024 * 1024))
disk="$tmpdir/disk.img"
ctl="$tmpdir/ctl"
pidf="$tmpdir/nbdkit.pid"
dir="$tmpdir/backups"
psk="$tmpdir/keys.psk"
make_random_image "$disk" "$size"
psktool -u backup -p "$psk" >/dev/null

# nbdkit on a free TCP port of the loopback address, TLS required.
port=
for _ in $(seq 20); do
    p=$((20000 + RANDOM % 20000))
    rm -f "$pidf"
    nbdkit -f --exit-with-parent -i 127.0.0.1 -p "$p" --tls=require \
        --tls-psk="$psk" -P "$pidf" "$SNAPFG_PLUGIN" origin="$disk" \
        state="$tmpdir/disk.state" control="$ctl" 2>"$pidf.log" &
    pid=$!
    for _ in $(seq 100); do
        [ -s "$pidf" ] && [ -S "$ctl" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null && [ -s "$pidf" ]; then
        port=$p
        _nbdkit_pids[$pidf]=$pid
        _nbdkit_logs[$pidf]=$pidf.log
        break
    fi
    wait "$pid" 2>/dev/null || true
done
[ -n "$port" ] || { cat "$pidf.log" >&2; fail "nbdkit did not start on a TCP port"; }
require_checkpoints "$ctl"
tls_uri="nbds://backup@127.0.0.1:$port/?tls-psk-file=$psk"
info "server on $tls_uri"

# write_some N SEED through TLS.
write_some() { write_random_blocks "$tls_uri" "$1" "$2" "$size"; }
save() {
    "$PY" - "$tls_uri" "$1" <<'EOF'
import nbd, sys
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.connect_uri(sys.argv[1])
with open(sys.argv[2], "wb") as f:
    size = h.get_size()
    for off in range(0, size, 1 << 20):
        f.write(h.pread(min(1 << 20, size - off), off))
h.shutdown()
EOF
}

for n in 1 2; do
    [ "$n" -eq 1 ] || write_some 100 "$n"
    save "$tmpdir/expect-$n.img"
    if ! bk -S "$ctl" -u "$tls_uri" backup "$dir"; then
        cat "$tmpdir/bk.log" >&2
        fail "backup run $n over TLS failed"
    fi
    restore_equals "$dir" "$n" "$tmpdir/expect-$n.img" "run $n over TLS"
done
[ "$(manifest_field "$dir" 2 type)" = incremental ] || check_fail "run 2 over TLS was not incremental"

st=0; bk -S "$ctl" -u "nbd://127.0.0.1:$port/" backup "$dir" || st=$?
[ "$st" -eq 1 ] || { cat "$tmpdir/bk.log" >&2; check_fail "plain NBD to a TLS-only server: exit $st, expected 1"; }
[ -z "$(manifest_field "$dir" 3 seq)" ] || check_fail "the refused plain-NBD run was recorded"
[ -z "$(our_snapshots "$ctl")" ] || check_fail "the refused plain-NBD run left a snapshot"
ls "$dir" | grep -q partial && check_fail "the refused run left $(ls "$dir")"

stop_nbdkit "$pidf"
finish
