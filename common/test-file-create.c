/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of common/file-create.c: an existing name or a planted
 * link is refused and nothing is written through it.
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "file-create.h"
#include "unit-test.h"

int
main (void)
{
  char dir[] = "/tmp/test-file-create.XXXXXX";
  char victim[64 + sizeof dir], path[64 + sizeof dir];
  struct stat st;
  int dfd, fd;

  umask (022);
  CHECK (mkdtemp (dir) != NULL);
  dfd = open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  CHECK (dfd >= 0);

  /* A new name: created with the mode less the umask, close-on-exec. */
  fd = create_in_dir (dfd, "a", O_RDWR, 0666);
  CHECK (fd >= 0);
  CHECK (fstat (fd, &st) == 0 && S_ISREG (st.st_mode));
  CHECK ((st.st_mode & 07777) == 0644);
  CHECK (fcntl (fd, F_GETFD) & FD_CLOEXEC);
  CHECK (write (fd, "keep", 4) == 4);
  close (fd);
  fd = create_in_dir (dfd, "b", O_WRONLY, 0600);
  CHECK (fd >= 0 && fstat (fd, &st) == 0 && (st.st_mode & 07777) == 0600);
  close (fd);

  /* An existing file is refused and left as it was. */
  CHECK (create_in_dir (dfd, "a", O_RDWR, 0600) == -EEXIST);
  CHECK (fstatat (dfd, "a", &st, 0) == 0 && st.st_size == 4);

  /* A planted link to a file elsewhere: refused, the target untouched. */
  snprintf (victim, sizeof victim, "%s/victim", dir);
  fd = open (victim, O_WRONLY | O_CREAT | O_EXCL, 0600);
  CHECK (fd >= 0 && write (fd, "victim", 6) == 6);
  close (fd);
  CHECK (symlinkat (victim, dfd, "link") == 0);
  CHECK (create_in_dir (dfd, "link", O_RDWR, 0600) == -EEXIST);
  CHECK (stat (victim, &st) == 0 && st.st_size == 6);
  /* A dangling link: refused, and its target is not created. */
  snprintf (path, sizeof path, "%s/not-there", dir);
  CHECK (symlinkat (path, dfd, "dangling") == 0);
  CHECK (create_in_dir (dfd, "dangling", O_RDWR, 0600) == -EEXIST);
  CHECK (stat (path, &st) == -1 && errno == ENOENT);
  /* A directory of that name. */
  CHECK (mkdirat (dfd, "sub", 0700) == 0);
  CHECK (create_in_dir (dfd, "sub", O_RDWR, 0600) == -EEXIST);

  /* Only a single path component: never a walk to somewhere else. */
  CHECK (create_in_dir (dfd, "", O_RDWR, 0600) == -EINVAL);
  CHECK (create_in_dir (dfd, ".", O_RDWR, 0600) == -EINVAL);
  CHECK (create_in_dir (dfd, "..", O_RDWR, 0600) == -EINVAL);
  CHECK (create_in_dir (dfd, "sub/x", O_RDWR, 0600) == -EINVAL);
  CHECK (create_in_dir (dfd, "/tmp/x", O_RDWR, 0600) == -EINVAL);
  CHECK (errno == EINVAL);
  CHECK (fstatat (dfd, "sub/x", &st, 0) == -1);
  CHECK (file_name_is_component ("a.cow") && file_name_is_component ("..."));
  CHECK (!file_name_is_component (NULL));

  /* The directory of a path can be synced; a missing one is an error. */
  CHECK (sync_directory_of (victim) == 0);
  snprintf (path, sizeof path, "%s/no-dir/file", dir);
  CHECK (sync_directory_of (path) == -ENOENT);

  /* Clean up. */
  unlinkat (dfd, "a", 0);
  unlinkat (dfd, "b", 0);
  unlinkat (dfd, "victim", 0);
  unlinkat (dfd, "link", 0);
  unlinkat (dfd, "dangling", 0);
  unlinkat (dfd, "sub", AT_REMOVEDIR);
  close (dfd);
  CHECK (rmdir (dir) == 0);
  return 0;
}
