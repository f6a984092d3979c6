/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: merging a snapshot back into its origin (dm's snapshot-merge).
 *
 * The origin view becomes the snapshot's view at once: origin requests
 * to chunks that still have an exception go to the COW store (reads and
 * writes alike), the rest to the origin.  A thread copies the chunks
 * back, last exception first, in batches:
 *
 *   1. mark the batch's chunks pending: origin requests to them wait;
 *   2. wait until requests already routed to their COW copies finish
 *      (they are tracked like snapshot reads);
 *   3. copy COW → origin and make the origin durable;
 *   4. remove the batch's pairs from the end of the on-disk table,
 *      durably (a crash before this re-copies the batch: harmless);
 *   5. drop the in-memory exceptions and retire the pending ones.
 *
 * The store's header carries a merge mark, so a restart resumes.  When
 * the table is empty the snapshot is gone.  Merging needs a persistent
 * store and the snapshot to be the origin's only one (so no origin write
 * needs a copy-out meanwhile).
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <unistd.h>

#include "engine-internal.h"
#include "lifecycle.h"
#include "merge.h"
#include "checkpoint.h"
#include "scoped-lock.h"
#include "snapfg-log.h"

#define MERGE_BATCH 16

/* --- origin requests during a merge --- */

static int
origin_piece (struct snapfg_engine *e, enum origin_op op, void *buf,
              uint32_t n, uint64_t offset, unsigned flags)
{
  switch (op) {
  case ORIGIN_READ:
    return device_pread (&e->origin, buf, n, offset);
  case ORIGIN_WRITE:
    return device_pwrite (&e->origin, buf, n, offset);
  case ORIGIN_ZERO:
    return device_zero (&e->origin, n, offset,
                        flags & SNAPFG_REQ_MAY_TRIM, false);
  case ORIGIN_TRIM: {
    int r = device_punch (&e->origin, n, offset);
    return r == -EOPNOTSUPP ? 0 : r;
  }
  }
  return -EINVAL;
}

static int
cow_piece (struct snapfg_snapshot *s, enum origin_op op, void *buf,
           uint32_t n, uint64_t offset)
{
  struct snapfg_store *st = s->store;

  switch (op) {
  case ORIGIN_READ:
    return device_pread (&st->dev, buf, n, offset);
  case ORIGIN_WRITE:
    return device_pwrite (&st->dev, buf, n, offset);
  case ORIGIN_ZERO:
    return device_pwrite (&st->dev, s->engine->zeroes, n, offset);
  case ORIGIN_TRIM:
    return 0;                   /* advisory; the chunk is merged as it is */
  }
  return -EINVAL;
}

int
merge_origin_io (struct snapfg_engine *e, enum origin_op op, void *buf,
                 uint32_t count, uint64_t offset, unsigned flags)
{
  struct snapfg_snapshot *s = e->merging;
  const uint64_t mask = s->chunk_size - 1, end = offset + count;
  char *p = buf;
  int r = 0;

  for (uint64_t pos = offset; pos < end && r == 0; ) {
    uint64_t chunk = pos >> s->chunk_shift, new_chunk;
    uint32_t n = s->chunk_size - (pos & mask);
    struct exception_stripe *stripe = exception_table_stripe (&s->table,
                                                              chunk);
    struct tracked_read tr;
    bool remapped;

    if (n > end - pos)
      n = end - pos;
    exception_stripe_lock (stripe);
    while (exception_stripe_is_pending (stripe, chunk))
      exception_stripe_wait (stripe);           /* being merged right now */
    remapped = exception_stripe_lookup (stripe, chunk, &new_chunk);
    if (remapped)
      exception_stripe_track_read (stripe, &tr, chunk);
    exception_stripe_unlock (stripe);

    if (remapped) {
      r = cow_piece (s, op, p, n,
                     store_chunk_offset (s->store, new_chunk) + (pos & mask));
      exception_stripe_lock (stripe);
      exception_stripe_untrack_read (stripe, &tr);
      exception_stripe_unlock (stripe);
    }
    else
      r = origin_piece (e, op, p, n, pos, flags);
    pos += n;
    if (p)
      p += n;
  }
  if (r == 0 && (flags & SNAPFG_REQ_FUA) && op != ORIGIN_READ) {
    r = s->store->ops->flush (s->store);
    if (r == 0)
      r = device_flush (&e->origin);
  }
  return r;
}

/* --- the merge thread --- */

