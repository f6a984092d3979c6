/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* What snapfgctl and snapfg-backup print, in one place: messages on
 * standard error ("PROG: ..."), the progress line (--progress), the
 * last line of a run (duration and rate) and, with --json, one JSON
 * object per command on standard output.
 *
 * With --json, standard output carries nothing but that object (a
 * command's own JSON, or {"ok": false, "exit_status": N, "error": ...}
 * when it failed before it had one), so that a script can always parse
 * it; the messages stay on standard error.
 */
#ifndef SNAPFG_TOOL_OUTPUT_H
#define SNAPFG_TOOL_OUTPUT_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>

enum tool_progress_mode {
  TOOL_PROGRESS_AUTO,           /* a progress line on a terminal only */
  TOOL_PROGRESS_ALWAYS,         /* on a terminal, else periodic lines */
  TOOL_PROGRESS_NEVER,
};

struct tool_output {
  const char *prog;             /* "snapfg-backup" */
  bool json;                    /* --json */
  enum tool_progress_mode progress;
  char last_error[1024];        /* the last tool_error, for --json */
  bool result_printed;          /* tool_json_result was called */
};

/* The program's settings (each tool sets prog, and json and progress
 * from its command line).
 */
extern struct tool_output tool_out;

/* "PROG: MESSAGE" on stderr, after ending a progress line.  tool_error
 * also remembers MESSAGE for the --json failure object.
 */
extern void tool_error (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
extern void tool_info (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));

/* --progress=WORD: 0, or -1 if WORD is none of auto, always, never. */
extern int tool_parse_progress (const char *word,
                                enum tool_progress_mode *mode);

/* --timeout=SECONDS: a whole number from min to TOOL_MAX_TIMEOUT into
 * *seconds, or -1.
 */
#define TOOL_MAX_TIMEOUT 86400
extern int tool_parse_timeout (const char *word, int min, int *seconds);
/* A rate in bytes per second (--limit-rate): a whole number, optionally
 * followed by K, M or G (1024-based, either case), at least 1024.  0, or
 * -1 if WORD is not one.
 */
extern int tool_parse_rate (const char *word, uint64_t *bytes_per_second);

/* Print OBJ (consumed) as one line on stdout.  When STATUS is not 0,
 * "ok": false, "exit_status" and "error" (the last tool_error, unless
 * OBJ has one) are added; NULL makes a new object.
 */
extern void tool_json_result (json_t *obj, int status);

/* Seconds of a monotonic clock. */
extern double tool_now (void);
/* T as ISO 8601 in UTC: 2026-12-02T17:12:28Z. */
extern void tool_iso_time (time_t t, char out[32]);
/* "12.3 MiB in 1.52 s (8.1 MiB/s)" */
extern void tool_format_rate (char *out, size_t len, uint64_t bytes,
                              double seconds);

/* A progress report: on a terminal one line redrawn in place (twice a
 * second), elsewhere (with --progress=always) a whole line every
 * TOOL_PROGRESS_PERIOD seconds, the first at once.
 */
#define TOOL_PROGRESS_PERIOD 5.0
struct tool_progress {
  const char *what;
  const char *unit;             /* NULL: bytes, shown in MiB with a rate */
  double start, last;
  bool tty, on;
};
extern void tool_progress_start (struct tool_progress *p, const char *what);
/* A count of UNIT ("chunks") rather than bytes: "WHAT: N of M UNIT (P%)". */
extern void tool_progress_start_count (struct tool_progress *p,
                                       const char *what, const char *unit);
extern void tool_progress_update (struct tool_progress *p, uint64_t done,
                                  uint64_t total);
/* The last report (100 %, or where it stopped). */
extern void tool_progress_end (struct tool_progress *p, uint64_t done,
                               uint64_t total);

#endif
