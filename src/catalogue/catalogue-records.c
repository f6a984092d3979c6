/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the catalogue's snapshot and checkpoint records.
 *
 * Copies of the lists handed out (the caller frees them), and each
 * change made on a copy of the tree and committed whole
 * (catalogue-file.c).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <jansson.h>

#include "catalogue.h"
#include "catalogue-internal.h"
#include "scoped-lock.h"
#include "snapfg-log.h"

static json_t *
find_named (json_t *array, const char *name, size_t *index)
{
  size_t i;
  json_t *v;

  json_array_foreach (array, i, v) {
    if (strcmp (json_string_value (json_object_get (v, "name")), name) == 0) {
      if (index)
        *index = i;
      return v;
    }
  }
  return NULL;
}

static char *
dup_string (json_t *o, const char *key)
{
  json_t *v = json_object_get (o, key);

  return json_is_string (v) ? strdup (json_string_value (v)) : NULL;
}

static uint64_t
get_uint (json_t *o, const char *key)
{
  return json_integer_value (json_object_get (o, key));
}

/* --- what snapshots and checkpoints share --- */

/* Free N elements of ELEM_SIZE bytes, each's strings by FREE_FIELDS. */
static void
free_records (void *list, size_t n, size_t elem_size,
              void (*free_fields) (void *elem))
{
  if (list == NULL)
    return;
  for (size_t i = 0; i < n; ++i)
    free_fields ((char *) list + i * elem_size);
  free (list);
}

/* A copy of the array KEY (snapshots or checkpoints): one element of
 * ELEM_SIZE bytes per record, filled by FILL (false: out of memory).
 */
static int
copy_records (struct catalogue *cat, const char *key, size_t elem_size,
              bool (*fill) (void *elem, json_t *rec),
              void (*free_fields) (void *elem), void **listp, size_t *np)
{
  SCOPED_MUTEX_LOCK (&cat->lock);
  json_t *a = json_object_get (cat->root, key), *v;
  size_t i, n = json_array_size (a);
  char *list = calloc (n ? n : 1, elem_size);

  if (list == NULL)
    return -ENOMEM;
  json_array_foreach (a, i, v) {
    if (!fill (list + i * elem_size, v)) {
      free_records (list, i + 1, elem_size, free_fields);
      return -ENOMEM;
    }
  }
  *listp = list;
  *np = n;
  return 0;
}

/* Add REC (consumed) to the array KEY, or replace the record of the same
 * name; EVENT_IF_NEW (may be NULL) goes into the history when it is added.
 */
static int
put_named (struct catalogue *cat, const char *key, const char *name,
           json_t *rec, const char *event_if_new, const char *detail)
{
  SCOPED_MUTEX_LOCK (&cat->lock);
  json_t *doc = json_deep_copy (cat->root);
  json_t *a = json_object_get (doc, key);
  size_t i;

  if (find_named (a, name, &i))
    json_array_set_new (a, i, rec);
  else {
    json_array_append_new (a, rec);
    if (event_if_new)
      catalogue_append_event (doc, event_if_new, name, detail);
  }
  return catalogue_commit (cat, doc);
}

/* Remove the record NAME from the array KEY (-ENOENT if there is none);
 * EVENT (may be NULL) goes into the history.
 */
static int
remove_named (struct catalogue *cat, const char *key, const char *name,
              const char *event, const char *detail)
{
  SCOPED_MUTEX_LOCK (&cat->lock);
  json_t *doc = json_deep_copy (cat->root);
  json_t *a = json_object_get (doc, key);
  size_t i;

  if (find_named (a, name, &i) == NULL) {
    json_decref (doc);
    return -ENOENT;
  }
  json_array_remove (a, i);
  if (event)
    catalogue_append_event (doc, event, name, detail);
  return catalogue_commit (cat, doc);
}

/* --- snapshots --- */

static bool
snapshot_from_json (void *elem, json_t *v)
{
  struct catalogue_snapshot *s = elem;

  s->name = dup_string (v, "name");
  s->cow = dup_string (v, "cow");
  s->store = dup_string (v, "store");
  s->state = dup_string (v, "state");
  s->chunk_size = get_uint (v, "chunk_size");
  s->cow_size = get_uint (v, "cow_size");
  s->created = get_uint (v, "created");
  snprintf (s->uuid, sizeof s->uuid, "%s",
            json_string_value (json_object_get (v, "uuid")));
  s->owned = json_is_true (json_object_get (v, "owned"));
  s->temporary = json_is_true (json_object_get (v, "temporary"));
  return s->name && s->cow && s->store && s->state;
}

static void
snapshot_free_fields (void *elem)
{
  struct catalogue_snapshot *s = elem;

  free (s->name);
  free (s->cow);
  free (s->store);
  free (s->state);
}

int
catalogue_snapshots (struct catalogue *cat, struct catalogue_snapshot **listp,
                     size_t *np)
{
  void *list;
  int r = copy_records (cat, "snapshots", sizeof **listp, snapshot_from_json,
                        snapshot_free_fields, &list, np);

  if (r == 0)
    *listp = list;
  return r;
}

void
catalogue_snapshots_free (struct catalogue_snapshot *list, size_t n)
{
  free_records (list, n, sizeof *list, snapshot_free_fields);
}

