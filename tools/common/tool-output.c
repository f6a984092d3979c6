/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* What the tools print: see tool-output.h. */

#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <unistd.h>

#include "tool-output.h"

struct tool_output tool_out = { .prog = "snapfg" };

/* The progress line on the terminal, if one is showing: a message
 * starts on a line of its own.
 */
static struct tool_progress *showing;

static void
end_progress_line (void)
{
  if (showing && showing->on) {
    fputc ('\n', stderr);
    showing->on = false;
  }
}

static void
vmessage (bool remember, const char *fmt, va_list ap)
{
  va_list copy;

  end_progress_line ();
  va_copy (copy, ap);
  if (remember)
    vsnprintf (tool_out.last_error, sizeof tool_out.last_error, fmt, copy);
  va_end (copy);
  fprintf (stderr, "%s: ", tool_out.prog);
  vfprintf (stderr, fmt, ap);
  fputc ('\n', stderr);
}

void
tool_error (const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vmessage (true, fmt, ap);
  va_end (ap);
}

void
tool_info (const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vmessage (false, fmt, ap);
  va_end (ap);
}

int
tool_parse_progress (const char *word, enum tool_progress_mode *mode)
{
  if (strcmp (word, "auto") == 0)
    *mode = TOOL_PROGRESS_AUTO;
  else if (strcmp (word, "always") == 0)
    *mode = TOOL_PROGRESS_ALWAYS;
  else if (strcmp (word, "never") == 0)
    *mode = TOOL_PROGRESS_NEVER;
  else
    return -1;
  return 0;
}

int
tool_parse_timeout (const char *word, int min, int *seconds)
{
  char *end;
  long v;

  errno = 0;
  v = strtol (word, &end, 10);
  if (errno || end == word || *end || v < min || v > TOOL_MAX_TIMEOUT)
    return -1;
  *seconds = v;
  return 0;
}

void
tool_json_result (json_t *obj, int status)
{
  char *text;

  if (obj == NULL)
    obj = json_object ();
  if (obj == NULL)
    return;
  tool_out.result_printed = true;
  if (status != 0) {
    json_object_set_new (obj, "ok", json_false ());
    json_object_set_new (obj, "exit_status", json_integer (status));
    if (json_object_get (obj, "error") == NULL)
      json_object_set_new (obj, "error",
                           json_string (tool_out.last_error[0]
                                        ? tool_out.last_error : "failed"));
  }
  else if (json_object_get (obj, "ok") == NULL)
    json_object_set_new (obj, "ok", json_true ());
  text = json_dumps (obj, JSON_COMPACT);
  if (text) {
    puts (text);
    fflush (stdout);
  }
  free (text);
  json_decref (obj);
}

double
tool_now (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

void
tool_iso_time (time_t t, char out[32])
{
  struct tm tm;

  gmtime_r (&t, &tm);
  strftime (out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void
tool_format_rate (char *out, size_t len, uint64_t bytes, double seconds)
{
  snprintf (out, len, "%.1f MiB in %.2f s (%.1f MiB/s)",
            bytes / 1048576.0, seconds,
            seconds > 0 ? bytes / 1048576.0 / seconds : 0.0);
}

void
tool_progress_start (struct tool_progress *p, const char *what)
{
  memset (p, 0, sizeof *p);
  p->what = what;
  p->start = tool_now ();
  p->last = -1e9;
  p->tty = isatty (STDERR_FILENO);
  showing = p;
}

void
tool_progress_start_count (struct tool_progress *p, const char *what,
                           const char *unit)
{
  tool_progress_start (p, what);
  p->unit = unit;
}

static bool
wanted (const struct tool_progress *p)
{
  switch (tool_out.progress) {
  case TOOL_PROGRESS_NEVER: return false;
  case TOOL_PROGRESS_ALWAYS: return true;
  default: return p->tty;
  }
}

static void
report (struct tool_progress *p, uint64_t done, uint64_t total, bool last)
{
  double t = tool_now () - p->start;

  if (p->unit)
    fprintf (stderr, "%s%s: %" PRIu64 " of %" PRIu64 " %s (%.0f%%)%s",
             p->tty ? "\r" : "", p->what, done, total, p->unit,
             total ? 100.0 * done / total : 100.0, p->tty ? "\033[K" : "\n");
  else
    fprintf (stderr, "%s%s: %" PRIu64 " of %" PRIu64 " MiB (%.0f%%), "
             "%.1f MiB/s%s", p->tty ? "\r" : "", p->what, done >> 20,
             total >> 20, total ? 100.0 * done / total : 100.0,
             t > 0 ? done / t / 1048576.0 : 0.0, p->tty ? "\033[K" : "\n");
  p->on = p->tty && !last;
  if (p->tty && last)
    fputc ('\n', stderr);
  fflush (stderr);
}

void
tool_progress_update (struct tool_progress *p, uint64_t done, uint64_t total)
{
  double now = tool_now ();

  if (!wanted (p) || now - p->last < (p->tty ? 0.5 : TOOL_PROGRESS_PERIOD))
    return;
  p->last = now;
  report (p, done, total, false);
}

void
tool_progress_end (struct tool_progress *p, uint64_t done, uint64_t total)
{
  if (wanted (p))
    report (p, done, total, true);
  if (showing == p)
    showing = NULL;
}

int
tool_parse_rate (const char *word, uint64_t *bytes_per_second)
{
  uint64_t n = 0, scale = 1;
  const char *p = word;

  for (; *p >= '0' && *p <= '9'; ++p) {
    if (n > UINT64_MAX / 10 / 1024 / 1024 / 1024)
      return -1;
    n = n * 10 + (*p - '0');
  }
  if (p == word)
    return -1;
  switch (*p) {
  case 'k': case 'K': scale = 1024; ++p; break;
  case 'm': case 'M': scale = 1024 * 1024; ++p; break;
  case 'g': case 'G': scale = 1024 * 1024 * 1024; ++p; break;
  }
  if (*p != '\0' || n * scale < 1024)
    return -1;
  *bytes_per_second = n * scale;
  return 0;
}
