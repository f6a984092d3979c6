/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: replacing a file whole, atomically (see atomic-file.h). */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "atomic-file.h"
#include "file-create.h"
#include "full-io.h"

/* fsync a directory given by its descriptor, or AT_FDCWD. */
static int
sync_directory (int dirfd)
{
  int fd = dirfd, r = 0;

  if (dirfd == AT_FDCWD &&
      (fd = open (".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) == -1)
    return -errno;
  if (fsync (fd) == -1)
    r = -errno;
  if (fd != dirfd)
    close (fd);
  return r;
}

int
atomic_file_begin (struct atomic_file *af, int dirfd, const char *name,
                   mode_t mode, unsigned flags)
{
  int fd;

  af->dirfd = dirfd;
  af->fd = -1;
  af->renamed = false;
  af->name[0] = af->tmp_name[0] = '\0';
  if (!file_name_is_component (name) ||
      snprintf (af->tmp_name, sizeof af->tmp_name, "%s.tmp", name) >=
      (int) sizeof af->tmp_name) {
    af->tmp_name[0] = '\0';
    errno = EINVAL;
    return -EINVAL;
  }
  strcpy (af->name, name);
  if ((flags & ATOMIC_FILE_REPLACE_LEFTOVER) &&
      unlinkat (dirfd, af->tmp_name, 0) == -1 && errno != ENOENT) {
    int r = -errno;
    af->tmp_name[0] = '\0';     /* not ours to remove */
    return r;
  }
  fd = create_in_dir (dirfd, af->tmp_name, O_RDWR, mode);
  if (fd < 0) {
    af->tmp_name[0] = '\0';     /* someone else's file: leave it be */
    errno = -fd;
    return fd;
  }
  af->fd = fd;
  return 0;
}

int
atomic_file_commit (struct atomic_file *af, const char **failed_step)
{
  const char *step;
  int r;

  if (af->fd < 0 || af->tmp_name[0] == '\0' || af->renamed) {
    errno = EINVAL;
    return -EINVAL;
  }
  step = "sync";
  if (fsync (af->fd) == -1)
    goto fail;
  step = "rename";
  if (renameat (af->dirfd, af->tmp_name, af->dirfd, af->name) == -1)
    goto fail;
  af->renamed = true;
  step = "sync the directory of";
  r = sync_directory (af->dirfd);
  if (r < 0)
    goto failed;
  return 0;

 fail:
  r = -errno;
 failed:
  if (failed_step)
    *failed_step = step;
  errno = -r;
  return r;
}

void
atomic_file_end (struct atomic_file *af)
{
  int saved_errno = errno;

  if (af->fd >= 0)
    close (af->fd);
  af->fd = -1;
  if (!af->renamed && af->tmp_name[0] != '\0')
    unlinkat (af->dirfd, af->tmp_name, 0);
  af->tmp_name[0] = '\0';
  errno = saved_errno;
}

int
atomic_file_write (int dirfd, const char *name, mode_t mode, unsigned flags,
                   const struct iovec *iov, size_t iovcnt,
                   const char **failed_step)
{
  struct atomic_file af;
  int r;

  r = atomic_file_begin (&af, dirfd, name, mode, flags);
  if (r < 0) {
    if (failed_step)
      *failed_step = "create";
    return r;
  }
  for (size_t i = 0; i < iovcnt && r == 0; ++i)
    r = full_write (af.fd, iov[i].iov_base, iov[i].iov_len);
  if (r < 0) {
    if (failed_step)
      *failed_step = "write";
  }
  else
    r = atomic_file_commit (&af, failed_step);
  atomic_file_end (&af);
  if (r < 0)
    errno = -r;
  return r;
}
