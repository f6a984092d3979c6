/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of common/snapfg-error.h and snapfg_fail (snapfg-log.h):
 * what is recorded, what is logged, and that each thread has its own.
 */

#include <config.h>

#include <stdio.h>
#include <stdarg.h>
#include <string.h>
#include <errno.h>
#include <pthread.h>

#include "snapfg-error.h"
#include "snapfg-log.h"
#include "unit-test.h"

/* What snapfg_error sent to the log. */
static char logged[4096];
static int logged_lines;

static void
capture_log (const char *fmt, va_list args)
{
  vsnprintf (logged, sizeof logged, fmt, args);
  logged_lines++;
}

static void *
other_thread (void *arg)
{
  (void) arg;
  /* A fresh thread has no record, whatever the main thread recorded. */
  CHECK (snapfg_get_error () == NULL);
  CHECK (snapfg_get_errno () == 0);
  CHECK (snapfg_set_error (EIO, "worker failure") == -EIO);
  CHECK (strcmp (snapfg_get_error (), "worker failure") == 0);
  return NULL;
}

int
main (void)
{
  char big[3 * SNAPFG_ERROR_MAX];
  pthread_t t;

  snapfg_set_log (capture_log, NULL);

  /* Nothing recorded at first, nor after a clear. */
  CHECK (snapfg_get_error () == NULL);
  CHECK (snapfg_get_errno () == 0);
  CHECK (!snapfg_error_logged ());

  /* A record: the message, the errno, -errno returned, nothing logged. */
  CHECK (snapfg_set_error (EINVAL, "chunk-size=%d: %s", 3, "not a power of 2")
         == -EINVAL);
  CHECK (strcmp (snapfg_get_error (), "chunk-size=3: not a power of 2") == 0);
  CHECK (snapfg_get_errno () == EINVAL);
  CHECK (!snapfg_error_logged ());
  CHECK (logged_lines == 0);

  /* A later record replaces it. */
  snapfg_set_error (ENOENT, "no snapshot named \"%s\"", "x");
  CHECK (strcmp (snapfg_get_error (), "no snapshot named \"x\"") == 0);
  CHECK (snapfg_get_errno () == ENOENT);

  /* A caller may add its words around the old message. */
  snapfg_set_error (ENOENT, "drop: %s; nothing was changed",
                    snapfg_get_error ());
  CHECK (strcmp (snapfg_get_error (),
                 "drop: no snapshot named \"x\"; nothing was changed") == 0);

  /* A failure always has an errno; a negative one is taken as such. */
  snapfg_set_error (0, "no errno");
  CHECK (snapfg_get_errno () == EIO);
  CHECK (snapfg_set_error (-ENOSPC, "negative") == -ENOSPC);
  CHECK (snapfg_get_errno () == ENOSPC);

  /* Cleared: nothing again. */
  snapfg_clear_error ();
  CHECK (snapfg_get_error () == NULL);
  CHECK (snapfg_get_errno () == 0);
  snapfg_error_set_logged ();   /* nothing to mark */
  CHECK (!snapfg_error_logged ());

  /* A long message is cut, and says so. */
  memset (big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  snapfg_set_error (EINVAL, "%s", big);
  CHECK (strlen (snapfg_get_error ()) == SNAPFG_ERROR_MAX - 1);
  CHECK (strcmp (snapfg_get_error () + SNAPFG_ERROR_MAX - 4, "...") == 0);

  /* snapfg_fail: a refusal is recorded, not logged... */
  logged_lines = 0;
  CHECK (snapfg_fail (EEXIST, "snapshot \"%s\" already exists", "s1")
         == -EEXIST);
  CHECK (strcmp (snapfg_get_error (), "snapshot \"s1\" already exists") == 0);
  CHECK (snapfg_get_errno () == EEXIST);
  CHECK (!snapfg_error_logged ());
  CHECK (logged_lines == 0);
  /* ...the server's trouble is recorded and logged once, the same text. */
  CHECK (snapfg_fail (ENOSPC, "cow=%s: no space", "/x") == -ENOSPC);
  CHECK (strcmp (snapfg_get_error (), "cow=/x: no space") == 0);
  CHECK (snapfg_error_logged ());
  CHECK (logged_lines == 1 && strcmp (logged, "cow=/x: no space") == 0);
  /* A new record is not logged until said so. */
  snapfg_set_error (EIO, "again");
  CHECK (!snapfg_error_logged ());
  /* snapfg_fail_logged logs whatever the errno. */
  logged_lines = 0;
  CHECK (snapfg_fail_logged (EINVAL, "state=%s: bad", "f") == -EINVAL);
  CHECK (logged_lines == 1 && strcmp (logged, "state=f: bad") == 0);
  CHECK (snapfg_error_logged ());
  /* A % in the message is not read as a format when logged. */
  snapfg_fail (EIO, "%s", "100%s done");
  CHECK (strcmp (logged, "100%s done") == 0);

  /* The classification the control server's log relies on. */
  CHECK (snapfg_is_server_trouble (EIO) && snapfg_is_server_trouble (-ENOSPC));
  CHECK (snapfg_is_server_trouble (ENOMEM) && snapfg_is_server_trouble (EDQUOT));
  CHECK (!snapfg_is_server_trouble (EINVAL) && !snapfg_is_server_trouble (ENOENT));
  CHECK (!snapfg_is_server_trouble (EEXIST) && !snapfg_is_server_trouble (EBUSY));

  /* Another thread's record is its own, both ways. */
  snapfg_set_error (EINVAL, "main's");
  CHECK (pthread_create (&t, NULL, other_thread, NULL) == 0);
  CHECK (pthread_join (t, NULL) == 0);
  CHECK (strcmp (snapfg_get_error (), "main's") == 0);
  CHECK (snapfg_get_errno () == EINVAL);

  printf ("test-snapfg-error: ok\n");
  return 0;
}
