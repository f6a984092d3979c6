/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: whole-file OFD locks (see file-lock.h). */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "file-lock.h"

int
file_lock (int fd, bool exclusive)
{
  struct flock fl;

  memset (&fl, 0, sizeof fl);
  fl.l_type = exclusive ? F_WRLCK : F_RDLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;                 /* to the end, however large it grows */
  fl.l_pid = 0;                 /* required for OFD locks */
  if (fcntl (fd, F_OFD_SETLK, &fl) == -1)
    return errno == EACCES ? -EAGAIN : -errno;
  return 0;
}
