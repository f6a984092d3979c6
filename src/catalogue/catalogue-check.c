/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: checking every record of a catalogue read from disk.
 *
 * The records decide which files a start opens, writes and removes: a
 * store of an unknown type used to be taken for a transient one and
 * removed, a swapped name served another snapshot's data, a COW path
 * naming the catalogue's own temporary file was unlinked by the next
 * rewrite.  So a record is only used if every field has its type and a
 * value the server could have written itself; anything else refuses the
 * start, naming the record and the field, and leaves every file as it
 * is.  Fields this version does not know are left alone (ignored).
 */

#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>

#include <jansson.h>

#include "catalogue.h"
#include "catalogue-internal.h"
#include "chunk-size.h"
#include "device.h"
#include "snapshot-name.h"
#include "store.h"

bool
catalogue_is_uuid (json_t *v)
{
  const char *s;

  if (!json_is_string (v) || json_string_length (v) != 36)
    return false;
  s = json_string_value (v);
  for (int i = 0; i < 36; ++i) {
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[i] != '-'
        : !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return false;
  }
  return true;
}

/* What is being checked, for the messages. */
struct where {
  struct catalogue *cat;
  const char *kind;                /* "snapshot", "checkpoint" */
  size_t index;
  const char *name;                /* the record's name, if it has one */
  char *buf;
  size_t len;
};

static const char *
bad (struct where *w, const char *field, const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));

static const char *
bad (struct where *w, const char *field, const char *fmt, ...)
{
  char what[512];
  va_list args;

  va_start (args, fmt);
  vsnprintf (what, sizeof what, fmt, args);
  va_end (args);
  snprintf (w->buf, w->len, "%s record %zu%s%s%s, field \"%s\": %s",
            w->kind, w->index, w->name ? " (\"" : "",
            w->name ? w->name : "", w->name ? "\")" : "", field, what);
  return w->buf;
}

/* A string without NUL bytes (jansson allows \u0000). */
static const char *
get_string (json_t *rec, const char *key)
{
  json_t *v = json_object_get (rec, key);

  if (!json_is_string (v) ||
      strlen (json_string_value (v)) != json_string_length (v))
    return NULL;
  return json_string_value (v);
}

static bool
get_uint (json_t *rec, const char *key, uint64_t *out)
{
  json_t *v = json_object_get (rec, key);

  if (!json_is_integer (v) || json_integer_value (v) < 0)
    return false;
  *out = json_integer_value (v);
  return true;
}

/* The path of FILE.d/NAME.EXT, as catalogue_state_file makes it. */
static bool
is_state_file (struct catalogue *cat, const char *path, const char *name,
               const char *ext)
{
  size_t d = strlen (cat->state_dir), n = strlen (name);

  return strncmp (path, cat->state_dir, d) == 0 && path[d] == '/' &&
    strncmp (path + d + 1, name, n) == 0 && path[d + 1 + n] == '.' &&
    strcmp (path + d + 2 + n, ext) == 0;
}

static const char *
check_snapshot (struct where *w, json_t *rec, bool *merging_seen)
{
  const char *name, *cow, *store, *state, *problem;
  json_t *owned;
  uint64_t u;
  char why[512];

  if (!json_is_object (rec))
    return bad (w, "(record)", "not an object");
  name = get_string (rec, "name");
  if (name == NULL)
    return bad (w, "name", "missing or not a string");
  problem = snapfg_check_snapshot_name (name);
  if (problem)
    return bad (w, "name", "%s", problem);
  w->name = name;

  store = get_string (rec, "store");
  if (store == NULL)
    return bad (w, "store", "missing or not a string");
  if (store_type_find (store) == NULL)
    return bad (w, "store", "\"%s\" is not a store type (expected "
                SNAPFG_STORE_TYPE_CHOICES ")", store);

  if (!get_uint (rec, "chunk_size", &u))
    return bad (w, "chunk_size", "missing or not a non-negative integer");
  problem = snapfg_check_chunk_size (u > INT64_MAX ? -1 : (int64_t) u);
  if (problem)
    return bad (w, "chunk_size", "%" PRIu64 ": %s", u, problem);
  if (!get_uint (rec, "cow_size", &u))
    return bad (w, "cow_size", "missing or not a non-negative integer");
  if (!get_uint (rec, "created", &u))
    return bad (w, "created", "missing or not a non-negative integer");
  if (!catalogue_is_uuid (json_object_get (rec, "uuid")))
    return bad (w, "uuid", "missing or not a uuid");

  state = get_string (rec, "state");
  if (state == NULL)
    return bad (w, "state", "missing or not a string");
  if (strcmp (state, CATALOGUE_SNAPSHOT_MERGING) == 0) {
    if (*merging_seen)
      return bad (w, "state", "a second snapshot being merged (only one "
                  "merge can be under way)");
    *merging_seen = true;
  }
  else if (strcmp (state, CATALOGUE_SNAPSHOT_ACTIVE) != 0)
    return bad (w, "state", "unknown state \"%s\" (expected "
                CATALOGUE_SNAPSHOT_ACTIVE " or " CATALOGUE_SNAPSHOT_MERGING
                ")", state);

  owned = json_object_get (rec, "owned");
  if (owned && !json_is_boolean (owned))
    return bad (w, "owned", "not true or false");
  cow = get_string (rec, "cow");
  if (cow == NULL || cow[0] == '\0')
    return bad (w, "cow", "missing, empty or not a string");
  if (json_is_true (owned)) {
    /* The server removes such a store with its snapshot: it must be
     * the one file the server made for it.
     */
    if (!is_state_file (w->cat, cow, name, "cow"))
      return bad (w, "cow", "\"%s\" is not %s/%s.cow, the store the server "
                  "makes for a snapshot of that name, yet the record says "
                  "the server made it (\"owned\")", cow, w->cat->state_dir,
                  name);
  }
  else if (!device_is_uri (cow)) {
    if (cow[0] != '/')
      return bad (w, "cow", "\"%s\" is not an absolute path or a URI", cow);
    if (catalogue_names_own_file (w->cat, cow, why, sizeof why))
      return bad (w, "cow", "\"%s\" %s; it cannot be a COW store", cow, why);
  }
  return NULL;
}

