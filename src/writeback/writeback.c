/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: the requests' side (see writeback.h).  The queue
 * and its indexes are held-queue.c, the committer's rounds
 * writeback-committer.c, the held data held-file.c.
 */

#include <config.h>

#include <stdio.h>
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
#include "crc32c.h"
#include "scoped-lock.h"
#include "snapfg-log.h"

void
writeback_held_free (struct writeback *wb, struct held_write *h)
{
  held_file_release (&wb->file, h->data_off, h->data_extent);
  free (h);
}

void
writeback_held_put (struct writeback *wb, struct held_write *h)
{
  if (held_write_put (h))
    writeback_held_free (wb, h);
}

uint64_t
writeback_cost (int op, uint32_t count)
{
  return held_write_cost (op == ORIGIN_WRITE, count);
}

/* Held data is like the page cache's dirty pages for the bare file
 * plugin, except that it cannot be written back before its round is
 * durable, and it is the process's own (in held-file.c's memory file).
 * It lets a burst of first writes run at page-cache speed until
 * writeback-max is full; after that they go at the disk's speed (two
 * writes of every byte, the copy and the new data).  The kernel lets
 * dirty pages reach a tenth of the memory before it even starts writing
 * them back (dirty_background_ratio): a sixteenth keeps held data under
 * that, with room for the page cache's own.  1G (on a 2-core 24 GiB server,
 * a sixteenth would be 1.5G) takes a 300 MB/s disk about 7 s to commit
 * (two writes of every byte): more would only keep more at stake until
 * a flush.
 */
#define DEFAULT_MAX_MIN (64 * 1024 * 1024)
#define DEFAULT_MAX_MAX (1024 * 1024 * 1024)

uint64_t
snapfg_default_writeback_max (void)
{
  long pages = sysconf (_SC_PHYS_PAGES);
  long page = sysconf (_SC_PAGESIZE);
  uint64_t max;

  if (pages <= 0 || page <= 0)
    return DEFAULT_MAX_MIN;
  max = (uint64_t) pages * page / 16;
  max &= ~(uint64_t) (1024 * 1024 - 1);         /* whole MiB */
  if (max < DEFAULT_MAX_MIN)
    return DEFAULT_MAX_MIN;
  if (max > DEFAULT_MAX_MAX)
    return DEFAULT_MAX_MAX;
  return max;
}

uint64_t
writeback_max (const struct snapfg_engine *e)
{
  return e->wb ? e->wb->max : 0;
}

bool
writeback_active (const struct snapfg_engine *e)
{
  return e->wb && e->wb->running;
}

/* Memory for a held write could not be had (err): say so, and that the
 * write goes the way writeback=off takes, which needs no held copy.
 * The first time, then at every power of two, so that a machine short
 * of memory for a while logs a few lines, not one per write.
 */
static void
log_not_held (struct writeback *wb, int err, uint32_t count, uint64_t offset)
{
  uint64_t n = atomic_fetch_add (&wb->not_held, 1) + 1;

  if ((n & (n - 1)) != 0)
    return;
  snapfg_error ("origin=%s: the write of %" PRIu32 " bytes at %" PRIu64
                " could not be held in memory (%s): it is made as with "
                "writeback=off, after its snapshots' copies are durable and "
                "any held write it overlaps is applied (%" PRIu64 " write%s "
                "so far)",
                wb->e->origin.path, count, offset, strerror (err), n,
                n == 1 ? "" : "s");
}

/* A held write of the request (ready: READY at once, else COPYING), its
 * data copied into the held file.  Returns NULL with *r set (-ENOMEM,
 * or the held file's error), after log_not_held: the callers then take
 * the path that holds nothing.
 */
static struct held_write *
held_new (struct writeback *wb, int op, const void *buf, uint32_t count,
          uint64_t offset, unsigned flags, bool ready, int *r)
{
  struct held_write *h = held_write_new (op, flags & SNAPFG_REQ_MAY_TRIM,
                                         offset, count, ready);

  if (h == NULL) {
    *r = -ENOMEM;
    log_not_held (wb, ENOMEM, count, offset);
    return NULL;
  }
  h->cost = writeback_cost (op, count);
  if (op == ORIGIN_WRITE) {
    *r = engine_fail_point (wb->e, FAIL_HELD_DATA) ? -ENOMEM
      : held_file_store (&wb->file, buf, count, &h->data_off);
    if (*r < 0) {
      log_not_held (wb, -*r, count, offset);
      free (h);
      return NULL;
    }
    h->data_extent = held_file_extent (count);
    /* The record's checksum of the data, computed now, outside the
     * lock the record is written under.
     */
    h->data_crc = crc32c (0, buf, count);
  }
  return h;
}

