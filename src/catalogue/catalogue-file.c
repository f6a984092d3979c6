/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the catalogue file (the format is in catalogue.h).
 *
 * Reading it back (a file that is not a snapfg catalogue, is malformed
 * or belongs to another origin -- catalogue-origin.c decides -- is
 * refused and never overwritten), and
 * every change as one atomic, locked rewrite.
 *
 * A change is made on a copy of the tree, the copy is written to
 * FILE.tmp, synced, locked and renamed over FILE, and the directory is
 * synced; only then does the copy replace the tree in memory.  So after
 * any failure both the file and the in-memory catalogue are as they were.
 *
 * The OFD lock is on the catalogue's inode.  A rename replaces the inode,
 * so the new file is locked (through FILE.tmp's descriptor) before it is
 * renamed into place, and the old descriptor (and its lock) is closed
 * after: FILE is locked at every instant.
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

#include "atomic-file.h"
#include "cleanup.h"
#include "catalogue.h"
#include "catalogue-internal.h"
#include "file-lock.h"
#include "full-io.h"
#include "random-uuid.h"
#include "snapfg-log.h"

#define CATALOGUE_FORMAT "snapfg-catalogue"
#define CATALOGUE_VERSION 1
#define CATALOGUE_MAX_EVENTS 200
#define CATALOGUE_MAX_SIZE (16 * 1024 * 1024)

/* --- writing --- */

/* Write doc as the new catalogue, atomically; on success the new file's
 * locked descriptor replaces cat->fd.  Called with cat->lock held.
 */
int
catalogue_write (struct catalogue *cat, json_t *doc)
{
  CLEANUP_FREE char *text = json_dumps (doc, JSON_INDENT (2) |
                                       JSON_PRESERVE_ORDER);
  CLEANUP_CLOSE int dirfd = -1;
  struct atomic_file af = { .fd = -1 };
  const char *what = "open the directory of";
  int r;

  if (text == NULL) {
    return snapfg_fail_logged (ENOMEM, "state=%s: cannot encode the catalogue (out of memory)",
                                       cat->path);
  }
  dirfd = open (cat->dir_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd == -1) {
    r = -errno;
    goto fail;
  }
  /* A FILE.tmp left by a crash is ours (we hold FILE's lock): replace it. */
  r = atomic_file_begin (&af, dirfd, cat->base_name, 0600,
                         ATOMIC_FILE_REPLACE_LEFTOVER);
  what = "create";
  if (r == 0) {
    r = full_write (af.fd, text, strlen (text));
    what = "write";
  }
  if (r == 0)
    r = full_write (af.fd, "\n", 1);
  /* Lock the new inode before it becomes FILE: FILE is locked at every
   * instant.
   */
  if (r == 0) {
    r = file_lock (af.fd, true);
    what = "lock";
  }
  if (r == 0)
    r = atomic_file_commit (&af, &what);
  if (af.renamed) {
    if (r < 0) {
      /* The rename happened: the new file is the catalogue now, and it
       * is locked through af.fd.  Only its durability is in doubt.
       */
      snapfg_error ("state=%s: cannot sync the directory %s: %s",
                    cat->path, cat->dir_path, strerror (-r));
    }
    close (cat->fd);
    cat->fd = af.fd;
    af.fd = -1;
    return r;
  }
  atomic_file_end (&af);
 fail:
  snapfg_fail_logged (-r, "state=%s: cannot %s %s: %s (the catalogue is unchanged)",
                          cat->path, what, cat->tmp_path, strerror (-r));
  return r;
}

/* Commit a changed copy of the tree: write it, then adopt it. */
int
catalogue_commit (struct catalogue *cat, json_t *doc)
{
  int r;

  /* Held (during the start): in memory only, written by
   * catalogue_release once the start has succeeded.
   */
  if (cat->held) {
    json_decref (cat->root);
    cat->root = doc;
    cat->pending = true;
    return 0;
  }
  r = catalogue_write (cat, doc);

  if (r == 0) {
    json_decref (cat->root);
    cat->root = doc;
  }
  else
    json_decref (doc);
  return r;
}

void
catalogue_append_event (json_t *doc, const char *event, const char *name,
              const char *detail)
{
  json_t *events = json_object_get (doc, "events");

  if (!json_is_array (events)) {
    events = json_array ();
    json_object_set_new (doc, "events", events);
  }
  json_array_append_new (events,
                         json_pack ("{s:I, s:s, s:s?, s:s?}",
                                    "time", (json_int_t) time (NULL),
                                    "event", event, "name", name,
                                    "detail", detail));
  while (json_array_size (events) > CATALOGUE_MAX_EVENTS)
    json_array_remove (events, 0);
}

static int
read_file (int fd, char **textp, size_t *lenp)
{
  struct stat st;
  char *text;
  size_t len;
  int r;

  if (fstat (fd, &st) == -1)
    return -errno;
  if (!S_ISREG (st.st_mode))
    return -EINVAL;
  if (st.st_size > CATALOGUE_MAX_SIZE)
    return -EFBIG;
  text = malloc (st.st_size + 1);
  if (text == NULL)
    return -ENOMEM;
  len = st.st_size;
  r = full_pread (fd, text, len, 0);
  if (r < 0) {
    free (text);
    return r == -ENODATA ? -EIO : r;    /* shrank under us */
  }
  text[len] = '\0';
  *textp = text;
  *lenp = len;
  return 0;
}

/* The catalogue is a regular file that the server rewrites by renaming
 * a new one over it: a device, a FIFO, a socket or a directory at its
 * path can never be one (and the owner and mode advice that a file
 * would get is no help there).
 */
static int
refuse_not_regular (struct catalogue *cat, mode_t mode)
{
  const char *what = S_ISDIR (mode) ? "a directory"
    : S_ISCHR (mode) ? "a character device"
    : S_ISBLK (mode) ? "a block device"
    : S_ISFIFO (mode) ? "a FIFO"
    : S_ISSOCK (mode) ? "a socket" : "of another kind";

  return snapfg_fail (EINVAL, "state=%s: not a regular file (it is %s); the "
                              "catalogue is a regular file the server creates and "
                              "replaces itself: name a new file in a directory of "
                              "the server's user", cat->path, what);
}

/* Open and lock FILE, making sure the locked inode is still the one the
 * name points to (a server rewriting it renames a new one into place).
 */
int
catalogue_open_locked (struct catalogue *cat, bool *created)
{
  for (int tries = 0; tries < 10; ++tries) {
    struct stat a, b;
    int fd, r;

    *created = false;
    /* Not even opened if it is not a regular file: opening a device or
     * a FIFO can have effects of its own.  (The check after the open
     * below covers a file replaced in between.)
     */
    if (lstat (cat->path, &a) == 0 && !S_ISREG (a.st_mode) && !S_ISLNK (a.st_mode))
      return refuse_not_regular (cat, a.st_mode);
    /* Never through a link: the catalogue is replaced by rename, which
     * would replace the link, not what it points to.
     */
    fd = open (cat->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd == -1 && errno == ENOENT) {
      fd = open (cat->path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                 0600);
      if (fd == -1 && errno == EEXIST)
        continue;
      *created = fd >= 0;
    }
    if (fd == -1) {
      r = -errno;
      if (r == -EISDIR)
        return refuse_not_regular (cat, S_IFDIR);
      if (r == -ELOOP)
        snapfg_fail (-r, "state=%s: is a symbolic link; the server replaces "
                         "the catalogue by renaming a new file over it, so "
                         "it must be the file itself: name the file the link "
                         "points to", cat->path);
      else
        snapfg_fail (-r, "state=%s: cannot open the catalogue: %s",
                         cat->path, strerror (-r));
      return r;
    }
    if (fstat (fd, &a) == 0 && !S_ISREG (a.st_mode)) {
      close (fd);
      return refuse_not_regular (cat, a.st_mode);
    }
    r = file_lock (fd, true);
    if (r < 0) {
      close (fd);
      if (r == -EAGAIN || r == -EACCES)
        snapfg_fail (EAGAIN, "state=%s: the catalogue is in use by another "
                             "process (another snapfg server of this origin?); "
                             "stop it first", cat->path);
      else
        snapfg_fail (-r, "state=%s: cannot lock the catalogue: %s",
                         cat->path, strerror (-r));
      return r == -EACCES ? -EAGAIN : r;
    }
    if (fstat (fd, &a) == 0 && stat (cat->path, &b) == 0 &&
        a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
      cat->fd = fd;
      return 0;
    }
    close (fd);                 /* renamed meanwhile: try the new one */
  }
  return snapfg_fail_logged (EAGAIN, "state=%s: the catalogue keeps being replaced; is "
                                     "another server using it?", cat->path);
}

int
catalogue_load_document (struct catalogue *cat, const struct catalogue_origin *origin,
               bool *fresh)
{
  char *text = NULL, why[1024];
  size_t len = 0;
  json_error_t err;
  json_t *root, *v, *o;
  const char *problem;
  int r;

  r = read_file (cat->fd, &text, &len);
  if (r < 0) {
    snapfg_fail (-r, "state=%s: cannot read the catalogue: %s",
                     cat->path, r == -EINVAL ? "not a regular file"
                     : strerror (-r));
    return r;
  }
  *fresh = len == 0;
  if (len == 0 && !cat->created_now) {
    /* Only a missing file starts a new catalogue: an empty one may be
     * what is left of a catalogue whose stores are still in FILE.d.
     */
    free (text);
    return snapfg_fail_logged (EINVAL, "state=%s: the catalogue is empty (0 bytes): damaged, "
                                       "or left by a crash before its first write; refusing to "
                                       "start a new catalogue over it (the stores it listed "
                                       "would be lost): restore it from a backup, or remove it "
                                       "if it never recorded anything", cat->path);
  }
  if (len == 0) {
    /* The file this open created: a new catalogue.  Nothing to lose. */
    free (text);
    random_uuid (cat->id);
    cat->root = json_pack ("{s:s, s:i, s:s, s:o, s:[], s:[], s:[]}",
                           "format", CATALOGUE_FORMAT,
                           "version", CATALOGUE_VERSION,
                           "id", cat->id,
                           "origin", catalogue_origin_object (origin),
                           "snapshots", "checkpoints", "events");
    return cat->root ? 0 : -ENOMEM;
  }

  root = json_loadb (text, len, JSON_REJECT_DUPLICATES, &err);
  free (text);
  if (root == NULL) {
    return snapfg_fail_logged (EINVAL, "state=%s: not a snapfg catalogue, or a damaged or "
                                       "truncated one (line %d: %s); refusing to use or "
                                       "overwrite it: restore it, or name a new file", cat->path,
                                       err.line, err.text);
  }
  if (!json_is_object (root) ||
      !json_is_string (v = json_object_get (root, "format")) ||
      strcmp (json_string_value (v), CATALOGUE_FORMAT) != 0) {
    snapfg_fail (EINVAL, "state=%s: not a snapfg catalogue (%s); refusing to "
                         "use or overwrite it: name a new file or the "
                         "catalogue of this origin", cat->path,
                         root == NULL ? err.text : "no \"format\": \""
                         CATALOGUE_FORMAT "\"");
    json_decref (root);
    return -EINVAL;
  }
  v = json_object_get (root, "version");
  if (!json_is_integer (v) || json_integer_value (v) != CATALOGUE_VERSION) {
    snapfg_fail (EINVAL, "state=%s: catalogue version %s is not supported (this "
                         "snapfg reads version %d); the file is left unchanged",
                         cat->path, json_is_integer (v) ? "other than 1" : "missing",
                         CATALOGUE_VERSION);
    json_decref (root);
    return -EINVAL;
  }
  v = json_object_get (root, "id");
  o = json_object_get (root, "origin");
  if (!catalogue_is_uuid (v) || !json_is_object (o) ||
      !json_is_string (json_object_get (o, "path")) ||
      !json_is_integer (json_object_get (o, "size")) ||
      json_integer_value (json_object_get (o, "size")) < 0) {
    snapfg_fail (EINVAL, "state=%s: malformed catalogue (\"id\" or \"origin\" "
                         "missing or wrong); the file is left unchanged",
                         cat->path);
    json_decref (root);
    return -EINVAL;
  }
  r = catalogue_check_origin (cat, root, origin);
  if (r < 0) {
    json_decref (root);
    return r;
  }
  /* (After the origin: another origin's catalogue says so first.) */
  problem = catalogue_check_records (cat, root, why, sizeof why);
  if (problem) {
    snapfg_fail (EINVAL, "state=%s: malformed catalogue: %s; the file is left "
                         "unchanged", cat->path, problem);
    json_decref (root);
    return -EINVAL;
  }
  snprintf (cat->id, sizeof cat->id, "%s", json_string_value (v));
  if (json_object_get (root, "events") == NULL)
    json_object_set_new (root, "events", json_array ());
  cat->root = root;
  return 0;
}
