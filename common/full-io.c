/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: reads and writes of all the bytes asked for (see full-io.h). */

#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <unistd.h>

#include "full-io.h"

/* One loop for the four: positioned or not, reading or writing. */
static int
full_io (int fd, char *p, size_t count, uint64_t offset, bool positioned,
         bool write_)
{
  while (count > 0) {
    ssize_t n;

    if (positioned)
      n = write_ ? pwrite (fd, p, count, offset)
        : pread (fd, p, count, offset);
    else
      n = write_ ? write (fd, p, count) : read (fd, p, count);
    if (n == -1) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0) {
      /* A read at the end of the file; a write that cannot progress. */
      errno = write_ ? EIO : ENODATA;
      return -errno;
    }
    p += n;
    count -= n;
    offset += n;
  }
  return 0;
}

int
full_write (int fd, const void *buf, size_t count)
{
  return full_io (fd, (char *) buf, count, 0, false, true);
}

int
full_read (int fd, void *buf, size_t count)
{
  return full_io (fd, buf, count, 0, false, false);
}

int
full_pwrite (int fd, const void *buf, size_t count, uint64_t offset)
{
  return full_io (fd, (char *) buf, count, offset, true, true);
}

int
full_pread (int fd, void *buf, size_t count, uint64_t offset)
{
  return full_io (fd, buf, count, offset, true, false);
}
