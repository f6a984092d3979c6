/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: creating a snapshot (docs/design.md sections 2 and 7).
 *
 * The checks that need no lock, opening (or reopening) the COW store
 * and loading its exceptions, the checkpoint taken at the same instant,
 * and the insertion into the engine's list under the geometry write
 * lock: the snapshot's point in time.  A refusal at any step leaves
 * nothing behind.
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
#include "lifecycle.h"
#include "scoped-lock.h"
#include "vector.h"
#include "catalogue.h"
#include "checkpoint.h"
#include "store-binding.h"
#include "snapfg-log.h"

/* Is the file or URI at path already some snapshot's COW store?  Returns
 * that snapshot's name.  (The origin itself is refused when the store
 * opens.)
 */
static const char *
cow_in_use_locked (struct snapfg_engine *e, const char *path)
{
  for (size_t i = 0; i < e->nsnapshots; ++i)
    if (device_is_named (&e->snapshots[i]->store->dev, path))
      return e->snapshots[i]->name;
  return NULL;
}

/* Undo a snapshot that never made it into the list.  A COW file that
 * opening the store created goes too: the failed command leaves nothing
 * behind.  Anything that existed before is left as it is.
 */
static void
snapshot_discard (struct snapfg_snapshot *s)
{
  char *created = NULL;

  if (s->store && s->store->created)
    created = strdup (s->store->dev.path);
  snapshot_free (s, false);
  if (created) {
    unlink (created);
    free (created);
  }
}

static int
load_exception (void *opaque, uint64_t old_chunk, uint64_t new_chunk)
{
  struct snapfg_snapshot *s = opaque;

  return exception_table_insert (&s->table, old_chunk, new_chunk);
}

static void
too_many_snapshots_why (struct snapfg_engine *e, const char *name,
                        char *buf, size_t len)
{
  snprintf (buf, len, "snapshot \"%s\": the origin already has %u "
            "snapshots, the maximum (max-snapshots=%u); drop one first, or "
            "restart the server with a larger max-snapshots=", name,
            e->max_snapshots, e->max_snapshots);
}

static void
too_many_snapshots (struct snapfg_engine *e, const char *name)
{
  char why[512];

  too_many_snapshots_why (e, name, why, sizeof why);
  snapfg_fail (EMLINK, "%s", why);
}

static void
close_state_dir (int fd)
{
  if (fd >= 0)
    close (fd);
}

static int snapshot_create (struct snapfg_engine *e,
                            const struct snapfg_snapshot_options *o);

/* Put s into the engine's list: from now on it is served and origin
 * writes copy out into it (its instant).  Called with the geometry write
 * lock held, which it never drops.  A refusal is described in why for
 * the caller to log once the lock is released (every request waits while
 * the write side is held); lifecycle_record logs its own errors.
 */
static int
insert_snapshot_locked (struct snapfg_engine *e, struct snapfg_snapshot *s,
                        const struct snapfg_snapshot_options *o,
                        struct checkpoint *cp, const char *store_type,
                        char *why, size_t len)
{
  void *list = e->snapshots;
  int r;

  why[0] = '\0';
  if (engine_find_snapshot_locked (e, o->name) != NULL) {
    snprintf (why, len, "snapshot \"%s\" already exists", o->name);
    return -EEXIST;
  }
  if (e->merging || (s->store->opened_merging &&
                     (e->nsnapshots > 0 || cp))) {
    snprintf (why, len, "snapshot \"%s\": snapshot %s is being merged into "
              "the origin; no other snapshot may exist until it is done",
              o->name, e->merging ? e->merging->name : o->name);
    return -EBUSY;
  }
  if (e->nsnapshots >= e->max_snapshots) {
    too_many_snapshots_why (e, o->name, why, len);
    return -EMLINK;
  }
  /* Grow the list before anything refers to s: on failure s is freed. */
  r = engine_fail_point (e, FAIL_SNAPSHOT_LIST) ? -ENOMEM
    : vector_reserve_ (&list, &e->snapshots_cap, e->nsnapshots, 1,
                       sizeof *e->snapshots);
  if (r < 0) {
    snprintf (why, len, "snapshot \"%s\": out of memory adding it to the "
              "list of snapshots", o->name);
    return r;
  }
  e->snapshots = list;
  /* In the catalogue before anyone can see it, and at its instant: a
   * crash right after leaves a snapshot that a restart brings back.
   */
  r = lifecycle_record (e, s, o, store_type);
  if (r < 0)
    return r;
  /* The checkpoint takes over tracking at the same instant.  If it
   * cannot be recorded, the snapshot is not taken either.
   */
  if (cp) {
    r = checkpoint_commit_locked (e, cp);
    if (r < 0) {
      if (e->catalogue)
        catalogue_snapshot_remove (e->catalogue, s->name, "dropped",
                                   "its checkpoint could not be recorded");
      snprintf (why, len, "snapshot \"%s\": cannot record checkpoint \"%s\" "
                "in the catalogue; the snapshot is not taken", o->name,
                o->checkpoint);
      return r;
    }
  }
  if (s->store->opened_merging) {
    /* A merge was under way: the origin view is the snapshot's from now
     * on, and snapfg_engine_start_background resumes the copying.
     */
    atomic_store (&s->state, SNAPSHOT_MERGING);
    e->merging = s;
  }
  snapshot_live_insert (s);
  e->snapshots[e->nsnapshots++] = s;
  e->min_chunk_size = engine_min_chunk_size (e);
  return 0;
}