/* The record of h in the held file: its state as a replay needs it. */
static void
record_of (const struct held_write *h, struct held_record *r)
{
  r->seq = h->seq;
  r->offset = h->offset;
  r->data_off = h->data_extent ? h->data_off : 0;
  r->count = h->count;
  r->data_crc = h->data_extent ? h->data_crc : 0;
  r->op = h->op == ORIGIN_WRITE ? HELD_OP_WRITE
    : h->op == ORIGIN_ZERO ? HELD_OP_ZERO : HELD_OP_TRIM;
  r->flags = h->flags & SNAPFG_REQ_MAY_TRIM ? HELD_FLAG_MAY_TRIM : 0;
  r->dropped = false;
}

/* Under the lock: queue h and write its record, which is in the held
 * file before the write is acknowledged (the caller acknowledges it
 * only after this), in sequence order.
 */
static void
enqueue (struct writeback *wb, struct held_write *h)
{
  struct held_record r;

  held_queue_append (&wb->q, h);
  record_of (h, &r);
  held_file_write_record (&wb->file, &r);
}

void
writeback_wake_committer (struct writeback *wb, bool urgent)
{
  /* Only then: a signal per write would cost the writers a futex call
   * each and the committer a wakeup.
   */
  if (wb->idle || (urgent && wb->gathering))
    pthread_cond_signal (&wb->work);
}

bool
writeback_round_is_full (const struct writeback *wb)
{
  return wb->q.held_bytes >= wb->max / ROUND_GATHER_FULL;
}

/* Writes that cost this much or more look for room before their copy. */
#define LOOK_FIRST_COST (128 * 1024)

/* Under the lock: is there room for cost? */
static bool
has_room (const struct writeback *wb, uint64_t cost)
{
  /* The held file's ring of records must have a slot too. */
  return held_queue_has_room (&wb->q, cost, wb->max) &&
    held_file_ring_has_room (&wb->file, wb->q.last_seq + 1,
                             wb->q.applied_seq);
}

static bool
has_room_now (struct writeback *wb, uint64_t cost)
{
  SCOPED_MUTEX_LOCK (&wb->lock);
  return has_room (wb, cost);
}

/* Queue h if there is room for it: true if queued. */
static bool
enqueue_if_room (struct writeback *wb, struct held_write *h)
{
  SCOPED_MUTEX_LOCK (&wb->lock);
  if (!has_room (wb, h->cost))
    return false;
  enqueue (wb, h);
  /* Gathering a round: start it if this makes it full (settled or not,
   * this write is not in it).
   */
  if (writeback_round_is_full (wb))
    writeback_wake_committer (wb, true);
  return true;
}

struct held_write *
writeback_hold_first (struct snapfg_engine *e, int op, const void *buf,
                      uint32_t count, uint64_t offset, unsigned flags,
                      int *r)
{
  struct writeback *wb = e->wb;
  uint64_t cost = writeback_cost (op, count);
  struct held_write *h;

  /* A large write looks first, so that a full queue costs no copy.  A
   * small one takes the lock once: when there is no room, its copy was
   * wasted.
   */
  if (cost >= LOOK_FIRST_COST && !has_room_now (wb, cost)) {
    *r = -EAGAIN;
    return NULL;
  }

  h = held_new (wb, op, buf, count, offset, flags, false, r);
  if (h == NULL) {
    *r = 1;                     /* no memory for it: not held */
    return NULL;
  }
  if (!enqueue_if_room (wb, h)) {
    writeback_held_free (wb, h);
    *r = -EAGAIN;
    return NULL;
  }
  return h;
}

