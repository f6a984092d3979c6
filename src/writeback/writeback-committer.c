/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: the committer thread's rounds.
 *
 * A round: copy and publish the copy-out batches queued so far, commit
 * them (one commit per snapshot for the round), then apply the settled
 * front of the queue to the origin in sequence order and retire it.  No
 * held write reaches the origin before the round that made its
 * exceptions durable (docs/design.md section 5).
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "writeback-internal.h"
#include "writeback.h"
#include "copy-out.h"
#include "scoped-lock.h"
#include "snapfg-log.h"

/* Under the lock: should the committer start the round now rather than
 * gather more?
 */
static bool
round_wanted_now (const struct writeback *wb)
{
  return wb->flush_waiters || wb->room_waiters || wb->copy_wanted ||
    atomic_load (&wb->stop) || writeback_round_is_full (wb);
}

/* Under the lock: take the queued copy-out batches. */
static struct deferred_copy *
take_copies (struct writeback *wb)
{
  struct deferred_copy *copies = wb->round_copies;

  wb->round_copies = wb->round_copies_last = NULL;
  wb->copy_wanted = false;
  return copies;
}

/* A held write whose copy could not read the origin (copy-out.h). */
static void
copy_failed_cb (void *opaque, void *owner, int err)
{
  writeback_copy_failed (opaque, owner, err);
}

/* Copy and publish a round's copy-out batches (copy-out.h).  A failed
 * COW write makes that snapshot Invalid (as dm does when a copy fails)
 * and the origin writes go ahead; a failed origin read keeps the
 * snapshot and drops the held writes over the chunks it could not copy
 * (writeback_copy_failed), before the publish lets their waiters on.
 */
static void
copy_round (struct writeback *wb, struct deferred_copy *copies)
{
  if (copies == NULL)
    return;
  deferred_copy_write (copies);
  deferred_copy_each_read_failure (copies, copy_failed_cb, wb->e);
  deferred_copy_publish (copies);
}

/* Make them durable, with those published while paused (linked before
 * 'copies' by the caller).
 */
static void
commit_round (struct writeback *wb, struct deferred_copy *list)
{
  size_t committed;
  uint64_t freed;

  if (list == NULL)
    return;
  committed = deferred_copy_commit (list);
  freed = deferred_copy_free (list);
  {
    SCOPED_MUTEX_LOCK (&wb->lock);
    held_queue_charge (&wb->q, -(int64_t) freed);
    pthread_cond_broadcast (&wb->room);
  }
  if (committed) {
    uint64_t max = atomic_load (&wb->max_round);

    atomic_fetch_add (&wb->rounds, 1);
    atomic_fetch_add (&wb->round_exceptions, committed);
    while (committed > max &&
           !atomic_compare_exchange_weak (&wb->max_round, &max, committed))
      ;
  }
}

/* Append list b to list a; returns the joined list. */
static struct deferred_copy *
join_copies (struct deferred_copy *a, struct deferred_copy *a_last,
             struct deferred_copy *b)
{
  if (a == NULL)
    return b;
  deferred_copy_link (a_last, b);
  return a;
}

/* Apply the settled writes from h on, up to APPLY_BATCH of them and no
 * further than last.  Returns the last one applied.
 *
 * Their data comes back from the held file into the committer's buffer
 * (bounce), neighbours together: writes held one after another lie side
 * by side in the file, and reading a run of them costs one pread, about
 * what a single 4 KiB one does.  A write larger than the buffer is
 * applied a buffer at a time (readers lay the whole held write over
 * what they read until it is retired, so nobody sees it half done).
 */
#define APPLY_BATCH 256

/* What the buffer holds now: [from, to) of the held file. */
struct bounce_window {
  uint64_t from, to;
};

/* The end (in the held file) of h's data and of its neighbours after it
 * in the batch (at most n more, none past last) that fit in the buffer
 * together.
 */
static uint64_t
run_end (struct held_write *h, struct held_write *last, unsigned n)
{
  uint64_t from = h->data_off, to = h->data_off + h->count;
  uint64_t next_off = h->data_off + h->data_extent;

  while (h != last && n-- > 0) {
    h = h->next;
    if (h->data_extent == 0 || h->data_off != next_off ||
        h->data_off + h->count - from > BOUNCE_SIZE)
      break;
    to = h->data_off + h->count;
    next_off = h->data_off + h->data_extent;
  }
  return to;
}

/* Write h's data to the origin.  Returns 0 or -errno (logged). */
static int
apply_data (struct writeback *wb, struct held_write *h,
            struct held_write *last, unsigned left,
            struct bounce_window *win)
{
  struct snapfg_engine *e = wb->e;
  uint32_t done = 0;
  int r;

