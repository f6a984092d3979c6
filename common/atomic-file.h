/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: replacing a file whole, atomically.
 *
 * The new contents go to NAME.tmp (created exclusively, never through a
 * link: see file-create.h), which is synced, renamed over NAME, and the
 * directory synced.  A crash at any point leaves NAME either as it was
 * or with all of the new contents, never torn; renameat replaces a link
 * planted at NAME rather than writing through it.
 *
 *   struct atomic_file af;
 *   r = atomic_file_begin (&af, dirfd, "catalogue", 0600, 0);
 *   ... write af.fd ...
 *   r = atomic_file_commit (&af, &step);
 *   atomic_file_end (&af);
 *
 * atomic_file_end always runs last: before the rename it removes the
 * temporary, after it only closes the descriptor (a caller that keeps
 * the new file open, for its lock, takes af.fd and sets it to -1).
 */
#ifndef SNAPFG_ATOMIC_FILE_H
#define SNAPFG_ATOMIC_FILE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

/* A NAME.tmp left by a crash is the caller's (it holds the lock that
 * makes it the only writer): remove it first instead of refusing.
 */
#define ATOMIC_FILE_REPLACE_LEFTOVER 1u

struct atomic_file {
  int dirfd;                     /* not owned */
  int fd;                        /* NAME.tmp, then NAME; -1 once taken */
  bool renamed;                  /* NAME.tmp is NAME now */
  char name[NAME_MAX + 1];
  char tmp_name[NAME_MAX + 1];
};

/* Create NAME.tmp in dirfd, open for reading and writing with mode
 * (less the umask).  Returns 0 or -errno: -EEXIST if NAME.tmp exists
 * (without ATOMIC_FILE_REPLACE_LEFTOVER), -EINVAL if NAME is not a
 * single path component or too long.  On failure af needs no
 * atomic_file_end (it may have one all the same).
 */
extern int atomic_file_begin (struct atomic_file *af, int dirfd,
                              const char *name, mode_t mode,
                              unsigned flags);

/* Sync NAME.tmp, rename it over NAME, sync the directory.  Returns 0 or
 * -errno, and *failed_step (if not NULL) names the step that failed:
 * "sync", "rename" or "sync the directory of".  After a failure to sync
 * the directory the rename has happened (af->renamed): the new file is
 * NAME, only its durability is in doubt.
 */
extern int atomic_file_commit (struct atomic_file *af,
                               const char **failed_step);

/* Close the descriptor (unless taken) and, if NAME.tmp was not renamed,
 * remove it.  Safe to call more than once.
 */
extern void atomic_file_end (struct atomic_file *af);

/* All of it at once: NAME's new contents are the iov buffers, in order.
 * Returns 0 or -errno (errno set too), *failed_step as above plus
 * "create" and "write".
 */
extern int atomic_file_write (int dirfd, const char *name, mode_t mode,
                              unsigned flags, const struct iovec *iov,
                              size_t iovcnt, const char **failed_step);

#endif
