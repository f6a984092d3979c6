/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the engine — opening the origin, taking snapshots, geometry and
 * status.  The request paths are in io-origin.c, io-snapshot.c and
 * copy-out.c.
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
#include "power-of-two.h"
#include "scoped-lock.h"
#include "vector.h"
#include "catalogue.h"
#include "checkpoint.h"
#include "store-binding.h"
#include "snapfg-log.h"

const char *
snapfg_check_chunk_size (int64_t chunk_size)
{
  if (chunk_size < SNAPFG_MIN_CHUNK_SIZE || chunk_size > SNAPFG_MAX_CHUNK_SIZE)
    return "must be between 512 and 1M";
  if (!is_power_of_two (chunk_size))
    return "must be a power of two";
  return NULL;
}

const char *
snapfg_check_store_type (const char *store_type)
{
  if (store_type_find (store_type) == NULL)
    return "unknown store type (expected " SNAPFG_STORE_TYPE_CHOICES ")";
  return NULL;
}

const char *
snapfg_check_block_size (int64_t block_size)
{
  if (block_size != 512 && block_size != 4096)
    return "must be 512 or 4096";
  return NULL;
}

/* Test hook: SNAPFG_TEST_CRASH_AT=WHERE[:N] kills the process at the Nth
 * (default first) time it reaches WHERE: "cow-data" (a copy-out's data,
 * or all of a batch's, is written, not yet committed), "cow-run" (one run
 * of consecutive chunks of a batch is written; the batch's other runs may
 * not be), "metadata" (the exception, or the whole batch, is committed),
 * "origin-write" (just before any origin write), "merge" (a merge batch
 * is copied into the origin but still in the COW table).
 */
static void
parse_fault_point (struct snapfg_engine *e, const char *spec)
{
  static const struct { const char *name; enum fault_point where; } points[] = {
    { "cow-data", FAULT_AFTER_COW_DATA },
    { "cow-run", FAULT_AFTER_COW_RUN },
    { "metadata", FAULT_AFTER_METADATA },
    { "origin-write", FAULT_BEFORE_ORIGIN_WRITE },
    { "merge", FAULT_MERGE_BATCH },
  };
  const char *colon;
  size_t len;

  e->fault_at = FAULT_NONE;
  if (spec == NULL || *spec == '\0')
    return;
  colon = strchr (spec, ':');
  len = colon ? (size_t) (colon - spec) : strlen (spec);
  for (size_t i = 0; i < sizeof points / sizeof points[0]; ++i)
    if (strlen (points[i].name) == len &&
        strncmp (spec, points[i].name, len) == 0)
      e->fault_at = points[i].where;
  atomic_init (&e->fault_countdown, colon ? strtol (colon + 1, NULL, 10) : 1);
  if (e->fault_at == FAULT_NONE)
    snapfg_error ("SNAPFG_TEST_CRASH_AT=%s: unknown fault point", spec);
}

/* Test hook: SNAPFG_TEST_FAIL_AT=WHERE[:N] makes the Nth (default first)
 * allocation at WHERE fail as if memory ran out: "snapshot-list"
 * (adding a snapshot to the engine's list).  Error paths that no other
 * test can reach deterministically are tested with it.
 */
static void
parse_fail_point (struct snapfg_engine *e, const char *spec)
{
  const char *colon;
  size_t len;

  e->fail_at = FAIL_NONE;
  if (spec == NULL || *spec == '\0')
    return;
  colon = strchr (spec, ':');
  len = colon ? (size_t) (colon - spec) : strlen (spec);
  if (len == strlen ("snapshot-list") &&
      strncmp (spec, "snapshot-list", len) == 0)
    e->fail_at = FAIL_SNAPSHOT_LIST;
  else
    snapfg_error ("SNAPFG_TEST_FAIL_AT=%s: unknown failure point", spec);
  atomic_init (&e->fail_countdown, colon ? strtol (colon + 1, NULL, 10) : 1);
}

int
snapfg_engine_open (const struct snapfg_options *opts,
                    struct snapfg_engine **ep)
{
  struct snapfg_engine *e;
  const char *env;
  int r;

  e = calloc (1, sizeof *e);
  if (e == NULL)
    return -ENOMEM;
  e->locking = opts->locking;
  e->durability = opts->durability;
  e->block_size = opts->block_size ? opts->block_size
    : SNAPFG_DEFAULT_BLOCK_SIZE;
  e->max_snapshots = opts->max_snapshots ? opts->max_snapshots
    : SNAPFG_DEFAULT_MAX_SNAPSHOTS;

