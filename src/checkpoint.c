/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: checkpoints — the chain of dirty bitmaps (see checkpoint.h). */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <unistd.h>
#include <pthread.h>

#include "checkpoint.h"
#include "cbt-bitmap.h"
#include "catalogue.h"
#include "engine-internal.h"
#include "snapfg-log.h"

#define MAX_NAME 128

struct checkpoint {
  char *name;
  char *bitmap_path;
  char *snapshot;               /* created with this snapshot, or NULL */
  uint64_t seq;
  int64_t created;
  uint32_t granularity;
  struct cbt_bitmap *bm;        /* NULL: the bitmap could not be opened */
  bool lost;                    /* inconsistent whatever the bitmap says */
  struct checkpoint *frozen;    /* prepared: the one its commit froze */
};

struct checkpoint_chain {
  struct catalogue *cat;        /* NULL: no state=, no checkpoints */
  uint32_t granularity;         /* for new checkpoints */
  pthread_mutex_t lock;         /* commands; the list */
  pthread_mutex_t io_lock;      /* see checkpoint.h */
  struct checkpoint **list;     /* creation order: the last is active */
  size_t n;
  uint64_t next_seq;
  /* A bitmap became inconsistent at run time and the catalogue does not
   * say so yet (it is written at the next command or at close).
   */
  atomic_bool unrecorded;
};

static bool
is_inconsistent (const struct checkpoint *cp)
{
  return cp->lost || cp->bm == NULL || atomic_load (&cp->bm->inconsistent);
}

static const char *
state_of (const struct checkpoint_chain *c, size_t i)
{
  if (is_inconsistent (c->list[i]))
    return CATALOGUE_CHECKPOINT_INCONSISTENT;
  return i == c->n - 1 ? CATALOGUE_CHECKPOINT_ACTIVE
    : CATALOGUE_CHECKPOINT_FROZEN;
}

static void
checkpoint_free (struct checkpoint *cp)
{
  if (cp == NULL)
    return;
  cbt_bitmap_close (cp->bm);
  free (cp->name);
  free (cp->bitmap_path);
  free (cp->snapshot);
  free (cp);
}

static void
note_inconsistent (struct cbt_bitmap *bm, void *opaque)
{
  struct checkpoint_chain *c = opaque;

  atomic_store (&c->unrecorded, true);
}

/* Rewrite the catalogue's checkpoint list as list[0..n) (the chain as it
 * is or is about to be), in one atomic rewrite.
 */
static int
records_write (struct checkpoint_chain *c, struct checkpoint **list,
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
  }
  r = catalogue_checkpoints_set (c->cat, recs, n);
  if (r < 0)
    atomic_store (&c->unrecorded, true);
  free (recs);
  return r;
}

