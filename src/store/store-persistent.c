/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the persistent exception store, in Linux dm-snapshot's on-disk
 * format (dm-format.h, docs/design.md section 5): its operations.  Group
 * commit is in store-persistent-commit.c, opening a store in
 * store-persistent-open.c; their shared state is store-persistent.h.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>

#include "store-persistent.h"
#include "rounding.h"
#include "snapfg-log.h"

static int
persistent_alloc_run (struct snapfg_store *st, uint64_t want,
                      uint64_t *first, uint64_t *got)
{
  struct persistent_store *ps = ps_of (st);
  const uint64_t ppa = ps->pairs_per_area;
  uint64_t chunk = atomic_load (&st->next_chunk);
  uint64_t n, next;

  /* A bump pointer that hops over metadata areas, without a lock.  A run
   * ends before the next metadata area (it is one write in the COW
   * device).  The last data chunk of a region is only handed out if the
   * next area fits in the store too: handing it out lets the region's
   * area fill up, and a full area must be followed by a zeroed one (the
   * table's end).
   */
  do {
    /* chunk is a data chunk of the region after area (chunk - 1) / (ppa + 1);
     * the next area starts at area_next.
     */
    uint64_t area_next = 1 + ((chunk - 1) / (ppa + 1) + 1) * (ppa + 1);
    uint64_t end;               /* the run ends before this chunk */

    if (area_next < st->max_chunks)
      end = area_next;
    else                        /* keep the region's last chunk back */
      end = area_next - 1 < st->max_chunks ? area_next - 1 : st->max_chunks;
    if (chunk >= end)
      return -ENOSPC;
    n = end - chunk < want ? end - chunk : want;
    next = dm_skip_metadata (chunk + n, ppa);
  } while (!atomic_compare_exchange_weak (&st->next_chunk, &chunk, next));
  persistent_wait_zeroing (ps, chunk, n);
  *first = chunk;
  *got = n;
  return 0;
}

static int
persistent_load (struct snapfg_store *st, store_exception_fn fn, void *opaque)
{
  struct persistent_store *ps = ps_of (st);
  struct dm_load_result res;
  char why[256];
  int r;

  if (st->opened_invalid || ps->fresh)
    return 0;                   /* nothing to load, or not to be used */
  r = dm_load_exceptions (&st->dev, st->chunk_size,
                          div_round_up (st->origin_size, st->chunk_size),
                          fn, opaque, &res, why, sizeof why);
  if (r < 0) {
    snapfg_error ("cow=%s: %s; refusing to use it (the file is left "
                  "unchanged)", st->dev.path, why);
    return r;
  }
  if (res.next_free > st->max_chunks) {
    /* Accepting it would make the next copy-out find the store "full"
     * and invalidate the snapshot.
     */
    snapfg_error ("cow=%s: cow-size= allows %" PRIu64 " bytes, less than "
                  "the %" PRIu64 " bytes the store already uses (%" PRIu64
                  " chunks of %" PRIu32 "); give cow-size=%" PRIu64
                  " or more, or no cow-size= (the file is left unchanged)",
                  st->dev.path, st->max_chunks << st->chunk_shift,
                  res.next_free << st->chunk_shift, res.next_free,
                  st->chunk_size, res.next_free << st->chunk_shift);
    return -EINVAL;
  }
  ps->current_area = res.current_area;
  ps->area_used = res.area_used;
  ps->zeroed_through = res.current_area;
  atomic_store (&ps->metadata_areas, res.current_area + 1);
  atomic_store (&st->next_chunk, res.next_free);
  /* The current area's pairs: the next commit rewrites the area whole. */
  r = device_pread (&st->dev, ps->area_buf, st->chunk_size,
                    store_chunk_offset (st, dm_area_chunk (res.current_area,
                                                           ps->pairs_per_area)));
  if (r < 0) {
    snapfg_error ("cow=%s: cannot read metadata area %" PRIu64 ": %s",
                  st->dev.path, res.current_area, strerror (-r));
    return r;
  }
  /* Anything after the terminator is stale (the kernel would revive it
   * on its next append to this area): it must not be written back.
   */
  memset (ps->area_buf + ps->area_used * DM_SNAP_PAIR_SIZE, 0,
          st->chunk_size - ps->area_used * DM_SNAP_PAIR_SIZE);
  if (ps->binding_pending) {
    r = persistent_write_header (ps, 1);
    if (r == 0)
      r = persistent_sync (ps);
    if (r < 0) {
      snapfg_error ("cow=%s: cannot write the binding record into the "
                    "header: %s", st->dev.path, strerror (-r));
      return r;
    }
    ps->binding_pending = false;
  }
  snapfg_debug ("cow=%s: reopened persistent store: %" PRIu64
                " exceptions, %" PRIu64 " metadata areas, next free chunk %"
                PRIu64, st->dev.path, res.exceptions, res.current_area + 1,
                res.next_free);
  return 0;
}

