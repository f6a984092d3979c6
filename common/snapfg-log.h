/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: logging for the engine.
 *
 * The engine is a library used by the nbdkit plugin, by snapfgctl and by
 * unit tests, so it cannot call nbdkit_error directly.  The plugin installs
 * nbdkit's functions here; everyone else gets stderr.
 *
 * The log is for the operator.  What a caller needs in order to tell
 * whoever asked (a control client's reply) is recorded separately, by the
 * function that failed, in the thread's last error (snapfg-error.h);
 * nothing here captures or rewrites log lines for that.  snapfg_fail
 * records and, for the server's own trouble, logs, in one call.
 */
#ifndef SNAPFG_LOG_H
#define SNAPFG_LOG_H

#include <stdarg.h>

typedef void (*snapfg_vlog_fn) (const char *fmt, va_list args);

/* Install the sinks for errors and debug messages (NULL = default). */
extern void snapfg_set_log (snapfg_vlog_fn error_fn, snapfg_vlog_fn debug_fn);

/* Install the sink for notices: actions worth a line in the log without
 * -v, such as snapshots created or dropped by a control client (NULL =
 * default: stderr).
 */
extern void snapfg_set_notice_log (snapfg_vlog_fn notice_fn);

extern void snapfg_error (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
extern void snapfg_debug (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
extern void snapfg_notice (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));

/* A failure found here, reported in one call: recorded as the thread's
 * last error (snapfg-error.h: message and errno, for the caller who
 * tells whoever asked), and, when it is the server's trouble
 * (snapfg_is_server_trouble: a disk error, no space, no memory), also
 * logged as an error, since the operator must hear of it whoever asked.
 * A refusal of what was asked (a bad name, a snapshot that exists, an
 * invalid store) is only recorded: the caller reports it, and knows how
 * (the control server in its reply and as a debug message with who
 * asked, the plugin at start-up as an error).  Returns -err:
 *   return snapfg_fail (EEXIST, "snapshot \"%s\" already exists", name);
 */
extern int snapfg_fail (int err, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

/* The same, always logged as an error: for failures that no caller
 * reports (found at start-up or by a background thread) but whose
 * message a caller may still want.
 */
extern int snapfg_fail_logged (int err, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

/* Debug flags, settable with nbdkit -D snapfg.lock=1 / -D snapfg.cow=1 /
 * -D snapfg.commit=1.
 * The names are part of the plugin's interface: nbdkit finds them by symbol.
 */
extern int snapfg_debug_lock;   /* per-CPU lock writer waits, stripe waits */
extern int snapfg_debug_cow;    /* copy-outs, exception publication */
extern int snapfg_debug_commit; /* group commit: batch sizes, sync latency */

#endif