int
catalogue_snapshot_put (struct catalogue *cat,
                        const struct catalogue_snapshot *s)
{
  json_t *rec;

  rec = json_pack ("{s:s, s:s, s:s, s:I, s:I, s:I, s:s, s:s, s:b}",
                   "name", s->name, "cow", s->cow, "store", s->store,
                   "chunk_size", (json_int_t) s->chunk_size,
                   "cow_size", (json_int_t) s->cow_size,
                   "created", (json_int_t) s->created,
                   "uuid", s->uuid,
                   "state", s->state ? s->state : CATALOGUE_SNAPSHOT_ACTIVE,
                   "owned", s->owned);
  if (rec == NULL)
    return -ENOMEM;
  if (s->temporary &&
      json_object_set_new (rec, "temporary", json_true ()) == -1) {
    json_decref (rec);
    return -ENOMEM;
  }
  return put_named (cat, "snapshots", s->name, rec, "created", s->cow);
}

int
catalogue_snapshot_set_state (struct catalogue *cat, const char *name,
                              const char *state)
{
  SCOPED_MUTEX_LOCK (&cat->lock);
  json_t *doc = json_deep_copy (cat->root), *rec;

  rec = find_named (json_object_get (doc, "snapshots"), name, NULL);
  if (rec == NULL) {
    json_decref (doc);
    return -ENOENT;
  }
  json_object_set_new (rec, "state", json_string (state));
  if (strcmp (state, CATALOGUE_SNAPSHOT_MERGING) == 0)
    catalogue_append_event (doc, "merge-started", name, NULL);
  return catalogue_commit (cat, doc);
}

int
catalogue_snapshot_remove (struct catalogue *cat, const char *name,
                           const char *event, const char *detail)
{
  return remove_named (cat, "snapshots", name, event, detail);
}

int
catalogue_snapshot_forget (struct catalogue *cat, const char *name,
                           const char *event, const char *detail,
                           const char *file)
{
  int r = remove_named (cat, "snapshots", name, event, detail);

  if (r < 0 || file == NULL)
    return r;
  /* The record is gone from the file first: a crash before the unlink
   * leaves a file nothing names, never a record without its file.
   */
  SCOPED_MUTEX_LOCK (&cat->lock);
  if (cat->held) {
    char **list = realloc (cat->unlink_after,
                           (cat->n_unlink_after + 1) * sizeof *list);
    char *copy = strdup (file);

    if (list == NULL || copy == NULL) {
      free (copy);
      if (list)
        cat->unlink_after = list;
      return 0;                 /* the file stays; nothing names it */
    }
    cat->unlink_after = list;
    cat->unlink_after[cat->n_unlink_after++] = copy;
  }
  else if (unlink (file) == -1 && errno != ENOENT)
    snapfg_error ("state=%s: snapshot %s: cannot remove its store %s: %m",
                  cat->path, name, file);
  return 0;
}

/* --- checkpoints --- */

static bool
checkpoint_from_json (void *elem, json_t *v)
{
  struct catalogue_checkpoint *c = elem;

  c->name = dup_string (v, "name");
  c->bitmap = dup_string (v, "bitmap");
  c->state = dup_string (v, "state");
  c->snapshot = dup_string (v, "snapshot");     /* NULL if null */
  c->owner = dup_string (v, "owner");           /* NULL if absent */
  c->granularity = get_uint (v, "granularity");
  c->created = get_uint (v, "created");
  c->seq = get_uint (v, "seq");
  return c->name && c->bitmap && c->state;
}

static void
checkpoint_free_fields (void *elem)
{
  struct catalogue_checkpoint *c = elem;

  free (c->name);
  free (c->bitmap);
  free (c->state);
  free (c->snapshot);
  free (c->owner);
}

int
catalogue_checkpoints (struct catalogue *cat,
                       struct catalogue_checkpoint **listp, size_t *np)
{
  void *list;
  int r = copy_records (cat, "checkpoints", sizeof **listp,
                        checkpoint_from_json, checkpoint_free_fields,
                        &list, np);

  if (r == 0)
    *listp = list;
  return r;
}

void
catalogue_checkpoints_free (struct catalogue_checkpoint *list, size_t n)
{
  free_records (list, n, sizeof *list, checkpoint_free_fields);
}

static json_t *
checkpoint_record (const struct catalogue_checkpoint *c)
{
  return json_pack ("{s:s, s:s, s:I, s:I, s:I, s:s, s:s?, s:s*}",
                    "name", c->name, "bitmap", c->bitmap,
                    "granularity", (json_int_t) c->granularity,
                    "created", (json_int_t) c->created,
                    "seq", (json_int_t) c->seq,
                    "state", c->state ? c->state
                    : CATALOGUE_CHECKPOINT_ACTIVE,
                    "snapshot", c->snapshot, "owner", c->owner);
}

int
catalogue_checkpoints_set (struct catalogue *cat,
                           const struct catalogue_checkpoint *list, size_t n)
{
  json_t *doc, *a = json_array ();

  if (a == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < n; ++i) {
    json_t *rec = checkpoint_record (&list[i]);
    if (rec == NULL || json_array_append_new (a, rec) == -1) {
      json_decref (a);
      return -ENOMEM;
    }
  }
  SCOPED_MUTEX_LOCK (&cat->lock);
  doc = json_deep_copy (cat->root);
  json_object_set_new (doc, "checkpoints", a);
  return catalogue_commit (cat, doc);
}
