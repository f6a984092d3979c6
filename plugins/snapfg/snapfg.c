/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: nbdkit plugin serving a live origin and point-in-time snapshots
 * of it with dm-snapshot semantics.  This file is the glue: it starts
 * the engine from the parameters (parsed in snapfg-params.c) and maps
 * nbdkit's callbacks onto the engine in src/.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "engine.h"
#include "chunk-size.h"
#include "checkpoint.h"
#include "control-server.h"
#include "catalogue.h"
#include "snapfg-log.h"
#include "snapfg-error.h"
#include "snapfg-params.h"


static struct snapfg_engine *engine;
static struct catalogue *catalogue;
static struct control_server *control;

static void
log_error (const char *fmt, va_list args)
{
  nbdkit_verror (fmt, args);
}

static void
log_debug (const char *fmt, va_list args)
{
  nbdkit_vdebug (fmt, args);
}

/* nbdkit has no level between debug (only with -v) and error: notices
 * (who created or dropped which snapshot) go to nbdkit's stderr, in the
 * shape of its own messages.  One fprintf, so that lines from several
 * threads do not mix.
 */
static void
log_notice (const char *fmt, va_list args)
{
  char msg[1024];

  vsnprintf (msg, sizeof msg, fmt, args);
  fprintf (stderr, "nbdkit: snapfg: %s\n", msg);
}

static void
plugin_load (void)
{
  snapfg_set_log (log_error, log_debug);
  snapfg_set_notice_log (log_notice);
}

static void
plugin_unload (void)
{
  /* nbdkit may unload without calling .cleanup (a failed start). */
  control_server_close (control);
  control = NULL;
  snapfg_engine_close (engine);
  engine = NULL;
  /* After the engine: it (and its checkpoints) record into it. */
  catalogue_close (catalogue);
  catalogue = NULL;
  params_free ();
}

/* A snapshot named on the command line.  With state= it may be back
 * from the catalogue already (the same name and COW): nothing to do.
 */
static int
startup_snapshot (const char *name, const char *cow)
{
  struct snapfg_snapshot_options snap = {
    .name = name,
    .cow_path = cow,
    .store_type = params.store_type,
    .chunk_size = params.chunk_size,
    .cow_size = params.cow_size,
    .attach = SNAPFG_ATTACH_STARTUP,
  };
  struct snapfg_snapshot *s = snapfg_snapshot_get (engine, name);

  if (s) {
    struct snapfg_snapshot_info info;
    bool same;

    snapfg_snapshot_info (s, &info);
    same = strcmp (info.cow_path, cow) == 0;
    snapfg_snapshot_put (s);
    if (same)
      return 0;
    nbdkit_error ("snapshot %s (COW %s): the catalogue %s already has a "
                  "snapshot of that name, with COW %s", name, cow,
                  params.state_path, info.cow_path);
    return -1;
  }
  return snapfg_snapshot_create (engine, &snap) < 0 ? -1 : 0;
}

/* A refusal the engine only recorded (snapfg_fail: a bad name, a store
 * that is not this origin's) is reported by its caller, and at start-up
 * that is us: as an error, the start fails with it.  What the engine
 * logged already is not logged twice.
 */
static int
report_start_failure (int r)
{
  const char *msg = snapfg_get_error ();

  if (r < 0 && msg && !snapfg_error_logged ())
    nbdkit_error ("%s", msg);
  return r;
}