static int
persistent_flush (struct snapfg_store *st)
{
  return persistent_sync (ps_of (st));
}

static void
persistent_invalidate (struct snapfg_store *st)
{
  struct persistent_store *ps = ps_of (st);
  int r;

  /* Say it on disk, durably, so that a restart keeps it Invalid.  The
   * commit lock orders this header write with the other header writers
   * (set_merge_mark) and makes the 'invalidated' check-and-set atomic.  It
   * does not stop a commit leader, which writes metadata areas with the
   * lock dropped; that is harmless, since the header is chunk 0 and no
   * area ever is.  Pairs committed after this are never read back: a
   * store whose header says valid = 0 is reopened without its table.
   */
  pthread_mutex_lock (&ps->lock);
  if (!ps->invalidated && !st->dev.readonly) {
    ps->invalidated = true;
    ps->marked = false;         /* Invalid for good, not just unsynced */
    r = persistent_write_header (ps, 0);
    if (r == 0)
      r = persistent_sync (ps);
    if (r < 0)
      snapfg_error ("cow=%s: could not mark the store Invalid on disk: %s",
                    st->dev.path, strerror (-r));
  }
  pthread_mutex_unlock (&ps->lock);
}

static int
persistent_mark_dropped (struct snapfg_store *st)
{
  struct persistent_store *ps = ps_of (st);
  struct store_binding b;
  int r = 0;

  /* valid = 0 is what the kernel understands too; the binding says why. */
  pthread_mutex_lock (&ps->lock);
  if (!st->dev.readonly) {
    if (binding_decode (ps->binding_raw, &b) == 0 && b.present) {
      b.state = BINDING_DROPPED;
      binding_encode (&b, ps->binding_raw);
    }
    ps->invalidated = true;
    ps->marked = false;         /* dropped for good, not just unsynced */
    r = persistent_write_header (ps, 0);
    if (r == 0)
      r = persistent_sync (ps);
    if (r < 0)
      snapfg_error ("cow=%s: could not mark the dropped store on disk: %s",
                    st->dev.path, strerror (-r));
  }
  pthread_mutex_unlock (&ps->lock);
  return r;
}

static void
persistent_usage (const struct snapfg_store *st, uint64_t *allocated,
                  uint64_t *total, uint64_t *metadata)
{
  struct persistent_store *ps = ps_of ((struct snapfg_store *) st);
  uint64_t next = atomic_load (&((struct snapfg_store *) st)->next_chunk);
  uint64_t sectors_per_chunk = st->chunk_size / 512;

  /* As dm reports it: allocated counts every chunk up to the next free
   * one, header and metadata included; metadata is the header and the
   * areas in use.
   */
  if (next > st->max_chunks)
    next = st->max_chunks;
  *allocated = next * sectors_per_chunk;
  *total = st->max_chunks * sectors_per_chunk;
  *metadata = (1 + atomic_load (&ps->metadata_areas)) * sectors_per_chunk;
}