  r = device_open (&e->origin, opts->origin_path, false);
  if (r == -EACCES || r == -EROFS || r == -EPERM) {
    /* Still usable for reading and for the snapshots' own writes. */
    r = device_open (&e->origin, opts->origin_path, true);
  }
  if (r < 0) {
    snapfg_error ("origin=%s: cannot open: %s",
                  opts->origin_path, device_strerror (r));
    goto err_free;
  }
  /* Locked while we serve it: a second server, or a program such as
   * QEMU that locks its images, on the same origin is refused.  A
   * read-only origin takes a shared lock: several readers are fine, a
   * writer is not (as with a shared activation in LVM).  An NBD export
   * cannot be locked.
   */
  r = device_lock (&e->origin, !e->origin.readonly);
  if (r < 0) {
    if (r == -EAGAIN)
      snapfg_error ("origin=%s: is in use (locked by another snapfg "
                    "server, or a program such as QEMU); stop it first",
                    opts->origin_path);
    else
      snapfg_error ("origin=%s: cannot lock it: %s", opts->origin_path,
                    strerror (-r));
    r = r == -EAGAIN ? -EBUSY : r;
    goto err_close;
  }
  if (e->origin.size == 0) {
    snapfg_error ("origin=%s: is empty (size 0)", opts->origin_path);
    r = -EINVAL;
    goto err_close;
  }
  e->size = e->origin.size;
  /* Clients are told this size: if the file shrinks under us, requests
   * past its new end fail instead of reading zeroes or growing it.
   */
  e->origin.bounded = true;
  atomic_init (&e->origin_size_seen, e->size);

  e->zeroes = calloc (1, SNAPFG_MAX_CHUNK_SIZE);
  if (e->zeroes == NULL) {
    r = -ENOMEM;
    goto err_close;
  }

  r = percpu_rwlock_init (&e->geometry);
  if (r < 0)
    goto err_zeroes;
  pthread_mutex_init (&e->merge_threads_lock, NULL);
  pthread_cond_init (&e->merge_threads_done, NULL);
  r = stats_init (&e->stats);
  if (r < 0) {
    pthread_cond_destroy (&e->merge_threads_done);
    pthread_mutex_destroy (&e->merge_threads_lock);
    percpu_rwlock_destroy (&e->geometry);
    goto err_zeroes;
  }

  env = getenv ("SNAPFG_TEST_DELAY_US");
  if (env && *env)
    e->test_delay_us = strtoul (env, NULL, 10);
  env = getenv ("SNAPFG_TEST_MERGE_DELAY_US");
  if (env && *env)
    e->test_merge_delay_us = strtoul (env, NULL, 10);
  parse_fault_point (e, getenv ("SNAPFG_TEST_CRASH_AT"));
  parse_fail_point (e, getenv ("SNAPFG_TEST_FAIL_AT"));

  *ep = e;
  return 0;

 err_zeroes:
  free ((void *) e->zeroes);
 err_close:
  device_close (&e->origin);
 err_free:
  free (e);
  return r;
}

pthread_mutex_t engine_live_lock = PTHREAD_MUTEX_INITIALIZER;

static void
live_remove (struct snapfg_snapshot *s)
{
  pthread_mutex_lock (&engine_live_lock);
  if (s->live_prevp) {
    *s->live_prevp = s->live_next;
    if (s->live_next)
      s->live_next->live_prevp = s->live_prevp;
    s->live_prevp = NULL;
  }
  pthread_mutex_unlock (&engine_live_lock);
}

static void
live_insert (struct snapfg_snapshot *s)
{
  struct snapfg_engine *e = s->engine;

  pthread_mutex_lock (&engine_live_lock);
  s->live_next = e->live;
  if (e->live)
    e->live->live_prevp = &s->live_next;
  e->live = s;
  s->live_prevp = &e->live;
  pthread_mutex_unlock (&engine_live_lock);
}

static void
snapshot_free (struct snapfg_snapshot *s, bool clean)
{
  live_remove (s);
  if (s->store)
    s->store->ops->close (s->store, clean);
  if (s->table.stripes)
    exception_table_destroy (&s->table);
  stats_destroy (&s->stats);
  pthread_mutex_destroy (&s->merge_lock);
  free (s->name);
  free (s);
}