void
writeback_wait_room (struct snapfg_engine *e, uint64_t cost)
{
  struct writeback *wb = e->wb;
  SCOPED_MUTEX_LOCK (&wb->lock);

  if (has_room (wb, cost))
    return;
  wb->room_waiters++;
  atomic_fetch_add (&wb->room_waits, 1);
  writeback_wake_committer (wb, true);
  /* No room means something is held or still being freed (the callers
   * only hold requests that fit in writeback-max), and the committer
   * broadcasts room once it has freed a round.
   */
  while (!has_room (wb, cost))
    pthread_cond_wait (&wb->room, &wb->lock);
  wb->room_waiters--;
}

int
writeback_ready (struct snapfg_engine *e, struct held_write *h)
{
  struct writeback *wb = e->wb;

  /* A copy of ours the committer already tried failed (REFUSED): the
   * request fails with its error (the caller cancels the write).
   */
  if (!held_write_transition (h, HELD_COPYING, HELD_READY))
    return h->error;

  /* No lock unless the committer waits for work: it says so (idle)
   * before it looks at the queue a last time, and this says ready
   * before it looks at idle, so one of the two sees the other (both
   * sequentially consistent).  Taking the lock to signal then means the
   * committer is waiting, or will be once it drops the lock.
   */
  if (atomic_load (&wb->idle)) {
    SCOPED_MUTEX_LOCK (&wb->lock);
    writeback_wake_committer (wb, false);
  }
  return 0;
}

void
writeback_copy_failed (struct snapfg_engine *e, struct held_write *h,
                       int err)
{
  /* Still copying out: the writer returns the error to its client.  The
   * error is set before the transition publishes it.
   */
  if (held_write_state (h) == HELD_COPYING) {
    h->error = err;
    if (held_write_transition (h, HELD_COPYING, HELD_REFUSED))
      return;
  }
  /* Acknowledged: the write must not reach the origin (the snapshot
   * would lose the chunk), and is not read any more; the committer
   * says so when its turn comes (the next flush or FUA on every
   * connection fails).  Refused or lost already: nothing more to do.
   */
  if (held_write_transition (h, HELD_READY, HELD_LOST))
    /* A replay must not apply it either. */
    held_file_drop_record (&e->wb->file, h->seq);
}

void
writeback_cancel (struct snapfg_engine *e, struct held_write *h)
{
  struct writeback *wb = e->wb;

  if (!held_write_transition (h, HELD_COPYING, HELD_CANCELLED))
    held_write_transition (h, HELD_REFUSED, HELD_CANCELLED);
  /* The request failed: a replay must not apply it. */
  held_file_drop_record (&wb->file, h->seq);
  SCOPED_MUTEX_LOCK (&wb->lock);
  writeback_wake_committer (wb, false);
}

/* Under the lock: wait until every held write up to seq is applied
 * (the committer starts its round at once for it).
 */
static void
wait_applied_locked (struct writeback *wb, uint64_t seq)
{
  if (wb->q.applied_seq >= seq)
    return;
  wb->flush_waiters++;
  writeback_wake_committer (wb, true);
  while (wb->q.applied_seq < seq)
    pthread_cond_wait (&wb->applied, &wb->lock);
  wb->flush_waiters--;
}

/* Under the lock: does the change overlap held writes, and may it be
 * held behind them (with room, and not FUA or a fast zero)?  Waits for
 * the writes it overlaps when it may not.
 */
enum behind { BEHIND_NOTHING, BEHIND_WAITED, BEHIND_HOLD };

static enum behind
may_hold_behind (struct writeback *wb, int op, uint32_t count,
                 uint64_t offset, unsigned flags)
{
  SCOPED_MUTEX_LOCK (&wb->lock);

  if (!held_queue_overlaps (&wb->q, offset, count))
    return BEHIND_NOTHING;
  /* FUA wants its own data on the origin, and a fast zero must be
   * refused if it is not fast: both go to the origin themselves, after
   * the writes they overlap.  So does a write with no room to be held.
   */
  if (!(flags & (SNAPFG_REQ_FUA | SNAPFG_REQ_FAST_ZERO)) &&
      has_room (wb, writeback_cost (op, count)))
    return BEHIND_HOLD;
  wait_applied_locked (wb, wb->q.last_seq);
  return BEHIND_WAITED;
}