static int
open_engine (void)
{
  struct snapfg_options opts = {
    .origin_path = params.origin_path,
    .locking = params.locking,
    .durability = params.durability,
    .block_size = params.block_size,
    .max_snapshots = params.max_snapshots,
    .writeback = params.writeback,
    .writeback_max = params.writeback_max,
    .origin_moved = params.origin_moved,
    .held_dir = params.held_dir,
    .held_dir_on_disk = params.held_dir_on_disk,
  };
  const char *problem;

  if (params.origin_path == NULL) {
    nbdkit_error ("the origin= parameter is required "
                  "(the disk to serve and snapshot)");
    return -1;
  }
  if (params.cow_path == NULL && params.extra_snapshots.len == 0) {
    if (params.cow_size) {
      nbdkit_error ("cow-size= given without cow= or snapshot=");
      return -1;
    }
  }
  else if (params.cow_size && params.cow_size < params.chunk_size) {
    nbdkit_error ("cow-size=%" PRIi64 ": smaller than one chunk "
                  "(chunk-size=%" PRIi64 ")", params.cow_size,
                  params.chunk_size);
    return -1;
  }

  /* The default follows a chunk size larger than itself. */
  if (!params.cbt_granularity_given &&
      params.cbt_granularity < params.chunk_size)
    params.cbt_granularity = params.chunk_size;
  problem = cbt_check_granularity (params.cbt_granularity, params.chunk_size);
  if (problem) {
    nbdkit_error ("cbt-granularity=%" PRIi64 ": %s (chunk-size=%" PRIi64
                  ")", params.cbt_granularity, problem, params.chunk_size);
    return -1;
  }

  if (snapfg_engine_open (&opts, &engine) < 0)
    return -1;

  /* The catalogue's snapshots come back first, under their names, and
   * an interrupted merge is set up again: all before any client.
   */
  if (params.state_path) {
    struct device_identity id = { 0, 0 };
    struct catalogue_origin origin = {
      .path = snapfg_origin_path (engine),
      .size = snapfg_size (engine),
      .has_identity = snapfg_origin_identity (engine, &id),
      .moved = params.origin_moved,
    };
    origin.dev = id.dev;
    origin.ino = id.ino;
    if (catalogue_open (params.state_path, &origin, &catalogue) < 0)
      goto fail;        /* the engine's held file goes with it */
    snapfg_engine_set_catalogue (engine, catalogue);
  }
  /* The checkpoints (they need the catalogue) track from here on: before
   * the restore, which may start a merge recorded but not begun (the
   * origin view changes then), and before any client.
   */
  if (snapfg_checkpoints_open (engine, catalogue, params.cbt_granularity) < 0)
    goto fail;
  if (catalogue && snapfg_engine_restore (engine) < 0)
    goto fail;

  if (params.cow_path &&
      startup_snapshot (SNAPFG_STARTUP_SNAPSHOT, params.cow_path) < 0)
    goto fail;
  /* Then the snapshot= ones, in order, with the same store settings. */
  for (size_t i = 0; i < params.extra_snapshots.len; ++i)
    if (startup_snapshot (params.extra_snapshots.ptr[i].name,
                          params.extra_snapshots.ptr[i].cow_path) < 0)
      goto fail;
  /* Writes a crash left held are replayed now, with every store of the
   * catalogue and the command line attached, before any client.
   */
  if (snapfg_engine_replay_held (engine) < 0)
    goto fail;
  return 0;

 fail:
  /* A catalogue this start created goes again (with what the engine
   * recorded in it: its snapshots are discarded with the engine).
   */
  snapfg_engine_close (engine);
  engine = NULL;
  catalogue_abandon (catalogue);
  catalogue = NULL;
  return -1;
}

static int
plugin_config_complete (void)
{
  snapfg_clear_error ();
  return report_start_failure (open_engine ());
}

/* Bind the control socket now, while errors still reach the user. */
static int
plugin_get_ready (void)
{
  snapfg_clear_error ();
  if (params.control_path &&
      control_server_open (engine, params.control_path, &control) < 0)
    return report_start_failure (-1);
  return 0;
}

/* Threads must start after nbdkit has forked. */
static int
plugin_after_fork (void)
{
  snapfg_clear_error ();
  if (control && control_server_start (control) < 0)
    return report_start_failure (-1);
  if (snapfg_engine_start_background (engine) < 0)
    return report_start_failure (-1);
  return 0;
}

/* Stop the control thread before nbdkit unloads us, so that it exits
 * promptly and no command runs against a closing engine.
 */
static void
plugin_cleanup (void)
{
  control_server_close (control);
  control = NULL;
}

/* A connection's view: the origin, or one snapshot. */
struct handle {
  struct snapfg_snapshot *snapshot;   /* NULL: the origin */
  /* Held origin writes that failed after write-back acknowledged them:
   * the point up to which this connection has been told of them (from
   * the point up to which anyone had been, when it opened).  A failure
   * past what it had been told when a flush or FUA request began fails
   * that request with EIO (engine.h).  Loaded and stored atomically:
   * the connection's requests run in parallel.
   */
  uint64_t writeback_told;
};

/* "snapfg snapshot of ORIGIN (STORE, chunk N, COW PATH): STATUS" */
static const char *
describe_snapshot (struct snapfg_snapshot *s)
{
  char status[128], describe[512];

  snapfg_snapshot_status (s, status, sizeof status);
  snapfg_snapshot_describe (s, describe, sizeof describe);
  return nbdkit_printf_intern ("snapfg snapshot of %s (%s): %s",
                               snapfg_origin_path (engine), describe, status);
}

