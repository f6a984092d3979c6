/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the checkpoint queries — "checkpoint list" and "changed
 * --since" (the union of a run of the chain's bitmaps, as byte ranges).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <unistd.h>
#include <pthread.h>

#include "checkpoint.h"
#include "checkpoint-internal.h"
#include "cleanup.h"
#include "cbt-bitmap.h"
#include "catalogue.h"
#include "engine-checkpoint.h"
#include "scoped-lock.h"
#include "snapfg-log.h"

static void
cbt_bitmap_cleanup (struct cbt_bitmap **bm)
{
  cbt_bitmap_close (*bm);
}

static uint64_t
dirty_bytes (const struct cbt_bitmap *bm)
{
  uint64_t n = cbt_bitmap_count (bm) * bm->granularity;

  /* The last granule may stick out past the origin's end. */
  if (bm->granules && cbt_bitmap_test (bm, bm->granules - 1))
    n -= ((uint64_t) bm->granules << bm->shift) - bm->origin_size;
  return n;
}

int
snapfg_checkpoint_list (struct snapfg_engine *e, snapfg_checkpoint_fn fn,
                        void *opaque)
{
  struct checkpoint_chain *c = snapfg_engine_checkpoints (e);
  int r = 0;

  r = checkpoint_need_catalogue (c, "checkpoint list");
  if (r < 0)
    return r;
  SCOPED_MUTEX_LOCK (&c->lock);
  checkpoint_record_pending (c);
  for (size_t i = 0; r == 0 && i < c->list.len; ++i) {
    struct checkpoint *cp = c->list.ptr[i];
    struct snapfg_checkpoint_info info = {
      .name = cp->name,
      .state = checkpoint_state_of (c, i),
      .snapshot = cp->snapshot,
      .owner = cp->owner,
      .bitmap = cp->bitmap_path,
      .granularity = cp->granularity,
      .created = cp->created,
      .seq = cp->seq,
      .dirty_bytes = cp->bm ? dirty_bytes (cp->bm) : 0,
    };
    r = fn (opaque, &info);
  }
  return r;
}

int
snapfg_checkpoint_changed (struct snapfg_engine *e, const char *since,
                           const char *snapshot, uint32_t *granularity,
                           snapfg_range_fn fn, void *opaque)
{
  struct checkpoint_chain *c = snapfg_engine_checkpoints (e);
  CLEANUP (cbt_bitmap_cleanup) struct cbt_bitmap *u = NULL;
  ssize_t first, end;
  uint32_t g;
  int r;

  r = checkpoint_need_catalogue (c, "changed --since");
  if (r < 0)
    return r;
  SCOPED_MUTEX_LOCK (&c->lock);
  checkpoint_record_pending (c);
  first = checkpoint_find_locked (c, since);
  if (first < 0) {
    return snapfg_fail (ENOENT, "changed: no checkpoint named \"%s\"", since);
  }
  end = c->list.len;
  if (snapshot) {
    /* The newest checkpoint made with that snapshot marks its instant. */
    for (end = c->list.len - 1; end >= 0; --end)
      if (c->list.ptr[end]->snapshot &&
          strcmp (c->list.ptr[end]->snapshot, snapshot) == 0)
        break;
    if (end < 0) {
      return snapfg_fail (ENOENT, "changed: snapshot \"%s\" was not created with a "
                                  "checkpoint (create it with --checkpoint), or that "
                                  "checkpoint was dropped", snapshot);
    }
    if (end < first) {
      return snapfg_fail (EINVAL, "changed: checkpoint \"%s\" is newer than snapshot "
                                  "\"%s\" (its checkpoint is \"%s\")", since, snapshot,
                                  c->list.ptr[end]->name);
    }
  }
  /* Refuse before answering anything: never a silently short delta. */
  for (ssize_t i = first; i < end; ++i)
    if (is_inconsistent (c->list.ptr[i])) {
      return snapfg_fail (ESTALE, "changed: checkpoint \"%s\" is inconsistent (the system "
                                  "stopped uncleanly or its bitmap could not be written), "
                                  "so the changes since \"%s\" are not known: a full "
                                  "backup is needed", c->list.ptr[i]->name, since);
    }

  /* The union, at the finest granularity among its bitmaps. */
  g = c->list.ptr[first]->granularity;
  for (ssize_t i = first; i < end; ++i)
    if (c->list.ptr[i]->granularity < g)
      g = c->list.ptr[i]->granularity;
  *granularity = g;
  u = cbt_bitmap_new_memory (g, snapfg_size (e));
  if (u == NULL)
    return -ENOMEM;
  for (ssize_t i = first; i < end && r == 0; ++i)
    r = cbt_bitmap_or (u, c->list.ptr[i]->bm);
  if (r < 0)
    return r;

  /* Runs of set granules, as byte ranges clipped to the origin. */
  for (uint64_t gi = 0; gi < u->granules && r == 0; ) {
    uint64_t w = atomic_load (&u->words[gi >> 6]) >> (gi & 63);
    uint64_t start, stop;

    if (w == 0) {
      gi = (gi | 63) + 1;       /* the rest of this word is clear */
      continue;
    }
    gi += __builtin_ctzll (w);
    start = gi;
    while (gi < u->granules && cbt_bitmap_test (u, gi))
      gi++;
    stop = gi << u->shift;
    if (stop > snapfg_size (e))
      stop = snapfg_size (e);
    r = fn (opaque, start << u->shift, stop - (start << u->shift));
  }
  return r;
}

