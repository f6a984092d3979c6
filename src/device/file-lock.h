/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: whole-file OFD locks on the origin, the COW stores and the
 * catalogue (docs/design.md section 7).
 *
 * Open file description locks (F_OFD_SETLK) rather than classic POSIX
 * locks: they belong to the open file, so they survive nbdkit's fork into
 * the background, and closing some other descriptor of the same file
 * (snapfgctl inspect, a second open in this process) does not drop them.
 * Two opens of one file in this process conflict like two processes do,
 * which is what "no file is reused while a reference to it is open"
 * needs.
 */
#ifndef SNAPFG_FILE_LOCK_H
#define SNAPFG_FILE_LOCK_H

#include <stdbool.h>

/* Lock the whole file open on fd: exclusive (a writer) or shared (a
 * reader), without waiting.  0, -EAGAIN if someone else holds a
 * conflicting lock, or another negative errno.
 */
extern int file_lock (int fd, bool exclusive);

#endif