static const char *
describe_origin (void)
{
  return nbdkit_printf_intern ("snapfg origin %s",
                               snapfg_origin_path (engine));
}

static int
plugin_list_exports (int readonly, int is_tls, struct nbdkit_exports *exports)
{
  const char *description = describe_origin ();
  struct snapfg_snapshot *s;
  int r = 0;

  if (description == NULL ||
      nbdkit_add_export (exports, "origin", description) == -1)
    return -1;
  for (size_t i = 0; r == 0 && (s = snapfg_snapshot_get_nth (engine, i));
       ++i) {
    description = describe_snapshot (s);
    if (description == NULL ||
        nbdkit_add_export (exports, snapfg_snapshot_name (s),
                           description) == -1)
      r = -1;
    snapfg_snapshot_put (s);
  }
  return r;
}

static const char *
plugin_default_export (int readonly, int is_tls)
{
  return "origin";
}

static void *
plugin_open (int readonly)
{
  const char *name = nbdkit_export_name ();
  struct handle *h;

  h = calloc (1, sizeof *h);
  if (h == NULL) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  if (name == NULL || strcmp (name, "") == 0 || strcmp (name, "origin") == 0)
    h->snapshot = NULL;
  else {
    h->snapshot = snapfg_snapshot_get (engine, name);
    if (h->snapshot == NULL) {
      nbdkit_error ("unknown export \"%s\" (exports: origin and the "
                    "snapshots listed by nbdinfo --list)", name);
      free (h);
      return NULL;
    }
  }
  h->writeback_told = snapfg_writeback_errors_sample (engine);
  snapfg_view_connection (engine, h->snapshot, 1);
  return h;
}

static void
plugin_close (void *handle)
{
  struct handle *h = handle;

  snapfg_view_connection (engine, h->snapshot, -1);
  snapfg_snapshot_put (h->snapshot);
  free (h);
}

static const char *
plugin_export_description (void *handle)
{
  struct handle *h = handle;

  return h->snapshot ? describe_snapshot (h->snapshot) : describe_origin ();
}

static int64_t
plugin_get_size (void *handle)
{
  return snapfg_size (engine);
}

static int
plugin_block_size (void *handle,
                   uint32_t *minimum, uint32_t *preferred, uint32_t *maximum)
{
  struct handle *h = handle;

  *minimum = snapfg_block_size (engine);
  *preferred = snapfg_preferred_size (engine, h->snapshot);
  *maximum = 0xffffffff;
  return 0;
}

static int
plugin_can_write (void *handle)
{
  return 1;
}

static int
plugin_can_flush (void *handle)
{
  return 1;
}

static int
plugin_can_fua (void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

static int
plugin_can_trim (void *handle)
{
  struct handle *h = handle;

  /* Trimming a snapshot has no useful meaning (its chunks are either the
   * origin's or a copy); only the origin advertises it.
   */
  return h->snapshot == NULL;
}

static int
plugin_can_zero (void *handle)
{
  return 1;
}

static int
plugin_can_fast_zero (void *handle)
{
  return 1;
}

static int
plugin_can_extents (void *handle)
{
  return 1;
}

static int
plugin_can_multi_conn (void *handle)
{
  /* A flush on any connection makes every completed write durable, on
   * every export (docs/design.md section 6).
   */
  return 1;
}

/* Engine results are 0 or -errno; nbdkit wants -1 and errno. */
static int
result (int r)
{
  if (r < 0) {
    nbdkit_set_error (-r);
    return -1;
  }
  return 0;
}

/* What the connection had been told of failed held writes when a
 * request began (taken before the engine is called).
 */
static uint64_t
told_at_start (struct handle *h)
{
  return __atomic_load_n (&h->writeback_told, __ATOMIC_ACQUIRE);
}

/* A flush, or a request with FUA, succeeded (r == 0): it still fails if
 * a held origin write failed that this connection had not been told of
 * when the request began, told0 (docs/design.md section 6: never
 * silent, and never a success over a lost write for a request sent
 * before the client could know).
 */
static int
durable_result (struct handle *h, int r, uint32_t flags, uint64_t told0)
{
  if (r == 0 && (flags & NBDKIT_FLAG_FUA))
    r = snapfg_writeback_check (engine, &h->writeback_told, told0);
  return result (r);
}

static unsigned
request_flags (uint32_t flags)
{
  unsigned f = 0;

  if (flags & NBDKIT_FLAG_FUA)
    f |= SNAPFG_REQ_FUA;
  if (flags & NBDKIT_FLAG_MAY_TRIM)
    f |= SNAPFG_REQ_MAY_TRIM;
  if (flags & NBDKIT_FLAG_FAST_ZERO)
    f |= SNAPFG_REQ_FAST_ZERO;
  if (flags & NBDKIT_FLAG_REQ_ONE)
    f |= SNAPFG_REQ_ONE;
  return f;
}

static int
plugin_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
              uint32_t flags)
{
  struct handle *h = handle;

  if (h->snapshot)
    return result (snapfg_snapshot_pread (h->snapshot, buf, count, offset));
  return result (snapfg_origin_pread (engine, buf, count, offset));
}

