/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: checkpoints — the chain of dirty bitmaps (see checkpoint.h).
 *
 * This file reopens the chain from the catalogue at start, closes it,
 * writes it back to the catalogue and holds the engine's hooks (marking
 * origin changes); creating and dropping are checkpoint-create.c, the
 * queries checkpoint-query.c.
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
#include "cbt-bitmap.h"
#include "catalogue.h"
#include "engine-checkpoint.h"
#include "snapfg-log.h"

const char *
checkpoint_state_of (const struct checkpoint_chain *c, size_t i)
{
  if (is_inconsistent (c->list.ptr[i]))
    return CATALOGUE_CHECKPOINT_INCONSISTENT;
  return i == c->list.len - 1 ? CATALOGUE_CHECKPOINT_ACTIVE
    : CATALOGUE_CHECKPOINT_FROZEN;
}

void
checkpoint_free (struct checkpoint *cp)
{
  if (cp == NULL)
    return;
  cbt_bitmap_close (cp->bm);
  free (cp->name);
  free (cp->bitmap_path);
  free (cp->snapshot);
  free (cp->owner);
  free (cp);
}

void
checkpoint_note_inconsistent (struct cbt_bitmap *bm, void *opaque)
{
  struct checkpoint_chain *c = opaque;

  atomic_store (&c->unrecorded, true);
}

int
checkpoint_records_write (struct checkpoint_chain *c, struct checkpoint **list,
               size_t n)
{
  struct catalogue_checkpoint *recs = calloc (n ? n : 1, sizeof *recs);
  int r;

  if (recs == NULL)
    return -ENOMEM;
  atomic_store (&c->unrecorded, false);
  for (size_t i = 0; i < n; ++i) {
    recs[i].name = list[i]->name;
    recs[i].bitmap = list[i]->bitmap_path;
    recs[i].granularity = list[i]->granularity;
    recs[i].created = list[i]->created;
    recs[i].seq = list[i]->seq;
    recs[i].state = (char *) (is_inconsistent (list[i])
                              ? CATALOGUE_CHECKPOINT_INCONSISTENT
                              : i == n - 1 ? CATALOGUE_CHECKPOINT_ACTIVE
                              : CATALOGUE_CHECKPOINT_FROZEN);
    recs[i].snapshot = list[i]->snapshot;
    recs[i].owner = list[i]->owner;
  }
  r = catalogue_checkpoints_set (c->cat, recs, n);
  if (r < 0)
    atomic_store (&c->unrecorded, true);
  free (recs);
  return r;
}

void
checkpoint_binding (struct snapfg_engine *e, const char *name, uint64_t seq,
                    struct cbt_binding *b)
{
  struct device_identity id = { 0, 0 };   /* an NBD origin has none */
  struct checkpoint_chain *c = snapfg_engine_checkpoints (e);

  memset (b, 0, sizeof *b);
  snprintf (b->catalogue_id, sizeof b->catalogue_id, "%s",
            c && c->cat ? catalogue_id (c->cat) : "");
  b->seq = seq;
  snprintf (b->name, sizeof b->name, "%s", name);
  snapfg_origin_identity (e, &id);
  b->origin_dev = id.dev;
  b->origin_ino = id.ino;
  b->origin_moved = snapfg_origin_moved (e);
}

void
checkpoint_record_pending (struct checkpoint_chain *c)
{
  if (c->cat && atomic_load (&c->unrecorded))
    checkpoint_records_write (c, c->list.ptr, c->list.len);
}

