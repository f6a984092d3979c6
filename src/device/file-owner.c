/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the owner and mode rule for state files (file-owner.h).  Below
 * the stores and the catalogue, which both apply it.
 */

#include <config.h>

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file-owner.h"
#include "snapfg-log.h"

int
file_check_owner (int fd, const char *path, bool directory)
{
  struct stat st;

  if (fstat (fd, &st) == -1) {
    int r = -errno;
    snapfg_error ("%s: %m", path);
    return r;
  }
  if (st.st_uid != geteuid ()) {
    return snapfg_fail (EPERM, "%s: owned by user %u, not by this server's user (%u): "
                               "the server only reads and writes state %s its own user "
                               "owns; chown %u %s (or run the server as the owner)", path,
                               (unsigned) st.st_uid, (unsigned) geteuid (),
                               directory ? "directories" : "files",
                               (unsigned) geteuid (), path);
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    return snapfg_fail (EPERM, "%s: writable by %s (mode %04o): whoever can write it "
                               "can change what the server serves; chmod go-w %s", path,
                               st.st_mode & S_IWOTH ? "every user" : "its group",
                               (unsigned) (st.st_mode & 07777), path);
  }
  return 0;
}
