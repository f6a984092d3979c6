/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the current thread's last error (see snapfg-error.h). */

#include <config.h>

#include <stdio.h>
#include <string.h>
#include <errno.h>

#include "snapfg-error.h"

struct last_error {
  int err;                      /* 0: nothing recorded */
  bool logged;
  char msg[SNAPFG_ERROR_MAX];
};

static _Thread_local struct last_error last;

int
snapfg_set_error_v (int err, const char *fmt, va_list args)
{
  int n;

  if (err <= 0)
    err = err < 0 ? -err : EIO;
  /* The arguments may point into the old message (a caller adding its
   * own words to it), so format into a copy first.
   */
  char msg[SNAPFG_ERROR_MAX];
  n = vsnprintf (msg, sizeof msg, fmt, args);
  if (n < 0)
    snprintf (msg, sizeof msg, "%s", strerror (err));
  else if ((size_t) n >= sizeof msg)
    memcpy (msg + sizeof msg - 4, "...", 4);
  memcpy (last.msg, msg, sizeof msg);
  last.err = err;
  last.logged = false;
  return -err;
}

int
snapfg_set_error (int err, const char *fmt, ...)
{
  va_list args;
  int r;

  va_start (args, fmt);
  r = snapfg_set_error_v (err, fmt, args);
  va_end (args);
  return r;
}

void
snapfg_error_set_logged (void)
{
  if (last.err)
    last.logged = true;
}

void
snapfg_clear_error (void)
{
  last.err = 0;
  last.logged = false;
  last.msg[0] = '\0';
}

const char *
snapfg_get_error (void)
{
  return last.err ? last.msg : NULL;
}

int
snapfg_get_errno (void)
{
  return last.err;
}

bool
snapfg_error_logged (void)
{
  return last.err && last.logged;
}

bool
snapfg_is_server_trouble (int err)
{
  switch (err < 0 ? -err : err) {
  case EIO: case ENOMEM: case ENOSPC: case EDQUOT: case EROFS: case EFBIG:
  case ENXIO: case ENODEV:
    return true;
  default:
    return false;
  }
}