static int
compare_seq (const void *a, const void *b)
{
  const struct catalogue_checkpoint *x = a, *y = b;

  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

int
snapfg_checkpoints_open (struct snapfg_engine *e, struct catalogue *cat,
                         uint32_t granularity)
{
  struct checkpoint_chain *c;
  struct catalogue_checkpoint *recs = NULL;
  size_t nrecs = 0;
  bool rewrite = false;
  int r;

  c = calloc (1, sizeof *c);
  if (c == NULL)
    return -ENOMEM;
  pthread_mutex_init (&c->lock, NULL);
  pthread_mutex_init (&c->io_lock, NULL);
  atomic_init (&c->unrecorded, false);
  c->cat = cat;
  c->granularity = granularity ? granularity : CBT_DEFAULT_GRANULARITY;
  c->next_seq = 1;
  snapfg_engine_set_checkpoints (e, c);
  if (cat == NULL)
    return 0;

  r = catalogue_checkpoints (cat, &recs, &nrecs);
  if (r < 0)
    return r;
  if (nrecs > 1)
    qsort (recs, nrecs, sizeof *recs, compare_seq);
  if (checkpoint_vector_reserve (&c->list, nrecs) < 0) {
    catalogue_checkpoints_free (recs, nrecs);
    return -ENOMEM;
  }
  for (size_t i = 0; i < nrecs; ++i) {
    struct catalogue_checkpoint *rec = &recs[i];
    struct checkpoint *cp = calloc (1, sizeof *cp);
    struct cbt_binding expect;
    char why[512];

    if (cp == NULL) {
      catalogue_checkpoints_free (recs, nrecs);
      return -ENOMEM;
    }
    cp->name = strdup (rec->name);
    cp->bitmap_path = strdup (rec->bitmap);
    cp->snapshot = rec->snapshot ? strdup (rec->snapshot) : NULL;
    cp->owner = rec->owner ? strdup (rec->owner) : NULL;
    cp->seq = rec->seq;
    cp->created = rec->created;
    cp->granularity = rec->granularity;
    c->list.ptr[c->list.len++] = cp;
    if (cp->name == NULL || cp->bitmap_path == NULL ||
        (rec->snapshot && cp->snapshot == NULL) ||
        (rec->owner && cp->owner == NULL)) {
      catalogue_checkpoints_free (recs, nrecs);
      return -ENOMEM;
    }
    if (rec->seq >= c->next_seq)
      c->next_seq = rec->seq + 1;
    if (rec->state && strcmp (rec->state,
                              CATALOGUE_CHECKPOINT_INCONSISTENT) == 0)
      cp->lost = true;

    checkpoint_binding (e, cp->name, cp->seq, &expect);
    r = cbt_bitmap_open (cp->bitmap_path, snapfg_size (e), &expect, &cp->bm, why,
                         sizeof why);
    if (r < 0) {
      snapfg_error ("checkpoint %s: bitmap %s: %s; the checkpoint is "
                    "inconsistent (a full backup is needed; drop it when "
                    "done)", cp->name, cp->bitmap_path, why);
      cp->bm = NULL;
      rewrite |= !cp->lost;
      cp->lost = true;
      continue;
    }
    cp->bm->on_inconsistent = checkpoint_note_inconsistent;
    cp->bm->opaque = c;
    if (cp->bm->granularity != cp->granularity) {
      snapfg_error ("checkpoint %s: bitmap %s has granularity %" PRIu32
                    " but the catalogue says %" PRIu32 "; the checkpoint is "
                    "inconsistent (a full backup is needed)", cp->name,
                    cp->bitmap_path, cp->bm->granularity, cp->granularity);
      rewrite |= !cp->lost;
      cp->lost = true;
    }
    if (atomic_load (&cp->bm->inconsistent) && !cp->lost) {
      snapfg_error ("checkpoint %s: bitmap %s: %s; the checkpoint is "
                    "inconsistent (a full backup is needed)", cp->name,
                    cp->bitmap_path, why);
      rewrite = true;
    }
  }
  catalogue_checkpoints_free (recs, nrecs);

  /* The newest tracks again (marked in use first); the frozen ones are
   * complete and stay clean.
   */
  for (size_t i = 0; i < c->list.len; ++i) {
    struct checkpoint *cp = c->list.ptr[i];

    if (is_inconsistent (cp))
      continue;
    if (i == c->list.len - 1) {
      if (cbt_bitmap_set_dirty (cp->bm) == 0)
        snapfg_engine_set_active_bitmap (e, cp->bm);
      else
        rewrite = true;
    }
    else if (cbt_bitmap_set_clean (cp->bm) < 0)
      rewrite = true;
  }
  if (rewrite || atomic_load (&c->unrecorded))
    checkpoint_records_write (c, c->list.ptr, c->list.len);
  if (c->list.len)
    snapfg_debug ("checkpoints: %zu reopened, %s active", c->list.len,
                  snapfg_engine_active_bitmap (e)
                  ? c->list.ptr[c->list.len - 1]->name : "none");
  return 0;
}

void
checkpoint_chain_close (struct snapfg_engine *e, bool clean)
{
  struct checkpoint_chain *c = snapfg_engine_checkpoints (e);

  if (c == NULL)
    return;
  snapfg_engine_set_active_bitmap (e, NULL);
  if (clean && c->list.len && !is_inconsistent (c->list.ptr[c->list.len - 1]))
    cbt_bitmap_set_clean (c->list.ptr[c->list.len - 1]->bm);
  checkpoint_record_pending (c);
  for (size_t i = 0; i < c->list.len; ++i)
    checkpoint_free (c->list.ptr[i]);
  checkpoint_vector_reset (&c->list);
  pthread_mutex_destroy (&c->lock);
  pthread_mutex_destroy (&c->io_lock);
  free (c);
  snapfg_engine_set_checkpoints (e, NULL);
}

/* --- lookups --- */

ssize_t
checkpoint_find_locked (struct checkpoint_chain *c, const char *name)
{
  for (size_t i = 0; i < c->list.len; ++i)
    if (strcmp (c->list.ptr[i]->name, name) == 0)
      return i;
  return -1;
}

int
checkpoint_need_catalogue (struct checkpoint_chain *c, const char *what)
{
  if (c && c->cat)
    return 0;
  return snapfg_fail (ENOTSUP, "%s: checkpoints need a catalogue to be recorded in: start "
                               "the server with state=FILE", what);
}



void
checkpoint_track_unlocked (struct snapfg_engine *e, uint64_t offset,
                           uint64_t count)
{
  struct checkpoint_chain *c = snapfg_engine_checkpoints (e);
  struct cbt_bitmap *bm;

  if (c == NULL || snapfg_engine_active_bitmap (e) == NULL)
    return;
  pthread_mutex_lock (&c->io_lock);
  bm = snapfg_engine_active_bitmap (e);
  if (bm)
    cbt_bitmap_mark (bm, offset, count);
  pthread_mutex_unlock (&c->io_lock);
}

int
checkpoint_sync (struct snapfg_engine *e)
{
  struct cbt_bitmap *bm = snapfg_engine_active_bitmap (e);

  /* A failed sync makes the bitmap inconsistent; the origin goes on. */
  if (bm)
    cbt_bitmap_sync (bm);
  return 0;
}

void
checkpoint_track_snapshot_locked (struct snapfg_engine *e,
                                  struct snapfg_snapshot *s)
{
  struct cbt_bitmap *bm = snapfg_engine_active_bitmap (e);
  uint64_t *chunks;
  uint32_t chunk_size;
  size_t n;
  int r;

  if (bm == NULL)
    return;
  r = snapfg_snapshot_remapped_chunks (s, &chunks, &n, &chunk_size);
  if (r < 0) {
    /* Without the list, the bitmap would miss these changes. */
    cbt_bitmap_set_inconsistent (bm, "cannot list the merging snapshot's "
                                 "chunks", -r);
    return;
  }
  for (size_t i = 0; i < n; ++i)
    cbt_bitmap_mark (bm, chunks[i] * chunk_size, chunk_size);
  free (chunks);
  cbt_bitmap_sync (bm);
}
