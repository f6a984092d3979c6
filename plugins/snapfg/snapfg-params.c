/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg plugin: parsing its parameters (nbdkit's .config callback).
 *
 * Each KEY=VALUE is checked as it comes, with an error naming it; the
 * checks that need several parameters are in plugin_config_complete.
 * Paths are made absolute here because nbdkit changes directory when
 * it forks; NBD URIs are kept exactly as given.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "chunk-size.h"
#include "device.h"
#include "snapfg-params.h"

struct plugin_params params = {
  .chunk_size = SNAPFG_DEFAULT_CHUNK_SIZE,
  .block_size = SNAPFG_DEFAULT_BLOCK_SIZE,
  .locking = SNAPFG_LOCKING_STRIPED,
  .durability = SNAPFG_DURABILITY_SYNC,
  .max_snapshots = SNAPFG_DEFAULT_MAX_SNAPSHOTS,
  .cbt_granularity = CBT_DEFAULT_GRANULARITY,
  .writeback = true,
  .writeback_max = 0,                   /* the engine's default */
};

void
params_free (void)
{
  free (params.state_path);
  free (params.origin_path);
  free (params.cow_path);
  for (size_t i = 0; i < params.extra_snapshots.len; ++i) {
    free (params.extra_snapshots.ptr[i].name);
    free (params.extra_snapshots.ptr[i].cow_path);
  }
  startup_snapshot_vector_reset (&params.extra_snapshots);
  free (params.control_path);
  free (params.held_dir);
  free (params.store_type);
}

/* Parse a size parameter; nbdkit_parse_size names the value on error. */
static int
parse_size_param (const char *key, const char *value, int64_t *out)
{
  int64_t size = nbdkit_parse_size (value);

  if (size == -1) {
    /* nbdkit's own message does not say which parameter it was. */
    nbdkit_error ("%s=%s: not a valid size", key, value);
    return -1;
  }
  *out = size;
  return 0;
}

/* A size that CHECK must accept too (it says what is wrong, or NULL). */
static int
parse_checked_size (const char *key, const char *value, int64_t *out,
                    const char *(*check) (int64_t))
{
  const char *problem;

  if (parse_size_param (key, value, out) == -1)
    return -1;
  problem = check (*out);
  if (problem) {
    nbdkit_error ("%s=%s: %s", key, value, problem);
    return -1;
  }
  return 0;
}

/* One of two words (locking=, durability=): *out = the matching value. */
static int
parse_choice (const char *key, const char *value, const char *what,
              const char *word0, int value0, const char *word1, int value1,
              int *out)
{
  if (strcmp (value, word0) == 0)
    *out = value0;
  else if (strcmp (value, word1) == 0)
    *out = value1;
  else {
    nbdkit_error ("%s=%s: unknown %s (expected %s or %s)", key, value, what,
                  word0, word1);
    return -1;
  }
  return 0;
}

/* Replace *DST by VALUE as a location: an NBD URI (if URI_OK) exactly as
 * given, else a path made absolute by RESOLVE (nbdkit_realpath for what
 * must exist, nbdkit_absolute_path for what may not yet).
 */
static int
set_location (char **dst, const char *value, bool uri_ok,
              char *(*resolve) (const char *))
{
  free (*dst);
  if (!uri_ok || !device_is_uri (value))
    *dst = resolve (value);
  else if ((*dst = strdup (value)) == NULL)
    nbdkit_error ("strdup: %m");
  return *dst ? 0 : -1;
}

/* snapshot=NAME:COW */
static int
add_startup_snapshot (const char *value)
{
  const char *colon = strchr (value, ':');
  const char *problem;
  struct startup_snapshot x;

  if (colon == NULL || colon == value || colon[1] == '\0') {
    nbdkit_error ("snapshot=%s: expected snapshot=NAME:COW", value);
    return -1;
  }
  x.name = strndup (value, colon - value);
  if (x.name == NULL) {
    nbdkit_error ("strndup: %m");
    return -1;
  }
  problem = snapfg_check_new_snapshot_name (x.name);
  if (problem) {
    nbdkit_error ("snapshot=%s: bad snapshot name: %s", value, problem);
    free (x.name);
    return -1;
  }
  x.cow_path = device_is_uri (colon + 1) ? strdup (colon + 1)
    : nbdkit_absolute_path (colon + 1);
  if (x.cow_path == NULL ||
      startup_snapshot_vector_append (&params.extra_snapshots, x) < 0) {
    free (x.name);
    free (x.cow_path);
    nbdkit_error ("snapshot=%s: out of memory", value);
    return -1;
  }
  return 0;
}

int
params_config (const char *key, const char *value)
{
  const char *problem;
  int choice;

  if (strcmp (key, "origin") == 0)
    /* An NBD URI is kept exactly as given (it is also its identity). */
    return set_location (&params.origin_path, value, true, nbdkit_realpath);
  if (strcmp (key, "cow") == 0)
    /* The COW file may not exist yet: made absolute, not resolved. */
    return set_location (&params.cow_path, value, true,
                         nbdkit_absolute_path);
  if (strcmp (key, "snapshot") == 0)
    return add_startup_snapshot (value);
  if (strcmp (key, "store") == 0) {
    problem = snapfg_check_store_type (value);
    if (problem) {
      nbdkit_error ("store=%s: %s", value, problem);
      return -1;
    }
    free (params.store_type);
    if ((params.store_type = strdup (value)) == NULL) {
      nbdkit_error ("strdup: %m");
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "chunk-size") == 0)
    return parse_checked_size (key, value, &params.chunk_size,
                               snapfg_check_chunk_size);
  if (strcmp (key, "cow-size") == 0) {
    if (parse_size_param (key, value, &params.cow_size) == -1)
      return -1;
    if (params.cow_size == 0) {
      nbdkit_error ("cow-size=%s: must be greater than zero", value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "block-size") == 0)
    return parse_checked_size (key, value, &params.block_size,
                               snapfg_check_block_size);
  if (strcmp (key, "locking") == 0) {
    if (parse_choice (key, value, "locking mode",
                      "striped", SNAPFG_LOCKING_STRIPED,
                      "global", SNAPFG_LOCKING_GLOBAL, &choice) == -1)
      return -1;
    params.locking = choice;
    return 0;
  }
  if (strcmp (key, "durability") == 0) {
    if (parse_choice (key, value, "durability mode",
                      "sync", SNAPFG_DURABILITY_SYNC,
                      "flush", SNAPFG_DURABILITY_FLUSH, &choice) == -1)
      return -1;
    params.durability = choice;
    return 0;
  }
  if (strcmp (key, "writeback") == 0) {
    if (parse_choice (key, value, "write-back mode", "on", 1, "off", 0,
                      &choice) == -1)
      return -1;
    params.writeback = choice;
    return 0;
  }
  if (strcmp (key, "writeback-max") == 0) {
    if (parse_size_param (key, value, &params.writeback_max) == -1)
      return -1;
    /* At least one 4K write and its bookkeeping; a write larger than
     * the limit is not held (it waits for its commit, as with
     * writeback=off).
     */
    if (params.writeback_max < 64 * 1024) {
      nbdkit_error ("writeback-max=%s: must be at least 64K", value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "cbt-granularity") == 0) {
    if (parse_size_param (key, value, &params.cbt_granularity) == -1)
      return -1;
    /* Checked against chunk-size= once every parameter is known. */
    problem = cbt_check_granularity (params.cbt_granularity, 0);
    if (problem) {
      nbdkit_error ("cbt-granularity=%s: %s", value, problem);
      return -1;
    }
    params.cbt_granularity_given = true;
    return 0;
  }
  if (strcmp (key, "origin-moved") == 0) {
    /* Said once, after the origin really moved: the stores and bitmaps
     * are rebound, so later starts need not say it again.
     */
    int b = nbdkit_parse_bool (value);

    if (b == -1)
      return -1;
    params.origin_moved = b;
    return 0;
  }
  if (strcmp (key, "max-snapshots") == 0) {
    if (nbdkit_parse_unsigned (key, value, &params.max_snapshots) == -1)
      return -1;
    if (params.max_snapshots == 0) {
      nbdkit_error ("max-snapshots=%s: must be at least 1", value);
      return -1;
    }
    return 0;
  }
  /* nbdkit changes directory when it forks: keep these paths absolute
   * (the catalogue may not exist yet).
   */
  if (strcmp (key, "control") == 0)
    return set_location (&params.control_path, value, false,
                         nbdkit_absolute_path);
  if (strcmp (key, "state") == 0)
    return set_location (&params.state_path, value, false,
                         nbdkit_absolute_path);
  /* Where write-back keeps held writes so that a crash of the server
   * loses none: it must exist (checked when the engine opens).
   */
  if (strcmp (key, "held-dir") == 0)
    return set_location (&params.held_dir, value, false, nbdkit_realpath);
  if (strcmp (key, "held-dir-on-disk") == 0) {
    int b = nbdkit_parse_bool (value);

    if (b == -1)
      return -1;
    params.held_dir_on_disk = b;
    return 0;
  }
  nbdkit_error ("unknown parameter '%s' (see nbdkit-snapfg-plugin(1))", key);
  return -1;
}
