/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the origin's catalogue (see catalogue.h for the format).
 *
 * This file opens and closes it, names the files of its state directory
 * and records events; the file itself (reading, checking, the atomic
 * rewrite) is catalogue-file.c, the records catalogue-records.c.
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

void
catalogue_uuid (char out[37])
{
  unsigned char b[16];
  ssize_t n = getrandom (b, sizeof b, 0);

  if (n != (ssize_t) sizeof b) {
    /* Cannot happen on Linux ≥ 3.17; fall back to something unique. */
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    uint64_t a = ts.tv_sec ^ ((uint64_t) getpid () << 32), c = ts.tv_nsec;
    memcpy (b, &a, 8);
    memcpy (b + 8, &c, 8);
  }
  b[6] = (b[6] & 0x0f) | 0x40;     /* version 4 (random) */
  b[8] = (b[8] & 0x3f) | 0x80;
  snprintf (out, 37,
            "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
            "%02x%02x%02x%02x%02x%02x",
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9],
            b[10], b[11], b[12], b[13], b[14], b[15]);
}

static char *
dir_of (const char *path)
{
  const char *slash = strrchr (path, '/');

  if (slash == NULL)
    return strdup (".");
  if (slash == path)
    return strdup ("/");
  return strndup (path, slash - path);
}

int
catalogue_open (const char *path, const struct catalogue_origin *origin,
                struct catalogue **catp)
{
  struct catalogue *cat;
  bool created = false, fresh = false;
  int r;

  cat = calloc (1, sizeof *cat);
  if (cat == NULL)
    return -ENOMEM;
  cat->fd = -1;
  pthread_mutex_init (&cat->lock, NULL);
  cat->path = strdup (path);
  if (cat->path == NULL ||
      asprintf (&cat->tmp_path, "%s.tmp", path) == -1 ||
      asprintf (&cat->state_dir, "%s.d", path) == -1 ||
      (cat->dir_path = dir_of (path)) == NULL) {
    cat->tmp_path = cat->state_dir = NULL;
    r = -ENOMEM;
    goto err;
  }
  cat->base_name = strrchr (cat->path, '/') ? strrchr (cat->path, '/') + 1
    : cat->path;

  r = catalogue_open_locked (cat, &created);
  if (r < 0)
    goto err;
  r = catalogue_load_document (cat, origin, &fresh);
  if (r < 0)
    goto err;
  cat->created_now = fresh;
  if (fresh) {
    json_t *doc = json_deep_copy (cat->root);
    catalogue_append_event (doc, "created", NULL, origin->path);
    r = catalogue_commit (cat, doc);
    if (r < 0)
      goto err;
  }
  *catp = cat;
  return 0;

 err:
  if (created)
    unlink (path);              /* we made it a moment ago, empty */
  catalogue_close (cat);
  return r;
}

void
catalogue_close (struct catalogue *cat)
{
  if (cat == NULL)
    return;
  if (cat->fd >= 0)
    close (cat->fd);
  json_decref (cat->root);
  pthread_mutex_destroy (&cat->lock);
  free (cat->path);
  free (cat->tmp_path);
  free (cat->dir_path);
  free (cat->state_dir);
  free (cat);
}

void
catalogue_abandon (struct catalogue *cat)
{
  /* Kept if a snapshot was recorded meanwhile: its store is bound to
   * this catalogue now, and the next start needs the record.
   */
  if (cat && cat->created_now &&
      json_array_size (json_object_get (cat->root, "snapshots")) == 0) {
    unlink (cat->path);
    rmdir (cat->state_dir);     /* only if empty */
  }
  catalogue_close (cat);
}

const char *
catalogue_path (const struct catalogue *cat)
{
  return cat->path;
}

const char *
catalogue_id (const struct catalogue *cat)
{
  return cat->id;
}

char *
catalogue_state_file (struct catalogue *cat, const char *name,
                      const char *ext)
{
  char *path;

  if (name[0] == '\0' || strchr (name, '/') || strcmp (name, ".") == 0 ||
      strcmp (name, "..") == 0 || strlen (name) > NAME_MAX - 8) {
    snapfg_error ("\"%s\": cannot be a file name in the state directory "
                  "%s (no '/', not . or .., at most %d bytes); give the "
                  "COW path explicitly", name, cat->state_dir, NAME_MAX - 8);
    return NULL;
  }
  if (mkdir (cat->state_dir, 0700) == -1 && errno != EEXIST) {
    snapfg_error ("state=%s: cannot create the state directory %s: %m",
                  cat->path, cat->state_dir);
    return NULL;
  }
  if (asprintf (&path, "%s/%s.%s", cat->state_dir, name, ext) == -1) {
    snapfg_error ("asprintf: %m");
    return NULL;
  }
  return path;
}