void
snapfg_engine_close (struct snapfg_engine *e)
{
  if (e == NULL)
    return;
  for (size_t i = 0; i < e->nsnapshots; ++i)
    merge_stop_thread (e->snapshots[i]);
  /* A merge that ended by itself detached its thread, which may still be
   * on its way out through the geometry lock.
   */
  pthread_mutex_lock (&e->merge_threads_lock);
  while (e->merge_threads > 0)
    pthread_cond_wait (&e->merge_threads_done, &e->merge_threads_lock);
  pthread_mutex_unlock (&e->merge_threads_lock);
  /* No origin change can come any more: the bitmaps close cleanly. */
  checkpoint_chain_close (e, true);
  /* No request can arrive any more, but a connection's close may still
   * hold a reference.  Close every store now anyway (a transient store
   * gives its file back, a persistent one flushes): the struct itself
   * goes with the last reference.
   */
  for (size_t i = 0; i < e->nsnapshots; ++i) {
    struct snapfg_snapshot *s = e->snapshots[i];

    atomic_store (&s->state, SNAPSHOT_DROPPED);
    live_remove (s);
    s->store->ops->close (s->store, true);
    s->store = NULL;
    snapfg_snapshot_put (s);
  }
  free (e->snapshots);
  /* Dropped snapshots that connections still hold outlive the engine:
   * take them off its list now.
   */
  pthread_mutex_lock (&engine_live_lock);
  while (e->live) {
    struct snapfg_snapshot *s = e->live;
    e->live = s->live_next;
    s->live_prevp = NULL;
  }
  pthread_mutex_unlock (&engine_live_lock);
  stats_destroy (&e->stats);
  pthread_cond_destroy (&e->merge_threads_done);
  pthread_mutex_destroy (&e->merge_threads_lock);
  percpu_rwlock_destroy (&e->geometry);
  free ((void *) e->zeroes);
  device_close (&e->origin);
  free (e);
}

/* The smallest chunk size over all snapshots (or 0). */
static uint32_t
compute_min_chunk_size (const struct snapfg_engine *e)
{
  uint32_t min = 0;

  for (size_t i = 0; i < e->nsnapshots; ++i)
    if (min == 0 || e->snapshots[i]->chunk_size < min)
      min = e->snapshots[i]->chunk_size;
  return min;
}

