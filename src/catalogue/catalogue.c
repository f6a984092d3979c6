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
#include <sys/stat.h>

#include <jansson.h>

#include "catalogue.h"
#include "file-owner.h"
#include "catalogue-internal.h"
#include "device.h"
#include "scoped-lock.h"
#include "snapfg-log.h"

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

/* The directory holding the catalogue: whoever can write it can put
 * another file in the catalogue's place, so it must be ours (or root's)
 * and not writable by others, unless it is sticky (like /tmp: others
 * cannot rename or remove our files there, and every file we create in
 * it is created with O_EXCL).
 */
static int
check_catalogue_dir (struct catalogue *cat)
{
  struct stat st;

  if (stat (cat->dir_path, &st) == -1) {
    int r = -errno;
    snapfg_fail (-r, "state=%s: cannot use the directory %s: %m",
                     cat->path, cat->dir_path);
    return r;
  }
  if (st.st_uid != geteuid () && st.st_uid != 0) {
    return snapfg_fail (EPERM, "state=%s: the directory %s is owned by user %u, not by "
                               "this server's user (%u) or root: its owner could replace "
                               "the catalogue; keep the catalogue in a directory of the "
                               "server's user (or chown %u %s)", cat->path, cat->dir_path,
                               (unsigned) st.st_uid, (unsigned) geteuid (),
                               (unsigned) geteuid (), cat->dir_path);
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
    return snapfg_fail (EPERM, "state=%s: the directory %s is writable by %s (mode %04o): "
                               "they could replace the catalogue; chmod go-w %s, or keep "
                               "the catalogue elsewhere", cat->path, cat->dir_path,
                               st.st_mode & S_IWOTH ? "every user" : "its group",
                               (unsigned) (st.st_mode & 07777), cat->dir_path);
  }
  return 0;
}

/* Where the catalogue's files really are (catalogue_names_own_file). */
static int
resolve_own_files (struct catalogue *cat)
{
  char *real_dir = realpath (cat->dir_path, NULL);
  const char *slash = strrchr (cat->path, '/');
  const char *base = slash ? slash + 1 : cat->path;
  int r = 0;

  if (real_dir == NULL)
    return -errno;
  if (asprintf (&cat->real_path, "%s%s%s", real_dir,
                strcmp (real_dir, "/") == 0 ? "" : "/", base) == -1 ||
      asprintf (&cat->real_tmp_path, "%s.tmp", cat->real_path) == -1 ||
      asprintf (&cat->real_state_dir, "%s.d", cat->real_path) == -1)
    r = -ENOMEM;
  free (real_dir);
  return r;
}

/* How many files in the state directory the records name: the stores
 * of snapshots created without a COW path, and the checkpoint bitmaps.
 */
static size_t
files_in_state_dir (json_t *root)
{
  json_t *v;
  size_t i, n = json_array_size (json_object_get (root, "checkpoints"));

  json_array_foreach (json_object_get (root, "snapshots"), i, v)
    if (json_is_true (json_object_get (v, "owned")))
      n++;
  return n;
}

/* One file of the state directory that a record names (the checks
 * made sure it is FILE.d/LEAF): if it is there, it must be a regular
 * file (not a link), the server user's and writable by nobody else.
 * (A missing one is the store's or the bitmap's to report.)
 */
static int
check_state_file (struct catalogue *cat, int dirfd, const char *path)
{
  const char *leaf = strrchr (path, '/') + 1;
  struct stat st;
  int fd, r;

  if (fstatat (dirfd, leaf, &st, AT_SYMLINK_NOFOLLOW) == -1)
    return 0;
  if (!S_ISREG (st.st_mode)) {
    return snapfg_fail (EINVAL, "state=%s: %s is %s; the server makes the files of its "
                                "state directory itself and never follows a link there: "
                                "remove it and put the right file back", cat->path, path,
                                S_ISLNK (st.st_mode) ? "a symbolic link"
                                : "not a regular file");
  }
  fd = openat (dirfd, leaf, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd == -1)
    return 0;
  r = file_check_owner (fd, path, false);
  close (fd);
  return r;
}