int
writeback_order_after_held (struct snapfg_engine *e, int op, const void *buf,
                            uint32_t count, uint64_t offset, unsigned flags)
{
  struct writeback *wb = e->wb;
  struct held_write *h;
  int r;

  if (wb == NULL || atomic_load (&wb->q.nheld) == 0)
    return 0;
  if (may_hold_behind (wb, op, count, offset, flags) != BEHIND_HOLD)
    return 0;

  h = held_new (wb, op, buf, count, offset, flags, true, &r);
  {
    SCOPED_MUTEX_LOCK (&wb->lock);

    if (h == NULL) {
      /* No memory to hold it: it goes to the origin itself, after the
       * writes it overlaps, as one with no room does.
       */
      wait_applied_locked (wb, wb->q.last_seq);
      return 0;
    }
    if (held_queue_overlaps (&wb->q, offset, count) &&
        held_file_ring_has_room (&wb->file, wb->q.last_seq + 1,
                                 wb->q.applied_seq)) {
      /* Held now even past writeback-max: by at most this one write per
       * client request, since the check above found room.
       */
      enqueue (wb, h);
      writeback_wake_committer (wb, writeback_round_is_full (wb));
      return 1;
    }
  }
  /* Applied meanwhile (nothing to go after any more), or no slot for
   * its record: it goes to the origin itself, after what it overlaps.
   */
  {
    SCOPED_MUTEX_LOCK (&wb->lock);

    if (held_queue_overlaps (&wb->q, offset, count))
      wait_applied_locked (wb, wb->q.last_seq);
  }
  writeback_held_free (wb, h);
  return 0;
}

void
writeback_defer_copy (struct snapfg_engine *e, struct deferred_copy *dc)
{
  struct writeback *wb = e->wb;

  deferred_copy_link (dc, NULL);
  SCOPED_MUTEX_LOCK (&wb->lock);
  /* Counted in writeback-max until its round frees it (the committer's
   * commit); past it by at most this request's batches, since its held
   * write found room.
   */
  held_queue_charge (&wb->q, deferred_copy_size (dc));
  if (wb->round_copies_last)
    deferred_copy_link (wb->round_copies_last, dc);
  else
    wb->round_copies = dc;
  wb->round_copies_last = dc;
}

void
writeback_urge (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;

  if (wb == NULL || !wb->running)
    return;
  SCOPED_MUTEX_LOCK (&wb->lock);
  wb->copy_wanted = true;
  writeback_wake_committer (wb, true);
}

void
writeback_wait_all (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;

  if (wb == NULL || !wb->running)
    return;
  SCOPED_MUTEX_LOCK (&wb->lock);
  wait_applied_locked (wb, wb->q.last_seq);
}

void
writeback_drain (struct snapfg_engine *e)
{
  /* With the geometry write side held no copy-out is in progress: every
   * held write is settled, and the committer (which takes no geometry
   * lock) applies them all.
   */
  writeback_wait_all (e);
}

/* --- origin reads --- */

int
writeback_read_begin (struct snapfg_engine *e, uint32_t count,
                      uint64_t offset, struct held_view *v)
{
  struct writeback *wb = e->wb;

  held_view_init (v);
  if (wb == NULL || atomic_load (&wb->q.nheld) == 0)
    return 0;
  {
    SCOPED_MUTEX_LOCK (&wb->lock);
    held_queue_collect (&wb->q, offset, count, v);
  }
  if (v->failed) {
    /* Without every held write it overlaps, the read would be stale. */
    writeback_read_end (e, v, NULL, count, offset, false);
    return -ENOMEM;
  }
  return 0;
}

int
writeback_read_end (struct snapfg_engine *e, struct held_view *v, void *buf,
                    uint32_t count, uint64_t offset, bool ok)
{
  int r = 0;

  /* In queue order: a later held write wins over an earlier one.  One
   * that was applied to the origin after it was taken is laid over the
   * same data again.
   */
  for (size_t i = 0; i < v->n; ++i) {
    struct held_write *h = v->w[i];

    if (ok && r == 0) {
      uint64_t from, to;
      char *dst;

      held_view_clip (h, offset, count, &from, &to);
      dst = (char *) buf + (from - offset);
      if (h->op == ORIGIN_WRITE) {
        r = held_file_load (&e->wb->file, dst, to - from,
                            h->data_off + (from - h->offset));
        if (r < 0)
          snapfg_error ("origin=%s: read at %" PRIu64 " failed: cannot "
                        "read back the held write at %" PRIu64 ": %s",
                        e->origin.path, offset, h->offset, strerror (-r));
      }
      else
        memset (dst, 0, to - from);     /* zero, or trim (reads as zero) */
    }
    writeback_held_put (e->wb, h);
  }
  if (v->w != v->inline_w)
    free (v->w);
  return r;
}

