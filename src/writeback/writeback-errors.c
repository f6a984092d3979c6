/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: who hears of a held write that failed after its
 * acknowledgement (snapfg_writeback_errors, _sample and _check in
 * engine.h).
 *
 * An error sequence, as the kernel keeps one per file for errors of
 * write-back to its pages, but counted in held writes' sequence numbers
 * rather than in failures.  The committer applies held writes in
 * sequence order, so it meets their failures in that order: failed_seq,
 * the sequence number of the latest, also says that every failure
 * before it is known.  A connection remembers the sequence number up to
 * which it has been told of every failure (told); a flush or FUA request
 * fails if a failure lies past what its connection had been told when
 * the request began, and then the connection has been told up to
 * failed_seq.
 *
 * "When the request began", not "when it looks": two flushes in flight
 * on one connection, both sent after a write that then failed, must
 * both fail, since neither was sent knowing of the failure and each
 * success would say that the write is durable.  Counting the failure as
 * reported by whichever looked first let the other succeed (a power cut
 * then lost writes that a completed flush covered).
 *
 * A new connection starts at told_seq, the point up to which every
 * failure has been reported to someone, not at failed_seq: an error
 * that nobody has reported yet (the writer disconnected without a
 * flush, as nbdcopy does by default) fails the next flush or FUA request
 * of whoever comes.  Once one connection has reported it, it is seen:
 * connections opened after that do not report it again, those opened
 * before still do (each once, but in every request already in flight).
 *
 * origin_errors and errors_seen count the same failures for stats
 * (writeback_errors_unseen); both, with failed_seq and told_seq, change
 * under the write-back lock, so that they agree.
 */

#include <config.h>

#include <errno.h>

#include "writeback-internal.h"
#include "writeback.h"
#include "scoped-lock.h"

uint64_t
snapfg_writeback_errors (struct snapfg_engine *e)
{
  return e->wb ? atomic_load (&e->wb->origin_errors) : 0;
}

uint64_t
snapfg_writeback_errors_sample (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;

  if (wb == NULL)
    return 0;
  SCOPED_MUTEX_LOCK (&wb->lock);
  return wb->told_seq;
}

uint64_t
snapfg_writeback_errors_unseen (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;

  if (wb == NULL)
    return 0;
  SCOPED_MUTEX_LOCK (&wb->lock);
  return atomic_load (&wb->origin_errors) - atomic_load (&wb->errors_seen);
}

int
snapfg_writeback_check (struct snapfg_engine *e, uint64_t *told,
                        uint64_t told_at_start)
{
  struct writeback *wb = e->wb;

  if (wb == NULL)
    return 0;
  SCOPED_MUTEX_LOCK (&wb->lock);
  if (wb->failed_seq <= told_at_start)
    return 0;
  /* Reported to this connection: every failure up to failed_seq.
   * (Stored atomically: the connection's other requests load it
   * without the lock when they begin.)
   */
  if (__atomic_load_n (told, __ATOMIC_RELAXED) < wb->failed_seq)
    __atomic_store_n (told, wb->failed_seq, __ATOMIC_RELEASE);
  if (wb->told_seq < wb->failed_seq) {
    wb->told_seq = wb->failed_seq;
    atomic_store (&wb->errors_seen, atomic_load (&wb->origin_errors));
  }
  return -EIO;
}
