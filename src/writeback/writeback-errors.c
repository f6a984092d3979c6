/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: who hears of a held write that failed after its
 * acknowledgement (snapfg_writeback_errors, _sample and _check in
 * engine.h).
 *
 * An error sequence, as the kernel keeps one per file for errors of
 * write-back to its pages: origin_errors counts the failures, and
 * errors_seen is the count as a flush or FUA request last reported it.
 * A connection remembers the count it last reported.  A new one starts
 * at errors_seen, not at the count: an error that nobody has reported
 * yet (the writer disconnected without a flush, as nbdcopy does by
 * default) fails the next flush or FUA request of whoever comes.  Once
 * one connection has reported it, it is seen: connections opened after
 * that do not report it again, those opened before still do (each
 * once).
 */

#include <config.h>

#include <errno.h>

#include "writeback-internal.h"
#include "writeback.h"

uint64_t
snapfg_writeback_errors (struct snapfg_engine *e)
{
  return e->wb ? atomic_load (&e->wb->origin_errors) : 0;
}

uint64_t
snapfg_writeback_errors_sample (struct snapfg_engine *e)
{
  return e->wb ? atomic_load (&e->wb->errors_seen) : 0;
}

uint64_t
snapfg_writeback_errors_unseen (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;
  uint64_t seen, now;

  if (wb == NULL)
    return 0;
  /* errors_seen first: it never passes origin_errors. */
  seen = atomic_load (&wb->errors_seen);
  now = atomic_load (&wb->origin_errors);
  return now - seen;
}

int
snapfg_writeback_check (struct snapfg_engine *e, uint64_t *seen)
{
  struct writeback *wb = e->wb;
  uint64_t now, was;

  if (wb == NULL)
    return 0;
  now = atomic_load (&wb->origin_errors);
  if (now == *seen)
    return 0;
  *seen = now;
  /* Reported: seen up to now (others may have reported more). */
  was = atomic_load (&wb->errors_seen);
  while (was < now &&
         !atomic_compare_exchange_weak (&wb->errors_seen, &was, now))
    ;
  return -EIO;
}