/* Every file of the state directory the records name. */
static int
check_state_files (struct catalogue *cat, int dirfd)
{
  json_t *v;
  size_t i;
  int r;

  json_array_foreach (json_object_get (cat->root, "snapshots"), i, v)
    if (json_is_true (json_object_get (v, "owned")) &&
        (r = check_state_file (cat, dirfd, json_string_value
                               (json_object_get (v, "cow")))) < 0)
      return r;
  json_array_foreach (json_object_get (cat->root, "checkpoints"), i, v)
    if ((r = check_state_file (cat, dirfd, json_string_value
                               (json_object_get (v, "bitmap")))) < 0)
      return r;
  return 0;
}

/* The state directory must be ours, and there when records need it: a
 * start without it (its file system not mounted yet?) would find every
 * store and bitmap in it missing.
 */
static int
check_state_dir (struct catalogue *cat)
{
  struct stat st;
  size_t needed;
  int fd, r;

  if (lstat (cat->state_dir, &st) == -1 && errno == ENOENT) {
    needed = files_in_state_dir (cat->root);
    if (needed == 0)
      return 0;
    return snapfg_fail (ENOENT, "state=%s: the state directory %s is missing, but the "
                                "catalogue names %zu file%s in it (stores of snapshots "
                                "created without --cow, checkpoint bitmaps): is its file "
                                "system mounted?  Nothing was changed; start the server "
                                "again once it is there", cat->path, cat->state_dir,
                                needed, needed == 1 ? "" : "s");
  }
  fd = catalogue_state_dir_open (cat, false);
  if (fd < 0)
    return fd;
  r = check_state_files (cat, fd);
  close (fd);
  return r;
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

  r = check_catalogue_dir (cat);
  if (r < 0)
    goto err;
  r = resolve_own_files (cat);
  if (r < 0) {
    snapfg_fail (-r, "state=%s: cannot resolve the directory %s: %s",
                     cat->path, cat->dir_path, strerror (-r));
    goto err;
  }
  r = catalogue_open_locked (cat, &created);
  if (r < 0)
    goto err;
  r = file_check_owner (cat->fd, cat->path, false);
  if (r < 0)
    goto err;
  cat->created_now = created;
  r = catalogue_load_document (cat, origin, &fresh);
  if (r < 0)
    goto err;
  cat->created_now = fresh;
  r = check_state_dir (cat);
  if (r < 0)
    goto err;
  if (fresh) {
    json_t *doc = json_deep_copy (cat->root);
    catalogue_append_event (doc, "created", NULL, origin->path);
    r = catalogue_commit (cat, doc);
    if (r < 0)
      goto err;
  }
  cat->held = true;
  *catp = cat;
  return 0;

 err:
  if (created)
    unlink (path);              /* we made it a moment ago, empty */
  catalogue_close (cat);
  return r;
}

int
catalogue_release (struct catalogue *cat)
{
  SCOPED_MUTEX_LOCK (&cat->lock);
  int r = 0;

  cat->held = false;
  if (cat->pending) {
    r = catalogue_write (cat, cat->root);
    if (r < 0)
      return r;
    cat->pending = false;
  }
  for (size_t i = 0; i < cat->n_unlink_after; ++i) {
    if (unlink (cat->unlink_after[i]) == -1 && errno != ENOENT)
      snapfg_error ("state=%s: cannot remove %s, which no snapshot uses "
                    "any more: %m", cat->path, cat->unlink_after[i]);
    free (cat->unlink_after[i]);
  }
  cat->n_unlink_after = 0;
  return 0;
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
  free (cat->real_path);
  free (cat->real_tmp_path);
  free (cat->real_state_dir);
  for (size_t i = 0; i < cat->n_unlink_after; ++i)
    free (cat->unlink_after[i]);
  free (cat->unlink_after);
  free (cat);
}

