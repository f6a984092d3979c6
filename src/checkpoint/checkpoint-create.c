/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: creating and dropping checkpoints (see checkpoint.h).
 *
 * Creating is in steps so that the engine can take a snapshot and a
 * checkpoint at one instant: prepare (the new bitmap, chain lock held),
 * commit under the geometry write lock (the catalogue first, then the
 * switch), finish or abandon.  Dropping folds the bits of the dropped
 * checkpoint into its predecessor before the catalogue forgets it.
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
#include "scoped-lock.h"
#include "snapfg-log.h"

#define MAX_NAME 128

static const char *
check_name (const char *name)
{
  size_t len = strlen (name);

  if (len == 0)
    return "must not be empty";
  if (len > MAX_NAME)
    return "is longer than 128 characters";
  if (name[0] == '.' || name[0] == '-')
    return "must not start with '.' or '-'";
  for (const char *p = name; *p; ++p)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
          (*p >= '0' && *p <= '9') || strchr ("._-+@:", *p)))
      return "may only hold letters, digits and . _ - + @ :";
  return NULL;
}

int
checkpoint_prepare (struct snapfg_engine *e, const char *name,
                    const char *snapshot, struct checkpoint **cpp)
{
  struct checkpoint_chain *c = snapfg_engine_checkpoints (e);
  struct checkpoint *cp;
  struct cbt_binding b;
  const char *problem;
  int r;

  if (c == NULL)
    return checkpoint_need_catalogue (c, "checkpoint create");
  pthread_mutex_lock (&c->lock);
  r = checkpoint_need_catalogue (c, "checkpoint create");
  if (r < 0)
    goto err;
  problem = check_name (name);
  if (problem) {
    r = snapfg_fail (EINVAL, "checkpoint name \"%s\": %s", name, problem);
    goto err;
  }
  if (checkpoint_find_locked (c, name) >= 0) {
    r = snapfg_fail (EEXIST, "checkpoint \"%s\" already exists (drop it first, or "
                             "choose another name)", name);
    goto err;
  }
  cp = calloc (1, sizeof *cp);
  if (cp == NULL) {
    r = -ENOMEM;
    goto err;
  }
  cp->name = strdup (name);
  cp->snapshot = snapshot ? strdup (snapshot) : NULL;
  cp->bitmap_path = catalogue_state_file (c->cat, name, "cbt");
  cp->granularity = c->granularity;
  if (cp->name == NULL || cp->bitmap_path == NULL ||
      (snapshot && cp->snapshot == NULL)) {
    r = cp->bitmap_path ? -ENOMEM : -EINVAL;
    checkpoint_free (cp);
    goto err;
  }
  if (access (cp->bitmap_path, F_OK) == 0) {
    /* Left behind by a server that died between making the file and
     * recording it: ours (it has our magic and is bound to this
     * catalogue and checkpoint, or to none) and unrecorded, so it can
     * go.  Anything else is not touched (and the create below refuses).
     */
    struct cbt_bitmap *old = NULL;
    char why[512];
    bool ours;

    checkpoint_binding (e, name, c->next_seq, &b);
    if (cbt_bitmap_open (cp->bitmap_path, snapfg_size (e), &b, &old, why,
                         sizeof why) == 0) {
      ours = !old->foreign;
      cbt_bitmap_close (old);
    }
    else
      ours = false;
    if (ours) {
      snapfg_debug ("checkpoint %s: replacing the unrecorded bitmap %s",
                    name, cp->bitmap_path);
      unlink (cp->bitmap_path);
    }
  }
  checkpoint_binding (e, name, c->next_seq, &b);
  r = cbt_bitmap_create (cp->bitmap_path, cp->granularity, snapfg_size (e), &b,
                         &cp->bm);
  if (r < 0) {
    checkpoint_free (cp);
    goto err;
  }
  cp->bm->on_inconsistent = checkpoint_note_inconsistent;
  cp->bm->opaque = c;
  cp->created = cp->bm->created;
  cp->seq = c->next_seq;
  *cpp = cp;
  return 0;                     /* c->lock stays held until finish/abandon */

 err:
  pthread_mutex_unlock (&c->lock);
  return r;
}