static void
persistent_close (struct snapfg_store *st, bool clean)
{
  struct persistent_store *ps = ps_of (st);

  if (clean && !st->dev.readonly && !st->opened_invalid) {
    int r = persistent_sync (ps);

    pthread_mutex_lock (&ps->lock);
    if (r == 0 && ps->marked && !ps->invalidated && ps->failed == 0) {
      /* Everything is durable now: the store is whole without the mark. */
      ps->marked = false;
      r = persistent_write_header (ps, 1);
      if (r == 0)
        r = persistent_sync (ps);
      if (r < 0)
        snapfg_error ("cow=%s: could not clear the unsynced mark: %s (the "
                      "snapshot will open as Invalid after a reboot)",
                      st->dev.path, strerror (-r));
    }
    pthread_mutex_unlock (&ps->lock);
  }
  persistent_commit_destroy (ps);
  snapfg_debug ("cow=%s: %" PRIu64 " exceptions committed in %" PRIu64
                " groups with %" PRIu64 " syncs (%" PRIu64 " commit calls)",
                st->dev.path, (uint64_t) atomic_load (&ps->commits),
                (uint64_t) atomic_load (&ps->groups),
                (uint64_t) atomic_load (&ps->syncs),
                (uint64_t) atomic_load (&ps->commit_calls));
  device_close (&st->dev);
  free (ps->area_buf);
  free (ps);
}

/* --- merging (see store.h) --- */

static int
set_merge_mark (struct persistent_store *ps, bool merging)
{
  int r;

  pthread_mutex_lock (&ps->lock);
  ps->merging = merging;
  r = persistent_write_header (ps, 1);
  if (r == 0)
    r = persistent_sync (ps);
  pthread_mutex_unlock (&ps->lock);
  if (r < 0)
    snapfg_error ("cow=%s: cannot write the merge mark in the header: %s",
                  ps->base.dev.path, strerror (-r));
  return r;
}

static int
persistent_merge_begin (struct snapfg_store *st)
{
  return set_merge_mark (ps_of (st), true);
}

static int
persistent_merge_end (struct snapfg_store *st)
{
  return set_merge_mark (ps_of (st), false);
}

static int
persistent_merge_last (struct snapfg_store *st, struct store_pair *pairs,
                       size_t max, size_t *n)
{
  struct persistent_store *ps = ps_of (st);
  int r = 0;

  pthread_mutex_lock (&ps->lock);
  if (ps->area_used == 0 && ps->current_area > 0) {
    /* The current area is empty: the table now ends with the previous,
     * full one.
     */
    uint64_t area = ps->current_area - 1;
    r = device_pread (&st->dev, ps->area_buf, st->chunk_size,
                      store_chunk_offset (st, dm_area_chunk
                                          (area, ps->pairs_per_area)));
    if (r == 0) {
      ps->current_area = area;
      ps->area_used = ps->pairs_per_area;
      atomic_store (&ps->metadata_areas, area + 1);
    }
  }
  *n = 0;
  while (r == 0 && *n < max && *n < ps->area_used) {
    size_t i = ps->area_used - 1 - *n;
    dm_pair_decode (ps->area_buf + i * DM_SNAP_PAIR_SIZE,
                    &pairs[*n].old_chunk, &pairs[*n].new_chunk);
    (*n)++;
  }
  pthread_mutex_unlock (&ps->lock);
  return r;
}

static int
persistent_merge_forget (struct snapfg_store *st, size_t n)
{
  struct persistent_store *ps = ps_of (st);
  int r;

  /* Zero the last n pairs: the table ends earlier, and every area stays
   * zero past its last pair.
   */
  pthread_mutex_lock (&ps->lock);
  ps->area_used -= n;
  memset (ps->area_buf + ps->area_used * DM_SNAP_PAIR_SIZE, 0,
          n * DM_SNAP_PAIR_SIZE);
  r = persistent_write_current_area (ps);
  if (r == 0)
    r = persistent_sync (ps);
  pthread_mutex_unlock (&ps->lock);
  return r;
}

const struct snapfg_store_ops persistent_ops = {
  .name = "persistent",
  .load = persistent_load,
  .alloc_run = persistent_alloc_run,
  .commit = persistent_commit,
  .flush = persistent_flush,
  .invalidate = persistent_invalidate,
  .mark_dropped = persistent_mark_dropped,
  .usage = persistent_usage,
  .merge_begin = persistent_merge_begin,
  .merge_last = persistent_merge_last,
  .merge_forget = persistent_merge_forget,
  .merge_end = persistent_merge_end,
  .close = persistent_close,
};