/* --- set-up and stop --- */

/* What copy-out hands write-back (copy-out.h): it knows nothing of
 * write-back, so that the two do not call each other.
 */
static void
defer_copy_cb (void *opaque, struct deferred_copy *dc)
{
  writeback_defer_copy (opaque, dc);
}

static void
urge_cb (void *opaque)
{
  writeback_urge (opaque);
}

/* Free what writeback_open made (nothing held, no committer). */
static void
writeback_free (struct writeback *wb)
{
  held_file_forget (&wb->file);
  free (wb->replay.r);
  free (wb->replay_stores);
  free (wb->bounce);
  pthread_cond_destroy (&wb->applied);
  pthread_cond_destroy (&wb->room);
  pthread_cond_destroy (&wb->work);
  pthread_mutex_destroy (&wb->lock);
  free (wb);
}

int
writeback_bound_stores (struct snapfg_engine *e,
                        char (**stores)[HELD_UUID_LEN], uint32_t *n)
{
  *n = 0;
  *stores = calloc (e->nsnapshots ? e->nsnapshots : 1, sizeof **stores);
  if (*stores == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < e->nsnapshots; ++i) {
    const char *uuid = e->snapshots[i]->store->uuid;

    if (uuid[0])
      snprintf ((*stores)[(*n)++], HELD_UUID_LEN, "%s", uuid);
  }
  return 0;
}

int
writeback_bind_stores (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;
  char (*stores)[HELD_UUID_LEN];
  uint32_t n;
  int r;

  if (wb == NULL || !wb->file_ours)
    return 0;
  r = writeback_bound_stores (e, &stores, &n);
  if (r == 0)
    r = held_file_set_stores (&wb->file, stores, n);
  free (stores);
  if (r < 0)
    snapfg_error ("writeback: cannot bind the held file %s to the %" PRIu32
                  " snapshot stores: %s", wb->file.path, n, strerror (-r));
  return r;
}

/* The held file: one left by an unclean stop is checked and kept for
 * the replay (writeback_replay); otherwise, with write-back on, a new one
 * is made.
 */
static int
open_held_file (struct writeback *wb, const struct writeback_options *o)
{
  struct held_place place = { .dir = o->held_dir, .on_disk = o->held_on_disk };
  struct held_header hdr;
  int r;

  r = held_file_place (&wb->file, &place, &wb->binding);
  if (r < 0) {
    /* With write-back off nothing is held: only a held file left by an
     * earlier start with it on would need the directory.
     */
    if (!wb->enabled && o->held_dir == NULL)
      return 0;
    return r;
  }
  r = held_file_exists (&wb->file);
  if (r < 0)
    return r;
  if (r == 1) {
    r = held_file_open_existing (&wb->file, &wb->binding, &wb->replay, &hdr);
    if (r < 0)
      return r;
    if (r == 1) {
      /* Every write in it was applied: it goes, and a new one is made. */
      snapfg_notice ("held file %s: left by an earlier start, with no "
                     "write to replay: removed", wb->file.path);
      free (wb->replay.r);
      wb->replay.r = NULL;
      held_file_close (&wb->file, true);
      goto create;
    }
    if (wb->e->origin.readonly) {
      snapfg_error ("held file %s: the origin is open read-only, so its "
                    "%zu held writes cannot be replayed: start once "
                    "read-write", wb->file.path, wb->replay.n);
      return -EROFS;
    }
    wb->replay_nstores = hdr.nstores;
    wb->replay_stores = malloc ((hdr.nstores ? hdr.nstores : 1) *
                                sizeof *wb->replay_stores);
    if (wb->replay_stores == NULL)
      return -ENOMEM;
    memcpy (wb->replay_stores, hdr.stores,
            hdr.nstores * sizeof *wb->replay_stores);
    wb->replay_pending = true;
    return 0;
  }
 create:
  if (!wb->enabled)
    return 0;
  r = held_file_create (&wb->file, &wb->binding, NULL, 0);
  if (r < 0)
    return r;
  wb->file_ours = true;
  return 0;
}

