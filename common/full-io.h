/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: reads and writes of all the bytes asked for.
 *
 * read(2) and write(2) may move fewer bytes than asked (a signal, a
 * pipe or socket, a file system's own limits).  These loop until all
 * count bytes are moved, resuming after EINTR.
 *
 * Each returns 0, or -errno with errno set as well (so callers that
 * report with strerror (errno) and callers that pass -errno on both
 * work).  A read that meets the end of the file first fails with
 * -ENODATA: the file is shorter than the caller expects.  A positioned
 * write that moves nothing fails with -EIO.
 */
#ifndef SNAPFG_FULL_IO_H
#define SNAPFG_FULL_IO_H

#include <stddef.h>
#include <stdint.h>

extern int full_write (int fd, const void *buf, size_t count);
extern int full_read (int fd, void *buf, size_t count);
extern int full_pwrite (int fd, const void *buf, size_t count,
                        uint64_t offset);
extern int full_pread (int fd, void *buf, size_t count, uint64_t offset);

#endif
