/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: logging for the engine (see snapfg-log.h). */

#include <config.h>

#include <stdio.h>
#include <stdarg.h>
#include <stdbool.h>

#include "snapfg-log.h"
#include "snapfg-error.h"

int snapfg_debug_lock = 0;
int snapfg_debug_cow = 0;
int snapfg_debug_commit = 0;

static void
stderr_error (const char *fmt, va_list args)
{
  fputs ("snapfg: error: ", stderr);
  vfprintf (stderr, fmt, args);
  fputc ('\n', stderr);
}

static void
stderr_debug (const char *fmt, va_list args)
{
  fputs ("snapfg: debug: ", stderr);
  vfprintf (stderr, fmt, args);
  fputc ('\n', stderr);
}

static void
stderr_notice (const char *fmt, va_list args)
{
  fputs ("snapfg: ", stderr);
  vfprintf (stderr, fmt, args);
  fputc ('\n', stderr);
}

static snapfg_vlog_fn error_sink = stderr_error;
static snapfg_vlog_fn notice_sink = stderr_notice;
static snapfg_vlog_fn debug_sink = stderr_debug;

void
snapfg_set_log (snapfg_vlog_fn error_fn, snapfg_vlog_fn debug_fn)
{
  error_sink = error_fn ? error_fn : stderr_error;
  debug_sink = debug_fn ? debug_fn : stderr_debug;
}

void
snapfg_set_notice_log (snapfg_vlog_fn notice_fn)
{
  notice_sink = notice_fn ? notice_fn : stderr_notice;
}

void
snapfg_error (const char *fmt, ...)
{
  va_list args;

  va_start (args, fmt);
  error_sink (fmt, args);
  va_end (args);
}

void
snapfg_debug (const char *fmt, ...)
{
  va_list args;

  va_start (args, fmt);
  debug_sink (fmt, args);
  va_end (args);
}

void
snapfg_notice (const char *fmt, ...)
{
  va_list args;

  va_start (args, fmt);
  notice_sink (fmt, args);
  va_end (args);
}

/* Record, then log the recorded text (already formatted: the arguments
 * are read once).
 */
static int
fail_v (int err, bool log, const char *fmt, va_list args)
{
  int r = snapfg_set_error_v (err, fmt, args);

  if (log) {
    snapfg_error ("%s", snapfg_get_error ());
    snapfg_error_set_logged ();
  }
  return r;
}

int
snapfg_fail (int err, const char *fmt, ...)
{
  va_list args;
  int r;

  va_start (args, fmt);
  r = fail_v (err, snapfg_is_server_trouble (err), fmt, args);
  va_end (args);
  return r;
}

int
snapfg_fail_logged (int err, const char *fmt, ...)
{
  va_list args;
  int r;

  va_start (args, fmt);
  r = fail_v (err, true, fmt, args);
  va_end (args);
  return r;
}