  if (h->data_off >= win->from && h->data_off + h->count <= win->to)
    return origin_apply_change (e, h->op,
                                (char *) wb->bounce + (h->data_off - win->from),
                                h->count, h->offset, h->flags);
  while (done < h->count) {
    uint32_t n = h->count - done;
    uint64_t to;

    if (n > BOUNCE_SIZE)
      n = BOUNCE_SIZE;
    to = done == 0 && n == h->count
      ? run_end (h, last, left) : h->data_off + done + n;
    win->from = win->to = 0;
    r = held_file_load (&wb->file, wb->bounce, to - (h->data_off + done),
                        h->data_off + done);
    if (r < 0) {
      snapfg_error ("origin=%s: write of %" PRIu32 " bytes at %" PRIu64
                    " was acknowledged but is not applied: its held data "
                    "cannot be read back: %s; the next flush fails",
                    e->origin.path, h->count, h->offset, strerror (-r));
      return r;
    }
    win->from = h->data_off + done;
    win->to = to;
    r = origin_apply_change (e, h->op, wb->bounce, n, h->offset + done,
                             h->flags);
    if (r < 0)
      return r;                 /* logged by origin_apply_change */
    done += n;
  }
  return 0;
}

/* The test hook's failed origin write (SNAPFG_TEST_FAIL_AT=held-apply),
 * logged as origin_apply_change logs a real one.
 */
static int
held_apply_failed (struct snapfg_engine *e, const struct held_write *h)
{
  snapfg_error ("origin=%s: %s of %" PRIu32 " bytes at %" PRIu64
                " failed: %s (test hook)", e->origin.path,
                origin_op_name (h->op), h->count, h->offset,
                strerror (EIO));
  return -EIO;
}

/* The held writes of a batch that failed after their acknowledgement:
 * how many, and the sequence number of the last.
 */
struct batch_failures {
  uint64_t n, last_seq;
};

static void
batch_failed (struct batch_failures *f, const struct held_write *h)
{
  f->n++;
  f->last_seq = h->seq;
}

static struct held_write *
apply_batch (struct writeback *wb, struct held_write *h,
             struct held_write *last, struct batch_failures *failed)
{
  struct snapfg_engine *e = wb->e;
  struct bounce_window win = { 0, 0 };

  for (unsigned n = 1; ; ++n, h = h->next) {
    enum held_state state = held_write_state (h);

    if (state == HELD_LOST) {
      snapfg_error ("origin=%s: %s of %" PRIu32 " bytes at %" PRIu64
                    " was acknowledged but is not applied: reading the "
                    "old data for a snapshot failed; the next flush "
                    "fails", e->origin.path, origin_op_name (h->op),
                    h->count, h->offset);
      batch_failed (failed, h);
    }
    else if (state == HELD_READY) {
      int r = engine_fail_point (e, FAIL_HELD_APPLY) ? held_apply_failed (e, h)
        : h->data_extent ? apply_data (wb, h, last, APPLY_BATCH - n, &win)
        : origin_apply_change (e, h->op, NULL, h->count, h->offset,
                               h->flags);
      if (r < 0)
        /* Logged; the next flush or FUA on every connection fails. */
        batch_failed (failed, h);
    }
    /* HELD_CANCELLED: never applied. */
    if (h == last || n == APPLY_BATCH)
      return h;
  }
}

/* Take the applied writes first .. last (the front of the queue) out of
 * the queue and its indexes, then free them; the failures among them
 * are published with applied_seq.  Without the lock on entry and
 * return.
 */
static void
retire_batch (struct writeback *wb, struct held_write *first,
              struct held_write *last, const struct batch_failures *failed)
{
  struct held_write *h, *next;
  uint64_t freed, run_off = 0, run_len = 0;

  /* The held file says they were applied before they leave the
   * indexes: from then on a write to the same range may go straight to
   * the origin, and a replay after a crash must not undo it.
   */
  held_file_mark_applied (&wb->file, last->seq);
  {
    SCOPED_MUTEX_LOCK (&wb->lock);
    /* Before the flushes waiting for these writes can look: a flush
     * that waited for one of them sees its failure (writeback-errors.c).
     */
    if (failed->n) {
      wb->failed_seq = failed->last_seq;
      atomic_fetch_add (&wb->origin_errors, failed->n);
    }
    freed = held_queue_remove_front (&wb->q, first, last);
    pthread_cond_broadcast (&wb->applied);
  }

