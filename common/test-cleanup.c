/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of src/cleanup.h: CLEANUP_FREE frees, CLEANUP_CLOSE closes,
 * on every way out of a scope (end of block, return, goto, break), TAKE_PTR
 * and TAKE_FD hand ownership out, and errno survives the cleanups.
 *
 * That memory was freed cannot be seen from inside the program, so a
 * counting cleanup made with CLEANUP () shows that cleanups run on each
 * path, and the same paths run CLEANUP_FREE: under the address sanitizer
 * (make check-sanitizers) the leak checker fails this test if one of
 * them did not free.
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "cleanup.h"
#include "unit-test.h"

static int cleanups_run;

static void
count_cleanup (int *v)
{
  cleanups_run++;
  *v = -1;
}

static bool
fd_is_open (int fd)
{
  return fcntl (fd, F_GETFD) != -1;
}

static int
open_dev_null (void)
{
  int fd = open ("/dev/null", O_RDONLY | O_CLOEXEC);

  if (fd == -1)
    FAIL ("open /dev/null: %s", strerror (errno));
  return fd;
}

/* Returns early from inside two nested scopes. */
static int
early_return (bool early)
{
  CLEANUP (count_cleanup) int a = 1;
  CLEANUP_FREE char *buf = malloc (100);

  CHECK (buf != NULL);
  {
    CLEANUP (count_cleanup) int b = 2;
    if (early)
      return a + b;
  }
  return 0;
}

static int
goto_out (void)
{
  int r = 0;

  for (int i = 0; i < 3; ++i) {
    CLEANUP (count_cleanup) int x = i;
    CLEANUP_FREE char *p = malloc (10);
    if (i == 1)
      break;                    /* leaves the body: cleanups run */
    if (x == 0)
      continue;                 /* so do these */
  }
  {
    CLEANUP (count_cleanup) int y = 0;
    if (y == 0)
      goto out;
    r = 1;
  }
 out:
  return r;
}

/* A failed call's errno must survive a cleanup running after it. */
static int
failing_open (int *fd_seen)
{
  CLEANUP_CLOSE int fd = open_dev_null ();
  CLEANUP_FREE char *buf = malloc (64);

  *fd_seen = fd;
  errno = 0;
  if (open ("/nonexistent/snapfg-test", O_RDONLY) == -1)
    return -errno;
  return 0;
}

static char *
make_owned_string (void)
{
  CLEANUP_FREE char *s = strdup ("kept");

  CHECK (s != NULL);
  return TAKE_PTR (s);          /* not freed: the caller owns it now */
}

static int
make_owned_fd (void)
{
  CLEANUP_CLOSE int fd = open_dev_null ();

  return TAKE_FD (fd);
}

int
main (void)
{
  int fd, r;

  /* End of block. */
  cleanups_run = 0;
  {
    CLEANUP (count_cleanup) int v = 0;
    (void) v;
  }
  CHECK (cleanups_run == 1);

  /* return from nested scopes: both counters, and buf. */
  cleanups_run = 0;
  CHECK (early_return (true) == 3);
  CHECK (cleanups_run == 2);
  cleanups_run = 0;
  CHECK (early_return (false) == 0);
  CHECK (cleanups_run == 2);

  /* continue, break and goto out of scopes. */
  cleanups_run = 0;
  CHECK (goto_out () == 0);
  CHECK (cleanups_run == 3);

  /* CLEANUP_CLOSE closes; a negative fd is left alone. */
  {
    CLEANUP_CLOSE int inner = open_dev_null ();
    fd = inner;
    CHECK (fd_is_open (fd));
  }
  CHECK (!fd_is_open (fd));
  {
    CLEANUP_CLOSE int none = -1;
    (void) none;
  }
  CHECK (!fd_is_open (fd));

  /* errno after cleanups: still the failed open's ENOENT, and the
   * descriptor was closed.
   */
  r = failing_open (&fd);
  CHECK (r == -ENOENT);
  CHECK (!fd_is_open (fd));

  /* Ownership handed out survives the scope. */
  {
    char *s = make_owned_string ();
    CHECK (strcmp (s, "kept") == 0);
    free (s);
  }
  fd = make_owned_fd ();
  CHECK (fd_is_open (fd));
  close (fd);

  /* CLEANUP_FREE of NULL is fine. */
  {
    CLEANUP_FREE char *nothing = NULL;
    (void) nothing;
  }

  printf ("cleanup: end of block, return, break, continue, goto, errno, "
          "TAKE_PTR, TAKE_FD: ok\n");
  return EXIT_SUCCESS;
}