/* Record a run-time inconsistency that the catalogue does not hold yet. */
static void
record_pending (struct checkpoint_chain *c)
{
  if (c->cat && atomic_load (&c->unrecorded))
    records_write (c, c->list, c->n);
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
  e->cbt = c;
  if (cat == NULL)
    return 0;

  r = catalogue_checkpoints (cat, &recs, &nrecs);
  if (r < 0)
    return r;
  qsort (recs, nrecs, sizeof *recs, compare_seq);
  c->list = calloc (nrecs ? nrecs : 1, sizeof *c->list);
  if (c->list == NULL) {
    catalogue_checkpoints_free (recs, nrecs);
    return -ENOMEM;
  }
  for (size_t i = 0; i < nrecs; ++i) {
    struct catalogue_checkpoint *rec = &recs[i];
    struct checkpoint *cp = calloc (1, sizeof *cp);
    char why[512];

    if (cp == NULL) {
      catalogue_checkpoints_free (recs, nrecs);
      return -ENOMEM;
    }
    cp->name = strdup (rec->name);
    cp->bitmap_path = strdup (rec->bitmap);
    cp->snapshot = rec->snapshot ? strdup (rec->snapshot) : NULL;
    cp->seq = rec->seq;
    cp->created = rec->created;
    cp->granularity = rec->granularity;
    c->list[c->n++] = cp;
    if (cp->name == NULL || cp->bitmap_path == NULL ||
        (rec->snapshot && cp->snapshot == NULL)) {
      catalogue_checkpoints_free (recs, nrecs);
      return -ENOMEM;
    }
    if (rec->seq >= c->next_seq)
      c->next_seq = rec->seq + 1;
    if (rec->state && strcmp (rec->state,
                              CATALOGUE_CHECKPOINT_INCONSISTENT) == 0)
      cp->lost = true;

    r = cbt_bitmap_open (cp->bitmap_path, e->size, &cp->bm, why, sizeof why);
    if (r < 0) {
      snapfg_error ("checkpoint %s: bitmap %s: %s; the checkpoint is "
                    "inconsistent (a full backup is needed; drop it when "
                    "done)", cp->name, cp->bitmap_path, why);
      cp->bm = NULL;
      rewrite |= !cp->lost;
      cp->lost = true;
      continue;
    }
    cp->bm->on_inconsistent = note_inconsistent;
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
  for (size_t i = 0; i < c->n; ++i) {
    struct checkpoint *cp = c->list[i];

    if (is_inconsistent (cp))
      continue;
    if (i == c->n - 1) {
      if (cbt_bitmap_set_dirty (cp->bm) == 0)
        atomic_store (&e->cbt_active, cp->bm);
      else
        rewrite = true;
    }
    else if (cbt_bitmap_set_clean (cp->bm) < 0)
      rewrite = true;
  }
  if (rewrite || atomic_load (&c->unrecorded))
    records_write (c, c->list, c->n);
  if (c->n)
    snapfg_debug ("checkpoints: %zu reopened, %s active", c->n,
                  atomic_load (&e->cbt_active) ? c->list[c->n - 1]->name
                  : "none");
  return 0;
}

void
checkpoint_chain_close (struct snapfg_engine *e, bool clean)
{
  struct checkpoint_chain *c = e->cbt;

  if (c == NULL)
    return;
  atomic_store (&e->cbt_active, NULL);
  if (clean && c->n && !is_inconsistent (c->list[c->n - 1]))
    cbt_bitmap_set_clean (c->list[c->n - 1]->bm);
  record_pending (c);
  for (size_t i = 0; i < c->n; ++i)
    checkpoint_free (c->list[i]);
  free (c->list);
  pthread_mutex_destroy (&c->lock);
  pthread_mutex_destroy (&c->io_lock);
  free (c);
  e->cbt = NULL;
}

/* --- names and lookups --- */

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

static ssize_t
find_locked (struct checkpoint_chain *c, const char *name)
{
  for (size_t i = 0; i < c->n; ++i)
    if (strcmp (c->list[i]->name, name) == 0)
      return i;
  return -1;
}

static int
need_catalogue (struct checkpoint_chain *c, const char *what)
{
  if (c && c->cat)
    return 0;
  snapfg_error ("%s: checkpoints need a catalogue to be recorded in: start "
                "the server with state=FILE", what);
  return -ENOTSUP;
}

/* --- creating --- */

int
checkpoint_prepare (struct snapfg_engine *e, const char *name,
                    const char *snapshot, struct checkpoint **cpp)
{
  struct checkpoint_chain *c = e->cbt;
  struct checkpoint *cp;
  const char *problem;
  int r;

  if (c == NULL)
    return need_catalogue (c, "checkpoint create");
  pthread_mutex_lock (&c->lock);
  r = need_catalogue (c, "checkpoint create");
  if (r < 0)
    goto err;
  problem = check_name (name);
  if (problem) {
    snapfg_error ("checkpoint name \"%s\": %s", name, problem);
    r = -EINVAL;
    goto err;
  }
  if (find_locked (c, name) >= 0) {
    snapfg_error ("checkpoint \"%s\" already exists (drop it first, or "
                  "choose another name)", name);
    r = -EEXIST;
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
     * recording it: ours (it has our magic) and unrecorded, so it can
     * go.  Anything else is not touched.
     */
    struct cbt_bitmap *old;
    char why[512];

    if (cbt_bitmap_open (cp->bitmap_path, e->size, &old, why,
                         sizeof why) == 0) {
      cbt_bitmap_close (old);
      snapfg_debug ("checkpoint %s: replacing the unrecorded bitmap %s",
                    name, cp->bitmap_path);
      unlink (cp->bitmap_path);
    }
  }
  r = cbt_bitmap_create (cp->bitmap_path, cp->granularity, e->size,
                         &cp->bm);
  if (r < 0) {
    checkpoint_free (cp);
    goto err;
  }
  cp->bm->on_inconsistent = note_inconsistent;
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
checkpoint_commit_locked (struct snapfg_engine *e, struct checkpoint *cp)
{
  struct checkpoint_chain *c = e->cbt;
  struct checkpoint **list;
  int r;

  list = realloc (c->list, (c->n + 1) * sizeof *list);
  if (list == NULL)
    return -ENOMEM;
  c->list = list;
  list[c->n] = cp;
  /* The catalogue first: a crash after this restarts with cp active and
   * the previous one frozen, which is exactly what the origin writes
   * from now on (held off by the write side) will find.
   */
  r = records_write (c, list, c->n + 1);
  if (r < 0)
    return r;
  pthread_mutex_lock (&c->io_lock);
  cp->frozen = c->n ? c->list[c->n - 1] : NULL;
  c->n++;
  c->next_seq++;
  atomic_store (&e->cbt_active, cp->bm);
  pthread_mutex_unlock (&c->io_lock);
  return 0;
}

void
checkpoint_finish (struct snapfg_engine *e, struct checkpoint *cp)
{
  struct checkpoint_chain *c = e->cbt;

  /* Nobody writes the frozen bitmap any more: make it durable and clean,
   * so that an unclean system stop from now on leaves it consistent.
   */
  if (cp->frozen && !is_inconsistent (cp->frozen))
    cbt_bitmap_set_clean (cp->frozen->bm);
  cp->frozen = NULL;
  record_pending (c);
  snapfg_debug ("checkpoint %s created (granularity %" PRIu32 "%s%s)",
                cp->name, cp->granularity, cp->snapshot ? ", with snapshot "
                : "", cp->snapshot ? cp->snapshot : "");
  pthread_mutex_unlock (&c->lock);
}

void
checkpoint_abandon (struct snapfg_engine *e, struct checkpoint *cp)
{
  struct checkpoint_chain *c = e->cbt;

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
  percpu_rwlock_write_lock (&e->geometry);
  r = checkpoint_commit_locked (e, cp);
  percpu_rwlock_write_unlock (&e->geometry);
  if (r < 0) {
    snapfg_error ("checkpoint create %s: cannot record it in the catalogue",
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
  struct checkpoint_chain *c = e->cbt;
  bool found = false;

  if (c == NULL || c->cat == NULL)
    return;
  pthread_mutex_lock (&c->lock);
  for (size_t i = 0; i < c->n; ++i)
    if (c->list[i]->snapshot && strcmp (c->list[i]->snapshot, snapshot) == 0) {
      free (c->list[i]->snapshot);
      c->list[i]->snapshot = NULL;
      found = true;
    }
  if (found && records_write (c, c->list, c->n) < 0)
    snapfg_debug ("checkpoints: cannot record that snapshot %s is a new "
                  "one (at the next change)", snapshot);
  pthread_mutex_unlock (&c->lock);
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
  struct checkpoint_chain *c = e->cbt;
  struct checkpoint *cp, *pred, **rest;
  bool active;
  ssize_t i;
  int r;

  if (c == NULL)
    return need_catalogue (c, "checkpoint drop");
  pthread_mutex_lock (&c->lock);
  r = need_catalogue (c, "checkpoint drop");
  if (r < 0)
    goto out;
  i = find_locked (c, name);
  if (i < 0) {
    snapfg_error ("checkpoint drop: no checkpoint named \"%s\"", name);
    r = -ENOENT;
    goto out;
  }
  cp = c->list[i];
  pred = i > 0 ? c->list[i - 1] : NULL;
  active = (size_t) i == c->n - 1;

  /* The chain without cp, for the catalogue. */
  rest = calloc (c->n, sizeof *rest);
  if (rest == NULL) {
    r = -ENOMEM;
    goto out;
  }
  memcpy (rest, c->list, i * sizeof *rest);
  memcpy (rest + i, c->list + i + 1, (c->n - i - 1) * sizeof *rest);

  if (!active) {
    /* Frozen: nobody writes cp or pred.  Its bits go into pred durably
     * before the catalogue forgets it, so a crash in between leaves both
     * (over-reporting from pred, never under-reporting).
     */
    if (pred)
      fold_into (pred, cp);
    r = records_write (c, rest, c->n - 1);
  }
  else {
    /* The active one: pred (if any) takes over tracking, at an instant
     * with no origin change in flight.  pred is marked in use first.
     */
    if (pred && !is_inconsistent (pred))
      cbt_bitmap_set_dirty (pred->bm);
    percpu_rwlock_write_lock (&e->geometry);
    pthread_mutex_lock (&c->io_lock);
    if (pred)
      fold_into (pred, cp);
    r = records_write (c, rest, c->n - 1);
    if (r == 0)
      atomic_store (&e->cbt_active,
                    pred && !is_inconsistent (pred) ? pred->bm : NULL);
    pthread_mutex_unlock (&c->io_lock);
    percpu_rwlock_write_unlock (&e->geometry);
  }
  if (r < 0) {
    snapfg_error ("checkpoint drop %s: cannot record it in the catalogue; "
                  "the checkpoint is kept", name);
    free (rest);
    goto out;
  }
  free (c->list);
  c->list = rest;
  c->n--;
  if (unlink (cp->bitmap_path) == -1)
    snapfg_debug ("checkpoint %s: cannot remove %s: %m", name,
                  cp->bitmap_path);
  snapfg_debug ("checkpoint %s dropped%s%s", name,
                pred ? "; its changes are now in " : "",
                pred ? pred->name : "");
  checkpoint_free (cp);
  record_pending (c);

 out:
  pthread_mutex_unlock (&c->lock);
  return r;
}

/* --- queries --- */

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
  struct checkpoint_chain *c = e->cbt;
  int r = 0;

  if (c == NULL)
    return need_catalogue (c, "checkpoint list");
  pthread_mutex_lock (&c->lock);
  r = need_catalogue (c, "checkpoint list");
  record_pending (c);
  for (size_t i = 0; r == 0 && i < c->n; ++i) {
    struct checkpoint *cp = c->list[i];
    struct snapfg_checkpoint_info info = {
      .name = cp->name,
      .state = state_of (c, i),
      .snapshot = cp->snapshot,
      .bitmap = cp->bitmap_path,
      .granularity = cp->granularity,
      .created = cp->created,
      .seq = cp->seq,
      .dirty_bytes = cp->bm ? dirty_bytes (cp->bm) : 0,
    };
    r = fn (opaque, &info);
  }
  pthread_mutex_unlock (&c->lock);
  return r;
}

int
snapfg_checkpoint_changed (struct snapfg_engine *e, const char *since,
                           const char *snapshot, uint32_t *granularity,
                           snapfg_range_fn fn, void *opaque)
{
  struct checkpoint_chain *c = e->cbt;
  struct cbt_bitmap *u = NULL;
  ssize_t first, end;
  uint32_t g;
  int r;

  if (c == NULL)
    return need_catalogue (c, "changed --since");
  pthread_mutex_lock (&c->lock);
  r = need_catalogue (c, "changed --since");
  if (r < 0)
    goto out;
  record_pending (c);
  first = find_locked (c, since);
  if (first < 0) {
    snapfg_error ("changed: no checkpoint named \"%s\"", since);
    r = -ENOENT;
    goto out;
  }
  end = c->n;
  if (snapshot) {
    /* The newest checkpoint made with that snapshot marks its instant. */
    for (end = c->n - 1; end >= 0; --end)
      if (c->list[end]->snapshot &&
          strcmp (c->list[end]->snapshot, snapshot) == 0)
        break;
    if (end < 0) {
      snapfg_error ("changed: snapshot \"%s\" was not created with a "
                    "checkpoint (create it with --checkpoint), or that "
                    "checkpoint was dropped", snapshot);
      r = -ENOENT;
      goto out;
    }
    if (end < first) {
      snapfg_error ("changed: checkpoint \"%s\" is newer than snapshot "
                    "\"%s\" (its checkpoint is \"%s\")", since, snapshot,
                    c->list[end]->name);
      r = -EINVAL;
      goto out;
    }
  }
  /* Refuse before answering anything: never a silently short delta. */
  for (ssize_t i = first; i < end; ++i)
    if (is_inconsistent (c->list[i])) {
      snapfg_error ("changed: checkpoint \"%s\" is inconsistent (the system "
                    "stopped uncleanly or its bitmap could not be written), "
                    "so the changes since \"%s\" are not known: a full "
                    "backup is needed", c->list[i]->name, since);
      r = -ESTALE;
      goto out;
    }

  /* The union, at the finest granularity among its bitmaps. */
  g = c->list[first]->granularity;
  for (ssize_t i = first; i < end; ++i)
    if (c->list[i]->granularity < g)
      g = c->list[i]->granularity;
  *granularity = g;
  u = cbt_bitmap_new_memory (g, e->size);
  if (u == NULL) {
    r = -ENOMEM;
    goto out;
  }
  for (ssize_t i = first; i < end && r == 0; ++i)
    r = cbt_bitmap_or (u, c->list[i]->bm);
  if (r < 0)
    goto out;

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
    if (stop > e->size)
      stop = e->size;
    r = fn (opaque, start << u->shift, stop - (start << u->shift));
  }

 out:
  cbt_bitmap_close (u);
  pthread_mutex_unlock (&c->lock);
  return r;
}

/* --- the engine's hooks --- */

void
checkpoint_track_unlocked (struct snapfg_engine *e, uint64_t offset,
                           uint64_t count)
{
  struct checkpoint_chain *c = e->cbt;
  struct cbt_bitmap *bm;

  if (c == NULL || atomic_load (&e->cbt_active) == NULL)
    return;
  pthread_mutex_lock (&c->io_lock);
  bm = atomic_load (&e->cbt_active);
  if (bm)
    cbt_bitmap_mark (bm, offset, count);
  pthread_mutex_unlock (&c->io_lock);
}

int
checkpoint_sync (struct snapfg_engine *e)
{
  struct cbt_bitmap *bm = atomic_load (&e->cbt_active);

  /* A failed sync makes the bitmap inconsistent; the origin goes on. */
  if (bm)
    cbt_bitmap_sync (bm);
  return 0;
}

void
checkpoint_track_snapshot_locked (struct snapfg_engine *e,
                                  struct snapfg_snapshot *s)
{
  struct cbt_bitmap *bm = atomic_load (&e->cbt_active);
  uint64_t *chunks;
  size_t n;
  int r;

  if (bm == NULL)
    return;
  r = exception_table_collect (&s->table, &chunks, &n);
  if (r < 0) {
    /* Without the list, the bitmap would miss these changes. */
    cbt_bitmap_set_inconsistent (bm, "cannot list the merging snapshot's "
                                 "chunks", -r);
    return;
  }
  for (size_t i = 0; i < n; ++i)
    cbt_bitmap_mark (bm, chunks[i] << s->chunk_shift, s->chunk_size);
  free (chunks);
  cbt_bitmap_sync (bm);
}
