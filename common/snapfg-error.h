/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the current thread's last error, recorded by the function that
 * found it.
 *
 * A failing function returns a negative errno; the words that say what
 * is wrong (which file, which name, what to do) are recorded here by the
 * function that knows them, so that the caller who must tell someone (the
 * control server's reply, the plugin at start-up) can say exactly that
 * without parsing the log.  Recording is not logging: snapfg-log.h says
 * what goes to the log, and snapfg_fail there does both in one call.
 *
 * The record is thread-local: the engine also fails on nbdkit's worker
 * threads and its own background threads, and one thread's failure must
 * not become another's message.  (In the dlopened plugin a _Thread_local
 * object uses the dynamic TLS model: allocated per thread on first use,
 * so its size costs no static TLS space.)
 */
#ifndef SNAPFG_ERROR_H
#define SNAPFG_ERROR_H

#include <stdarg.h>
#include <stdbool.h>

/* The longest message kept (longer ones are cut, ending in "..."). */
#define SNAPFG_ERROR_MAX 1024

/* Record a failure as this thread's last error: err is a positive errno
 * (0 is taken as EIO: a failure always has one), fmt a printf format
 * (%m is not expanded: pass strerror).  Replaces any earlier record.
 * Returns -err, so that a failure is recorded and returned in one line:
 *   return snapfg_set_error (EINVAL, "chunk-size=%u: %s", n, problem);
 */
extern int snapfg_set_error (int err, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
extern int snapfg_set_error_v (int err, const char *fmt, va_list args)
  __attribute__ ((format (printf, 2, 0)));

/* Note that the current record's message is already in the log as an
 * error (snapfg_fail does this), so that the caller does not log it
 * again.
 */
extern void snapfg_error_set_logged (void);

/* Forget the record: before a call whose failure the caller will
 * report, so that an older failure is not taken for its own.
 */
extern void snapfg_clear_error (void);

/* The recorded message, or NULL if nothing failed since the last
 * snapfg_clear_error.  Valid until the next record on this thread.
 */
extern const char *snapfg_get_error (void);
/* The recorded errno (positive), 0 if none. */
extern int snapfg_get_errno (void);
/* Whether the recorded message is in the log already. */
extern bool snapfg_error_logged (void);

/* Is a failure with this errno the server's trouble (its disks, its
 * memory: something for the log, as an error) rather than a refusal of
 * what was asked (no such name, already exists, invalid argument: the
 * asker's business)?
 */
extern bool snapfg_is_server_trouble (int err);

#endif
