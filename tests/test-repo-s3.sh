#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The repository's S3 back end alone, against a real S3 implementation
# (Ceph's RADOS Gateway, started here): every operation with its data
# checked byte for byte, put-if-absent raced by threads, listings of more
# than 1000 keys, what another S3 client sees of the stored objects, and
# the messages for wrong keys, a missing bucket, a wrong endpoint and a
# credentials file others may read.  First, without the gateway, the
# faults a real one does not make on demand (tests/s3-fault-server.py).
# tests/test-repo-s3-commands.sh runs it on its own gateway (make check
# runs it that way: one gateway started, not two); by hand it starts one.
set -u
source "$(dirname "$0")/functions.sh"
source "$top_srcdir/tests/s3-functions.sh"

: "${REPO_S3_CHECK:=${top_builddir:-.}/tests/repo-s3-check}"
[ -x "$REPO_S3_CHECK" ] ||
    fail "driver repo-s3-check not found ($REPO_S3_CHECK): run 'make tests/repo-s3-check'"

# --- what a real gateway does not do on demand ------------------------
# tests/s3-fault-server.py: 503s that pass, 500s that do not, and a put
# stored but never answered.
fault_server() {  # fault_server MODE: start it, set $fault_url
    rm -f "$tmpdir/fault-port"
    /usr/bin/python3 "$top_srcdir/tests/s3-fault-server.py" "$tmpdir/fault-port" "$1" \
        2>>"$tmpdir/fault-server.log" &
    fault_pid=$!
    on_exit "kill $fault_pid 2>/dev/null"
    for _ in $(seq 100); do [ -s "$tmpdir/fault-port" ] && break; sleep 0.1; done
    [ -s "$tmpdir/fault-port" ] || fail "s3-fault-server.py did not start"
    fault_url=http://127.0.0.1:$(cat "$tmpdir/fault-port")
}
# No gateway needed, and no signature checked: any keys do.  They are
# given to each command only: a parent's gateway keys stay in place.
fault_check() {  # fault_check ARGS...: repo-s3-check against $fault_url
    AWS_ACCESS_KEY_ID=fault-test AWS_SECRET_ACCESS_KEY=fault-test \
        S3_ENDPOINT_OPTION=$fault_url "$REPO_S3_CHECK" "$@"
}
fault_server flaky
fault_check flaky s3://fault-bucket/p || check_fail "503 SlowDown is not retried"
kill "$fault_pid"
fault_server lost-reply
fault_check lost-reply s3://fault-bucket/p ||
    check_fail "a put if_absent whose reply was lost"
kill "$fault_pid"
fault_server broken
fault_check open-fails s3://fault-bucket/p \
    EIO "500" "InternalError" "injected" "s3://fault-bucket/" ||
    check_fail "a gateway that fails every request"
n=$(grep -c '"GET /fault-bucket?' "$tmpdir/fault-server.log" || true)
[ "$n" -ge 6 ] || check_fail "500 was tried $n times, not 6 (the retries)"
kill "$fault_pid"

s3_gateway_start
bucket=snapfg-backend-test
s3_make_bucket "$bucket"

# put-if-absent rests on the gateway honouring "If-None-Match: *" on PUT:
# see it do so with another client first, so that a gateway that ignores
# it is named as the cause.
printf one >"$tmpdir/one"
printf two >"$tmpdir/two"
s3_curl -f -T "$tmpdir/one" "$AWS_ENDPOINT_URL/$bucket/inm" ||
    fail "plain PUT with curl failed"
code=$(s3_curl -o /dev/null -w '%{http_code}' -H 'If-None-Match: *' \
    -T "$tmpdir/two" "$AWS_ENDPOINT_URL/$bucket/inm")
[ "$code" = 412 ] ||
    fail "the gateway answered $code, not 412, to a PUT with If-None-Match: * over an existing object"
[ "$(s3_curl -f "$AWS_ENDPOINT_URL/$bucket/inm")" = one ] ||
    fail "a refused conditional PUT changed the object"
s3_curl -f -X DELETE "$AWS_ENDPOINT_URL/$bucket/inm" || fail "DELETE failed"
info "the gateway honours If-None-Match: * on PUT (412 over an existing object)"

