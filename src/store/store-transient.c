/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the transient exception store (dm-snapshot's "N").
 *
 * The exception table lives only in memory; the COW device holds chunk
 * data from chunk 0 upwards, handed out by a bump pointer.  Since the
 * table is lost when the process ends, every start is a new snapshot, so
 * the COW device must be new, empty or all zero: anything else might be
 * somebody's data and is refused without being written.
 *
 * Sequential first writes into a COW file that grows stall on the file
 * system's block allocation (a pre-written COW file measured 0.73-0.80 x
 * bare against 0.53 x).  Writing zeroes ahead costs a write of every
 * chunk, which was slower.  So a COW file has its blocks reserved ahead
 * of the allocator (fallocate with the size kept: no data written, the
 * extents read as zeroes until written), a window at a time, by the
 * request that crosses the low mark; it is one cheap call per window
 * and nobody waits for it.  A clean close truncates the file to zero,
 * which gives the reserved blocks back with the rest.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <unistd.h>

#include <stdatomic.h>

#include "store.h"
#include "rounding.h"
#include "snapfg-log.h"

#define PREALLOC_WINDOW (64 * 1024 * 1024)  /* bytes reserved at a time */
#define PREALLOC_LOW (32 * 1024 * 1024)     /* reserve more when less is left */

struct transient_store {
  struct snapfg_store base;
  /* Reserved up to this byte offset (preallocate_ahead). */
  atomic_uint_least64_t reserved_end;
  atomic_bool reserving;                   /* one reserver at a time */
  atomic_bool reserve_off;                 /* cannot: stop trying */
};

static void
preallocate_ahead (struct transient_store *ts, uint64_t next_chunk)
{
  struct snapfg_store *st = &ts->base;
  uint64_t used = next_chunk << st->chunk_shift;
  uint64_t end = atomic_load (&ts->reserved_end);
  uint64_t limit = st->max_chunks << st->chunk_shift, from, len;
  bool expected = false;
  int r;

  if (atomic_load (&ts->reserve_off) || end >= limit ||
      end >= used + PREALLOC_LOW)
    return;
  if (!atomic_compare_exchange_strong (&ts->reserving, &expected, true))
    return;                     /* someone else is at it: do not wait */
  from = end > used ? end : used;
  len = from + PREALLOC_WINDOW < limit ? PREALLOC_WINDOW : limit - from;
  r = device_preallocate (&st->dev, len, from);
  if (r == 0)
    atomic_store (&ts->reserved_end, from + len);
  else
    /* Only an optimisation (a file system without fallocate, a full
     * one): the writes allocate as before.
     */
    atomic_store (&ts->reserve_off, true);
  atomic_store (&ts->reserving, false);
}

static int
transient_alloc_run (struct snapfg_store *st, uint64_t want, uint64_t *first,
                     uint64_t *got)
{
  int r = store_bump_alloc (st, want, first, got);

  if (r == 0)
    preallocate_ahead ((struct transient_store *) st, *first + *got);
  return r;
}

static int
transient_commit (struct snapfg_store *st, const struct store_pair *pairs,
                  size_t n)
{
  /* Nothing to record: the table is in memory and dies with us. */
  return 0;
}

static int
transient_flush (struct snapfg_store *st)
{
  return device_flush (&st->dev);
}

static void
transient_invalidate (struct snapfg_store *st)
{
  /* Nothing on disk to mark; the engine's state says Invalid. */
}

static void
transient_usage (const struct snapfg_store *st, uint64_t *allocated,
                 uint64_t *total, uint64_t *metadata)
{
  uint64_t used = atomic_load (&st->next_chunk);

  if (used > st->max_chunks)
    used = st->max_chunks;
  *allocated = (used << st->chunk_shift) / 512;
  *total = (st->max_chunks << st->chunk_shift) / 512;
  *metadata = 0;
}

static void
transient_close (struct snapfg_store *st, bool clean)
{
  /* The chunk data is meaningless without the table.  Give the space
   * back and leave the device empty or all zero, so that the next start
   * can use it.
   */
  if (st->dev.ops) {
    uint64_t used = atomic_load (&st->next_chunk);
    int r;

    if (used > st->max_chunks)
      used = st->max_chunks;
    r = device_discard_contents (&st->dev, used << st->chunk_shift);
    if (r < 0)
      snapfg_error ("cow=%s: could not empty the transient COW store: %s",
                    st->dev.path, strerror (-r));
  }
  device_close (&st->dev);
  free (st);
}

static const struct snapfg_store_ops transient_ops = {
  .name = "transient",
  .load = NULL,
  .alloc_run = transient_alloc_run,
  .commit = transient_commit,
  .flush = transient_flush,
  .invalidate = transient_invalidate,
  .usage = transient_usage,
  .close = transient_close,
};

/* A transient store starts empty every time: refuse a COW device that
 * holds anything, since it might be somebody's data.
 */
static int
check_empty (const struct snapfg_store_params *params,
             struct snapfg_store *st)
{
  int r;

  if (st->created)
    return 0;
  r = device_is_all_zero (&st->dev);
  if (r < 0) {
    snapfg_fail (-r, "cow=%s: cannot read the COW %s: %s", params->path,
                     device_noun (st->dev.path), strerror (-r));
    return r;
  }
  if (r == 0) {
    const char *noun = device_noun (params->path);

    /* Say what to do for this kind of disk: a file (the only kind whose
     * size is not fixed) can simply be removed; a block device or an
     * export has to be zeroed.
     */
    if (!st->dev.fixed_size)
      return snapfg_fail (EEXIST, "cow=%s: the file holds data that is not an empty "
                                  "store (a transient store needs a new, empty or "
                                  "all-zero file; a transient COW file left by a crash "
                                  "must be removed by hand); refusing to overwrite it",
                                  params->path);
    else
      return snapfg_fail (EEXIST, "cow=%s: the %s holds data that is not an empty "
                                  "store (a transient store needs an all-zero %s; if "
                                  "this is a transient COW left by a crash and nothing "
                                  "else is on it, zero it by hand, for example with "
                                  "'blkdiscard -z' for a block device); refusing to "
                                  "overwrite it", params->path, noun, noun);
  }
  return 0;
}

int
transient_store_open (const struct snapfg_store_params *params,
                      struct snapfg_store **stp)
{
  struct transient_store *ts = calloc (1, sizeof *ts);
  struct snapfg_store *st;
  int r;

  if (ts == NULL)
    return -ENOMEM;
  st = &ts->base;
  st->ops = &transient_ops;
  st->chunk_size = params->chunk_size;
  st->chunk_shift = log2_of_power_of_two (params->chunk_size);

  r = store_open_device (params, st);
  if (r < 0) {
    free (st);
    return r;
  }
  r = check_empty (params, st);
  if (r < 0) {
    store_discard_new (st);
    return r;
  }

  /* Default: room for a copy of every origin chunk. */
  r = store_set_size (params, st,
                      round_up (params->origin->size, st->chunk_size));
  if (r < 0) {
    store_discard_new (st);
    return r;
  }
  atomic_init (&st->next_chunk, 0);
  /* A disk of fixed size has no file system allocating its blocks.
   * SNAPFG_TEST_NO_PREALLOCATE turns it off, to measure what it saves.
   */
  atomic_init (&ts->reserve_off, st->dev.fixed_size ||
               getenv ("SNAPFG_TEST_NO_PREALLOCATE") != NULL);
  *stp = st;
  return 0;
}
