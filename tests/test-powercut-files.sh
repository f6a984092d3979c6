#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The power-cut rounds of test-powercut.sh with snapfg's file backends:
# origin= and cow= are regular files, each an export of the volatile-
# cache disks seen through nbdfuse.  test-powercut.sh reaches the same
# disks through its libnbd backends, which never run the file backend's
# pwrite, fdatasync and O_DIRECT copies; here the order of those is what
# a cut tests.  Skipped without nbdfuse or /dev/fuse.
SNAPFG_POWERCUT_VIA=files exec "$(dirname "$0")/test-powercut.sh"