static bool
catalogue_knows (void *opaque, const char *uuid)
{
  struct snapfg_engine *e = opaque;
  struct catalogue_snapshot *list;
  size_t n;
  bool known = false;

  if (e->catalogue == NULL ||
      catalogue_snapshots (e->catalogue, &list, &n) < 0)
    return false;
  for (size_t i = 0; i < n; ++i)
    if (strcmp (list[i].uuid, uuid) == 0)
      known = true;
  catalogue_snapshots_free (list, n);
  return known;
}

int
snapfg_snapshot_create (struct snapfg_engine *e,
                        const struct snapfg_snapshot_options *o)
{
  const char *problem = snapfg_check_snapshot_name (o->name);
  int r;

  if (problem) {
    char printable[128];
    snapfg_printable_name (o->name, printable, sizeof printable);
    return snapfg_fail (EINVAL, "snapshot name \"%s\": %s", printable, problem);
  }
  /* Without a COW path the catalogue's state directory holds it. */
  if (o->cow_path == NULL) {
    struct snapfg_snapshot_options own = *o;
    char *path;

    if (e->catalogue == NULL) {
      return snapfg_fail (EINVAL, "create %s: no COW path given, and the server has no "
                                  "state= catalogue whose directory could hold one; give "
                                  "a COW path (snapfgctl create %s --cow PATH)",
                                  o->name, o->name);
    }
    path = catalogue_state_file (e->catalogue, o->name, "cow");
    if (path == NULL)
      return -EINVAL;
    own.cow_path = path;
    own.owned = true;
    r = snapshot_create (e, &own);
    free (path);
    return r;
  }
  return snapshot_create (e, o);
}

/* Step 1: may this snapshot be created now?  The chunk size, the
 * engine's list (full, a merge under way, the name taken, the store
 * taken) and the COW path.  Says why not.
 */
static int
create_check (struct snapfg_engine *e, const struct snapfg_snapshot_options *o)
{
  /* The one check of the chunk size, whoever asked (the plugin's
   * parameters, the control socket, the catalogue).
   */
  uint64_t asked = o->chunk_size ? o->chunk_size : SNAPFG_DEFAULT_CHUNK_SIZE;
  const char *problem = snapfg_check_chunk_size (asked > INT64_MAX ? -1
                                                 : (int64_t) asked);
  const char *in_use;
  bool exists, merging, full;

  if (problem) {
    return snapfg_fail (EINVAL, "chunk-size=%" PRIu64 ": %s", asked, problem);
  }
  {
    SCOPED_GEOMETRY_READ_LOCK (&e->geometry);
    exists = engine_find_snapshot_locked (e, o->name) != NULL;
    in_use = cow_in_use_locked (e, o->cow_path);
    merging = e->merging != NULL;
    full = e->nsnapshots >= e->max_snapshots;
  }
  if (full && !exists) {
    too_many_snapshots (e, o->name);
    return -EMLINK;
  }
  if (merging) {
    return snapfg_fail (EBUSY, "snapshot \"%s\": a snapshot is being merged into the "
                               "origin; no other snapshot may exist until it is done",
                               o->name);
  }
  if (exists) {
    return snapfg_fail (EEXIST, "snapshot \"%s\" already exists", o->name);
  }
  if (in_use) {
    return snapfg_fail (EBUSY, "cow=%s: already the COW store of snapshot \"%s\"; "
                               "every snapshot needs its own", o->cow_path, in_use);
  }
  return lifecycle_check_cow (e, o->cow_path, o->owned);
}

