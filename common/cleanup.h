/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: scoped cleanup.
 *
 * A variable declared with one of these attributes is released when it
 * goes out of scope, by whatever path: the end of the block, a return in
 * the middle of it, or a goto out of it.  That removes the "free (a);
 * free (b); close (fd); return r;" repeated at every exit of a function
 * that owns several things.
 *
 *   CLEANUP_FREE char *buf = malloc (n);     freed (NULL is fine)
 *   CLEANUP_CLOSE int fd = open (...);       closed unless < 0
 *
 * To hand the thing to someone else instead (return it, store it in a
 * struct), take it out of the variable: TAKE_PTR (buf) returns buf and
 * leaves NULL behind, TAKE_FD (fd) returns fd and leaves -1.
 *
 * The cleanups preserve errno, so "return -errno" after a failed call
 * still reports that call's error even if a cleanup runs afterwards.
 */
#ifndef SNAPFG_CLEANUP_H
#define SNAPFG_CLEANUP_H

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

/* Run fn (&variable) when the variable goes out of scope. */
#define CLEANUP(fn) __attribute__ ((cleanup (fn)))

static inline void
cleanup_free (void *ptr)
{
  int saved_errno = errno;

  free (*(void **) ptr);
  errno = saved_errno;
}

static inline void
cleanup_close (int *fd)
{
  int saved_errno = errno;

  if (*fd >= 0)
    close (*fd);
  errno = saved_errno;
}

#define CLEANUP_FREE CLEANUP (cleanup_free)
#define CLEANUP_CLOSE CLEANUP (cleanup_close)

/* Move ownership out of a cleanup variable. */
#define TAKE_PTR(p) \
  ({ __typeof__ (p) take_ptr_value_ = (p); (p) = NULL; take_ptr_value_; })
#define TAKE_FD(fd) \
  ({ int take_fd_value_ = (fd); (fd) = -1; take_fd_value_; })

#endif
