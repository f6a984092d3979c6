#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The S3 back end alone (tests/test-repo-s3.sh), then the repository
# tests again with their repositories in a bucket, all against one real
# S3 gateway (Ceph's RADOS Gateway, started once here for all of them:
# a start and stop costs 5-10 CPU-seconds, and CI runs this on two
# releases at once).  Each repository test runs as it does on a
# directory (SNAPFG_TEST_REPO_BASE=s3://BUCKET/PREFIX; tests/repo-functions.sh
# gives each its own prefix); the parts that edit a directory
# repository's files by hand skip themselves.  Which repository tests:
# SNAPFG_S3_REPO_TESTS="test-repo-backup ..." (names separated by spaces
# or commas; default: all that apply).
set -u
source "$(dirname "$0")/functions.sh"
source "$top_srcdir/tests/s3-functions.sh"

tests=${SNAPFG_S3_REPO_TESTS:-test-repo-backup test-repo-dedup test-repo-crash test-repo-encrypt test-repo-prune}
tests=${tests//,/ }

s3_gateway_start

# The back end first (in a bucket of its own): if it is broken, that is
# named before the repository tests fail on it.
info "=== test-repo-s3 (the back end alone) ==="
st=0
"$top_srcdir/tests/test-repo-s3.sh" || st=$?
[ "$st" -eq 0 ] || check_fail "test-repo-s3 failed on the shared gateway (exit status $st)"

bucket=snapfg-repo-tests
s3_make_bucket "$bucket"
export SNAPFG_TEST_REPO_BASE="s3://$bucket/runs"

passed=() skipped=()
for t in $tests; do
    script=$top_srcdir/tests/$t.sh
    [ -f "$script" ] || fail "no such test: $script"
    info "=== $t on s3 ==="
    st=0
    "$script" || st=$?
    case $st in
        0) passed+=("$t") ;;
        77) skipped+=("$t") ;;
        *) check_fail "$t failed on S3 (exit status $st)" ;;
    esac
done
info "passed on S3: ${passed[*]:-none}"
[ ${#skipped[@]} -eq 0 ] || info "skipped themselves on S3: ${skipped[*]}"
[ ${#passed[@]} -gt 0 ] || check_fail "no repository test passed on S3"

# The tests leave their repositories behind; the bucket is all theirs.
s3_curl -f "$AWS_ENDPOINT_URL/$bucket?list-type=2&max-keys=5" >"$tmpdir/left.xml" ||
    check_fail "listing the bucket with curl"
grep -q "<Key>runs/" "$tmpdir/left.xml" ||
    check_fail "no object under runs/ in the bucket: did the tests use S3 at all?"

finish