static int
copy_back (struct snapfg_snapshot *s, const struct store_pair *pair,
           void *buf)
{
  struct snapfg_engine *e = s->engine;
  uint64_t start = pair->old_chunk << s->chunk_shift;
  uint64_t len = s->chunk_size;
  int r;

  if (start >= e->size)
    return 0;                   /* cannot happen: checked at load */
  if (start + len > e->size)
    len = e->size - start;
  r = device_pread (&s->store->dev, buf, len,
                    store_chunk_offset (s->store, pair->new_chunk));
  if (r == 0) {
    /* The origin's data changes here (its view changed when the merge
     * began, and was tracked then): the active checkpoint records it
     * too, before the write.
     */
    checkpoint_track_unlocked (e, start, len);
    r = device_pwrite (&e->origin, buf, len, start);
  }
  return r;
}

/* Steps 1 and 2: own the batch's chunks. */
static int
claim_batch (struct snapfg_snapshot *s, const struct store_pair *pairs,
             size_t n, struct pending_exception *pe)
{
  for (size_t i = 0; i < n; ++i) {
    struct exception_stripe *stripe =
      exception_table_stripe (&s->table, pairs[i].old_chunk);
    int r;

    exception_stripe_lock (stripe);
    while ((r = exception_stripe_add_pending (&s->table, stripe, &pe[i],
                                              pairs[i].old_chunk)) == -EAGAIN) {
      exception_stripe_unlock (stripe);
      r = exception_stripe_grow (stripe);
      if (r < 0) {
        /* Give back what we took. */
        while (i-- > 0) {
          stripe = exception_table_stripe (&s->table, pairs[i].old_chunk);
          exception_stripe_lock (stripe);
          exception_stripe_retire (stripe, &pe[i]);
          exception_stripe_unlock (stripe);
        }
        return r;
      }
      exception_stripe_lock (stripe);
    }
    while (exception_stripe_has_tracked_reads (stripe, pairs[i].old_chunk))
      exception_stripe_wait (stripe);
    exception_stripe_unlock (stripe);
  }
  return 0;
}

/* Step 5, or undoing steps 1-2 (merged = false). */
static void
release_batch (struct snapfg_snapshot *s, const struct store_pair *pairs,
               size_t n, struct pending_exception *pe, bool merged)
{
  for (size_t i = 0; i < n; ++i) {
    struct exception_stripe *stripe =
      exception_table_stripe (&s->table, pairs[i].old_chunk);

    exception_stripe_lock (stripe);
    if (merged)
      exception_stripe_remove (stripe, pairs[i].old_chunk);
    exception_stripe_retire (stripe, &pe[i]);
    exception_stripe_unlock (stripe);
  }
}

/* The snapshot is fully merged: it is gone. */
static void
finish_merge (struct snapfg_snapshot *s)
{
  struct snapfg_engine *e = s->engine;
  bool listed = false;

  s->store->ops->merge_end (s->store);
  percpu_rwlock_write_lock (&e->geometry);
  e->merging = NULL;
  for (size_t i = 0; i < e->nsnapshots; ++i) {
    if (e->snapshots[i] == s) {
      memmove (&e->snapshots[i], &e->snapshots[i + 1],
               (e->nsnapshots - i - 1) * sizeof *e->snapshots);
      e->nsnapshots--;
      listed = true;
      break;
    }
  }
  e->min_chunk_size = 0;
  atomic_store (&s->merged, true);
  atomic_store (&s->state, SNAPSHOT_DROPPED);
  /* Nothing is held during a merge (origin writes go through it): the
   * held file names the stores left, as after a drop.
   */
  writeback_bind_stores (e);
  percpu_rwlock_write_unlock (&e->geometry);
  snapfg_debug ("snapshot %s: merge complete (%" PRIu64 " chunks); the "
                "snapshot is gone", s->name,
                (uint64_t) atomic_load (&s->merge_done));
  if (listed) {
    lifecycle_forget (e, s, "merged");
    snapfg_snapshot_put (s);    /* the list's reference */
  }
}

static void *
merge_thread (void *arg)
{
  struct snapfg_snapshot *s = arg;
  struct snapfg_store *st = s->store;
  struct snapfg_engine *e = s->engine;
  struct store_pair pairs[MERGE_BATCH];
  struct pending_exception pe[MERGE_BATCH];
  void *buf = malloc (s->chunk_size);
  int r = buf ? 0 : -ENOMEM;

  while (r == 0 && !atomic_load (&s->merge_stop)) {
    size_t n;

    r = st->ops->merge_last (st, pairs, MERGE_BATCH, &n);
    if (r < 0 || n == 0)
      break;
    r = claim_batch (s, pairs, n, pe);
    if (r < 0)
      break;
    if (e->test.merge_delay_us)
      usleep (e->test.merge_delay_us);      /* tests: a merge that lasts */
    for (size_t i = 0; i < n && r == 0; ++i)
      r = copy_back (s, &pairs[i], buf);
    if (r == 0)
      r = device_flush (&e->origin);
    if (r == 0) {
      engine_fault_point (e, FAULT_MERGE_BATCH);
      r = st->ops->merge_forget (st, n);
    }
    release_batch (s, pairs, n, pe, r == 0);
    if (r == 0)
      atomic_fetch_add (&s->merge_done, n);
  }
  free (buf);

  if (r < 0)
    snapfg_error ("snapshot %s: merge stopped after %" PRIu64 " chunks: %s "
                  "(origin requests still see the snapshot's data; restart "
                  "to resume)", s->name,
                  (uint64_t) atomic_load (&s->merge_done), strerror (-r));
  else if (!atomic_load (&s->merge_stop))
    finish_merge (s);

  /* Nobody will join a thread whose merge ended by itself (the snapshot
   * may be gone from the list): detach it.  One being stopped by the
   * engine is joined instead.
   */
  {
    SCOPED_MUTEX_LOCK (&s->merge_lock);
    if (!atomic_load (&s->merge_stop)) {
      pthread_detach (pthread_self ());
      s->merge_thread_running = false;
    }
  }
  snapfg_snapshot_put (s);      /* the thread's own reference */
  {
    SCOPED_MUTEX_LOCK (&e->merge_threads_lock);
    if (--e->merge_threads == 0)
      pthread_cond_broadcast (&e->merge_threads_done);
  }
  return NULL;
}