# Every operation, under a prefix and at the top of the bucket.
"$REPO_S3_CHECK" ops "s3://$bucket/site-a/repo" || fail "operations under a prefix"
"$REPO_S3_CHECK" ops "s3://$bucket" || fail "operations at the top of the bucket"

# What the back end stores is what another client reads, at the key
# s3://BUCKET/PREFIX/KEY, with a trailing '/' in the URL ignored.
"$REPO_S3_CHECK" put-get "s3://$bucket/p1/" "config" "hello, s3" ||
    fail "put-get"
[ "$(s3_curl -f "$AWS_ENDPOINT_URL/$bucket/p1/config")" = "hello, s3" ] ||
    check_fail "curl does not read back what the back end stored at p1/config"

# --- the keys from a credentials file -----------------------------------
creds=$tmpdir/credentials
printf '[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n[ceph]\naws_access_key_id = %s\naws_secret_access_key = %s\n' \
    "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >"$creds"
chmod 600 "$creds"
( unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
  export AWS_PROFILE=ceph S3_CREDENTIALS_OPTION=$creds
  "$REPO_S3_CHECK" put-get "s3://$bucket/p2" "k" "from the file" ) ||
    check_fail "keys from --s3-credentials, profile ceph"
# --s3-credentials wins over the environment: its [default] keys are wrong.
S3_CREDENTIALS_OPTION=$creds "$REPO_S3_CHECK" open-fails "s3://$bucket/p2" \
    EACCES "403" "InvalidAccessKeyId" "s3://$bucket/" "check the access key" ||
    check_fail "a wrong key in the credentials file"
chmod 644 "$creds"
( export AWS_PROFILE=ceph S3_CREDENTIALS_OPTION=$creds
  "$REPO_S3_CHECK" open-fails "s3://$bucket/p2" EACCES "$creds" "chmod 600" ) ||
    check_fail "a world-readable credentials file is not refused"

# --- wrong settings, each named ----------------------------------------
AWS_SECRET_ACCESS_KEY=wrong-secret "$REPO_S3_CHECK" open-fails \
    "s3://$bucket/p3" EACCES "403" "SignatureDoesNotMatch" "$bucket" \
    "$AWS_ENDPOINT_URL" ||
    check_fail "a wrong secret"
AWS_ACCESS_KEY_ID=NOSUCHKEY "$REPO_S3_CHECK" open-fails \
    "s3://$bucket/p3" EACCES "403" "InvalidAccessKeyId" ||
    check_fail "an unknown access key"
"$REPO_S3_CHECK" open-fails "s3://no-such-bucket-here/p" ENXIO \
    "s3://no-such-bucket-here/" "404" "NoSuchBucket" "create the bucket" ||
    check_fail "a missing bucket"
"$REPO_S3_CHECK" open-fails "s3://Bad_Bucket/p" EINVAL "Bad_Bucket" \
    "bucket name" || check_fail "an invalid bucket name"
"$REPO_S3_CHECK" open-fails "s3://$bucket/a/../b" EINVAL "prefix" ||
    check_fail "an invalid prefix"
( unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
  export HOME=$tmpdir
  "$REPO_S3_CHECK" open-fails "s3://$bucket/p" ENOKEY "--s3-credentials" \
    "AWS_ACCESS_KEY_ID" ) || check_fail "no credentials at all"
# Nothing listens on a port just found free: refused, after the retries.
port=$(_s3_free_port) || fail "no free port"
t0=$SECONDS
S3_ENDPOINT_OPTION=http://127.0.0.1:$port "$REPO_S3_CHECK" open-fails \
    "s3://$bucket/p" ECONNREFUSED "http://127.0.0.1:$port" "no reply" \
    "attempts" || check_fail "a wrong endpoint"
info "a wrong endpoint failed after $((SECONDS - t0)) s of retries"
S3_ENDPOINT_OPTION=ftp://127.0.0.1 "$REPO_S3_CHECK" open-fails \
    "s3://$bucket/p" EINVAL "ftp://127.0.0.1" "http://" ||
    check_fail "an endpoint that is not http(s)"

finish