int
writeback_open (struct snapfg_engine *e, const struct writeback_options *o)
{
  struct writeback *wb = calloc (1, sizeof *wb);
  struct device_identity id = { 0, 0 };
  pthread_condattr_t ca;
  int r;

  if (wb == NULL)
    return -ENOMEM;
  wb->e = e;
  wb->enabled = o->on && !e->origin.readonly;
  wb->max = o->max;
  pthread_mutex_init (&wb->lock, NULL);
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);   /* the gathering */
  pthread_cond_init (&wb->work, &ca);
  pthread_condattr_destroy (&ca);
  pthread_cond_init (&wb->room, NULL);
  pthread_cond_init (&wb->applied, NULL);
  held_queue_init (&wb->q);
  wb->file.fd = -1;
  wb->file.dirfd = -1;
  wb->binding.origin_path = e->origin.path;
  wb->binding.has_identity = device_identity (&e->origin, &id);
  wb->binding.origin_dev = id.dev;
  wb->binding.origin_ino = id.ino;
  wb->binding.origin_size = e->size;
  wb->binding.origin_moved = e->origin_moved;
  wb->binding.max_stores = e->max_snapshots;
  r = open_held_file (wb, o);
  if (r < 0) {
    writeback_free (wb);
    return r;
  }
  /* Page-aligned, as a device opened with O_DIRECT may want. */
  if (wb->enabled && posix_memalign (&wb->bounce, 4096, BOUNCE_SIZE) != 0) {
    held_file_close (&wb->file, wb->file_ours);
    writeback_free (wb);
    return -ENOMEM;
  }
  e->wb = wb;
  e->copy_deferral.defer = defer_copy_cb;
  e->copy_deferral.urge = urge_cb;
  e->copy_deferral.opaque = e;
  return 0;
}

int
writeback_start (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;
  int err;

  if (wb == NULL || !wb->enabled || wb->running)
    return 0;
  err = pthread_create (&wb->thread, NULL, writeback_committer, wb);
  if (err) {
    snapfg_error ("writeback=on: cannot start the committer thread: %s",
                  strerror (err));
    return -err;
  }
  /* Its name shows in top -H and ps -L. */
  pthread_setname_np (wb->thread, "snapfg-commit");
  wb->running = true;
  return 0;
}

void
writeback_close (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;

  if (wb == NULL)
    return;
  if (wb->running) {
    {
      SCOPED_MUTEX_LOCK (&wb->lock);
      atomic_store (&wb->stop, true);
      pthread_cond_signal (&wb->work);  /* idle or gathering */
    }
    pthread_join (wb->thread, NULL);
    wb->running = false;
  }
  deferred_copy_free (wb->paused_copies); /* none: a stop commits them */
  memset (&e->copy_deferral, 0, sizeof e->copy_deferral);
  /* Everything held was applied: the file goes, unless it is one left
   * by an unclean stop that was never replayed (the next start does).
   */
  held_file_close (&wb->file, wb->file_ours);
  writeback_free (wb);
  e->wb = NULL;
}

/* --- what the plugin and the control socket see --- */

void
snapfg_writeback_stats (struct snapfg_engine *e,
                        struct snapfg_writeback_stats *ws)
{
  struct writeback *wb = e->wb;

  memset (ws, 0, sizeof *ws);
  if (wb == NULL)
    return;
  ws->enabled = wb->enabled;
  ws->max_bytes = wb->max;
  {
    SCOPED_MUTEX_LOCK (&wb->lock);
    ws->held_bytes = wb->q.held_bytes;
    ws->held_writes = wb->q.held_writes;
    ws->waiting = wb->room_waiters;
  }
  ws->rounds = atomic_load (&wb->rounds);
  ws->round_exceptions = atomic_load (&wb->round_exceptions);
  ws->max_round = atomic_load (&wb->max_round);
  ws->room_waits = atomic_load (&wb->room_waits);
  ws->origin_errors = atomic_load (&wb->origin_errors);
  ws->errors_unseen = snapfg_writeback_errors_unseen (e);
}

/* snapfg_writeback_errors and snapfg_writeback_check: writeback-errors.c */