int
merge_start_thread (struct snapfg_snapshot *s)
{
  int err = 0;

  SCOPED_MUTEX_LOCK (&s->merge_lock);
  if (!s->merge_thread_running) {
    atomic_store (&s->merge_total, exception_table_count (&s->table)
                  + atomic_load (&s->merge_done));
    atomic_fetch_add (&s->refs, 1);     /* the thread's own reference */
    {
      SCOPED_MUTEX_LOCK (&s->engine->merge_threads_lock);
      s->engine->merge_threads++;
    }
    err = pthread_create (&s->merge_thread, NULL, merge_thread, s);
    if (err) {
      {
        SCOPED_MUTEX_LOCK (&s->engine->merge_threads_lock);
        s->engine->merge_threads--;
      }
      atomic_fetch_sub (&s->refs, 1);
      snapfg_fail_logged (err, "snapshot %s: cannot start the merge thread: %s",
                               s->name, strerror (err));
    }
    else
      s->merge_thread_running = true;
  }
  return -err;
}

void
merge_stop_thread (struct snapfg_snapshot *s)
{
  bool join;

  {
    SCOPED_MUTEX_LOCK (&s->merge_lock);
    atomic_store (&s->merge_stop, true);
    join = s->merge_thread_running;
    s->merge_thread_running = false;
  }
  if (join)
    pthread_join (s->merge_thread, NULL);
}

const char *
merge_prepare_locked (struct snapfg_engine *e, struct snapfg_snapshot *s,
                      int *r)
{
  *r = 0;
  if (s->store->ops->merge_begin == NULL)
    return "only a persistent snapshot can be merged";
  if (atomic_load (&s->state) == SNAPSHOT_MERGING)
    return "it is already being merged";
  if (!snapshot_is_valid (s))
    return "it is Invalid (its contents are lost): drop it";
  if (e->nsnapshots != 1)
    return "it is not the origin's only snapshot; drop the others first";
  /* Held writes go to the origin before its view is routed through the
   * merge (which writes to the origin itself).
   */
  writeback_drain (e);
  /* The catalogue first: a restart that finds it merging either resumes
   * the merge (the store is marked) or starts it (it is not yet).
   */
  *r = lifecycle_merging (e, s);
  if (*r == 0)
    *r = s->store->ops->merge_begin (s->store);
  if (*r == 0) {
    atomic_store (&s->state, SNAPSHOT_MERGING);
    e->merging = s;
    /* The origin view becomes the snapshot's now: every chunk it holds
     * changes, at this instant, for the active checkpoint.
     */
    checkpoint_track_snapshot_locked (e, s);
  }
  return NULL;
}

int
snapfg_snapshot_merge (struct snapfg_engine *e, const char *name)
{
  struct snapfg_snapshot *s = snapfg_snapshot_get (e, name);
  const char *problem = NULL;
  int r = 0;

  if (s == NULL) {
    return snapfg_fail (ENOENT, "merge: no snapshot named \"%s\"", name);
  }

  /* Checked and switched with requests stopped, so no snapshot can be
   * created meanwhile.  The merge is marked durably before the origin
   * view changes: from a restart on, the origin view is the snapshot's.
   */
  {
    SCOPED_GEOMETRY_WRITE_LOCK (&e->geometry);
    problem = merge_prepare_locked (e, s, &r);
  }

  if (problem) {
    r = snapfg_fail (EINVAL, "merge %s: %s", name, problem);
  }
  if (r == 0) {
    snapfg_debug ("snapshot %s: merging %" PRIu64 " chunks into the origin",
                  name, exception_table_count (&s->table));
    r = merge_start_thread (s);
  }
  snapfg_snapshot_put (s);
  return r;
}