  /* Freed with the lock dropped.  Nobody else follows the chain from
   * first to last any more (readers hold references of their own, and
   * last->next is no writer's tail now).  Neighbours in the held file
   * give their pages back together.  The room is given back only once
   * the memory is: were it given back first, writers could hold a new
   * round's worth while this one is still allocated, and the peak would
   * reach twice writeback-max.
   */
  for (h = first; ; h = next) {
    bool end = h == last;

    next = h->next;
    /* Only the queue's reference: no reader can take one now (it is out
     * of the queue and the read index).
     */
    if (atomic_load (&h->refs) == 1) {
      if (run_len && h->data_off == run_off + run_len)
        run_len += h->data_extent;
      else if (h->data_extent) {
        held_file_release (&wb->file, run_off, run_len);
        run_off = h->data_off;
        run_len = h->data_extent;
      }
      free (h);
    }
    else
      writeback_held_put (wb, h);
    if (end)
      break;
  }
  held_file_release (&wb->file, run_off, run_len);
  SCOPED_MUTEX_LOCK (&wb->lock);
  held_queue_charge (&wb->q, -(int64_t) freed);
  pthread_cond_broadcast (&wb->room);
}

/* Under the lock: wait until there is work (a settled write at the
 * front, copy-out batches, or a stop with nothing held).
 */
static void
wait_for_work (struct writeback *wb)
{
  for (;;) {
    atomic_store (&wb->idle, true);     /* before the look: see ready */
    if ((wb->q.head && held_write_settled (wb->q.head)) || wb->round_copies ||
        (atomic_load (&wb->stop) && !wb->q.head))
      break;
    pthread_cond_wait (&wb->work, &wb->lock);
  }
  atomic_store (&wb->idle, false);
}

/* Under the lock: gather the round for up to ROUND_GATHER_NS unless
 * somebody waits for it.
 */
static void
gather_round (struct writeback *wb)
{
  struct timespec until;

  if (round_wanted_now (wb))
    return;
  clock_gettime (CLOCK_MONOTONIC, &until);
  until.tv_nsec += ROUND_GATHER_NS;
  if (until.tv_nsec >= 1000000000) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000;
  }
  wb->gathering = true;
  while (!round_wanted_now (wb) &&
         pthread_cond_timedwait (&wb->work, &wb->lock, &until) == 0)
    ;
  wb->gathering = false;
}

/* Under the lock (dropped and taken again): paused by the test hook
 * (engine_writeback_paused): no held write reaches the origin, but
 * copy-out batches are done once a writer waits for one of their chunks,
 * so that it goes on (as a slow disk would let it).  Only then, so that
 * a test decides when the copies are made.
 */
static void
paused_round (struct writeback *wb)
{
  struct deferred_copy *last_copy = wb->round_copies_last;
  struct deferred_copy *copies = wb->copy_wanted ? take_copies (wb) : NULL;

  pthread_mutex_unlock (&wb->lock);
  copy_round (wb, copies);
  usleep (10000);
  pthread_mutex_lock (&wb->lock);
  if (copies)
    wb->paused_copies = join_copies (copies, last_copy, wb->paused_copies);
}

/* Without the lock: one round. */
static void
run_round (struct writeback *wb, struct held_write *first)
{
  struct held_write *last = first ? held_queue_settled_end (first) : NULL;
  struct deferred_copy *last_copy, *paused, *copies;

  /* The batches are taken after the walk saw the writes settled: theirs
   * were queued before that.  Others' early is harmless, and is what
   * lets a write waiting for one of their chunks go on.
   */
  {
    SCOPED_MUTEX_LOCK (&wb->lock);
    last_copy = wb->round_copies_last;
    paused = wb->paused_copies;
    wb->paused_copies = NULL;
    copies = take_copies (wb);
  }
  copy_round (wb, copies);
  commit_round (wb, join_copies (copies, last_copy, paused));

  /* Applied, taken out of the queue and freed APPLY_BATCH at a time:
   * the lock is held for that many at most (a round can be hundreds of
   * thousands), so readers and writers get it in between, and the room
   * and the flushes waiting for them come as each part lands.
   */
  for (struct held_write *h = first; h; ) {
    struct batch_failures failed = { 0, 0 };
    struct held_write *batch_last = apply_batch (wb, h, last, &failed);
    struct held_write *next = batch_last == last ? NULL : batch_last->next;

    retire_batch (wb, h, batch_last, &failed);
    h = next;
  }
}

void *
writeback_committer (void *arg)
{
  struct writeback *wb = arg;

  pthread_mutex_lock (&wb->lock);
  for (;;) {
    struct held_write *first;

    wait_for_work (wb);
    if (wb->q.head == NULL && wb->round_copies == NULL)
      break;                    /* stopping, and nothing is held */
    gather_round (wb);
    if (!atomic_load (&wb->stop) && engine_writeback_paused (wb->e)) {
      paused_round (wb);
      continue;
    }
    /* This round: the settled writes at the front of the queue (maybe
     * none: a write waiting for a batch's chunk is not settled), and
     * every copy-out batch queued so far.
     */
    first = wb->q.head && held_write_settled (wb->q.head) ? wb->q.head : NULL;
    pthread_mutex_unlock (&wb->lock);
    run_round (wb, first);
    pthread_mutex_lock (&wb->lock);
  }
  pthread_mutex_unlock (&wb->lock);
  return NULL;
}