int
checkpoint_set_owner (struct checkpoint *cp, const char *owner)
{
  free (cp->owner);
  cp->owner = owner ? strdup (owner) : NULL;
  return owner && cp->owner == NULL ? -ENOMEM : 0;
}

int
checkpoint_commit_locked (struct snapfg_engine *e, struct checkpoint *cp)
{
  struct checkpoint_chain *c = snapfg_engine_checkpoints (e);
  int r;

  /* Room for cp past the end: it joins the list only once recorded. */
  if (checkpoint_vector_reserve (&c->list, 1) < 0)
    return -ENOMEM;
  c->list.ptr[c->list.len] = cp;
  /* The catalogue first: a crash after this restarts with cp active and
   * the previous one frozen, which is exactly what the origin writes
   * from now on (held off by the write side) will find.
   */
  r = checkpoint_records_write (c, c->list.ptr, c->list.len + 1);
  if (r < 0)
    return r;
  pthread_mutex_lock (&c->io_lock);
  cp->frozen = c->list.len ? c->list.ptr[c->list.len - 1] : NULL;
  c->list.len++;
  c->next_seq++;
  snapfg_engine_set_active_bitmap (e, cp->bm);
  pthread_mutex_unlock (&c->io_lock);
  return 0;
}

void
checkpoint_finish (struct snapfg_engine *e, struct checkpoint *cp)
{
  struct checkpoint_chain *c = snapfg_engine_checkpoints (e);

  /* Nobody writes the frozen bitmap any more: make it durable and clean,
   * so that an unclean system stop from now on leaves it consistent.
   */
  if (cp->frozen && !is_inconsistent (cp->frozen))
    cbt_bitmap_set_clean (cp->frozen->bm);
  cp->frozen = NULL;
  checkpoint_record_pending (c);
  snapfg_debug ("checkpoint %s created (granularity %" PRIu32 "%s%s)",
                cp->name, cp->granularity, cp->snapshot ? ", with snapshot "
                : "", cp->snapshot ? cp->snapshot : "");
  pthread_mutex_unlock (&c->lock);
}

void
checkpoint_abandon (struct snapfg_engine *e, struct checkpoint *cp)
{
  struct checkpoint_chain *c = snapfg_engine_checkpoints (e);

  unlink (cp->bitmap_path);
  checkpoint_free (cp);
  pthread_mutex_unlock (&c->lock);
}

int
snapfg_checkpoint_create (struct snapfg_engine *e, const char *name)
{
  struct checkpoint *cp;
  int r;

  r = checkpoint_prepare (e, name, NULL, &cp);
  if (r < 0)
    return r;
  /* The instant: origin changes in flight finish in the old bitmap; the
   * next ones find the new one.
   */
  snapfg_engine_hold_requests (e);
  r = checkpoint_commit_locked (e, cp);
  snapfg_engine_release_requests (e);
  if (r < 0) {
    snapfg_fail (-r, "checkpoint create %s: cannot record it in the catalogue",
                     name);
    checkpoint_abandon (e, cp);
    return r;
  }
  checkpoint_finish (e, cp);
  return 0;
}

void
checkpoint_forget_snapshot (struct snapfg_engine *e, const char *snapshot)
{
  struct checkpoint_chain *c = snapfg_engine_checkpoints (e);
  bool found = false;

  if (c == NULL || c->cat == NULL)
    return;
  SCOPED_MUTEX_LOCK (&c->lock);
  for (size_t i = 0; i < c->list.len; ++i)
    if (c->list.ptr[i]->snapshot && strcmp (c->list.ptr[i]->snapshot, snapshot) == 0) {
      free (c->list.ptr[i]->snapshot);
      c->list.ptr[i]->snapshot = NULL;
      found = true;
    }
  if (found && checkpoint_records_write (c, c->list.ptr, c->list.len) < 0)
    snapfg_debug ("checkpoints: cannot record that snapshot %s is a new "
                  "one (at the next change)", snapshot);
}