static struct snapfg_snapshot *
find_snapshot_locked (struct snapfg_engine *e, const char *name)
{
  for (size_t i = 0; i < e->nsnapshots; ++i)
    if (strcmp (e->snapshots[i]->name, name) == 0)
      return e->snapshots[i];
  return NULL;
}

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
  snapfg_error ("%s", why);
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
  if (find_snapshot_locked (e, o->name) != NULL) {
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
  live_insert (s);
  e->snapshots[e->nsnapshots++] = s;
  e->min_chunk_size = compute_min_chunk_size (e);
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
    snapfg_error ("snapshot name \"%s\": %s", printable, problem);
    return -EINVAL;
  }
  /* Without a COW path the catalogue's state directory holds it. */
  if (o->cow_path == NULL) {
    struct snapfg_snapshot_options own = *o;
    char *path;

    if (e->catalogue == NULL) {
      snapfg_error ("create %s: no COW path given, and the server has no "
                    "state= catalogue whose directory could hold one; give "
                    "a COW path (snapfgctl create %s --cow PATH)",
                    o->name, o->name);
      return -EINVAL;
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
  char why[1024];
  struct checkpoint *cp = NULL;
  const char *problem;
  percpu_rwlock_token token;
  const char *in_use;
  bool exists, merging, full;
  int r;

  problem = snapfg_check_chunk_size (params.chunk_size);
  if (problem) {
    snapfg_error ("chunk-size=%" PRIu32 ": %s", params.chunk_size, problem);
    return -EINVAL;
  }
  token = percpu_rwlock_read_lock (&e->geometry);
  exists = find_snapshot_locked (e, o->name) != NULL;
  in_use = cow_in_use_locked (e, o->cow_path);
  merging = e->merging != NULL;
  full = e->nsnapshots >= e->max_snapshots;
  percpu_rwlock_read_unlock (&e->geometry, token);
  if (full && !exists) {
    too_many_snapshots (e, o->name);
    return -EMLINK;
  }
  if (merging) {
    snapfg_error ("snapshot \"%s\": a snapshot is being merged into the "
                  "origin; no other snapshot may exist until it is done",
                  o->name);
    return -EBUSY;
  }
  if (exists) {
    snapfg_error ("snapshot \"%s\" already exists", o->name);
    return -EEXIST;
  }
  if (in_use) {
    snapfg_error ("cow=%s: already the COW store of snapshot \"%s\"; "
                  "every snapshot needs its own", o->cow_path, in_use);
    return -EBUSY;
  }
  r = lifecycle_check_cow (e, o->cow_path);
  if (r < 0)
    return r;

  s = calloc (1, sizeof *s);
  if (s == NULL)
    return -ENOMEM;
  s->owned_cow = o->owned;
  s->engine = e;
  atomic_init (&s->state, SNAPSHOT_VALID);
  atomic_init (&s->overflow, false);
  atomic_init (&s->merged, false);
  atomic_init (&s->refs, 1);    /* the engine's list */
  pthread_mutex_init (&s->merge_lock, NULL);
  s->name = strdup (o->name);
  if (s->name == NULL || stats_init (&s->stats) < 0) {
    free (s->name);
    free (s);
    return -ENOMEM;
  }
  /* Opening the store may read the whole COW file: do it before stopping
   * the world.  A reopened store's own chunk size wins.
   */
  r = store_open (&params, &s->store);
  if (r < 0) {
    snapshot_free (s, false);
    return r;                   /* -ESTALE: see snapfg_engine_restore */
  }
  s->chunk_size = s->store->chunk_size;
  s->chunk_shift = s->store->chunk_shift;
  r = exception_table_init (&s->table,
                            e->locking == SNAPFG_LOCKING_GLOBAL
                            ? 0 : SNAPFG_STRIPE_BITS);
  if (r < 0) {
    snapshot_discard (s);
    return r;
  }
  if (s->store->opened_invalid)
    atomic_store (&s->state, SNAPSHOT_INVALID);
  else if (s->store->ops->load) {
    r = s->store->ops->load (s->store, load_exception, s);
    if (r < 0) {
      snapshot_discard (s);
      return r;
    }
  }

  /* A checkpoint started at the same instant: its bitmap file is made
   * now, outside the write side.  Checkpoints of an older snapshot of
   * this name let go of it first.
   */
  if (o->attach == SNAPFG_ATTACH_RUNTIME)
    checkpoint_forget_snapshot (e, o->name);
  if (o->checkpoint) {
    r = checkpoint_prepare (e, o->checkpoint, o->name, &cp);
    if (r < 0) {
      snapshot_discard (s);
      return r;
    }
  }

  /* The snapshot's point in time: every origin write in flight holds the
   * read side, so once we hold the write side they have all completed,
   * and every later one sees this snapshot and copies out into it.
   */
  {
    SCOPED_GEOMETRY_WRITE_LOCK (&e->geometry);
    r = insert_snapshot_locked (e, s, o, cp, params.type, why, sizeof why);
  }
  if (r < 0) {
    if (why[0])
      snapfg_error ("%s", why);
    goto err_discard;
  }
  if (cp)
    checkpoint_finish (e, cp);

  if (snapfg_debug_cow)
    snapfg_debug ("snapshot %s created: %s store, chunk %" PRIu32
                  ", COW %s", s->name, s->store->ops->name, s->chunk_size,
                  s->store->dev.path);
  return 0;

 err_discard:
  if (cp)
    checkpoint_abandon (e, cp);
  snapshot_discard (s);
  return r;
}

struct snapfg_snapshot *
snapfg_snapshot_get (struct snapfg_engine *e, const char *name)
{
  percpu_rwlock_token token = percpu_rwlock_read_lock (&e->geometry);
  struct snapfg_snapshot *s = find_snapshot_locked (e, name);

  if (s)
    atomic_fetch_add (&s->refs, 1);
  percpu_rwlock_read_unlock (&e->geometry, token);
  return s;
}

struct snapfg_snapshot *
snapfg_snapshot_get_nth (struct snapfg_engine *e, size_t i)
{
  percpu_rwlock_token token = percpu_rwlock_read_lock (&e->geometry);
  struct snapfg_snapshot *s = i < e->nsnapshots ? e->snapshots[i] : NULL;

  if (s)
    atomic_fetch_add (&s->refs, 1);
  percpu_rwlock_read_unlock (&e->geometry, token);
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

int
snapfg_snapshot_drop (struct snapfg_engine *e, const char *name)
{
  struct snapfg_snapshot *s = NULL;
  size_t i;

  /* The write side: requests in flight on any view finish first, and no
   * origin write is between its copy-outs and its data write.
   */
  percpu_rwlock_write_lock (&e->geometry);
  for (i = 0; i < e->nsnapshots; ++i) {
    if (strcmp (e->snapshots[i]->name, name) == 0) {
      s = e->snapshots[i];
      break;
    }
  }
  if (s && s == e->merging) {
    percpu_rwlock_write_unlock (&e->geometry);
    snapfg_error ("drop: snapshot \"%s\" is being merged into the origin",
                  name);
    return -EBUSY;
  }
  if (s) {
    memmove (&e->snapshots[i], &e->snapshots[i + 1],
             (e->nsnapshots - i - 1) * sizeof *e->snapshots);
    e->nsnapshots--;
    e->min_chunk_size = compute_min_chunk_size (e);
    atomic_store (&s->state, SNAPSHOT_DROPPED);
  }
  percpu_rwlock_write_unlock (&e->geometry);

  if (s == NULL) {
    snapfg_error ("drop: no snapshot named \"%s\"", name);
    return -ENOENT;
  }
  snapfg_debug ("snapshot %s dropped (COW %s)", s->name, s->store->dev.path);
  lifecycle_forget (e, s, "dropped");
  snapfg_snapshot_put (s);      /* the list's reference */
  return 0;
}

int
snapfg_set_block_size (struct snapfg_engine *e, uint32_t block_size)
{
  const char *problem = snapfg_check_block_size (block_size);

  if (problem) {
    snapfg_error ("block size %" PRIu32 ": %s", block_size, problem);
    return -EINVAL;
  }
  /* Requests in flight finish under the old geometry. */
  percpu_rwlock_write_lock (&e->geometry);
  e->block_size = block_size;
  percpu_rwlock_write_unlock (&e->geometry);
  if (snapfg_debug_lock)
    snapfg_debug ("block size is now %" PRIu32 " for new connections",
                  block_size);
  return 0;
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
    snapfg_error ("changed %s: the snapshot is being merged into the "
                  "origin, so its changed ranges are no longer known; "
                  "after the merge, back up the origin in full", s->name);
    return -EBUSY;
  default:
    snapfg_error ("changed %s: the snapshot is %s, so the list of origin "
                  "ranges changed since it was taken is incomplete; take a "
                  "full backup", s->name,
                  atomic_load (&s->state) == SNAPSHOT_DROPPED
                  ? "dropped" : "Invalid");
    return -EIO;
  }
}

int
snapfg_snapshot_changed (struct snapfg_snapshot *s, snapfg_range_fn fn,
                         void *opaque)
{
  uint64_t *chunks;
  size_t n, i;
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

uint64_t
snapfg_size (struct snapfg_engine *e)
{
  return e->size;
}

const char *
snapfg_origin_path (struct snapfg_engine *e)
{
  return e->origin.path;
}

uint32_t
snapfg_block_size (struct snapfg_engine *e)
{
  percpu_rwlock_token token = percpu_rwlock_read_lock (&e->geometry);
  uint32_t block_size = e->block_size;

  percpu_rwlock_read_unlock (&e->geometry, token);
  return block_size;
}

uint32_t
snapfg_preferred_size (struct snapfg_engine *e, struct snapfg_snapshot *s)
{
  percpu_rwlock_token token = percpu_rwlock_read_lock (&e->geometry);
  uint32_t preferred = s ? s->chunk_size : e->min_chunk_size;

  if (preferred < e->block_size)
    preferred = e->block_size;
  percpu_rwlock_read_unlock (&e->geometry, token);
  return preferred;
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

/* Does s hold its own copy of every chunk of [first, last]? */
static bool
snapshot_holds_chunks (struct snapfg_snapshot *s, uint64_t first,
                       uint64_t last)
{
  for (uint64_t chunk = first; chunk <= last; ++chunk) {
    struct exception_stripe *stripe = exception_table_stripe (&s->table,
                                                              chunk);
    bool held;

    exception_stripe_lock (stripe);
    held = exception_stripe_lookup (stripe, chunk, NULL) &&
      !exception_stripe_is_pending (stripe, chunk);
    exception_stripe_unlock (stripe);
    if (!held)
      return false;
  }
  return true;
}

bool
engine_origin_shrunk (struct snapfg_engine *e, int r, uint64_t end)
{
  uint64_t now, seen;

  if (r != -EIO || device_current_size (&e->origin, &now) < 0 || now >= end)
    return false;               /* a real I/O error */
  seen = atomic_load (&e->origin_size_seen);
  while (now != seen)
    if (atomic_compare_exchange_weak (&e->origin_size_seen, &seen, now)) {
      snapfg_error ("origin=%s: the file shrank to %" PRIu64 " bytes "
                    "under the running server (it had %" PRIu64 " bytes "
                    "at start-up); requests past %" PRIu64 " fail with EIO",
                    e->origin.path, now, e->size, now);
      /* What was past the new end is gone: a snapshot that still read
       * any of it from the origin has lost that data for good (dm, too,
       * invalidates a snapshot whose copy fails).
       */
      for (size_t i = 0; i < e->nsnapshots; ++i) {
        struct snapfg_snapshot *s = e->snapshots[i];

        if (snapshot_is_valid (s) &&
            !snapshot_holds_chunks (s, now >> s->chunk_shift,
                                    (e->size - 1) >> s->chunk_shift))
          snapshot_invalidate (s, "the origin shrank, and the data it "
                               "lost was not copied out", 0);
      }
      break;
    }
  return true;
}

void
engine_fault_point (struct snapfg_engine *e, enum fault_point where)
{
  if (e->fault_at != where)
    return;
  if (atomic_fetch_sub (&e->fault_countdown, 1) != 1)
    return;
  /* Die the way a crash or kill -9 would: no cleanup, no flush. */
  snapfg_debug ("test fault point %d reached: killing the process", where);
  kill (getpid (), SIGKILL);
  pause ();
}

bool
engine_fail_point (struct snapfg_engine *e, enum fail_point where)
{
  if (e->fail_at != where)
    return false;
  if (atomic_fetch_sub (&e->fail_countdown, 1) != 1)
    return false;
  snapfg_debug ("test failure point %d reached: failing the allocation",
                where);
  return true;
}

void
engine_test_delay (const struct snapfg_engine *e)
{
  if (e->test_delay_us)
    usleep (e->test_delay_us);
}

int
snapfg_engine_start_background (struct snapfg_engine *e)
{
  percpu_rwlock_token token = percpu_rwlock_read_lock (&e->geometry);
  struct snapfg_snapshot *s = e->merging;
  int r = 0;

  percpu_rwlock_read_unlock (&e->geometry, token);
  if (s) {
    snapfg_debug ("snapshot %s: resuming an interrupted merge", s->name);
    r = merge_start_thread (s);
  }
  return r;
}

int
snapfg_flush (struct snapfg_engine *e, struct snapfg_snapshot *from)
{
  percpu_rwlock_token token = percpu_rwlock_read_lock (&e->geometry);
  int r = 0;

  if (from && !snapshot_is_valid (from)) {
    percpu_rwlock_read_unlock (&e->geometry, token);
    return -EIO;
  }

  /* COW first: an origin chunk on disk must never be newer than the
   * snapshots' copies of it.  The checkpoint bitmap too: an origin
   * change on disk must never be missing from it.
   */
  checkpoint_sync (e);
  for (size_t i = 0; i < e->nsnapshots && r == 0; ++i) {
    struct snapfg_snapshot *s = e->snapshots[i];
    int sr;

    if (s == e->merging) {
      /* Origin writes to chunks not merged yet went into this COW store:
       * it holds origin data, and its flush failing fails the flush.
       */
      r = s->store->ops->flush (s->store);
      if (r < 0)
        snapfg_error ("snapshot %s (COW %s): flush during the merge "
                      "failed: %s", s->name, s->store->dev.path,
                      strerror (-r));
      continue;
    }
    if (!snapshot_is_valid (s))
      continue;
    sr = s->store->ops->flush (s->store);
    if (sr < 0)
      snapshot_invalidate (s, "flushing the COW store failed", -sr);
  }
  if (r < 0) {
    percpu_rwlock_read_unlock (&e->geometry, token);
    return r;
  }
  if (!e->origin.readonly)
    r = device_flush (&e->origin);
  if (r < 0)
    snapfg_error ("origin=%s: flush failed: %s", e->origin.path,
                  strerror (-r));
  percpu_rwlock_read_unlock (&e->geometry, token);
  return r;
}