/* Step 2: a store in the state directory is created and opened through
 * the directory's descriptor, by the name the server gives it.  Returns
 * the descriptor (the caller closes it), -1 for a store elsewhere, or
 * -errno.
 */
static int
create_open_state_dir (struct snapfg_engine *e,
                       const struct snapfg_snapshot_options *o,
                       struct snapfg_store_params *params)
{
  const char *slash;
  int fd;

  if (!o->owned)
    return -1;
  slash = strrchr (o->cow_path, '/');
  if (e->catalogue == NULL || slash == NULL) {
    return snapfg_fail (EINVAL, "snapshot \"%s\": its store %s is recorded as the state "
                                "directory's, but there is no catalogue", o->name,
                                o->cow_path);
  }
  fd = catalogue_state_dir_open (e->catalogue, !params->must_exist);
  if (fd < 0)
    return fd;
  params->state_dirfd = fd;
  params->state_leaf = slash + 1;
  return fd;
}

/* Step 3: the snapshot itself, not yet with a store (NULL: no memory). */
static struct snapfg_snapshot *
create_alloc (struct snapfg_engine *e, const struct snapfg_snapshot_options *o)
{
  struct snapfg_snapshot *s = calloc (1, sizeof *s);

  if (s == NULL)
    return NULL;
  s->owned_cow = o->owned;
  s->engine = e;
  atomic_init (&s->state, SNAPSHOT_VALID);
  atomic_init (&s->overflow, false);
  atomic_init (&s->merged, false);
  atomic_init (&s->refs, 1);    /* the engine's list */
  pthread_mutex_init (&s->merge_lock, NULL);
  s->name = strdup (o->name);
  if (s->name == NULL || stats_init (&s->stats) < 0) {
    pthread_mutex_destroy (&s->merge_lock);
    free (s->name);
    free (s);
    return NULL;
  }
  return s;
}

/* Step 4: open the store and load its exceptions.  Opening may read the
 * whole COW file: it is done before stopping the world.  A reopened
 * store's own chunk size wins.  On failure s is gone.
 */
static int
create_open_store (struct snapfg_snapshot *s,
                   const struct snapfg_store_params *params)
{
  struct snapfg_engine *e = s->engine;
  int r = store_open (params, &s->store);

  if (r < 0) {
    snapshot_free (s, false);
    return r;                   /* -ESTALE: see snapfg_engine_restore */
  }
  s->chunk_size = s->store->chunk_size;
  s->chunk_shift = s->store->chunk_shift;
  r = exception_table_init (&s->table,
                            e->locking == SNAPFG_LOCKING_GLOBAL
                            ? 0 : SNAPFG_STRIPE_BITS);
  /* Which regions ever had an exception: the snapshot's block status
   * asks the origin alone about the others (io-snapshot.c).
   */
  if (r == 0)
    r = exception_table_map_regions (&s->table,
                                     (e->size >> s->chunk_shift) + 1);
  if (r == 0) {
    if (s->store->opened_invalid)
      atomic_store (&s->state, SNAPSHOT_INVALID);
    else if (s->store->ops->load)
      r = s->store->ops->load (s->store, load_exception, s);
  }
  if (r < 0)
    snapshot_discard (s);
  return r;
}

/* Step 5: a checkpoint started at the same instant: its bitmap file is
 * made now, outside the write side.  Checkpoints of an older snapshot of
 * this name let go of it first.  *cpp: NULL if none was asked for.
 */