/* --- dropping --- */

/* Make cp inconsistent (its bitmap flags it too, if it has one). */
static void
make_inconsistent (struct checkpoint *cp, const char *why)
{
  if (cp->bm)
    cbt_bitmap_set_inconsistent (cp->bm, why, 0);
  else
    cp->lost = true;
}

/* pred |= cp (durably); pred inconsistent if cp is or the write fails. */
static void
fold_into (struct checkpoint *pred, struct checkpoint *cp)
{
  int r;

  if (is_inconsistent (pred))
    return;                     /* refused anyway: nothing to keep exact */
  if (is_inconsistent (cp)) {
    make_inconsistent (pred, "a later checkpoint dropped into it was "
                       "inconsistent");
    return;
  }
  r = cbt_bitmap_or (pred->bm, cp->bm);
  if (r < 0)
    cbt_bitmap_set_inconsistent (pred->bm, "merging a dropped checkpoint's "
                                 "bits into it failed", -r);
}

int
snapfg_checkpoint_drop (struct snapfg_engine *e, const char *name)
{
  struct checkpoint_chain *c = snapfg_engine_checkpoints (e);
  struct checkpoint *cp, *pred, **rest;
  bool active;
  ssize_t i;
  int r;

  r = checkpoint_need_catalogue (c, "checkpoint drop");
  if (r < 0)
    return r;
  SCOPED_MUTEX_LOCK (&c->lock);
  i = checkpoint_find_locked (c, name);
  if (i < 0) {
    return snapfg_fail (ENOENT, "checkpoint drop: no checkpoint named \"%s\"", name);
  }
  cp = c->list.ptr[i];
  pred = i > 0 ? c->list.ptr[i - 1] : NULL;
  active = (size_t) i == c->list.len - 1;

  /* The chain without cp, for the catalogue. */
  rest = calloc (c->list.len, sizeof *rest);
  if (rest == NULL)
    return -ENOMEM;
  memcpy (rest, c->list.ptr, i * sizeof *rest);
  memcpy (rest + i, c->list.ptr + i + 1,
          (c->list.len - i - 1) * sizeof *rest);

  if (!active) {
    /* Frozen: nobody writes cp or pred.  Its bits go into pred durably
     * before the catalogue forgets it, so a crash in between leaves both
     * (over-reporting from pred, never under-reporting).
     */
    if (pred)
      fold_into (pred, cp);
    r = checkpoint_records_write (c, rest, c->list.len - 1);
  }
  else {
    /* The active one: pred (if any) takes over tracking, at an instant
     * with no origin change in flight.  pred is marked in use first.
     */
    if (pred && !is_inconsistent (pred))
      cbt_bitmap_set_dirty (pred->bm);
    snapfg_engine_hold_requests (e);
    pthread_mutex_lock (&c->io_lock);
    if (pred)
      fold_into (pred, cp);
    r = checkpoint_records_write (c, rest, c->list.len - 1);
    if (r == 0)
      snapfg_engine_set_active_bitmap (e, pred && !is_inconsistent (pred) ? pred->bm : NULL);
    pthread_mutex_unlock (&c->io_lock);
    snapfg_engine_release_requests (e);
  }
  if (r < 0) {
    snapfg_fail (-r, "checkpoint drop %s: cannot record it in the catalogue; "
                     "the checkpoint is kept", name);
    free (rest);
    return r;
  }
  free (rest);
  checkpoint_vector_remove (&c->list, i);
  if (cp->bm && cp->bm->foreign)
    snapfg_notice ("checkpoint %s dropped; %s is another checkpoint's "
                   "bitmap, so it is left in place", name, cp->bitmap_path);
  else if (unlink (cp->bitmap_path) == -1)
    snapfg_debug ("checkpoint %s: cannot remove %s: %m", name,
                  cp->bitmap_path);
  snapfg_debug ("checkpoint %s dropped%s%s", name,
                pred ? "; its changes are now in " : "",
                pred ? pred->name : "");
  checkpoint_free (cp);
  checkpoint_record_pending (c);
  return 0;
}