static const char *
check_checkpoint (struct where *w, json_t *rec)
{
  const char *name, *bitmap, *state, *problem;
  json_t *snap;
  uint64_t u;

  if (!json_is_object (rec))
    return bad (w, "(record)", "not an object");
  name = get_string (rec, "name");
  if (name == NULL || name[0] == '\0' || name[0] == '.' ||
      strchr (name, '/'))
    return bad (w, "name", "missing, not a string or not a name the "
                "server gives checkpoints");
  w->name = name;
  bitmap = get_string (rec, "bitmap");
  if (bitmap == NULL)
    return bad (w, "bitmap", "missing or not a string");
  if (!is_state_file (w->cat, bitmap, name, "cbt"))
    return bad (w, "bitmap", "\"%s\" is not %s/%s.cbt, the bitmap the server "
                "makes for a checkpoint of that name", bitmap,
                w->cat->state_dir, name);
  if (!get_uint (rec, "granularity", &u))
    return bad (w, "granularity", "missing or not a non-negative integer");
  problem = cbt_check_granularity (u > INT64_MAX ? -1 : (int64_t) u,
                                   SNAPFG_MIN_CHUNK_SIZE);
  if (problem)
    return bad (w, "granularity", "%" PRIu64 ": %s", u, problem);
  if (!get_uint (rec, "created", &u))
    return bad (w, "created", "missing or not a non-negative integer");
  if (!get_uint (rec, "seq", &u) || u == 0)
    return bad (w, "seq", "missing or not a positive integer");
  state = get_string (rec, "state");
  if (state == NULL)
    return bad (w, "state", "missing or not a string");
  if (strcmp (state, CATALOGUE_CHECKPOINT_ACTIVE) != 0 &&
      strcmp (state, CATALOGUE_CHECKPOINT_FROZEN) != 0 &&
      strcmp (state, CATALOGUE_CHECKPOINT_INCONSISTENT) != 0)
    return bad (w, "state", "unknown state \"%s\" (expected "
                CATALOGUE_CHECKPOINT_ACTIVE ", " CATALOGUE_CHECKPOINT_FROZEN
                " or " CATALOGUE_CHECKPOINT_INCONSISTENT ")", state);
  snap = json_object_get (rec, "snapshot");
  if (snap && !json_is_null (snap)) {
    const char *s = get_string (rec, "snapshot");
    if (s == NULL || snapfg_check_snapshot_name (s))
      return bad (w, "snapshot", "not null or a snapshot name");
  }
  return NULL;
}

/* Does an earlier record of array a (before index i) have the same
 * string in key?
 */
static bool
duplicate (json_t *a, size_t i, const char *key)
{
  const char *mine = json_string_value (json_object_get
                                        (json_array_get (a, i), key));

  for (size_t j = 0; j < i; ++j)
    if (strcmp (json_string_value (json_object_get (json_array_get (a, j),
                                                    key)), mine) == 0)
      return true;
  return false;
}

const char *
catalogue_check_records (struct catalogue *cat, json_t *root, char *buf,
                         size_t len)
{
  json_t *a, *v;
  size_t i;
  bool merging = false;
  const char *problem;

  a = json_object_get (root, "snapshots");
  if (!json_is_array (a))
    return "\"snapshots\" is not an array";
  json_array_foreach (a, i, v) {
    struct where w = { cat, "snapshot", i, NULL, buf, len };

    problem = check_snapshot (&w, v, &merging);
    if (problem)
      return problem;
    if (duplicate (a, i, "name"))
      return bad (&w, "name", "a second record of this name");
    if (duplicate (a, i, "uuid"))
      return bad (&w, "uuid", "the uuid of an earlier record");
    if (duplicate (a, i, "cow"))
      return bad (&w, "cow", "the store of an earlier record (every "
                  "snapshot has its own)");
  }

  a = json_object_get (root, "checkpoints");
  if (!json_is_array (a))
    return "\"checkpoints\" is not an array";
  json_array_foreach (a, i, v) {
    struct where w = { cat, "checkpoint", i, NULL, buf, len };

    problem = check_checkpoint (&w, v);
    if (problem)
      return problem;
    if (duplicate (a, i, "name"))
      return bad (&w, "name", "a second record of this name");
    for (size_t j = 0; j < i; ++j)
      if (json_integer_value (json_object_get (json_array_get (a, j), "seq"))
          == json_integer_value (json_object_get (v, "seq")))
        return bad (&w, "seq", "the seq of an earlier record");
  }

  a = json_object_get (root, "events");
  if (a && !json_is_array (a))
    return "\"events\" is not an array";
  return NULL;
}
