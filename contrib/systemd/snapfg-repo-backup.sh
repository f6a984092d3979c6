#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A backup host's nightly job into a snapfg repository: every disk of
# /etc/snapfg/repo-backup.conf backed up, then retention (prune) and
# gc.  Run by snapfg-repo-backup.service (snapfg-repo-backup.timer).
#
# /etc/snapfg/repo-backup.conf (shell syntax):
#
#   REPO=/backup/repo                # or s3://BUCKET/PREFIX
#   KEY_FILE=/etc/snapfg/repo.key    # empty for an unencrypted repository
#   HOST=backup@vmhost               # -H: the server's machine over ssh;
#                                    # empty on the server's own machine
#   # NAME CONTROL_SOCKET NBD_SOCKET, one disk a line
#   DISKS="vm1 /run/snapfg-vm1.ctl /run/snapfg-vm1.sock
#   vm2 /run/snapfg-vm2.ctl /run/snapfg-vm2.sock"
#   KEEP="--keep-last 3 --keep-daily 7 --keep-weekly 4 --keep-monthly 6"
#   # For S3: AWS_ENDPOINT_URL, AWS_REGION exported here, and
#   # S3_CREDENTIALS=/etc/snapfg/s3.cred (AWS shared-credentials format).
#
# A disk whose backup fails does not stop the others; the job's exit
# status is the first failure's (snapfg-backup's table: 3 asks for a
# --full run).

set -u
conf=${SNAPFG_REPO_BACKUP_CONF:-/etc/snapfg/repo-backup.conf}
# shellcheck source=/dev/null
. "$conf" || exit 2
: "${REPO:?REPO is not set in $conf}"
prog=${SNAPFG_BACKUP:-snapfg-backup}
common=()
[ -z "${S3_CREDENTIALS:-}" ] || common+=(--s3-credentials "$S3_CREDENTIALS")
keyopt=()
[ -z "${KEY_FILE:-}" ] || keyopt=(--key-file "$KEY_FILE")
hostopt=()
[ -z "${HOST:-}" ] || hostopt=(-H "$HOST")

status=0
while read -r name ctl sock; do
    [ -n "$name" ] || continue
    st=0
    "$prog" "${hostopt[@]}" -S "$ctl" -u "nbd+unix:///?socket=$sock" \
        --progress=always backup "$REPO" --disk "$name" --compress \
        "${keyopt[@]}" "${common[@]}" || st=$?
    if [ "$st" -ne 0 ]; then
        echo "snapfg-repo-backup: disk $name: exit status $st" >&2
        [ "$status" -ne 0 ] || status=$st
    fi
done <<<"${DISKS:-}"

# Retention, then the chunks no run references any more.
st=0
# shellcheck disable=SC2086
"$prog" prune "$REPO" ${KEEP:---keep-last 7} "${common[@]}" || st=$?
[ "$status" -ne 0 ] || status=$st
st=0
"$prog" gc "$REPO" "${common[@]}" || st=$?
[ "$status" -ne 0 ] || status=$st
exit "$status"
