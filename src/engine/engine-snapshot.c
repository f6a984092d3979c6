/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the engine's snapshots once they exist — references, lookup,
 * drop, the changed ranges, statistics, status and invalidation.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <unistd.h>
#include <signal.h>
#include <sys/stat.h>

#include "engine-internal.h"
#include "snapshot-writes.h"
#include "lifecycle.h"
#include "scoped-lock.h"
#include "snapfg-log.h"

/* --- a snapshot's teardown, and the list of live snapshots --- */

pthread_mutex_t engine_live_lock = PTHREAD_MUTEX_INITIALIZER;

void
snapshot_live_remove (struct snapfg_snapshot *s)
{
  SCOPED_MUTEX_LOCK (&engine_live_lock);
  if (s->live_prevp) {
    *s->live_prevp = s->live_next;
    if (s->live_next)
      s->live_next->live_prevp = s->live_prevp;
    s->live_prevp = NULL;
  }
}

void
snapshot_live_insert (struct snapfg_snapshot *s)
{
  struct snapfg_engine *e = s->engine;

  SCOPED_MUTEX_LOCK (&engine_live_lock);
  s->live_next = e->live;
  if (e->live)
    e->live->live_prevp = &s->live_next;
  e->live = s;
  s->live_prevp = &e->live;
}

void
snapshot_free (struct snapfg_snapshot *s, bool clean)
{
  snapshot_live_remove (s);
  if (s->store)
    s->store->ops->close (s->store, clean);
  if (s->table.stripes)
    exception_table_destroy (&s->table);
  stats_destroy (&s->stats);
  snapshot_writes_free (s);
  pthread_mutex_destroy (&s->merge_lock);
  free (s->name);
  free (s);
}

/* --- finding and holding snapshots --- */

struct snapfg_snapshot *
snapfg_snapshot_get (struct snapfg_engine *e, const char *name)
{
  SCOPED_GEOMETRY_READ_LOCK (&e->geometry);
  struct snapfg_snapshot *s = engine_find_snapshot_locked (e, name);

  if (s)
    atomic_fetch_add (&s->refs, 1);
  return s;
}

struct snapfg_snapshot *
snapfg_snapshot_get_nth (struct snapfg_engine *e, size_t i)
{
  SCOPED_GEOMETRY_READ_LOCK (&e->geometry);
  struct snapfg_snapshot *s = i < e->nsnapshots ? e->snapshots[i] : NULL;

  if (s)
    atomic_fetch_add (&s->refs, 1);
  return s;
}

void
snapfg_snapshot_put (struct snapfg_snapshot *s)
{
  if (s && atomic_fetch_sub (&s->refs, 1) == 1)
    snapshot_free (s, true);
}

const char *
snapfg_snapshot_name (const struct snapfg_snapshot *s)
{
  return s->name;
}

bool
snapfg_snapshot_cow_owned (const struct snapfg_snapshot *s)
{
  return s->owned_cow;
}

static int
compare_chunks (const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

  return x < y ? -1 : x > y;
}

/* An incremental backup built from the changed ranges of a snapshot is
 * only complete if every origin change since the snapshot's instant was
 * copied out into it: not so for an Invalid snapshot (copy-outs stopped
 * when it became Invalid) nor a merging one (its exceptions are being
 * merged away).  Says why and returns -errno, or 0.
 */
static int
changed_refusal (struct snapfg_snapshot *s)
{
  switch (atomic_load (&s->state)) {
  case SNAPSHOT_VALID:
    return 0;
  case SNAPSHOT_MERGING:
    return snapfg_fail (EBUSY, "changed %s: the snapshot is being merged into the "
                               "origin, so its changed ranges are no longer known; "
                               "after the merge, back up the origin in full", s->name);
  default:
    return snapfg_fail (EIO, "changed %s: the snapshot is %s, so the list of origin "
                             "ranges changed since it was taken is incomplete; take a "
                             "full backup", s->name,
                             atomic_load (&s->state) == SNAPSHOT_DROPPED
                             ? "dropped" : "Invalid");
  }
}

int
snapfg_snapshot_changed (struct snapfg_snapshot *s, snapfg_range_fn fn,
                         void *opaque)
{
  uint64_t *chunks;
  size_t n, i, j0;
  int r;

  r = changed_refusal (s);
  if (r < 0)
    return r;
  r = exception_table_collect (&s->table, &chunks, &n);
  if (r < 0)
    return r;
  /* It may have become Invalid while the table was read: the list would
   * miss the origin changes made since.
   */
  r = changed_refusal (s);
  if (r < 0) {
    free (chunks);
    return r;
  }
  /* The exceptions the snapshot's own writes made are no origin
   * change (snapshot-writes.h).
   */
  for (i = 0, j0 = 0; i < n; ++i)
    if (!snapshot_writes_only_snapshot (s, chunks[i]))
      chunks[j0++] = chunks[i];
  n = j0;
  if (n > 1)
    qsort (chunks, n, sizeof *chunks, compare_chunks);
  for (i = 0; i < n && r == 0; ) {
    size_t j = i + 1;
    uint64_t start, end;

    while (j < n && chunks[j] == chunks[j - 1] + 1)
      j++;
    start = chunks[i] << s->chunk_shift;
    end = (chunks[j - 1] + 1) << s->chunk_shift;
    if (end > s->engine->size)
      end = s->engine->size;
    r = fn (opaque, start, end - start);
    i = j;
  }
  free (chunks);
  return r;
}

