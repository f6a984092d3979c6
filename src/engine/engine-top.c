/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the top of the engine — opening the origin, starting the
 * background threads (merge, write-back), closing in order, its geometry
 * (size, block size) and flush.  Nothing below calls up into this file
 * (docs/design.md section 9).  Snapshots are created in
 * engine-snapshot-create.c, dropped in engine-snapshot-drop.c and looked
 * up and described in engine-snapshot.c; the test hooks are
 * engine-test-hooks.c; the request paths are io-origin.c, io-snapshot.c
 * and copy-out.c; a shrunk origin is noticed in origin-device.c.
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
#include "copy-out.h"
#include "merge.h"
#include "power-of-two.h"
#include "scoped-lock.h"
#include "checkpoint.h"
#include "snapfg-log.h"

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
  e->origin_moved = opts->origin_moved;
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
    e->test.delay_us = strtoul (env, NULL, 10);
  env = getenv ("SNAPFG_TEST_MERGE_DELAY_US");
  if (env && *env)
    e->test.merge_delay_us = strtoul (env, NULL, 10);
  engine_parse_fault_point (e, getenv ("SNAPFG_TEST_CRASH_AT"));
  engine_parse_fail_point (e, getenv ("SNAPFG_TEST_FAIL_AT"));
  /* (The environment's own string: it lives as long as the process.) */
  env = getenv ("SNAPFG_TEST_WRITEBACK_PAUSE");
  if (env && *env)
    e->test.writeback_pause_path = env;

  suspend_init (&e->suspend);
  {
    struct writeback_options wo = {
      .on = opts->writeback,
      .max = writeback_max_for_memory (opts->writeback, opts->writeback_max),
      .held_dir = opts->held_dir,
      .held_on_disk = opts->held_dir_on_disk,
    };

    r = writeback_open (e, &wo);
  }
  if (r < 0) {
    stats_destroy (&e->stats);
    pthread_cond_destroy (&e->merge_threads_done);
    pthread_mutex_destroy (&e->merge_threads_lock);
    percpu_rwlock_destroy (&e->geometry);
    goto err_zeroes;
  }

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

void
snapfg_engine_close (struct snapfg_engine *e)
{
  if (e == NULL)
    return;
  suspend_destroy (e);
  /* A clean stop applies everything held (no request can come any
   * more); the origin and the stores are synced below and as they close.
   */
  writeback_close (e);
  for (size_t i = 0; i < e->nsnapshots; ++i)
    merge_stop_thread (e->snapshots[i]);
  /* A merge that ended by itself detached its thread, which may still be
   * on its way out through the geometry lock.
   */
  {
    SCOPED_MUTEX_LOCK (&e->merge_threads_lock);
    while (e->merge_threads > 0)
      pthread_cond_wait (&e->merge_threads_done, &e->merge_threads_lock);
  }
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
    snapshot_live_remove (s);
    s->store->ops->close (s->store, true);
    s->store = NULL;
    snapfg_snapshot_put (s);
  }
  free (e->snapshots);
  /* Dropped snapshots that connections still hold outlive the engine:
   * take them off its list now.
   */
  {
    SCOPED_MUTEX_LOCK (&engine_live_lock);
    while (e->live) {
      struct snapfg_snapshot *s = e->live;
      e->live = s->live_next;
      s->live_prevp = NULL;
    }
  }
  stats_destroy (&e->stats);
  pthread_cond_destroy (&e->merge_threads_done);
  pthread_mutex_destroy (&e->merge_threads_lock);
  percpu_rwlock_destroy (&e->geometry);
  free ((void *) e->zeroes);
  if (!e->origin.readonly && device_flush (&e->origin) < 0)
    snapfg_error ("origin=%s: flush at close failed", e->origin.path);
  device_close (&e->origin);
  free (e);
}

int
snapfg_set_block_size (struct snapfg_engine *e, uint32_t block_size)
{
  const char *problem = snapfg_check_block_size (block_size);

  if (problem) {
    return snapfg_fail (EINVAL, "block size %" PRIu32 ": %s", block_size, problem);
  }
  /* Requests in flight finish under the old geometry. */
  {
    SCOPED_GEOMETRY_WRITE_LOCK (&e->geometry);
    e->block_size = block_size;
  }
  if (snapfg_debug_lock)
    snapfg_debug ("block size is now %" PRIu32 " for new connections",
                  block_size);
  return 0;
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

bool
snapfg_origin_identity (struct snapfg_engine *e, struct device_identity *id)
{
  return device_identity (&e->origin, id);
}

uint32_t
snapfg_block_size (struct snapfg_engine *e)
{
  SCOPED_GEOMETRY_READ_LOCK (&e->geometry);
  return e->block_size;
}

uint32_t
snapfg_preferred_size (struct snapfg_engine *e, struct snapfg_snapshot *s)
{
  SCOPED_GEOMETRY_READ_LOCK (&e->geometry);
  uint32_t preferred = s ? s->chunk_size : e->min_chunk_size;

  return preferred > e->block_size ? preferred : e->block_size;
}

int
snapfg_engine_replay_held (struct snapfg_engine *e)
{
  return origin_replay_held (e) < 0 ? -1 : 0;
}

int
snapfg_engine_start_background (struct snapfg_engine *e)
{
  struct snapfg_snapshot *s;
  int r = 0;

  {
    SCOPED_GEOMETRY_READ_LOCK (&e->geometry);
    s = e->merging;
  }
  if (s) {
    snapfg_debug ("snapshot %s: resuming an interrupted merge", s->name);
    r = merge_start_thread (s);
  }
  /* A replay the plugin did not ask for (a program linking the engine
   * directly) is made before the committer starts.
   */
  if (r == 0)
    r = origin_replay_held (e);
  if (r == 0)
    r = writeback_start (e);
  return r;
}

int
snapfg_flush (struct snapfg_engine *e, struct snapfg_snapshot *from)
{
  /* Every write acknowledged before the flush reaches the origin first,
   * each after its exceptions are durable (with no lock held: a
   * geometry change waiting for this request must not stop the
   * committer).  Then everything is synced as without write-back.
   */
  writeback_wait_all (e);

  SCOPED_GEOMETRY_READ_LOCK (&e->geometry);
  int r = 0;

  if (from && !snapshot_is_valid (from))
    return -EIO;

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
  if (r < 0)
    return r;
  if (!e->origin.readonly)
    r = device_flush (&e->origin);
  if (r < 0)
    snapfg_error ("origin=%s: flush failed: %s", e->origin.path,
                  strerror (-r));
  return r;
}