static int
plugin_pwrite (void *handle, const void *buf, uint32_t count,
               uint64_t offset, uint32_t flags)
{
  struct handle *h = handle;
  uint64_t told0 = told_at_start (h);

  if (h->snapshot)
    return durable_result (h, snapfg_snapshot_pwrite (h->snapshot, buf,
                                                      count, offset,
                                                      request_flags (flags)),
                           flags, told0);
  return durable_result (h, snapfg_origin_pwrite (engine, buf, count, offset,
                                                  request_flags (flags)),
                         flags, told0);
}

static int
plugin_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct handle *h = handle;
  uint64_t told0 = told_at_start (h);

  if (h->snapshot)
    return durable_result (h, snapfg_snapshot_zero (h->snapshot, count,
                                                    offset,
                                                    request_flags (flags)),
                           flags, told0);
  return durable_result (h, snapfg_origin_zero (engine, count, offset,
                                                request_flags (flags)),
                         flags, told0);
}

static int
plugin_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  uint64_t told0 = told_at_start (handle);

  return durable_result (handle, snapfg_origin_trim (engine, count, offset,
                                                     request_flags (flags)),
                         flags, told0);
}

static int
plugin_flush (void *handle, uint32_t flags)
{
  struct handle *h = handle;
  uint64_t told0 = told_at_start (h);

  return durable_result (h, snapfg_flush (engine, h->snapshot),
                         NBDKIT_FLAG_FUA, told0);
}

static int
add_extent (void *opaque, uint64_t offset, uint64_t length, uint32_t type)
{
  struct nbdkit_extents *extents = opaque;

  return nbdkit_add_extent (extents, offset, length, type) == -1 ? -EINVAL : 0;
}

static int
plugin_extents (void *handle, uint32_t count, uint64_t offset,
                uint32_t flags, struct nbdkit_extents *extents)
{
  struct handle *h = handle;

  if (h->snapshot)
    return result (snapfg_snapshot_extents (h->snapshot, count, offset,
                                            request_flags (flags),
                                            add_extent, extents));
  return result (snapfg_origin_extents (engine, count, offset,
                                        request_flags (flags),
                                        add_extent, extents));
}

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static struct nbdkit_plugin plugin = {
  .name               = "snapfg",
  .longname           = "snapfg: live origin with dm-snapshot style snapshots",
  .version            = PACKAGE_VERSION,
  .load               = plugin_load,
  .unload             = plugin_unload,
  .config             = params_config,
  .config_complete    = plugin_config_complete,
  .config_help        = plugin_config_help,
  .magic_config_key   = "origin",
  .get_ready          = plugin_get_ready,
  .after_fork         = plugin_after_fork,
  .cleanup            = plugin_cleanup,
  .list_exports       = plugin_list_exports,
  .default_export     = plugin_default_export,
  .open               = plugin_open,
  .close              = plugin_close,
  .export_description = plugin_export_description,
  .get_size           = plugin_get_size,
  .block_size         = plugin_block_size,
  .can_write          = plugin_can_write,
  .can_flush          = plugin_can_flush,
  .can_fua            = plugin_can_fua,
  .can_trim           = plugin_can_trim,
  .can_zero           = plugin_can_zero,
  .can_fast_zero      = plugin_can_fast_zero,
  .can_extents        = plugin_can_extents,
  .can_multi_conn     = plugin_can_multi_conn,
  .pread              = plugin_pread,
  .pwrite             = plugin_pwrite,
  .zero               = plugin_zero,
  .trim               = plugin_trim,
  .flush              = plugin_flush,
  .extents            = plugin_extents,
  .errno_is_preserved = 0,
};

NBDKIT_REGISTER_PLUGIN (plugin)
