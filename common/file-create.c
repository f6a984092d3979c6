/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: creating a file in a directory, exclusively (see
 * file-create.h).
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file-create.h"

bool
file_name_is_component (const char *name)
{
  return name != NULL && name[0] != '\0' && strchr (name, '/') == NULL &&
    strcmp (name, ".") != 0 && strcmp (name, "..") != 0;
}

int
create_in_dir (int dirfd, const char *name, int flags, mode_t mode)
{
  int fd;

  if (!file_name_is_component (name)) {
    errno = EINVAL;
    return -EINVAL;
  }
  fd = openat (dirfd, name,
               flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  return fd == -1 ? -errno : fd;
}

int
sync_directory_of (const char *path)
{
  char *copy = strdup (path);
  int fd, r = 0;

  if (copy == NULL)
    return -ENOMEM;
  fd = open (dirname (copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd == -1 || fsync (fd) == -1)
    r = -errno;
  if (fd >= 0)
    close (fd);
  free (copy);
  return r;
}