void
catalogue_abandon (struct catalogue *cat)
{
  /* Changes still held were never written: they are dropped with the
   * tree.  A file this open created is removed again unless a snapshot
   * was recorded in it on disk: its store is bound to this catalogue
   * now, and the next start needs the record.
   */
  if (cat && cat->created_now &&
      (cat->held ||
       json_array_size (json_object_get (cat->root, "snapshots")) == 0)) {
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

int
catalogue_state_dir_open (struct catalogue *cat, bool create)
{
  int fd, r;

  if (create && mkdir (cat->state_dir, 0700) == -1 && errno != EEXIST) {
    r = -errno;
    snapfg_fail (-r, "state=%s: cannot create the state directory %s: %m",
                     cat->path, cat->state_dir);
    return r;
  }
  fd = open (cat->state_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd == -1) {
    r = -errno;
    if (r == -ELOOP || r == -ENOTDIR)
      snapfg_fail (-r, "state=%s: %s is not a directory (a symbolic link?); "
                       "the server makes its state directory itself and never "
                       "follows a link there: move it away", cat->path,
                       cat->state_dir);
    else
      snapfg_fail (-r, "state=%s: cannot open the state directory %s: %m",
                       cat->path, cat->state_dir);
    return r;
  }
  r = file_check_owner (fd, cat->state_dir, true);
  if (r < 0) {
    close (fd);
    return r;
  }
  return fd;
}

char *
catalogue_state_file (struct catalogue *cat, const char *name,
                      const char *ext)
{
  char *path;
  int fd;

  if (name[0] == '\0' || strchr (name, '/') || strcmp (name, ".") == 0 ||
      strcmp (name, "..") == 0 || strlen (name) > NAME_MAX - 8) {
    snapfg_fail (EINVAL, "\"%s\": cannot be a file name in the state directory "
                         "%s (no '/', not . or .., at most %d bytes); give the "
                         "COW path explicitly", name, cat->state_dir, NAME_MAX - 8);
    return NULL;
  }
  fd = catalogue_state_dir_open (cat, true);
  if (fd < 0)
    return NULL;
  close (fd);
  if (asprintf (&path, "%s/%s.%s", cat->state_dir, name, ext) == -1) {
    snapfg_fail (ENOMEM, "asprintf: %m");
    return NULL;
  }
  return path;
}

/* path with its directory resolved (and, if it is a link to something
 * that exists, the link too): where a file opened by that name really
 * is.  NULL if its directory does not exist.
 */
static char *
where_it_is (const char *path, bool *dangling)
{
  char *real = realpath (path, NULL), *dir, *real_dir, *out;
  const char *slash;
  struct stat st;

  *dangling = false;
  if (real)
    return real;
  if (lstat (path, &st) == 0 && S_ISLNK (st.st_mode)) {
    *dangling = true;
    return NULL;
  }
  dir = dir_of (path);
  if (dir == NULL)
    return NULL;
  real_dir = realpath (dir, NULL);
  free (dir);
  if (real_dir == NULL)
    return NULL;
  slash = strrchr (path, '/');
  if (asprintf (&out, "%s%s%s", real_dir,
                strcmp (real_dir, "/") == 0 ? "" : "/",
                slash ? slash + 1 : path) == -1)
    out = NULL;
  free (real_dir);
  return out;
}

bool
catalogue_names_own_file (struct catalogue *cat, const char *path,
                          char *why, size_t len)
{
  struct stat a, b;
  bool dangling, own = false;
  char *real;
  size_t n;

  if (device_is_uri (path))
    return false;
  if (stat (path, &a) == 0 && fstat (cat->fd, &b) == 0 &&
      a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
    snprintf (why, len, "is the catalogue %s itself", cat->path);
    return true;
  }
  real = where_it_is (path, &dangling);
  if (dangling) {
    snprintf (why, len, "is a symbolic link to a file that does not exist: "
              "the server would create the file where it points (name the "
              "file itself)");
    return true;
  }
  if (real == NULL)
    return false;               /* its directory does not exist */
  n = strlen (cat->real_state_dir);
  if (strcmp (real, cat->real_path) == 0) {
    snprintf (why, len, "is the catalogue %s itself", cat->path);
    own = true;
  }
  else if (strcmp (real, cat->real_tmp_path) == 0) {
    snprintf (why, len, "is the catalogue's temporary file %s, which "
              "every change of the catalogue replaces", cat->tmp_path);
    own = true;
  }
  else if (strncmp (real, cat->real_state_dir, n) == 0 &&
           (real[n] == '/' || real[n] == '\0')) {
    snprintf (why, len, "is in the state directory %s, whose files the "
              "server names and creates itself (leave out --cow to have "
              "the store made there)", cat->state_dir);
    own = true;
  }
  free (real);
  return own;
}