static int
create_prepare_checkpoint (struct snapfg_engine *e,
                           const struct snapfg_snapshot_options *o,
                           struct checkpoint **cpp)
{
  int r;

  *cpp = NULL;
  if (o->attach == SNAPFG_ATTACH_RUNTIME)
    checkpoint_forget_snapshot (e, o->name);
  if (o->checkpoint == NULL)
    return 0;
  r = checkpoint_prepare (e, o->checkpoint, o->name, cpp);
  if (r == 0 && o->checkpoint_owner &&
      (r = checkpoint_set_owner (*cpp, o->checkpoint_owner)) < 0) {
    checkpoint_abandon (e, *cpp);
    *cpp = NULL;
  }
  return r;
}

static int
snapshot_create (struct snapfg_engine *e,
                 const struct snapfg_snapshot_options *o)
{
  struct binding_want want = {
    .request = o->attach == SNAPFG_ATTACH_RESTORE ? BIND_RESTORE
    : o->attach == SNAPFG_ATTACH_STARTUP ? BIND_STARTUP : BIND_RUNTIME,
    .origin = &e->origin,
    .name = o->name,
    .catalogue_id = e->catalogue ? catalogue_id (e->catalogue) : NULL,
    .uuid = o->uuid,
    .merge_expected = o->merging,
    .origin_moved = e->origin_moved,
    .catalogue_knows = catalogue_knows,
    .opaque = e,
  };
  struct snapfg_store_params params = {
    .type = o->store_type ? o->store_type : SNAPFG_DEFAULT_STORE_TYPE,
    .path = o->cow_path,
    .chunk_size = o->chunk_size ? o->chunk_size : SNAPFG_DEFAULT_CHUNK_SIZE,
    .cow_size = o->cow_size,
    .origin = &e->origin,
    .origin_size = e->size,
    .unsynced = e->durability == SNAPFG_DURABILITY_FLUSH,
    .bind = &want,
    .must_exist = o->attach == SNAPFG_ATTACH_RESTORE,
  };
  struct snapfg_snapshot *s;
  struct checkpoint *cp;
  char why[1024];
  int state_dirfd, r;

  r = create_check (e, o);
  if (r < 0)
    return r;
  state_dirfd = create_open_state_dir (e, o, &params);
  if (state_dirfd < -1)
    return state_dirfd;
  s = create_alloc (e, o);
  if (s == NULL) {
    close_state_dir (state_dirfd);
    return -ENOMEM;
  }
  r = create_open_store (s, &params);
  close_state_dir (state_dirfd);
  if (r < 0)
    return r;
  /* Writes held before an unclean stop belong before this snapshot's
   * instant: replay them first, unless this is one of the stores they
   * were held for (re-attached at start-up; they may need its copies).
   */
  if (writeback_replay_pending (e) &&
      !writeback_replay_binds (e, s->store->uuid) &&
      (r = origin_replay_held (e)) < 0) {
    snapshot_discard (s);
    return r;
  }
  r = create_prepare_checkpoint (e, o, &cp);
  if (r < 0) {
    snapshot_discard (s);
    return r;
  }

  /* Step 6, the snapshot's point in time: every origin write in flight
   * holds the read side, so once we hold the write side they have all
   * completed, and every later one sees this snapshot and copies out
   * into it.
   */
  {
    SCOPED_GEOMETRY_WRITE_LOCK (&e->geometry);
    /* Writes acknowledged before the snapshot's instant are in it: held
     * ones reach the origin first (snapshot reads never see held data).
     */
    writeback_drain (e);
    r = insert_snapshot_locked (e, s, o, cp, params.type, why, sizeof why);
    if (r == 0)
      writeback_bind_stores (e);
  }
  if (r < 0) {
    if (why[0])
      snapfg_fail (-r, "%s", why);
    if (cp)
      checkpoint_abandon (e, cp);
    snapshot_discard (s);
    return r;
  }
  if (cp)
    checkpoint_finish (e, cp);

  if (snapfg_debug_cow)
    snapfg_debug ("snapshot %s created: %s store, chunk %" PRIu32
                  ", COW %s", s->name, s->store->ops->name, s->chunk_size,
                  s->store->dev.path);
  return 0;
}
