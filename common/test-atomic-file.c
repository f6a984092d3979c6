/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of common/atomic-file.c: the file is replaced whole or not
 * at all, the temporary never survives, and nothing is written through
 * a planted link.
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "atomic-file.h"
#include "unit-test.h"

static int dfd;

/* The contents of name (at most 63 bytes), or "" if it cannot be read. */
static const char *
contents (const char *name)
{
  static char buf[64];
  int fd = openat (dfd, name, O_RDONLY | O_NOFOLLOW);
  ssize_t n = fd >= 0 ? read (fd, buf, sizeof buf - 1) : -1;

  buf[n > 0 ? n : 0] = '\0';
  if (fd >= 0)
    close (fd);
  return buf;
}

static bool
exists (const char *name)
{
  struct stat st;
  return fstatat (dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

static void
put (const char *name, const char *text)
{
  int fd = openat (dfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0600);

  CHECK (fd >= 0);
  CHECK (write (fd, text, strlen (text)) == (ssize_t) strlen (text));
  close (fd);
}

static int
write_text (const char *name, const char *text, unsigned flags,
            const char **step)
{
  struct iovec iov[2] = {
    { .iov_base = (char *) text, .iov_len = strlen (text) },
    { .iov_base = (char *) "\n", .iov_len = 1 },
  };
  return atomic_file_write (dfd, name, 0600, flags, iov, 2, step);
}

int
main (void)
{
  char dir[] = "/tmp/test-atomic-file.XXXXXX";
  char victim[64 + sizeof dir];
  struct atomic_file af;
  struct stat a, b;
  const char *step;
  char longname[NAME_MAX + 1];

  CHECK (mkdtemp (dir) != NULL);
  dfd = open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  CHECK (dfd >= 0);

  /* A new file, then a replacement: a new inode, no temporary left. */
  step = NULL;
  CHECK (write_text ("doc", "one", 0, &step) == 0 && step == NULL);
  CHECK (strcmp (contents ("doc"), "one\n") == 0);
  CHECK (fstatat (dfd, "doc", &a, 0) == 0 && (a.st_mode & 0777) == 0600);
  CHECK (write_text ("doc", "two", 0, &step) == 0);
  CHECK (strcmp (contents ("doc"), "two\n") == 0);
  CHECK (fstatat (dfd, "doc", &b, 0) == 0 && a.st_ino != b.st_ino);
  CHECK (!exists ("doc.tmp"));

  /* A leftover temporary is refused unless the caller says it is its
   * own; NAME is unchanged either way until the rename.
   */
  put ("doc.tmp", "leftover");
  CHECK (write_text ("doc", "three", 0, &step) == -EEXIST);
  CHECK (errno == EEXIST && strcmp (step, "create") == 0);
  CHECK (strcmp (contents ("doc"), "two\n") == 0);
  CHECK (strcmp (contents ("doc.tmp"), "leftover") == 0);
  CHECK (write_text ("doc", "three", ATOMIC_FILE_REPLACE_LEFTOVER, &step)
         == 0);
  CHECK (strcmp (contents ("doc"), "three\n") == 0 && !exists ("doc.tmp"));

  /* A link planted at NAME.tmp: never written through. */
  snprintf (victim, sizeof victim, "%s/victim", dir);
  put ("victim", "victim");
  CHECK (symlinkat (victim, dfd, "doc.tmp") == 0);
  CHECK (write_text ("doc", "four", 0, &step) == -EEXIST);
  CHECK (strcmp (contents ("victim"), "victim") == 0);
  CHECK (write_text ("doc", "four", ATOMIC_FILE_REPLACE_LEFTOVER, &step)
         == 0);
  CHECK (strcmp (contents ("victim"), "victim") == 0);
  CHECK (strcmp (contents ("doc"), "four\n") == 0);

  /* A link planted at NAME: replaced by the new file, its target kept. */
  CHECK (symlinkat (victim, dfd, "linked") == 0);
  CHECK (write_text ("linked", "new", 0, &step) == 0);
  CHECK (fstatat (dfd, "linked", &a, AT_SYMLINK_NOFOLLOW) == 0 &&
         S_ISREG (a.st_mode));
  CHECK (strcmp (contents ("linked"), "new\n") == 0);
  CHECK (strcmp (contents ("victim"), "victim") == 0);

  /* Given up before the commit: the temporary goes, NAME stays. */
  CHECK (atomic_file_begin (&af, dfd, "doc", 0600, 0) == 0);
  CHECK (write (af.fd, "half", 4) == 4);
  CHECK (exists ("doc.tmp"));
  atomic_file_end (&af);
  atomic_file_end (&af);                 /* twice is harmless */
  CHECK (!exists ("doc.tmp"));
  CHECK (strcmp (contents ("doc"), "four\n") == 0);

  /* The caller keeps the new file's descriptor (as the catalogue does,
   * for its lock): after the commit it is NAME's.
   */
  CHECK (atomic_file_begin (&af, dfd, "doc", 0600, 0) == 0);
  CHECK (write (af.fd, "kept", 4) == 4);
  CHECK (atomic_file_commit (&af, &step) == 0 && af.renamed);
  {
    int fd = af.fd;

    af.fd = -1;
    atomic_file_end (&af);
    CHECK (fstat (fd, &a) == 0 && fstatat (dfd, "doc", &b, 0) == 0);
    CHECK (a.st_ino == b.st_ino);
    CHECK (fcntl (fd, F_GETFD) & FD_CLOEXEC);
    close (fd);
  }
  CHECK (strcmp (contents ("doc"), "kept") == 0 && !exists ("doc.tmp"));
  /* Committing twice is a caller's mistake, refused. */
  CHECK (atomic_file_commit (&af, &step) == -EINVAL);

  /* The rename fails (NAME is a directory): NAME untouched, the
   * temporary removed, the step named.
   */
  CHECK (mkdirat (dfd, "adir", 0700) == 0);
  CHECK (write_text ("adir", "x", 0, &step) < 0);
  CHECK (strcmp (step, "rename") == 0);
  CHECK (fstatat (dfd, "adir", &a, 0) == 0 && S_ISDIR (a.st_mode));
  CHECK (!exists ("adir.tmp"));

  /* Names that are not one component, or too long for NAME.tmp. */
  CHECK (write_text ("", "x", 0, &step) == -EINVAL);
  CHECK (write_text ("adir/doc", "x", 0, &step) == -EINVAL);
  CHECK (write_text ("..", "x", 0, &step) == -EINVAL);
  memset (longname, 'n', NAME_MAX - 2);
  longname[NAME_MAX - 2] = '\0';
  CHECK (write_text (longname, "x", 0, &step) == -EINVAL);
  CHECK (!exists ("adir/doc.tmp"));
  longname[NAME_MAX - 4] = '\0';         /* NAME.tmp fits exactly */
  CHECK (write_text (longname, "x", 0, &step) == 0);
  unlinkat (dfd, longname, 0);

  /* Relative to the working directory. */
  CHECK (fchdir (dfd) == 0);
  CHECK (atomic_file_write (AT_FDCWD, "cwd", 0600, 0,
                            &(struct iovec) { "c", 1 }, 1, &step) == 0);
  CHECK (strcmp (contents ("cwd"), "c") == 0);
  CHECK (chdir ("/") == 0);

  unlinkat (dfd, "doc", 0);
  unlinkat (dfd, "victim", 0);
  unlinkat (dfd, "linked", 0);
  unlinkat (dfd, "cwd", 0);
  unlinkat (dfd, "adir", AT_REMOVEDIR);
  close (dfd);
  CHECK (rmdir (dir) == 0);
  return 0;
}
