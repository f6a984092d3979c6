/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: logging for the engine.
 *
 * The engine is a library used by the nbdkit plugin, by snapfgctl and by
 * unit tests, so it cannot call nbdkit_error directly.  The plugin installs
 * nbdkit's functions here; everyone else gets stderr.
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

/* A per-thread hook that takes every error logged on this thread
 * instead of the error sink: the control server puts the message in its
 * reply and then logs it itself, as a debug message when the client's
 * request was at fault, else as an error.
 */
extern void snapfg_set_thread_error_hook (snapfg_vlog_fn hook);

extern void snapfg_error (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
extern void snapfg_debug (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
extern void snapfg_notice (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));

/* Debug flags, settable with nbdkit -D snapfg.lock=1 / -D snapfg.cow=1 /
 * -D snapfg.commit=1.
 * The names are part of the plugin's interface: nbdkit finds them by symbol.
 */
extern int snapfg_debug_lock;   /* per-CPU lock writer waits, stripe waits */
extern int snapfg_debug_cow;    /* copy-outs, exception publication */
extern int snapfg_debug_commit; /* group commit: batch sizes, sync latency */

#endif