void
snapfg_view_connection (struct snapfg_engine *e, struct snapfg_snapshot *s,
                        int delta)
{
  atomic_fetch_add (&(s ? &s->stats : &e->stats)->connections, delta);
}

void
snapfg_view_stats (struct snapfg_engine *e, struct snapfg_snapshot *s,
                   struct snapfg_view_stats *vs)
{
  memset (vs, 0, sizeof *vs);
  stats_summarize (s ? &s->stats : &e->stats, &vs->requests);
  if (s) {
    vs->exceptions = exception_table_count (&s->table);
    vs->lock_contention = exception_table_contention (&s->table);
  }
}

void
snapfg_snapshot_info (struct snapfg_snapshot *s,
                      struct snapfg_snapshot_info *info)
{
  memset (info, 0, sizeof *info);
  info->name = s->name;
  info->store = s->store->ops->name;
  info->cow_path = s->store->dev.path;
  info->chunk_size = s->chunk_size;
  snapfg_snapshot_status (s, info->status, sizeof info->status);
  s->store->ops->usage (s->store, &info->allocated_sectors,
                        &info->total_sectors, &info->metadata_sectors);
  info->exceptions = exception_table_count (&s->table);
  /* A status request may hold a reference taken just before a drop or
   * the end of a merge: say which, not "Invalid".
   */
  if (atomic_load (&s->state) == SNAPSHOT_DROPPED)
    info->state = atomic_load (&s->merged) ? "merged" : "dropped";
  else if (atomic_load (&s->state) == SNAPSHOT_MERGING) {
    info->state = "merging";
    info->merge_done = atomic_load (&s->merge_done);
    info->merge_total = atomic_load (&s->merge_total);
    /* The table shrinks a batch at a time, a little before merge_done
     * grows: report what the store holds, consistently with the counts.
     */
    info->exceptions = info->merge_total - info->merge_done;
  }
  else if (!snapshot_is_valid (s))
    info->state = "Invalid";
  else if (atomic_load (&s->overflow))
    info->state = "Overflow";
  else
    info->state = "valid";
  info->connections = atomic_load (&s->stats.connections);
}

void
snapfg_snapshot_status (struct snapfg_snapshot *s, char *buf, size_t len)
{
  uint64_t allocated, total, metadata;

  if (atomic_load (&s->state) == SNAPSHOT_INVALID ||
      atomic_load (&s->state) == SNAPSHOT_DROPPED) {
    snprintf (buf, len, "Invalid");
    return;
  }
  if (atomic_load (&s->overflow)) {
    snprintf (buf, len, "Overflow");
    return;
  }
  s->store->ops->usage (s->store, &allocated, &total, &metadata);
  snprintf (buf, len, "%" PRIu64 "/%" PRIu64 " %" PRIu64,
            allocated, total, metadata);
}

void
snapfg_snapshot_describe (struct snapfg_snapshot *s, char *buf, size_t len)
{
  snprintf (buf, len, "%s store, chunk %" PRIu32 ", COW %s",
            s->store->ops->name, s->chunk_size, s->store->dev.path);
}

void
snapshot_invalidate (struct snapfg_snapshot *s, const char *why, int err)
{
  int expected = SNAPSHOT_VALID;

  if (!atomic_compare_exchange_strong (&s->state, &expected,
                                       SNAPSHOT_INVALID))
    return;                     /* already Invalid: said so already */
  /* Say what to do next: an Invalid snapshot never becomes valid again. */
  const char *next = strcmp (why, "the COW store is full") == 0
    ? " with a larger COW store (cow-size=, snapfgctl create --cow-size)"
    : err == ENOSPC ? " where there is room" : "";
  if (err)
    snapfg_error ("snapshot %s (COW %s) is now Invalid: %s: %s; its "
                  "contents are lost: drop it (snapfgctl drop %s) and create "
                  "a new one%s", s->name, s->store->dev.path, why,
                  strerror (err), s->name, next);
  else
    snapfg_error ("snapshot %s (COW %s) is now Invalid: %s; its contents "
                  "are lost: drop it (snapfgctl drop %s) and create a new "
                  "one%s", s->name, s->store->dev.path, why, s->name, next);
  s->store->ops->invalidate (s->store);
}

/* The smallest chunk size over all snapshots (or 0). */
uint32_t
engine_min_chunk_size (const struct snapfg_engine *e)
{
  uint32_t min = 0;

  for (size_t i = 0; i < e->nsnapshots; ++i)
    if (min == 0 || e->snapshots[i]->chunk_size < min)
      min = e->snapshots[i]->chunk_size;
  return min;
}

struct snapfg_snapshot *
engine_find_snapshot_locked (struct snapfg_engine *e, const char *name)
{
  for (size_t i = 0; i < e->nsnapshots; ++i)
    if (strcmp (e->snapshots[i]->name, name) == 0)
      return e->snapshots[i];
  return NULL;
}

bool
snapshot_chunk_is_remapped (struct snapfg_snapshot *s, uint64_t chunk)
{
  struct exception_stripe *stripe = exception_table_stripe (&s->table, chunk);
  bool remapped;

  exception_stripe_lock (stripe);
  remapped = exception_stripe_remapped (stripe, chunk, NULL);
  exception_stripe_unlock (stripe);
  return remapped;
}
