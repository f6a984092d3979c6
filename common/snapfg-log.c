/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: logging for the engine (see snapfg-log.h). */

#include <config.h>

#include <stdio.h>
#include <stdarg.h>

#include "snapfg-log.h"

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

static _Thread_local snapfg_vlog_fn thread_error_hook;

void
snapfg_set_thread_error_hook (snapfg_vlog_fn hook)
{
  thread_error_hook = hook;
}

void
snapfg_error (const char *fmt, ...)
{
  va_list args;

  if (thread_error_hook) {
    va_start (args, fmt);
    thread_error_hook (fmt, args);
    va_end (args);
    return;
  }
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
